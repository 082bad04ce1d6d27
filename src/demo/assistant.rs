//! The demo's parent agent: a chat agent with the `research` tool, and RPC methods for
//! imperative runs and the lifecycle (`research`, `dispatch`, `cancel`, `clear`, `runs`,
//! `hooks`).

use agent_tools::prelude::*;
use agent_tools::sql::Value as SqlValue;
use agent_tools::{
    Admission, CancelToken, ClearFilter, EventDelivery, MilestoneMode, OnMilestones, ProgressSnapshot, Refusal,
    RunInfo, RunStatus, ScheduledTask,
};
use agent_tools::{Env, HttpRequest};
use futures::future::join_all;
use schemars::JsonSchema;
use serde_json::{json, Value};

use super::children::{Researcher, Summarizer};
use super::setting;

/// The input of the `research` tool. Besides the topic, optional fields whose schema uses what
/// a validator must really check (`pattern`, `format`, `uniqueItems`, `if`/`then`): an input
/// that breaks any of them is refused before a child starts.
#[derive(JsonSchema, serde::Deserialize)]
#[allow(dead_code)] // read by the child's model, not by Rust
#[schemars(extend("if" = {"properties": {"depth": {"const": "deep"}}, "required": ["depth"]},
                  "then" = {"required": ["sources"]}))]
pub struct ResearchInput {
    /// The topic to research, e.g. "HTTP/3".
    #[schemars(length(min = 3))]
    query: String,
    /// A ticket code for the research, e.g. "NET-42".
    #[schemars(regex(pattern = r"^[A-Z]{2,5}-[0-9]+$"))]
    #[serde(default)]
    ticket: Option<String>,
    /// Who to tell about it.
    #[schemars(email)]
    #[serde(default)]
    notify: Option<String>,
    /// Sources to start from, each once.
    #[serde(default)]
    sources: Option<std::collections::BTreeSet<String>>,
    /// "quick" or "deep" (a deep one needs sources).
    #[serde(default)]
    depth: Option<Depth>,
}

/// How deep a research goes.
#[derive(JsonSchema, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Depth {
    /// A quick look.
    Quick,
    /// A thorough one, from given sources.
    Deep,
}

/// The demo's default cap on live runs per parent (`MAX_CONCURRENT_AGENT_TOOLS`).
const DEMO_LIVE_RUNS: usize = 64;

/// Compares two secrets without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The parent: a chat agent whose model researches topics with `Researcher` children.
#[derive(Default)]
pub struct Assistant;

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

/// Scheduled tasks the demo's `schedule` RPC lets wait at once, per parent.
const DEMO_SCHEDULED_TASKS: usize = 100;

/// Hook calls `demo_hook_log` keeps (the newest).
const HOOK_LOG_ROWS: i64 = 10_000;

/// Records a hook call in `demo_hook_log` (the newest [`HOOK_LOG_ROWS`]) and logs it (unless
/// `QUIET_HOOKS=1`: under `wrangler dev` every log line is relayed to wrangler's Node process,
/// which the benchmark does not want to measure).
fn log_hook(host: &AgentHost<Assistant>, run_id: &str, hook: &str, status: Option<RunStatus>) {
    log_row(host, run_id, hook, status.map(RunStatus::as_str));
}

fn log_row(host: &AgentHost<Assistant>, run_id: &str, hook: &str, status: Option<&str>) {
    if setting(host.env(), "QUIET_HOOKS").as_deref() != Some("1") {
        host.log(&json!({ "type": "demo:hook", "runId": run_id, "hook": hook, "status": status }).to_string());
    }
    let sql = host.sql();
    let _ = sql.exec(HOOK_LOG, &[]);
    let bindings = [run_id.into(), hook.into(), status.map_or(SqlValue::Null, Into::into)];
    let _ = sql.exec("INSERT INTO demo_hook_log (run_id, hook, status) VALUES (?, ?, ?)", &bindings);
    let _ = sql.exec("DELETE FROM demo_hook_log WHERE n <= last_insert_rowid() - ?", &[HOOK_LOG_ROWS.into()]);
}

impl Agent for Assistant {
    fn system_prompt(&self) -> Option<String> {
        Some(
            "You are a helpful assistant. For each topic the user wants researched, call the research tool \
             once per topic, all in the same step, then summarise what the researchers found."
                .into(),
        )
    }

    fn tools(&self) -> Tools<Self> {
        Tools::new().agent(
            AgentTool::of::<Researcher>("research", "Research one topic in depth and report the findings.")
                .input::<ResearchInput>()
                .display_name("Researcher")
                .icon("🔎"),
        )
    }

    /// `MAX_CONCURRENT_AGENT_TOOLS` (default 64; `0` for unlimited), `AGENT_TOOL_ADMISSION`
    /// (`reject` or `queue`), `AGENT_TOOL_ALARM_MS` (the recovery alarm's interval, default
    /// 10 000), `AGENT_TOOL_BACKBONE_MS` (a comma-separated backbone cadence),
    /// `AGENT_TOOL_RETAIN_RUNS` and `AGENT_TOOL_RETAIN_MS` (the retention policy; `0` for no
    /// limit).
    fn agent_tool_options(&self, env: &Env) -> AgentToolOptions {
        let cap = setting(env, "MAX_CONCURRENT_AGENT_TOOLS").and_then(|v| v.parse().ok()).unwrap_or(DEMO_LIVE_RUNS);
        let mut options = AgentToolOptions { max_concurrent: (cap > 0).then_some(cap), ..AgentToolOptions::default() };
        if let Some(n) = setting(env, "AGENT_TOOL_RETAIN_RUNS").and_then(|v| v.parse::<usize>().ok()) {
            options.retention.max_runs = (n > 0).then_some(n);
        }
        if let Some(ms) = setting(env, "AGENT_TOOL_RETAIN_MS").and_then(|v| v.parse::<u64>().ok()) {
            options.retention.max_age_ms = (ms > 0).then_some(ms);
        }
        if setting(env, "AGENT_TOOL_ADMISSION").as_deref() == Some("queue") {
            options.admission = Admission::Queue;
        }
        if let Some(ms) = setting(env, "AGENT_TOOL_ALARM_MS").and_then(|v| v.parse().ok()) {
            options.recovery_alarm_ms = ms;
        }
        if let Some(cadence) = setting(env, "AGENT_TOOL_BACKBONE_MS") {
            options.backbone_cadence_ms = cadence.split(',').filter_map(|n| n.trim().parse().ok()).collect();
        }
        if let Some(ms) = setting(env, "AGENT_TOOL_REATTACH_NO_PROGRESS_MS").and_then(|v| v.parse().ok()) {
            options.reattach_no_progress_timeout_ms = ms;
        }
        if let Some(ms) = setting(env, "AGENT_TOOL_REATTACH_WINDOW_MS").and_then(|v| v.parse().ok()) {
            options.reattach_max_window_ms = Some(ms);
        }
        options
    }

    /// With `ACCESS_TOKEN` set (a var or a secret), every request and socket must carry it:
    /// `?token=…` (the page passes its own `?token=` on through `useAgent({ query })`) or
    /// `Authorization: Bearer …`. Unset (the default), everyone gets in.
    async fn authorize(&self, host: &AgentHost<Self>, request: &HttpRequest) -> Result<(), Refusal> {
        let Some(expected) = setting(host.env(), "ACCESS_TOKEN") else { return Ok(()) };
        let from_query = agent_tools::RequestUrl::of(request).query("token");
        let from_header = request
            .headers()
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer ").map(str::to_owned));
        match from_query.or(from_header) {
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
            Some(_) => Err(Refusal::forbidden("the access token is wrong")),
            None => Err(Refusal::unauthorized("an access token is required (?token=…)")),
        }
    }

    async fn on_agent_tool_start(&self, host: &AgentHost<Self>, run: &RunInfo) {
        log_hook(host, &run.run_id, "start", None);
    }

    async fn on_agent_tool_finish(&self, host: &AgentHost<Self>, run: &RunInfo, result: &RunResult) {
        log_hook(host, &run.run_id, "finish", Some(result.status));
    }

    /// Milestones are logged (as `milestone`, with their name); plain progress is not.
    async fn on_progress(&self, host: &AgentHost<Self>, run: &RunInfo, progress: &ProgressSnapshot) {
        if let Some(name) = &progress.milestone {
            log_row(host, &run.run_id, "milestone", Some(name));
        }
    }

    async fn on_detached_finish(
        &self,
        host: &AgentHost<Self>,
        handler: &Value,
        run: &RunInfo,
        result: &RunResult,
    ) -> Result<(), String> {
        match serde_json::from_value::<DemoHandler>(handler.clone()) {
            Ok(DemoHandler::Record) => {
                log_hook(host, &run.run_id, "detached", Some(result.status));
                Ok(())
            }
            Ok(DemoHandler::Failing) => {
                log_hook(host, &run.run_id, "detached-attempt", Some(result.status));
                Err("the failing handler always fails".into())
            }
            Err(e) => Err(format!("unknown handler {handler}: {e}")),
        }
    }

    /// A scheduled research task is due: dispatch it as a background run.
    async fn on_schedule(&self, host: &AgentHost<Self>, task: ScheduledTask) {
        match task.payload::<ScheduledResearch>() {
            Ok(research) => {
                let options = RunOptions::new(json!({ "query": research.topic, "words": 6, "delayMs": 10 }))
                    .run_id(research.run_id);
                host.run_agent_tool_detached::<Researcher>(options, DetachedOptions::default()).await;
            }
            Err(e) => host.log_error(&format!("demo: {e}")),
        }
    }

    async fn call(&self, host: &AgentHost<Self>, method: &str, args: Vec<Value>) -> Result<Value, String> {
        let arg = args.into_iter().next().unwrap_or(Value::Null);
        match method {
            "research" => research(host, arg).await,
            "dispatch" => dispatch(host, arg).await,
            "cancel" => {
                let run_id = arg.get("runId").and_then(Value::as_str).ok_or("cancel expects {runId, reason?}")?;
                let reason = arg.get("reason").and_then(Value::as_str).map(str::to_owned);
                host.cancel_agent_tool(run_id, reason).await?;
                Ok(run_json(host, run_id))
            }
            "clear" => {
                let status = match arg.get("status") {
                    None | Some(Value::Null) => None,
                    Some(Value::Array(s)) => Some(
                        s.iter()
                            .map(|v| {
                                serde_json::from_value::<RunStatus>(v.clone())
                                    .map_err(|_| format!("unknown status {v}"))
                            })
                            .collect::<Result<Vec<_>, _>>()?,
                    ),
                    Some(other) => return Err(format!("clear: status must be an array, got {other}")),
                };
                let filter = ClearFilter { status, older_than: arg.get("olderThan").and_then(Value::as_i64) };
                let cleared = host.clear_agent_tool_runs(&filter).await?;
                Ok(json!({ "cleared": cleared }))
            }
            "runs" => Ok(host.agent_tool_runs().iter().map(|r| run_json(host, &r.run_id)).collect()),
            "inspect" => {
                let run_id = arg.get("runId").and_then(Value::as_str).ok_or("inspect expects {runId}")?;
                serde_json::to_value(host.inspect_agent_tool_run(run_id)).map_err(|e| e.to_string())
            }
            "chunks" => {
                let run_id = arg.get("runId").and_then(Value::as_str).ok_or("chunks expects {runId, after?}")?;
                let after = arg.get("after").and_then(Value::as_i64);
                serde_json::to_value(host.get_agent_tool_chunks(run_id, after)).map_err(|e| e.to_string())
            }
            "schedule" => {
                let task: ScheduledResearch =
                    serde_json::from_value(arg).map_err(|e| format!("schedule expects {{inMs, topic, runId}}: {e}"))?;
                if host.scheduled()?.len() >= DEMO_SCHEDULED_TASKS {
                    return Err(format!("at most {DEMO_SCHEDULED_TASKS} scheduled tasks may wait at once"));
                }
                let id = host.schedule_in(task.in_ms, &task).await?;
                Ok(json!({ "taskId": id, "scheduled": host.scheduled()?.len() }))
            }
            "bench" if setting(host.env(), "BENCH_ROUTES").as_deref() == Some("1") => {
                super::bench::bench(host, arg).await
            }
            "hooks" => {
                let sql = host.sql();
                let _ = sql.exec(HOOK_LOG, &[]);
                let rows = sql
                    .exec("SELECT run_id, hook, status FROM demo_hook_log ORDER BY n", &[])
                    .map_err(|e| e.to_string())?;
                Ok(rows.iter().map(|r| json!({ "runId": r.text(0), "hook": r.text(1), "status": r.text(2) })).collect())
            }
            other => Err(format!("Method {other} does not exist")),
        }
    }
}

/// The payload of the demo's scheduled task: research `topic` as run `run_id`, `in_ms` from now.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScheduledResearch {
    in_ms: u64,
    topic: String,
    run_id: String,
}

/// A run as the demo's `runs` and `cancel` return it: what the registry knows, its result
/// flattened beside, its latest progress and milestones, and how many chunks it stored.
fn run_json(host: &AgentHost<Assistant>, run_id: &str) -> Value {
    let Some(inspection) = host.inspect_agent_tool_run(run_id) else { return Value::Null };
    let mut out = serde_json::to_value(&inspection.info).unwrap_or_default();
    if let (Value::Object(o), Some(result)) = (&mut out, &inspection.result) {
        for key in ["summary", "output", "error", "reason", "childStillRunning"] {
            if let Some(v) = serde_json::to_value(result).ok().and_then(|r| r.get(key).cloned()) {
                o.insert(key.into(), v);
            }
        }
    }
    out["progress"] = serde_json::to_value(&inspection.progress).unwrap_or_default();
    out["milestones"] = serde_json::to_value(&inspection.milestones).unwrap_or_default();
    out["chunks"] = host.get_agent_tool_chunks(run_id, None).len().into();
    out
}

/// Which child class a dispatch names: the demo's two, by their class names.
enum Child {
    Researcher,
    Summarizer,
}

fn child(name: &str) -> Result<Child, String> {
    match name {
        "Researcher" => Ok(Child::Researcher),
        "Summarizer" => Ok(Child::Summarizer),
        other => Err(format!("unknown agent type {other:?}; Assistant dispatches [\"Researcher\", \"Summarizer\"]")),
    }
}

async fn run_awaited(host: &AgentHost<Assistant>, child: &Child, options: RunOptions) -> RunResult {
    match child {
        Child::Researcher => host.run_agent_tool::<Researcher>(options).await,
        Child::Summarizer => host.run_agent_tool::<Summarizer>(options).await,
    }
}

/// `research(topics)` or `research({topics, runIds?, parentToolCallId?, words?, delayMs?, agent?,
/// cancelAfterMs?})`: one run per topic (of `Researcher`, or the `agent` given), all at once;
/// resolves with their results in order. `cancelAfterMs` cancels them all through their
/// `signal` after that long (`0`: before they are dispatched).
async fn research(host: &AgentHost<Assistant>, arg: Value) -> Result<Value, String> {
    let (topics, options) = match arg {
        Value::Array(topics) => (topics, Value::Null),
        Value::Object(ref o) => (o.get("topics").and_then(Value::as_array).cloned().unwrap_or_default(), arg.clone()),
        _ => return Err("research expects an array of topics or {topics: [...]}".into()),
    };
    if topics.is_empty() || topics.len() > 16 {
        return Err("research takes 1 to 16 topics".into());
    }
    let run_ids = options.get("runIds").and_then(Value::as_array).cloned().unwrap_or_default();
    let agent = child(options.get("agent").and_then(Value::as_str).unwrap_or("Researcher"))?;
    let signal = options.get("cancelAfterMs").and_then(Value::as_u64).map(|ms| {
        let signal = CancelToken::new();
        let deadline = signal.clone();
        if ms == 0 {
            signal.cancel(Some("cancelled before the dispatch".into()));
        }
        let wait = host.sleep(ms);
        host.spawn(async move {
            wait.await;
            deadline.cancel(Some(format!("no result within {ms} ms")));
        });
        signal
    });
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
            signal: signal.clone(),
            ..Default::default()
        };
        run_awaited(host, &agent, opts)
    });
    let results = join_all(runs).await;
    serde_json::to_value(results).map_err(|e| e.to_string())
}

/// `dispatch({agent, input, runId?, parentToolCallId?, displayOrder?, eventDelivery?, display?,
/// detached?})`: one run of any child class, with every option; detached runs return a handle
/// at once.
async fn dispatch(host: &AgentHost<Assistant>, arg: Value) -> Result<Value, String> {
    let agent = child(arg.get("agent").and_then(Value::as_str).ok_or("dispatch expects {agent, input, ...}")?)?;
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
        signal: None,
    };
    match arg.get("detached") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {
            serde_json::to_value(run_awaited(host, &agent, options).await).map_err(|e| e.to_string())
        }
        Some(detached) => {
            let detached = detached_options(detached)?;
            let handle = match agent {
                Child::Researcher => host.run_agent_tool_detached::<Researcher>(options, detached).await,
                Child::Summarizer => host.run_agent_tool_detached::<Summarizer>(options, detached).await,
            };
            serde_json::to_value(handle).map_err(|e| e.to_string())
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
    let (notify, notify_source) = match arg.get("notify") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => (false, None),
        Some(Value::Bool(true)) => (true, None),
        Some(other) => {
            let source = other.get("source").and_then(Value::as_str).ok_or("notify: true or {source}")?;
            (true, Some(source.to_owned()))
        }
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
        notify_source,
        max_budget_ms: arg.get("maxBudgetMs").and_then(Value::as_u64),
        no_progress_budget_ms: arg.get("noProgressBudgetMs").and_then(Value::as_u64),
        on_milestones,
    })
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use agent_tools::Agent;

    /// The tool's schema uses the keywords it is meant to show, and the library accepts it.
    #[test]
    fn the_research_schema_uses_keywords_a_validator_must_check() {
        let tools = Assistant.tools();
        tools.check().expect("a schema the library validates fully");
        let spec = serde_json::to_string(&tools.specs()).unwrap();
        for keyword in ["\"pattern\"", "\"format\":\"email\"", "\"uniqueItems\":true", "\"if\"", "\"then\""] {
            assert!(spec.contains(keyword), "{keyword} in {spec}");
        }
    }
}
