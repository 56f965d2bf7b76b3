//! The CLI's modules, checked against their imports: no import circle among them (a command
//! file imports `commands/mod.rs`, `output.rs`, `conn.rs` and below, never another way round).
//! A structural check of `src/`; it needs no database. The parser is the root crate's
//! `tests/import_graph/mod.rs`, shared by all three crates' checks.

#[path = "../../tests/import_graph/mod.rs"]
mod import_graph;

#[test]
fn no_module_imports_one_that_imports_it_back() {
    import_graph::assert_no_circles(env!("CARGO_MANIFEST_DIR"));
}
