//! The test kit's modules, checked against their imports: no import circle among them (the order
//! bottom to top is in `src/lib.rs`). A structural check of `src/`; it needs no database. The
//! parser is the root crate's `tests/import_graph/mod.rs`, shared by all three crates' checks.

#[path = "../../tests/import_graph/mod.rs"]
mod import_graph;

#[test]
fn no_module_imports_one_that_imports_it_back() {
    import_graph::assert_no_circles(env!("CARGO_MANIFEST_DIR"));
}
