//! JSON Schema validation for tool inputs and outputs: the keywords tool schemas use (and
//! `schemars` derives), with errors that name the offending path.
//!
//! Supported: `type` (one or several), `properties`, `required`, `additionalProperties`,
//! `items`, `minItems`, `maxItems`, `enum`, `const`, `minLength`, `maxLength` (in characters),
//! `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `anyOf`, `oneOf`, `allOf`,
//! `nullable`, and local `$ref`s (`#/$defs/…`, `#/definitions/…`). Other keywords (`pattern`,
//! `format`, …) are accepted and not checked.

use serde_json::Value;

/// Validates `value` against `schema`; on failure, the first problem found, e.g.
/// `/query: must be at least 3 characters long`.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    check(schema, schema, value, "", 0).map_err(|(path, problem)| {
        let path = if path.is_empty() { "input".to_owned() } else { path };
        format!("{path}: {problem}")
    })
}

type Problem = (String, String);

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    let actual = type_name(v);
    actual == t
        || (t == "number" && actual == "integer")
        || (t == "integer" && v.as_f64().is_some_and(|f| f.fract() == 0.0))
}

fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

/// How deep schemas may nest (through `$ref`s and combinators) before validation gives up: a
/// schema that refers to itself without consuming the value would otherwise never end.
const MAX_DEPTH: usize = 64;

fn check(root: &Value, schema: &Value, value: &Value, path: &str, depth: usize) -> Result<(), Problem> {
    let fail = |problem: String| Err((path.to_owned(), problem));
    if depth > MAX_DEPTH {
        return fail("the schema nests too deeply (a $ref cycle?)".into());
    }
    let depth = depth + 1;
    let Value::Object(s) = schema else {
        return if schema == &Value::Bool(false) { fail("no value is allowed here".into()) } else { Ok(()) };
    };
    if let Some(reference) = s.get("$ref").and_then(Value::as_str) {
        let Some(target) = resolve(root, reference) else { return fail(format!("unresolvable $ref {reference}")) };
        check(root, target, value, path, depth)?;
    }
    if value.is_null() && s.get("nullable") == Some(&Value::Bool(true)) {
        return Ok(());
    }
    if let Some(t) = s.get("type") {
        let allowed: Vec<&str> = match t {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !allowed.is_empty() && !allowed.iter().any(|t| has_type(value, t)) {
            return fail(format!("must be {}, got {}", allowed.join(" or "), type_name(value)));
        }
    }
    if let Some(options) = s.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            return fail(format!("must be one of {}", Value::Array(options.clone())));
        }
    }
    if let Some(c) = s.get("const") {
        if c != value {
            return fail(format!("must be {c}"));
        }
    }
    match value {
        Value::String(text) => {
            let len = text.chars().count() as u64;
            if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
                if len < min {
                    return fail(format!("must be at least {min} characters long"));
                }
            }
            if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
                if len > max {
                    return fail(format!("must be at most {max} characters long"));
                }
            }
        }
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or(0.0);
            let bound = |k: &str| s.get(k).and_then(Value::as_f64);
            if let Some(min) = bound("minimum").filter(|m| n < *m) {
                return fail(format!("must be at least {min}"));
            }
            if let Some(max) = bound("maximum").filter(|m| n > *m) {
                return fail(format!("must be at most {max}"));
            }
            if let Some(min) = bound("exclusiveMinimum").filter(|m| n <= *m) {
                return fail(format!("must be greater than {min}"));
            }
            if let Some(max) = bound("exclusiveMaximum").filter(|m| n >= *m) {
                return fail(format!("must be less than {max}"));
            }
        }
        Value::Array(items) => {
            if let Some(min) = s.get("minItems").and_then(Value::as_u64).filter(|m| (items.len() as u64) < *m) {
                return fail(format!("must have at least {min} items"));
            }
            if let Some(max) = s.get("maxItems").and_then(Value::as_u64).filter(|m| (items.len() as u64) > *m) {
                return fail(format!("must have at most {max} items"));
            }
            if let Some(item_schema) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(root, item_schema, item, &format!("{path}/{i}"), depth)?;
                }
            }
        }
        Value::Object(fields) => {
            if let Some(required) = s.get("required").and_then(Value::as_array) {
                for key in required.iter().filter_map(Value::as_str) {
                    if !fields.contains_key(key) {
                        return Err((format!("{path}/{key}"), "is required".into()));
                    }
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            for (key, field) in fields {
                let field_path = format!("{path}/{key}");
                match props.and_then(|p| p.get(key)) {
                    Some(field_schema) => check(root, field_schema, field, &field_path, depth)?,
                    None => match s.get("additionalProperties") {
                        Some(Value::Bool(false)) => return Err((field_path, "is not an allowed property".into())),
                        Some(extra @ Value::Object(_)) => check(root, extra, field, &field_path, depth)?,
                        _ => {}
                    },
                }
            }
        }
        _ => {}
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for sub in all {
            check(root, sub, value, path, depth)?;
        }
    }
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        if !any.iter().any(|sub| check(root, sub, value, path, depth).is_ok()) {
            return fail("matches none of the allowed shapes".into());
        }
    }
    if let Some(one) = s.get("oneOf").and_then(Value::as_array) {
        let matching = one.iter().filter(|sub| check(root, sub, value, path, depth).is_ok()).count();
        if matching != 1 {
            return fail(format!("must match exactly one allowed shape, matches {matching}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn research() -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 3},
                "depth": {"type": "integer", "minimum": 1, "maximum": 5},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 2},
                "mode": {"enum": ["fast", "deep"]}
            },
            "required": ["query"],
            "additionalProperties": false,
            "$defs": {"Tag": {"type": "string", "maxLength": 4}}
        })
    }

    #[test]
    fn accepts_valid_input() {
        assert_eq!(
            validate(&research(), &json!({"query": "HTTP/3", "depth": 2, "tags": ["net"], "mode": "fast"})),
            Ok(())
        );
        assert_eq!(validate(&json!({"type": "number"}), &json!(3)), Ok(()), "an integer is a number");
        assert_eq!(validate(&json!({}), &json!({"anything": 1})), Ok(()));
    }

    #[test]
    fn names_the_problem_and_its_path() {
        let s = research();
        for (input, expected) in [
            (json!({}), "/query: is required"),
            (json!({"query": "ab"}), "/query: must be at least 3 characters long"),
            (json!({"query": 5}), "/query: must be string, got integer"),
            (json!({"query": "abc", "depth": 9}), "/depth: must be at most 5"),
            (json!({"query": "abc", "depth": 1.5}), "/depth: must be integer, got number"),
            (json!({"query": "abc", "tags": ["toolong"]}), "/tags/0: must be at most 4 characters long"),
            (json!({"query": "abc", "tags": ["a", "b", "c"]}), "/tags: must have at most 2 items"),
            (json!({"query": "abc", "mode": "slow"}), "/mode: must be one of [\"fast\",\"deep\"]"),
            (json!({"query": "abc", "extra": 1}), "/extra: is not an allowed property"),
            (json!("text"), "input: must be object, got string"),
        ] {
            assert_eq!(validate(&s, &input), Err(expected.to_owned()), "{input}");
        }
    }

    #[test]
    fn combinators() {
        let s = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
        assert!(validate(&s, &json!("x")).is_ok());
        assert!(validate(&s, &json!(true)).is_err());
        let s = json!({"oneOf": [{"type": "number"}, {"type": "integer"}]});
        assert!(validate(&s, &json!(1)).unwrap_err().contains("exactly one"));
        assert!(validate(&json!({"type": "string", "nullable": true}), &Value::Null).is_ok());
    }

    #[test]
    fn a_ref_cycle_is_an_error_not_a_stack_overflow() {
        assert!(validate(&json!({"$ref": "#"}), &json!(1)).unwrap_err().contains("nests too deeply"));
        let tree = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}});
        assert!(validate(&tree, &json!({"children": [{"children": []}]})).is_ok(), "recursive types still validate");
    }
}
