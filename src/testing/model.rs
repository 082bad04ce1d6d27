//! A model that says what the test scripted, and remembers what it was shown.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use serde_json::Value;

use crate::llm::{FinishReason, Model, ModelError, ModelEvent, ModelMessage, ModelRequest, ToolCall};

/// One thing a scripted step does, in order.
#[derive(Debug, Clone, PartialEq)]
enum Say {
    Text(String),
    ToolCall { name: String, input: Value },
    Delay(Duration),
    Fail(String),
}

/// One step of a [`ScriptedModel`]: what the model streams for one request.
///
/// ```
/// use agent_tools::testing::Step;
/// use serde_json::json;
/// let step = Step::new().text("Looking into it.").tool_call("research", json!({ "query": "HTTP/3" }));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    says: Vec<Say>,
}

impl Step {
    /// A step that says nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A text delta.
    pub fn text(mut self, text: &str) -> Self {
        self.says.push(Say::Text(text.to_owned()));
        self
    }

    /// The text as one delta per word, `gap` of virtual time apart (a streaming answer).
    pub fn words(mut self, text: &str, gap: Duration) -> Self {
        for (i, word) in text.split_whitespace().enumerate() {
            if i > 0 && !gap.is_zero() {
                self.says.push(Say::Delay(gap));
            }
            self.says.push(Say::Text(if i == 0 { word.to_owned() } else { format!(" {word}") }));
        }
        self
    }

    /// A call of tool `name` with `input` (the step then ends with `tool-calls`, and the turn
    /// asks for the next step with the results).
    pub fn tool_call(mut self, name: &str, input: Value) -> Self {
        self.says.push(Say::ToolCall { name: name.to_owned(), input });
        self
    }

    /// Silence for `how_long` of virtual time.
    pub fn delay(mut self, how_long: Duration) -> Self {
        self.says.push(Say::Delay(how_long));
        self
    }

    /// The provider fails here (what was streamed before stays streamed).
    pub fn fail(mut self, message: &str) -> Self {
        self.says.push(Say::Fail(message.to_owned()));
        self
    }
}

type Respond = dyn Fn(&ModelRequest) -> Step;

struct Script {
    steps: RefCell<VecDeque<Step>>,
    otherwise: RefCell<Option<Rc<Respond>>>,
    seen: RefCell<Vec<ModelRequest>>,
    calls: RefCell<u64>,
}

/// A model that streams what the test scripted: its steps in order, one per request (across
/// every object that uses it), then what [`ScriptedModel::otherwise`] answers. It records every
/// request, so a test can assert what the model was shown ([`ScriptedModel::requests`]).
/// Clones share the script.
///
/// ```
/// use agent_tools::testing::{ScriptedModel, Step};
/// let model = ScriptedModel::new()
///     .step(Step::new().text("Hello"))
///     .otherwise(|request| Step::new().text(&format!("{} messages", request.messages.len())));
/// ```
#[derive(Clone)]
pub struct ScriptedModel(Rc<Script>);

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("steps_left", &self.0.steps.borrow().len())
            .field("otherwise", &self.0.otherwise.borrow().is_some())
            .field("requests_seen", &self.0.seen.borrow().len())
            .finish()
    }
}

impl Default for ScriptedModel {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedModel {
    /// A model with no steps (it answers with an empty text until given some).
    pub fn new() -> Self {
        Self(Rc::new(Script {
            steps: RefCell::new(VecDeque::new()),
            otherwise: RefCell::new(None),
            seen: RefCell::new(Vec::new()),
            calls: RefCell::new(0),
        }))
    }

    /// Adds a step to the script.
    pub fn step(self, step: Step) -> Self {
        self.0.steps.borrow_mut().push_back(step);
        self
    }

    /// What the model answers once the script's steps are used up (by default an empty text).
    pub fn otherwise(self, respond: impl Fn(&ModelRequest) -> Step + 'static) -> Self {
        *self.0.otherwise.borrow_mut() = Some(Rc::new(respond));
        self
    }

    /// Every request the model got, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.0.seen.borrow().clone()
    }

    /// The tool results the model was shown in its last request: `(tool name, output)`.
    pub fn last_tool_results(&self) -> Vec<(String, Value)> {
        let seen = self.0.seen.borrow();
        let Some(last) = seen.last() else { return Vec::new() };
        last.messages
            .iter()
            .filter_map(|m| match m {
                ModelMessage::Tool { name, output, .. } => Some((name.clone(), output.clone())),
                _ => None,
            })
            .collect()
    }
}

impl Model for ScriptedModel {
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
        self.0.seen.borrow_mut().push(request.clone());
        let call = {
            let mut calls = self.0.calls.borrow_mut();
            *calls += 1;
            *calls
        };
        let scripted = self.0.steps.borrow_mut().pop_front();
        let step = match scripted {
            Some(step) => step,
            None => {
                let otherwise = self.0.otherwise.borrow().clone();
                otherwise.map_or_else(Step::new, |respond| respond(request))
            }
        };
        let mut tool_calls = 0;
        for say in step.says {
            match say {
                Say::Text(text) => on_event(ModelEvent::TextDelta(text)),
                Say::ToolCall { name, input } => {
                    let id = format!("call_{call}_{tool_calls}");
                    tool_calls += 1;
                    on_event(ModelEvent::ToolCallReady(Ok(ToolCall { id, name, input })));
                }
                Say::Delay(gap) => crate::host::sleep(gap).await,
                Say::Fail(message) => return Err(ModelError::Network(message)),
            }
        }
        on_event(ModelEvent::Finish(if tool_calls > 0 { FinishReason::ToolCalls } else { FinishReason::Stop }));
        Ok(())
    }
}
