//! Agent tools for Rust Workers: one chat agent dispatches other chat agents as tools, on
//! Cloudflare Workers (workers-rs, WASM).
//!
//! Each child run is a real sub-agent in its own Durable Object, with its own SQLite storage,
//! messages and stream. The parent keeps a durable run registry, streams the child's events to
//! its WebSocket clients as `agent-tool-event` frames (byte-compatible with the TypeScript
//! Agents SDK, `agents@0.32.0`, so its stock clients work unchanged), replays them to any client
//! that connects later, runs children in the background with durable completion callbacks, and
//! recovers runs after a restart.
//!
//! A parent and a child with one agent tool, and the Worker entry:
//!
//! ```
//! use agent_tools::prelude::*; // hooks take `agent_tools::Env`, which it brings in
//! use worker::{event, Context, Request, Response};
//!
//! /// The child: researches one topic (a chat agent; one Durable Object per run).
//! #[derive(Default)]
//! pub struct Researcher;
//!
//! impl Agent for Researcher {
//!     fn system_prompt(&self) -> Option<String> {
//!         Some("Research the topic you are given; end with a short summary.".into())
//!     }
//! }
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Research {
//!     /// The topic, e.g. "HTTP/3".
//!     #[schemars(length(min = 3))]
//!     query: String,
//! }
//!
//! /// The parent: a chat agent whose model may call researchers.
//! #[derive(Default)]
//! pub struct Assistant;
//!
//! impl Agent for Assistant {
//!     fn tools(&self) -> Tools<Self> {
//!         let research = AgentTool::of::<Researcher>("research", "Research one topic in depth.");
//!         Tools::new().agent(research.input::<Research>())
//!     }
//! }
//!
//! // Their Durable Object classes, checked against wrangler.toml when this compiles.
//! agent_tools::durable_object!(Assistant);
//! agent_tools::durable_object!(Researcher);
//!
//! #[event(fetch)]
//! async fn fetch(req: Request, env: worker::Env, _ctx: Context) -> worker::Result<Response> {
//!     agent_tools::route::<Assistant>(req, &env).await // children are reached only through it
//! }
//! # fn main() {}
//! ```
//!
//! `wrangler.toml` binds each class under its own name and lists it in `new_sqlite_classes`.
//! Clients connect to `/agents/assistant/<name>` with the stock `useAgent`, `useAgentChat` and
//! `useAgentToolEvents`. See `docs/guide.md` for the whole tour: tools beside agent tools, imperative
//! and detached runs, progress, drill-in, recovery, and the TypeScript SDK side by side.
//!
//! The crate is split the way the problem is: the parent's and the child's logic are plain Rust
//! over a storage trait, unit-tested against real SQLite; [`AgentHost`] binds them to a Durable
//! Object.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]
#![deny(missing_debug_implementations)]

// The demo names the crate as a Worker would (`agent_tools::…`).
extern crate self as agent_tools;

mod agent;
mod cancel;
mod chat;
mod child;
mod error;
mod host;
mod llm;
mod macros;
pub mod observability;
mod parent;
mod platform;
mod protocol;
mod routing;
mod schedule;
mod schema;
pub mod sql;
mod state;
mod store;
#[cfg(all(any(test, feature = "testing"), not(target_arch = "wasm32")))]
pub mod testing;

/// `docs/testing.md`, whose examples are compiled and run as doctests.
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../docs/testing.md")]
pub struct TestingGuide;

/// `docs/guide.md`, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct UsingGuide;

/// `docs/concepts.md`, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/concepts.md")]
pub struct ConceptsGuide;
mod tools;
mod types;
mod wrangler_check;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod architecture_tests;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod fuzz_tests;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod sim;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod public_api_tests {
    /// The code blocks of a doc comment (`//!` or `///`), as rustdoc compiles them, with the
    /// lines rustdoc hides (`# …`) left out: what a reader of the rendered docs sees.
    fn doc_blocks(source: &str) -> Vec<String> {
        let mut blocks = Vec::new();
        let mut current: Option<Vec<&str>> = None;
        for line in source.lines() {
            let trimmed = line.trim_start();
            let Some(doc) = trimmed.strip_prefix("//!").or_else(|| trimmed.strip_prefix("///")) else { continue };
            let doc = doc.strip_prefix(' ').unwrap_or(doc);
            match (&mut current, doc.starts_with("```")) {
                (None, true) => current = Some(Vec::new()),
                (Some(lines), true) => {
                    blocks.push(lines.join("\n"));
                    current = None;
                }
                (Some(lines), false) if doc != "#" && !doc.starts_with("# ") => lines.push(doc),
                _ => {}
            }
        }
        blocks
    }

    /// The Rust blocks of a Markdown page (` ```rust ` fences, with attributes or none), with the
    /// lines rustdoc hides (`# …`) left out, as `doc_blocks` gives them.
    fn markdown_rust_blocks(page: &str) -> Vec<String> {
        let mut blocks = Vec::new();
        let mut current: Option<Vec<&str>> = None;
        for line in page.lines() {
            let fence = line.trim_start().strip_prefix("```");
            match (&mut current, fence) {
                (None, Some(lang)) if lang.split(',').next() == Some("rust") => current = Some(Vec::new()),
                (Some(lines), Some(_)) => {
                    blocks.push(lines.join("\n"));
                    current = None;
                }
                (Some(lines), None) if line != "#" && !line.starts_with("# ") => lines.push(line),
                _ => {}
            }
        }
        blocks
    }

    /// The pages of `docs/` that `lib.rs` includes as doc comments (a `#[doc]` attribute that
    /// is the page's `include_str!`), so that rustdoc compiles their Rust blocks as doctests:
    /// name and text.
    fn doctested_chapters() -> Vec<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        include_str!("lib.rs")
            .split("#[doc = include_str!(\"../docs/")
            .skip(1)
            .map(|rest| {
                let name = rest[..rest.find('"').expect("a closing quote")].to_owned();
                let text = std::fs::read_to_string(root.join("docs").join(&name)).expect("an included chapter");
                (name, text)
            })
            .collect()
    }

    /// Every Rust block of the README is a doctest of the crate (shown without its hidden
    /// lines): a block of a doc comment in `lib.rs` or `host/parent/dispatch.rs`, or of a
    /// chapter of `docs/` that `lib.rs` includes. So the README's code compiles whenever the
    /// doctests do.
    #[test]
    fn the_readmes_code_is_compiled() {
        let readme = include_str!("../README.md");
        let mut compiled: Vec<String> = [include_str!("lib.rs"), include_str!("host/parent/dispatch.rs")]
            .iter()
            .flat_map(|s| doc_blocks(s))
            .collect();
        compiled.extend(doctested_chapters().iter().flat_map(|(_, text)| markdown_rust_blocks(text)));
        let mut rust_blocks = 0;
        for code in markdown_rust_blocks(readme) {
            rust_blocks += 1;
            assert!(compiled.contains(&code), "this README block is not a doctest:\n{code}");
        }
        assert!(rust_blocks >= 1, "the README shows the library's code");
    }

    /// Every page of `docs/` with a Rust block is included by `lib.rs` as a doc comment, so its
    /// code is compiled by the doctests (a page that is not would show code nothing checks).
    #[test]
    fn every_chapter_with_rust_code_is_a_doctest() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
        let included: Vec<String> = doctested_chapters().into_iter().map(|(name, _)| name).collect();
        let mut with_code = 0;
        for entry in std::fs::read_dir(docs).expect("docs/") {
            let path = entry.expect("entry").path();
            let name = path.file_name().expect("a name").to_string_lossy().into_owned();
            if !name.ends_with(".md") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable");
            if !markdown_rust_blocks(&text).is_empty() {
                with_code += 1;
                assert!(included.contains(&name), "docs/{name} has Rust code that no doctest compiles");
            }
        }
        assert!(with_code >= 2, "docs/testing.md and docs/concepts.md show code ({with_code})");
    }

    /// GitHub's anchor of a heading: lower case, letters, digits, `-` and `_` kept, spaces as `-`.
    fn anchor(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect()
    }

    /// The lines of a Markdown page outside its fenced code blocks.
    fn prose(page: &str) -> impl Iterator<Item = &str> {
        let mut in_code = false;
        page.lines().filter(move |line| {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                return false;
            }
            !in_code
        })
    }

    /// Every relative link of the README and of `docs/` points at a file or folder that exists,
    /// and a link to a heading (`page.md#anchor`, or `#anchor` on the same page) at a heading of
    /// that page: moving a section cannot leave a link behind.
    #[test]
    fn every_relative_link_of_the_docs_resolves() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut pages = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
        let anchors = |page: &std::path::Path| -> Vec<String> {
            let text = std::fs::read_to_string(page).expect("a page");
            prose(&text)
                .filter_map(|line| line.trim_start_matches('#').strip_prefix(' ').filter(|_| line.starts_with('#')))
                .map(anchor)
                .collect()
        };
        let mut links = 0;
        for page in &pages {
            let text = std::fs::read_to_string(page).expect("a page");
            let dir = page.parent().expect("a folder");
            for line in prose(&text) {
                for (at, _) in line.match_indices("](") {
                    let rest = &line[at + 2..];
                    let target = &rest[..rest.find(')').unwrap_or(rest.len())];
                    if target.contains("://") || target.starts_with("mailto:") {
                        continue;
                    }
                    links += 1;
                    let (file, heading) = target.split_once('#').unwrap_or((target, ""));
                    let file = if file.is_empty() { page.clone() } else { dir.join(file) };
                    let shown = format!("{}: ({target})", page.display());
                    assert!(file.exists(), "{shown}: no such file");
                    if !heading.is_empty() {
                        assert!(anchors(&file).iter().any(|a| a == heading), "{shown}: no such heading");
                    }
                }
            }
        }
        assert!(links >= 40, "the README and docs/ link to each other ({links})");
    }

    /// Every `.rs` file under `src/`, one after another.
    fn all_sources() -> String {
        let mut sources = String::new();
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).expect("src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    sources.push_str(&std::fs::read_to_string(path).expect("readable"));
                }
            }
        }
        sources
    }

    /// The tests the guards table of `docs/testing.md` names (`module::tests::name`, or
    /// `tests::name` under the module named before it in the row) exist: a table of guards
    /// cannot point at a test that is gone.
    #[test]
    fn every_test_the_guards_table_names_exists() {
        let testing = include_str!("../docs/testing.md");
        let table = &testing[testing.find("### The contract's guards").expect("the guards table")..];
        let table = &table[..table[4..].find("\n#").map_or(table.len(), |end| end + 4)];
        let sources = all_sources();
        let mut named = 0;
        for cell in table.split('`').skip(1).step_by(2) {
            let Some((_, name)) = cell.rsplit_once("tests::") else { continue };
            named += 1;
            assert!(sources.contains(&format!("fn {name}(")), "docs/testing.md names no such test: {cell}");
        }
        assert!(named >= 25, "the guards table names the tests ({named})");
    }

    /// Rows of `docs/parity.md` whose named tests do not yet assert what the row says (found
    /// by an audit, issue 38): each is to get a test that does, and then leaves this list.
    const PARITY_ROWS_AWAITING_A_TEST: [u32; 0] = [];

    /// The body of test `function` in `text`: from its `fn` line to the next item's first line.
    fn test_body<'a>(text: &'a str, function: &str) -> Option<&'a str> {
        let start = text.find(&format!("fn {function}("))?;
        let rest = &text[start..];
        let mut end = rest.len();
        let mut offset = 0;
        for (n, line) in rest.split_inclusive('\n').enumerate() {
            let item = line.trim_start();
            let next_item = ["fn ", "async fn ", "pub fn ", "#[test]", "#[tokio::test", "mod ", "/// "];
            if n > 0 && next_item.iter().any(|p| item.starts_with(p)) {
                end = offset;
                break;
            }
            offset += line.len();
        }
        Some(&rest[..end])
    }

    /// The rows a `// parity: 3, 15` line in `body` says the test asserts.
    fn parity_tags(body: &str) -> Vec<u32> {
        body.lines()
            .filter_map(|l| l.trim_start().strip_prefix("// parity: "))
            .flat_map(|list| list.split(',').map(|n| n.trim().parse::<u32>().expect("a row number")))
            .collect()
    }

    /// `docs/parity.md` and the tests hold each other: every test a row names is a function in
    /// that file whose body says it asserts the row (`// parity: N`), every row names tests or
    /// says "—" (cannot apply), and every `// parity: N` in the code is in a test that row N
    /// names. So a row cannot point at a test that is gone, moved or about something else, and
    /// a test cannot claim a row that does not name it. Rows still awaiting a test that asserts
    /// them are listed in [`PARITY_ROWS_AWAITING_A_TEST`], and only those.
    #[test]
    fn the_parity_table_and_the_tests_name_each_other() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let parity = std::fs::read_to_string(root.join("docs/parity.md")).expect("docs/parity.md");
        let read = |file: &str| std::fs::read_to_string(root.join(file)).unwrap_or_else(|_| panic!("no file {file}"));
        let (mut rows, mut named) = (0, 0);
        let mut claims = std::collections::BTreeSet::new();
        for row in parity.lines().filter(|l| l.starts_with("| ") && l[2..].starts_with(|c: char| c.is_ascii_digit())) {
            rows += 1;
            let number: u32 = row[2..].split(' ').next().and_then(|n| n.parse().ok()).expect("a row number");
            let awaiting = PARITY_ROWS_AWAITING_A_TEST.contains(&number);
            let test_cell = row.trim_end_matches('|').rsplit('|').next().expect("a test column").trim();
            assert_ne!(test_cell, "**none**", "a behaviour of the seed no test asserts: {row}");
            if test_cell == "—" {
                assert!(!awaiting, "row {number} cannot apply, so it awaits no test");
                continue;
            }
            let mut in_row = 0;
            for cell in test_cell.split('`').skip(1).step_by(2) {
                let Some((file, function)) = cell.split_once(".rs::") else { continue };
                let file = format!("{file}.rs");
                let text = read(&file);
                let body = test_body(&text, function).unwrap_or_else(|| panic!("{row}\nno test {function} in {file}"));
                let asserts = parity_tags(body).contains(&number);
                if awaiting {
                    assert!(!asserts, "{file}::{function} asserts row {number} now: take it off the awaiting list");
                } else {
                    assert!(
                        asserts,
                        "{file}::{function} is named by row {number} but does not say `// parity: {number}`"
                    );
                }
                claims.insert((file, function.to_owned(), number));
                in_row += 1;
            }
            assert!(in_row > 0, "a row names no test and does not say —: {row}");
            named += in_row;
        }
        assert!(rows >= 140 && named >= 130, "the table has its rows ({rows}) and names their tests ({named})");
        // The other way: every claim in the code is a row's.
        let mut files = Vec::new();
        let mut dirs = vec![root.join("src"), root.join("tests"), root.join("examples")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("a directory").flatten() {
                let path = entry.path();
                if path.is_dir() && !path.ends_with("target") && !path.ends_with("node_modules") {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path.strip_prefix(root).expect("under the root").to_string_lossy().into_owned());
                }
            }
        }
        let mut tags = 0;
        for file in files {
            let text = read(&file);
            let mut function = None;
            for line in text.lines() {
                if let Some(at) = line.find("fn ") {
                    let name: String =
                        line[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if line[at + 3 + name.len()..].starts_with('(') {
                        function = Some(name);
                    }
                }
                for number in parity_tags(line) {
                    let function = function.clone().unwrap_or_default();
                    assert!(
                        claims.contains(&(file.clone(), function.clone(), number)),
                        "{file}::{function} says it asserts row {number}, which does not name it"
                    );
                    tags += 1;
                }
            }
        }
        assert!(tags >= 100, "the tests say which rows they assert ({tags})");
    }

    /// `docs/from-typescript.md` covers the whole API an agent author uses: every method of the
    /// `Agent` trait (as `Agent::name`) and every public method of `AgentHost` (as
    /// `host.name`), and every such name it mentions exists.
    #[test]
    fn the_typescript_guide_covers_the_agent_trait_and_the_host() {
        let guide = include_str!("../docs/from-typescript.md");
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let read = |path: &str| std::fs::read_to_string(src.join(path)).expect("a source file");
        let fns = |text: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| {
                    let l = l.trim_start();
                    let rest = l.strip_prefix("pub async fn ").or_else(|| l.strip_prefix("pub fn "))?;
                    Some(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
                })
                .collect()
        };
        let agent = read("agent.rs");
        let trait_body = &agent[agent.find("pub trait Agent").expect("the trait")..];
        let trait_body = &trait_body[..trait_body.find("\n}").expect("its end")];
        let methods: Vec<String> = trait_body
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l.strip_prefix("async fn ").or_else(|| l.strip_prefix("fn "))?;
                Some(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
            })
            .collect();
        assert!(methods.len() >= 20, "the trait's methods: {methods:?}");
        for method in &methods {
            assert!(guide.contains(&format!("Agent::{method}")), "docs/from-typescript.md lacks Agent::{method}");
        }
        let mut host = Vec::new();
        for file in ["host/core.rs", "host/parent/dispatch.rs", "host/parent/sub_agent.rs"] {
            let text = read(file);
            for block in text.split("impl<A: Agent> AgentHost<A> {").skip(1) {
                let block = &block[..block.find("\n}").unwrap_or(block.len())];
                host.extend(fns(block));
            }
        }
        assert!(host.len() >= 25, "the host's methods: {host:?}");
        for method in &host {
            let named = guide.contains(&format!("host.{method}(")) || guide.contains(&format!("host.{method}::"));
            assert!(named, "docs/from-typescript.md lacks host.{method}");
        }
        // And what it names exists.
        let sources = all_sources();
        for prefix in ["Agent::", "host."] {
            for (at, _) in guide.match_indices(prefix) {
                let name: String =
                    guide[at + prefix.len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                assert!(
                    sources.contains(&format!("fn {name}")),
                    "docs/from-typescript.md names {prefix}{name}, which does not exist"
                );
            }
        }
    }

    /// No call of the public API fails with a bare `String`: the files that hold public items
    /// (the crate root's re-exports and public modules) declare no `pub fn` and no trait method
    /// whose result's error is `String` (the crate's `Error` instead).
    #[test]
    fn the_public_api_fails_with_the_crate_error() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let public = [
            "agent.rs",
            "tools.rs",
            "error.rs",
            "cancel.rs",
            "routing.rs",
            "sql.rs",
            "observability.rs",
            "llm/mod.rs",
            "llm/openai.rs",
            "llm/offline.rs",
            "platform/model.rs",
            "platform/route.rs",
            "types/run.rs",
            "types/options.rs",
            "types/detached.rs",
            "host/core.rs",
            "host/io.rs",
            "host/child/turn.rs",
            "host/parent/dispatch.rs",
            "host/parent/sub_agent.rs",
            "testing/world.rs",
            "testing/client.rs",
            "testing/model.rs",
            "testing/sim.rs",
        ];
        let mut signatures = 0;
        for file in public {
            let text = std::fs::read_to_string(src.join(file)).expect(file);
            // The bodies of public traits (`pub trait X … {` to the `}` that closes it at the
            // start of a line): their methods are public whatever they are prefixed with.
            let traits: Vec<(usize, usize)> = text
                .match_indices("\npub trait ")
                .map(|(start, _)| (start, text[start..].find("\n}").map_or(text.len(), |e| start + e)))
                .collect();
            // A signature runs from `fn` to its body or its `;`.
            for (at, _) in text.match_indices("fn ") {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let head = text[line_start..at].trim();
                let public_fn = head.starts_with("pub") && !head.starts_with("pub(");
                let in_trait = traits.iter().any(|&(start, end)| (start..end).contains(&at));
                let trait_method = in_trait && (head.is_empty() || head == "async");
                if !public_fn && !trait_method {
                    continue;
                }
                let end = text[at..].find(['{', ';']).map_or(text.len(), |e| at + e);
                let signature: String = text[at..end].split_whitespace().collect::<Vec<_>>().join(" ");
                signatures += 1;
                let Some((_, result)) = signature.split_once("-> ") else { continue };
                assert!(
                    !(result.contains("Result<") && result.trim_end().ends_with(", String>")),
                    "{file}: a public signature fails with String: {signature}"
                );
            }
        }
        assert!(signatures > 150, "the public signatures were read ({signatures})");
    }

    /// The demo is built as another Worker would be: it names only public items.
    #[test]
    fn the_demo_uses_the_public_api_only() {
        let lib = include_str!("lib.rs");
        let private: Vec<&str> =
            lib.lines().filter_map(|l| l.strip_prefix("mod ").and_then(|m| m.strip_suffix(';'))).collect();
        assert!(private.contains(&"parent") && private.contains(&"platform"), "{private:?}");
        for (file, text) in [
            ("demo/mod.rs", include_str!("demo/mod.rs")),
            ("demo/assistant.rs", include_str!("demo/assistant.rs")),
            ("demo/children.rs", include_str!("demo/children.rs")),
            ("demo/bench.rs", include_str!("demo/bench.rs")),
        ] {
            assert!(!text.contains("crate::"), "{file} reaches into the crate with `crate::`");
            for (at, _) in text.match_indices("agent_tools::") {
                let segment: String = text[at + "agent_tools::".len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                assert!(!private.contains(&segment.as_str()), "{file} uses the private module agent_tools::{segment}");
            }
        }
    }
}

#[cfg(feature = "demo")]
pub mod demo;

/// Models that drive a turn: the [`Model`](model::Model) trait, the provider-neutral request and
/// the events a model streams, the built-in offline model, and the providers a Worker's settings
/// select ([`ModelProvider::from_env`](model::ModelProvider::from_env): offline, OpenAI-compatible,
/// Workers AI).
pub mod model {
    pub use crate::llm::*;
    pub use crate::platform::model::{ModelProvider, WorkersAiConfig};
}

/// The `http` crate the hooks' [`HttpRequest`] and [`HttpResponse`] come from, re-exported so a
/// Worker matches `http::Method::POST` or builds an `http::Response` without naming the same
/// version itself.
pub use http;

pub use agent::{milestone_line, require_token, Agent, Refusal, SubAgent};
pub use cancel::{CancelToken, Cancelled};
pub use error::{Error, Invalid, NotFound, Refused, Unavailable};
pub use host::{
    json_error, json_response, sleep, AgentHost, ChatChunk, ChatStream, Env, HttpRequest, HttpResponse, SubAgentStub,
    Turn, TurnOutput,
};
pub use platform::route::{route, Routes};
pub use routing::RequestUrl;
pub use state::StateSource;
pub use tools::{AgentTool, ClientTool, Tool, ToolContext, Tools};
pub use types::{
    Admission, AgentClass, AgentToolChunk, AgentToolFailure, AgentToolOptions, ChatRecovery, ClearFilter,
    DetachedHandle, DetachedOptions, EventDelivery, HandlerTag, InterruptedReason, InterruptedTurn, Milestone,
    MilestoneMode, OnMilestones, Outcome, Progress, ProgressSnapshot, RecoveryAttempt, RecoveryPolicy, Retention,
    RunInfo, RunInspection, RunOptions, RunResult, RunStatus, ScheduledTask, UnknownStatus,
    DEFAULT_MAX_RECOVERY_ATTEMPTS, DEFAULT_MAX_RECOVERY_WORK, DEFAULT_NOTIFY_SOURCE,
};

/// The fixed limits (see `docs/security.md`); the adjustable ones are
/// [`AgentToolOptions`] fields.
pub mod limits {
    pub use crate::chat::protocol::{MAX_QUEUED_TURNS, MAX_WAITING_TURNS};
    pub use crate::host::child::{TAIL_PAGE, TAIL_QUEUE};
    pub use crate::llm::sse::MAX_SSE_LINE_BYTES;
    pub use crate::parent::engine::MAX_CHILD_CLEAR_ATTEMPTS;
    pub use crate::parent::engine::{MAX_DISPLAY_BYTES, MAX_INPUT_BYTES, RETENTION_BATCH};
    pub use crate::parent::registry::{MAX_TOMBSTONES, REPLAY_PAGE_FRAMES, REPLAY_PAGE_RUNS};
    pub use crate::platform::route::MAX_BODY_BYTES;
    pub use crate::protocol::rpc::MAX_FRAME_BYTES;
    pub use crate::protocol::tail::MAX_TAIL_LINE_BYTES;
    pub use crate::state::MAX_STATE_BYTES;
}

/// What an agent author needs: `use agent_tools::prelude::*;` brings in the trait and its host,
/// tools, the types every hook signature names (`Env`, `HttpRequest`, `RunInfo`, `HandlerTag`,
/// …), the settings and the run's options and results.
///
/// It names `Env` and `Error` (this crate's), as `worker`'s prelude does (`worker::*` has its
/// own `Env` and `Error`): glob-importing both makes either name ambiguous where it is used. Take
/// from `worker` the few items the fetch entry needs by name, and name its `Env` by its path:
///
/// ```
/// use agent_tools::prelude::*; // Env and Error are agent_tools'
/// use worker::{event, Context, Request, Response};
///
/// #[derive(Default)]
/// pub struct Assistant;
///
/// impl Agent for Assistant {
///     fn agent_tool_options(&self, env: &Env) -> AgentToolOptions {
///         let cap = env.var("MAX_RUNS").and_then(|n| n.parse().ok()).unwrap_or(8);
///         AgentToolOptions::default().max_concurrent(cap)
///     }
/// }
/// agent_tools::durable_object!(Assistant, unchecked);
///
/// #[event(fetch)]
/// async fn fetch(req: Request, env: worker::Env, _ctx: Context) -> worker::Result<Response> {
///     agent_tools::route::<Assistant>(req, &env).await
/// }
/// # fn main() {}
/// ```
pub mod prelude {
    pub use crate::model::{Model, ModelError};
    pub use crate::observability::ObservabilityEvent;
    pub use crate::{
        Admission, Agent, AgentClass, AgentHost, AgentTool, AgentToolOptions, CancelToken, ChatChunk, ChatRecovery,
        ChatStream, ClearFilter, ClientTool, DetachedHandle, DetachedOptions, Env, Error, HandlerTag, HttpRequest,
        HttpResponse, InterruptedTurn, Milestone, OnMilestones, Outcome, Progress, ProgressSnapshot, RecoveryAttempt,
        Refusal, Retention, RunInfo, RunOptions, RunResult, RunStatus, ScheduledTask, StateSource, SubAgent,
        SubAgentStub, Tool, ToolContext, Tools, Turn, TurnOutput,
    };
}

/// What [`durable_object!`] expands to needs; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::wrangler_check::{check_wrangler, WranglerCheck};
}
