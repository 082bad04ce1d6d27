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

/// Where the Worker's entry sends a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteTarget {
    /// The agent class.
    pub(crate) class: &'static str,
    /// Its Durable Object binding.
    pub(crate) binding: &'static str,
    /// The instance name.
    pub(crate) name: String,
}

/// Where the Worker's entry sends a request: the agent class among `agents` (`(class,
/// binding)` pairs) its path names, and the instance name. A refusal is an HTTP status and its
/// message: 404 for another path or an agent the entry does not route, 400 for a name over 512
/// bytes. The name is the path segment as written (not percent-decoded), so it never has a
/// `/`: the objects of child runs, named `<Parent>/<name>/<run>` (see
/// [`crate::parent::engine::child_address`]), are out of its reach even when their class is
/// listed, and a client reaches them only through their parent's drill-in gate. The Worker's
/// entry and the test kit route with it.
pub(crate) fn route_target(path: &str, agents: &[(&'static str, &'static str)]) -> Result<RouteTarget, (u16, String)> {
    let Some(parsed) = parse_agent_path(path) else {
        return Err((404, format!("no route for {path}; agents live at /agents/<agent>/<name>")));
    };
    let Some(&(class, binding)) = agents.iter().find(|(class, _)| kebab_case(class) == parsed.agent) else {
        let known: Vec<String> = agents.iter().map(|(c, _)| kebab_case(c)).collect();
        return Err((404, format!("unknown agent {:?}; this Worker serves {known:?}", parsed.agent)));
    };
    if parsed.name.len() > 512 {
        return Err((400, "agent name is longer than 512 bytes".into()));
    }
    Ok(RouteTarget { class, binding, name: parsed.name })
}

/// An absolute request URL (`https://host:port/path?query#fragment`) split into its host, path
/// and query: what the crate's routes read, and what [`crate::Agent::authorize`] usually needs.
/// The runtime hands every request's URL over already parsed and serialized, so splitting it is
/// enough; `worker`'s `Request::url()` parses it again with the `url` crate, which was ≈ 24 KiB of
/// the demo's gzipped Worker.
///
/// ```
/// let url = agent_tools::RequestUrl::new("https://example.org/agents/assistant/alice?token=a+b".into());
/// assert_eq!((url.host(), url.path()), ("example.org", "/agents/assistant/alice"));
/// assert_eq!(url.query("token").as_deref(), Some("a b"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestUrl {
    url: String,
    /// Where the authority starts (after `scheme://`).
    authority_at: usize,
    /// Where the path starts (the end of the authority) and ends (at `?`, `#` or the end).
    path_at: usize,
    path_end: usize,
    /// Where the query (after its `?`) starts and ends.
    query: Option<(usize, usize)>,
}

impl RequestUrl {
    /// The URL of `request` (an absolute one, as the runtime gives every request).
    pub fn of<B>(request: &http::Request<B>) -> Self {
        Self::new(request.uri().to_string())
    }

    /// Splits `url`.
    pub fn new(url: String) -> Self {
        let authority_at = url.find("://").map_or(0, |i| i + 3);
        let end = url.find('#').unwrap_or(url.len());
        let path_at = url[authority_at..end].find(['/', '?']).map_or(end, |i| authority_at + i);
        let query = url[path_at..end].find('?').map(|i| (path_at + i + 1, end));
        let path_end = query.map_or(end, |(start, _)| start - 1);
        Self { url, authority_at, path_at, path_end, query }
    }

    /// The host, without user info or port (`url`'s `host_str`).
    pub fn host(&self) -> &str {
        let authority = &self.url[self.authority_at..self.path_at];
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        match host.rfind(':') {
            Some(colon) if !host[colon..].contains(']') => &host[..colon],
            _ => host,
        }
    }

    /// The path, `/` when the URL has none.
    pub fn path(&self) -> &str {
        match &self.url[self.path_at..self.path_end] {
            "" => "/",
            path => path,
        }
    }

    /// The URL with its path replaced by `path` (already encoded), query and fragment kept.
    pub fn with_path(&self, path: &str) -> String {
        format!("{}{}{}", &self.url[..self.path_at], path, &self.url[self.path_end..])
    }

    /// The query's `name=value` pairs, decoded as `application/x-www-form-urlencoded` is
    /// (`+` is a space; a malformed escape stays as written), as `url`'s `query_pairs` does.
    pub fn query_pairs(&self) -> impl Iterator<Item = (String, String)> + '_ {
        let query = self.query.map_or("", |(start, end)| &self.url[start..end]);
        query.split('&').filter(|pair| !pair.is_empty()).map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(name), form_decode(value))
        })
    }

    /// The first value of query parameter `name`.
    pub fn query(&self, name: &str) -> Option<String> {
        self.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The whole URL.
    pub fn as_str(&self) -> &str {
        &self.url
    }
}

/// One `application/x-www-form-urlencoded` name or value, decoded leniently.
fn form_decode(s: &str) -> String {
    String::from_utf8_lossy(&unescape(s, true).0).into_owned()
}

/// Decodes `%XX` escapes; `None` for a malformed escape or invalid UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let (bytes, well_formed) = unescape(s, false);
    well_formed.then(|| String::from_utf8(bytes).ok()).flatten()
}

/// The bytes `s` stands for with its `%XX` escapes decoded (and `+` as a space, in form data),
/// and whether every `%` began a well-formed escape (a malformed one is kept as written).
fn unescape(s: &str, plus_is_space: bool) -> (Vec<u8>, bool) {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut well_formed = true;
    let mut i = 0;
    while i < bytes.len() {
        let hex = if bytes[i] == b'%' { s.get(i + 1..i + 3) } else { None };
        // Two hex digits only: `from_str_radix` alone would take a sign (`%+F`).
        match hex.filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit())).and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                well_formed &= bytes[i] != b'%';
                out.push(if plus_is_space && bytes[i] == b'+' { b' ' } else { bytes[i] });
                i += 1;
            }
        }
    }
    (out, well_formed)
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

    /// The entry reaches the agents it lists, by name; never another agent, and never the
    /// object of a child run, even of a listed class (its name has a `/`).
    #[test]
    fn the_entry_routes_listed_agents_and_never_a_child_runs_object() {
        let agents = [("Assistant", "ASSISTANT"), ("Researcher", "RESEARCHER")];
        let target = route_target("/agents/researcher/alice/get-messages", &agents).unwrap();
        assert_eq!(target, RouteTarget { class: "Researcher", binding: "RESEARCHER", name: "alice".into() });
        // A child run's object, asked for by its name encoded: another (top-level) object.
        use crate::parent::registry::{NewRun, Registry};
        let db = crate::store::sqlite::memory();
        let registry = Registry::new(&db);
        registry.migrate().unwrap();
        let run = NewRun { run_id: "agent-tool:c1".into(), agent_type: "Researcher".into(), ..Default::default() };
        registry.insert(&run, 0).unwrap();
        let run = registry.get("agent-tool:c1").unwrap().unwrap();
        let child = crate::parent::engine::child_address("Assistant", "alice", &run).name;
        for encoded in [crate::routing::percent_encode(&child), child.replace('/', "%2F"), child.clone()] {
            let reached = route_target(&format!("/agents/researcher/{encoded}"), &agents);
            assert!(reached.as_ref().map_or(true, |t| t.name != child && !t.name.contains('/')), "{reached:?}");
        }
        assert_eq!(route_target("/agents/planner/alice", &agents).unwrap_err().0, 404);
        assert_eq!(route_target("/elsewhere", &agents).unwrap_err().0, 404);
        assert_eq!(route_target(&format!("/agents/assistant/{}", "n".repeat(513)), &agents).unwrap_err().0, 400);
    }

    #[test]
    fn request_urls_split_as_url_parses_them() {
        let u = RequestUrl::new("https://user:pw@example.org:8787/agents/a/b?token=x%20y+z&e=&flag&t=2#frag".into());
        assert_eq!((u.host(), u.path()), ("example.org", "/agents/a/b"));
        let pairs: Vec<(String, String)> = u.query_pairs().collect();
        let want = [("token", "x y z"), ("e", ""), ("flag", ""), ("t", "2")];
        assert_eq!(pairs, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
        assert_eq!(u.query("token").as_deref(), Some("x y z"));
        assert_eq!(u.query("missing"), None);
        assert_eq!(
            u.with_path("/agents/c/d%20e"),
            "https://user:pw@example.org:8787/agents/c/d%20e?token=x%20y+z&e=&flag&t=2#frag"
        );
        for (url, host, path, moved) in [
            (
                "http://agent-tools.internal/_agent_tools/tail?runId=r&after=3",
                "agent-tools.internal",
                "/_agent_tools/tail",
                "http://agent-tools.internal/n?runId=r&after=3",
            ),
            ("http://localhost", "localhost", "/", "http://localhost/n"),
            ("http://[::1]:8787/x", "[::1]", "/x", "http://[::1]:8787/n"),
            ("http://h?q=1", "h", "/", "http://h/n?q=1"),
            ("http://h#f", "h", "/", "http://h/n#f"),
            ("http://h/p#f?not=query", "h", "/p", "http://h/n#f?not=query"),
        ] {
            let u = RequestUrl::new(url.into());
            assert_eq!((u.host(), u.path(), u.with_path("/n").as_str()), (host, path, moved), "{url}");
        }
        assert_eq!(RequestUrl::new("http://h/p#f?not=query".into()).query_pairs().count(), 0);
        // Malformed escapes stay as written; invalid UTF-8 becomes U+FFFD.
        let odd = RequestUrl::new("http://h/?a=%zz%4&b=%ff&c=%E2%82%AC".into());
        let odd: Vec<String> = odd.query_pairs().map(|(_, v)| v).collect();
        assert_eq!(odd, ["%zz%4", "\u{fffd}", "€"]);
    }

    #[test]
    fn request_urls_agree_with_the_url_crate() {
        for url in [
            "https://example.org/agents/assistant/alice?token=a%2Bb+c&x=%E2%82%AC&&y",
            "http://agent-tools.internal/_agent_tools/start",
            "http://127.0.0.1:8787/agents/assistant/a%20b/sub/researcher/agent-tool%3Ac1/get-messages",
            "https://u@h.example:443/p/q/?a=1&a=2#top",
            "http://localhost:8787",
        ] {
            let ours = RequestUrl::new(url.into());
            let theirs = worker::Url::parse(url).unwrap();
            assert_eq!(Some(ours.host()), theirs.host_str(), "{url}");
            assert_eq!(ours.path(), theirs.path(), "{url}");
            let pairs: Vec<(String, String)> = theirs.query_pairs().into_owned().collect();
            assert_eq!(ours.query_pairs().collect::<Vec<_>>(), pairs, "{url}");
        }
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
