//! The compile-time check behind [`durable_object!`](crate::durable_object): does
//! `wrangler.toml` bind the class and give it SQLite storage? A `const fn`, so a mistake is a
//! build error naming the class and the missing line, not a failure on the first request.
//!
//! It reads the common shape of the file: top-level `[[durable_objects.bindings]]` tables with
//! `name` and `class_name`, and `[[migrations]]` tables with a `new_sqlite_classes` array (on one
//! line or several). Inline tables and `[env.*]` sections are not read; use
//! `durable_object!(…, unchecked)` with those.

/// What [`check_wrangler`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WranglerCheck {
    /// The class is bound under the binding and listed in `new_sqlite_classes`.
    Ok,
    /// No `[[durable_objects.bindings]]` has this `name` and `class_name`.
    NoBinding,
    /// The binding exists, but no `[[migrations]] new_sqlite_classes` lists the class.
    NotSqlite,
}

#[derive(Clone, Copy)]
enum Section {
    Other,
    Binding,
    Migration,
}

/// Checks that `toml` binds `class` as `binding` and lists it in `new_sqlite_classes`.
pub const fn check_wrangler(toml: &str, class: &str, binding: &str) -> WranglerCheck {
    let text = toml.as_bytes();
    let (class, binding) = (class.as_bytes(), binding.as_bytes());
    let mut section = Section::Other;
    let (mut has_name, mut has_class) = (false, false);
    let (mut bound, mut sqlite) = (false, false);
    let mut in_sqlite_array = false;
    let mut pos = 0;
    loop {
        let at_end = pos >= text.len();
        let line = if at_end { &[] as &[u8] } else { strip_comment(trim(line_at(text, pos))) };
        let header = line.len() >= 2 && line[0] == b'[' && !in_sqlite_array;
        if at_end || header {
            if matches!(section, Section::Binding) && has_name && has_class {
                bound = true;
            }
            if at_end {
                break;
            }
            section = if eq(line, b"[[durable_objects.bindings]]") {
                Section::Binding
            } else if eq(line, b"[[migrations]]") {
                Section::Migration
            } else {
                Section::Other
            };
            has_name = false;
            has_class = false;
        } else if in_sqlite_array {
            if contains_string(line, class) {
                sqlite = true;
            }
            if contains_byte(line, b']') {
                in_sqlite_array = false;
            }
        } else if matches!(section, Section::Binding) {
            if let Some(value) = string_value(line, b"name") {
                has_name = eq(value, binding);
            }
            if let Some(value) = string_value(line, b"class_name") {
                has_class = eq(value, class);
            }
        } else if matches!(section, Section::Migration) {
            if let Some(rest) = key_rest(line, b"new_sqlite_classes") {
                if contains_string(rest, class) {
                    sqlite = true;
                }
                in_sqlite_array = !contains_byte(rest, b']');
            }
        }
        pos += line_at(text, pos).len() + 1;
    }
    if !bound {
        WranglerCheck::NoBinding
    } else if !sqlite {
        WranglerCheck::NotSqlite
    } else {
        WranglerCheck::Ok
    }
}

/// `s[from..to]`, in a `const fn`.
const fn slice(s: &[u8], from: usize, to: usize) -> &[u8] {
    let (_, rest) = s.split_at(from);
    rest.split_at(to - from).0
}

/// The line starting at `pos`, without its newline.
const fn line_at(text: &[u8], pos: usize) -> &[u8] {
    let mut end = pos;
    while end < text.len() && text[end] != b'\n' {
        end += 1;
    }
    slice(text, pos, end)
}

const fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t' || b == b'\r'
}

const fn trim(s: &[u8]) -> &[u8] {
    let (mut from, mut to) = (0, s.len());
    while from < to && is_space(s[from]) {
        from += 1;
    }
    while to > from && is_space(s[to - 1]) {
        to -= 1;
    }
    slice(s, from, to)
}

/// The line up to a `#` that is not inside a string.
const fn strip_comment(s: &[u8]) -> &[u8] {
    let mut i = 0;
    let mut quoted = false;
    while i < s.len() {
        if s[i] == b'"' {
            quoted = !quoted;
        } else if s[i] == b'#' && !quoted {
            return trim(slice(s, 0, i));
        }
        i += 1;
    }
    s
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn contains_byte(s: &[u8], b: u8) -> bool {
    let mut i = 0;
    while i < s.len() {
        if s[i] == b {
            return true;
        }
        i += 1;
    }
    false
}

/// What follows `key =` on a line, if the line sets `key`.
const fn key_rest<'a>(line: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    if line.len() <= key.len() || !eq(slice(line, 0, key.len()), key) {
        return None;
    }
    let rest = trim(slice(line, key.len(), line.len()));
    if rest.is_empty() || rest[0] != b'=' {
        return None;
    }
    Some(trim(slice(rest, 1, rest.len())))
}

/// The string a line sets `key` to (`key = "value"`).
const fn string_value<'a>(line: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let Some(rest) = key_rest(line, key) else { return None };
    if rest.len() < 2 || rest[0] != b'"' {
        return None;
    }
    let mut end = 1;
    while end < rest.len() && rest[end] != b'"' {
        end += 1;
    }
    if end >= rest.len() {
        return None;
    }
    Some(slice(rest, 1, end))
}

/// Whether `s` contains the string literal `"value"`.
const fn contains_string(s: &[u8], value: &[u8]) -> bool {
    let mut i = 0;
    while i + value.len() + 2 <= s.len() {
        if s[i] == b'"' && s[i + value.len() + 1] == b'"' && eq(slice(s, i + 1, i + 1 + value.len()), value) {
            return true;
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
name = "demo"   # the Worker
main = "build/index.js"

[[durable_objects.bindings]]
name = "Assistant"
class_name = "Assistant"

[[durable_objects.bindings]]
class_name="Researcher"   # order and spacing vary
name="RESEARCHER"

[[migrations]]
tag = "v1"
new_sqlite_classes = ["Assistant"]

[[migrations]]
tag = "v2"
new_sqlite_classes = [
  "Researcher", # a comment
]

[vars]
name = "Summarizer"
"#;

    #[test]
    fn finds_bindings_and_sqlite_classes() {
        assert_eq!(check_wrangler(TOML, "Assistant", "Assistant"), WranglerCheck::Ok);
        assert_eq!(check_wrangler(TOML, "Researcher", "RESEARCHER"), WranglerCheck::Ok);
        assert_eq!(check_wrangler(TOML, "Researcher", "Researcher"), WranglerCheck::NoBinding, "the binding's name");
        assert_eq!(
            check_wrangler(TOML, "Summarizer", "Summarizer"),
            WranglerCheck::NoBinding,
            "[vars] is not a binding"
        );
        let no_sqlite = TOML.replace("\"Assistant\"]", "]");
        assert_eq!(check_wrangler(&no_sqlite, "Assistant", "Assistant"), WranglerCheck::NotSqlite);
        assert_eq!(check_wrangler("", "A", "A"), WranglerCheck::NoBinding);
    }

    #[test]
    fn runs_at_compile_time() {
        const RESULT: WranglerCheck = check_wrangler(TOML, "Assistant", "Assistant");
        assert_eq!(RESULT, WranglerCheck::Ok);
    }

    #[test]
    fn the_repository_config_declares_the_demo() {
        let toml = include_str!("../wrangler.toml");
        for class in ["Assistant", "Researcher", "Summarizer"] {
            assert_eq!(check_wrangler(toml, class, class), WranglerCheck::Ok, "{class}");
        }
    }
}
