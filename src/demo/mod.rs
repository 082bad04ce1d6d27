//! The demo Worker: a parent `Assistant` whose model calls `Researcher` children as a tool.
//!
//! Both are chat agents on the model the settings select (the offline model by default:
//! "Research HTTP/3 and gRPC" makes two `research` calls in one step). `OFFLINE_WORDS` and
//! `OFFLINE_DELAY_MS` set the length and pace of the offline model's answers; a run's input may
//! override them with `words` and `delayMs`. A researcher reports progress and one milestone
//! (`sources-gathered`) before it writes.

use futures::future::join_all;
use schemars::JsonSchema;
use serde_json::{json, Value};
use worker::{
    durable_object, event, Context, DurableObject, Env, Request, Response, State, WebSocket, WebSocketIncomingMessage,
};

use crate::model::ModelError;
use crate::parent::{AgentTool, RunOptions};
use crate::platform::child::{ChildAgent, ChildHost, Turn, TurnOutput};
use crate::platform::model::ModelProvider;
use crate::platform::parent::{ChildClass, ParentAgent, ParentHost};
use crate::platform::route::route_agent_request;
use crate::protocol::chunk::Progress;

/// The input of the `research` tool.
#[derive(JsonSchema, serde::Deserialize)]
#[allow(dead_code)] // read by the child's model, not by Rust
pub struct ResearchInput {
    /// The topic to research, e.g. "HTTP/3".
    #[schemars(length(min = 3))]
    query: String,
}

/// The parent's logic.
pub struct AssistantAgent;

impl ParentAgent for AssistantAgent {
    const CLASS: &'static str = "Assistant";
    const CHILDREN: &'static [ChildClass] = &[ChildClass { class: "Researcher", binding: "Researcher" }];

    fn system_prompt(&self) -> Option<String> {
        Some(
            "You are a helpful assistant. For each topic the user wants researched, call the research tool \
              once per topic, all in the same step, then summarise what the researchers found."
                .into(),
        )
    }

    fn tools(&self) -> Vec<AgentTool> {
        vec![AgentTool::new("research", "Researcher", "Research one topic in depth and report the findings.")
            .input::<ResearchInput>()
            .display_name("Researcher")
            .icon("🔎")]
    }

    async fn call(&self, parent: &ParentHost<Self>, method: &str, args: Vec<Value>) -> Result<Value, String> {
        match method {
            "research" => research(parent, args.into_iter().next().unwrap_or(Value::Null)).await,
            "runs" => {
                let runs = parent.registry().all().map_err(|e| e.to_string())?;
                Ok(Value::Array(runs.iter().map(run_json).collect()))
            }
            other => Err(format!("Method {other} does not exist")),
        }
    }
}

/// `research(topics)` or `research({topics, runIds?, parentToolCallId?, words?, delayMs?})`:
/// one `Researcher` run per topic, all at once; resolves with their results in order.
async fn research(parent: &ParentHost<AssistantAgent>, arg: Value) -> Result<Value, String> {
    let (topics, options) = match arg {
        Value::Array(topics) => (topics, Value::Null),
        Value::Object(ref o) => (o.get("topics").and_then(Value::as_array).cloned().unwrap_or_default(), arg.clone()),
        _ => return Err("research expects an array of topics or {topics: [...]}".into()),
    };
    if topics.is_empty() || topics.len() > 16 {
        return Err("research takes 1 to 16 topics".into());
    }
    let run_ids = options.get("runIds").and_then(Value::as_array).cloned().unwrap_or_default();
    let runs = topics.iter().enumerate().map(|(i, topic)| {
        let mut input = json!({ "query": topic });
        for key in ["words", "delayMs"] {
            if let Some(v) = options.get(key) {
                input[key] = v.clone();
            }
        }
        let opts = RunOptions {
            input,
            run_id: run_ids.get(i).and_then(Value::as_str).map(str::to_owned),
            parent_tool_call_id: options.get("parentToolCallId").and_then(Value::as_str).map(str::to_owned),
            display_order: Some(i as i64),
            ..Default::default()
        };
        parent.run_agent_tool("Researcher", opts)
    });
    let results = join_all(runs).await;
    serde_json::to_value(results).map_err(|e| e.to_string())
}

fn run_json(r: &crate::parent::RunRecord) -> Value {
    json!({
        "runId": r.run_id, "agentType": r.agent_type, "parentToolCallId": r.parent_tool_call_id,
        "status": r.status, "inputPreview": r.input_preview, "summary": r.summary, "error": r.error_message,
        "displayOrder": r.display_order, "startedAt": r.started_at, "completedAt": r.completed_at,
        "nextSeq": r.next_seq, "terminalSeq": r.terminal_seq,
    })
}

/// The child's logic: a chat agent that researches what it is asked.
pub struct ResearcherAgent;

impl ChildAgent for ResearcherAgent {
    const CLASS: &'static str = "Researcher";

    fn system_prompt(&self) -> Option<String> {
        Some("You are a researcher. Research the topic you are given and answer with concise findings.".into())
    }

    /// The configured model; an offline run's input may set its `words` and `delayMs`.
    fn model(&self, env: &Env, input: Option<&Value>) -> Result<ModelProvider, ModelError> {
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

    /// A structured record of the findings, kept beside the text summary (and the summary
    /// itself when the model wrote no text).
    fn get_agent_tool_output(&self, turn: &Turn, message: &Value) -> Option<Value> {
        let findings = crate::chat::message::text_of(message);
        let topic = turn.input().get("query").and_then(Value::as_str).unwrap_or_default();
        Some(json!({ "topic": topic, "findings": findings, "words": findings.split_whitespace().count() }))
    }

    async fn run(&self, turn: &Turn) -> Result<TurnOutput, String> {
        let pause = turn.input().get("delayMs").and_then(Value::as_u64).unwrap_or(60).min(1000) * 2;
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

/// The parent Durable Object.
#[durable_object]
pub struct Assistant {
    parent: ParentHost<AssistantAgent>,
}

impl DurableObject for Assistant {
    fn new(state: State, env: Env) -> Self {
        Self { parent: ParentHost::new(state, env, AssistantAgent) }
    }
    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        self.parent.fetch(req).await
    }
    async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        self.parent.websocket_message(ws, message).await
    }
    async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String, _clean: bool) -> worker::Result<()> {
        self.parent.websocket_close(ws, code, reason).await
    }
}

/// The child Durable Object.
#[durable_object]
pub struct Researcher {
    host: ChildHost<ResearcherAgent>,
}

impl DurableObject for Researcher {
    fn new(state: State, env: Env) -> Self {
        Self { host: ChildHost::new(state, env, ResearcherAgent) }
    }
    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        self.host.fetch(req).await
    }
    async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        self.host.websocket_message(ws, message).await
    }
    async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String, _clean: bool) -> worker::Result<()> {
        self.host.websocket_close(ws, code, reason).await
    }
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> worker::Result<Response> {
    route_agent_request(req, &env, &[AssistantAgent::CLASS]).await
}
