//! The schema checks as they run in a Worker: compiled to wasm32 and run on V8 (Node, through
//! `wasm-bindgen-test-runner`), where a `pattern` is JavaScript's own `RegExp` with the `u`
//! flag. Natively the same checks run on `regex-lite` (the unit tests in `src/schema.rs`); these
//! assert what only the Worker's side does: ECMA-262 syntax regex-lite has no support for, and a
//! pattern that does not compile caught as a declaration error instead of a throw through the
//! instance. Only the public API is used.
#![cfg(target_arch = "wasm32")]

use agent_tools::{Agent, AgentClass, AgentTool, Tools};
use serde_json::json;
use wasm_bindgen_test::wasm_bindgen_test;

#[derive(Default)]
struct Parent;

impl AgentClass for Parent {
    const CLASS: &'static str = "Parent";
    const BINDING: &'static str = "Parent";
}

impl Agent for Parent {}

struct Child;

impl AgentClass for Child {
    const CLASS: &'static str = "Child";
    const BINDING: &'static str = "Child";
}

fn tool_with_pattern(pattern: &str) -> AgentTool {
    AgentTool::of::<Child>("lookup", "Looks a code up.").input_schema(json!({
        "type": "object",
        "properties": { "code": { "type": "string", "pattern": pattern } },
        "required": ["code"]
    }))
}

#[wasm_bindgen_test]
fn a_pattern_that_does_not_compile_is_a_declaration_error() {
    for broken in ["(", "[a-", "\\p{NoSuchProperty}", "a{2,1}"] {
        let error = Tools::<Parent>::new().agent(tool_with_pattern(broken)).check().unwrap_err().to_string();
        assert!(error.contains(&format!("pattern {broken:?} does not compile")), "{broken}: {error}");
    }
}

#[wasm_bindgen_test]
fn patterns_are_ecmascript_with_the_u_flag() {
    // A lookahead and a Unicode property class: ECMA-262 with `u`; regex-lite has neither.
    let tool = tool_with_pattern("^(?=.*\\d)\\p{Lu}");
    Tools::<Parent>::new().agent(tool_with_pattern("^(?=.*\\d)\\p{Lu}")).check().unwrap();
    tool.check_input(&json!({ "code": "Ä1" })).unwrap();
    for wrong in ["Äb", "ä1", "1Ä"] {
        let error = tool.check_input(&json!({ "code": wrong })).unwrap_err().to_string();
        assert!(error.contains("/code: must match the pattern"), "{wrong}: {error}");
    }
    // Not anchored unless the pattern says so, as JSON Schema has it.
    let unanchored = tool_with_pattern("\\d{3}");
    unanchored.check_input(&json!({ "code": "ab123cd" })).unwrap();
    assert!(unanchored.check_input(&json!({ "code": "ab12cd" })).is_err());
}
