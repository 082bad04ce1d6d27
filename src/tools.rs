//! What an agent's model may call: [`AgentTool`]s (child agents) and ordinary server-side
//! [`Tool`]s, gathered in [`Tools`]. Both get the same treatment: input validated against the
//! tool's JSON Schema before anything runs (an invalid call is a tool error the model sees), and
//! a failure returned to the model as the envelope
//! `{"ok":false,"status":"error",…,"retryable":false}`.

use std::collections::HashSet;
use std::rc::Rc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::agent::Agent;
use crate::error::Error;
use crate::host::AgentHost;
use crate::host::Turn;
use crate::llm::{ToolCall, ToolSpec};
use crate::parent::agent_tool::schema_for;
use crate::protocol::chunk::Progress;

pub use crate::parent::agent_tool::AgentTool;

/// An ordinary server-side tool of agent `A`: typed input (its JSON Schema derived with
/// `schemars`), an async `execute` with access to the agent.
///
/// ```
/// use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Assistant;
/// # impl Agent for Assistant {}
/// # agent_tools::durable_object!(Assistant);
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Add {
///     a: i64,
///     b: i64,
/// }
///
/// struct Adder;
///
/// impl Tool<Assistant> for Adder {
///     type Input = Add;
///     type Output = i64;
///     fn name(&self) -> &str {
///         "add"
///     }
///     fn description(&self) -> &str {
///         "Adds two integers."
///     }
///     async fn execute(&self, _ctx: &ToolContext<'_, Assistant>, input: Add) -> Result<i64, Error> {
///         input.a.checked_add(input.b).ok_or_else(|| "the sum overflows".into())
///     }
/// }
/// # fn main() {}
/// ```
#[allow(async_fn_in_trait)] // Workers are single-threaded; no `Send` bound is wanted.
pub trait Tool<A: Agent>: 'static {
    /// The input, deserialized from the model's arguments once they match its schema.
    type Input: DeserializeOwned + JsonSchema;
    /// What the model receives on success.
    type Output: Serialize;
    /// The name the model calls it by (`[a-zA-Z0-9_-]`, at most 64 characters).
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// Runs one call. An `Err` reaches the model as the failure envelope, with its message.
    async fn execute(&self, ctx: &ToolContext<'_, A>, input: Self::Input) -> Result<Self::Output, Error>;

    /// Whether a call that a restart cut short (started, no result kept) may simply run again
    /// when the chat turn is continued: `true` for a tool without side effects (a lookup, a
    /// computation). The default, `false`, gives the model an "interrupted" result instead
    /// (`{"ok":false,"status":"interrupted",…,"retryable":true}`), so a tool that sends, pays or
    /// writes is never repeated behind anyone's back.
    fn repeatable(&self) -> bool {
        false
    }

    /// Whether a call with this input waits for a person's approval before it runs (the AI
    /// SDK's `needsApproval`). The turn pauses durably: the client gets the approval request,
    /// and the call runs once approved, or the model is told it was denied. Default: never.
    fn needs_approval(&self, input: &Self::Input) -> bool {
        let _ = input;
        false
    }

    /// A call of this tool was denied (a person said no, or nobody answered in time): it does
    /// not run, and the model is told; this runs first, for what must happen either way (say,
    /// telling a waiting child: [`crate::AgentHost::send_to_agent_tool_run`]). It may run again
    /// after a restart, so it must be idempotent. Default: nothing.
    async fn on_denied(&self, ctx: &ToolContext<'_, A>, input: Self::Input, reason: &str) {
        let _ = (ctx, input, reason);
    }
}

/// What a [`Tool`] sees of the turn that called it.
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Desk;
/// # impl Agent for Desk {}
/// # agent_tools::durable_object!(Desk, unchecked);
/// # fn main() {}
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Text {
///     text: String,
/// }
///
/// /// Counts words, telling the caller how far it got.
/// struct WordCount;
///
/// impl Tool<Desk> for WordCount {
///     type Input = Text;
///     type Output = usize;
///     fn name(&self) -> &str {
///         "word_count"
///     }
///     fn description(&self) -> &str {
///         "Count the words of a text."
///     }
///     async fn execute(&self, context: &ToolContext<'_, Desk>, input: Text) -> Result<usize, Error> {
///         context.report_progress(Progress::status("counting"));
///         context.host().log(&format!("call {}", context.call_id()));
///         Ok(input.text.split_whitespace().count())
///     }
/// }
/// ```
pub struct ToolContext<'a, A: Agent> {
    pub(crate) host: &'a AgentHost<A>,
    pub(crate) call: &'a ToolCall,
    pub(crate) turn: Option<&'a Turn<A>>,
}

impl<A: Agent> std::fmt::Debug for ToolContext<'_, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("tool", &self.call.name)
            .field("call_id", &self.call.id)
            .field("in_turn", &self.turn.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a, A: Agent> ToolContext<'a, A> {
    /// The agent running the tool.
    pub fn host(&self) -> &'a AgentHost<A> {
        self.host
    }

    /// The model's tool call id.
    pub fn call_id(&self) -> &str {
        &self.call.id
    }

    /// The agent-tool run this turn executes, when the agent runs as a child.
    pub fn turn(&self) -> Option<&'a Turn<A>> {
        self.turn
    }

    /// Reports progress of the run this turn executes (see [`Turn::report_progress`]); a no-op
    /// with a warning outside an agent-tool run.
    pub fn report_progress(&self, progress: Progress) {
        match self.turn {
            Some(turn) => turn.report_progress(progress),
            None => self.host.log_error("agent-tools: report_progress outside an agent-tool run is ignored"),
        }
    }
}

use crate::host::LocalFuture;

/// A [`Tool`] with its types erased, so tools of different types share one list.
pub(crate) trait DynTool<A: Agent> {
    fn spec(&self) -> ToolSpec;
    fn repeatable(&self) -> bool;
    fn needs_approval(&self, input: &Value) -> bool;
    fn denied<'a>(&'a self, ctx: &'a ToolContext<'a, A>, input: Value, reason: &'a str) -> LocalFuture<'a, ()>;
    fn call<'a>(&'a self, ctx: &'a ToolContext<'a, A>, input: Value) -> LocalFuture<'a, Result<Value, String>>;
}

struct Erased<T> {
    tool: T,
    schema: Value,
}

impl<A: Agent, T: Tool<A>> DynTool<A> for Erased<T> {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.tool.name().to_owned(),
            description: self.tool.description().to_owned(),
            input_schema: self.schema.clone(),
        }
    }

    fn repeatable(&self) -> bool {
        self.tool.repeatable()
    }

    fn needs_approval(&self, input: &Value) -> bool {
        // An input that does not deserialize runs, to get its error.
        serde_json::from_value::<T::Input>(input.clone()).is_ok_and(|input| self.tool.needs_approval(&input))
    }

    fn denied<'a>(&'a self, ctx: &'a ToolContext<'a, A>, input: Value, reason: &'a str) -> LocalFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(input) = serde_json::from_value::<T::Input>(input) {
                self.tool.on_denied(ctx, input, reason).await;
            }
        })
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a, A>, input: Value) -> LocalFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            let input: T::Input = serde_json::from_value(input)
                .map_err(|e| format!("Invalid input for tool {}: {e}", self.tool.name()))?;
            let output = self.tool.execute(ctx, input).await.map_err(|e| e.to_string())?;
            serde_json::to_value(output)
                .map_err(|e| format!("tool {} returned unserializable output: {e}", self.tool.name()))
        })
    }
}

/// A client-side tool: the model may call it, and the browser runs it (the stock client's
/// `useAgentChat({ tools })` with an `execute`, or its `onToolCall` and `addToolOutput`). The
/// parent's turn pauses durably until the output comes back (`cf_agent_tool_result`), then goes
/// on with it. A sub-agent's turn has no browser: there the call gets an error result.
///
/// Clients may also declare their tools themselves (the stock client sends `clientTools` with
/// each request); a tool declared here is offered to the model whether or not a client is
/// connected.
///
/// ```
/// use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Assistant;
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Where {
///     /// How precise, in metres.
///     accuracy: u32,
/// }
///
/// impl Agent for Assistant {
///     fn tools(&self) -> Tools<Self> {
///         Tools::new().client(ClientTool::new("get_location", "The user's location, from their browser.").input::<Where>())
///     }
/// }
/// # agent_tools::durable_object!(Assistant);
/// # fn main() {}
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ClientTool {
    spec: ToolSpec,
}

impl ClientTool {
    /// A client-side tool `name`, taking any JSON object until a schema is set.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self { spec: ToolSpec::new(name, description, serde_json::json!({ "type": "object" })) }
    }

    /// Input schema derived from a Rust type.
    pub fn input<T: JsonSchema>(mut self) -> Self {
        self.spec.input_schema = schema_for::<T>();
        self
    }

    /// Input schema given as raw JSON Schema.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.spec.input_schema = schema;
        self
    }

    /// The tool as the model sees it.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }
}

/// One entry of [`Tools`].
pub(crate) enum Entry<A: Agent> {
    Agent(Rc<AgentTool>),
    Server(Rc<dyn DynTool<A>>),
    Client(Rc<ClientTool>),
}

impl<A: Agent> Clone for Entry<A> {
    fn clone(&self) -> Self {
        match self {
            Self::Agent(t) => Self::Agent(t.clone()),
            Self::Server(t) => Self::Server(t.clone()),
            Self::Client(t) => Self::Client(t.clone()),
        }
    }
}

impl<A: Agent> Entry<A> {
    pub(crate) fn spec(&self) -> ToolSpec {
        match self {
            Self::Agent(t) => t.spec(),
            Self::Server(t) => t.spec(),
            Self::Client(t) => t.spec.clone(),
        }
    }

    /// Whether a call with this (valid) input waits for a person's approval.
    pub(crate) fn needs_approval(&self, input: &Value) -> bool {
        match self {
            Self::Agent(t) => t.needs_approval_for(input),
            Self::Server(t) => t.needs_approval(input),
            Self::Client(_) => false,
        }
    }
}

/// The tools of an agent's model, in the order the model sees them.
///
/// ```
/// use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Researcher;
/// # impl Agent for Researcher {}
/// # agent_tools::durable_object!(Researcher);
/// # #[derive(Default)] pub struct Assistant;
///
/// impl Agent for Assistant {
///     fn tools(&self) -> Tools<Self> {
///         Tools::new().agent(AgentTool::of::<Researcher>("research", "Research one topic in depth."))
///     }
/// }
/// # agent_tools::durable_object!(Assistant);
/// # fn main() {}
/// ```
pub struct Tools<A: Agent> {
    pub(crate) entries: Vec<Entry<A>>,
}

/// The tools by kind and name, in order: `Tools [agent research, server checkpoint, client local_time]`.
impl<A: Agent> std::fmt::Debug for Tools<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tools = self.entries.iter().map(|entry| {
            let kind = match entry {
                Entry::Agent(_) => "agent",
                Entry::Server(_) => "server",
                Entry::Client(_) => "client",
            };
            format!("{kind} {}", entry.spec().name)
        });
        f.debug_tuple("Tools").field(&tools.collect::<Vec<_>>()).finish()
    }
}

impl<A: Agent> Default for Tools<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: Agent> Clone for Tools<A> {
    fn clone(&self) -> Self {
        Self { entries: self.entries.clone() }
    }
}

impl<A: Agent> Tools<A> {
    /// No tools.
    pub fn new() -> Self {
        Self { entries: Vec::new() }
    }

    /// Adds a child agent as a tool.
    pub fn agent(mut self, tool: AgentTool) -> Self {
        self.entries.push(Entry::Agent(Rc::new(tool)));
        self
    }

    /// Adds an ordinary server-side tool.
    pub fn tool<T: Tool<A>>(mut self, tool: T) -> Self {
        let schema = schema_for::<T::Input>();
        self.entries.push(Entry::Server(Rc::new(Erased { tool, schema })));
        self
    }

    /// Adds a client-side tool (the browser runs it).
    pub fn client(mut self, tool: ClientTool) -> Self {
        self.entries.push(Entry::Client(Rc::new(tool)));
        self
    }

    /// The tools as the model sees them.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.entries.iter().map(Entry::spec).collect()
    }

    /// Checks the declaration: names are valid and unique, every input and output schema is
    /// one the validator fully understands. An agent whose tools fail this answers every
    /// request with this error (and logs it) instead of running a model with broken tools.
    pub fn check(&self) -> Result<(), Error> {
        self.problem().map_err(Error::Config)
    }

    fn problem(&self) -> Result<(), String> {
        let mut seen = HashSet::new();
        for entry in &self.entries {
            let spec = entry.spec();
            let name = &spec.name;
            if name.is_empty()
                || name.len() > 64
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!("tool name {name:?} must be 1 to 64 characters of [a-zA-Z0-9_-]"));
            }
            if !seen.insert(name.clone()) {
                return Err(format!("two tools are named {name:?}; tool names must be unique"));
            }
            crate::schema::check_schema(&spec.input_schema)
                .map_err(|e| format!("tool {name:?} has an invalid input schema: {e}"))?;
            if spec.input_schema.get("type").and_then(Value::as_str) != Some("object") {
                return Err(format!("tool {name:?}: its input schema must describe an object (\"type\": \"object\")"));
            }
            if let Entry::Agent(tool) = entry {
                if let Some(output) = &tool.output_schema {
                    crate::schema::check_schema(output)
                        .map_err(|e| format!("tool {name:?} has an invalid output schema: {e}"))?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn find(&self, name: &str) -> Option<&Entry<A>> {
        self.entries.iter().find(|e| match e {
            Entry::Agent(t) => t.name == name,
            Entry::Server(t) => t.spec().name == name,
            Entry::Client(t) => t.spec.name == name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Default)]
    struct Parent;
    impl crate::AgentClass for Parent {
        const CLASS: &'static str = "Parent";
        const BINDING: &'static str = "Parent";
    }
    impl Agent for Parent {}

    #[derive(serde::Deserialize, JsonSchema)]
    struct Words {
        #[allow(dead_code)]
        text: String,
    }

    struct Count(&'static str);
    impl Tool<Parent> for Count {
        type Input = Words;
        type Output = usize;
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            "Counts words."
        }
        async fn execute(&self, _ctx: &ToolContext<'_, Parent>, input: Words) -> Result<usize, Error> {
            Ok(input.text.split_whitespace().count())
        }
    }

    fn agent_tool(name: &str) -> AgentTool {
        AgentTool::of::<Parent>(name, "A child.")
    }

    #[test]
    fn a_sound_declaration_passes() {
        let tools: Tools<Parent> = Tools::new().agent(agent_tool("research")).tool(Count("count"));
        assert_eq!(tools.check(), Ok(()));
        let names: Vec<String> = tools.specs().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["research", "count"]);
        assert_eq!(tools.specs()[1].input_schema["properties"]["text"]["type"], "string");
    }

    #[test]
    fn bad_declarations_fail_early_and_clearly() {
        let twice: Tools<Parent> = Tools::new().agent(agent_tool("count")).tool(Count("count"));
        assert_eq!(
            twice.check(),
            Err(Error::Config("two tools are named \"count\"; tool names must be unique".into()))
        );
        let spaced: Tools<Parent> = Tools::new().tool(Count("count words"));
        assert!(spaced.check().unwrap_err().to_string().contains("must be 1 to 64 characters of [a-zA-Z0-9_-]"));
        let unchecked: Tools<Parent> =
            Tools::new().agent(agent_tool("research").input_schema(json!({"type": "object", "not_a_keyword": 1})));
        let error = unchecked.check().unwrap_err().to_string();
        assert!(error.starts_with("tool \"research\" has an invalid input schema: keyword `not_a_keyword`"), "{error}");
        let scalar: Tools<Parent> = Tools::new().agent(agent_tool("research").input_schema(json!({"type": "string"})));
        assert!(scalar.check().unwrap_err().to_string().contains("must describe an object"));
        let output: Tools<Parent> =
            Tools::new().agent(agent_tool("research").output_schema(json!({"type": "object", "format": "color"})));
        assert!(output.check().unwrap_err().to_string().starts_with("tool \"research\" has an invalid output schema"));
    }
}
