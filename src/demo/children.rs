//! The demo's child agents.

use agent_tools::model::{ModelError, ModelProvider};
use agent_tools::prelude::*;
use serde_json::{json, Value};
use worker::Env;

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

/// A chat agent that researches what it is asked, reporting progress and a milestone.
#[derive(Default)]
pub struct Researcher;

impl Agent for Researcher {
    fn system_prompt(&self) -> Option<String> {
        Some("You are a researcher. Research the topic you are given and answer with concise findings.".into())
    }

    fn model(&self, env: &Env, input: Option<&Value>) -> Result<impl agent_tools::model::Model, ModelError> {
        paced_model(env, input)
    }

    /// A structured record of the findings, kept beside the text summary (and the summary
    /// itself when the model wrote no text).
    fn get_agent_tool_output(&self, turn: &Turn<Self>, message: &Value) -> Option<Value> {
        let findings: String = message["parts"]
            .as_array()?
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect();
        let topic = turn.input().get("query").and_then(Value::as_str).unwrap_or_default();
        Some(json!({ "topic": topic, "findings": findings, "words": findings.split_whitespace().count() }))
    }

    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, String> {
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
        turn.report_progress(step(0.1, "searching", "Looking for sources"));
        turn.pause(pause).await;
        turn.report_progress(Progress {
            milestone: Some("sources-gathered".into()),
            ..step(0.4, "reading", "Sources gathered")
        });
        turn.pause(pause).await;
        turn.report_progress(step(0.6, "writing", "Writing the findings"));
        let out = turn.chat().await?;
        turn.report_progress(step(1.0, "done", "Done"));
        Ok(out)
    }
}

/// A second child class: summarizes text in one turn, no progress.
#[derive(Default)]
pub struct Summarizer;

impl Agent for Summarizer {
    fn system_prompt(&self) -> Option<String> {
        Some("Summarize the text you are given in a few sentences.".into())
    }

    fn model(&self, env: &Env, input: Option<&Value>) -> Result<impl agent_tools::model::Model, ModelError> {
        paced_model(env, input)
    }
}
