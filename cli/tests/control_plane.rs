//! Commands against a database without a control plane, with a newer one, and a setup whose
//! migration fails.

mod common;

use common::{assert_fails_saying, pgtenant, setup, text};
use pgtenant_testkit::TestDatabase;

fn migrations_dir(name: &str, sql: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pgtenant-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a migrations directory");
    std::fs::write(dir.join("V1__accounts.sql"), sql).expect("a migration");
    dir
}

#[tokio::test]
async fn without_a_control_plane_every_command_says_run_setup() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    let dir = migrations_dir("none", "CREATE TABLE accounts (id bigint);");
    let dir = dir.to_str().expect("a UTF-8 path");
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["tenants"],
        &["trash"],
        &["alarms"],
        &["alarms", "failed"],
        &["alarms", "retry", "acme/books", "--all"],
        &["sweep"],
        &["show", "acme/books"],
        &["clear", "acme/books"],
        &["migrate", "--dir", dir],
    ] {
        let output = pgtenant(&[args, &["--database-url", url]].concat());
        assert_fails_saying(
            &output,
            "no pgtenant control plane in this database: run `pgtenant setup`",
        );
        assert!(
            !text(&output).contains("does not exist"),
            "{args:?}: {}",
            text(&output)
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A control plane written by a newer pgtenant: commands that write refuse, reads warn.
#[tokio::test]
async fn a_newer_control_plane_refuses_writes() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    setup(url);
    let client = db.connect().await.expect("connect");
    client
        .batch_execute(
            "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch,
                                           quarantine_cause, quarantine_repair, quarantined_at)
             VALUES ('acme/books', 'acme', 'books', 't_acme_books_1_0000000000', 1,
                     'broken', 'fix it', now());
             INSERT INTO pgtenant.refinery_schema_history (version, name, applied_on, checksum)
             VALUES (99, 'from_the_future', '2030-01-01T00:00:00Z', '0')",
        )
        .await
        .expect("a control plane from the future");
    let supported = pgtenant::admin::supported_version();
    let dir = migrations_dir("newer", "CREATE TABLE accounts (id bigint);");
    for (command, args) in [
        ("sweep", &["sweep", "--retention", "0s"][..]),
        ("clear", &["clear", "acme/books"]),
        (
            "migrate",
            &["migrate", "--dir", dir.to_str().expect("UTF-8")],
        ),
    ] {
        let output = pgtenant(&[args, &["--database-url", url]].concat());
        assert_fails_saying(
            &output,
            &format!("at version 99, newer than this pgtenant (version {supported}): `pgtenant {command}` changes the database and is refused"),
        );
    }
    // Nothing was cleared.
    let cause: Option<String> = client
        .query_one("SELECT quarantine_cause FROM pgtenant.tenants", &[])
        .await
        .expect("read")
        .get(0);
    assert_eq!(cause.as_deref(), Some("broken"));
    assert_fails_saying(&pgtenant(&["setup", "--database-url", url]), "version 99");

    let status = pgtenant(&["status", "--database-url", url]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(
        String::from_utf8_lossy(&status.stderr)
            .contains("warning: this database's control plane is at version 99"),
        "{}",
        text(&status)
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A control-plane migration that fails: the server's message, detail, hint and SQLSTATE are
/// shown, not refinery's "db error".
#[tokio::test]
async fn a_failing_setup_shows_what_the_server_said() {
    let db = TestDatabase::create().await.expect("test database");
    let client = db.connect().await.expect("connect");
    client
        .batch_execute(
            "CREATE FUNCTION refuse_views() RETURNS event_trigger LANGUAGE plpgsql AS $$
             BEGIN
                 RAISE EXCEPTION 'views are frozen today'
                     USING DETAIL = 'a change freeze is in force',
                           HINT = 'ask the DBA to drop event trigger view_freeze',
                           ERRCODE = 'PTX99';
             END $$;
             CREATE EVENT TRIGGER view_freeze ON ddl_command_start WHEN TAG IN ('CREATE VIEW')
                 EXECUTE FUNCTION refuse_views();",
        )
        .await
        .expect("an event trigger that refuses views");
    let output = pgtenant(&["setup", "--database-url", db.url()]);
    for expected in [
        "V1__control_plane",
        "views are frozen today (SQLSTATE PTX99)",
        "detail: a change freeze is in force",
        "hint: ask the DBA to drop event trigger view_freeze",
    ] {
        assert_fails_saying(&output, expected);
    }
    client
        .batch_execute("DROP EVENT TRIGGER view_freeze")
        .await
        .expect("drop the trigger");
    setup(db.url());
}
