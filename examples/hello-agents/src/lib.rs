//! A Worker built on `agent-tools` as a library. `Planner`'s model calls an agent tool
//! (`research`, a `Researcher` child) and an ordinary tool (`word_count`) in one step; the
//! researcher has an agent tool of its own (`fact_check`, a `FactChecker` grandchild); the
//! agents run on a small model of this Worker's own; `POST /agents/planner/<name>/runs`
//! starts a background research run.
use std::time::Duration;

use agent_tools::model::{
    FinishReason, Model, ModelError, ModelEvent, ModelMessage, ModelRequest, OfflineModel, ToolCall,
};
use agent_tools::prelude::*;
use agent_tools::{json_error, json_response, Env, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use worker::{event, Context, Request, Response};

/// Calls every tool once in its first step (with the user's text as `query` and `text`), then
/// answers with what the tools returned.
struct Scripted;

impl Model for Scripted {
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
        let step = request.messages.iter().filter(|m| matches!(m, ModelMessage::Assistant { .. })).count();
        match request.messages.last() {
            Some(ModelMessage::User(text)) if !request.tools.is_empty() => {
                // A child's input arrives as JSON text: take its `query`.
                let parsed = serde_json::from_str::<Value>(text).ok();
                let topic = parsed.as_ref().and_then(|v| v["query"].as_str()).unwrap_or(text);
                for (n, tool) in request.tools.iter().enumerate() {
                    let input = json!({ "query": topic, "text": topic });
                    let (id, name) = (format!("call_{step}_{n}"), tool.name.clone());
                    on_event(ModelEvent::ToolCallReady(Ok(ToolCall::new(id, name, input))));
                }
                on_event(ModelEvent::Finish(FinishReason::ToolCalls));
            }
            _ => {
                let results: Vec<String> = (request.messages.iter())
                    .filter_map(|m| match m {
                        ModelMessage::Tool { name, output, .. } => Some(format!("{name}: {}", text(output))),
                        _ => None,
                    })
                    .collect();
                on_event(ModelEvent::TextDelta(format!("Done. {}", results.join("; "))));
                on_event(ModelEvent::Finish(FinishReason::Stop));
            }
        }
        Ok(())
    }
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Topic {
    /// What to look into.
    #[schemars(length(min = 3))]
    query: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Text {
    #[schemars(length(max = 64))]
    text: String,
}

/// An ordinary server-side tool.
struct WordCount;

impl Tool<Planner> for WordCount {
    type Input = Text;
    type Output = usize;
    fn name(&self) -> &str {
        "word_count"
    }
    fn description(&self) -> &str {
        "Counts the words of a text."
    }
    async fn execute(&self, ctx: &ToolContext<'_, Planner>, input: Text) -> Result<usize, Error> {
        // A fault to watch a turn survive a panic: `--var PANIC_ON:boom`, then chat "boom" (the
        // instance resets, the turn goes on without this call's result: docs/recovery.md).
        if ctx.host().env().var("PANIC_ON").is_some_and(|word| input.text.contains(&word)) {
            panic!("word_count: asked to panic on {:?}", input.text);
        }
        let words = input.text.split_whitespace().filter(|w| w.chars().any(char::is_alphabetic)).count();
        if words == 0 {
            return Err(format!("no words in {:?}", input.text).into()); // the model gets the failure envelope
        }
        Ok(words)
    }
}

/// The agent clients talk to.
#[derive(Default)]
pub struct Planner;

impl Agent for Planner {
    fn tools(&self) -> Tools<Self> {
        let research = AgentTool::of::<Researcher>("research", "Research a topic.").input::<Topic>();
        Tools::new().agent(research).tool(WordCount)
    }
    fn model(&self, _env: &Env, _input: Option<&Value>) -> Result<impl Model, ModelError> {
        Ok(Scripted)
    }
    /// `POST /agents/planner/<name>/runs` with `{"query": …}` starts a background research run.
    async fn on_request(&self, host: &AgentHost<Self>, req: HttpRequest) -> HttpResponse {
        if req.method() != "POST" || !req.uri().path().ends_with("/runs") {
            return host.default_response(&req);
        }
        let Ok(topic) = serde_json::from_slice::<Topic>(req.body()) else {
            return json_error(400, "expected {\"query\": string}");
        };
        let options = RunOptions::new(json!({ "query": topic.query }));
        match host.run_agent_tool_detached::<Researcher>(options, DetachedOptions::default()).await {
            Ok(handle) => json_response(202, &handle),
            Err(refused) => json_error(503, refused.to_string()), // over the cap, say: nothing started
        }
    }
}

/// A child that delegates fact checking to a child of its own.
#[derive(Default)]
pub struct Researcher;

impl Agent for Researcher {
    fn tools(&self) -> Tools<Self> {
        Tools::new().agent(AgentTool::of::<FactChecker>("fact_check", "Check the facts of a claim.").input::<Topic>())
    }
    fn model(&self, _env: &Env, _input: Option<&Value>) -> Result<impl Model, ModelError> {
        Ok(Scripted)
    }
}

/// The grandchild, on the built-in offline model.
#[derive(Default)]
pub struct FactChecker;

impl Agent for FactChecker {
    fn model(&self, _env: &Env, _input: Option<&Value>) -> Result<impl Model, ModelError> {
        Ok(OfflineModel { words: 8, delay: Duration::from_millis(20) })
    }
}

agent_tools::durable_object!(Planner);
agent_tools::durable_object!(Researcher);
agent_tools::durable_object!(FactChecker);

#[event(fetch)]
async fn fetch(req: Request, env: worker::Env, _ctx: Context) -> worker::Result<Response> {
    agent_tools::route::<Planner>(req, &env).await
}
