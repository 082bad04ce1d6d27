//! The demo's parent agent: a chat agent with the `research` tool, and RPC methods for
//! imperative runs and the lifecycle (`research`, `dispatch`, `cancel`, `clear`, `runs`,
//! `hooks`).

use std::time::Duration;

use agent_tools::prelude::*;
use agent_tools::sql::Value as SqlValue;
use agent_tools::{
    Admission, CancelToken, ClearFilter, EventDelivery, HandlerTag, OnMilestones, ProgressSnapshot, Refusal, RunInfo,
    RunStatus, ScheduledTask,
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
#[derive(Debug, JsonSchema, serde::Deserialize)]
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
#[derive(Debug, JsonSchema, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Depth {
    /// A quick look.
    Quick,
    /// A thorough one, from given sources.
    Deep,
}

/// The demo's default cap on live runs per parent (`MAX_CONCURRENT_AGENT_TOOLS`).
const DEMO_LIVE_RUNS: usize = 64;

/// The parent: a chat agent whose model researches topics with `Researcher` children.
#[derive(Debug, Default)]
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
    /// The demo's state: `{"budget": n}`, the research budget a user sets (1 to 10 runs).
    fn validate_state_change(&self, next: &Value) -> Result<(), Error> {
        match next.get("budget").and_then(Value::as_u64) {
            Some(1..=10) if next.as_object().is_some_and(|o| o.len() == 1) => Ok(()),
            _ => Err("the state is {\"budget\": n}, a research budget of 1 to 10 runs".into()),
        }
    }

    fn system_prompt(&self) -> Option<String> {
        Some(
            "You are a helpful assistant. For each topic the user wants researched, call the research tool \
             once per topic, all in the same step, then summarise what the researchers found. To publish \
             findings, call publish (the user approves it first). For the user's local time, call local_time \
             (their browser answers)."
                .into(),
        )
    }

    /// `research` (a child per topic), `publish` (a child too, dispatched only once the user
    /// approves the call), `review` (asks the user whether a background research that waits may
    /// publish, and tells it) and `local_time` (the browser answers it).
    fn tools(&self) -> Tools<Self> {
        Tools::new()
            .agent(research_tool())
            .agent(publish_tool())
            .tool(Review)
            .client(ClientTool::new("local_time", "The user's local date and time, as their browser tells it."))
    }

    /// A background research that waits for approval asks the chat as `review <run id>`, which
    /// the model answers with the `review` tool; other milestones have the default wording.
    fn format_detached_milestone(&self, run: &RunInfo, milestone: &Milestone) -> String {
        if milestone.name == "needs-approval" {
            return format!("review {}", run.run_id);
        }
        agent_tools::milestone_line(run, milestone)
    }

    /// `MAX_CONCURRENT_AGENT_TOOLS` (default 64; `0` for unlimited), `AGENT_TOOL_ADMISSION`
    /// (`reject` or `queue`), `AGENT_TOOL_ALARM_MS` (the recovery alarm's interval, default
    /// 10 000), `AGENT_TOOL_BACKBONE_MS` (a comma-separated backbone cadence),
    /// `AGENT_TOOL_RETAIN_RUNS` and `AGENT_TOOL_RETAIN_MS` (the retention policy; `0` for no
    /// limit).
    fn agent_tool_options(&self, env: &Env) -> AgentToolOptions {
        let number = |name: &str| setting(env, name).and_then(|v| v.trim().parse::<u64>().ok());
        let cap = number("MAX_CONCURRENT_AGENT_TOOLS").map_or(DEMO_LIVE_RUNS, |n| n as usize);
        let mut options = AgentToolOptions::default();
        if cap > 0 {
            options = options.max_concurrent(cap);
        }
        if let Some(n) = number("AGENT_TOOL_RETAIN_RUNS") {
            options.retention.max_runs = (n > 0).then_some(n as usize);
        }
        if let Some(ms) = number("AGENT_TOOL_RETAIN_MS") {
            options.retention.max_age = (ms > 0).then(|| Duration::from_millis(ms));
        }
        if setting(env, "AGENT_TOOL_ADMISSION").as_deref() == Some("queue") {
            options = options.admission(Admission::Queue);
        }
        if let Some(ms) = number("AGENT_TOOL_ALARM_MS") {
            options = options.recovery_alarm(Duration::from_millis(ms));
        }
        if let Some(cadence) = setting(env, "AGENT_TOOL_BACKBONE_MS") {
            let cadence: Vec<Duration> =
                cadence.split(',').filter_map(|n| n.trim().parse().ok()).map(Duration::from_millis).collect();
            options = options.backbone_cadence(&cadence);
        }
        if let Some(ms) = number("AGENT_TOOL_REATTACH_NO_PROGRESS_MS") {
            options = options.reattach_no_progress_timeout(Duration::from_millis(ms));
        }
        if let Some(ms) = number("AGENT_TOOL_REATTACH_WINDOW_MS") {
            options = options.reattach_max_window(Duration::from_millis(ms));
        }
        options
    }

    /// With `ACCESS_TOKEN` set (a var or a secret), every request and socket must carry it:
    /// `?token=…` (the page passes its own `?token=` on through `useAgent({ query })`) or
    /// `Authorization: Bearer …`. Unset (the default), everyone gets in.
    async fn authorize(&self, host: &AgentHost<Self>, request: &HttpRequest) -> Result<(), Refusal> {
        match setting(host.env(), "ACCESS_TOKEN") {
            Some(expected) => agent_tools::require_token(request, &expected),
            None => Ok(()),
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
        handler: &HandlerTag,
        run: &RunInfo,
        result: &RunResult,
    ) -> Result<(), Error> {
        match handler.decode::<DemoHandler>()? {
            DemoHandler::Record => {
                log_hook(host, &run.run_id, "detached", Some(result.status));
                Ok(())
            }
            DemoHandler::Failing => {
                log_hook(host, &run.run_id, "detached-attempt", Some(result.status));
                Err("the failing handler always fails".into())
            }
        }
    }

    /// A scheduled research task is due: dispatch it as a background run.
    async fn on_schedule(&self, host: &AgentHost<Self>, task: ScheduledTask) {
        match task.payload::<ScheduledResearch>() {
            Ok(research) => {
                let options = RunOptions::new(json!({ "query": research.topic, "words": 6, "delayMs": 10 }))
                    .run_id(research.run_id);
                if let Err(e) = host.run_agent_tool_detached::<Researcher>(options, DetachedOptions::default()).await {
                    host.log_error(&format!("demo: the scheduled research was refused: {e}"));
                }
            }
            Err(e) => host.log_error(&format!("demo: {e}")),
        }
    }

    async fn call(&self, host: &AgentHost<Self>, method: &str, args: Vec<Value>) -> Result<Value, Error> {
        let arg = args.into_iter().next().unwrap_or(Value::Null);
        match method {
            "research" => research(host, arg).await,
            "dispatch" => dispatch(host, arg).await,
            "cancel" => {
                let RunArg { run_id, reason, .. } = rpc_arg("cancel", "{runId, reason?}", arg)?;
                host.cancel_agent_tool(&run_id, reason)?;
                run_json(host, &run_id).await
            }
            "clear" => {
                let ClearArgs { status, older_than } =
                    rpc_arg("clear", "{status?: [statuses], olderThan?: epoch ms}", arg)?;
                let mut filter = ClearFilter::all();
                filter.status = status;
                if let Some(ms) = older_than {
                    filter = filter.older_than(std::time::UNIX_EPOCH + Duration::from_millis(ms));
                }
                let cleared = host.clear_agent_tool_runs(&filter).await?;
                Ok(json!({ "cleared": cleared }))
            }
            "runs" => {
                let mut rows = Vec::new();
                for run in host.agent_tool_runs()? {
                    rows.push(run_json(host, &run.run_id).await?);
                }
                Ok(Value::Array(rows))
            }
            "inspect" => {
                let RunArg { run_id, .. } = rpc_arg("inspect", "{runId}", arg)?;
                serde_json::to_value(host.inspect_agent_tool_run(&run_id)?).map_err(|e| Error::Failed(e.to_string()))
            }
            "chunks" => {
                let RunArg { run_id, after, .. } = rpc_arg("chunks", "{runId, after?}", arg)?;
                serde_json::to_value(host.agent_tool_chunks(&run_id, after).await?)
                    .map_err(|e| Error::Failed(e.to_string()))
            }
            "ask" => ask(host, rpc_arg("ask", "{name, message?, turnId?, after?, stopAfter?}", arg)?).await,
            "schedule" => {
                let task: ScheduledResearch =
                    serde_json::from_value(arg).map_err(|e| Error::json("schedule expects {inMs, topic, runId}", e))?;
                if host.scheduled()?.len() >= DEMO_SCHEDULED_TASKS {
                    return Err(format!("at most {DEMO_SCHEDULED_TASKS} scheduled tasks may wait at once").into());
                }
                let id = host.schedule_in(Duration::from_millis(task.in_ms), &task).await?;
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
                    .map_err(|e| Error::Failed(e.to_string()))?;
                Ok(rows.iter().map(|r| json!({ "runId": r.text(0), "hook": r.text(1), "status": r.text(2) })).collect())
            }
            other => Err(format!("Method {other} does not exist").into()),
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
async fn run_json(host: &AgentHost<Assistant>, run_id: &str) -> Result<Value, Error> {
    let Some(inspection) = host.inspect_agent_tool_run(run_id)? else { return Ok(Value::Null) };
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
    out["chunks"] = host.agent_tool_chunks(run_id, None).await?.len().into();
    Ok(out)
}

/// Which child class a dispatch names: the demo's two, by their class names.
#[derive(serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Child {
    #[default]
    Researcher,
    Summarizer,
}

impl Child {
    /// Checks a run's input against the schema of the tool the model dispatches this child with
    /// (the same check as a model's tool call); `Summarizer` has no tool, so any JSON input does.
    fn check_input(self, input: &Value) -> Result<(), Error> {
        match self {
            Child::Researcher => research_tool().check_input(input),
            Child::Summarizer => Ok(()),
        }
    }
}

/// The `research` tool the model sees; RPC inputs for `Researcher` are checked against it too.
fn research_tool() -> AgentTool {
    AgentTool::of::<Researcher>("research", "Research one topic in depth and report the findings.")
        .input::<ResearchInput>()
        .display_name("Researcher")
        .icon("🔎")
}

/// The `review` tool's input.
#[derive(JsonSchema, serde::Deserialize)]
struct ReviewInput {
    /// The run that waits for approval.
    run_id: String,
}

/// Asks the user (the call needs approval) whether a background research may publish, and
/// tells the run either way: approved, when the call runs; denied, from `on_denied`.
struct Review;

impl Tool<Assistant> for Review {
    type Input = ReviewInput;
    type Output = String;
    fn name(&self) -> &str {
        "review"
    }
    fn description(&self) -> &str {
        "Ask the user whether a background research run that waits for approval may publish its findings."
    }
    fn needs_approval(&self, _input: &ReviewInput) -> bool {
        true
    }
    async fn execute(&self, ctx: &ToolContext<'_, Assistant>, input: ReviewInput) -> Result<String, Error> {
        ctx.host().send_to_agent_tool_run(&input.run_id, "approval", &json!({ "approved": true })).await?;
        Ok(format!("{} may publish", input.run_id))
    }
    async fn on_denied(&self, ctx: &ToolContext<'_, Assistant>, input: ReviewInput, reason: &str) {
        let decision = json!({ "approved": false, "reason": reason });
        if let Err(e) = ctx.host().send_to_agent_tool_run(&input.run_id, "approval", &decision).await {
            ctx.host().log_error(&format!("telling {} it was not approved failed: {e}", input.run_id));
        }
    }
}

/// The `publish` tool: a researcher whose findings are "published"; every call waits for the
/// user's approval (the stock approval request), and no child starts before it.
fn publish_tool() -> AgentTool {
    AgentTool::of::<Researcher>("publish", "Research a topic and publish the findings; the user approves it first.")
        .input::<ResearchInput>()
        .display_name("Publisher")
        .icon("📣")
        .needs_approval()
}

async fn run_awaited(host: &AgentHost<Assistant>, child: Child, options: RunOptions) -> RunResult {
    match child {
        Child::Researcher => host.run_agent_tool::<Researcher>(options).await,
        Child::Summarizer => host.run_agent_tool::<Summarizer>(options).await,
    }
}

/// Reads an RPC method's argument as `T`, strictly (no unknown fields, no wrong types): the
/// error names the method and what was wrong.
fn rpc_arg<T: serde::de::DeserializeOwned>(method: &str, shape: &str, arg: Value) -> Result<T, Error> {
    // No argument at all reads as `{}`: what is required is then named as missing.
    let arg = if arg.is_null() { json!({}) } else { arg };
    serde_json::from_value(arg).map_err(|e| Error::json(format!("{method} expects {shape}"), e))
}

/// The argument of `cancel`, `inspect` and `chunks`: a run id (and what each takes besides).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RunArg {
    run_id: String,
    reason: Option<String>,
    after: Option<i64>,
}

/// `clear({status?, olderThan?})`'s argument.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClearArgs {
    status: Option<Vec<RunStatus>>,
    older_than: Option<u64>,
}

/// `ask({name, message, stopAfter?})` or `ask({name, turnId, after?})`'s argument.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AskArgs {
    name: String,
    message: Option<String>,
    turn_id: Option<String>,
    after: Option<i64>,
    stop_after: Option<usize>,
}

/// `ask`: a direct chat with the `Researcher` sub-agent named `name` (no agent tool, no run
/// row): `message` starts a turn and reads it (dropping it, which cancels it, after `stopAfter`
/// chunks); `turnId` reads a turn again after log index `after`. Answers `{turnId, text,
/// chunks, status, summary}` (`status` is `null` when the reading stopped first).
async fn ask(host: &AgentHost<Assistant>, args: AskArgs) -> Result<Value, Error> {
    let sub = host.sub_agent::<Researcher>(&args.name);
    let mut turn = match (args.message, args.turn_id) {
        (Some(message), None) => sub.chat(message).await?,
        (None, Some(turn)) => sub.resume(&turn, args.after.unwrap_or(-1)).await?,
        _ => return Err("ask expects {name, message} or {name, turnId, after?}".into()),
    };
    let (mut text, mut chunks) = (String::new(), 0);
    while let Some(chunk) = turn.next().await {
        let chunk = chunk?;
        chunks += 1;
        if chunk.chunk["type"] == "text-delta" {
            text.push_str(chunk.chunk["delta"].as_str().unwrap_or_default());
        }
        if args.stop_after.is_some_and(|n| chunks >= n) {
            break;
        }
    }
    let (status, summary) = turn.outcome().map(|o| (o.status(), o.summary().map(str::to_owned))).unzip();
    Ok(
        json!({ "turnId": turn.turn_id(), "text": text, "chunks": chunks, "status": status, "summary": summary.flatten() }),
    )
}

/// `research({topics, ...})`'s argument.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResearchArgs {
    topics: Vec<String>,
    #[serde(default)]
    run_ids: Vec<String>,
    parent_tool_call_id: Option<String>,
    words: Option<u32>,
    delay_ms: Option<u32>,
    #[serde(default)]
    agent: Child,
    cancel_after_ms: Option<u64>,
}

const RESEARCH_SHAPE: &str =
    "[topics] or {topics, runIds?, parentToolCallId?, words?, delayMs?, agent?, cancelAfterMs?}";

/// `research(topics)` or `research({topics, runIds?, parentToolCallId?, words?, delayMs?, agent?,
/// cancelAfterMs?})`: one run per topic (of `Researcher`, or the `agent` given), all at once;
/// resolves with their results in order. `cancelAfterMs` cancels them all through their
/// `signal` after that long (`0`: before they are dispatched). Every argument is checked, and
/// every topic's input against the `research` tool's schema, before anything starts.
async fn research(host: &AgentHost<Assistant>, arg: Value) -> Result<Value, Error> {
    let args: ResearchArgs = match arg {
        Value::Array(_) => ResearchArgs {
            topics: rpc_arg("research", RESEARCH_SHAPE, arg)?,
            run_ids: Vec::new(),
            parent_tool_call_id: None,
            words: None,
            delay_ms: None,
            agent: Child::Researcher,
            cancel_after_ms: None,
        },
        arg => rpc_arg("research", RESEARCH_SHAPE, arg)?,
    };
    if args.topics.is_empty() || args.topics.len() > 16 {
        return Err("research takes 1 to 16 topics".into());
    }
    let inputs = args
        .topics
        .iter()
        .map(|topic| {
            let mut input = json!({ "query": topic });
            if let Some(words) = args.words {
                input["words"] = words.into();
            }
            if let Some(delay) = args.delay_ms {
                input["delayMs"] = delay.into();
            }
            args.agent.check_input(&input).map(|()| input)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let signal = args.cancel_after_ms.map(|ms| {
        let signal = CancelToken::new();
        let deadline = signal.clone();
        if ms == 0 {
            signal.cancel(Some("cancelled before the dispatch".into()));
        }
        let wait = host.sleep(Duration::from_millis(ms));
        host.spawn(async move {
            wait.await;
            deadline.cancel(Some(format!("no result within {ms} ms")));
        });
        signal
    });
    let runs = inputs.into_iter().enumerate().map(|(i, input)| {
        let opts = RunOptions {
            input,
            run_id: args.run_ids.get(i).cloned(),
            parent_tool_call_id: args.parent_tool_call_id.clone(),
            display_order: Some(i as i64),
            signal: signal.clone(),
            ..Default::default()
        };
        run_awaited(host, args.agent, opts)
    });
    let results = join_all(runs).await;
    serde_json::to_value(results).map_err(|e| Error::Failed(e.to_string()))
}

/// `dispatch({...})`'s argument.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DispatchArgs {
    agent: Child,
    input: Value,
    run_id: Option<String>,
    parent_tool_call_id: Option<String>,
    display_order: Option<u32>,
    input_preview: Option<String>,
    display: Option<Value>,
    #[serde(default)]
    event_delivery: EventDelivery,
    /// `false`, `true` or a [`DetachedArgs`] object.
    detached: Option<Value>,
}

/// `detached: {onFinish?: "record"|"failing", notify?: true|{source}, maxBudgetMs?,
/// noProgressBudgetMs?, onMilestones?: [names] | {names, mode}}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DetachedArgs {
    on_finish: Option<DemoHandler>,
    /// `false`, `true` or `{source}`.
    notify: Option<Value>,
    max_budget_ms: Option<u64>,
    no_progress_budget_ms: Option<u64>,
    /// `[names]` or `{names, mode}`.
    on_milestones: Option<Value>,
}

/// `notify`'s `{source}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifySource {
    source: String,
}

const DETACHED_SHAPE: &str = "detached: true or {onFinish?: \"record\"|\"failing\", notify?: true|{source}, \
     maxBudgetMs?, noProgressBudgetMs?, onMilestones?: [names]|{names, mode}}";

const DISPATCH_SHAPE: &str = "{agent: \"Researcher\"|\"Summarizer\", input, runId?, parentToolCallId?, displayOrder?, \
     inputPreview?, display?, eventDelivery?: \"full\"|\"terminal\", detached?: true|{onFinish?, notify?, maxBudgetMs?, \
     noProgressBudgetMs?, onMilestones?}}";

/// `dispatch({agent, input, runId?, parentToolCallId?, displayOrder?, eventDelivery?, display?,
/// detached?})`: one run of any child class, with every option; detached runs return a handle
/// at once. Every argument is checked, and the input against the child's tool schema, before
/// anything starts.
async fn dispatch(host: &AgentHost<Assistant>, arg: Value) -> Result<Value, Error> {
    let args: DispatchArgs = rpc_arg("dispatch", DISPATCH_SHAPE, arg)?;
    args.agent.check_input(&args.input)?;
    let mut options = RunOptions::new(args.input).event_delivery(args.event_delivery);
    options.run_id = args.run_id;
    options.parent_tool_call_id = args.parent_tool_call_id;
    options.display_order = args.display_order.map(i64::from);
    options.input_preview = args.input_preview;
    options.display = args.display;
    let detached = match args.detached {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(DetachedOptions::default()),
        Some(d) => Some(detached_options(rpc_arg("dispatch", DETACHED_SHAPE, d)?)?),
    };
    match detached {
        None => {
            serde_json::to_value(run_awaited(host, args.agent, options).await).map_err(|e| Error::Failed(e.to_string()))
        }
        Some(detached) => {
            let run_id = options.run_id.clone();
            let handle = match args.agent {
                Child::Researcher => host.run_agent_tool_detached::<Researcher>(options, detached).await,
                Child::Summarizer => host.run_agent_tool_detached::<Summarizer>(options, detached).await,
            };
            match handle {
                Ok(handle) => serde_json::to_value(handle).map_err(|e| Error::Failed(e.to_string())),
                // Over RPC, a refusal is the TypeScript SDK's handle with status `error`.
                Err(e) => Ok(
                    json!({ "runId": run_id, "agentType": format!("{:?}", args.agent), "status": "error", "error": e.to_string() }),
                ),
            }
        }
    }
}

fn detached_options(d: DetachedArgs) -> Result<DetachedOptions, Error> {
    let (notify, notify_source) = match d.notify {
        None | Some(Value::Null) | Some(Value::Bool(false)) => (false, None),
        Some(Value::Bool(true)) => (true, None),
        Some(source) => {
            let NotifySource { source } = rpc_arg("dispatch", "detached.notify: true or {source}", source)?;
            (true, Some(source))
        }
    };
    let on_milestones = match d.on_milestones {
        None | Some(Value::Null) => None,
        Some(names @ Value::Array(_)) => Some(OnMilestones::narrate(rpc_arg::<Vec<String>>(
            "dispatch",
            "detached.onMilestones: [names] or {names, mode}",
            names,
        )?)),
        Some(with) => Some(rpc_arg("dispatch", "detached.onMilestones: [names] or {names, mode}", with)?),
    };
    let mut options = DetachedOptions::default();
    if let Some(tag) = d.on_finish {
        options = options.on_finish(&tag);
    }
    if notify {
        options = options.notify();
    }
    if let Some(source) = notify_source {
        options = options.notify_source(source);
    }
    if let Some(ms) = d.max_budget_ms {
        options = options.max_budget(Duration::from_millis(ms));
    }
    if let Some(ms) = d.no_progress_budget_ms {
        options = options.no_progress_budget(Duration::from_millis(ms));
    }
    if let Some(milestones) = on_milestones {
        options = options.on_milestones(milestones);
    }
    Ok(options)
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
