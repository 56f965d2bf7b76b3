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
mod import_graph;

use import_graph::Graph;

fn sources() -> BTreeMap<String, String> {
    import_graph::sources(env!("CARGO_MANIFEST_DIR"))
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
    let crate_graph = Graph::of(env!("CARGO_MANIFEST_DIR"));
    let mut problems = crate_graph.circles_and_hidden_imports();
    let (modules, graph) = (&crate_graph.modules, &crate_graph.edges);
    let names: BTreeSet<String> = modules.keys().cloned().collect();

    // Up the layers: never.
    for (from, targets) in graph {
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
            for to in graph.get(file).into_iter().flatten() {
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

    let edges = crate_graph.import_count();
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
