//! The library's layers (`src/lib.rs`, `src/protocol/mod.rs`), checked against its imports: a
//! structural check of `src/`, the one test here that needs no database.
//!
//! Bottom to top: the vocabulary (ids, errors, options, connections, the control-plane calls'
//! helpers), `state/`, `protocol/`, the facades (`router.rs`, `handle.rs`, `admin/`, `lib.rs`).
//! A module imports only its own layer or lower ones; a protocol imports another protocol
//! only where the table in `src/protocol/mod.rs` says it is built of it, and the table must
//! say exactly what the code does; no import circle anywhere. An import is any `crate::a::b`
//! path outside comments and the `#[cfg(test)] mod tests` at a file's end.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`protocol::session_fencing::bind`) → the file's text, as it is.
fn sources() -> BTreeMap<String, String> {
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
            let name = if parts.is_empty() || parts == ["lib"] {
                "lib".to_owned()
            } else {
                parts.join("::")
            };
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            out.insert(name, text);
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

/// Names at the crate root (`crate::Error`) → the module they come from: `lib.rs`'s `pub use`s,
/// and `lib` itself for what it defines.
fn root_names(lib: &str, names: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    // One statement per `;`: a `pub use a::b::{C, D as E};` may span lines.
    for statement in lib.split(';') {
        let statement = statement.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(path) = statement.strip_prefix("pub use ") {
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
                out.insert(name, "lib".to_owned());
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
        if text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
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
        if let Some(module) = path.first().and_then(|first| root.get(*first)) {
            if module != me {
                found.insert(module.clone());
            }
            continue;
        }
        for len in (1..=path.len()).rev() {
            let candidate = path[..len].join("::");
            if names.contains(&candidate) {
                if candidate != me {
                    found.insert(candidate);
                }
                break;
            }
        }
    }
    found
}

fn layer(module: &str) -> (u8, &'static str) {
    let top = module.split("::").next().unwrap_or(module);
    match top {
        "lib" | "router" | "handle" | "admin" => (3, "facade"),
        "protocol" => (2, "protocol"),
        "state" => (1, "state"),
        _ => (0, "vocabulary"),
    }
}

/// The table of `src/protocol/mod.rs`: rows in order, each the modules of its files and the
/// modules it is built of.
fn protocol_table(doc: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let module_of = |file: &str| {
        let file = file.trim().trim_matches('`').trim_end_matches(".rs");
        let file = file.trim_end_matches("/mod");
        format!("protocol::{}", file.replace('/', "::"))
    };
    doc.lines()
        .filter_map(|line| line.strip_prefix("//! |"))
        .skip(2) // the header and its rule
        .map(|row| {
            let cells: Vec<&str> = row.split('|').collect();
            assert!(
                cells.len() >= 3,
                "src/protocol/mod.rs: a table row needs three cells: {row}"
            );
            let files = cells[1].split(',').map(module_of).collect();
            let built_of = cells[2]
                .split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(|name| format!("protocol::{name}"))
                .collect();
            (files, built_of)
        })
        .collect()
}

#[test]
fn every_import_goes_down_the_layers_and_the_protocol_table_says_what_each_protocol_is_built_of() {
    let sources = sources();
    let modules: BTreeMap<String, String> = sources
        .iter()
        .map(|(name, text)| (name.clone(), code_only(text)))
        .collect();
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let root = root_names(&modules["lib"], &names);
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

    // Up the layers: never.
    for (from, targets) in &graph {
        for to in targets {
            let (from_rank, from_layer) = layer(from);
            let (to_rank, to_layer) = layer(to);
            if to_rank > from_rank {
                problems.push(format!(
                    "{from} ({from_layer}) imports {to} ({to_layer}), a layer above it: move what \
                     it needs down, or the caller up"
                ));
            }
        }
    }

    // Protocols: exactly what the table says, and only rows above.
    // The table is in the doc comment, which `modules` strips.
    let table = protocol_table(&sources["protocol"]);
    let mut row_of = BTreeMap::new();
    for (row, (files, _)) in table.iter().enumerate() {
        for file in files {
            if !names.contains(file) {
                problems.push(format!(
                    "src/protocol/mod.rs names {file}, which is not a module"
                ));
            }
            row_of.insert(file.clone(), row);
        }
    }
    for name in names.iter().filter(|name| name.starts_with("protocol::")) {
        if !row_of.contains_key(name) {
            problems.push(format!(
                "{name} is missing from the table in src/protocol/mod.rs"
            ));
        }
    }
    for (row, (files, built_of)) in table.iter().enumerate() {
        let declared: BTreeSet<&String> = built_of.iter().collect();
        for part in built_of {
            match row_of.get(part) {
                Some(&below) if below < row => {}
                Some(_) => problems.push(format!(
                    "src/protocol/mod.rs: {files:?} is built of {part}, which is not in a row \
                     above it"
                )),
                None => problems.push(format!(
                    "src/protocol/mod.rs: {files:?} is built of {part}, which is not in the table"
                )),
            }
        }
        let mut used = BTreeSet::new();
        for file in files {
            for to in graph.get(file.as_str()).into_iter().flatten() {
                if to.starts_with("protocol") {
                    used.insert(to);
                }
            }
        }
        for to in &used {
            if !declared.contains(to) {
                problems.push(format!(
                    "{files:?} imports {to}, which its row of src/protocol/mod.rs does not list: \
                     add it there (if DESIGN builds it of that protocol) or move what it needs \
                     into state/"
                ));
            }
        }
        for part in &declared {
            if !used.contains(part) {
                problems.push(format!(
                    "src/protocol/mod.rs says {files:?} is built of {part}, but it imports \
                     nothing from it: drop it from the row"
                ));
            }
        }
    }

    // No circle anywhere (the layers rule alone allows one within a layer).
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
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_source_file_opens_with_a_doc_naming_its_design_section() {
    let missing: Vec<String> = sources()
        .into_iter()
        .filter(|(name, _)| name != "lib")
        .filter(|(_, text)| {
            !text
                .lines()
                .take_while(|line| line.starts_with("//!"))
                .any(|line| line.contains("DESIGN"))
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        missing.is_empty(),
        "these modules do not open with a `//!` doc that names their DESIGN section (\"DESIGN §5 \
         \\\"Heartbeat\\\"\"): {missing:?}"
    );
}
