//! An agent's [`Tools`](crate::Tools) bound to one model turn: agent tools dispatch child runs,
//! server-side tools run their `execute`; both validate input first and hand failures to the
//! model as the failure envelope.

use serde_json::Value;

use super::child::Turn;
use super::core::{AgentHost, Host};
use crate::agent::Agent;
use crate::chat::journal::Redo;
use crate::chat::turn::{Needs, ToolBox};
use crate::llm::{ToolCall, ToolSpec};
use crate::tools::{Entry, ToolContext};
use crate::types::AgentToolFailure;

/// The tools of one turn: a client's chat turn (`turn: None`) or an agent-tool run's.
pub(crate) struct HostTools<'a, A: Agent> {
    pub(crate) host: &'a AgentHost<A>,
    /// The turn's request id (the run id for an agent-tool run): the child runs it dispatches
    /// are cancelled with it.
    pub(crate) request_id: &'a str,
    pub(crate) turn: Option<&'a Turn<A>>,
}

impl<A: Agent> HostTools<'_, A> {
    /// The client-side tools the last chat request declared (`clientTools`), those the agent
    /// does not declare itself; none in a sub-agent's turn.
    fn requested_client_tools(&self) -> Vec<ToolSpec> {
        if self.turn.is_some() {
            return Vec::new();
        }
        let declared = crate::chat::store::ClientTools::new(self.host.host.sql()).list().unwrap_or_else(|e| {
            self.host.host.storage_failed("client tools", &e);
            Vec::new()
        });
        declared.into_iter().filter(|t| self.host.parts.tools.find(&t.name).is_none()).collect()
    }
}

impl<A: Agent> ToolBox for HostTools<'_, A> {
    fn specs(&self) -> Vec<ToolSpec> {
        let mut specs = self.host.parts.tools.specs();
        specs.extend(self.requested_client_tools());
        specs
    }

    async fn execute(&self, call: &ToolCall, order: usize) -> Result<Value, String> {
        let Some(entry) = self.host.parts.tools.find(&call.name) else {
            if self.requested_client_tools().iter().any(|t| t.name == call.name) {
                return Err(client_only(&call.name));
            }
            return Err(format!("unknown tool {:?}", call.name));
        };
        let spec = entry.spec();
        crate::schema::validate(&spec.input_schema, &call.input)
            .map_err(|e| format!("Invalid input for tool {}: {e}", call.name))?;
        if self.turn.is_some() && entry.needs_approval(&call.input) {
            // A sub-agent's turn has no person to ask (its parent mediates: see the guide).
            return Ok(AgentToolFailure::error(format!(
                "The tool {} needs a person's approval, which a sub-agent's turn cannot ask for; the parent must \
                 ask (see docs/guide.md, \"A person in the loop\").",
                call.name
            ))
            .to_value());
        }
        match entry {
            Entry::Agent(tool) => {
                let options = tool.run_options(call, order);
                if let Some(run_id) = &options.run_id {
                    let mut turn_runs = self.host.host.0.turn_runs.borrow_mut();
                    turn_runs.entry(self.request_id.to_owned()).or_default().push(run_id.clone());
                }
                let result = self.host.host.dispatch_awaited(tool.child, options).await;
                Ok(tool.result_for_model(&result))
            }
            Entry::Server(tool) => {
                let ctx = ToolContext { host: self.host, call, turn: self.turn };
                match tool.call(&ctx, call.input.clone()).await {
                    Ok(output) => Ok(output),
                    Err(error) => Ok(AgentToolFailure::error(error).to_value()),
                }
            }
            Entry::Client(_) => Err(client_only(&call.name)),
        }
    }

    fn redo(&self, name: &str) -> Redo {
        match self.host.parts.tools.find(name) {
            // The run is durable: its call re-attaches to it.
            Some(Entry::Agent(_)) => Redo::Run,
            Some(Entry::Server(tool)) if tool.repeatable() => Redo::Run,
            _ => Redo::Interrupted,
        }
    }

    fn needs(&self, call: &ToolCall) -> Needs {
        // A sub-agent's turn cannot pause: its calls run (a client-side one gets its error).
        if self.turn.is_some() {
            return Needs::Run;
        }
        let spec = match self.host.parts.tools.find(&call.name) {
            Some(entry) => entry.spec(),
            None => match self.requested_client_tools().into_iter().find(|t| t.name == call.name) {
                Some(spec) => spec,
                None => return Needs::Run,
            },
        };
        // An invalid call runs, to get its error.
        if crate::schema::validate(&spec.input_schema, &call.input).is_err() {
            return Needs::Run;
        }
        match self.host.parts.tools.find(&call.name) {
            Some(Entry::Client(_)) | None => Needs::Client,
            Some(entry) if entry.needs_approval(&call.input) => Needs::Approval,
            Some(_) => Needs::Run,
        }
    }

    async fn denied(&self, call: &ToolCall, reason: &str) {
        if let Some(Entry::Server(tool)) = self.host.parts.tools.find(&call.name) {
            let ctx = ToolContext { host: self.host, call, turn: self.turn };
            tool.denied(&ctx, call.input.clone(), reason).await;
        }
    }

    fn call_id_taken(&self, id: &str) -> bool {
        // Taken unless the registry says it is free (a failed read picks another id).
        !matches!(self.host.host.registry().get(&format!("agent-tool:{id}")), Ok(None))
    }
}

/// The error a client-side tool's call gets where no browser can run it.
fn client_only(name: &str) -> String {
    format!("The tool {name} runs in the browser, and a sub-agent's turn has no client-side tools.")
}

impl Host {
    /// Runs the chat turn a client asked for, with the agent's model and tools.
    pub(crate) async fn run_chat_turn(&self, request_id: String, sender: Option<String>) {
        // Armed before the turn runs any code of the agent's (a panic there resets the instance
        // at once): if the turn is cut, the alarm continues it. The turn is waiting meanwhile, so
        // a cancel already finds it.
        self.0.chat.waits(&request_id, sender.clone());
        self.watch_chat_turn().await;
        self.hooks().run_chat_turn(self, request_id.clone(), sender).await;
        self.0.chat.done_waiting(&request_id);
        self.0.turn_runs.borrow_mut().remove(&request_id);
        // A turn that paused for a person and was answered while it ran goes on.
        self.run_continuations().await;
    }

    /// Cancels a chat turn (running or still queued) and the child runs it was waiting on: the
    /// model stops first, then the children are cancelled together.
    pub(crate) async fn cancel_chat_turn(&self, request_id: &str) {
        if !self.0.chat.cancel(request_id, "cancelled by the client") {
            return;
        }
        self.cancel_turn_runs(request_id, "the chat turn was cancelled").await;
    }

    /// Cancels the child runs a turn dispatched.
    pub(crate) async fn cancel_turn_runs(&self, request_id: &str, reason: &str) {
        let runs = self.0.turn_runs.borrow_mut().remove(request_id).unwrap_or_default();
        self.cancel_runs(&runs, reason).await;
    }

    /// Cancels runs, together.
    pub(crate) async fn cancel_runs(&self, runs: &[String], reason: &str) {
        // A cancel that storage refused was reported by the engine (`agent_tool:storage_failed`),
        // and its run is recovered by the alarm.
        for run_id in runs {
            if let Err(e) = self.cancel_agent_tool(run_id, Some(reason.to_owned())) {
                self.log_error(&format!("cancelling {run_id} with its chat turn failed: {e}"));
            }
        }
    }
}
