//! The agent as the host sees it: its hooks behind one object-safe trait, so the host's code
//! (routing, sockets, the alarm, driving runs as parent and as child) is compiled once for every
//! agent class of a Worker instead of once per class. Only these forwarding calls, the agent's
//! tools and its [`Turn`] are compiled per agent type.

use std::rc::Rc;

use serde_json::Value;

use super::child::{Turn, TurnOutput};
use super::core::{AgentHost, Host};
pub(crate) use super::io::LocalFuture;
use super::io::{HttpRequest, HttpResponse};
use super::tools::HostTools;
use crate::agent::{Agent, Refusal, SubAgent};
use crate::cancel::CancelToken;
use crate::chat::turn::DynModel;
use crate::observability::ObservabilityEvent;
use crate::tools::Tools;
use crate::types::{Milestone, ProgressSnapshot, RunInfo, RunResult, ScheduledTask};

/// The agent of one Durable Object and its tools: what [`Hooks`] is implemented for, and what
/// an [`AgentHost`] holds beside the erased host.
pub(crate) struct Parts<A: Agent> {
    pub(crate) agent: A,
    pub(crate) tools: Tools<A>,
}

/// An agent's hooks with its type erased. Each call hands the hook the typed
/// [`AgentHost`] it expects, made from the erased host and these parts.
pub(crate) trait Hooks {
    fn authorize<'a>(self: Rc<Self>, host: &Host, request: &'a HttpRequest) -> LocalFuture<'a, Result<(), Refusal>>;
    fn call<'a>(
        self: Rc<Self>,
        host: &Host,
        method: &'a str,
        args: Vec<Value>,
    ) -> LocalFuture<'a, Result<Value, String>>;
    fn on_request(self: Rc<Self>, host: &Host, request: HttpRequest) -> LocalFuture<'static, HttpResponse>;
    fn on_schedule(self: Rc<Self>, host: &Host, task: ScheduledTask) -> LocalFuture<'static, ()>;
    fn on_observability(&self, event: &ObservabilityEvent);
    fn validate_state_change(&self, next: &Value) -> Result<(), String>;
    fn on_state_changed<'a>(
        self: Rc<Self>,
        host: &Host,
        state: &'a Value,
        source: &'a crate::StateSource,
    ) -> LocalFuture<'a, ()>;
    fn on_agent_tool_start<'a>(self: Rc<Self>, host: &Host, run: &'a RunInfo) -> LocalFuture<'a, ()>;
    fn on_agent_tool_finish<'a>(
        self: Rc<Self>,
        host: &Host,
        run: &'a RunInfo,
        result: &'a RunResult,
    ) -> LocalFuture<'a, ()>;
    fn on_progress<'a>(
        self: Rc<Self>,
        host: &Host,
        run: &'a RunInfo,
        progress: &'a ProgressSnapshot,
    ) -> LocalFuture<'a, ()>;
    fn on_detached_finish<'a>(
        self: Rc<Self>,
        host: &Host,
        handler: &'a Value,
        run: &'a RunInfo,
        result: &'a RunResult,
    ) -> LocalFuture<'a, Result<(), String>>;
    fn format_detached_completion(&self, run: &RunInfo, result: &RunResult) -> String;
    fn should_keep_recovering(&self, run: &crate::RecoveryAttempt) -> bool;
    fn format_detached_milestone(&self, run: &RunInfo, milestone: &Milestone) -> String;
    fn on_before_sub_agent<'a>(
        self: Rc<Self>,
        host: &Host,
        request: &'a HttpRequest,
        child: &'a SubAgent,
    ) -> LocalFuture<'a, Option<HttpResponse>>;
    /// Runs a chat turn a client (or a detached run's notice) asked for, with the agent's
    /// model and tools.
    fn run_chat_turn(
        self: Rc<Self>,
        host: &Host,
        request_id: String,
        sender: Option<String>,
    ) -> LocalFuture<'static, ()>;
    /// Continues a chat turn from its journal: one a restart cut short, or (`fresh`) one that
    /// paused for a person and was answered.
    fn continue_chat_turn(
        self: Rc<Self>,
        host: &Host,
        turn: crate::chat::journal::OpenTurn,
        max_attempts: u32,
        slot: Option<super::chat::TurnSlot>,
        fresh: bool,
    ) -> LocalFuture<'static, super::chat::ChatEnd>;
    /// Runs an agent-tool run's turn ([`Agent::run`]).
    fn run(
        self: Rc<Self>,
        host: &Host,
        run_id: String,
        input: Value,
        attempt: i64,
        cancel: CancelToken,
    ) -> LocalFuture<'static, Result<TurnOutput, String>>;
}

/// The model of an agent's chat turns: the test kit's scripted one, else the agent's own.
enum ChatModel<'a> {
    Scripted(Rc<dyn DynModel>),
    Own(Box<dyn DynModel + 'a>),
}

impl ChatModel<'_> {
    fn get(&self) -> &dyn DynModel {
        match self {
            Self::Scripted(model) => &**model,
            Self::Own(model) => &**model,
        }
    }
}

fn chat_model<A: Agent>(host: &AgentHost<A>) -> Result<ChatModel<'_>, crate::llm::ModelError> {
    if let Some(model) = host.host.0.io.model() {
        return Ok(ChatModel::Scripted(model));
    }
    Ok(ChatModel::Own(Box::new(host.parts.agent.model(host.host.0.io.env(), None)?)))
}

impl<A: Agent> Parts<A> {
    fn typed(self: Rc<Self>, host: &Host) -> AgentHost<A> {
        AgentHost { host: host.clone(), parts: self }
    }
}

impl<A: Agent> Hooks for Parts<A> {
    fn authorize<'a>(self: Rc<Self>, host: &Host, request: &'a HttpRequest) -> LocalFuture<'a, Result<(), Refusal>> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.authorize(&host, request).await })
    }

    fn call<'a>(
        self: Rc<Self>,
        host: &Host,
        method: &'a str,
        args: Vec<Value>,
    ) -> LocalFuture<'a, Result<Value, String>> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.call(&host, method, args).await.map_err(|e| e.to_string()) })
    }

    fn on_request(self: Rc<Self>, host: &Host, request: HttpRequest) -> LocalFuture<'static, HttpResponse> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.on_request(&host, request).await })
    }

    fn on_schedule(self: Rc<Self>, host: &Host, task: ScheduledTask) -> LocalFuture<'static, ()> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.on_schedule(&host, task).await })
    }

    fn on_observability(&self, event: &ObservabilityEvent) {
        self.agent.on_observability(event);
    }

    fn validate_state_change(&self, next: &Value) -> Result<(), String> {
        self.agent.validate_state_change(next).map_err(|e| e.to_string())
    }

    fn on_state_changed<'a>(
        self: Rc<Self>,
        host: &Host,
        state: &'a Value,
        source: &'a crate::StateSource,
    ) -> LocalFuture<'a, ()> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.on_state_changed(&host, state, source).await })
    }

    fn on_agent_tool_start<'a>(self: Rc<Self>, host: &Host, run: &'a RunInfo) -> LocalFuture<'a, ()> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.on_agent_tool_start(&host, run).await })
    }

    fn on_agent_tool_finish<'a>(
        self: Rc<Self>,
        host: &Host,
        run: &'a RunInfo,
        result: &'a RunResult,
    ) -> LocalFuture<'a, ()> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.on_agent_tool_finish(&host, run, result).await })
    }

    fn on_progress<'a>(
        self: Rc<Self>,
        host: &Host,
        run: &'a RunInfo,
        progress: &'a ProgressSnapshot,
    ) -> LocalFuture<'a, ()> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.on_progress(&host, run, progress).await })
    }

    fn on_detached_finish<'a>(
        self: Rc<Self>,
        host: &Host,
        handler: &'a Value,
        run: &'a RunInfo,
        result: &'a RunResult,
    ) -> LocalFuture<'a, Result<(), String>> {
        let host = self.typed(host);
        Box::pin(async move {
            let handler = crate::types::HandlerTag(handler.clone());
            host.parts.agent.on_detached_finish(&host, &handler, run, result).await.map_err(|e| e.to_string())
        })
    }

    fn format_detached_completion(&self, run: &RunInfo, result: &RunResult) -> String {
        self.agent.format_detached_completion(run, result)
    }

    fn should_keep_recovering(&self, run: &crate::RecoveryAttempt) -> bool {
        self.agent.should_keep_recovering(run)
    }

    fn format_detached_milestone(&self, run: &RunInfo, milestone: &Milestone) -> String {
        self.agent.format_detached_milestone(run, milestone)
    }

    fn on_before_sub_agent<'a>(
        self: Rc<Self>,
        host: &Host,
        request: &'a HttpRequest,
        child: &'a SubAgent,
    ) -> LocalFuture<'a, Option<HttpResponse>> {
        let host = self.typed(host);
        Box::pin(async move { host.parts.agent.on_before_sub_agent(&host, request, child).await })
    }

    fn run_chat_turn(
        self: Rc<Self>,
        host: &Host,
        request_id: String,
        sender: Option<String>,
    ) -> LocalFuture<'static, ()> {
        let host = self.typed(host);
        Box::pin(async move {
            let core = &host.host.0;
            let agent = &host.parts.agent;
            let tools = HostTools { host: &host, request_id: &request_id, turn: None };
            let (system, max_steps) = (agent.system_prompt(), agent.max_steps());
            let model = match chat_model(&host) {
                Ok(model) => model,
                Err(e) => return core.chat.fail_request(&request_id, &e.to_string()),
            };
            core.chat.run_client_turn(&request_id, sender, system, max_steps, model.get(), &tools).await;
        })
    }

    fn continue_chat_turn(
        self: Rc<Self>,
        host: &Host,
        turn: crate::chat::journal::OpenTurn,
        max_attempts: u32,
        slot: Option<super::chat::TurnSlot>,
        fresh: bool,
    ) -> LocalFuture<'static, super::chat::ChatEnd> {
        let host = self.typed(host);
        Box::pin(async move {
            let core = &host.host.0;
            let agent = &host.parts.agent;
            let request_id = turn.request_id.clone();
            let tools = HostTools { host: &host, request_id: &request_id, turn: None };
            let (system, max_steps) = (agent.system_prompt(), agent.max_steps());
            // A model that cannot be made now ends the turn with the reason, as a decline does.
            let (model, problem) = match chat_model(&host) {
                Ok(model) => (Some(model), None),
                Err(e) => (None, Some(e.to_string())),
            };
            let offline = crate::llm::OfflineModel::default();
            let model: &dyn DynModel = model.as_ref().map_or(&offline, |m| m.get());
            let decide = |cut: &crate::InterruptedTurn| match &problem {
                Some(problem) => crate::ChatRecovery::Decline(problem.clone()),
                None if fresh => crate::ChatRecovery::Continue,
                None => agent.on_chat_recovery(cut),
            };
            core.chat.continue_turn(turn, system, max_steps, model, &tools, max_attempts, &decide, slot, fresh).await
        })
    }

    fn run(
        self: Rc<Self>,
        host: &Host,
        run_id: String,
        input: Value,
        attempt: i64,
        cancel: CancelToken,
    ) -> LocalFuture<'static, Result<TurnOutput, String>> {
        let turn = Turn::new(self.typed(host), run_id, input, attempt, cancel);
        Box::pin(async move { turn.host().parts.agent.run(&turn).await.map_err(|e| e.to_string()) })
    }
}
