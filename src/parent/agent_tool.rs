//! `agent_tool()`: a child agent as a tool the parent's model can call.
//!
//! The tool's input schema comes from a Rust type (derived with `schemars`) or is given raw.
//! Input is validated before dispatch: an invalid call gets a clear tool error and no child
//! starts. The run id is `agent-tool:<toolCallId>`, so a re-issued tool call re-attaches instead
//! of starting a second child.

use schemars::JsonSchema;
use serde_json::{json, Value};

use crate::error::{Error, Invalid};
use crate::llm::{ToolCall, ToolSpec};
use crate::types::{AgentClass, RunOptions, RunResult, RunStatus};

/// A child class a parent dispatches, and the binding that hosts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChildRef {
    /// The class name (the runs' `agentType`).
    pub(crate) class: &'static str,
    /// Its `[[durable_objects.bindings]]` name.
    pub(crate) binding: &'static str,
}

impl ChildRef {
    pub(crate) fn of<C: AgentClass>() -> Self {
        Self { class: C::CLASS, binding: C::BINDING }
    }
}

/// A child agent offered to the parent's model as a tool (the TypeScript SDK's `agentTool()`).
///
/// The input schema comes from a Rust type (`.input::<T>()`, derived with `schemars`) or is
/// given raw (`.input_schema(json!(…))`); the model's input is validated against it before any
/// child starts. The run id is `agent-tool:<toolCallId>`, so a re-issued tool call re-attaches
/// instead of starting a second child. The model receives the child's summary, the validated
/// output (with `.output::<T>()`), or the [`crate::AgentToolFailure`] envelope.
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Researcher;
/// # impl Agent for Researcher {}
/// # agent_tools::durable_object!(Researcher, unchecked);
/// #[derive(schemars::JsonSchema, serde::Deserialize)]
/// struct Topic {
///     /// What to research.
///     query: String,
/// }
///
/// # fn main() {
/// let research = AgentTool::of::<Researcher>("research", "Research a topic in depth.")
///     .input::<Topic>()
///     .needs_approval_when(|input| input["query"].as_str().is_some_and(|q| q.contains("payroll")));
/// assert_eq!(research.name, "research");
/// assert!(research.needs_approval_for(&serde_json::json!({ "query": "payroll 2026" })));
/// assert!(!research.needs_approval_for(&serde_json::json!({ "query": "QUIC" })));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTool {
    /// The tool name the model calls (`research`).
    pub name: String,
    pub(crate) child: ChildRef,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: Value,
    /// JSON Schema its output must match; the model then receives the output, not the summary.
    pub output_schema: Option<Value>,
    /// Name shown in UIs.
    pub display_name: Option<String>,
    /// Icon shown in UIs.
    pub icon: Option<String>,
    /// More UI metadata, merged under `display`.
    pub display: Option<Value>,
    pub(crate) approval: NeedsApproval,
}

/// When a tool's call waits for a person's approval before it runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NeedsApproval {
    Never,
    Always,
    When(fn(&Value) -> bool),
}

impl PartialEq for NeedsApproval {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Never, Self::Never) | (Self::Always, Self::Always) => true,
            (Self::When(a), Self::When(b)) => std::ptr::fn_addr_eq(*a, *b),
            _ => false,
        }
    }
}

/// The schema of `T`, as sent to models (without the `$schema` marker).
pub(crate) fn schema_for<T: JsonSchema>() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_else(|_| json!({}));
    if let Value::Object(o) = &mut schema {
        o.remove("$schema");
    }
    schema
}

impl AgentTool {
    /// A tool `name` that dispatches child agent `C`, taking any JSON object until a schema is
    /// set.
    pub fn of<C: AgentClass>(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            child: ChildRef::of::<C>(),
            description: description.into(),
            input_schema: json!({ "type": "object" }),
            output_schema: None,
            display_name: None,
            icon: None,
            display: None,
            approval: NeedsApproval::Never,
        }
    }

    /// Every call waits for a person's approval before its child is dispatched (the stock
    /// client's approval request; denied, the model is told and no child starts).
    pub fn needs_approval(mut self) -> Self {
        self.approval = NeedsApproval::Always;
        self
    }

    /// A call waits for approval when `when` says so of its (valid) input.
    pub fn needs_approval_when(mut self, when: fn(&Value) -> bool) -> Self {
        self.approval = NeedsApproval::When(when);
        self
    }

    /// Whether a call with this (valid) input waits for approval.
    pub fn needs_approval_for(&self, input: &Value) -> bool {
        match self.approval {
            NeedsApproval::Never => false,
            NeedsApproval::Always => true,
            NeedsApproval::When(when) => when(input),
        }
    }

    /// Input schema derived from a Rust type.
    pub fn input<T: JsonSchema>(mut self) -> Self {
        self.input_schema = schema_for::<T>();
        self
    }

    /// Input schema given as raw JSON Schema.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }

    /// Output schema derived from a Rust type.
    pub fn output<T: JsonSchema>(mut self) -> Self {
        self.output_schema = Some(schema_for::<T>());
        self
    }

    /// Output schema given as raw JSON Schema.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Name shown in UIs (`display.name`).
    pub fn display_name(mut self, name: impl Into<String>) -> Self {
        self.display_name = Some(name.into());
        self
    }

    /// Icon shown in UIs (`display.icon`).
    pub fn icon(mut self, icon: impl Into<String>) -> Self {
        self.icon = Some(icon.into());
        self
    }

    /// Extra UI metadata.
    pub fn display(mut self, display: Value) -> Self {
        self.display = Some(display);
        self
    }

    /// The child class it dispatches.
    pub fn child_class(&self) -> &'static str {
        self.child.class
    }

    /// The tool as the model sees it.
    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: self.input_schema.clone(),
        }
    }

    /// The `display` of its runs: `{name?, icon?, ...display}`.
    pub fn display_json(&self) -> Option<Value> {
        let mut d = match &self.display {
            Some(Value::Object(o)) => o.clone(),
            _ => Default::default(),
        };
        if let Some(n) = &self.display_name {
            d.entry("name").or_insert_with(|| json!(n));
        }
        if let Some(i) = &self.icon {
            d.entry("icon").or_insert_with(|| json!(i));
        }
        (!d.is_empty()).then_some(Value::Object(d))
    }

    /// Validates a call's input: an [`Error::Invalid`] whose message is the tool error the
    /// model receives.
    pub fn check_input(&self, input: &Value) -> Result<(), Error> {
        crate::schema::validate(&self.input_schema, input)
            .map_err(|e| Error::Invalid(Invalid::Input { tool: self.name.clone(), problem: e.to_string() }))
    }

    /// The dispatch options of a call, `order`-th of its step.
    pub(crate) fn run_options(&self, call: &ToolCall, order: usize) -> RunOptions {
        RunOptions {
            input: call.input.clone(),
            run_id: Some(format!("agent-tool:{}", call.id)),
            parent_tool_call_id: Some(call.id.clone()),
            display_order: Some(order as i64),
            display: self.display_json(),
            ..Default::default()
        }
    }

    /// What the model receives for a finished run: the summary, or, with an output schema, the
    /// validated output; else the failure envelope.
    pub fn result_for_model(&self, result: &RunResult) -> Value {
        let Some(schema) = &self.output_schema else { return result.for_model() };
        if result.status != RunStatus::Completed {
            return result.for_model();
        }
        let output = result
            .output
            .clone()
            .or_else(|| result.summary.as_deref().and_then(|s| serde_json::from_str(s).ok()))
            .unwrap_or(Value::Null);
        match crate::schema::validate(schema, &output) {
            Ok(()) => output,
            Err(e) => json!({
                "ok": false, "status": "error", "retryable": false,
                "error": format!("{} returned output that does not match the tool's output schema: {e}", self.child.class),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(JsonSchema, serde::Deserialize)]
    #[allow(dead_code)]
    struct ResearchInput {
        /// What to research.
        #[schemars(length(min = 3))]
        query: String,
    }

    struct Researcher;
    impl AgentClass for Researcher {
        const CLASS: &'static str = "Researcher";
        const BINDING: &'static str = "Researcher";
    }

    fn tool() -> AgentTool {
        AgentTool::of::<Researcher>("research", "Research one topic in depth.")
            .input::<ResearchInput>()
            .display_name("Researcher")
    }

    /// Two agent tools are equal when everything about them is, their approval rule too: the
    /// same kind of rule, and for a conditional one, the same function.
    #[test]
    fn tools_are_equal_only_with_the_same_approval_rule() {
        fn big(input: &Value) -> bool {
            input["query"].as_str().is_some_and(|q| q.len() > 10)
        }
        fn any(_: &Value) -> bool {
            true
        }
        let rules = [tool(), tool().needs_approval(), tool().needs_approval_when(big), tool().needs_approval_when(any)];
        for (i, a) in rules.iter().enumerate() {
            for (j, b) in rules.iter().enumerate() {
                assert_eq!(a == b, i == j, "rule {i} against rule {j}");
            }
        }
        assert_eq!(tool().needs_approval_when(big), tool().needs_approval_when(big));
    }

    #[test]
    fn derived_schemas_validate_input() {
        let t = tool();
        assert_eq!(t.spec().input_schema["properties"]["query"]["type"], "string");
        assert!(t.spec().input_schema.get("$schema").is_none());
        assert_eq!(t.check_input(&json!({"query": "HTTP/3"})), Ok(()));
        assert_eq!(
            t.check_input(&json!({"query": "ab"})),
            Err(Error::Invalid(Invalid::Input {
                tool: "research".into(),
                problem: "/query: must be at least 3 characters long".into()
            }))
        );
        assert!(t.check_input(&json!({})).unwrap_err().to_string().contains("/query: is required"));
    }

    #[test]
    fn calls_map_to_run_options() {
        // parity: 8, 37
        let call = ToolCall { id: "call_7".into(), name: "research".into(), input: json!({"query": "QUIC"}) };
        let o = tool().icon("🔎").run_options(&call, 2);
        assert_eq!(tool().child_class(), "Researcher", "the class it dispatches");
        assert_eq!(o.run_id.as_deref(), Some("agent-tool:call_7"));
        assert_eq!(o.parent_tool_call_id.as_deref(), Some("call_7"));
        assert_eq!(o.display_order, Some(2));
        assert_eq!(o.display, Some(json!({"name": "Researcher", "icon": "🔎"})));
        assert_eq!(o.input, json!({"query": "QUIC"}), "the model's input is the child's");
    }

    #[test]
    fn output_schemas_gate_what_the_model_sees() {
        let t = tool().output_schema(json!({"type": "object", "required": ["count"]}));
        let mut r = RunResult::refused("r", "Researcher", "x");
        r.status = RunStatus::Completed;
        r.error = None;
        r.output = Some(json!({"count": 2}));
        assert_eq!(t.result_for_model(&r), json!({"count": 2}));
        r.output = Some(json!({"other": 1}));
        let bad = t.result_for_model(&r);
        assert_eq!(bad["ok"], false);
        assert!(bad["error"].as_str().unwrap().contains("/count: is required"));
        r.output = None;
        r.summary = Some("{\"count\": 1}".into());
        assert_eq!(t.result_for_model(&r), json!({"count": 1}), "a JSON summary serves as output");
    }
}
