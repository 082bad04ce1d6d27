//! What the engine's unit tests share: a database with the parent's tables, an engine, and
//! the small builders every table of cases uses.

pub use super::*;
pub use crate::parent::registry::{NewRun, Registry};
pub use crate::protocol::child_api::RunInput;
pub use crate::protocol::Outcome;
pub(crate) use crate::store::sqlite;
pub use crate::types::{EventDelivery, RunStatus};
pub use serde_json::{json, Value};

/// A fresh database with the parent's tables and an identity, and an engine over it.
pub fn engine(options: AgentToolOptions) -> (rusqlite::Connection, ParentEngine) {
    let db = sqlite::memory();
    migrate(&db).unwrap();
    meta::set(&db, "name", "p").unwrap();
    (db, ParentEngine::new("Parent", options, 1))
}

/// A run of child class `Child` with this input.
pub fn new_run(id: &str, input: &Value) -> NewRun {
    NewRun {
        run_id: id.into(),
        parent_tool_call_id: None,
        agent_type: "Child".into(),
        binding: "Child".into(),
        input_preview: None,
        display: None,
        display_order: 0,
        event_delivery: EventDelivery::Full,
        input: RunInput::of(input),
    }
}

/// An awaited dispatch of `new`.
pub fn awaited(new: NewRun) -> Dispatch {
    Dispatch { new, detached: None, abandoned: None }
}

/// Dispatches an awaited run `id` at time 10.
pub fn dispatch(
    engine: &mut ParentEngine,
    db: &rusqlite::Connection,
    id: &str,
    input: Value,
) -> (Admitted, Vec<ParentAction>) {
    engine.dispatch(db, awaited(new_run(id, &input)), 10)
}

/// A name for each way a dispatch is admitted.
pub fn admitted_name(admitted: &Admitted) -> &'static str {
    match admitted {
        Admitted::Refused(_) => "refused",
        Admitted::Finished(_) => "finished",
        Admitted::Driving => "driving",
        Admitted::Joined => "joined",
        Admitted::Queued => "queued",
    }
}

/// The results handed to callers, in order.
pub fn resolved(actions: &[ParentAction]) -> Vec<(String, RunStatus)> {
    actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::Resolve { run_id, result } => Some((run_id.clone(), result.status)),
            _ => None,
        })
        .collect()
}

/// A database whose statements containing `pattern` fail, `times` times, after `skip` of them
/// succeeded.
pub struct FailOn {
    pub db: rusqlite::Connection,
    pub pattern: &'static str,
    pub times: std::cell::Cell<usize>,
    pub skip: std::cell::Cell<usize>,
}

impl FailOn {
    /// Over `db`, failing nothing until `times` (and `skip`) are set.
    pub fn new(db: rusqlite::Connection, pattern: &'static str) -> Self {
        Self { db, pattern, times: 0.into(), skip: 0.into() }
    }

    /// Failing the next `times` statements that contain the pattern.
    pub fn failing(self, times: usize) -> Self {
        self.times.set(times);
        self
    }
}

impl Sql for FailOn {
    fn exec(&self, sql: &str, params: &[crate::store::Value]) -> Result<Vec<crate::store::Row>, StoreError> {
        if self.times.get() > 0 && sql.contains(self.pattern) {
            if self.skip.get() > 0 {
                self.skip.set(self.skip.get() - 1);
                return self.db.exec(sql, params);
            }
            self.times.set(self.times.get() - 1);
            return Err(StoreError { message: format!("injected: {}", self.pattern) });
        }
        self.db.exec(sql, params)
    }

    fn batch(&self, sql: &str) -> Result<(), StoreError> {
        self.db.batch(sql)
    }

    fn atomically(&self, work: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
        self.db.atomically(work)
    }
}

/// The exchange number of the last action of `kind` ("start", "tail", "inspect", "clear",
/// "finish": the finish hook) for `run`.
pub fn gen_of(actions: &[ParentAction], kind: &str, run: &str) -> Option<u64> {
    actions.iter().rev().find_map(|a| match (a, kind) {
        (ParentAction::StartChild { run_id, gen, .. }, "start")
        | (ParentAction::OpenTail { run_id, gen, .. }, "tail")
        | (ParentAction::InspectChild { run_id, gen, .. }, "inspect")
        | (ParentAction::ClearChild { run_id, gen, .. }, "clear")
            if run_id == run =>
        {
            Some(*gen)
        }
        (ParentAction::Hook(HookCall::Finish(info, _, gen)), "finish") if info.run_id == run => Some(*gen),
        _ => None,
    })
}

/// Dispatches run `id` at time 10 and lets its child accept it; the generation of the tail the
/// engine then opens.
pub fn started(
    db: &(impl Sql + ?Sized),
    engine: &mut ParentEngine,
    id: &str,
    detached: Option<crate::types::DetachedOptions>,
) -> u64 {
    let dispatch = Dispatch { new: new_run(id, &json!(1)), detached, abandoned: None };
    let (_, actions) = engine.dispatch(db, dispatch, 10);
    let start = gen_of(&actions, "start", id).unwrap();
    let actions = engine.handle(db, ParentEvent::StartReplied { run_id: id.into(), gen: start, result: Ok(()) }, 11);
    gen_of(&actions, "tail", id).unwrap()
}

/// When the engine wants the alarm, forgetting it: what the decisions after this ask for.
pub fn take_alarm(engine: &mut ParentEngine) -> Option<i64> {
    engine.alarm.take()
}
