//! The [`Agent`] trait: what an agent author writes. Every hook has a default, so an agent is
//! a unit struct with a system prompt, and grows hook by hook.
//!
//! One trait serves both roles, as in the TypeScript SDK: any agent can dispatch other agents
//! as tools (a *parent*) and be dispatched as a tool (a *child*), so a child may have agent tools
//! of its own. [`crate::durable_object!`] turns an agent into its Durable Object class.

use serde_json::Value;

use crate::error::Error;
use crate::host::{AgentHost, Env, HttpRequest, HttpResponse, Turn, TurnOutput};
use crate::llm::{Model, ModelError};
use crate::observability::ObservabilityEvent;
use crate::platform::model::ModelProvider;
use crate::tools::Tools;
#[allow(unused_imports)] // re-exported: the settings an agent declares
pub use crate::types::{Admission, AgentClass, AgentToolOptions, RecoveryPolicy, Retention};
use crate::types::{HandlerTag, Milestone, ProgressSnapshot, RunInfo, RunResult, RunStatus};

/// A chat agent. Implement it on a `Default` type, declare its Durable Object with
/// [`crate::durable_object!`], and route its parents with [`crate::route`].
///
/// Hooks receive the agent's [`AgentHost`]: its storage, its clients, and the calls that
/// dispatch, cancel, inspect and clear child runs.
#[allow(async_fn_in_trait)] // Workers are single-threaded; no `Send` bound is wanted.
pub trait Agent: AgentClass + Default + Sized + 'static {
    // ----- the chat agent ---------------------------------------------------------------

    /// Instructions for the model.
    fn system_prompt(&self) -> Option<String> {
        None
    }

    /// The tools the model may call: agent tools ([`crate::AgentTool`]) and ordinary
    /// server-side tools ([`crate::Tool`]). Read once per instance.
    fn tools(&self) -> Tools<Self> {
        Tools::new()
    }

    /// The most model steps in one chat turn (the AI SDK's `stepCountIs(n)`).
    fn max_steps(&self) -> usize {
        5
    }

    /// The model for a turn. `input` is the run's input when the turn is an agent-tool run,
    /// `None` for a chat turn. By default the provider the Worker's settings select
    /// ([`ModelProvider::from_env`]: `MODEL_PROVIDER`, …); return any [`Model`] of your own.
    fn model(&self, env: &Env, input: Option<&Value>) -> Result<impl Model, ModelError> {
        let _ = input;
        ModelProvider::from_env(env)
    }

    /// The engine's settings (concurrency cap, re-attach and detached budgets, recovery).
    fn agent_tool_options(&self, env: &Env) -> AgentToolOptions {
        let _ = env;
        AgentToolOptions::default()
    }

    /// Decides who may reach this agent: it sees every HTTP request and WebSocket upgrade that
    /// reaches the agent from outside (its chat socket, `GET /get-messages`, drill-in
    /// `/sub/<child>/<name>/…` to its children and their sockets, and the requests
    /// [`Agent::on_request`] would serve) before anything else runs, so a refused one leaves no
    /// row, no child and no replay. The TypeScript SDK's `onBeforeConnect` / `onBeforeRequest`,
    /// per agent. The default lets everyone in.
    ///
    /// A refused request gets `{"error": message}` with the refusal's status; a refused
    /// WebSocket is accepted and closed at once with code `4000 + status` (4401, 4403), which
    /// the stock client takes as final: it does not reconnect. A WebSocket that got in stays in
    /// (its RPC calls reach [`Agent::call`], which serves only the methods it matches).
    ///
    /// [`crate::require_token`] is the usual check: a token in `?token=` or
    /// `Authorization: Bearer`.
    async fn authorize(&self, host: &AgentHost<Self>, request: &HttpRequest) -> Result<(), Refusal> {
        let _ = (host, request);
        Ok(())
    }

    /// Serves an RPC call (`agent.call(method, args)` of the stock client): the agent's
    /// declared methods are the ones it matches. The default knows none. An `Err` rejects the
    /// call, and the client gets its message ([`Error::NotFound`] for a method the agent does
    /// not serve, [`Error::Invalid`] for arguments it refuses).
    async fn call(&self, host: &AgentHost<Self>, method: &str, args: Vec<Value>) -> Result<Value, Error> {
        let _ = (host, args);
        Err(Error::NotFound(crate::error::NotFound::Method(method.to_owned())))
    }

    /// Serves an HTTP request the built-in routes do not (a `POST` to start a run, say). The
    /// path is the agent's (`/agents/<agent>/<name>/<rest>`); a body has been read into memory
    /// (up to 1 MiB). The default answers a JSON 405 for other methods on the agent itself and
    /// a JSON 404 for anything else.
    async fn on_request(&self, host: &AgentHost<Self>, request: HttpRequest) -> HttpResponse {
        host.default_response(&request)
    }

    /// A client's `setState` (`cf_agent_state`) asks to make `next` this agent's state: `Err`
    /// refuses it with a reason the client gets (`cf_agent_state_error`; its `onStateUpdateError`)
    /// and nothing is stored. The default accepts any state.
    ///
    /// ```
    /// # use agent_tools::prelude::*;
    /// # #[derive(Default)] pub struct Assistant;
    /// # agent_tools::durable_object!(Assistant, unchecked);
    /// impl Agent for Assistant {
    ///     fn validate_state_change(&self, next: &serde_json::Value) -> Result<(), Error> {
    ///         match next["budget"].as_u64() {
    ///             Some(1..=10) => Ok(()),
    ///             _ => Err("the research budget is 1 to 10 runs".into()),
    ///         }
    ///     }
    /// }
    /// # fn main() {}
    /// ```
    fn validate_state_change(&self, next: &Value) -> Result<(), Error> {
        let _ = next;
        Ok(())
    }

    /// The state changed (the TypeScript SDK's `onStateChanged`): by the agent
    /// ([`AgentHost::set_agent_state`]) or by a client, after every other client got it.
    async fn on_state_changed(&self, host: &AgentHost<Self>, state: &Value, source: &crate::StateSource) {
        let _ = (host, state, source);
    }

    /// A task scheduled with [`AgentHost::schedule`] is due. Runs once per task (again after a
    /// crash before it returned).
    async fn on_schedule(&self, host: &AgentHost<Self>, task: crate::ScheduledTask) {
        let _ = (host, task);
    }

    /// Subscribes to the engine's structured events (they are also logged as JSON lines).
    fn on_observability(&self, event: &ObservabilityEvent) {
        let _ = event;
    }

    // ----- as a parent ------------------------------------------------------------------

    /// Fires once when a run's row is created, after its `started` frame.
    async fn on_agent_tool_start(&self, host: &AgentHost<Self>, run: &RunInfo) {
        let _ = (host, run);
    }

    /// Fires once per run when it reaches a terminal status, awaited or detached (a repaired
    /// `interrupted` run does not fire it again; a detached run's handler sees every outcome).
    /// At least once: if the object dies before the hook returns, its next instance calls it
    /// again; callers of the run get its result after the hook returned.
    async fn on_agent_tool_finish(&self, host: &AgentHost<Self>, run: &RunInfo, result: &RunResult) {
        let _ = (host, run, result);
    }

    /// Best-effort: a child's progress or milestone passed through this agent. Not durable. The
    /// snapshot's `at` is the child's time when it reported it.
    async fn on_progress(&self, host: &AgentHost<Self>, run: &RunInfo, progress: &ProgressSnapshot) {
        let _ = (host, run, progress);
    }

    /// Delivers a detached run's outcome to the handler it was dispatched with (the tag given
    /// in [`crate::DetachedOptions::on_finish`], typically the app's own enum, serialized).
    /// Called at least once per outcome (exactly once unless a delivery crashed): make it
    /// idempotent. `Err` is retried by the backbone, up to 5 attempts, then dead-lettered.
    async fn on_detached_finish(
        &self,
        host: &AgentHost<Self>,
        handler: &HandlerTag,
        run: &RunInfo,
        result: &RunResult,
    ) -> Result<(), Error> {
        let _ = (host, handler, run, result);
        Ok(())
    }

    /// As a child, with [`crate::RecoveryPolicy::Rerun`]: whether a run whose turn a restart cut
    /// short gets another attempt (the TypeScript SDK's `chatRecovery` `shouldKeepRecovering`).
    /// Asked only while [`AgentToolOptions::max_recovery_attempts`] allows one; `false` seals
    /// the run `interrupted` with its partial answer kept. The default keeps recovering.
    ///
    /// ```
    /// # use agent_tools::prelude::*;
    /// # #[derive(Default)] pub struct Importer;
    /// # agent_tools::durable_object!(Importer, unchecked);
    /// impl Agent for Importer {
    ///     // A turn that streamed a lot before its object went down is not repeated.
    ///     fn should_keep_recovering(&self, run: &agent_tools::RecoveryAttempt) -> bool {
    ///         run.chunks < 5_000
    ///     }
    /// }
    /// # fn main() {}
    /// ```
    fn should_keep_recovering(&self, run: &crate::RecoveryAttempt) -> bool {
        let _ = run;
        true
    }

    /// Whether a chat turn that a restart cut short (a deploy, a crash, an eviction, a panic) is
    /// continued from its last kept step (the TypeScript SDK's `onChatRecovery`). Asked once per
    /// continuation while [`AgentToolOptions::max_recovery_attempts`] allows one; a
    /// [`crate::ChatRecovery::Decline`] ends the turn with an error part that gives its reason.
    /// The default continues.
    ///
    /// ```
    /// # use agent_tools::prelude::*;
    /// # #[derive(Default)] pub struct Assistant;
    /// # agent_tools::durable_object!(Assistant, unchecked);
    /// use agent_tools::{ChatRecovery, InterruptedTurn};
    /// impl Agent for Assistant {
    ///     // A turn cut while it was sending mail is left to the user.
    ///     fn on_chat_recovery(&self, turn: &InterruptedTurn) -> ChatRecovery {
    ///         match turn.pending_tools.iter().any(|t| t == "send_mail") {
    ///             true => ChatRecovery::Decline("interrupted while sending mail: check your outbox".into()),
    ///             false => ChatRecovery::Continue,
    ///         }
    ///     }
    /// }
    /// # fn main() {}
    /// ```
    fn on_chat_recovery(&self, turn: &crate::InterruptedTurn) -> crate::ChatRecovery {
        let _ = turn;
        crate::ChatRecovery::Continue
    }

    /// The chat message a `notify` run injects when it finishes (empty: none). The default is
    /// the TypeScript SDK's wording.
    fn format_detached_completion(&self, run: &RunInfo, result: &RunResult) -> String {
        let label = format!("Background task \"{}\" (run {})", run.agent_type, run.run_id);
        let error = |e: &Option<String>| e.as_ref().map_or(".".to_owned(), |e| format!(": {e}"));
        match result.status {
            RunStatus::Completed => match &result.summary {
                Some(summary) if !summary.is_empty() => format!("{label} finished:\n\n{summary}"),
                _ => format!("{label} finished successfully."),
            },
            RunStatus::Error => format!("{label} failed{}", error(&result.error)),
            RunStatus::Aborted => format!("{label} was cancelled."),
            RunStatus::Interrupted if result.reason == Some(crate::InterruptedReason::BudgetExceeded) => {
                format!("{label} ran out of time before completing and was stopped.")
            }
            RunStatus::Interrupted => format!("{label} was interrupted before completing{}", error(&result.error)),
            status => format!("{label} ended ({}).", status.as_str()),
        }
    }

    /// The chat line a milestone of an `on_milestones` run adds (empty: none). The default is
    /// the TypeScript SDK's wording.
    fn format_detached_milestone(&self, run: &RunInfo, milestone: &Milestone) -> String {
        milestone_line(run, milestone)
    }

    /// The drill-in gate: runs before a `/sub/<child>/<name>` request reaches the child. Return
    /// a response to refuse it. The default refuses (404) any name that is not a known run of
    /// that child class, so a guessed id never creates a child (and answers 500 when the
    /// registry cannot be read: nothing is let through on a failed check).
    async fn on_before_sub_agent(
        &self,
        host: &AgentHost<Self>,
        request: &HttpRequest,
        child: &SubAgent,
    ) -> Option<HttpResponse> {
        let _ = request;
        match host.has_agent_tool_run(&child.class, &child.name) {
            Ok(true) => None,
            Ok(false) => Some(crate::host::json_error(
                404,
                format!("no {} run {:?} on this {}", child.class, child.name, Self::CLASS),
            )),
            Err(e) => Some(crate::host::json_error(500, e.to_string())),
        }
    }

    // ----- as a child -------------------------------------------------------------------

    /// The user message that starts a run: the input as text (a string as is, anything else as
    /// pretty JSON), with id `agent-tool-<run>-input`.
    fn format_agent_tool_input(&self, input: &Value, run_id: &str) -> Value {
        let text = match input {
            Value::String(s) => s.clone(),
            other => serde_json::to_string_pretty(other).unwrap_or_default(),
        };
        crate::chat::message::user_text(format!("agent-tool-{run_id}-input"), text)
    }

    /// Structured output of a finished run (default: none). Read right after the turn ends;
    /// `message` is the assistant's `UIMessage`.
    fn agent_tool_output(&self, turn: &Turn<Self>, message: &Value) -> Option<Value> {
        let _ = (turn, message);
        None
    }

    /// Run `run_id`'s summary, what the parent's model reads: by default the assistant's text,
    /// or the output's JSON when the turn produced no text (the TypeScript SDK's
    /// `getAgentToolSummary(runId, output)`, also handed the text).
    fn agent_tool_summary(&self, run_id: &str, text: &str, output: Option<&Value>) -> String {
        let _ = run_id;
        match output {
            Some(o) if text.is_empty() => o.to_string(),
            _ => text.to_owned(),
        }
    }

    /// Runs an agent-tool run. The default runs a chat turn ([`Turn::chat`]); override it to
    /// report progress around the chat, or for workflow-style work that streams chunks with
    /// [`Turn::emit`]. An `Err` ends the run as `error`; a cancel drops this future.
    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        turn.chat().await
    }
}

/// Why [`Agent::authorize`] turned a request away: an HTTP status (401, 403, …) and a message
/// for the client.
///
/// ```
/// use agent_tools::Refusal;
///
/// assert_eq!(Refusal::unauthorized("sign in first").status, 401);
/// assert_eq!(Refusal::new(429, "slow down").status, 429);
/// assert_eq!(Refusal::new(500, "not a refusal's status").status, 403, "anything but a 4xx is a 403");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// The HTTP status; a WebSocket is closed with `4000 + status`.
    pub status: u16,
    /// What the client is told.
    pub message: String,
}

impl Refusal {
    /// A refusal with any 4xx status (anything else counts as 403).
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        let status = if (400..500).contains(&status) { status } else { 403 };
        Self { status, message: message.into() }
    }

    /// 401: the client did not say who it is.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, message)
    }

    /// 403: the client may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, message)
    }
}

/// Admits a request that carries `expected` as its `?token=` query parameter (what the stock
/// client's `useAgent({ query: { token } })` sends, WebSocket upgrades included) or as
/// `Authorization: Bearer <token>`; refuses it otherwise: 401 when it carries no token, 403
/// when the token is wrong. The comparison takes the same time wherever the two differ. For
/// [`Agent::authorize`]:
///
/// ```
/// # use agent_tools::{Agent, AgentHost, HttpRequest, Refusal};
/// # #[derive(Default)] pub struct Planner;
/// # agent_tools::durable_object!(Planner, unchecked);
/// impl Agent for Planner {
///     async fn authorize(&self, host: &AgentHost<Self>, request: &HttpRequest) -> Result<(), Refusal> {
///         match host.env().var("ACCESS_TOKEN") {
///             Some(token) => agent_tools::require_token(request, &token),
///             None => Ok(()), // no token configured: everyone gets in
///         }
///     }
/// }
/// # fn main() {}
/// ```
pub fn require_token(request: &HttpRequest, expected: &str) -> Result<(), Refusal> {
    let from_query = crate::RequestUrl::of(request).query("token");
    let from_header = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_owned);
    match from_query.or(from_header) {
        Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => Err(Refusal::forbidden("the access token is wrong")),
        None => Err(Refusal::unauthorized("an access token is required (?token=… or Authorization: Bearer …)")),
    }
}

/// Whether `a == b`, in a time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A drill-in target: the child class and the run id (its instance name) a
/// `/sub/<child>/<name>` path names.
///
/// What [`crate::Agent::on_before_sub_agent`] is asked about, for a drill-in path
/// `/agents/<parent>/<name>/sub/<child>/<run-id>`:
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Desk;
/// # agent_tools::durable_object!(Desk, unchecked);
/// # fn main() {}
/// impl Agent for Desk {
///     async fn on_before_sub_agent(
///         &self,
///         host: &AgentHost<Self>,
///         _request: &HttpRequest,
///         child: &SubAgent,
///     ) -> Option<HttpResponse> {
///         // Only runs this parent dispatched, and only its researchers.
///         match host.has_agent_tool_run(&child.class, &child.name) {
///             Ok(true) if child.class == "Researcher" => None,
///             Ok(_) => Some(agent_tools::json_error(404, "no such run")),
///             Err(_) => Some(agent_tools::json_error(500, "the runs cannot be read")),
///         }
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubAgent {
    /// The child class, as recorded for the run (`Researcher`); the kebab-case of the path
    /// segment when no run matches.
    pub class: String,
    /// The run id.
    pub name: String,
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    fn request(uri: &str, bearer: Option<&str>) -> HttpRequest {
        let mut builder = http::Request::builder().uri(uri);
        if let Some(token) = bearer {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        builder.body(Vec::new()).expect("a request")
    }

    #[test]
    fn a_token_is_taken_from_the_query_or_the_bearer_header() {
        let secret = "s3cret-token";
        assert_eq!(require_token(&request("https://w/agents/a/n?token=s3cret-token", None), secret), Ok(()));
        assert_eq!(require_token(&request("https://w/agents/a/n", Some("s3cret-token")), secret), Ok(()));
        let wrong = require_token(&request("https://w/agents/a/n?token=s3cret-tokem", None), secret);
        assert_eq!(wrong.unwrap_err().status, 403);
        let shorter = require_token(&request("https://w/agents/a/n", Some("s3cret")), secret);
        assert_eq!(shorter.unwrap_err().status, 403);
        let none = require_token(&request("https://w/agents/a/n", None), secret);
        assert_eq!(none.unwrap_err().status, 401);
        let basic = http::Request::builder()
            .uri("https://w/agents/a/n")
            .header("authorization", "Basic czNjcmV0LXRva2Vu")
            .body(Vec::new())
            .unwrap();
        assert_eq!(require_token(&basic, secret).unwrap_err().status, 401, "only a bearer token counts");
        assert!(
            constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"ab", b"abc")
        );
    }
}

/// The default chat line of a detached run's milestone ([`Agent::format_detached_milestone`]),
/// the TypeScript SDK's wording: for an override that changes some milestones only.
pub fn milestone_line(run: &RunInfo, milestone: &Milestone) -> String {
    let detail = milestone
        .data
        .as_ref()
        .map(|d| format!("\n\n{}", serde_json::to_string_pretty(d).unwrap_or_default()))
        .unwrap_or_default();
    format!(
        "Background task \"{}\" (run {}) reached milestone \"{}\".{detail}",
        run.agent_type, run.run_id, milestone.name
    )
}
