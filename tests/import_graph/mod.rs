//! The import graph of a crate's `src/`, for the structural tests of all three crates
//! (`tests/layers.rs` here, `cli/tests/layers.rs`, `testcontainers/tests/layers.rs`, which
//! include this file by path): modules, the modules each imports, and the circles among them.
//!
//! An import is any `crate::a::b` path outside comments and the `#[cfg(test)] mod tests` at a
//! file's end, taken as the longest module path it starts with; a name re-exported at the
//! crate root (`crate::Error`) counts as the module it comes from.

#![allow(dead_code)] // each crate's test uses its own part of it

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`protocol::session_fencing::bind`) → the file's text, as it is; the crate root
/// is `lib` (or `main`).
pub(crate) fn sources(manifest_dir: &str) -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|error| panic!("read {}: {error}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).expect("under src");
            let mut parts: Vec<String> = relative
                .iter()
                .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_owned())
                .collect();
            if parts.last().is_some_and(|last| last == "mod") {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            out.insert(parts.join("::"), text);
        }
    }
    let root = Path::new(manifest_dir).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The text without `//` comments and without the trailing test module.
pub(crate) fn code_only(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod tests"))
        {
            break;
        }
        code.push_str(line.split("//").next().unwrap_or(""));
        code.push('\n');
    }
    code
}

/// A crate's modules as code, and who imports whom.
pub(crate) struct Graph {
    /// Module path → its code (`code_only`).
    pub(crate) modules: BTreeMap<String, String>,
    /// Module path → the modules it imports.
    pub(crate) edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// The graph of the crate whose manifest is in `manifest_dir`.
    pub(crate) fn of(manifest_dir: &str) -> Graph {
        let modules: BTreeMap<String, String> = sources(manifest_dir)
            .into_iter()
            .map(|(name, text)| (name, code_only(&text)))
            .collect();
        let names: BTreeSet<String> = modules.keys().cloned().collect();
        let root_module = if names.contains("lib") { "lib" } else { "main" };
        let root = root_names(&modules[root_module], root_module, &names);
        let edges = modules
            .iter()
            .map(|(name, text)| (name.clone(), imports(text, &names, &root, name)))
            .collect();
        Graph { modules, edges }
    }

    /// Problems every crate's check reports: imports this parser cannot see, and circles.
    pub(crate) fn circles_and_hidden_imports(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, text) in &self.modules {
            if text.contains("super::") || text.contains("crate::{") {
                problems.push(format!(
                    "{name}: write each import as a full `crate::a::b` path (no `super::`, no \
                     `crate::{{…}}`) so that this check sees it"
                ));
            }
        }
        fn visit<'a>(
            node: &'a str,
            graph: &'a BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
            problems: &mut Vec<String>,
        ) {
            if let Some(at) = path.iter().position(|seen| *seen == node) {
                problems.push(format!(
                    "import circle: {} → {node}",
                    path[at..].join(" → ")
                ));
                return;
            }
            if !done.insert(node) {
                return;
            }
            path.push(node);
            for next in graph.get(node).into_iter().flatten() {
                visit(next, graph, path, done, problems);
            }
            path.pop();
        }
        let mut done = BTreeSet::new();
        for node in self.edges.keys() {
            visit(node, &self.edges, &mut Vec::new(), &mut done, &mut problems);
        }
        problems
    }

    /// How many imports in all: a parser that found almost none is broken, not a tidy crate.
    pub(crate) fn import_count(&self) -> usize {
        self.edges.values().map(BTreeSet::len).sum()
    }
}

/// The whole check of a crate with no layer rules of its own (the CLI, the test kit): no
/// circle, no import the parser cannot see, and a parser that found the imports.
pub(crate) fn assert_no_circles(manifest_dir: &str) {
    let graph = Graph::of(manifest_dir);
    let problems = graph.circles_and_hidden_imports();
    println!(
        "{} modules, {} imports",
        graph.modules.len(),
        graph.import_count()
    );
    assert!(
        graph.import_count() > graph.modules.len(),
        "the parser found almost no imports: {:?}",
        graph.edges
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Names at the crate root (`crate::Error`) → the module they come from: the root's
/// `pub use`s, and the root itself (`root_module`) for what it defines.
fn root_names(
    root_text: &str,
    root_module: &str,
    names: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    // One statement per `;`: a `pub use a::b::{C, D as E};` may span lines.
    for statement in root_text.split(';') {
        let statement = statement.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some((_, path)) = statement.split_once("pub use ") {
            let (module, items) = match path.split_once("::{") {
                Some((module, items)) => (module.to_owned(), items.trim_end_matches('}')),
                None => match path.rsplit_once("::") {
                    Some((module, item)) => (module.to_owned(), item),
                    None => continue, // a dependency re-exported whole
                },
            };
            let module = module.trim_start_matches("crate::").to_owned();
            if !names.contains(&module) {
                continue;
            }
            for item in items.split(',') {
                let name = item.rsplit(" as ").next().unwrap_or(item).trim();
                if !name.is_empty() {
                    out.insert(name.to_owned(), module.clone());
                }
            }
        }
        for keyword in [
            "pub type ",
            "pub struct ",
            "pub enum ",
            "pub fn ",
            "pub const ",
        ] {
            if let Some(at) = statement.find(keyword) {
                let name: String = statement[at + keyword.len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.insert(name, root_module.to_owned());
            }
        }
    }
    out
}

/// The modules `text` imports, each as the longest module path a `crate::…` path starts with
/// (a crate-root name as the module it comes from).
fn imports(
    text: &str,
    names: &BTreeSet<String>,
    root: &BTreeMap<String, String>,
    me: &str,
) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        if text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::` or a longer identifier
        }
        let path: Vec<&str> = text[at + "crate::".len()..]
            .split("::")
            .map(|segment| {
                let end = segment
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(segment.len());
                &segment[..end]
            })
            .take_while(|segment| !segment.is_empty())
            .collect();
        let module = match path.first().and_then(|first| root.get(*first)) {
            Some(module) => Some(module.clone()),
            None => (1..=path.len())
                .rev()
                .map(|len| path[..len].join("::"))
                .find(|candidate| names.contains(candidate)),
        };
        if let Some(module) = module.filter(|module| module != me) {
            found.insert(module);
        }
    }
    found
}
