//! The parent's chat turn: its model calls child agents as tools.

use std::cell::Cell;

use serde_json::{json, Value};

use super::{ParentAgent, ParentHost};
use crate::cancel::CancelToken;
use crate::chat::turn::ToolBox;
use crate::model::{ToolCall, ToolSpec};
use crate::platform::chat::TurnSpec;
use crate::platform::model::PlatformModel;
use crate::protocol::tail::ChunkKind;

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
            Err(e) => {
                let error = json!({ "type": "cf_agent_use_chat_response", "id": request_id,
                                    "body": e.to_string(), "done": true, "error": true });
                self.broadcast(&error.to_string());
                return;
            }
        };
        let model = PlatformModel { provider, env: &inner.env };
        inner.chat.reset_stream(&request_id);
        let tools = ParentTools { host: self, request_id: &request_id };
        let next = Cell::new(0_i64);
        let emit = |body: String| {
            let index = next.get();
            if inner.chat.store(&request_id, index, ChunkKind::Stored, &body) {
                inner.chat.send(&inner.state, &request_id, &body);
                next.set(index + 1);
            }
        };
        let spec = TurnSpec {
            request_id: request_id.clone(),
            stream_id: request_id.clone(),
            sender,
            system: inner.agent.system_prompt(),
            max_steps: inner.agent.max_steps(),
            emit: &emit,
            cancel: CancelToken::new(),
        };
        inner.chat.run(&inner.state, spec, &model, &tools).await;
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
