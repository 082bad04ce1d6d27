//! JSON Schema validation of tool inputs and outputs, with errors that name the offending path.
//!
//! Two halves. [`check_schema`] runs when a tool is declared and refuses any keyword
//! [`validate`] does not implement (and any malformed value of one it does), so nothing a
//! schema says is ever silently ignored. [`validate`] then checks every value against it.
//!
//! Implemented (draft 2020-12, and what `schemars` derives):
//! - any value: `type` (one or several), `enum`, `const`, `allOf`, `anyOf`, `oneOf`, `not`,
//!   `if`/`then`/`else`, local `$ref`s (`#/$defs/…`, `#/definitions/…`, `#`), `nullable`;
//! - strings: `minLength`, `maxLength` (in characters), `pattern` (unanchored, as the spec
//!   says; see `Pattern` for its dialect), `format` (`date-time`, `date`, `time`, `email`,
//!   `uri`, `uuid`, `ipv4`, `ipv6`, `hostname`);
//! - numbers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`, and
//!   the integer formats `schemars` emits (`int8` … `uint64`, `int`, `uint`; `float`/`double`
//!   accept any number);
//! - arrays: `items`, `prefixItems`, `minItems`, `maxItems`, `uniqueItems`;
//! - objects: `properties`, `required`, `additionalProperties`, `patternProperties`,
//!   `minProperties`, `maxProperties`;
//! - annotations, accepted and not checked: `title`, `description`, `default`, `examples`,
//!   `deprecated`, `readOnly`, `writeOnly`, `$comment`, `$schema`, `$id`, `$defs`,
//!   `definitions`.

use serde_json::{Map, Value};

/// Keywords that only annotate.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
    "$schema",
    "$id",
    "$defs",
    "definitions",
];

/// Keywords [`validate`] implements.
const KEYWORDS: &[&str] = &[
    "type",
    "enum",
    "const",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "$ref",
    "nullable",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "minProperties",
    "maxProperties",
];

const FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "email",
    "uri",
    "uuid",
    "ipv4",
    "ipv6",
    "hostname",
    "int8",
    "int16",
    "int32",
    "int64",
    "int",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "uint",
    "float",
    "double",
];

const TYPES: &[&str] = &["null", "boolean", "integer", "number", "string", "array", "object"];

/// Validates `value` against `schema`; on failure, the first problem found, e.g.
/// `/query: must be at least 3 characters long`.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    check(schema, schema, value, "", 0).map_err(|(path, problem)| {
        let path = if path.is_empty() { "input".to_owned() } else { path };
        format!("{path}: {problem}")
    })
}

/// Checks a schema when a tool is declared: every keyword is one [`validate`] implements (or
/// an annotation), with a well-formed value; every `pattern` compiles; every `$ref` resolves.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    check_node(schema, schema, "", 0).map_err(|(path, problem)| {
        let at = if path.is_empty() { String::new() } else { format!(" at {path}") };
        format!("{problem}{at}")
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

fn check_node(root: &Value, schema: &Value, path: &str, depth: usize) -> Result<(), Problem> {
    let fail = |problem: String| Err((path.to_owned(), problem));
    if depth > MAX_DEPTH {
        return fail("the schema nests too deeply".into());
    }
    let s = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(s) => s,
        other => return fail(format!("a schema must be an object or a boolean, got {}", type_name(other))),
    };
    let sub = |key: &str| format!("{path}/{key}");
    for (key, value) in s {
        let at = sub(key);
        let bad = |what: &str| Err((at.clone(), format!("`{key}` must be {what}")));
        match key.as_str() {
            k if ANNOTATIONS.contains(&k) => {
                if matches!(k, "$defs" | "definitions") {
                    let Some(defs) = value.as_object() else { return bad("an object of schemas") };
                    for (name, def) in defs {
                        check_node(root, def, &format!("{at}/{name}"), depth + 1)?;
                    }
                }
            }
            "type" => {
                let names: Vec<&Value> = match value {
                    Value::Array(many) if !many.is_empty() => many.iter().collect(),
                    Value::String(_) => vec![value],
                    _ => return bad("a type name or a non-empty array of them"),
                };
                for name in names {
                    if !name.as_str().is_some_and(|n| TYPES.contains(&n)) {
                        return bad(&format!("one of {TYPES:?}"));
                    }
                }
            }
            "enum" => {
                if !value.is_array() {
                    return bad("an array");
                }
            }
            "const" | "nullable" => {
                if key == "nullable" && !value.is_boolean() {
                    return bad("a boolean");
                }
            }
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                let Some(subs) = value.as_array().filter(|a| !a.is_empty()) else {
                    return bad("a non-empty array of schemas");
                };
                for (i, s) in subs.iter().enumerate() {
                    check_node(root, s, &format!("{at}/{i}"), depth + 1)?;
                }
            }
            "not" | "if" | "then" | "else" | "items" => check_node(root, value, &at, depth + 1)?,
            "additionalProperties" => check_node(root, value, &at, depth + 1)?,
            "properties" | "patternProperties" => {
                let Some(props) = value.as_object() else { return bad("an object of schemas") };
                for (name, prop) in props {
                    if key == "patternProperties" {
                        regex(name).map_err(|e| (format!("{at}/{name}"), e))?;
                    }
                    check_node(root, prop, &format!("{at}/{name}"), depth + 1)?;
                }
            }
            "$ref" => {
                let Some(reference) = value.as_str() else { return bad("a string") };
                if resolve(root, reference).is_none() {
                    return Err((
                        at,
                        format!("`$ref` {reference:?} does not resolve (only local `#/…` references do)"),
                    ));
                }
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" => {
                if value.as_u64().is_none() {
                    return bad("a non-negative integer");
                }
            }
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
                if !value.is_number() {
                    return bad("a number");
                }
            }
            "multipleOf" => {
                if !value.as_f64().is_some_and(|m| m > 0.0) {
                    return bad("a number greater than 0");
                }
            }
            "uniqueItems" => {
                if !value.is_boolean() {
                    return bad("a boolean");
                }
            }
            "required" => {
                if !value.as_array().is_some_and(|r| r.iter().all(Value::is_string)) {
                    return bad("an array of strings");
                }
            }
            "pattern" => {
                let Some(pattern) = value.as_str() else { return bad("a string") };
                regex(pattern).map_err(|e| (at.clone(), e))?;
            }
            "format" => {
                if !value.as_str().is_some_and(|f| FORMATS.contains(&f)) {
                    return Err((
                        at,
                        format!("`format` {value} is not one the validator checks; supported: {}", FORMATS.join(", ")),
                    ));
                }
            }
            other => {
                debug_assert!(!KEYWORDS.contains(&other));
                return Err((
                    at,
                    format!(
                        "keyword `{other}` is not supported: the validator would ignore it; remove it or express it \
                         with the supported keywords"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn regex(pattern: &str) -> Result<Pattern, String> {
    Pattern::new(pattern).map_err(|e| format!("pattern {pattern:?} does not compile: {e}"))
}

/// A compiled `pattern` (or `patternProperties` key). In a Worker it is JavaScript's `RegExp`
/// with the `u` flag: ECMA-262, the dialect JSON Schema names (and the one the TypeScript SDK's
/// schemas run in), with no regex engine in the Worker's code. Natively (the unit tests) it is
/// `regex-lite`, which agrees with it on the syntax tool schemas use (classes, repetition,
/// anchors, groups, alternation, ASCII `\d` and `\w`); lookaround and backreferences compile
/// only in a Worker.
pub(crate) struct Pattern(
    #[cfg(target_arch = "wasm32")] js_sys::RegExp,
    #[cfg(not(target_arch = "wasm32"))] regex_lite::Regex,
);

impl Pattern {
    #[cfg(target_arch = "wasm32")]
    fn new(pattern: &str) -> Result<Self, String> {
        use wasm_bindgen::{JsCast, JsValue};
        // `RegExp::new` would throw through the Worker on a bad pattern; `Reflect.construct`
        // catches it.
        let args = js_sys::Array::of2(&JsValue::from_str(pattern), &JsValue::from_str("u"));
        js_sys::Reflect::construct(&js_sys::RegExp::new("", "").constructor(), &args)
            .map(|r| Self(r.unchecked_into()))
            .map_err(|e| match e.dyn_ref::<js_sys::Error>() {
                Some(e) => String::from(e.message()),
                None => "not a regular expression".to_owned(),
            })
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn new(pattern: &str) -> Result<Self, String> {
        regex_lite::Regex::new(pattern).map(Self).map_err(|e| e.to_string())
    }

    /// Whether `text` has a match anywhere (JSON Schema's patterns are not anchored).
    fn is_match(&self, text: &str) -> bool {
        #[cfg(target_arch = "wasm32")]
        return self.0.test(text);
        #[cfg(not(target_arch = "wasm32"))]
        return self.0.is_match(text);
    }
}

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
        Value::String(text) => check_string(s, text).or_else(fail)?,
        Value::Number(n) => check_number(s, n).or_else(fail)?,
        Value::Array(items) => check_array(root, s, items, path, depth)?,
        Value::Object(fields) => check_object(root, s, fields, path, depth)?,
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
    if let Some(not) = s.get("not") {
        if check(root, not, value, path, depth).is_ok() {
            return fail("matches a shape that is not allowed".into());
        }
    }
    if let Some(condition) = s.get("if") {
        let branch = if check(root, condition, value, path, depth).is_ok() { s.get("then") } else { s.get("else") };
        if let Some(branch) = branch {
            check(root, branch, value, path, depth)?;
        }
    }
    Ok(())
}

fn check_string(s: &Map<String, Value>, text: &str) -> Result<(), String> {
    let len = text.chars().count() as u64;
    if let Some(min) = s.get("minLength").and_then(Value::as_u64).filter(|min| len < *min) {
        return Err(format!("must be at least {min} characters long"));
    }
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64).filter(|max| len > *max) {
        return Err(format!("must be at most {max} characters long"));
    }
    if let Some(pattern) = s.get("pattern").and_then(Value::as_str) {
        if !regex(pattern)?.is_match(text) {
            return Err(format!("must match the pattern {pattern:?}"));
        }
    }
    if let Some(format) = s.get("format").and_then(Value::as_str) {
        if !string_format_ok(format, text) {
            return Err(format!("must be a valid {format}"));
        }
    }
    Ok(())
}

fn check_number(s: &Map<String, Value>, number: &serde_json::Number) -> Result<(), String> {
    let n = number.as_f64().unwrap_or(0.0);
    let bound = |k: &str| s.get(k).and_then(Value::as_f64);
    if let Some(min) = bound("minimum").filter(|m| n < *m) {
        return Err(format!("must be at least {min}"));
    }
    if let Some(max) = bound("maximum").filter(|m| n > *m) {
        return Err(format!("must be at most {max}"));
    }
    if let Some(min) = bound("exclusiveMinimum").filter(|m| n <= *m) {
        return Err(format!("must be greater than {min}"));
    }
    if let Some(max) = bound("exclusiveMaximum").filter(|m| n >= *m) {
        return Err(format!("must be less than {max}"));
    }
    if let Some(step) = bound("multipleOf").filter(|m| *m > 0.0) {
        let ratio = n / step;
        if (ratio - ratio.round()).abs() > 1e-9 * ratio.abs().max(1.0) {
            return Err(format!("must be a multiple of {step}"));
        }
    }
    if let Some(format) = s.get("format").and_then(Value::as_str) {
        if !number_format_ok(format, number) {
            return Err(format!("must be a valid {format}"));
        }
    }
    Ok(())
}

fn check_array(root: &Value, s: &Map<String, Value>, items: &[Value], path: &str, depth: usize) -> Result<(), Problem> {
    let fail = |problem: String| Err((path.to_owned(), problem));
    if let Some(min) = s.get("minItems").and_then(Value::as_u64).filter(|m| (items.len() as u64) < *m) {
        return fail(format!("must have at least {min} items"));
    }
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64).filter(|m| (items.len() as u64) > *m) {
        return fail(format!("must have at most {max} items"));
    }
    if s.get("uniqueItems") == Some(&Value::Bool(true)) {
        for (i, item) in items.iter().enumerate() {
            if let Some(j) = items[..i].iter().position(|earlier| earlier == item) {
                return fail(format!("items {j} and {i} are equal; items must be unique"));
            }
        }
    }
    let prefix = s.get("prefixItems").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    for (i, item) in items.iter().enumerate() {
        let item_schema = match prefix.get(i) {
            Some(schema) => Some(schema),
            None => s.get("items"),
        };
        if let Some(item_schema) = item_schema {
            check(root, item_schema, item, &format!("{path}/{i}"), depth)?;
        }
    }
    Ok(())
}

fn check_object(
    root: &Value,
    s: &Map<String, Value>,
    fields: &Map<String, Value>,
    path: &str,
    depth: usize,
) -> Result<(), Problem> {
    let fail = |problem: String| Err((path.to_owned(), problem));
    if let Some(min) = s.get("minProperties").and_then(Value::as_u64).filter(|m| (fields.len() as u64) < *m) {
        return fail(format!("must have at least {min} properties"));
    }
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64).filter(|m| (fields.len() as u64) > *m) {
        return fail(format!("must have at most {max} properties"));
    }
    if let Some(required) = s.get("required").and_then(Value::as_array) {
        for key in required.iter().filter_map(Value::as_str) {
            if !fields.contains_key(key) {
                return Err((format!("{path}/{key}"), "is required".into()));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    let patterns: Vec<(Pattern, &Value)> = match s.get("patternProperties").and_then(Value::as_object) {
        Some(p) => match p.iter().map(|(k, v)| regex(k).map(|r| (r, v))).collect::<Result<Vec<_>, _>>() {
            Ok(patterns) => patterns,
            Err(e) => return fail(e),
        },
        None => Vec::new(),
    };
    for (key, field) in fields {
        let field_path = format!("{path}/{key}");
        let mut matched = false;
        if let Some(field_schema) = props.and_then(|p| p.get(key)) {
            check(root, field_schema, field, &field_path, depth)?;
            matched = true;
        }
        for (pattern, field_schema) in &patterns {
            if pattern.is_match(key) {
                check(root, field_schema, field, &field_path, depth)?;
                matched = true;
            }
        }
        if !matched {
            match s.get("additionalProperties") {
                Some(Value::Bool(false)) => return Err((field_path, "is not an allowed property".into())),
                Some(extra @ Value::Object(_)) => check(root, extra, field, &field_path, depth)?,
                _ => {}
            }
        }
    }
    Ok(())
}

fn number_format_ok(format: &str, n: &serde_json::Number) -> bool {
    let range = |min: f64, max: f64| n.as_f64().is_some_and(|f| f.fract() == 0.0 && f >= min && f <= max);
    match format {
        "int8" => range(i8::MIN as f64, i8::MAX as f64),
        "int16" => range(i16::MIN as f64, i16::MAX as f64),
        "int32" => range(i32::MIN as f64, i32::MAX as f64),
        "int64" | "int" => n.is_i64() || n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.3e18),
        "uint8" => range(0.0, u8::MAX as f64),
        "uint16" => range(0.0, u16::MAX as f64),
        "uint32" => range(0.0, u32::MAX as f64),
        "uint64" | "uint" => n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0 && (0.0..1.85e19).contains(&f)),
        _ => true, // float, double; string formats do not apply to numbers
    }
}

fn string_format_ok(format: &str, text: &str) -> bool {
    match format {
        "date" => is_date(text),
        "time" => is_time(text),
        "date-time" => text.split_once(['T', 't']).is_some_and(|(d, t)| is_date(d) && is_time(t)),
        "email" => text.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && !local.contains(char::is_whitespace) && is_hostname(domain) && domain.contains('.')
        }),
        "uri" => text.split_once(':').is_some_and(|(scheme, rest)| {
            scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && !rest.is_empty()
                && !text.contains(char::is_whitespace)
        }),
        "uuid" => {
            let groups: Vec<&str> = text.split('-').collect();
            groups.len() == 5
                && groups
                    .iter()
                    .zip([8, 4, 4, 4, 12])
                    .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
        }
        "ipv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
        "hostname" => is_hostname(text),
        _ => true, // numeric formats do not apply to strings
    }
}

fn digits(s: &str, n: usize) -> Option<u32> {
    (s.len() == n && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
}

fn is_date(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let [y, m, d] = parts.as_slice() else { return false };
    let (Some(y), Some(m), Some(d)) = (digits(y, 4), digits(m, 2), digits(d, 2)) else { return false };
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

fn is_time(s: &str) -> bool {
    // hh:mm:ss[.frac](Z|±hh:mm)
    let (clock, zone) = if let Some(clock) = s.strip_suffix(['Z', 'z']) {
        (clock, None)
    } else if let Some(at) = s.rfind(['+', '-']) {
        (&s[..at], Some(&s[at + 1..]))
    } else {
        return false;
    };
    let clock = clock.split_once('.').map_or(clock, |(whole, frac)| {
        if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
            "invalid"
        } else {
            whole
        }
    });
    let hms: Vec<&str> = clock.split(':').collect();
    let [h, m, sec] = hms.as_slice() else { return false };
    let ok_clock = matches!((digits(h, 2), digits(m, 2), digits(sec, 2)), (Some(h), Some(m), Some(s)) if h < 24 && m < 60 && s <= 60);
    let ok_zone = zone.is_none_or(|z| {
        let hm: Vec<&str> = z.split(':').collect();
        matches!(hm.as_slice(), [h, m] if digits(h, 2).is_some_and(|h| h < 24) && digits(m, 2).is_some_and(|m| m < 60))
    });
    ok_clock && ok_zone
}

fn is_hostname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
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
        assert_eq!(check_schema(&research()), Ok(()));
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
        let not = json!({"not": {"const": "admin"}});
        assert!(validate(&not, &json!("user")).is_ok());
        assert_eq!(validate(&not, &json!("admin")), Err("input: matches a shape that is not allowed".into()));
        let conditional = json!({
            "type": "object",
            "if": {"properties": {"kind": {"const": "url"}}},
            "then": {"required": ["url"]},
            "else": {"required": ["text"]}
        });
        assert!(validate(&conditional, &json!({"kind": "url", "url": "x"})).is_ok());
        assert_eq!(validate(&conditional, &json!({"kind": "url"})), Err("/url: is required".into()));
        assert_eq!(validate(&conditional, &json!({"kind": "note"})), Err("/text: is required".into()));
    }

    #[test]
    fn strings_patterns_and_formats() {
        let s = json!({"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"});
        assert!(validate(&s, &json!("AB-12")).is_ok());
        assert_eq!(validate(&s, &json!("ab-12")), Err("input: must match the pattern \"^[A-Z]{2}-[0-9]+$\"".into()));
        assert!(validate(&json!({"pattern": "b"}), &json!("abc")).is_ok(), "unanchored, as the spec says");
        for (format, good, bad) in [
            ("date", "2026-02-28", "2026-02-30"),
            ("time", "23:59:60.5+01:00", "24:00:00Z"),
            ("date-time", "2026-12-01T06:00:00Z", "2026-12-01 06:00"),
            ("email", "ada@example.org", "ada@"),
            ("uri", "https://example.org/a?b", "not a uri"),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
            ("ipv4", "192.168.0.1", "256.1.1.1"),
            ("ipv6", "::1", "1:::2"),
            ("hostname", "api.example.org", "-bad-.org"),
        ] {
            let s = json!({"type": "string", "format": format});
            assert!(validate(&s, &json!(good)).is_ok(), "{format} accepts {good}");
            assert_eq!(validate(&s, &json!(bad)), Err(format!("input: must be a valid {format}")), "{format}: {bad}");
        }
    }

    #[test]
    fn numbers_arrays_and_objects() {
        assert!(validate(&json!({"multipleOf": 0.5}), &json!(2.5)).is_ok());
        assert_eq!(validate(&json!({"multipleOf": 3}), &json!(7)), Err("input: must be a multiple of 3".into()));
        // Each bound is named in its message.
        for (schema, good, bad, message) in [
            (json!({"minimum": 2}), json!(2), json!(1.5), "must be at least 2"),
            (json!({"maximum": 0.25}), json!(0.25), json!(1), "must be at most 0.25"),
            (json!({"exclusiveMinimum": -1.5}), json!(-1.4), json!(-1.5), "must be greater than -1.5"),
            (json!({"exclusiveMaximum": 10}), json!(9.9), json!(10), "must be less than 10"),
            (json!({"multipleOf": 0.5}), json!(1.5), json!(0.7), "must be a multiple of 0.5"),
        ] {
            assert!(validate(&schema, &good).is_ok(), "{schema} accepts {good}");
            assert_eq!(validate(&schema, &bad), Err(format!("input: {message}")), "{schema}: {bad}");
        }
        assert!(validate(&json!({"type": "integer", "format": "uint8"}), &json!(255)).is_ok());
        assert_eq!(
            validate(&json!({"type": "integer", "format": "uint8"}), &json!(256)),
            Err("input: must be a valid uint8".into())
        );
        let unique = json!({"type": "array", "uniqueItems": true});
        assert!(validate(&unique, &json!([1, 2, 3])).is_ok());
        assert_eq!(
            validate(&unique, &json!([1, 2, 1])),
            Err("input: items 0 and 2 are equal; items must be unique".into())
        );
        let tuple = json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false});
        assert!(validate(&tuple, &json!(["a", 1])).is_ok());
        assert_eq!(validate(&tuple, &json!(["a", 1, 2])), Err("/2: no value is allowed here".into()));
        let labels =
            json!({"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": false});
        assert!(validate(&labels, &json!({"x-a": "1"})).is_ok());
        assert_eq!(validate(&labels, &json!({"x-a": 1})), Err("/x-a: must be string, got integer".into()));
        assert_eq!(validate(&labels, &json!({"y": "1"})), Err("/y: is not an allowed property".into()));
        assert_eq!(
            validate(&json!({"minProperties": 1}), &json!({})),
            Err("input: must have at least 1 properties".into())
        );
    }

    #[test]
    fn declarations_refuse_what_validation_would_ignore() {
        for (schema, expected) in [
            (json!({"type": "object", "dependentRequired": {}}), "keyword `dependentRequired` is not supported"),
            (json!({"properties": {"a": {"contains": {}}}}), "keyword `contains` is not supported"),
            (json!({"type": "string", "format": "color"}), "`format` \"color\" is not one the validator checks"),
            (json!({"pattern": "("}), "pattern \"(\" does not compile"),
            (json!({"$ref": "#/$defs/Missing"}), "does not resolve"),
            (json!({"minLength": "3"}), "`minLength` must be a non-negative integer"),
            (json!({"type": "text"}), "`type` must be one of"),
            (json!({"required": [1]}), "`required` must be an array of strings"),
            (json!({"anyOf": []}), "`anyOf` must be a non-empty array of schemas"),
            (json!({"multipleOf": 0}), "`multipleOf` must be a number greater than 0"),
            (json!([1]), "a schema must be an object or a boolean"),
        ] {
            let error = check_schema(&schema).unwrap_err();
            assert!(error.contains(expected), "{schema}: {error}");
        }
        assert!(check_schema(&json!({"properties": {"a": {"contains": {}}}}))
            .unwrap_err()
            .ends_with("at /properties/a/contains"));
    }

    #[test]
    fn schemars_derived_schemas_are_accepted() {
        // parity: 12
        #[derive(schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Input {
            /// A name.
            #[schemars(length(min = 1, max = 10), regex(pattern = r"^\w+$"))]
            name: String,
            count: u8,
            ratio: Option<f64>,
            tags: Vec<Tag>,
            pair: (i32, String),
            #[schemars(email)]
            contact: String,
        }
        #[derive(schemars::JsonSchema)]
        #[allow(dead_code)]
        enum Tag {
            A,
            B { weight: i64 },
        }
        let schema = crate::parent::agent_tool::schema_for::<Input>();
        assert_eq!(check_schema(&schema), Ok(()), "{schema:#}");
        let good = json!({"name": "ok", "count": 3, "ratio": null, "tags": ["A", {"B": {"weight": 2}}],
                          "pair": [1, "x"], "contact": "a@b.io"});
        assert_eq!(validate(&schema, &good), Ok(()));
        let mut bad = good.clone();
        bad["name"] = json!("two words");
        assert!(validate(&schema, &bad).unwrap_err().starts_with("/name: must match the pattern"));
        let mut bad = good.clone();
        bad["count"] = json!(300);
        assert!(validate(&schema, &bad).is_err(), "u8 bounds are checked");
        let mut bad = good;
        bad["contact"] = json!("nobody");
        assert_eq!(validate(&schema, &bad), Err("/contact: must be a valid email".into()));
    }

    #[test]
    fn a_ref_cycle_is_an_error_not_a_stack_overflow() {
        assert!(validate(&json!({"$ref": "#"}), &json!(1)).unwrap_err().contains("nests too deeply"));
        let tree = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}});
        assert_eq!(check_schema(&tree), Ok(()));
        assert!(validate(&tree, &json!({"children": [{"children": []}]})).is_ok(), "recursive types still validate");
    }
}
