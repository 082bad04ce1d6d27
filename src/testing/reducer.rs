//! A faithful Rust port of the stock TypeScript client reducer for `agent-tool-event` frames,
//! from the npm package `agents@0.32.0`:
//!
//! - `dist/agent-tools-CdJC-8Dc.js`: `applyAgentToolEvent`, `applyToRun`, `emptyRun`,
//!   `rebuildIndexes`, `sortRuns`, `createAgentToolEventState`, `agentToolEventDedupeKey`,
//!   `readAgentToolProgressChunk`, `readAgentToolMilestoneChunk` and `mergeMilestone`;
//! - `dist/message-builder-DAl9AhHH.js`: `applyChunkToParts` and its helpers;
//! - `dist/react.js`: `useAgentToolEvents`, which keeps a `seen` set of dedupe keys in front of
//!   the reducer.
//!
//! The simulation uses it as "a stock client": given the same frames it ends in the same state
//! as the JavaScript code, byte for byte once serialized, quirks included
//! (`tests/e2e/reducer_check.rs` checks that against the JavaScript code itself).
//!
//! # How the port stays faithful
//!
//! The JavaScript code is dynamically typed and a frame can hold any JSON, so the port works on
//! a small model of JavaScript values rather than on typed structs:
//!
//! - strings are UTF-16 code units: `JSON.parse` accepts lone surrogates, and `+=` on a text part
//!   joins the two halves of a surrogate pair sent in two deltas;
//! - objects keep JavaScript's property order (array-index keys first, ascending, then the other
//!   keys in insertion order); a property set to `undefined` keeps its slot but `JSON.stringify`
//!   leaves it out;
//! - the operations the code relies on are ported: `ToString`, `ToNumber`, `+`, `===`,
//!   truthiness, `??`, object spread, template literals, `Array.prototype.join` and `includes`,
//!   `JSON.parse`, `JSON.stringify`, V8's `Array.prototype.sort` (a TimSort: with an
//!   inconsistent comparator the order depends on the algorithm) and
//!   `String.prototype.localeCompare` (ICU's root collation);
//! - a property read the JavaScript code makes on the plain objects it builds sees
//!   `Object.prototype`: a run id such as `"toString"` finds a function where it expects a run;
//! - where the JavaScript code throws a `TypeError` (a chunk frame whose `body` is a number, a
//!   chunk for a run id inherited from `Object.prototype`, ...) the port returns a [`JsError`]:
//!   the hook then drops the frame if computing its dedupe key threw, and a reducer call that
//!   threw leaves the state as it was (its key stays seen);
//! - `Date.now()` (the `at` of a progress snapshot, and of a milestone without one) reads a
//!   clock the caller controls, so that a simulation stays deterministic (see [`Client`]);
//! - `applyChunkToParts` keeps side state in a `WeakMap` and a `WeakSet` keyed by part objects
//!   (`rawToolInputText`, `provisionalInput`). The reducer applies each chunk to fresh shallow
//!   copies of the parts (`parts.map((part) => ({ ...part }))`), so entries made for one chunk
//!   are unreachable from the next: the port keeps that side state in a table keyed by part
//!   index that lives for one chunk, which is all the JavaScript code can observe.
//!
//! Deliberate divergences, none reachable from frames a server sends: a chunk body nested more
//! than [`MAX_DEPTH`] levels deep counts as unparseable (V8 parses it, though it cannot
//! `JSON.stringify` a state much deeper); `localeCompare` orders ASCII exactly like ICU but other
//! characters by code unit; 64 or more runs under one key are sorted by a stable merge sort that
//! agrees with V8's whenever the comparator is consistent (numeric `order`s).

// Two crates build this file (the library's simulation and the end-to-end check against the
// JavaScript code), each using a part of its API.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The frame type the hook keeps (`message.type`).
const FRAME_TYPE: &str = "agent-tool-event";
/// The reserved chunk type of `reportProgress` frames.
const PROGRESS_PART: &str = "data-agent-progress";
/// The reserved chunk type of milestone frames.
const MILESTONE_PART: &str = "data-agent-milestone";
/// The own properties of `Object.prototype` (Node 20): what a property read on a plain object
/// finds when the object has no such own property.
const OBJECT_PROTOTYPE_KEYS: [&str; 12] = [
    "constructor",
    "__defineGetter__",
    "__defineSetter__",
    "hasOwnProperty",
    "__lookupGetter__",
    "__lookupSetter__",
    "isPrototypeOf",
    "propertyIsEnumerable",
    "toString",
    "valueOf",
    "__proto__",
    "toLocaleString",
];

/// How deeply a chunk body may nest before the port treats it as unparseable, where it parts
/// from `JSON.parse` (which has no limit): it keeps every recursive walk of a value well inside
/// a thread's stack.
pub const MAX_DEPTH: usize = 1000;

// ---------------------------------------------------------------------------------------------
// JavaScript values
// ---------------------------------------------------------------------------------------------

/// A JavaScript string: a sequence of UTF-16 code units, lone surrogates allowed. Held as Rust
/// text whenever it is valid Unicode (nearly always), as code units only when it holds a lone
/// surrogate, so that equal strings have equal representations.
#[derive(Clone, PartialEq, Eq, Hash)]
enum JsStr {
    Text(Arc<str>),
    Units(Arc<[u16]>),
}

impl JsStr {
    /// The string of these code units.
    fn from_units(units: Vec<u16>) -> Self {
        match String::from_utf16(&units) {
            Ok(text) => Self::Text(text.into()),
            Err(_) => Self::Units(units.into()),
        }
    }

    /// `a + b + ...`: halves of a surrogate pair that meet become one character.
    fn concat(parts: &[JsStr]) -> Self {
        if parts.iter().all(|p| matches!(p, Self::Text(_))) {
            let text: String = parts.iter().map(|p| p.text().unwrap_or_default()).collect();
            Self::Text(text.into())
        } else {
            Self::from_units(parts.iter().flat_map(|p| p.to_units()).collect())
        }
    }

    /// The Rust text, if this is valid Unicode.
    fn text(&self) -> Option<&str> {
        match self {
            Self::Text(text) => Some(text),
            Self::Units(_) => None,
        }
    }

    fn to_units(&self) -> Vec<u16> {
        match self {
            Self::Text(text) => text.encode_utf16().collect(),
            Self::Units(units) => units.to_vec(),
        }
    }

    fn is_empty(&self) -> bool {
        self.text() == Some("")
    }

    /// Whether this is exactly `s`.
    fn is(&self, s: &str) -> bool {
        self.text() == Some(s)
    }

    /// `String.prototype.includes` of an ASCII needle (which matches the same in UTF-8 bytes
    /// as in UTF-16 code units).
    fn contains(&self, needle: &str) -> bool {
        match self {
            Self::Text(text) => text.contains(needle),
            Self::Units(units) => {
                let needle: Vec<u16> = needle.encode_utf16().collect();
                needle.is_empty() || units.windows(needle.len()).any(|w| w == needle.as_slice())
            }
        }
    }

    /// `String.prototype.startsWith` of an ASCII prefix.
    fn starts_with(&self, prefix: &str) -> bool {
        match self {
            Self::Text(text) => text.starts_with(prefix),
            Self::Units(units) => units.iter().copied().take(prefix.len()).eq(prefix.encode_utf16()),
        }
    }

    /// The characters, a lone surrogate as `Err` (what `JSON.stringify` escapes).
    fn chars(&self) -> Box<dyn Iterator<Item = Result<char, u16>> + '_> {
        match self {
            Self::Text(text) => Box::new(text.chars().map(Ok)),
            Self::Units(units) => {
                Box::new(char::decode_utf16(units.iter().copied()).map(|c| c.map_err(|e| e.unpaired_surrogate())))
            }
        }
    }

    /// The string as Rust text, lone surrogates replaced by U+FFFD.
    fn lossy(&self) -> String {
        match self {
            Self::Text(text) => text.to_string(),
            Self::Units(units) => String::from_utf16_lossy(units),
        }
    }
}

impl From<&str> for JsStr {
    fn from(s: &str) -> Self {
        Self::Text(s.into())
    }
}

impl From<String> for JsStr {
    fn from(s: String) -> Self {
        Self::Text(s.into())
    }
}

/// A JavaScript value, as far as JSON and this code go (no functions, symbols or cycles).
/// Arrays and objects are shared: a clone is a new reference to the same value, and the code
/// never mutates a value in place once another reference can see it.
#[derive(Clone)]
enum Js {
    Undefined,
    Null,
    Bool(bool),
    Num(f64),
    Str(JsStr),
    Arr(Arc<Vec<Js>>),
    Obj(Arc<Obj>),
}

impl Js {
    fn str(s: &str) -> Self {
        Self::Str(s.into())
    }

    fn array(items: Vec<Js>) -> Self {
        Self::Arr(Arc::new(items))
    }

    fn object(obj: Obj) -> Self {
        Self::Obj(Arc::new(obj))
    }

    fn empty_object() -> Self {
        Self::object(Obj::default())
    }

    fn is_undefined(&self) -> bool {
        matches!(self, Self::Undefined)
    }

    /// `value == null`.
    fn is_nullish(&self) -> bool {
        matches!(self, Self::Undefined | Self::Null)
    }

    /// Whether this is the string `s`.
    fn is_str(&self, s: &str) -> bool {
        matches!(self, Self::Str(v) if v.is(s))
    }

    /// `value ?? fallback`.
    fn or(self, fallback: Js) -> Js {
        if self.is_nullish() {
            fallback
        } else {
            self
        }
    }

    /// Converts parsed JSON (numbers become doubles, as `JSON.parse` makes them).
    fn from_serde(value: &Value) -> Self {
        match value {
            Value::Null => Self::Null,
            Value::Bool(b) => Self::Bool(*b),
            Value::Number(n) => Self::Num(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => Self::str(s),
            Value::Array(items) => Self::array(items.iter().map(Self::from_serde).collect()),
            Value::Object(map) => {
                let mut obj = Obj::default();
                for (key, value) in map {
                    obj.set(key, Self::from_serde(value));
                }
                Self::object(obj)
            }
        }
    }

    /// What `JSON.parse(JSON.stringify(value))` would give, as serde JSON (`None` where
    /// `JSON.stringify` leaves the value out). Lone surrogates become U+FFFD.
    fn to_serde(&self) -> Option<Value> {
        Some(match self {
            Self::Undefined => return None,
            Self::Null => Value::Null,
            Self::Bool(b) => Value::Bool(*b),
            Self::Num(n) if n.is_finite() => {
                number_to_string(*n).parse::<serde_json::Number>().map_or(Value::Null, Value::Number)
            }
            Self::Num(_) => Value::Null,
            Self::Str(s) => Value::String(s.lossy()),
            Self::Arr(items) => Value::Array(items.iter().map(|v| v.to_serde().unwrap_or(Value::Null)).collect()),
            Self::Obj(obj) => {
                Value::Object(obj.entries().filter_map(|(k, v)| v.to_serde().map(|v| (k.lossy(), v))).collect())
            }
        })
    }
}

/// A plain JavaScript object: own properties in JavaScript's order.
#[derive(Clone, Default)]
struct Obj(Vec<(JsStr, Js)>);

impl Obj {
    /// An object literal `{ k1: v1, k2: v2, ... }`.
    fn of<const N: usize>(entries: [(&str, Js); N]) -> Self {
        let mut obj = Self::default();
        for (key, value) in entries {
            obj.set(key, value);
        }
        obj
    }

    /// `{ ...value }`: a shallow copy of `value`'s own enumerable properties.
    fn copy_of(value: &Js) -> Self {
        match value {
            Js::Obj(obj) => (**obj).clone(),
            other => {
                let mut obj = Self::default();
                obj.spread(other);
                obj
            }
        }
    }

    fn entries(&self) -> impl Iterator<Item = (&JsStr, &Js)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    fn values(&self) -> impl Iterator<Item = &Js> {
        self.0.iter().map(|(_, v)| v)
    }

    fn own(&self, key: &JsStr) -> Option<&Js> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `obj.key` for a key no prototype of a plain object has: `undefined` when absent.
    fn get(&self, key: &str) -> Js {
        self.0.iter().find(|(k, _)| k.is(key)).map_or(Js::Undefined, |(_, v)| v.clone())
    }

    /// `key in obj`, for a key no prototype of a plain object has.
    fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k.is(key))
    }

    fn set(&mut self, key: &str, value: Js) {
        match self.0.iter_mut().find(|(k, _)| k.is(key)) {
            Some(slot) => slot.1 = value,
            None => self.set_key(key.into(), value),
        }
    }

    /// Defines an own property (`CreateDataProperty`): an existing key keeps its place; a new
    /// array-index key goes among the index keys, in numeric order; any other key goes last.
    fn set_key(&mut self, key: JsStr, value: Js) {
        if let Some(slot) = self.0.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
            return;
        }
        let at = match array_index(&key) {
            Some(index) => self
                .0
                .iter()
                .position(|(k, _)| array_index(k).is_none_or(|other| other > index))
                .unwrap_or(self.0.len()),
            None => self.0.len(),
        };
        self.0.insert(at, (key, value));
    }

    /// Sets `key` unless `value == null` (`...(v != null ? { key: v } : {})`).
    fn set_unless_nullish(&mut self, key: &str, value: Js) {
        if !value.is_nullish() {
            self.set(key, value);
        }
    }

    /// `{ ...this, ...source }`: copies `source`'s own enumerable properties (a string's are
    /// its UTF-16 code units, an array's its elements; other primitives have none).
    fn spread(&mut self, source: &Js) {
        match source {
            Js::Obj(obj) => {
                for (key, value) in obj.entries() {
                    self.set_key(key.clone(), value.clone());
                }
            }
            Js::Arr(items) => {
                for (index, value) in items.iter().enumerate() {
                    self.set(&index.to_string(), value.clone());
                }
            }
            Js::Str(s) => {
                for (index, unit) in s.to_units().into_iter().enumerate() {
                    self.set(&index.to_string(), Js::Str(JsStr::from_units(vec![unit])));
                }
            }
            _ => {}
        }
    }
}

/// The value of `key` if it is an array index (a canonical decimal integer below 2^32 - 1),
/// the keys JavaScript orders first.
fn array_index(key: &JsStr) -> Option<u32> {
    let text = key.text()?;
    let canonical = !text.is_empty()
        && text.len() <= 10
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !canonical {
        return None;
    }
    text.parse::<u64>().ok().and_then(|v| u32::try_from(v).ok()).filter(|v| *v != u32::MAX)
}

/// An exception the JavaScript code would have thrown; the port returns it instead of
/// panicking. Those [`Client::receive`] reports are all `TypeError`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsError(String);

impl JsError {
    fn type_error(message: &str) -> Self {
        Self(format!("TypeError: {message}"))
    }

    fn syntax_error(message: &str) -> Self {
        Self(format!("SyntaxError: {message}"))
    }

    /// The exception, roughly as JavaScript would print it.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JsError {}

// ---------------------------------------------------------------------------------------------
// Abstract operations
// ---------------------------------------------------------------------------------------------

/// `value.key`: throws on `undefined` and `null`.
fn get(value: &Js, key: &str) -> Result<Js, JsError> {
    match value {
        Js::Undefined | Js::Null => {
            Err(JsError::type_error(&format!("Cannot read properties of null or undefined (reading '{key}')")))
        }
        other => Ok(prop(other, key)),
    }
}

/// `value.key` on a value known not to be `undefined` or `null`. None of the keys this code
/// reads exists on `Object.prototype`, `Array.prototype` or the primitives' prototypes, except
/// `at` (`Array.prototype.at`, `String.prototype.at`), which is only ever tested with
/// `typeof … === "number"`, where a function and `undefined` agree.
fn prop(value: &Js, key: &str) -> Js {
    match value {
        Js::Obj(obj) => obj.get(key),
        _ => Js::Undefined,
    }
}

/// Truthiness (`if (value)`).
fn truthy(value: &Js) -> bool {
    match value {
        Js::Undefined | Js::Null => false,
        Js::Bool(b) => *b,
        Js::Num(n) => *n != 0.0 && !n.is_nan(),
        Js::Str(s) => !s.is_empty(),
        Js::Arr(_) | Js::Obj(_) => true,
    }
}

/// `a === b`. Objects and arrays are never equal: every comparison this code makes is between
/// values of different frames, and each frame is its own `JSON.parse`.
fn strict_eq(a: &Js, b: &Js) -> bool {
    match (a, b) {
        (Js::Undefined, Js::Undefined) | (Js::Null, Js::Null) => true,
        (Js::Bool(a), Js::Bool(b)) => a == b,
        (Js::Num(a), Js::Num(b)) => a == b,
        (Js::Str(a), Js::Str(b)) => a == b,
        _ => false,
    }
}

/// `ToString(value)` (also what a template literal does).
fn to_js_string(value: &Js) -> JsStr {
    match value {
        Js::Undefined => "undefined".into(),
        Js::Null => "null".into(),
        Js::Bool(b) => if *b { "true" } else { "false" }.into(),
        Js::Num(n) => number_to_string(*n).as_str().into(),
        Js::Str(s) => s.clone(),
        Js::Arr(items) => join(items, ","),
        Js::Obj(_) => "[object Object]".into(),
    }
}

/// `Array.prototype.join`: `undefined` and `null` elements become empty strings.
fn join(items: &[Js], separator: &str) -> JsStr {
    let mut parts = Vec::with_capacity(2 * items.len());
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            parts.push(separator.into());
        }
        if !item.is_nullish() {
            parts.push(to_js_string(item));
        }
    }
    JsStr::concat(&parts)
}

/// `Number.prototype.toString()`: the shortest digits that round-trip, laid out as ECMAScript
/// specifies (`1e+21`, `1e-7`, `0.000001`, `123`).
fn number_to_string(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x < 0.0 {
        return format!("-{}", number_to_string(-x));
    }
    // Rust's shortest round-trip digits, e.g. "1.2345e-7".
    let scientific = format!("{x:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else { return scientific };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = digits.len() as i64;
    let n = exponent.parse::<i64>().unwrap_or(0) + 1;
    if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let sign = if n > 0 { '+' } else { '-' };
        let e = (n - 1).abs();
        if k == 1 {
            format!("{digits}e{sign}{e}")
        } else {
            format!("{}.{}e{sign}{e}", &digits[..1], &digits[1..])
        }
    }
}

/// `ToNumber(value)`.
fn to_number(value: &Js) -> f64 {
    match value {
        Js::Undefined => f64::NAN,
        Js::Null => 0.0,
        Js::Bool(b) => f64::from(u8::from(*b)),
        Js::Num(n) => *n,
        Js::Str(s) => string_to_number(s),
        // ToPrimitive: an array's `toString` is `join`; an object's is "[object Object]".
        Js::Arr(items) => string_to_number(&join(items, ",")),
        Js::Obj(_) => f64::NAN,
    }
}

/// JavaScript's `WhiteSpace` and `LineTerminator` (what `trim` and `Number(string)` strip).
fn is_js_space(c: char) -> bool {
    matches!(
        c as u32,
        0x09..=0x0D | 0x20 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000 | 0xFEFF
    )
}

/// `StringToNumber`: decimal literals with an optional sign, `Infinity`, and `0x`/`0o`/`0b`
/// integers; surrounding whitespace ignored; empty is 0; anything else NaN.
fn string_to_number(s: &JsStr) -> f64 {
    // A lone surrogate is neither space nor part of a number.
    let Some(text) = s.text() else { return f64::NAN };
    let text = text.trim_matches(is_js_space);
    if text.is_empty() {
        return 0.0;
    }
    if !text.is_ascii() {
        return f64::NAN;
    }
    for (prefix, radix) in [("0x", 16), ("0X", 16), ("0o", 8), ("0O", 8), ("0b", 2), ("0B", 2)] {
        if let Some(digits) = text.strip_prefix(prefix) {
            return radix_integer(digits, radix);
        }
    }
    let (negative, body) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = if body == "Infinity" {
        f64::INFINITY
    } else if is_decimal_literal(body) {
        body.parse::<f64>().unwrap_or(f64::NAN)
    } else {
        return f64::NAN;
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// `StrUnsignedDecimalLiteral` without `Infinity`: `1`, `1.`, `.5`, `1.5e-3`.
fn is_decimal_literal(s: &str) -> bool {
    let bytes = s.as_bytes();
    let mut i = 0;
    let int_digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    i += int_digits;
    let mut frac_digits = 0;
    if bytes.get(i) == Some(&b'.') {
        i += 1;
        frac_digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        i += frac_digits;
    }
    if int_digits + frac_digits == 0 {
        return false;
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(bytes.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exp_digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if exp_digits == 0 {
            return false;
        }
        i += exp_digits;
    }
    i == bytes.len()
}

/// A `0x`/`0o`/`0b` integer, rounded to the nearest double (ties to even).
fn radix_integer(digits: &str, radix: u32) -> f64 {
    let bits_per_digit = match radix {
        16 => 4,
        8 => 3,
        _ => 1,
    };
    let mut bits = Vec::with_capacity(digits.len() * bits_per_digit);
    for c in digits.chars() {
        let Some(d) = c.to_digit(radix) else { return f64::NAN };
        bits.extend((0..bits_per_digit).rev().map(|b| (d >> b) & 1 == 1));
    }
    if bits.is_empty() {
        return f64::NAN;
    }
    let first_one = bits.iter().position(|b| *b).unwrap_or(bits.len());
    let bits = &bits[first_one..];
    let mantissa_bits = bits.len().min(53);
    let mut mantissa = bits[..mantissa_bits].iter().fold(0u64, |acc, b| acc << 1 | u64::from(*b));
    if bits.len() > 53 {
        let round = bits[53];
        let sticky = bits[54..].iter().any(|b| *b);
        if round && (sticky || mantissa & 1 == 1) {
            mantissa += 1;
        }
    }
    let shift = bits.len().saturating_sub(53);
    mantissa as f64 * 2f64.powi(i32::try_from(shift).unwrap_or(i32::MAX))
}

/// The `+` operator.
fn js_add(a: &Js, b: &Js) -> Js {
    let primitive = |v: &Js| match v {
        Js::Arr(_) | Js::Obj(_) => Js::Str(to_js_string(v)),
        other => other.clone(),
    };
    let (a, b) = (primitive(a), primitive(b));
    if matches!(a, Js::Str(_)) || matches!(b, Js::Str(_)) {
        Js::Str(JsStr::concat(&[to_js_string(&a), to_js_string(&b)]))
    } else {
        Js::Num(to_number(&a) + to_number(&b))
    }
}

/// `array.includes(needle)` / `string.includes(needle)` on a chunk's `body`.
fn includes(value: &Js, needle: &str) -> Result<bool, JsError> {
    match value {
        Js::Str(s) => Ok(s.contains(needle)),
        Js::Arr(items) => Ok(items.iter().any(|item| item.is_str(needle))),
        Js::Undefined | Js::Null => {
            Err(JsError::type_error("Cannot read properties of undefined (reading 'includes')"))
        }
        _ => Err(JsError::type_error("event.body.includes is not a function")),
    }
}

// ---------------------------------------------------------------------------------------------
// JSON.parse and JSON.stringify
// ---------------------------------------------------------------------------------------------

/// `JSON.parse(text)`: duplicate keys keep their first place and their last value; numbers
/// are doubles (`1e400` is `Infinity`); lone surrogates are kept. Iterative, so no input can
/// exhaust the stack; nesting beyond [`MAX_DEPTH`] is refused.
fn json_parse(text: &[u16]) -> Result<Js, JsError> {
    enum Open {
        Array(Vec<Js>),
        Object(Obj, JsStr),
    }
    let mut p = Parser { text, pos: 0 };
    let mut stack: Vec<Open> = Vec::new();
    'value: loop {
        p.skip_space();
        let mut value = match p.peek() {
            Some(b'{') => {
                p.pos += 1;
                p.skip_space();
                if p.eat(b'}') {
                    Js::empty_object()
                } else {
                    if stack.len() >= MAX_DEPTH {
                        return Err(p.error("nesting too deep"));
                    }
                    let key = p.key()?;
                    stack.push(Open::Object(Obj::default(), key));
                    continue 'value;
                }
            }
            Some(b'[') => {
                p.pos += 1;
                p.skip_space();
                if p.eat(b']') {
                    Js::array(Vec::new())
                } else {
                    if stack.len() >= MAX_DEPTH {
                        return Err(p.error("nesting too deep"));
                    }
                    stack.push(Open::Array(Vec::new()));
                    continue 'value;
                }
            }
            Some(b'"') => Js::Str(p.string()?),
            Some(b't') => p.literal("true", Js::Bool(true))?,
            Some(b'f') => p.literal("false", Js::Bool(false))?,
            Some(b'n') => p.literal("null", Js::Null)?,
            Some(b'-' | b'0'..=b'9') => Js::Num(p.number()?),
            _ => return Err(p.error("unexpected token")),
        };
        // A value is complete: hand it to the array or object it belongs to.
        loop {
            match stack.pop() {
                None => {
                    p.skip_space();
                    return if p.pos == p.text.len() { Ok(value) } else { Err(p.error("unexpected token")) };
                }
                Some(Open::Array(mut items)) => {
                    items.push(value);
                    p.skip_space();
                    if p.eat(b',') {
                        stack.push(Open::Array(items));
                        continue 'value;
                    }
                    p.expect(b']')?;
                    value = Js::array(items);
                }
                Some(Open::Object(mut obj, key)) => {
                    obj.set_key(key, value);
                    p.skip_space();
                    if p.eat(b',') {
                        p.skip_space();
                        let key = p.key()?;
                        stack.push(Open::Object(obj, key));
                        continue 'value;
                    }
                    p.expect(b'}')?;
                    value = Js::object(obj);
                }
            }
        }
    }
}

/// The cursor of [`json_parse`].
struct Parser<'a> {
    text: &'a [u16],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> JsError {
        JsError::syntax_error(&format!("{what} in JSON at position {}", self.pos))
    }

    /// The next code unit if it is ASCII.
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).and_then(|u| u8::try_from(*u).ok()).filter(u8::is_ascii)
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let found = self.peek() == Some(c);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, c: u8) -> Result<(), JsError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.error("unexpected token"))
        }
    }

    fn literal(&mut self, word: &str, value: Js) -> Result<Js, JsError> {
        let end = self.pos + word.len();
        if self.text.get(self.pos..end).is_some_and(|s| s.iter().copied().eq(word.encode_utf16())) {
            self.pos = end;
            Ok(value)
        } else {
            Err(self.error("unexpected token"))
        }
    }

    /// An object key and the colon after it.
    fn key(&mut self) -> Result<JsStr, JsError> {
        if self.peek() != Some(b'"') {
            return Err(self.error("expected a property name"));
        }
        let key = self.string()?;
        self.skip_space();
        self.expect(b':')?;
        Ok(key)
    }

    fn string(&mut self) -> Result<JsStr, JsError> {
        self.pos += 1; // the opening quote
        let mut units = Vec::new();
        loop {
            let Some(&unit) = self.text.get(self.pos) else { return Err(self.error("unterminated string")) };
            self.pos += 1;
            match unit {
                0x22 => return Ok(JsStr::from_units(units)),
                0x5C => {
                    let escaped = self.peek();
                    self.pos += 1;
                    units.push(match escaped {
                        Some(b'"') => 0x22,
                        Some(b'\\') => 0x5C,
                        Some(b'/') => 0x2F,
                        Some(b'b') => 0x08,
                        Some(b'f') => 0x0C,
                        Some(b'n') => 0x0A,
                        Some(b'r') => 0x0D,
                        Some(b't') => 0x09,
                        Some(b'u') => {
                            let hex = self.text.get(self.pos..self.pos + 4).ok_or_else(|| self.error("bad escape"))?;
                            let hex = String::from_utf16(hex).map_err(|_| self.error("bad escape"))?;
                            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                                return Err(self.error("bad escape"));
                            }
                            self.pos += 4;
                            u16::from_str_radix(&hex, 16).map_err(|_| self.error("bad escape"))?
                        }
                        _ => return Err(self.error("bad escape")),
                    });
                }
                u if u < 0x20 => return Err(self.error("bad control character in string literal")),
                u => units.push(u),
            }
        }
    }

    fn number(&mut self) -> Result<f64, JsError> {
        let start = self.pos;
        self.eat(b'-');
        let digits = |p: &mut Self| {
            let from = p.pos;
            while matches!(p.peek(), Some(b'0'..=b'9')) {
                p.pos += 1;
            }
            p.pos - from
        };
        if self.eat(b'0') {
            // no more integer digits after a leading zero
        } else if digits(self) == 0 {
            return Err(self.error("no number after minus sign"));
        }
        if self.eat(b'.') && digits(self) == 0 {
            return Err(self.error("unterminated fractional number"));
        }
        if self.eat(b'e') || self.eat(b'E') {
            let _ = self.eat(b'+') || self.eat(b'-');
            if digits(self) == 0 {
                return Err(self.error("exponent part is missing a number"));
            }
        }
        let literal: String = self.text[start..self.pos].iter().map(|u| char::from(*u as u8)).collect();
        literal.parse::<f64>().map_err(|_| self.error("bad number"))
    }
}

/// `JSON.stringify(value)`; `None` for `undefined`.
fn json_stringify(value: &Js) -> Option<String> {
    let mut out = String::new();
    write_json(&mut out, value).then_some(out)
}

/// Writes `value` as `JSON.stringify` does; false (and nothing written) for `undefined`.
fn write_json(out: &mut String, value: &Js) -> bool {
    match value {
        Js::Undefined => return false,
        Js::Null => out.push_str("null"),
        Js::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Js::Num(n) if n.is_finite() => out.push_str(&number_to_string(*n)),
        Js::Num(_) => out.push_str("null"),
        Js::Str(s) => write_json_string(out, s),
        Js::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if !write_json(out, item) {
                    out.push_str("null");
                }
            }
            out.push(']');
        }
        Js::Obj(obj) => {
            out.push('{');
            let mut first = true;
            for (key, value) in obj.entries().filter(|(_, v)| !v.is_undefined()) {
                if !first {
                    out.push(',');
                }
                first = false;
                write_json_string(out, key);
                out.push(':');
                write_json(out, value);
            }
            out.push('}');
        }
    }
    true
}

/// `QuoteJSONString`, with lone surrogates escaped (well-formed `JSON.stringify`).
fn write_json_string(out: &mut String, s: &JsStr) {
    out.push('"');
    for decoded in s.chars() {
        match decoded {
            Ok('"') => out.push_str("\\\""),
            Ok('\\') => out.push_str("\\\\"),
            Ok('\u{8}') => out.push_str("\\b"),
            Ok('\u{c}') => out.push_str("\\f"),
            Ok('\n') => out.push_str("\\n"),
            Ok('\r') => out.push_str("\\r"),
            Ok('\t') => out.push_str("\\t"),
            Ok(c) if c < ' ' => out.push_str(&format!("\\u{:04x}", c as u32)),
            Ok(c) => out.push(c),
            Err(lone) => out.push_str(&format!("\\u{lone:04x}")),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Array.prototype.sort and String.prototype.localeCompare
// ---------------------------------------------------------------------------------------------

/// A comparator as `Array.prototype.sort` calls it: `(a, b) => number`, maybe throwing.
type Comparator<'a> = &'a mut dyn FnMut(&Js, &Js) -> Result<f64, JsError>;

/// V8's `Array.prototype.sort` (TimSort, `third_party/v8/builtins/array-sort.tq`): below 64
/// elements one run, found by `CountAndMakeRun` and extended by `BinaryInsertionSort`, so the
/// very comparisons V8 makes, in its order; from 64 elements on, runs merged by a stable merge.
/// A comparator result of NaN counts as 0.
fn v8_sort(items: &mut [Js], compare: Comparator<'_>) -> Result<(), JsError> {
    let n = items.len();
    if n < 2 {
        return Ok(());
    }
    let mut compare = |a: &Js, b: &Js| compare(a, b).map(|v| if v.is_nan() { 0.0 } else { v });
    let min_run = {
        let (mut m, mut r) = (n, 0);
        while m >= 64 {
            r |= m & 1;
            m >>= 1;
        }
        m + r
    };
    let mut runs = Vec::new();
    let mut low = 0;
    while low < n {
        let remaining = n - low;
        let mut run = count_and_make_run(items, low, n, &mut compare)?;
        if run < min_run {
            let forced = min_run.min(remaining);
            binary_insertion_sort(items, low, low + run, low + forced, &mut compare)?;
            run = forced;
        }
        runs.push(low..low + run);
        low += run;
    }
    // Merge the runs left to right: a right element goes first only if it is strictly less.
    let mut merged: Vec<Js> = items[runs[0].clone()].to_vec();
    for run in &runs[1..] {
        let right = &items[run.clone()];
        let mut out = Vec::with_capacity(merged.len() + right.len());
        let (mut i, mut j) = (0, 0);
        while i < merged.len() && j < right.len() {
            if compare(&right[j], &merged[i])? < 0.0 {
                out.push(right[j].clone());
                j += 1;
            } else {
                out.push(merged[i].clone());
                i += 1;
            }
        }
        out.extend_from_slice(&merged[i..]);
        out.extend_from_slice(&right[j..]);
        merged = out;
    }
    items.clone_from_slice(&merged);
    Ok(())
}

/// `CountAndMakeRun`: the length of the run starting at `low` (non-descending, or strictly
/// descending and then reversed).
fn count_and_make_run(
    items: &mut [Js],
    low: usize,
    high: usize,
    compare: &mut dyn FnMut(&Js, &Js) -> Result<f64, JsError>,
) -> Result<usize, JsError> {
    if low + 1 == high {
        return Ok(1);
    }
    let descending = compare(&items[low + 1], &items[low])? < 0.0;
    let mut length = 2;
    for idx in low + 2..high {
        let order = compare(&items[idx], &items[idx - 1])?;
        if (descending && order >= 0.0) || (!descending && order < 0.0) {
            break;
        }
        length += 1;
    }
    if descending {
        items[low..low + length].reverse();
    }
    Ok(length)
}

/// `BinaryInsertionSort`: sorts `[low, high)` given that `[low, start)` is sorted.
fn binary_insertion_sort(
    items: &mut [Js],
    low: usize,
    start: usize,
    high: usize,
    compare: &mut dyn FnMut(&Js, &Js) -> Result<f64, JsError>,
) -> Result<(), JsError> {
    let mut start = if low == start { start + 1 } else { start };
    while start < high {
        let (mut left, mut right) = (low, start);
        while left < right {
            let mid = left + ((right - left) >> 1);
            if compare(&items[start], &items[mid])? < 0.0 {
                right = mid;
            } else {
                left = mid + 1;
            }
        }
        items[left..=start].rotate_right(1);
        start += 1;
    }
    Ok(())
}

/// The ICU root collation's order of the ASCII characters that are not ignorable (checked
/// against Node 20's `localeCompare`): letters compare equal at the primary level regardless of
/// case, then lowercase before uppercase; the other control characters are ignored.
const ASCII_COLLATION: &[u8] = b"\t\n\x0b\x0c\r _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789abcdefghijklmnopqrstuvwxyz";

/// `a.localeCompare(b)` in Node's default (en-US) collation: -1, 0 or 1.
fn locale_compare(a: &[u16], b: &[u16]) -> f64 {
    // (primary weight, tertiary weight) per character; ignorable characters have none.
    let elements = |s: &[u16]| -> Vec<(u32, u8)> {
        s.iter()
            .filter_map(|&unit| match u8::try_from(unit) {
                Ok(c) if c.is_ascii() => ASCII_COLLATION
                    .iter()
                    .position(|&o| o == c.to_ascii_lowercase())
                    .map(|p| (p as u32 + 1, u8::from(c.is_ascii_uppercase()))),
                _ => Some((0x100 + u32::from(unit), 0)),
            })
            .collect()
    };
    let (a, b) = (elements(a), elements(b));
    let order =
        a.iter().map(|e| e.0).cmp(b.iter().map(|e| e.0)).then_with(|| a.iter().map(|e| e.1).cmp(b.iter().map(|e| e.1)));
    match order {
        std::cmp::Ordering::Less => -1.0,
        std::cmp::Ordering::Equal => 0.0,
        std::cmp::Ordering::Greater => 1.0,
    }
}

// ---------------------------------------------------------------------------------------------
// The reducer (agent-tools-CdJC-8Dc.js)
// ---------------------------------------------------------------------------------------------

/// The reducer's state (`AgentToolEventState`): `runsById`, `runsByToolCallId` and
/// `unboundRuns`, as the JavaScript code would hold them.
#[derive(Clone, Default)]
pub struct State {
    runs_by_id: Obj,
    /// Tool call id to its runs (each value an array of runs).
    runs_by_tool_call_id: Obj,
    unbound_runs: Vec<Js>,
}

impl State {
    /// `createAgentToolEventState()`: no runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// `JSON.stringify(state)`, byte for byte.
    pub fn to_json_string(&self) -> String {
        let mut out = String::from("{\"runsById\":");
        write_json(&mut out, &Js::object(self.runs_by_id.clone()));
        out.push_str(",\"runsByToolCallId\":");
        write_json(&mut out, &Js::object(self.runs_by_tool_call_id.clone()));
        out.push_str(",\"unboundRuns\":");
        write_json(&mut out, &Js::array(self.unbound_runs.clone()));
        out.push('}');
        out
    }

    /// `JSON.parse(JSON.stringify(state))` as serde JSON (keys `runsById`, `runsByToolCallId`,
    /// `unboundRuns`; `undefined` fields left out). Lone surrogates, which only a chunk body
    /// with `\ud8xx` escapes can bring in, become U+FFFD.
    pub fn to_json(&self) -> Value {
        let mut map = serde_json::Map::new();
        map.insert("runsById".into(), Js::object(self.runs_by_id.clone()).to_serde().unwrap_or(Value::Null));
        map.insert(
            "runsByToolCallId".into(),
            Js::object(self.runs_by_tool_call_id.clone()).to_serde().unwrap_or(Value::Null),
        );
        map.insert("unboundRuns".into(), Js::array(self.unbound_runs.clone()).to_serde().unwrap_or(Value::Null));
        Value::Object(map)
    }

    /// How many runs the state knows (`Object.keys(state.runsById).length`).
    pub fn run_count(&self) -> usize {
        self.runs_by_id.0.len()
    }
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json_string())
    }
}

/// `applyAgentToolEvent(state, frame)`. `now` stands for `Date.now()`. A frame that is not an
/// `agent-tool-event` leaves the state as it is; `Err` is the exception the JavaScript code
/// would throw.
pub fn apply_agent_tool_event(state: &State, frame: &Value, now: &mut dyn FnMut() -> f64) -> Result<State, JsError> {
    Ok(apply_message(state, &Js::from_serde(frame), now)?.unwrap_or_else(|| state.clone()))
}

/// `agentToolEventDedupeKey(frame)`, the identity the hook deduplicates frames on (its parts
/// joined by NUL characters; lone surrogates as U+FFFD). `now` stands for `Date.now()`, which
/// the JavaScript code reads while computing it.
pub fn agent_tool_event_dedupe_key(frame: &Value, now: &mut dyn FnMut() -> f64) -> Result<String, JsError> {
    dedupe_key(&Js::from_serde(frame), now).map(|key| key.lossy())
}

/// `applyAgentToolEvent`: `None` when it returns the state unchanged.
fn apply_message(state: &State, message: &Js, now: &mut dyn FnMut() -> f64) -> Result<Option<State>, JsError> {
    if !get(message, "type")?.is_str(FRAME_TYPE) {
        return Ok(None);
    }
    let event = get(message, "event")?;
    let run_id = get(&event, "runId")?;
    let key = to_js_string(&run_id);
    let prev = state.runs_by_id.own(&key).cloned().or_else(|| inherited(&key));
    let Some(next) = apply_to_run(prev, message, &event, now)? else { return Ok(None) };
    let mut runs_by_id = state.runs_by_id.clone();
    runs_by_id.set_key(key, next);
    let (runs_by_tool_call_id, unbound_runs) = rebuild_indexes(&runs_by_id)?;
    Ok(Some(State { runs_by_id, runs_by_tool_call_id, unbound_runs }))
}

/// What `obj[key]` finds on a plain object without that own property: a member of
/// `Object.prototype` (a function, or `Object.prototype` itself for `__proto__`), none of which
/// has an own enumerable property, a `status` or `parts`: the port stands in `{}` for it.
fn inherited(key: &JsStr) -> Option<Js> {
    OBJECT_PROTOTYPE_KEYS.iter().any(|k| key.is(k)).then(Js::empty_object)
}

/// `sortRuns`: by `order`, then by `runId` (`localeCompare`).
fn sort_runs(runs: &mut [Js]) -> Result<(), JsError> {
    v8_sort(runs, &mut |a, b| {
        let (a_order, b_order) = (prop(a, "order"), prop(b, "order"));
        if !strict_eq(&a_order, &b_order) {
            return Ok(to_number(&a_order) - to_number(&b_order));
        }
        match prop(a, "runId") {
            Js::Str(a_id) => Ok(locale_compare(&a_id.to_units(), &to_js_string(&prop(b, "runId")).to_units())),
            Js::Undefined | Js::Null => {
                Err(JsError::type_error("Cannot read properties of undefined (reading 'localeCompare')"))
            }
            _ => Err(JsError::type_error("a.runId.localeCompare is not a function")),
        }
    })
}

/// `rebuildIndexes(runsById)`: runs grouped by `parentToolCallId` (truthy ones), the others
/// unbound; each list sorted.
fn rebuild_indexes(runs_by_id: &Obj) -> Result<(Obj, Vec<Js>), JsError> {
    let mut grouped: Vec<(JsStr, Vec<Js>)> = Vec::new();
    let mut unbound = Vec::new();
    for run in runs_by_id.values() {
        let parent = prop(run, "parentToolCallId");
        if !truthy(&parent) {
            unbound.push(run.clone());
            continue;
        }
        let key = to_js_string(&parent);
        if let Some((_, runs)) = grouped.iter_mut().find(|(k, _)| *k == key) {
            runs.push(run.clone());
        } else if inherited(&key).is_some() {
            // `grouped[key] ?? []` finds the inherited member, which has no `push`.
            return Err(JsError::type_error("grouped[run.parentToolCallId].push is not a function"));
        } else {
            grouped.push((key, vec![run.clone()]));
        }
    }
    // Sort in `Object.entries(grouped)` order (index keys first), as the JavaScript loop does.
    let mut by_tool_call = Obj::default();
    for (key, _) in &grouped {
        by_tool_call.set_key(key.clone(), Js::Undefined);
    }
    let keys: Vec<JsStr> = by_tool_call.entries().map(|(k, _)| k.clone()).collect();
    for key in keys {
        let Some(group) = grouped.iter_mut().find(|(k, _)| *k == key) else { continue };
        let mut runs = std::mem::take(&mut group.1);
        sort_runs(&mut runs)?;
        by_tool_call.set_key(key, Js::array(runs));
    }
    sort_runs(&mut unbound)?;
    Ok((by_tool_call, unbound))
}

/// `emptyRun(message)`: the run a `started` event creates; `None` for any other kind.
fn empty_run(message: &Js, event: &Js) -> Option<Js> {
    if !prop(event, "kind").is_str("started") {
        return None;
    }
    Some(Js::object(Obj::of([
        ("runId", prop(event, "runId")),
        ("agentType", prop(event, "agentType")),
        ("parentToolCallId", prop(message, "parentToolCallId")),
        ("inputPreview", prop(event, "inputPreview")),
        ("order", prop(event, "order")),
        ("display", prop(event, "display")),
        ("status", Js::str("running")),
        ("parts", Js::array(Vec::new())),
        ("subAgent", Js::object(Obj::of([("agent", prop(event, "agentType")), ("name", prop(event, "runId"))]))),
    ])))
}

/// `applyToRun(prev, message)`: the run after `message`, or `None` (`undefined`) when the
/// event does not apply (a non-`started` event for an unknown run, an unknown kind).
fn apply_to_run(
    prev: Option<Js>,
    message: &Js,
    event: &Js,
    now: &mut dyn FnMut() -> f64,
) -> Result<Option<Js>, JsError> {
    let seeded = prev.or_else(|| empty_run(message, event));
    let kind = prop(event, "kind");
    let Js::Str(kind) = kind else { return Ok(None) };
    let kind = kind.lossy();
    if kind == "started" {
        let status = seeded.as_ref().map_or(Js::Undefined, |s| prop(s, "status"));
        if ["completed", "error", "aborted", "interrupted"].iter().any(|s| status.is_str(s)) {
            return Ok(seeded);
        }
        let mut run = seeded.as_ref().map(Obj::copy_of).unwrap_or_default();
        run.set("runId", prop(event, "runId"));
        run.set("agentType", prop(event, "agentType"));
        run.set("parentToolCallId", prop(message, "parentToolCallId"));
        run.set("inputPreview", prop(event, "inputPreview"));
        run.set("order", prop(event, "order"));
        run.set("display", prop(event, "display"));
        run.set("status", Js::str("running"));
        let parts = seeded.as_ref().map_or(Js::Undefined, |s| prop(s, "parts"));
        run.set("parts", parts.or(Js::array(Vec::new())));
        run.set("subAgent", Js::object(Obj::of([("agent", prop(event, "agentType")), ("name", prop(event, "runId"))])));
        return Ok(Some(Js::object(run)));
    }
    let Some(seeded) = seeded else { return Ok(None) };
    if kind == "chunk" {
        return apply_chunk_event(seeded, event, now).map(Some);
    }
    let mut run = Obj::copy_of(&seeded);
    match kind.as_str() {
        "finished" => {
            run.set("status", Js::str("completed"));
            run.set("summary", prop(event, "summary"));
            run.set("error", Js::Undefined);
        }
        "error" => {
            run.set("status", Js::str("error"));
            run.set("error", prop(event, "error"));
        }
        "aborted" => {
            run.set("status", Js::str("aborted"));
            run.set("error", prop(event, "reason"));
        }
        "interrupted" => {
            run.set("status", Js::str("interrupted"));
            run.set("error", prop(event, "error"));
            run.set("reason", prop(event, "reason"));
            run.set("childStillRunning", prop(event, "childStillRunning"));
        }
        _ => return Ok(None),
    }
    Ok(Some(Js::object(run)))
}

/// The `chunk` case of `applyToRun`.
fn apply_chunk_event(seeded: Js, event: &Js, now: &mut dyn FnMut() -> f64) -> Result<Js, JsError> {
    // `seeded.parts.map((part) => ({ ...part }))`, outside the `try`.
    let mut parts = match prop(&seeded, "parts") {
        Js::Arr(parts) => Parts::copy_of(&parts),
        Js::Undefined | Js::Null => {
            return Err(JsError::type_error("Cannot read properties of undefined (reading 'map')"))
        }
        _ => return Err(JsError::type_error("seeded.parts.map is not a function")),
    };
    // try { parsed = JSON.parse(event.body); applyChunkToParts(parts, parsed); } catch { return seeded; }
    let parsed = match json_parse(&to_js_string(&prop(event, "body")).to_units()) {
        Ok(parsed) => parsed,
        Err(_) => return Ok(seeded),
    };
    if apply_chunk_to_parts(&mut parts, &parsed).is_err() {
        return Ok(seeded);
    }
    let parts = Js::array(parts.0.into_iter().map(Js::Obj).collect());
    let mut run = Obj::copy_of(&seeded);
    run.set("parts", parts);
    if let Some(progress) = read_progress_chunk(&parsed, now) {
        run.set("progress", Js::object(progress));
        return Ok(Js::object(run));
    }
    let Some(milestone) = read_milestone_chunk(&parsed, now) else { return Ok(Js::object(run)) };
    let name = milestone.get("name");
    let at = milestone.get("at");
    let existing = prop(&seeded, "milestones");
    let merged = merge_milestone(&existing, milestone)?;
    let is_new = merged.is_some();
    let milestones = merged.unwrap_or(existing);
    let progress = prop(&seeded, "progress");
    let not_older = progress.is_undefined() || to_number(&at) >= to_number(&prop(&progress, "at"));
    if is_new && not_older {
        let data = prop(&parsed, "data").or(Js::empty_object());
        let mut snapshot = Obj::default();
        if let fraction @ Js::Num(_) = prop(&data, "fraction") {
            snapshot.set("fraction", fraction);
        }
        if let message @ Js::Str(_) = prop(&data, "message") {
            snapshot.set("message", message);
        }
        if let phase @ Js::Str(_) = prop(&data, "phase") {
            snapshot.set("phase", phase);
        }
        snapshot.set("milestone", name);
        snapshot.set("at", at);
        run.set("progress", Js::object(snapshot));
    }
    run.set("milestones", milestones);
    Ok(Js::object(run))
}

/// `readAgentToolProgressChunk(chunk)`: the latest-wins snapshot a `data-agent-progress`
/// chunk carries, stamped `at: Date.now()`.
fn read_progress_chunk(chunk: &Js, now: &mut dyn FnMut() -> f64) -> Option<Obj> {
    let Js::Obj(c) = chunk else { return None };
    if !c.get("type").is_str(PROGRESS_PART) {
        return None;
    }
    let data = c.get("data").or(Js::empty_object());
    let mut progress = Obj::default();
    if let fraction @ Js::Num(_) = prop(&data, "fraction") {
        progress.set("fraction", fraction);
    }
    if let message @ Js::Str(_) = prop(&data, "message") {
        progress.set("message", message);
    }
    if let phase @ Js::Str(_) = prop(&data, "phase") {
        progress.set("phase", phase);
    }
    let inner = prop(&data, "data");
    if !inner.is_undefined() {
        progress.set("data", inner);
    }
    progress.set("at", Js::Num(now()));
    Some(progress)
}

/// `readAgentToolMilestoneChunk(chunk)`: the milestone a `data-agent-milestone` chunk with a
/// string `name` carries (`sequence` defaults to 0, `at` to `Date.now()`).
fn read_milestone_chunk(chunk: &Js, now: &mut dyn FnMut() -> f64) -> Option<Obj> {
    let Js::Obj(c) = chunk else { return None };
    if !c.get("type").is_str(MILESTONE_PART) {
        return None;
    }
    let data = c.get("data").or(Js::empty_object());
    let name @ Js::Str(_) = prop(&data, "name") else { return None };
    let sequence = match prop(&data, "sequence") {
        sequence @ Js::Num(_) => sequence,
        _ => Js::Num(0.0),
    };
    let at = match prop(&data, "at") {
        at @ Js::Num(_) => at,
        _ => Js::Num(now()),
    };
    let mut milestone = Obj::of([("name", name), ("sequence", sequence), ("at", at)]);
    let inner = prop(&data, "data");
    if !inner.is_undefined() {
        milestone.set("data", inner);
    }
    Some(milestone)
}

/// `mergeMilestone(existing, milestone)`: the list with the milestone added and sorted by
/// `sequence`, or `None` when a milestone of that sequence is there already (JavaScript then
/// returns `existing` itself, which the caller tells apart by identity).
fn merge_milestone(existing: &Js, milestone: Obj) -> Result<Option<Js>, JsError> {
    let sequence = milestone.get("sequence");
    let mut list = match existing {
        Js::Arr(list) => {
            if list.iter().any(|m| strict_eq(&prop(m, "sequence"), &sequence)) {
                return Ok(None);
            }
            list.to_vec()
        }
        _ => Vec::new(),
    };
    list.push(Js::object(milestone));
    v8_sort(&mut list, &mut |a, b| Ok(to_number(&prop(a, "sequence")) - to_number(&prop(b, "sequence"))))?;
    Ok(Some(Js::array(list)))
}

/// `agentToolEventDedupeKey(message)`.
fn dedupe_key(message: &Js, now: &mut dyn FnMut() -> f64) -> Result<JsStr, JsError> {
    let event = get(message, "event")?;
    let kind = get(&event, "kind")?;
    let identity = if !kind.is_str("chunk") {
        let json = json_stringify(&event).unwrap_or_else(|| "undefined".into());
        JsStr::from(format!("event:{json}"))
    } else {
        chunk_identity(message, &event, now)?
    };
    // [message.parentToolCallId ?? "", event.runId, identity].join("\0")
    let parts = [prop(message, "parentToolCallId").or(Js::str("")), prop(&event, "runId"), Js::Str(identity)];
    Ok(join(&parts, "\0"))
}

/// The identity part of a `chunk` event's dedupe key: its `unstoredId`, its milestone's
/// sequence, its progress id, or its `sequence`.
fn chunk_identity(message: &Js, event: &Js, now: &mut dyn FnMut() -> f64) -> Result<JsStr, JsError> {
    let unstored = prop(event, "unstoredId");
    if !unstored.is_undefined() {
        return Ok(JsStr::concat(&["unstored:".into(), to_js_string(&unstored)]));
    }
    let body = prop(event, "body");
    let mut milestone = None;
    let mut progress = false;
    let mut progress_id = None;
    if includes(&body, MILESTONE_PART)? || includes(&body, PROGRESS_PART)? {
        // try { ... } catch { milestone = undefined; }
        if let Ok(parsed) = json_parse(&to_js_string(&body).to_units()) {
            milestone = read_milestone_chunk(&parsed, now);
            progress = read_progress_chunk(&parsed, now).is_some();
            match get(&parsed, "id") {
                Ok(Js::Str(id)) => progress_id = Some(id),
                Ok(_) => {}
                Err(_) => milestone = None,
            }
        }
    }
    let sequence = to_js_string(&prop(message, "sequence"));
    Ok(match (milestone, progress, progress_id) {
        (Some(m), _, _) => JsStr::concat(&["milestone:".into(), to_js_string(&m.get("sequence"))]),
        (None, true, Some(id)) => JsStr::concat(&["progress:".into(), id]),
        (None, true, None) => JsStr::concat(&["progress:".into(), sequence, ":".into(), to_js_string(&body)]),
        (None, false, _) => JsStr::concat(&["seq:".into(), sequence]),
    })
}

// ---------------------------------------------------------------------------------------------
// applyChunkToParts (message-builder-DAl9AhHH.js)
// ---------------------------------------------------------------------------------------------

/// The parts array `applyChunkToParts` works on: shallow copies of a run's parts
/// (`parts.map((part) => ({ ...part }))`), each copied when first written.
struct Parts(Vec<Arc<Obj>>);

impl Parts {
    fn copy_of(parts: &[Js]) -> Self {
        Self(
            parts
                .iter()
                .map(|part| match part {
                    Js::Obj(obj) => obj.clone(),
                    other => Arc::new(Obj::copy_of(other)),
                })
                .collect(),
        )
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &Obj> + ExactSizeIterator {
        self.0.iter().map(|part| &**part)
    }

    /// The part at `i`, to write to.
    fn at(&mut self, i: usize) -> &mut Obj {
        Arc::make_mut(&mut self.0[i])
    }

    fn push(&mut self, part: Obj) {
        self.0.push(Arc::new(part));
    }
}

impl std::ops::Index<usize> for Parts {
    type Output = Obj;

    fn index(&self, i: usize) -> &Obj {
        &self.0[i]
    }
}

/// `rawToolInputText` (a `WeakMap`) and `provisionalInput` (a `WeakSet`), keyed by part: here
/// by the part's index, for the one `applyChunkToParts` call the JavaScript code can see them
/// in (see the module docs).
#[derive(Default)]
struct SideState {
    raw_tool_input_text: HashMap<usize, JsStr>,
    provisional_input: HashSet<usize>,
}

/// The tool part states that are approval states (`APPROVAL_STATES`).
const APPROVAL_STATES: [&str; 2] = ["approval-requested", "approval-responded"];

/// Whether `value` is one of `states`.
fn is_one_of(value: &Js, states: &[&str]) -> bool {
    states.iter().any(|s| value.is_str(s))
}

/// `applyChunkToParts(parts, chunk)`: `Ok(true)` when the chunk type is handled, `Ok(false)`
/// when it is not (parts untouched), `Err` when the JavaScript code throws (then the caller
/// drops `parts`, possibly half-updated, as the reducer does).
fn apply_chunk_to_parts(parts: &mut Parts, chunk: &Js) -> Result<bool, JsError> {
    let mut side = SideState::default();
    let chunk_type = get(chunk, "type")?;
    let c = |key: &str| prop(chunk, key);
    let name = match &chunk_type {
        Js::Str(s) => s.lossy(),
        _ => String::new(),
    };
    match name.as_str() {
        "text-start" => parts.push(text_part("text", Js::str(""))),
        "text-delta" => {
            let delta = c("delta").or(Js::str(""));
            match find_last_part_by_type(parts, "text") {
                Some(i) => {
                    let text = js_add(&parts[i].get("text"), &delta);
                    parts.at(i).set("text", text);
                }
                None => parts.push(text_part("text", delta)),
            }
        }
        "text-end" => {
            if let Some(i) = find_last_part_by_type(parts, "text").filter(|i| parts[*i].has("state")) {
                parts.at(i).set("state", Js::str("done"));
            }
        }
        "reasoning-start" => parts.push(text_part("reasoning", Js::str(""))),
        "reasoning-delta" => {
            let delta = c("delta").or(Js::str(""));
            match find_last_part_by_type(parts, "reasoning") {
                Some(i) => {
                    let text = js_add(&parts[i].get("text"), &delta);
                    parts.at(i).set("text", text);
                    merge_provider_metadata(parts.at(i), &c("providerMetadata"));
                }
                None => {
                    let mut part = text_part("reasoning", delta);
                    part.set_unless_nullish("providerMetadata", c("providerMetadata"));
                    parts.push(part);
                }
            }
        }
        "reasoning-end" => {
            if let Some(i) = find_last_part_by_type(parts, "reasoning").filter(|i| parts[*i].has("state")) {
                parts.at(i).set("state", Js::str("done"));
                merge_provider_metadata(parts.at(i), &c("providerMetadata"));
            }
        }
        "file" => parts.push(Obj::of([("type", Js::str("file")), ("mediaType", c("mediaType")), ("url", c("url"))])),
        "source-url" => parts.push(Obj::of([
            ("type", Js::str("source-url")),
            ("sourceId", c("sourceId")),
            ("url", c("url")),
            ("title", c("title")),
            ("providerMetadata", c("providerMetadata")),
        ])),
        "source-document" => parts.push(Obj::of([
            ("type", Js::str("source-document")),
            ("sourceId", c("sourceId")),
            ("mediaType", c("mediaType")),
            ("title", c("title")),
            ("filename", c("filename")),
            ("providerMetadata", c("providerMetadata")),
        ])),
        "tool-input-start" => {
            if find_tool_part_by_call_id(parts, &c("toolCallId")).is_none() {
                let mut part = tool_part(chunk, "input-streaming");
                part.set("input", Js::Undefined);
                part.set_unless_nullish("providerExecuted", c("providerExecuted"));
                part.set_unless_nullish("callProviderMetadata", c("providerMetadata"));
                part.set_unless_nullish("title", c("title"));
                parts.push(part);
            }
        }
        "tool-input-delta" => {
            if let Some(i) = find_tool_part_by_call_id(parts, &c("toolCallId")) {
                if parts[i].get("state").is_str("input-streaming") {
                    if let Js::Str(delta) = c("inputTextDelta") {
                        let text = side.raw_tool_input_text.remove(&i).unwrap_or_else(|| "".into());
                        side.raw_tool_input_text.insert(i, JsStr::concat(&[text, delta]));
                    }
                    let input = c("input");
                    if !input.is_undefined() {
                        parts.at(i).set("input", input);
                        side.provisional_input.insert(i);
                    }
                }
            }
        }
        "tool-input-available" => match find_tool_part_by_call_id(parts, &c("toolCallId")) {
            Some(i) if parts[i].get("state").is_str("input-streaming") => {
                let p = parts.at(i);
                p.set("state", Js::str("input-available"));
                p.set("input", normalize_tool_input(&c("input")));
                p.set_unless_nullish("providerExecuted", c("providerExecuted"));
                p.set_unless_nullish("callProviderMetadata", c("providerMetadata"));
                p.set_unless_nullish("title", c("title"));
                side.raw_tool_input_text.remove(&i);
                side.provisional_input.remove(&i);
            }
            Some(_) => {
                apply_late_tool_input(parts, chunk, &mut side);
            }
            None => {
                let mut part = tool_part(chunk, "input-available");
                part.set("input", normalize_tool_input(&c("input")));
                part.set_unless_nullish("providerExecuted", c("providerExecuted"));
                part.set_unless_nullish("callProviderMetadata", c("providerMetadata"));
                part.set_unless_nullish("title", c("title"));
                parts.push(part);
            }
        },
        "tool-input-error" => match find_tool_part_by_call_id(parts, &c("toolCallId")) {
            Some(i) => {
                let p = parts.at(i);
                if !is_one_of(&p.get("state"), &["output-available", "output-error", "output-denied"]) {
                    p.set("state", Js::str("output-error"));
                    p.set("errorText", c("errorText"));
                    p.set("input", normalize_tool_input(&c("input")));
                    p.set_unless_nullish("providerExecuted", c("providerExecuted"));
                    p.set_unless_nullish("callProviderMetadata", c("providerMetadata"));
                }
            }
            None => {
                let mut part = tool_part(chunk, "output-error");
                part.set("input", normalize_tool_input(&c("input")));
                part.set("errorText", c("errorText"));
                part.set_unless_nullish("providerExecuted", c("providerExecuted"));
                part.set_unless_nullish("callProviderMetadata", c("providerMetadata"));
                parts.push(part);
            }
        },
        "tool-approval-request" => {
            if let Some(i) = find_tool_part_by_call_id(parts, &c("toolCallId")) {
                let p = parts.at(i);
                let settled = ["approval-responded", "output-available", "output-error", "output-denied"];
                if !is_one_of(&p.get("state"), &settled) {
                    if let Some(raw) = side.raw_tool_input_text.get(&i) {
                        if p.get("input").is_undefined() {
                            p.set("input", normalize_tool_input(&Js::Str(raw.clone())));
                            side.provisional_input.insert(i);
                        }
                    }
                    side.raw_tool_input_text.remove(&i);
                    p.set("state", Js::str("approval-requested"));
                    let mut approval = Obj::of([("id", c("approvalId"))]);
                    let descriptor = c("approvalDescriptor");
                    if !descriptor.is_undefined() {
                        approval.set("descriptor", descriptor);
                    }
                    p.set("approval", Js::object(approval));
                }
            }
        }
        "tool-output-denied" => {
            if let Some(i) = find_tool_part_by_call_id(parts, &c("toolCallId")) {
                let p = parts.at(i);
                let settled = ["output-available", "output-error", "output-denied", "approval-responded"];
                if !is_one_of(&p.get("state"), &settled) {
                    p.set("state", Js::str("output-denied"));
                }
            }
        }
        "tool-output-available" => {
            if let Some(i) = find_tool_part_by_call_id(parts, &c("toolCallId")) {
                let p = parts.at(i);
                p.set("state", Js::str("output-available"));
                p.set("output", c("output"));
                let preliminary = c("preliminary");
                if !preliminary.is_undefined() {
                    p.set("preliminary", preliminary);
                }
            }
        }
        "tool-output-error" => {
            if let Some(i) = find_tool_part_by_call_id(parts, &c("toolCallId")) {
                parts.at(i).set("state", Js::str("output-error"));
                parts.at(i).set("errorText", c("errorText"));
            }
        }
        "step-start" | "start-step" => parts.push(Obj::of([("type", Js::str("step-start"))])),
        _ => {
            // `chunk.type.startsWith("data-")`
            let Js::Str(type_name) = &chunk_type else {
                return Err(JsError::type_error("chunk.type.startsWith is not a function"));
            };
            if !type_name.starts_with("data-") {
                return Ok(false);
            }
            if truthy(&c("transient")) {
                return Ok(true);
            }
            let id = c("id");
            if !id.is_nullish() {
                if let Some(i) = find_data_part_by_type_and_id(parts, &chunk_type, &id) {
                    parts.at(i).set("data", c("data"));
                    return Ok(true);
                }
            }
            let mut part = Obj::of([("type", chunk_type.clone())]);
            part.set_unless_nullish("id", id);
            part.set("data", c("data"));
            parts.push(part);
        }
    }
    Ok(true)
}

/// A new streaming text or reasoning part.
fn text_part(kind: &str, text: Js) -> Obj {
    Obj::of([("type", Js::str(kind)), ("text", text), ("state", Js::str("streaming"))])
}

/// The first fields of a new tool part: `type: \`tool-${chunk.toolName}\``, `toolCallId`,
/// `toolName`, `state`.
fn tool_part(chunk: &Js, state: &str) -> Obj {
    let tool_name = prop(chunk, "toolName");
    let type_name = JsStr::concat(&["tool-".into(), to_js_string(&tool_name)]);
    Obj::of([
        ("type", Js::Str(type_name)),
        ("toolCallId", prop(chunk, "toolCallId")),
        ("toolName", tool_name),
        ("state", Js::str(state)),
    ])
}

/// `applyLateToolInput(parts, chunk)`: fills an approval part's missing (or provisional)
/// input from a `tool-input-available` that came after the approval request.
fn apply_late_tool_input(parts: &mut Parts, chunk: &Js, side: &mut SideState) -> bool {
    // isLateToolInputChunk
    if !prop(chunk, "type").is_str("tool-input-available") {
        return false;
    }
    let Some(i) = find_tool_part_by_call_id(parts, &prop(chunk, "toolCallId")) else { return false };
    let p = parts.at(i);
    if !is_one_of(&p.get("state"), &APPROVAL_STATES) {
        return false;
    }
    if !p.get("input").is_undefined() && !side.provisional_input.contains(&i) {
        return false;
    }
    p.set("input", normalize_tool_input(&prop(chunk, "input")));
    side.provisional_input.remove(&i);
    p.set_unless_nullish("providerExecuted", prop(chunk, "providerExecuted"));
    p.set_unless_nullish("callProviderMetadata", prop(chunk, "providerMetadata"));
    p.set_unless_nullish("title", prop(chunk, "title"));
    true
}

/// `normalizeToolInput(raw).input`: a plain object as is, a string that parses to one parsed,
/// anything else `{}`.
fn normalize_tool_input(raw: &Js) -> Js {
    match raw {
        Js::Obj(_) => raw.clone(),
        // `raw.trim().startsWith("{")`, then `JSON.parse(raw)`.
        Js::Str(s) if s.chars().find(|c| !c.is_ok_and(is_js_space)) == Some(Ok('{')) => {
            match json_parse(&s.to_units()) {
                Ok(parsed @ Js::Obj(_)) => parsed,
                _ => Js::empty_object(),
            }
        }
        _ => Js::empty_object(),
    }
}

/// `mergeProviderMetadata(part, metadata)`: `{ ...part.providerMetadata, ...metadata }`.
fn merge_provider_metadata(part: &mut Obj, metadata: &Js) {
    if metadata.is_nullish() {
        return;
    }
    let mut merged = Obj::default();
    merged.spread(&part.get("providerMetadata"));
    merged.spread(metadata);
    part.set("providerMetadata", Js::object(merged));
}

/// `findLastPartByType(parts, type)`.
fn find_last_part_by_type(parts: &Parts, kind: &str) -> Option<usize> {
    parts.iter().rposition(|p| p.get("type").is_str(kind))
}

/// `findToolPartByCallId(parts, toolCallId)`: none for a falsy id.
fn find_tool_part_by_call_id(parts: &Parts, tool_call_id: &Js) -> Option<usize> {
    if !truthy(tool_call_id) {
        return None;
    }
    parts.iter().rposition(|p| p.has("toolCallId") && strict_eq(&p.get("toolCallId"), tool_call_id))
}

/// `findDataPartByTypeAndId(parts, type, id)`.
fn find_data_part_by_type_and_id(parts: &Parts, kind: &Js, id: &Js) -> Option<usize> {
    parts.iter().rposition(|p| strict_eq(&p.get("type"), kind) && p.has("id") && strict_eq(&p.get("id"), id))
}

// ---------------------------------------------------------------------------------------------
// The client (useAgentToolEvents)
// ---------------------------------------------------------------------------------------------

/// What [`Client::receive`] did with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not an `agent-tool-event` frame (or not an object): the hook ignores it.
    Ignored,
    /// Computing its dedupe key threw: the hook's listener throws before remembering the key,
    /// so the frame is dropped and a later copy gets the same treatment.
    KeyThrew(JsError),
    /// Its dedupe key was seen before: dropped.
    Duplicate,
    /// The reducer returned a new state.
    Applied,
    /// The reducer returned the same state (e.g. a chunk for a run that never started).
    Unchanged,
    /// The reducer threw: the state stays as it was, the key stays seen.
    Threw(JsError),
}

/// Where `Date.now()` comes from.
#[derive(Clone)]
enum Clock {
    /// A time the owner sets ([`Client::set_now`]).
    Fixed(f64),
    /// A function of the owner's (e.g. the system clock, or a simulated one).
    Source(Arc<dyn Fn() -> f64 + Send + Sync>),
}

impl Clock {
    fn now(&self) -> f64 {
        match self {
            Self::Fixed(ms) => *ms,
            Self::Source(now) => now(),
        }
    }
}

/// A stock client: `useAgentToolEvents`'s state and its `seen` set of dedupe keys. Frames go
/// through [`Client::receive`] as the hook's message listener handles them: frames that are
/// not `agent-tool-event`s are ignored, a frame whose dedupe key was seen is dropped, and any
/// other is applied with `applyAgentToolEvent`.
///
/// `Date.now()` reads the client's clock. [`Client::new`] starts it at 0 and leaves it there
/// until [`Client::set_now`] moves it, so that a simulation is deterministic; the JavaScript
/// hook reads the wall clock ([`Client::with_system_clock`]).
#[derive(Clone)]
pub struct Client {
    state: State,
    seen: HashSet<JsStr>,
    clock: Clock,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("state", &self.state).field("seen", &self.seen.len()).finish()
    }
}

impl Client {
    /// A client with no runs and nothing seen, whose clock reads 0 until [`Client::set_now`].
    pub fn new() -> Self {
        Self { state: State::new(), seen: HashSet::new(), clock: Clock::Fixed(0.0) }
    }

    /// A client whose `Date.now()` calls `now` (milliseconds since the epoch).
    pub fn with_clock(now: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        Self { clock: Clock::Source(Arc::new(now)), ..Self::new() }
    }

    /// A client whose `Date.now()` is the system clock, as in a browser.
    pub fn with_system_clock() -> Self {
        Self::with_clock(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_millis() as f64))
    }

    /// Sets what `Date.now()` returns from now on (a fixed clock).
    pub fn set_now(&mut self, ms: f64) {
        self.clock = Clock::Fixed(ms);
    }

    /// Handles one frame as `useAgentToolEvents` does: dedupe on
    /// `agentToolEventDedupeKey(frame)`, then `applyAgentToolEvent`.
    pub fn receive(&mut self, frame: &Value) -> Outcome {
        let message = Js::from_serde(frame);
        // `message.type !== "agent-tool-event"` (throws for `null`; the listener dies either way).
        if !get(&message, "type").is_ok_and(|t| t.is_str(FRAME_TYPE)) {
            return Outcome::Ignored;
        }
        let clock = &self.clock;
        let mut now = || clock.now();
        let key = match dedupe_key(&message, &mut now) {
            Ok(key) => key,
            Err(e) => return Outcome::KeyThrew(e),
        };
        if !self.seen.insert(key) {
            return Outcome::Duplicate;
        }
        match apply_message(&self.state, &message, &mut now) {
            Ok(Some(state)) => {
                self.state = state;
                Outcome::Applied
            }
            Ok(None) => Outcome::Unchanged,
            Err(e) => Outcome::Threw(e),
        }
    }

    /// `resetLocalState()`: forgets every run and every key seen (the clock stays).
    pub fn reset(&mut self) {
        self.seen.clear();
        self.state = State::new();
    }

    /// The reducer's state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The state as `JSON.parse(JSON.stringify(state))` (see [`State::to_json`]).
    pub fn state_json(&self) -> Value {
        self.state.to_json()
    }

    /// `JSON.stringify(state)`, byte for byte (see [`State::to_json_string`]).
    pub fn state_string(&self) -> String {
        self.state.to_json_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The clock the tests' clients read.
    const NOW: u32 = 5000;

    fn frame(parent: Option<&str>, sequence: u64, event: Value) -> Value {
        let mut frame = json!({"type": "agent-tool-event", "sequence": sequence, "event": event});
        if let Some(parent) = parent {
            frame["parentToolCallId"] = json!(parent);
        }
        frame
    }

    fn started(run: &str, order: i64) -> Value {
        json!({"kind": "started", "runId": run, "agentType": "Researcher", "inputPreview": "HTTP/3", "order": order})
    }

    fn chunk(run: &str, body: Value) -> Value {
        json!({"kind": "chunk", "runId": run, "body": body.to_string()})
    }

    fn client() -> Client {
        let mut client = Client::new();
        client.set_now(NOW.into());
        client
    }

    /// A client that received `frames`, each of which it applied.
    fn fed(frames: &[Value]) -> Client {
        let mut client = client();
        for frame in frames {
            assert_eq!(client.receive(frame), Outcome::Applied, "{frame}");
        }
        client
    }

    /// Run `run`'s state.
    fn run(client: &Client, run: &str) -> Value {
        client.state_json()["runsById"][run].clone()
    }

    /// Frames of one run with these chunk bodies (sequences 1, 2, ...).
    fn stream(run: &str, bodies: &[Value]) -> Vec<Value> {
        let mut frames = vec![frame(None, 0, started(run, 0))];
        frames.extend(bodies.iter().enumerate().map(|(i, b)| frame(None, i as u64 + 1, chunk(run, b.clone()))));
        frames
    }

    #[test]
    fn a_run_streams_text_and_finishes() {
        let mut frames = vec![frame(Some("call_1"), 0, started("r1", 0))];
        for (i, body) in [
            json!({"type": "start", "messageId": "m1"}),
            json!({"type": "start-step"}),
            json!({"type": "text-start", "id": "t1"}),
            json!({"type": "text-delta", "id": "t1", "delta": "Hello"}),
            json!({"type": "text-delta", "id": "t1", "delta": " world"}),
            json!({"type": "text-end", "id": "t1"}),
            json!({"type": "finish-step"}),
            json!({"type": "finish"}),
        ]
        .into_iter()
        .enumerate()
        {
            frames.push(frame(Some("call_1"), i as u64 + 1, chunk("r1", body)));
        }
        frames.push(frame(Some("call_1"), 9, json!({"kind": "finished", "runId": "r1", "summary": "Hello world"})));
        let client = fed(&frames);
        let run = json!({
            "runId": "r1",
            "agentType": "Researcher",
            "parentToolCallId": "call_1",
            "inputPreview": "HTTP/3",
            "order": 0,
            "status": "completed",
            "parts": [{"type": "step-start"}, {"type": "text", "text": "Hello world", "state": "done"}],
            "subAgent": {"agent": "Researcher", "name": "r1"},
            "summary": "Hello world",
        });
        assert_eq!(
            client.state_json(),
            json!({"runsById": {"r1": run}, "runsByToolCallId": {"call_1": [run]}, "unboundRuns": []})
        );
        // Key order and left-out `undefined`s (`display`, `error`) as JSON.stringify has them.
        let start = concat!(
            r#"{"runsById":{"r1":{"runId":"r1","agentType":"Researcher","parentToolCallId":"call_1","#,
            r#""inputPreview":"HTTP/3","order":0,"status":"completed","parts":[{"type":"step-start"},"#,
        );
        assert!(client.state_string().starts_with(start), "{}", client.state_string());
    }

    #[test]
    fn terminal_events_set_status_and_error() {
        // parity: 28, 120
        let client = fed(&[
            frame(None, 0, started("e", 0)),
            frame(None, 1, json!({"kind": "error", "runId": "e", "error": "boom"})),
            frame(None, 0, started("a", 1)),
            frame(None, 1, json!({"kind": "aborted", "runId": "a", "reason": "user"})),
            frame(None, 0, started("i", 2)),
            frame(
                None,
                1,
                json!({
                    "kind": "interrupted",
                    "runId": "i",
                    "error": "silent",
                    "reason": "no-progress",
                    "childStillRunning": true,
                }),
            ),
            // Re-attached and completed later: the error goes, the reason stays.
            frame(None, 2, json!({"kind": "finished", "runId": "i", "summary": "done"})),
        ]);
        assert_eq!(run(&client, "e")["status"], "error");
        assert_eq!(run(&client, "e")["error"], "boom");
        assert_eq!(run(&client, "a")["status"], "aborted");
        assert_eq!(run(&client, "a")["error"], "user");
        let i = run(&client, "i");
        assert_eq!(
            (&i["status"], &i["summary"], &i["reason"], &i["childStillRunning"]),
            (&json!("completed"), &json!("done"), &json!("no-progress"), &json!(true))
        );
        assert!(i.get("error").is_none(), "error: undefined is left out");
        let order: Vec<Value> =
            client.state_json()["unboundRuns"].as_array().unwrap().iter().map(|r| r["runId"].clone()).collect();
        assert_eq!(order, [json!("e"), json!("a"), json!("i")]);

        // A `started` after a terminal event changes nothing (but is a new state).
        let mut client = client;
        let before = client.state_string();
        assert_eq!(client.receive(&frame(None, 0, started("e", 5))), Outcome::Applied);
        assert_eq!(client.state_string(), before);
    }

    #[test]
    fn replayed_frames_are_deduplicated() {
        let frames =
            stream("r", &[json!({"type": "text-delta", "delta": "a"}), json!({"type": "text-delta", "delta": "b"})]);
        let mut client = fed(&frames);
        for frame in &frames {
            let mut replayed = frame.clone();
            replayed["replay"] = json!(true);
            assert_eq!(client.receive(&replayed), Outcome::Duplicate);
        }
        // Chunks dedupe on their sequence alone, whatever the body.
        assert_eq!(
            client.receive(&frame(None, 2, chunk("r", json!({"type": "text-delta", "delta": "X"})))),
            Outcome::Duplicate
        );
        assert_eq!(run(&client, "r")["parts"], json!([{"type": "text", "text": "ab", "state": "streaming"}]));
        // Lifecycle events dedupe on their content: a new reason is a new event.
        let interrupted =
            |reason: &str| frame(None, 3, json!({"kind": "interrupted", "runId": "r", "error": "x", "reason": reason}));
        assert_eq!(client.receive(&interrupted("no-progress")), Outcome::Applied);
        assert_eq!(client.receive(&interrupted("no-progress")), Outcome::Duplicate);
        assert_eq!(client.receive(&interrupted("window-exceeded")), Outcome::Applied);
        assert_eq!(run(&client, "r")["reason"], "window-exceeded");
        // The same frames under another parent tool call are other frames.
        assert_eq!(
            agent_tool_event_dedupe_key(&frame(Some("c"), 1, chunk("r", json!({}))), &mut || NOW.into()),
            Ok("c\0r\0seq:1".to_owned())
        );
    }

    #[test]
    fn tool_parts_follow_their_call() {
        let client = fed(&stream(
            "r",
            &[
                json!({"type": "tool-input-start", "toolCallId": "c1", "toolName": "search", "title": "Searching"}),
                json!({"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "{\"q\":"}),
                json!({"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "1}", "input": {"q": 1}}),
                json!({
                    "type": "tool-input-available",
                    "toolCallId": "c1",
                    "toolName": "search",
                    "input": "{\"q\":\"http\"}",
                }),
                json!({"type": "tool-output-available", "toolCallId": "c1", "output": {"hits": 3}}),
                json!({"type": "tool-input-available", "toolCallId": "c2", "toolName": "calc", "input": [1]}),
                json!({"type": "tool-approval-request", "toolCallId": "c2", "approvalId": "ap1"}),
                json!({"type": "tool-output-denied", "toolCallId": "c2"}),
                json!({"type": "tool-output-error", "toolCallId": "missing", "errorText": "nothing to update"}),
            ],
        ));
        assert_eq!(
            run(&client, "r")["parts"],
            json!([
                {
                    "type": "tool-search",
                    "toolCallId": "c1",
                    "toolName": "search",
                    "state": "output-available",
                    "input": {"q": "http"},
                    "title": "Searching",
                    "output": {"hits": 3},
                },
                {
                    "type": "tool-calc",
                    "toolCallId": "c2",
                    "toolName": "calc",
                    "state": "output-denied",
                    "input": {},
                    "approval": {"id": "ap1"},
                },
            ])
        );
    }

    #[test]
    fn data_parts_update_by_id_and_transient_ones_are_skipped() {
        let client = fed(&stream(
            "r",
            &[
                json!({"type": "data-weather", "id": "w", "data": {"temp": 1}}),
                json!({"type": "data-weather", "data": "no id"}),
                json!({"type": "data-weather", "id": "w", "data": {"temp": 2}}),
                json!({"type": "data-weather", "id": "x", "data": 3, "transient": true}),
            ],
        ));
        assert_eq!(
            run(&client, "r")["parts"],
            json!([{"type": "data-weather", "id": "w", "data": {"temp": 2}}, {"type": "data-weather", "data": "no id"}])
        );
    }

    #[test]
    fn progress_and_milestones() {
        // parity: 91
        let progress = |id: &str, fraction: f64| {
            let data = json!({"fraction": fraction, "message": "reading"});
            json!({"type": "data-agent-progress", "id": id, "transient": true, "data": data})
        };
        let milestone = |name: &str, sequence: u64, at: u32| {
            let data = json!({"name": name, "sequence": sequence, "at": at, "phase": "p"});
            json!({"type": "data-agent-milestone", "data": data})
        };
        let mut client = client();
        let frames = stream("r", &[progress("p1", 0.25), milestone("second", 2, NOW + 1)]);
        for frame in &frames {
            assert_eq!(client.receive(frame), Outcome::Applied);
        }
        // The newer milestone replaced the progress snapshot.
        assert_eq!(run(&client, "r")["progress"], json!({"phase": "p", "milestone": "second", "at": NOW + 1}));
        // A progress frame: latest wins, stamped with the client's clock.
        client.set_now((NOW + 10).into());
        assert_eq!(client.receive(&frame(None, 2, chunk("r", progress("p2", 0.5)))), Outcome::Applied);
        assert_eq!(run(&client, "r")["progress"], json!({"fraction": 0.5, "message": "reading", "at": NOW + 10}));
        // An older milestone joins the list, in sequence order, but leaves the snapshot.
        assert_eq!(client.receive(&frame(None, 2, chunk("r", milestone("first", 1, NOW)))), Outcome::Applied);
        assert_eq!(run(&client, "r")["progress"]["fraction"], 0.5);
        let names: Vec<Value> =
            run(&client, "r")["milestones"].as_array().unwrap().iter().map(|m| m["name"].clone()).collect();
        assert_eq!(names, [json!("first"), json!("second")]);
        // Milestones dedupe on their own sequence, progress frames on their id.
        assert_eq!(client.receive(&frame(None, 7, chunk("r", milestone("again", 2, NOW)))), Outcome::Duplicate);
        assert_eq!(client.receive(&frame(None, 7, chunk("r", progress("p2", 0.9)))), Outcome::Duplicate);
        // Milestones are persisted data parts too; progress frames are transient.
        assert_eq!(run(&client, "r")["parts"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn bodies_that_do_not_parse_or_apply_leave_the_run() {
        let mut client = fed(&stream("r", &[json!({"type": "text-delta", "delta": "a"})]));
        let before = client.state_string();
        for (sequence, body) in ["{not json", "null", "5", "{\"type\":5}", "{}"].into_iter().enumerate() {
            let event = json!({"kind": "chunk", "runId": "r", "body": body});
            assert_eq!(client.receive(&frame(None, 10 + sequence as u64, event)), Outcome::Applied);
        }
        assert_eq!(client.state_string(), before);
        // A chunk for a run that never started: the reducer returns the same state.
        assert_eq!(client.receive(&frame(None, 1, chunk("ghost", json!({"type": "text-start"})))), Outcome::Unchanged);
    }

    #[test]
    fn what_the_hook_ignores_and_where_javascript_throws() {
        let mut client = client();
        assert_eq!(client.receive(&json!({"type": "cf_agent_state"})), Outcome::Ignored);
        assert_eq!(client.receive(&Value::Null), Outcome::Ignored);
        assert!(matches!(client.receive(&json!({"type": "agent-tool-event", "event": null})), Outcome::KeyThrew(_)));
        let numeric_body = json!({"kind": "chunk", "runId": "r", "body": 5});
        assert!(matches!(client.receive(&frame(None, 1, numeric_body)), Outcome::KeyThrew(_)));
        // `runsById["toString"]` is Object.prototype.toString, which has no `parts`.
        assert!(matches!(client.receive(&frame(None, 1, chunk("toString", json!({})))), Outcome::Threw(_)));
        // `grouped["__proto__"]` is Object.prototype, which has no `push`.
        assert!(matches!(client.receive(&frame(Some("__proto__"), 0, started("r", 0))), Outcome::Threw(_)));
        assert_eq!(client.state().run_count(), 0);
        // A run may be called "__proto__" all the same.
        assert_eq!(client.receive(&frame(None, 0, started("__proto__", 0))), Outcome::Applied);
        assert_eq!(run(&client, "__proto__")["status"], "running");
    }

    #[test]
    fn reset_forgets_runs_and_seen_frames() {
        let frames = stream("r", &[json!({"type": "text-delta", "delta": "a"})]);
        let mut client = fed(&frames);
        client.reset();
        assert_eq!(client.state_json(), json!({"runsById": {}, "runsByToolCallId": {}, "unboundRuns": []}));
        for frame in &frames {
            assert_eq!(client.receive(frame), Outcome::Applied);
        }
    }

    #[test]
    fn strings_are_utf16() {
        let raw =
            |sequence: u64, body: &str| frame(None, sequence, json!({"kind": "chunk", "runId": "r", "body": body}));
        let client = fed(&[
            frame(None, 0, started("r", 0)),
            // Two halves of a surrogate pair, in two deltas, make one character.
            raw(1, r#"{"type":"text-delta","delta":"\ud83d"}"#),
            raw(2, r#"{"type":"text-delta","delta":"\ude00!"}"#),
            // A lone one stays, and JSON.stringify escapes it.
            raw(3, r#"{"type":"reasoning-delta","delta":"\ud800"}"#),
            // A string spread into an object: one property per code unit.
            raw(4, r#"{"type":"reasoning-end","providerMetadata":"😀"}"#),
        ]);
        assert_eq!(run(&client, "r")["parts"][0]["text"], "😀!");
        assert!(client.state_string().contains(
            r#"{"type":"reasoning","text":"\ud800","state":"done","providerMetadata":{"0":"\ud83d","1":"\ude00"}}"#
        ));
    }

    #[test]
    fn json_as_javascript_writes_it() {
        let parse = |text: &str| json_parse(&text.encode_utf16().collect::<Vec<_>>());
        let roundtrip = |text: &str| parse(text).ok().and_then(|v| json_stringify(&v));
        // Index keys first, in numeric order; duplicates keep their first place, last value.
        assert_eq!(
            roundtrip(r#"{"b":1,"10":2,"a":3,"2":4,"b":5,"01":6}"#).unwrap(),
            r#"{"2":4,"10":2,"b":5,"a":3,"01":6}"#
        );
        assert_eq!(
            roundtrip(r#"[1.0,-0,1e21,1e-7,0.000001,123e-20,1e400,5e-324,0.1]"#).unwrap(),
            "[1,0,1e+21,1e-7,0.000001,1.23e-18,null,5e-324,0.1]"
        );
        assert_eq!(roundtrip(r#""\u0001\b\u2028\ud800 \/""#).unwrap(), "\"\\u0001\\b\u{2028}\\ud800 /\"");
        for bad in
            ["", " ", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "+1", "\"\t\"", "\u{feff}1", "nul", "[1] 2", "'a'"]
        {
            assert!(parse(bad).is_err(), "{bad:?} is not JSON");
        }
        assert!(parse(&"[".repeat(MAX_DEPTH + 1)).is_err());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(roundtrip(&deep).as_deref(), Some(deep.as_str()));
    }

    #[test]
    fn numbers_as_javascript_reads_and_writes_them() {
        for (x, text) in [
            (0.0, "0"),
            (-0.0, "0"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (123456.789, "123456.789"),
            (1e-6, "0.000001"),
            (1.5e-7, "1.5e-7"),
            (-2.5e300, "-2.5e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(number_to_string(x), text);
        }
        for (text, x) in [
            ("", 0.0),
            (" 12 ", 12.0),
            ("0x1F", 31.0),
            ("0b101", 5.0),
            ("0o17", 15.0),
            ("-Infinity", f64::NEG_INFINITY),
            (".5", 0.5),
            ("5.", 5.0),
            ("\u{a0}1e3\n", 1000.0),
        ] {
            assert_eq!(string_to_number(&text.into()), x, "{text:?}");
        }
        for text in ["1_0", "-0x1", "infinity", "1e", "0x", "abc", "1 2"] {
            assert!(string_to_number(&text.into()).is_nan(), "{text:?}");
        }
        assert_eq!(string_to_number(&"0x20000000000001".into()), 9007199254740992.0, "ties to even");
        assert_eq!(string_to_number(&"0x20000000000003".into()), 9007199254740996.0, "ties to even");
        assert_eq!(string_to_number(&"00012".into()), 12.0);
        assert!(string_to_number(&"\u{180e}5".into()).is_nan(), "U+180E is not a space");
        assert!(string_to_number(&"1e+".into()).is_nan());
        assert_eq!(to_number(&Js::array(vec![Js::str(" 7 ")])), 7.0);
    }

    #[test]
    fn runs_sort_by_order_then_as_icu_collates_their_ids() {
        // parity: 118
        let mut client = client();
        for id in ["b", "A", "a-b", "a", "B", "ab", "a b", "aB", "run-10", "run-9", "x\u{1}"] {
            assert_eq!(client.receive(&frame(Some("c"), 0, started(id, 0))), Outcome::Applied);
        }
        assert_eq!(client.receive(&frame(Some("c"), 0, started("first", -1))), Outcome::Applied);
        let ids: Vec<Value> = client.state_json()["runsByToolCallId"]["c"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].clone())
            .collect();
        // As `[...].sort((a, b) => a.localeCompare(b))` has them in Node 20.
        let expected = ["first", "a", "A", "a b", "a-b", "ab", "aB", "b", "B", "run-10", "run-9", "x\u{1}"];
        assert_eq!(ids, expected.map(|id| json!(id)));
    }

    #[test]
    fn no_body_makes_it_panic() {
        let mut client = fed(&stream("r", &[]));
        let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
        let bodies = [
            deep.as_str(),
            "\"\\ud800\"",
            "[\"data-agent-progress\"]",
            "{\"type\":\"data-\"}",
            "{\"type\":[\"text-start\"]}",
        ];
        for (i, body) in bodies.into_iter().enumerate() {
            let frame = frame(None, i as u64 + 1, json!({"kind": "chunk", "runId": "r", "body": body}));
            assert_eq!(client.receive(&frame), Outcome::Applied);
        }
        assert_eq!(run(&client, "r")["parts"], json!([{"type": "data-"}]));
    }
}
