//! One current text per SQL object: `sql/schema.sql` is what a freshly set-up control plane
//! holds (tests/support/schema_dump.sql on it), and this test fails when they differ.
//!
//! Regenerate after changing a migration (or after a merge that adds one):
//! `PGTENANT_WRITE_SCHEMA=1 cargo test --test schema`.

mod support;

use std::ops::Range;
use std::path::Path;

use tokio_postgres::SimpleQueryMessage;

/// The dump: one row per object, kind then name then signature.
const DUMP_SQL: &str = include_str!("support/schema_dump.sql");
/// The checked-in current text.
const SCHEMA_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/schema.sql");
/// Set (to anything but 0 or empty) to rewrite [`SCHEMA_FILE`] instead of comparing.
const WRITE_ENV: &str = "PGTENANT_WRITE_SCHEMA";
const REGENERATE: &str = "PGTENANT_WRITE_SCHEMA=1 cargo test --test schema";
/// The line of the header that names the server's major version: the text of views, defaults
/// and constraints is PostgreSQL's own rendering, which may change between majors.
const MAJOR_PREFIX: &str = "-- Dumped from PostgreSQL ";

/// The dump of the control plane `client` sees, with its header.
async fn dump(client: &tokio_postgres::Client) -> String {
    let major: i32 = client
        .query_one(
            "SELECT current_setting('server_version_num')::int / 10000",
            &[],
        )
        .await
        .expect("server version")
        .get(0);
    let migrations: Vec<String> = client
        .query(
            "SELECT format('V%s__%s', version, name) FROM pgtenant.refinery_schema_history ORDER BY version",
            &[],
        )
        .await
        .expect("applied migrations")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let objects: Vec<String> = client
        .simple_query(DUMP_SQL)
        .await
        .expect("dump the control plane")
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row.get(0).expect("object text").to_owned()),
            _ => None,
        })
        .collect();
    let mut text = format!(
        "-- pgtenant control plane: the current text of every object in schema pgtenant.\n\
         --\n\
         -- GENERATED from a freshly set-up control plane by tests/schema.rs; do not edit. The\n\
         -- migrations in migrations/ are history; this file is the current text (sql/README.md).\n\
         -- Regenerate: {REGENERATE}\n\
         --\n\
         {MAJOR_PREFIX}{major}. Migrations applied:\n"
    );
    for migration in &migrations {
        text.push_str(&format!("--   {migration}\n"));
    }
    for object in &objects {
        text.push('\n');
        text.push_str(object);
        text.push('\n');
    }
    text
}

fn major_of(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|line| line.strip_prefix(MAJOR_PREFIX))
        .and_then(|rest| rest.split('.').next())
}

/// Where `want` and `got` differ, as (want lines, got lines) ranges: a small line diff that
/// resynchronises on three equal lines, enough to show a changed function or column.
fn hunks(want: &[&str], got: &[&str]) -> Vec<(Range<usize>, Range<usize>)> {
    let synced = |x: usize, y: usize| {
        let (left, right) = (&want[x..], &got[y..]);
        if left.len() < 3 || right.len() < 3 {
            return left == right;
        }
        left[..3] == right[..3]
    };
    let (mut i, mut j, mut found) = (0, 0, Vec::new());
    loop {
        while i < want.len() && j < got.len() && want[i] == got[j] {
            (i, j) = (i + 1, j + 1);
        }
        if i == want.len() && j == got.len() {
            return found;
        }
        // The nearest point (fewest lines skipped on both sides) where they agree again.
        let (a, b) = (1..=want.len() - i + got.len() - j)
            .flat_map(|d| (0..=d).map(move |a| (a, d - a)))
            .find(|&(a, b)| i + a <= want.len() && j + b <= got.len() && synced(i + a, j + b))
            .unwrap_or((want.len() - i, got.len() - j));
        found.push((i..i + a, j..j + b));
        (i, j) = (i + a, j + b);
    }
}

/// The first differing lines of `want` (the file) and `got` (the database), with context.
fn describe_difference(want: &str, got: &str) -> String {
    const HUNKS: usize = 4;
    const SHOWN: usize = 12;
    let (want, got): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let hunks = hunks(&want, &got);
    let mut out = format!(
        "sql/schema.sql (-) differs from a freshly set-up control plane (+) in {} place(s):\n",
        hunks.len()
    );
    for (left, right) in hunks.iter().take(HUNKS) {
        out.push_str(&format!(
            "@@ file line {}, database line {}\n",
            left.start + 1,
            right.start + 1
        ));
        for line in &want[left.start.saturating_sub(2)..left.start] {
            out.push_str(&format!("   {line}\n"));
        }
        for (sign, lines) in [("-", &want[left.clone()]), ("+", &got[right.clone()])] {
            for line in lines.iter().take(SHOWN) {
                out.push_str(&format!(" {sign} {line}\n"));
            }
            if lines.len() > SHOWN {
                out.push_str(&format!(" {sign} … {} more line(s)\n", lines.len() - SHOWN));
            }
        }
    }
    if hunks.len() > HUNKS {
        out.push_str(&format!("… and {} more place(s)\n", hunks.len() - HUNKS));
    }
    out.push_str(&format!(
        "If the migrations are right, regenerate the file and commit it: {REGENERATE}"
    ));
    out
}

#[tokio::test]
async fn the_checked_in_schema_is_the_current_control_plane() {
    let (_db, client) = support::database().await;
    let got = dump(&client).await;
    let write = std::env::var(WRITE_ENV).is_ok_and(|value| !value.is_empty() && value != "0");
    if write {
        std::fs::write(SCHEMA_FILE, &got).expect("write sql/schema.sql");
        println!("wrote {SCHEMA_FILE}");
        return;
    }
    let want = match std::fs::read_to_string(SCHEMA_FILE) {
        Ok(want) => want,
        Err(error) => panic!(
            "read {}: {error}; generate it with {REGENERATE}",
            Path::new(SCHEMA_FILE).display()
        ),
    };
    if major_of(&want) != major_of(&got) {
        // Not a difference of the control plane: PostgreSQL prints views and expressions its
        // own way in each major. CI runs the major the file was made with.
        println!(
            "skipped: sql/schema.sql was dumped from PostgreSQL {:?}, this server is {:?}",
            major_of(&want),
            major_of(&got)
        );
        return;
    }
    assert!(want == got, "{}", describe_difference(&want, &got));
}

#[tokio::test]
async fn the_dump_is_the_same_for_every_database_and_after_setup_again() {
    let (_one, mut first) = support::database().await;
    let (_two, second) = support::database().await;
    let before = dump(&first).await;
    let again = pgtenant::setup(&mut first).await.expect("setup again");
    assert!(again.applied.is_empty(), "{:?}", again.applied);
    assert_eq!(before, dump(&first).await, "setup again changed the dump");
    assert!(
        before == dump(&second).await,
        "two fresh control planes dump differently:\n{}",
        describe_difference(&before, &dump(&second).await)
    );
}
