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

/// The migration that retires the V1 overloads, not in migrations/ while the previous release
/// (0.1.0-pre) calls them: see its header.
const RETIRE_SQL: &str = include_str!("../sql/retire_v1_overloads.sql");

/// The functions it retires, and the ones it rewrites (each of these called a V1 body).
const RETIRED: [&str; 5] = [
    "pgtenant.acquire(text,text,text,text,bigint,boolean)",
    "pgtenant.quarantine(text,text,text,text)",
    "pgtenant.release(text,bigint,text,bigint,text,text,integer)",
    "pgtenant.forget(text,bigint,text,bigint)",
    "pgtenant.restore(text,text,bigint,text)",
];

/// The fingerprints the migration checks, as they are on `client`'s control plane.
async fn fingerprints(client: &tokio_postgres::Client) -> String {
    client
        .query(
            "SELECT format('[%L, %L]', p.oid::regprocedure, md5(concat_ws('|', p.prosrc, p.prosecdef,
                                  p.provolatile, p.proconfig::text)))
               FROM pg_proc p
              WHERE p.pronamespace = 'pgtenant'::regnamespace
                AND p.proname IN ('acquire', 'quarantine', 'release', 'forget', 'restore')
              ORDER BY p.oid::regprocedure::text COLLATE \"C\"",
            &[],
        )
        .await
        .expect("fingerprints")
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join(",\n")
}

#[tokio::test]
async fn this_release_runs_without_the_v1_overloads_once_they_are_retired() {
    let (db, mut client) = support::database().await;
    let tx = client.transaction().await.expect("begin");
    if let Err(error) = tx.batch_execute(RETIRE_SQL).await {
        drop(tx);
        panic!(
            "sql/retire_v1_overloads.sql does not apply: {error:?}\nthe functions it checks are now:\n{}",
            fingerprints(&client).await
        );
    }
    tx.commit().await.expect("commit");
    for signature in RETIRED {
        let gone: bool = client
            .query_one("SELECT to_regprocedure($1) IS NULL", &[&signature])
            .await
            .expect("look up")
            .get(0);
        assert!(gone, "{signature} is still there");
    }
    // Applied twice, it refuses (its functions are not the ones it was written against).
    let again = client.batch_execute(RETIRE_SQL).await.expect_err("twice");
    assert!(
        format!("{again:?}").contains("retire_v1_overloads"),
        "{again:?}"
    );
    // Grants name no retired function.
    client
        .batch_execute("SELECT pgtenant.grant_roles(NULL, NULL)")
        .await
        .expect("grant_roles");

    // Every protocol that reached a V1 body: acquire (creation, takeover), release, forget,
    // restore, quarantine from acquire (a vanished schema) and from a failed creation.
    let router = support::router(db.url(), "retired").await;
    let id = support::tenant("kept");
    let handle = router.open_or_create(&id).await.expect("create");
    support::create_log(&handle).await;
    support::append(&handle, "r", 1).await.expect("write");
    handle.release().await.expect("release");
    let handle = router.open(&id).await.expect("open again");
    let forgotten_at = handle.epoch();
    handle
        .forget(pgtenant::ActiveWork::Drain)
        .await
        .expect("forget");
    let back = router.restore(&id).await.expect("restore");
    assert!(back.epoch() > forgotten_at);
    assert_eq!(
        support::count_rows(&back, "SELECT count(*) FROM log").await,
        1
    );
    let other = support::router(db.url(), "retired-2").await;
    back.handoff().await.expect("hand off");
    let taken = other.open(&id).await.expect("take the tenant");
    support::append(&taken, "r2", 2).await.expect("write there");
    other.close().await;

    let sick = support::tenant("sick");
    let handle = router.open_or_create(&sick).await.expect("create");
    let schema = handle.schema().to_owned();
    handle.release().await.expect("release");
    client
        .batch_execute(&format!("DROP SCHEMA {schema}"))
        .await
        .expect("drop the schema");
    match router.open(&sick).await {
        Err(pgtenant::Error::Quarantined { cause, .. }) => {
            assert!(cause.contains("missing"), "{cause}")
        }
        other => panic!("expected Quarantined, got {other:?}"),
    }
    router.close().await;

    let broken = refinery::Migration::unapplied("V1__broken", "ALTER TABLE nowhere ADD x int")
        .expect("migration");
    let router = pgtenant::Router::start(
        support::options(db.url(), "retired-3").migrations(refinery::Runner::new(&[broken])),
    )
    .await
    .expect("router");
    match router.open_or_create(&support::tenant("half")).await {
        Err(pgtenant::Error::Quarantined { cause, .. }) => {
            assert!(cause.contains("nowhere"), "{cause}")
        }
        other => panic!("expected Quarantined, got {other:?}"),
    }
    let quarantined: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtenant.history WHERE event = 'quarantined'",
            &[],
        )
        .await
        .expect("history")
        .get(0);
    assert_eq!(quarantined, 2);
    router.close().await;
}
