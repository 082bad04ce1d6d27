//! The demo's parent agent: a chat agent with the `research` tool, and RPC methods for
//! imperative runs and the lifecycle (`research`, `dispatch`, `cancel`, `clear`, `runs`,
//! `hooks`).

use futures::future::join_all;
use schemars::JsonSchema;
use serde_json::{json, Value};
use worker::Env;

use crate::parent::detached::{DetachedOptions, MilestoneMode, OnMilestones};
use crate::parent::{Admission, AgentTool, ClearFilter, EventDelivery, RunOptions, RunRecord, RunResult, RunStatus};
use crate::platform::model::setting;
use crate::platform::parent::{ChildClass, ParentAgent, ParentHost};
use crate::store::{Sql, Value as V};

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

/// The demo's detached completion handlers: a typed registry, kept in SQL by name.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum DemoHandler {
    /// Records the outcome in the hook log.
    Record,
    /// Always fails (to show retries and the dead letter).
    Failing,
}

const HOOK_LOG: &str = "CREATE TABLE IF NOT EXISTS demo_hook_log (n INTEGER PRIMARY KEY AUTOINCREMENT, \
    run_id TEXT NOT NULL, hook TEXT NOT NULL, status TEXT)";

fn log_hook(parent: &ParentHost<AssistantAgent>, run_id: &str, hook: &str, status: Option<RunStatus>) {
    let status = status.map(RunStatus::as_str);
    worker::console_log!("{}", json!({ "type": "demo:hook", "runId": run_id, "hook": hook, "status": status }));
    let sql = parent.sql();
    let _ = sql.batch(HOOK_LOG);
    let _ = sql.exec(
        "INSERT INTO demo_hook_log (run_id, hook, status) VALUES (?, ?, ?)",
        &[V::from(run_id), V::from(hook), V::from(status)],
    );
}

impl ParentAgent for AssistantAgent {
    const CLASS: &'static str = "Assistant";
    const CHILDREN: &'static [ChildClass] = &[
        ChildClass { class: "Researcher", binding: "Researcher" },
        ChildClass { class: "Summarizer", binding: "Summarizer" },
    ];

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

    /// `MAX_CONCURRENT_AGENT_TOOLS` (unset: unlimited).
    fn max_concurrent_agent_tools(&self, env: &Env) -> Option<usize> {
        setting(env, "MAX_CONCURRENT_AGENT_TOOLS").and_then(|v| v.parse().ok())
    }

    /// `AGENT_TOOL_ALARM_MS` (default 10 000): the recovery alarm's interval.
    fn recovery_alarm_ms(&self, env: &Env) -> u64 {
        setting(env, "AGENT_TOOL_ALARM_MS").and_then(|v| v.parse().ok()).unwrap_or(10_000)
    }

    /// `AGENT_TOOL_ADMISSION`: `reject` (default) or `queue`.
    fn admission(&self, env: &Env) -> Admission {
        match setting(env, "AGENT_TOOL_ADMISSION").as_deref() {
            Some("queue") => Admission::Queue,
            _ => Admission::Reject,
        }
    }

    async fn on_agent_tool_start(&self, parent: &ParentHost<Self>, run: &RunRecord) {
        log_hook(parent, &run.run_id, "start", None);
    }

    async fn on_agent_tool_finish(&self, parent: &ParentHost<Self>, run: &RunRecord, result: &RunResult) {
        log_hook(parent, &run.run_id, "finish", Some(result.status));
    }

    async fn on_detached_finish(
        &self,
        parent: &ParentHost<Self>,
        handler: &Value,
        run: &RunRecord,
        result: &RunResult,
    ) -> Result<(), String> {
        match serde_json::from_value::<DemoHandler>(handler.clone()) {
            Ok(DemoHandler::Record) => {
                log_hook(parent, &run.run_id, "detached", Some(result.status));
                Ok(())
            }
            Ok(DemoHandler::Failing) => {
                log_hook(parent, &run.run_id, "detached-attempt", Some(result.status));
                Err("the failing handler always fails".into())
            }
            Err(e) => Err(format!("unknown handler {handler}: {e}")),
        }
    }

    /// `AGENT_TOOL_BACKBONE_MS`: a comma-separated cadence (default 5000,15000,30000,120000).
    fn backbone_cadence_ms(&self, env: &Env) -> Vec<u64> {
        setting(env, "AGENT_TOOL_BACKBONE_MS")
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| crate::parent::detached::CADENCE_MS.to_vec())
    }

    async fn call(&self, parent: &ParentHost<Self>, method: &str, args: Vec<Value>) -> Result<Value, String> {
        let arg = args.into_iter().next().unwrap_or(Value::Null);
        match method {
            "research" => research(parent, arg).await,
            "dispatch" => dispatch(parent, arg).await,
            "cancel" => {
                let run_id = arg.get("runId").and_then(Value::as_str).ok_or("cancel expects {runId, reason?}")?;
                let reason = arg.get("reason").and_then(Value::as_str).map(str::to_owned);
                parent.cancel_agent_tool(run_id, reason).await;
                Ok(parent.registry().get(run_id).map_err(|e| e.to_string())?.map_or(Value::Null, |r| run_json(&r)))
            }
            "clear" => {
                let status = match arg.get("status") {
                    None | Some(Value::Null) => None,
                    Some(Value::Array(s)) => Some(
                        s.iter()
                            .map(|v| v.as_str().and_then(RunStatus::parse).ok_or(format!("unknown status {v}")))
                            .collect::<Result<Vec<_>, _>>()?,
                    ),
                    Some(other) => return Err(format!("clear: status must be an array, got {other}")),
                };
                let filter = ClearFilter { status, older_than: arg.get("olderThan").and_then(Value::as_i64) };
                let cleared = parent.clear_agent_tool_runs(&filter).await?;
                Ok(json!({ "cleared": cleared }))
            }
            "runs" => {
                let runs = parent.registry().all().map_err(|e| e.to_string())?;
                Ok(Value::Array(runs.iter().map(run_json).collect()))
            }
            "hooks" => {
                let _ = parent.sql().batch(HOOK_LOG);
                let rows = parent
                    .sql()
                    .exec("SELECT run_id, hook, status FROM demo_hook_log ORDER BY n", &[])
                    .map_err(|e| e.to_string())?;
                Ok(rows.iter().map(|r| json!({ "runId": r.text(0), "hook": r.text(1), "status": r.text(2) })).collect())
            }
            other => Err(format!("Method {other} does not exist")),
        }
    }
}

/// `research(topics)` or `research({topics, runIds?, parentToolCallId?, words?, delayMs?, agent?})`:
/// one run per topic (of `Researcher`, or the `agent` given), all at once; resolves with their
/// results in order.
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
    let agent = options.get("agent").and_then(Value::as_str).unwrap_or("Researcher");
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
        parent.run_agent_tool(agent, opts)
    });
    let results = join_all(runs).await;
    serde_json::to_value(results).map_err(|e| e.to_string())
}

/// `dispatch({agent, input, runId?, parentToolCallId?, displayOrder?, eventDelivery?, display?,
/// detached?})`: one run of any child class, with every option; detached runs return a handle
/// at once.
async fn dispatch(parent: &ParentHost<AssistantAgent>, arg: Value) -> Result<Value, String> {
    let agent = arg.get("agent").and_then(Value::as_str).ok_or("dispatch expects {agent, input, ...}")?;
    let text = |k: &str| arg.get(k).and_then(Value::as_str).map(str::to_owned);
    let event_delivery = match arg.get("eventDelivery").and_then(Value::as_str) {
        None | Some("full") => EventDelivery::Full,
        Some("terminal") => EventDelivery::Terminal,
        Some(other) => return Err(format!("eventDelivery must be \"full\" or \"terminal\", got {other:?}")),
    };
    let options = RunOptions {
        input: arg.get("input").cloned().unwrap_or(Value::Null),
        run_id: text("runId"),
        parent_tool_call_id: text("parentToolCallId"),
        display_order: arg.get("displayOrder").and_then(Value::as_i64),
        input_preview: text("inputPreview"),
        display: arg.get("display").cloned(),
        event_delivery,
    };
    match arg.get("detached") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {
            serde_json::to_value(parent.run_agent_tool(agent, options).await).map_err(|e| e.to_string())
        }
        Some(detached) => {
            let detached = detached_options(detached)?;
            serde_json::to_value(parent.run_agent_tool_detached(agent, options, detached).await)
                .map_err(|e| e.to_string())
        }
    }
}

/// `detached: true | {onFinish?: "record"|"failing", notify?: true|{source}, maxBudgetMs?,
/// noProgressBudgetMs?, onMilestones?: [names] | {names, mode}}`.
fn detached_options(arg: &Value) -> Result<DetachedOptions, String> {
    if arg == &Value::Bool(true) {
        return Ok(DetachedOptions::default());
    }
    let on_finish = match arg.get("onFinish") {
        None | Some(Value::Null) => None,
        Some(name) => {
            let handler: DemoHandler =
                serde_json::from_value(name.clone()).map_err(|_| format!("unknown onFinish handler {name}"))?;
            Some(serde_json::to_value(handler).map_err(|e| e.to_string())?)
        }
    };
    let notify = match arg.get("notify") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some("agent-tool".to_owned()),
        Some(other) => Some(other.get("source").and_then(Value::as_str).ok_or("notify: true or {source}")?.to_owned()),
    };
    let on_milestones = match arg.get("onMilestones") {
        None | Some(Value::Null) => None,
        Some(Value::Array(names)) => Some(OnMilestones {
            names: names.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            mode: MilestoneMode::Narrate,
        }),
        Some(other) => Some(serde_json::from_value(other.clone()).map_err(|e| format!("onMilestones: {e}"))?),
    };
    Ok(DetachedOptions {
        on_finish,
        notify,
        max_budget_ms: arg.get("maxBudgetMs").and_then(Value::as_u64),
        no_progress_budget_ms: arg.get("noProgressBudgetMs").and_then(Value::as_u64),
        on_milestones,
    })
}

fn run_json(r: &RunRecord) -> Value {
    json!({
        "runId": r.run_id, "agentType": r.agent_type, "parentToolCallId": r.parent_tool_call_id,
        "status": r.status, "inputPreview": r.input_preview, "summary": r.summary, "error": r.error_message,
        "displayOrder": r.display_order, "startedAt": r.started_at, "completedAt": r.completed_at,
        "nextSeq": r.next_seq, "terminalSeq": r.terminal_seq, "eventDelivery": r.event_delivery.as_str(),
    })
}
