//! The CLI's modules, checked against their imports: no import circle among them (a command
//! file imports `commands/mod.rs`, `output.rs`, `conn.rs` and below, never another way round).
//! A structural check of `src/`; it needs no database. The parser is the root crate's
//! `tests/import_graph/mod.rs`, shared by all three crates' checks.

#[path = "../../tests/import_graph/mod.rs"]
mod import_graph;

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = import_graph::Graph::of(env!("CARGO_MANIFEST_DIR"));
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
