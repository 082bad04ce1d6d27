//! Clearing runs three levels deep: a parent clears its runs, its child clears its own runs
//! (a grandchild each), then deletes its storage. A grandchild that could not be reached at
//! that moment is asked again later: the child keeps what it still owes across its own wipe.

use std::time::Duration;

use agent_tools::prelude::*;
use agent_tools::testing::{ScriptedModel, Step, World};
use serde_json::json;

/// The grandchild: a chat turn (its transcript is the storage a clear must delete).
#[derive(Default)]
pub struct Leaf;
impl Agent for Leaf {}

/// The child: runs a grandchild, then answers.
#[derive(Default)]
pub struct Mid;
impl Agent for Mid {
    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        let leaf = turn.host().run_agent_tool::<Leaf>(RunOptions::new(json!("a leaf")).run_id("leaf-1")).await;
        Ok(TurnOutput::new(format!("leaf said {}", leaf.summary.unwrap_or_default())))
    }
}

#[derive(Default)]
pub struct Top;
impl Agent for Top {}

agent_tools::durable_object!(Top, unchecked);
agent_tools::durable_object!(Mid, unchecked);
agent_tools::durable_object!(Leaf, unchecked);

#[test]
fn a_grandchild_unreachable_when_its_parent_is_cleared_is_cleared_later() {
    let world = World::new()
        .route::<Top>()
        .agent::<Mid>()
        .agent::<Leaf>()
        .model::<Leaf>(ScriptedModel::new().otherwise(|_| Step::new().text("leaf notes")));
    let top = world.host::<Top>("t");
    let result =
        world.block_on(async move { top.run_agent_tool::<Mid>(RunOptions::new(json!("go")).run_id("mid-1")).await });
    assert_eq!(result.summary.as_deref(), Some("leaf said leaf notes"), "{result:?}");
    let leaf = world.host::<Leaf>("Mid/Top/t/mid-1/leaf-1");
    assert!(!leaf.messages().is_empty(), "the grandchild keeps its run's transcript");
    // The child's first call to its grandchild is lost: its clear is owed.
    world.drop_hops_to("Leaf", 1);
    let top = world.host::<Top>("t");
    let cleared = world.block_on(async move { top.clear_agent_tool_runs(&ClearFilter::all()).await });
    assert_eq!(cleared.expect("cleared"), ["mid-1"]);
    world.settle();
    world.advance(Duration::from_millis(10 * 60_000));
    world.settle();
    let leaf = world.host::<Leaf>("Mid/Top/t/mid-1/leaf-1");
    assert!(leaf.messages().is_empty(), "the grandchild's storage was deleted: {:#?}", leaf.messages());
}
