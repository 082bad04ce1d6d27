//! The demo's child agents.

use serde_json::{json, Value};
use worker::Env;

use crate::model::ModelError;
use crate::platform::child::{ChildAgent, Turn, TurnOutput};
use crate::platform::model::ModelProvider;
use crate::protocol::chunk::Progress;

/// The offline model at the pace the settings give, or the pace a run's input asks for
/// (`words`, `delayMs`): tests and the demo page use it to make runs long or short.
fn paced_model(env: &Env, input: Option<&Value>) -> Result<ModelProvider, ModelError> {
    let mut provider = ModelProvider::from_env(env)?;
    if let (ModelProvider::Offline(pace), Some(input)) = (&mut provider, input) {
        if let Some(words) = input.get("words").and_then(Value::as_u64) {
            pace.words = words.min(5000) as usize;
        }
        if let Some(delay) = input.get("delayMs").and_then(Value::as_u64) {
            pace.delay_ms = delay.min(60_000);
        }
    }
    Ok(provider)
}

/// The child's logic: a chat agent that researches what it is asked.
pub struct ResearcherAgent;

impl ChildAgent for ResearcherAgent {
    const CLASS: &'static str = "Researcher";

    fn system_prompt(&self) -> Option<String> {
        Some("You are a researcher. Research the topic you are given and answer with concise findings.".into())
    }

    fn model(&self, env: &Env, input: Option<&Value>) -> Result<ModelProvider, ModelError> {
        paced_model(env, input)
    }

    /// A structured record of the findings, kept beside the text summary (and the summary
    /// itself when the model wrote no text).
    fn get_agent_tool_output(&self, turn: &Turn, message: &Value) -> Option<Value> {
        let findings = crate::chat::message::text_of(message);
        let topic = turn.input().get("query").and_then(Value::as_str).unwrap_or_default();
        Some(json!({ "topic": topic, "findings": findings, "words": findings.split_whitespace().count() }))
    }

    async fn run(&self, turn: &Turn) -> Result<TurnOutput, String> {
        // Two word-delays between the research phases, at the pace the model streams.
        let delay = match paced_model(turn.env(), Some(turn.input())) {
            Ok(ModelProvider::Offline(pace)) => pace.delay_ms,
            _ => 60,
        };
        let pause = delay.min(1000) * 2;
        let step = |fraction: f64, phase: &str, message: &str| Progress {
            fraction: Some(fraction),
            phase: Some(phase.into()),
            message: Some(message.into()),
            ..Default::default()
        };
        turn.report_progress(step(0.1, "searching", "Looking for sources"), false);
        turn.pause(pause).await;
        turn.report_progress(
            Progress { milestone: Some("sources-gathered".into()), ..step(0.4, "reading", "Sources gathered") },
            false,
        );
        turn.pause(pause).await;
        turn.report_progress(step(0.6, "writing", "Writing the findings"), false);
        let out = turn.chat(self).await?;
        turn.report_progress(step(1.0, "done", "Done"), false);
        Ok(out)
    }
}

/// A second child class: summarizes text in one turn, no progress.
pub struct SummarizerAgent;

impl ChildAgent for SummarizerAgent {
    const CLASS: &'static str = "Summarizer";

    fn system_prompt(&self) -> Option<String> {
        Some("Summarize the text you are given in a few sentences.".into())
    }

    fn model(&self, env: &Env, input: Option<&Value>) -> Result<ModelProvider, ModelError> {
        paced_model(env, input)
    }
}
