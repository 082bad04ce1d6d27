//! The parent's chat turn: its model calls child agents as tools.

use serde_json::Value;

use super::{ParentAgent, ParentHost};
use crate::chat::turn::ToolBox;
use crate::model::{ToolCall, ToolSpec};
use crate::platform::model::PlatformModel;

/// The parent's agent tools, bound to one chat turn.
struct ParentTools<'a, A: ParentAgent> {
    host: &'a ParentHost<A>,
    request_id: &'a str,
}

impl<A: ParentAgent> ToolBox for ParentTools<'_, A> {
    fn specs(&self) -> Vec<ToolSpec> {
        self.host.agent().tools().iter().map(|t| t.spec()).collect()
    }

    async fn execute(&self, call: &ToolCall, order: usize) -> Result<Value, String> {
        let tools = self.host.agent().tools();
        let Some(tool) = tools.iter().find(|t| t.name == call.name) else {
            return Err(format!("unknown tool {:?}", call.name));
        };
        tool.check_input(&call.input)?;
        let options = tool.run_options(call, order);
        if let Some(run_id) = &options.run_id {
            self.host.0.turn_runs.borrow_mut().entry(self.request_id.to_owned()).or_default().push(run_id.clone());
        }
        let result = self.host.run_agent_tool(&tool.child, options).await;
        Ok(tool.result_for_model(&result))
    }

    fn call_id_taken(&self, id: &str) -> bool {
        matches!(self.host.registry().get(&format!("agent-tool:{id}")), Ok(Some(_)))
    }
}

impl<A: ParentAgent> ParentHost<A> {
    /// Runs the chat turn a client asked for.
    pub(super) async fn run_chat_turn(&self, request_id: String, sender: Option<String>) {
        let inner = &self.0;
        let provider = match inner.agent.model(&inner.env) {
            Ok(p) => p,
            Err(e) => return inner.chat.fail_request(&inner.state, &request_id, &e.to_string()),
        };
        let model = PlatformModel { provider, env: &inner.env };
        let tools = ParentTools { host: self, request_id: &request_id };
        let (system, max_steps) = (inner.agent.system_prompt(), inner.agent.max_steps());
        inner.chat.run_client_turn(&inner.state, &request_id, sender, system, max_steps, &model, &tools).await;
        inner.turn_runs.borrow_mut().remove(&request_id);
    }

    /// Cancels a chat turn (running or still queued) and the child runs it was waiting on: the
    /// model stops first, then the children are cancelled together.
    pub(super) async fn cancel_chat_turn(&self, request_id: &str) {
        if self.0.chat.cancel(request_id, "cancelled by the client").is_none() {
            return;
        }
        let runs = self.0.turn_runs.borrow().get(request_id).cloned().unwrap_or_default();
        let reason = || Some("the chat turn was cancelled".to_owned());
        futures::future::join_all(runs.iter().map(|run_id| self.cancel_agent_tool(run_id, reason()))).await;
    }
}
