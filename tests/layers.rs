//! The library's layers (`src/lib.rs`, `src/protocol/mod.rs`), checked against its imports: a
//! structural check of `src/`, the one test here that needs no database.
//!
//! Bottom to top: the vocabulary (ids, errors, options, connections), then side by side the
//! data-access layer `db/` (the only place control-plane SQL is written and sent) and `state/`
//! (memory only: it imports nothing that does I/O, `db/` nothing of it), then `protocol/`, then
//! the facades (`router.rs`, `handle.rs`, `admin/`, `lib.rs`).
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

/// Modules that send statements or open connections, which `state/` must not import.
const DOES_IO: [&str; 5] = ["db", "connect", "data_pool", "control_plane", "migrate"];

fn layer(module: &str) -> (u8, &'static str) {
    let top = module.split("::").next().unwrap_or(module);
    match top {
        "lib" | "router" | "handle" | "admin" => (3, "facade"),
        "protocol" => (2, "protocol"),
        // Setup runs the control plane's migrations and grants: a protocol of its own (§4).
        "control_plane" => (2, "setup"),
        "state" => (1, "state"),
        "db" => (1, "data access"),
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

    // Side by side: the data-access layer and state know nothing of each other, and state
    // imports nothing that does I/O.
    for (from, targets) in graph {
        for to in targets {
            let top = |module: &str| module.split("::").next().unwrap_or(module).to_owned();
            let (from_top, to_top) = (top(from), top(to));
            if from_top == "db" && to_top == "state" {
                problems.push(format!(
                    "{from} (data access) imports {to} (state): a call takes what it needs as \
                     arguments; move a shared type down to the vocabulary"
                ));
            }
            if from_top == "state" && DOES_IO.contains(&to_top.as_str()) {
                problems.push(format!(
                    "{from} (state) imports {to}, which does I/O: state holds memory only; \
                     move the I/O into a protocol, which calls db/ and updates state"
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

/// The string literals of Rust source `text` outside comments, each with the line it starts on.
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let (mut literals, mut line, mut at) = (Vec::new(), 1, 0);
    let count_lines =
        |from: usize, to: usize| chars[from..to].iter().filter(|c| **c == '\n').count();
    while at < chars.len() {
        let rest = &chars[at..];
        match rest {
            ['/', '/', ..] => {
                let end = rest
                    .iter()
                    .position(|c| *c == '\n')
                    .map_or(chars.len(), |n| at + n);
                at = end;
            }
            ['/', '*', ..] => {
                let end = (at + 2..chars.len().saturating_sub(1))
                    .find(|&i| chars[i] == '*' && chars[i + 1] == '/')
                    .map_or(chars.len(), |i| i + 2);
                line += count_lines(at, end);
                at = end;
            }
            ['r', '#', ..] | ['r', '"', ..] => {
                let hashes = rest[1..].iter().take_while(|c| **c == '#').count();
                let open = at + 1 + hashes;
                if chars.get(open) != Some(&'"') {
                    at += 1;
                    continue;
                }
                let closing: Vec<char> = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let end = (open + 1..chars.len())
                    .find(|&i| chars[i..].starts_with(&closing))
                    .unwrap_or(chars.len());
                literals.push((line, chars[open + 1..end].iter().collect()));
                let end = (end + closing.len()).min(chars.len());
                line += count_lines(at, end);
                at = end;
            }
            ['"', ..] => {
                let mut i = at + 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                let end = i.min(chars.len());
                literals.push((line, chars[at + 1..end].iter().collect()));
                line += count_lines(at, end);
                at = end + 1;
            }
            // A char literal ('"', '\\'), not a lifetime.
            ['\'', '\\', ..] => {
                at += rest[2..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map_or(rest.len(), |n| n + 3);
            }
            ['\'', _, '\'', ..] => at += 3,
            ['\n', ..] => {
                line += 1;
                at += 1;
            }
            _ => at += 1,
        }
    }
    literals
}

/// Whether a string literal is SQL that names the control plane: a statement reading or
/// calling something in schema `pgtenant`, or such a relation alone (a FROM clause's part).
fn names_control_plane_in_sql(literal: &str) -> bool {
    let Some(at) = literal.find("pgtenant.") else {
        return false;
    };
    let name: String = literal[at + "pgtenant.".len()..]
        .chars()
        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
        .collect();
    if name.is_empty() {
        return false;
    }
    let words: Vec<&str> = literal
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .collect();
    let keyword = [
        "SELECT", "FROM", "JOIN", "INSERT", "UPDATE", "DELETE", "CALL", "PERFORM",
    ]
    .iter()
    .any(|keyword| words.contains(keyword));
    let after = &literal[at + "pgtenant.".len() + name.len()..];
    let called = after.trim_start().starts_with('(');
    let relation_alone = literal.split_whitespace().count() == 2
        && literal
            .trim_start()
            .trim_start_matches('(')
            .starts_with("pgtenant.");
    keyword || called || relation_alone
}

#[test]
fn control_plane_sql_is_written_only_in_the_data_access_layer() {
    let mut problems = Vec::new();
    let mut in_db = 0;
    for (module, text) in sources() {
        let literals = string_literals(&text);
        let sql = literals
            .iter()
            .filter(|(_, literal)| names_control_plane_in_sql(literal));
        if module == "db" || module.starts_with("db::") {
            in_db += sql.count();
            continue;
        }
        for (line, literal) in sql {
            let first = literal.lines().next().unwrap_or("").trim();
            problems.push(format!(
                "src/{}.rs:{line}: SQL naming the control plane outside src/db/ (\"{first}\"): \
                 write it as a typed call in src/db/ and call that",
                module.replace("::", "/")
            ));
        }
    }
    println!("{in_db} control-plane statements, all in src/db/");
    assert!(
        in_db > 20,
        "the check found only {in_db} statements in src/db/: is it still reading them?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_sql_check_tells_sql_from_prose() {
    // What the placement check must flag, and what it must leave alone (error text, span names).
    for sql in [
        "SELECT pgtenant.fence($1, $2, $3, $4)",
        "SELECT alive FROM pgtenant.replica_liveness WHERE replica_id = $1",
        "pgtenant.lease_rows s",
        "(SELECT l.*, t.owner_incarnation FROM pgtenant.lease_rows l",
    ] {
        assert!(names_control_plane_in_sql(sql), "not flagged: {sql}");
    }
    for prose in [
        "read pgtenant.fleet_status",
        "pgtenant.acquire returned no row",
        "pgtenant.run",
        "check pgtenant.replica_status and",
        "pgtenant.connection",
    ] {
        assert!(!names_control_plane_in_sql(prose), "flagged: {prose}");
    }
    let text = "let a = '\"'; // \"SELECT pgtenant.x()\"\nlet b = r#\"SELECT pgtenant.y()\"#; /* \"no\" */ let c = \"x\\\"y\";";
    let found: Vec<String> = string_literals(text).into_iter().map(|(_, s)| s).collect();
    assert_eq!(found, ["SELECT pgtenant.y()", "x\\\"y"]);
}

/// The guide's walks ("* **Open** …", "* **Heartbeat** …", "* **Run** …" in `docs/guide.md`):
/// their modules in order, and the counts the text gives.
fn guide_walks() -> Vec<(String, Vec<String>, String)> {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide.md"))
        .expect("docs/guide.md");
    let mut walks = Vec::new();
    let mut lines = guide.lines().peekable();
    while let Some(line) = lines.next() {
        // A walk's first step is its entry point, in backticks right after the name.
        let Some(name) = ["Open", "Heartbeat", "Run"].into_iter().find(|name| {
            line.starts_with(&format!("* **{name}**")) && line.contains("`router` →")
                || line.starts_with(&format!("* **{name}**")) && line.contains("`handle` →")
        }) else {
            continue;
        };
        let mut text = line.to_owned();
        while lines.peek().is_some_and(|next| next.starts_with("  ")) {
            text.push(' ');
            text.push_str(lines.next().unwrap_or_default().trim());
        }
        // The walk is the backticked names joined by arrows, up to the counts.
        let walk_text = text.split(" files,").next().unwrap_or(&text);
        let modules: Vec<String> = walk_text
            .split('→')
            .filter_map(|step| {
                let start = step.find('`')? + 1;
                let end = start + step[start..].find('`')?;
                Some(step[start..end].to_owned())
            })
            .collect();
        walks.push((name.to_owned(), modules, text));
    }
    walks
}

#[test]
fn the_guides_walks_follow_the_imports_and_say_their_counts() {
    let graph = Graph::of(env!("CARGO_MANIFEST_DIR"));
    let walks = guide_walks();
    assert_eq!(
        walks.len(),
        3,
        "docs/guide.md has the open, heartbeat and run walks"
    );
    let mut problems = Vec::new();
    for (name, modules, text) in walks {
        let mut entered: Vec<&String> = Vec::new();
        let mut returns = 0;
        for (step, module) in modules.iter().enumerate() {
            if !graph.modules.contains_key(module) {
                problems.push(format!("{name} walk: {module} is not a module of src/"));
                continue;
            }
            if step > 0 {
                // `use crate::db;` then `db::leases::acquire(…)` imports `db::leases` too.
                let ancestors: Vec<String> = module
                    .match_indices("::")
                    .map(|(at, _)| module[..at].to_owned())
                    .chain(std::iter::once(module.clone()))
                    .collect();
                let reached = entered.iter().any(|from| {
                    graph
                        .edges
                        .get(from.as_str())
                        .is_some_and(|to| ancestors.iter().any(|a| to.contains(a)))
                });
                if !reached {
                    problems.push(format!(
                        "{name} walk: step {step} enters {module}, which no module entered before \
                         it imports"
                    ));
                }
            }
            if entered.contains(&module) {
                returns += 1;
            } else {
                entered.push(module);
            }
        }
        let said = format!("{} files, {returns} return", entered.len());
        println!("{name}: {said}");
        if !text.contains(&said) {
            problems.push(format!("{name} walk: the guide should say \"{said}\""));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
