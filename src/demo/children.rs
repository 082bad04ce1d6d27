//! The demo's child agents.

use std::time::Duration;

use agent_tools::model::{Model, ModelError, ModelEvent, ModelProvider, ModelRequest};
use agent_tools::prelude::*;
use agent_tools::Env;
use agent_tools::RecoveryPolicy;
use serde_json::{json, Value};

use super::setting;

/// The demo's children's model: the provider the settings select, and, on the offline model,
/// the pace a run's input asks for (`words`, `delayMs`) and an optional silence mid-answer
/// (`stallAfterWords`, `stallMs`): tests and the demo page use them to make runs long, short or
/// silent. A model of the demo's own, wrapping a built-in one.
struct Paced {
    provider: ModelProvider,
    stall_after: Option<u64>,
    stall_ms: u64,
    /// A single text delta of this many bytes after the first word (`hugeChunkBytes`): what no
    /// model should send, for the tests of the parent's limits.
    huge_chunk: Option<usize>,
}

fn paced_model(env: &Env, input: Option<&Value>) -> Result<Paced, ModelError> {
    let mut provider = ModelProvider::from_env(env)?;
    let number = |key: &str| input.and_then(|i| i.get(key)).and_then(Value::as_u64);
    if let ModelProvider::Offline(pace) = &mut provider {
        if let Some(words) = number("words") {
            pace.words = words.min(200_000) as usize;
        }
        if let Some(delay) = number("delayMs") {
            pace.delay = Duration::from_millis(delay.min(60_000));
        }
    }
    Ok(Paced {
        provider,
        stall_after: number("stallAfterWords"),
        stall_ms: number("stallMs").unwrap_or(0).min(600_000),
        huge_chunk: number("hugeChunkBytes").map(|n| n.min(4 << 20) as usize),
    })
}

impl Model for Paced {
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
        let ModelProvider::Offline(offline) = &self.provider else {
            return self.provider.step(request, on_event).await;
        };
        let mut words = 0;
        let events = offline.events(request);
        let long = events.size_hint().0 > 256;
        for (n, event) in events.enumerate() {
            let paced = matches!(event, ModelEvent::TextDelta(_) | ModelEvent::ToolCallStart { .. });
            if paced && !offline.delay.is_zero() {
                agent_tools::sleep(offline.delay).await;
            } else if n % 256 == 255 {
                // With no pace, yield now and then, as a provider's stream does between reads.
                agent_tools::sleep(Duration::ZERO).await;
            }
            let delta = matches!(event, ModelEvent::TextDelta(_));
            on_event(event);
            if n == 0 && long && offline.delay.is_zero() {
                // A long answer's first event goes out at once, as a provider's first token does.
                agent_tools::sleep(Duration::ZERO).await;
            }
            if delta {
                words += 1;
                if words == 1 {
                    if let Some(bytes) = self.huge_chunk {
                        on_event(ModelEvent::TextDelta("x".repeat(bytes)));
                    }
                }
                if self.stall_after == Some(words) {
                    agent_tools::sleep(Duration::from_millis(self.stall_ms)).await;
                }
            }
        }
        Ok(())
    }
}

/// `CHILD_RECOVERY`: `rerun` (the default) or `seal`; `CHILD_MAX_RECOVERY_WORK`: the chunks a
/// run may stream from its first interruption on (default 1 000; `0` for no bound).
fn child_options(env: &Env) -> AgentToolOptions {
    let recovery = match setting(env, "CHILD_RECOVERY").as_deref() {
        Some("seal") => RecoveryPolicy::Seal,
        _ => RecoveryPolicy::Rerun,
    };
    let mut options = AgentToolOptions::default().recovery(recovery);
    if let Some(work) = setting(env, "CHILD_MAX_RECOVERY_WORK").and_then(|v| v.trim().parse::<u64>().ok()) {
        options = options.max_recovery_work((work > 0).then_some(work));
    }
    options
}

/// A chat agent that researches what it is asked, reporting progress and a milestone.
#[derive(Debug, Default)]
pub struct Researcher;

/// The answer a reviewed research waits for (`{"approved": bool, "reason"?: string}`).
#[derive(serde::Deserialize)]
struct Decision {
    approved: bool,
    #[serde(default)]
    reason: String,
}

impl Agent for Researcher {
    fn system_prompt(&self) -> Option<String> {
        Some("You are a researcher. Research the topic you are given and answer with concise findings.".into())
    }

    fn model(&self, env: &Env, input: Option<&Value>) -> Result<impl Model, ModelError> {
        paced_model(env, input)
    }

    fn agent_tool_options(&self, env: &Env) -> AgentToolOptions {
        child_options(env)
    }

    /// A structured record of the findings, kept beside the text summary (and the summary
    /// itself when the model wrote no text).
    fn agent_tool_output(&self, turn: &Turn<Self>, message: &Value) -> Option<Value> {
        let findings: String = message["parts"]
            .as_array()?
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect();
        let topic = turn.input_json().get("query").and_then(Value::as_str).unwrap_or_default();
        Some(json!({ "topic": topic, "findings": findings, "words": findings.split_whitespace().count() }))
    }

    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        // Two word-delays between the research phases, at the pace the model streams.
        let delay = match paced_model(turn.env(), Some(turn.input_json())).map(|m| m.provider) {
            Ok(ModelProvider::Offline(pace)) => pace.delay,
            _ => Duration::from_millis(60),
        };
        let pause = delay.min(Duration::from_secs(1)) * 2;
        let step =
            |fraction: f64, phase: &str, message: &str| Progress::fraction(fraction).phase(phase).message(message);
        turn.report_progress(step(0.1, "searching", "Looking for sources"));
        turn.pause(pause).await;
        let mut gathered = step(0.4, "reading", "Sources gathered");
        gathered.milestone = Some("sources-gathered".into());
        turn.report_progress(gathered);
        turn.pause(pause).await;
        if let Some(ms) = turn.input_json().get("hangMs").and_then(Value::as_u64) {
            // A hung child: nothing reaches this Durable Object (not even an inspection) for
            // `hangMs`, as when it is stuck; the rest of the Worker goes on.
            let hang = turn.host().sleep(Duration::from_millis(ms.min(25_000)));
            match turn.host().state() {
                Some(state) => {
                    let _ = state
                        .block_concurrency_while(async move {
                            hang.await;
                            Ok(())
                        })
                        .await;
                }
                // Natively there is no input gate to hold: the turn only waits.
                None => hang.await,
            }
        }
        if turn.input_json().get("review") == Some(&Value::Bool(true)) {
            // The seed's parent-mediated approval: the parent's chat asks its person, and the
            // answer comes back here (kept across restarts of either side).
            let mut asking = step(0.5, "waiting", "Waiting for approval to publish");
            asking.milestone = Some("needs-approval".into());
            turn.report_progress(asking);
            let decision: Decision = turn.wait_for("approval").await?;
            if !decision.approved {
                let reason = if decision.reason.is_empty() { "declined".to_owned() } else { decision.reason };
                turn.report_progress(step(1.0, "done", "Not published"));
                return Ok(TurnOutput::new(format!("Not published: {reason}")));
            }
        }
        turn.report_progress(step(0.6, "writing", "Writing the findings"));
        let out = turn.chat().await?;
        turn.report_progress(step(1.0, "done", "Done"));
        Ok(out)
    }
}

/// A second child class: summarizes text in one turn, no progress.
#[derive(Debug, Default)]
pub struct Summarizer;

impl Agent for Summarizer {
    fn system_prompt(&self) -> Option<String> {
        Some("Summarize the text you are given in a few sentences.".into())
    }

    fn model(&self, env: &Env, input: Option<&Value>) -> Result<impl Model, ModelError> {
        paced_model(env, input)
    }

    fn agent_tool_options(&self, env: &Env) -> AgentToolOptions {
        child_options(env)
    }
}
