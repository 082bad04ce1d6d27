//! The demo app in real Chromium (Debian's, installed by `scripts/setup.sh`), driven by
//! playwright-core: each test starts the Worker and runs one scenario of
//! `tests/browser/run.mjs`. Screenshots land in `test-artifacts/browser/`.

use std::time::Duration;

use crate::harness::{root, Worker};

/// The longest a scenario's Node process may run.
const SCENARIO_LIMIT: Duration = Duration::from_secs(600);

async fn scenario(name: &str, vars: &[(&str, &str)]) {
    let worker = Worker::start_with(None, vars).await;
    run_scenario(name, &worker, vars, None).await;
}

/// Runs scenario `name` of `tests/browser/run.mjs` against `worker`; with `agent`, on the agent of
/// that name (a scenario in parts).
async fn run_scenario(name: &str, worker: &Worker, vars: &[(&str, &str)], agent: Option<&str>) {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "{chromium} is missing: run ./scripts/setup.sh (it installs Debian's chromium)"
    );
    let words = vars.iter().find(|(k, _)| *k == "OFFLINE_WORDS").map_or("24", |(_, v)| v);
    let mut command = tokio::process::Command::new("node");
    if let Some(agent) = agent {
        command.env("NAME", agent);
    }
    let child = command
        .arg(root().join("tests/browser/run.mjs"))
        .arg(name)
        .arg(worker.http(""))
        .arg(root().join("test-artifacts/browser"))
        .env("WORDS", words)
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Every step of a scenario has its own timeout and its failure report is bounded too: this is
    // the last resort, so that nothing can keep the suite waiting.
    let output = tokio::time::timeout(SCENARIO_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("scenario {name} did not end in {SCENARIO_LIMIT:?}: killed"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "scenario {name} failed:\n{stderr}\n{stdout}");
    assert!(stdout.contains(&format!("{{\"scenario\":\"{name}\",\"ok\":true}}")), "{stdout}");
}

const QUICK: &[(&str, &str)] = &[("OFFLINE_WORDS", "12"), ("OFFLINE_DELAY_MS", "40")];
const SLOW: &[(&str, &str)] = &[("OFFLINE_WORDS", "30"), ("OFFLINE_DELAY_MS", "80")];

/// The runtime killed while a chat turn's children stream; after the restart a page that loads
/// while the turn is continued shows "recovering", then the one answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_during_recovery_shows_recovering_then_the_answer() {
    const VARS: &[(&str, &str)] = &[("OFFLINE_WORDS", "60"), ("OFFLINE_DELAY_MS", "80")];
    across_a_restart("recover-start", "recover-reload", VARS).await;
}

/// Runs scenario `before` on one agent, kills the runtime (its state kept), and runs `after` on
/// the same agent of a fresh runtime.
async fn across_a_restart(before: &str, after: &str, vars: &[(&str, &str)]) {
    let mut worker = Worker::start_with(None, vars).await;
    let _state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let agent = crate::harness::unique(before);
    run_scenario(before, &worker, vars, Some(&agent)).await;
    worker.kill();
    let worker = Worker::start_with(Some(&persist), vars).await;
    run_scenario(after, &worker, vars, Some(&agent)).await;
}

/// A call that needs approval: two tabs see the stock approval request, it survives a reload,
/// the child is dispatched only once approved, and the answer goes on in the same message.
#[tokio::test(flavor = "multi_thread")]
async fn an_approved_call_runs_its_child_and_both_tabs_see_the_answer() {
    scenario("approve", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denied_call_runs_nothing_and_the_model_says_so() {
    scenario("deny", QUICK).await;
}

/// The seed's parent-mediated approval: a background run waits at `needs-approval`, the chat
/// asks, and the approval reaches the run, which writes its findings.
#[tokio::test(flavor = "multi_thread")]
async fn a_background_run_waits_for_the_chats_approval() {
    scenario("review", QUICK).await;
}

/// The runtime killed while a background run waits for the chat's approval: after the restart
/// the question is there once, and the approval reaches the run, run again by its child.
#[tokio::test(flavor = "multi_thread")]
async fn a_background_run_waits_for_the_chats_approval_across_a_restart() {
    across_a_restart("review-ask", "review-answer", QUICK).await;
}

/// The stock `onToolCall` answers the agent's client-side tool; the turn goes on with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_side_tool_is_answered_by_the_browser() {
    scenario("client-tool", QUICK).await;
}

/// The runtime killed while a call waits for its approval: after the restart the page shows the
/// question again, and the approval goes on with the turn.
#[tokio::test(flavor = "multi_thread")]
async fn an_approval_waits_across_a_restart() {
    across_a_restart("approve-ask", "approve-answer", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agents_state_is_set_followed_and_refused_with_its_reason() {
    scenario("state", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chat_message_streams_two_child_timelines() {
    // parity: 117
    scenario("chat", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_mid_stream_continues_without_doubling() {
    scenario("reload", SLOW).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stopping_the_chat_aborts_its_children() {
    scenario("stop", SLOW).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_cancelled_from_its_card_is_marked_aborted() {
    scenario("cancel", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tray_shows_progress_and_milestones_and_replays_them() {
    // parity: 78, 119
    scenario("progress", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_detached_run_tells_the_chat_and_the_model_answers() {
    scenario("notify", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn drilling_in_shows_the_childs_conversation() {
    scenario("drill", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cleared_runs_are_gone_after_a_reload() {
    scenario("clear", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_drill_in_id_shows_not_found() {
    scenario("not-found", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_tabs_see_the_same_runs_live() {
    // parity: 115
    scenario("two-tabs", QUICK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_socket_reconnects_and_catches_up() {
    scenario("reconnect", QUICK).await;
}
