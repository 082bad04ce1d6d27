//! The shape of the crate, checked: the engines and the wire protocol never reach the platform,
//! and the modules depend on each other without a cycle.
//!
//! The crate's modules, bottom to top:
//!
//! ```text
//! store  routing  cancel  observability  schema      plain helpers, no crate imports (schema runs
//! protocol                                            patterns on JavaScript's RegExp in a Worker)
//! types                                              options, statuses, results: the contract's data
//! llm  chat                                          the model seam, the chat core
//! parent  child                                      the engines: events and time in, actions out
//! agent  tools  host  platform  macros  wrangler_check
//!                                                    the edge: what an author implements, the
//!                                                    host that binds it to one object over `Io`,
//!                                                    and the `Io` of a Durable Object
//! ```
//!
//! The edge is one layer on purpose: the `Agent` trait's hooks receive the `AgentHost` that runs
//! them, so the trait (`agent.rs`) and its host (`host/`) name each other, as a trait and the type
//! it is implemented for often do. Everything below the edge is acyclic, and nothing below it
//! names the edge or the `worker` crate. Within the edge, the host reaches the platform only
//! through its `Io` (it never names `platform`), so the same host runs natively in the test kit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that make up the edge (one node of the graph).
const EDGE: &[&str] = &["agent", "tools", "host", "platform", "macros", "wrangler_check"];

/// Modules that must not name the edge nor the platform's crates.
const BELOW_THE_EDGE: &[&str] =
    &["parent", "child", "protocol", "chat", "types", "store", "llm", "routing", "cancel", "observability"];

/// Crates only the edge may use (the Workers runtime).
const PLATFORM_CRATES: &[&str] = &["worker", "js_sys", "wasm_bindgen", "web_sys"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file as the library compiles it: its comments and every item compiled for
/// tests only (`#[cfg(test)]`, `#[cfg(all(test, ..))]`: a test module, a test helper) left out,
/// wherever they stand in the file.
fn library_code(text: &str) -> String {
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = ["#[cfg(test)]", "#[cfg(all(test"].iter().filter_map(|m| rest.find(m)).min() {
        out.push_str(&rest[..at]);
        rest = skip_item(&rest[at..]);
    }
    out.push_str(rest);
    out
}

/// `code` after its first item (an attribute and what it applies to: up to the `;` or the
/// `}` that closes the item's first block).
fn skip_item(code: &str) -> &str {
    let attribute_end = code.find(']').map_or(code.len(), |i| i + 1);
    let mut depth = 0i32;
    for (i, b) in code.bytes().enumerate().skip(attribute_end) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return &code[i + 1..];
                }
            }
            b';' if depth == 0 => return &code[i + 1..],
            _ => {}
        }
    }
    ""
}

/// The names at the head of each path a `use` tree or a path expression starting at `rest`
/// names: `a::b` gives `a`; `{a::X, b, c::{d}}` gives `a`, `b`, `c`.
fn heads(rest: &str) -> Vec<&str> {
    if let Some(group) = rest.strip_prefix('{') {
        let mut out = Vec::new();
        let (mut depth, mut start) = (0i32, 0usize);
        for (i, b) in group.bytes().enumerate() {
            match b {
                b'{' => depth += 1,
                b'}' if depth == 0 => {
                    out.extend(ident_at(group[start..i].trim_start()));
                    return out;
                }
                b'}' => depth -= 1,
                b',' if depth == 0 => {
                    out.extend(ident_at(group[start..i].trim_start()));
                    start = i + 1;
                }
                _ => {}
            }
        }
        return out;
    }
    ident_at(rest).into_iter().collect()
}

fn ident_at(rest: &str) -> Option<&str> {
    let end = rest.bytes().position(|b| !is_ident(b)).unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The identifiers `code` names right after `prefix::` (each member of a group too).
fn paths_after<'a>(code: &'a str, prefix: &str) -> BTreeSet<&'a str> {
    let needle = format!("{prefix}::");
    code.match_indices(&needle)
        .filter(|(at, _)| at.checked_sub(1).and_then(|i| code.as_bytes().get(i)).is_none_or(|b| !is_ident(*b)))
        .flat_map(|(at, _)| heads(&code[at + needle.len()..]))
        .collect()
}

/// The identifiers `code` names at the crate root through `super::` chains that climb past the
/// top of the file's module (`depth`: how many modules deep the file's module is, 1 for a
/// top-level module).
fn paths_above(code: &str, depth: usize) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("super::") {
        if at.checked_sub(1).and_then(|i| code.as_bytes().get(i)).is_some_and(|b| is_ident(*b) || *b == b':') {
            continue; // the middle of a chain, or a longer name
        }
        let mut rest = &code[at..];
        let mut climbs = 0;
        while let Some(next) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = next;
        }
        if climbs >= depth {
            out.extend(heads(rest));
        }
    }
    out
}

/// The names the crate root re-exports (`pub use module::{Name, ..}`), and the module each
/// comes from: `crate::Error` is a dependency on `error`.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let code = library_code(lib);
    for (at, _) in code.match_indices("\npub use ") {
        let rest = &code[at + "\npub use ".len()..];
        let Some(module) = ident_at(rest) else { continue };
        let tail = &rest[module.len()..];
        // `module::{A, b::B}` or `module::path::Name`: the names it binds at the root.
        let statement = &tail[..tail.find(';').unwrap_or(tail.len())];
        let names: Vec<&str> = statement
            .split([',', '{', '}'])
            .filter_map(|item| item.rsplit("::").next().map(str::trim))
            .map(|item| item.rsplit(" as ").next().unwrap_or(item).trim())
            .filter(|item| !item.is_empty() && item.bytes().all(is_ident))
            .collect();
        for name in names {
            out.insert(name.to_owned(), module.to_owned());
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Each top-level module's dependencies on the others (by `crate::` paths in its library code),
/// and the platform crates it names.
fn module_graph() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let mut graph: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src");
        let top = relative.components().next().expect("a component").as_os_str().to_string_lossy();
        let top = top.trim_end_matches(".rs").to_owned();
        // The crate root is the public façade; tests and the demo Worker are not the library.
        let test_only = ["sim", "fuzz_tests", "architecture_tests"].contains(&top.as_str())
            || relative.file_name().is_some_and(|f| f == "tests.rs");
        if top == "lib" || top == "demo" || test_only {
            continue;
        }
        let code = library_code(&std::fs::read_to_string(&file).expect("readable"));
        // How deep the file's module is: `a.rs` and `a/mod.rs` 1, `a/b.rs` 2.
        let depth = relative.components().count() - usize::from(relative.file_name().is_some_and(|f| f == "mod.rs"));
        let mut named = paths_after(&code, "crate");
        named.extend(paths_above(&code, depth));
        let (deps, crates) = graph.entry(top.clone()).or_default();
        // A name the root re-exports is a dependency on the module it comes from.
        let modules = named.into_iter().map(|n| reexports.get(n).cloned().unwrap_or_else(|| n.to_owned()));
        deps.extend(modules.filter(|m| *m != top));
        for name in PLATFORM_CRATES {
            if code.contains(&format!("{name}::")) && !paths_after(&code, name).is_empty() {
                crates.insert((*name).to_owned());
            }
        }
    }
    graph
}

fn node(module: &str) -> &str {
    if EDGE.contains(&module) {
        "edge"
    } else {
        module
    }
}

#[test]
fn nothing_below_the_edge_names_the_edge_or_the_platform() {
    let graph = module_graph();
    for module in BELOW_THE_EDGE {
        let (deps, crates) = graph.get(*module).unwrap_or_else(|| panic!("no module {module}"));
        let edge: Vec<&String> = deps.iter().filter(|d| EDGE.contains(&d.as_str())).collect();
        assert!(edge.is_empty(), "{module} names the edge: {edge:?}");
        assert!(crates.is_empty(), "{module} names the platform's crates: {crates:?}");
    }
}

#[test]
fn the_host_reaches_the_platform_only_through_io() {
    let graph = module_graph();
    let (deps, _) = graph.get("host").expect("a host module");
    assert!(!deps.contains("platform"), "the host names the platform: {deps:?}");
    // The test kit is the other platform beneath the same host: it never borrows the Worker's.
    let (deps, crates) = graph.get("testing").expect("a testing module");
    assert!(!deps.contains("platform"), "the test kit names the Worker's platform: {deps:?}");
    assert!(crates.is_empty(), "the test kit names the Workers runtime: {crates:?}");
    assert!(graph["platform"].0.contains("host"), "the platform binds the host (this check sees the graph)");
}

/// The modules of `edges` that cannot be ordered bottom to top (Kahn's algorithm): those on a
/// cycle and those that depend on one. Empty when the graph has no cycle.
fn unordered<'a>(mut edges: BTreeMap<&'a str, BTreeSet<&'a str>>) -> BTreeMap<&'a str, BTreeSet<&'a str>> {
    while let Some(leaf) = edges.iter().find(|(_, to)| to.is_empty()).map(|(m, _)| *m) {
        edges.remove(leaf);
        for to in edges.values_mut() {
            to.remove(leaf);
        }
    }
    edges
}

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = module_graph();
    let nodes: BTreeSet<&str> = graph.keys().map(|m| node(m)).collect();
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (module, (deps, _)) in &graph {
        let from = node(module);
        let to = edges.entry(from).or_default();
        to.extend(deps.iter().map(|d| node(d)).filter(|d| *d != from && nodes.contains(d)));
    }
    let cycle = unordered(edges);
    assert!(cycle.is_empty(), "these modules depend on each other in a cycle: {cycle:?}");
}

#[test]
fn the_checks_see_what_they_check() {
    // A cycle, and what is not one.
    let edges = |pairs: &[(&'static str, &'static str)]| {
        let mut map: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (from, to) in pairs {
            map.entry(from).or_default().insert(to);
            map.entry(to).or_default();
        }
        map
    };
    let cycle = unordered(edges(&[("parent", "types"), ("types", "platform"), ("platform", "parent"), ("x", "types")]));
    assert_eq!(cycle.keys().copied().collect::<Vec<_>>(), ["parent", "platform", "types", "x"]);
    assert!(unordered(edges(&[("parent", "types"), ("platform", "parent"), ("platform", "types")])).is_empty());
    // The parsing: `crate::` paths in code, not in comments nor in the test module.
    let code = library_code(
        "use crate::platform::AgentHost;\n// crate::agent in a comment\nfn f() { worker::Delay::from(1); }\n#[cfg(test)]\nmod tests { use crate::demo; }",
    );
    assert_eq!(paths_after(&code, "crate"), BTreeSet::from(["platform"]));
    assert_eq!(paths_after(&code, "worker"), BTreeSet::from(["Delay"]));
    assert!(paths_after("my_crate::x", "crate").is_empty(), "a longer name is not `crate`");
    // Grouped imports, code after a test module, and a test helper between two items.
    let code = library_code(
        "use crate::{parent::X, child::{a, b}, store};\n#[cfg(test)]\nmod tests { use crate::demo; }\n\
         fn f() { crate::routing::x(); }\n#[cfg(all(test, not(x)))]\nfn helper() { crate::sim::y(); }\nuse crate::cancel::Z;",
    );
    assert_eq!(paths_after(&code, "crate"), BTreeSet::from(["cancel", "child", "parent", "routing", "store"]));
    // `super::` chains that climb to the crate root from a file `depth` modules deep.
    let code = "use super::super::host::X;\nuse super::sibling::Y;\nfn g() { super::super::super::types::Z; }";
    assert_eq!(paths_above(code, 2), BTreeSet::from(["host", "types"]));
    assert_eq!(paths_above(code, 3), BTreeSet::from(["types"]));
    // Names the root re-exports lead to their module.
    let lib = "\npub use host::{AgentHost, Env as WorkerEnv};\npub use error::Error;\npub use platform::route::{route, Routes};";
    let reexports = root_reexports(lib);
    assert_eq!(reexports.get("AgentHost").map(String::as_str), Some("host"));
    assert_eq!(reexports.get("WorkerEnv").map(String::as_str), Some("host"));
    assert_eq!(reexports.get("Error").map(String::as_str), Some("error"));
    assert_eq!(reexports.get("Routes").map(String::as_str), Some("platform"));
}

/// Every full path a `use` tree or a path expression starting at `rest` names, as its segments:
/// `a::b::{c, d::e}` gives `[a, b, c]` and `[a, b, d, e]`.
fn full_paths(rest: &str) -> Vec<Vec<&str>> {
    let mut prefix = Vec::new();
    let mut rest = rest;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut out = Vec::new();
            let (mut depth, mut start) = (0i32, 0usize);
            for (i, b) in group.bytes().enumerate() {
                let end = match b {
                    b'{' => {
                        depth += 1;
                        false
                    }
                    b'}' if depth == 0 => true,
                    b'}' => {
                        depth -= 1;
                        false
                    }
                    b',' if depth == 0 => true,
                    _ => false,
                };
                if end {
                    for tail in full_paths(group[start..i].trim_start()) {
                        out.push(prefix.iter().copied().chain(tail).collect());
                    }
                    start = i + 1;
                    if b == b'}' {
                        break;
                    }
                }
            }
            return out;
        }
        let Some(ident) = ident_at(rest) else { return vec![prefix] };
        prefix.push(ident);
        match rest[ident.len()..].strip_prefix("::") {
            Some(next) => rest = next,
            None => return vec![prefix],
        }
    }
}

/// A library file's module path (`parent/engine/follow.rs` is `parent::engine::follow`, a
/// `mod.rs` its folder's).
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> =
        relative.components().map(|c| c.as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Each library file (by module path) and the files it names: through `crate::` paths (a name
/// the root re-exports counts as its module), `super::` and `self::` chains, and paths through
/// its own child modules.
fn file_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let reexports = root_reexports(&lib);
    let mut code_of = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src").to_path_buf();
        let top = relative.components().next().expect("a component").as_os_str().to_string_lossy().into_owned();
        let top = top.trim_end_matches(".rs");
        let test_only = ["sim", "fuzz_tests", "architecture_tests"].contains(&top)
            || relative.file_name().is_some_and(|f| f == "tests.rs" || f == "testing.rs");
        if top == "lib" || top == "demo" || test_only {
            continue;
        }
        code_of.insert(module_of(&relative), library_code(&std::fs::read_to_string(&file).expect("readable")));
    }
    let modules: BTreeSet<Vec<String>> = code_of.keys().cloned().collect();
    // The longest module a path (from the crate root) goes through.
    let resolve = |path: &[&str]| -> Option<Vec<String>> {
        (1..=path.len()).rev().map(|n| path[..n].iter().map(|s| s.to_string()).collect()).find(|m| modules.contains(m))
    };
    let mut graph = BTreeMap::new();
    for (module, code) in &code_of {
        let mut named: Vec<Vec<String>> = Vec::new();
        let starts = |needle: &str| {
            code.match_indices(needle)
                .filter(|(at, _)| {
                    at.checked_sub(1).and_then(|i| code.as_bytes().get(i)).is_none_or(|b| !is_ident(*b) && *b != b':')
                })
                .map(|(at, _)| &code[at + needle.len()..])
                .collect::<Vec<_>>()
        };
        for rest in starts("crate::") {
            for path in full_paths(rest) {
                let path = match path.first().and_then(|head| reexports.get(*head)) {
                    Some(top) if resolve(&path[..1]).is_none() => vec![top.as_str()],
                    _ => path,
                };
                named.extend(resolve(&path));
            }
        }
        let own: Vec<&str> = module.iter().map(String::as_str).collect();
        for rest in starts("super::") {
            let mut base = own.clone();
            let mut rest = rest;
            base.pop();
            while let Some(next) = rest.strip_prefix("super::") {
                base.pop();
                rest = next;
            }
            for path in full_paths(rest) {
                named.extend(resolve(&base.iter().copied().chain(path).collect::<Vec<_>>()));
            }
        }
        let children: BTreeSet<&str> = modules
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m[module.len()].as_str())
            .collect();
        for child in children.iter().map(|c| format!("{c}::")).chain(["self::".to_owned()]) {
            for rest in starts(&child) {
                let head: Vec<&str> = child.trim_end_matches("::").split("::").filter(|s| *s != "self").collect();
                for path in full_paths(rest) {
                    let path: Vec<&str> = own.iter().copied().chain(head.iter().copied()).chain(path).collect();
                    named.extend(resolve(&path));
                }
            }
        }
        named.retain(|m| m != module);
        graph.insert(module.clone(), named.into_iter().collect());
    }
    graph
}

/// The folder a file belongs to: a module with child modules is one folder with them; any
/// other file is its parent module's.
fn folder(module: &[String], graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    let has_children = graph.keys().any(|m| m.len() > module.len() && m.starts_with(module));
    if has_children {
        module.to_vec()
    } else {
        module[..module.len() - 1].to_vec()
    }
}

/// The groups of files that name each other in a circle (strongly connected, more than one
/// file).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<BTreeSet<Vec<String>>> {
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(at) = todo.pop() {
            for next in graph.get(&at).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<Vec<String>>> = Vec::new();
    for (module, reached) in &reaches {
        let circle: BTreeSet<Vec<String>> = reached
            .iter()
            .filter(|other| *other != *module && reaches.get(other).is_some_and(|r| r.contains(*module)))
            .cloned()
            .chain([(*module).clone()])
            .collect();
        if circle.len() > 1 && !out.contains(&circle) {
            out.push(circle);
        }
    }
    out
}

/// No two files of different folders name each other, directly or through others: `store.rs`
/// knows no engine, an engine's module and the files of another never go round. Within a folder
/// (a module and its children) a circle is one module's business; the edge is one layer on
/// purpose (see the top of this file), so its files are one folder here.
#[test]
fn no_circle_crosses_a_folder() {
    let graph = file_graph();
    let mut crossing = Vec::new();
    for circle in circles(&graph) {
        let folders: BTreeSet<Vec<String>> = circle
            .iter()
            .map(|m| if EDGE.contains(&m[0].as_str()) { vec!["edge".to_owned()] } else { folder(m, &graph) })
            .collect();
        if folders.len() > 1 {
            crossing.push(circle.iter().map(|m| m.join("::")).collect::<Vec<_>>());
        }
    }
    assert!(crossing.is_empty(), "files of different folders name each other in a circle: {crossing:#?}");
    // The check sees the files and what they name.
    let store: &BTreeSet<Vec<String>> = &graph[&vec!["store".to_owned()]];
    assert!(store.is_empty(), "store.rs names no other file: {store:?}");
    let follow = &graph[&["parent", "engine", "follow"].map(String::from).to_vec()];
    assert!(follow.contains(&["parent", "registry"].map(String::from).to_vec()), "{follow:?}");
}

#[test]
fn the_file_checks_see_what_they_check() {
    assert_eq!(
        full_paths("a::b::{c, d::{e, f}};"),
        [vec!["a", "b", "c"], vec!["a", "b", "d", "e"], vec!["a", "b", "d", "f"]]
    );
    assert_eq!(full_paths("x::Y)"), [vec!["x", "Y"]]);
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let graph = BTreeMap::from([
        (m("a::x"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("a::x")])),
        (m("c"), BTreeSet::from([m("b")])),
    ]);
    assert_eq!(circles(&graph), [BTreeSet::from([m("a::x"), m("b")])]);
    assert_eq!(folder(&m("a::x"), &graph), m("a"));
}
