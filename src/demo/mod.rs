//! The demo Worker: a parent `Assistant` that dispatches `Researcher` children.
//!
//! Both run on the built-in offline model. `OFFLINE_WORDS` and `OFFLINE_DELAY_MS` (vars in
//! `wrangler.toml`) set the length and pace of a researcher's answer; a run's input may
//! override them with `words` and `delayMs`.

use futures::future::join_all;
use serde_json::{json, Value};
use worker::{
    durable_object, event, Context, DurableObject, Env, Request, Response, State, WebSocket, WebSocketIncomingMessage,
};

use crate::model::offline::{self, OfflinePace};
use crate::parent::RunOptions;
use crate::platform::child::{ChildAgent, ChildHost, Turn, TurnOutput};
use crate::platform::parent::{ChildClass, ParentAgent, ParentHost};
use crate::platform::route::route_agent_request;
use crate::protocol::chunk;

/// The parent's logic.
pub struct AssistantAgent;

impl ParentAgent for AssistantAgent {
    const CLASS: &'static str = "Assistant";
    const CHILDREN: &'static [ChildClass] = &[ChildClass { class: "Researcher", binding: "Researcher" }];

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

/// The child's logic: researches `input.query` with the offline model.
pub struct ResearcherAgent;

fn pace(turn: &Turn) -> OfflinePace {
    let var = |name: &str| turn.env().var(name).ok().and_then(|v| v.to_string().parse::<u64>().ok());
    let input = |name: &str| turn.input().get(name).and_then(Value::as_u64);
    let default = OfflinePace::default();
    OfflinePace {
        words: input("words").or_else(|| var("OFFLINE_WORDS")).map_or(default.words, |w| w.min(5000) as usize),
        delay_ms: input("delayMs").or_else(|| var("OFFLINE_DELAY_MS")).map_or(default.delay_ms, |d| d.min(60_000)),
    }
}

impl ChildAgent for ResearcherAgent {
    const CLASS: &'static str = "Researcher";

    async fn run(&self, turn: &Turn) -> Result<TurnOutput, String> {
        let query = match turn.input() {
            Value::String(s) => s.clone(),
            Value::Object(o) => o.get("query").and_then(Value::as_str).unwrap_or_default().to_owned(),
            other => other.to_string(),
        };
        let pace = pace(turn);
        let text = offline::research_answer(&query, pace.words);
        let text_id = "text-0";
        turn.emit(chunk::start(&format!("msg-{}", turn.run_id())));
        turn.emit(chunk::text_start(text_id));
        for delta in offline::deltas(&text) {
            turn.pause(pace.delay_ms).await;
            turn.emit(chunk::text_delta(text_id, &delta));
        }
        turn.emit(chunk::text_end(text_id));
        turn.emit(chunk::finish(Some("stop")));
        Ok(TurnOutput { summary: text, output: None })
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
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> worker::Result<Response> {
    route_agent_request(req, &env, &[AssistantAgent::CLASS]).await
}
