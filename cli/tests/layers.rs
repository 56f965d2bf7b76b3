//! The CLI's modules, checked against their imports: no import circle among them (a command
//! file imports `commands/mod.rs`, `output.rs`, `conn.rs` and below, never another way round).
//! A structural check of `src/`; it needs no database.
//!
//! An import is any `crate::a::b` path outside comments and the `#[cfg(test)] mod tests` at a
//! file's end. The parser is a copy of the root crate's `tests/layers.rs`, cut down to circles
//! (the test kit's `tests/layers.rs` holds the same copy): small enough to copy, and a test
//! file cannot share a module with another crate's tests without a crate of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`cluster::tls`) → the file's code (comments and the trailing test module cut).
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|error| panic!("read {}: {error}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(root).expect("under src");
                let mut parts: Vec<String> = relative
                    .iter()
                    .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_owned())
                    .collect();
                if parts.last().is_some_and(|last| last == "mod") {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&path).expect("a readable source file");
                out.insert(parts.join("::"), code_only(&text));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The text without `//` comments and without the trailing test module.
fn code_only(text: &str) -> String {
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

/// Names the crate root re-exports (`pub use a::b::{C, D};`) → the module they come from.
fn root_names(root: &str, names: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for statement in root.split(';') {
        let statement = statement.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(path) = statement
            .split_once("pub use ")
            .map(|(_, path)| path.trim_start_matches("crate::"))
        else {
            continue;
        };
        let (module, items) = match path.split_once("::{") {
            Some((module, items)) => (module, items.trim_end_matches('}')),
            None => match path.rsplit_once("::") {
                Some(split) => split,
                None => continue,
            },
        };
        if names.contains(module) {
            for item in items.split(',') {
                let name = item.rsplit(" as ").next().unwrap_or(item).trim();
                if !name.is_empty() {
                    out.insert(name.to_owned(), module.to_owned());
                }
            }
        }
    }
    out
}

/// The modules `text` imports: each `crate::…` path as the longest module path it starts with.
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

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let modules = modules();
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let crate_root = modules
        .get("lib")
        .or_else(|| modules.get("main"))
        .expect("src/lib.rs or src/main.rs");
    let root = root_names(crate_root, &names);
    let graph: BTreeMap<&str, BTreeSet<String>> = modules
        .iter()
        .map(|(name, text)| (name.as_str(), imports(text, &names, &root, name)))
        .collect();
    let mut problems = Vec::new();
    for (name, text) in &modules {
        if text.contains("super::") || text.contains("crate::{") {
            problems.push(format!(
                "{name}: write each import as a full `crate::a::b` path (no `super::`, no \
                 `crate::{{…}}`) so that this check sees it"
            ));
        }
    }
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<&str, BTreeSet<String>>,
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
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done, &mut problems);
    }
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    println!("{} modules, {edges} imports", modules.len());
    assert!(
        edges > modules.len(),
        "the parser found almost no imports: {graph:?}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
