//! The crate's layers, checked: every `crate::` and `super::` path in `src/` is an edge
//! of the module graph, which must have no cycle, and must only point down the layers
//! that `lib.rs` describes:
//!
//! ```text
//! public face   client, acl, list                (and lib.rs)
//! primitives    mutex/, fair, rwlock, semaphore, legacy, redlock/, multi/, optimistic/,
//!               election/
//! engine/       the lease engine
//! script/       scripts, running them, reading replies
//! transport/    connections, batching, cluster, sentinel, tls
//! vocabulary    error, token, keys, options      (used by every layer)
//! ```
//!
//! Primitives do not import each other. A primitive's folder (`mutex/`, `redlock/`)
//! counts as one module: a parent and its own children may refer to each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const VOCABULARY: &[&str] = &["error", "token", "keys", "options"];
const PRIMITIVES: &[&str] = &[
    "mutex",
    "fair",
    "rwlock",
    "semaphore",
    "legacy",
    "redlock",
    "multi",
    "optimistic",
    "election",
];
const FACE: &[&str] = &["client", "acl", "list", "lib"];

/// The layer of a module path (`engine::guard`): higher layers may use lower ones.
fn layer(module: &str) -> u8 {
    let top = module.split("::").next().unwrap_or(module);
    match top {
        t if VOCABULARY.contains(&t) => 0,
        "transport" => 1,
        "script" => 2,
        "engine" => 3,
        t if PRIMITIVES.contains(&t) => 4,
        t if FACE.contains(&t) => 5,
        other => panic!("module {other} is in no layer: add it to tests/layers.rs and lib.rs's map"),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/engine/guard.rs` -> `engine::guard`; `src/mutex/mod.rs` -> `mutex`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src").with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The node a module counts as: a primitive's whole folder is one node.
fn node(module: &str) -> String {
    let top = module.split("::").next().unwrap_or(module);
    if PRIMITIVES.contains(&top) {
        top.to_owned()
    } else {
        module.to_owned()
    }
}

/// Every `crate::a::b` / `super::a` path in `code`, resolved to the longest known
/// module prefix (an item path `crate::engine::guard::Guard` counts as
/// `engine::guard`; a braced import `crate::script::{A, B}` as `script`). Lines that
/// start with `//` are skipped (doc links name items, they import nothing), and so is
/// a file's `#[cfg(test)] mod tests`.
fn references(code: &str, module: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut parent: Vec<&str> = module.split("::").collect();
    parent.pop();
    let mut out = BTreeSet::new();
    let mut lines = code.lines().peekable();
    while let Some(line) = lines.next() {
        let line = line.trim_start();
        // The unit tests at the end of a file use whatever they test.
        if line == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        if line.starts_with("//") {
            continue;
        }
        for (prefix, base) in [("crate::", &[][..]), ("super::", &parent[..])] {
            let mut rest = line;
            while let Some(at) = rest.find(prefix) {
                let joined = rest[..at]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_');
                rest = &rest[at + prefix.len()..];
                if joined {
                    continue;
                }
                let path: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let mut segments: Vec<String> = base.iter().map(|s| s.to_string()).collect();
                segments.extend(path.split("::").filter(|s| !s.is_empty()).map(str::to_owned));
                while !segments.is_empty() && !known.contains(&segments.join("::")) {
                    segments.pop();
                }
                out.insert(if segments.is_empty() {
                    "lib".to_owned()
                } else {
                    segments.join("::")
                });
            }
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            (
                module_of(&src, f),
                std::fs::read_to_string(f).expect("read source"),
            )
        })
        .collect();
    let mut known: BTreeSet<String> = modules.iter().map(|(m, _)| m.clone()).collect();
    known.remove("lib");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &modules {
        let from = node(module);
        let entry = edges.entry(from.clone()).or_default();
        for target in references(code, module, &known) {
            let to = node(&target);
            if to != from {
                entry.insert(to);
            }
        }
    }
    edges
}

#[test]
fn the_module_graph_has_no_cycle() {
    let edges = graph();
    // Depth-first search with colours; report the first cycle found as a path.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == n).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(n.to_owned());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(n.to_owned(), 1);
        path.push(n.to_owned());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, state, path) {
                return Some(cycle);
            }
        }
        path.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if let Some(cycle) = visit(n, &edges, &mut state, &mut Vec::new()) {
            panic!("the module graph has a cycle: {}", cycle.join(" -> "));
        }
    }
    assert!(edges.len() > 20, "the graph was read: {} modules", edges.len());
    // The parser sees the imports it must see.
    assert!(
        edges["engine::guard"].contains("engine::lease"),
        "{:?}",
        edges["engine::guard"]
    );
    assert!(edges["fair"].contains("engine::acquire"), "{:?}", edges["fair"]);
}

#[test]
fn every_module_imports_only_from_the_layers_below_it() {
    let mut wrong = Vec::new();
    for (from, targets) in graph() {
        for to in targets {
            let (a, b) = (layer(&from), layer(&to));
            let sideways_primitive = a == 4 && b == 4;
            let vocabulary_reaching_up = a == 0 && b > 0;
            if b > a || sideways_primitive || vocabulary_reaching_up {
                wrong.push(format!("{from} (layer {a}) imports {to} (layer {b})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}
