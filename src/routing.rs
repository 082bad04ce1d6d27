//! Request paths, as the stock clients build them.
//!
//! `/agents/<agent-kebab>/<name>[/sub/<child-kebab>/<child-name>][/<rest>]`. Class names become
//! kebab-case exactly as the TypeScript SDK's `camelCaseToKebabCase` does, so `useAgent({agent:
//! "Assistant"})` and `sub: [{agent: "Researcher", name}]` reach the right place unchanged.

/// `Assistant` → `assistant`, `ResearchAgent` → `research-agent`, `MCPAgent` → `m-c-p-agent`,
/// `CHAT_AGENT` → `chat-agent` (the TypeScript SDK's rule, including its quirks).
///
/// Class names are ASCII ([`crate::durable_object!`] refuses any other at compile time), and on
/// ASCII the SDK's `toUpperCase`/`toLowerCase` are ASCII's case rules; using those keeps
/// Unicode's case tables (≈ 28 KB of data) out of the Worker.
pub fn kebab_case(name: &str) -> String {
    let has_lower = name.bytes().any(|b| b.is_ascii_lowercase());
    let has_upper = name.bytes().any(|b| b.is_ascii_uppercase());
    if has_upper && !has_lower {
        return name.to_ascii_lowercase().replace('_', "-");
    }
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    let out = out.strip_prefix('-').unwrap_or(&out).replace('_', "-");
    match out.strip_suffix('-') {
        Some(trimmed) => trimmed.to_owned(),
        None => out,
    }
}

/// A parsed `/agents/...` path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPath {
    /// The agent class in kebab-case.
    pub agent: String,
    /// The instance name, as sent (the SDK does not encode the root name).
    pub name: String,
    /// A drill-in to a child, if the path has one.
    pub sub: Option<SubPath>,
    /// What follows, with a leading `/` (or empty).
    pub rest: String,
}

/// The `/sub/<child-kebab>/<child-name>` part of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubPath {
    /// The child class in kebab-case.
    pub agent: String,
    /// The child's name (the run id), percent-decoded.
    pub name: String,
}

/// Parses `/agents/<agent>/<name>[/sub/<child>/<child-name>][/rest]`; `None` for any other path.
pub fn parse_agent_path(path: &str) -> Option<AgentPath> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let [prefix, agent, name, rest @ ..] = parts.as_slice() else { return None };
    if *prefix != "agents" {
        return None;
    }
    let (sub, rest) = match rest {
        ["sub", child, child_name, tail @ ..] => {
            (Some(SubPath { agent: (*child).to_owned(), name: percent_decode(child_name)? }), tail)
        }
        tail => (None, tail),
    };
    let rest = if rest.is_empty() { String::new() } else { format!("/{}", rest.join("/")) };
    Some(AgentPath { agent: (*agent).to_owned(), name: (*name).to_owned(), sub, rest })
}

/// Decodes `%XX` escapes; `None` for a malformed escape or invalid UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Encodes a path segment the way `encodeURIComponent` does.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kebab_case_matches_the_sdk() {
        for (from, to) in [
            ("Assistant", "assistant"),
            ("ResearchAgent", "research-agent"),
            ("MyAgent", "my-agent"),
            ("MCPAgent", "m-c-p-agent"),
            ("AIChatAgent", "a-i-chat-agent"),
            ("CHAT_AGENT", "chat-agent"),
            ("my_agent", "my-agent"),
            ("Agent2Go", "agent2-go"),
            ("chat", "chat"),
            ("Foo__", "foo-"),
        ] {
            assert_eq!(kebab_case(from), to, "{from}");
        }
    }

    #[test]
    fn parses_agent_and_drill_in_paths() {
        assert_eq!(
            parse_agent_path("/agents/assistant/alice"),
            Some(AgentPath { agent: "assistant".into(), name: "alice".into(), sub: None, rest: String::new() })
        );
        assert_eq!(parse_agent_path("/agents/assistant/alice/get-messages").unwrap().rest, "/get-messages");
        let drill =
            parse_agent_path("/agents/assistant/alice/sub/researcher/agent-tool%3Acall_1/get-messages").unwrap();
        assert_eq!(drill.sub, Some(SubPath { agent: "researcher".into(), name: "agent-tool:call_1".into() }));
        assert_eq!(drill.rest, "/get-messages");
        assert_eq!(parse_agent_path("/agents/assistant"), None);
        assert_eq!(parse_agent_path("/other/assistant/alice"), None);
        assert_eq!(parse_agent_path("/agents/a/b/sub/c/%ZZ"), None, "bad escapes are refused");
    }

    #[test]
    fn percent_round_trip() {
        let s = "agent-tool:call 1/é";
        assert_eq!(percent_decode(&percent_encode(s)).as_deref(), Some(s));
        assert_eq!(percent_encode("a b:c"), "a%20b%3Ac");
        for malformed in ["%+F", "%-1", "% f", "%4", "%"] {
            assert_eq!(percent_decode(malformed), None, "{malformed}");
        }
    }
}
