use crate::parent::engine::testing::*;
use crate::types::Retention;

#[test]
fn retention_clears_the_oldest_finished_runs_and_their_children() {
    let options =
        AgentToolOptions { retention: Retention { max_runs: Some(2), max_age: None }, ..AgentToolOptions::default() };
    let (db, mut engine) = engine(options);
    let registry = Registry::new(&db);
    for i in 0..4 {
        let id = format!("r{i}");
        registry.insert(&new_run(&id, &json!(i)), i).unwrap();
        registry.finish(&id, &Terminal::Completed { summary: "s".into(), output: None }, 100 + i).unwrap();
    }
    let actions = engine.alarm(&db, 200);
    let cleared: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::ClearChild { run_id, .. } => Some(run_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(cleared, ["r0", "r1"]);
    let left: Vec<String> = registry.all().unwrap().into_iter().map(|r| r.run_id).collect();
    assert_eq!(left, ["r2", "r3"]);
    assert!(actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::Retention, _))));
    // A new dispatch trims too: the live run is never counted against the policy.
    assert!(matches!(dispatch(&mut engine, &db, "r4", json!(4)).0, Admitted::Driving(_)));
    assert_eq!(registry.all().unwrap().len(), 3);
}
