//! The `pgtenant` command line against real PostgreSQL.

use std::process::{Command, Output};

use pgtenant_testkit::TestDatabase;

fn pgtenant(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pgtenant"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .expect("run pgtenant")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn setup_twice_then_status() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();

    let status = pgtenant(&["status", "--database-url", url]);
    assert!(!status.status.success());
    assert!(
        text(&status).contains("run `pgtenant setup` first"),
        "{}",
        text(&status)
    );

    let first = pgtenant(&["setup", "--database-url", url]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("applied V1__control_plane"),
        "{}",
        text(&first)
    );
    let second = pgtenant(&["setup", &format!("--database-url={url}")]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(text(&second).contains("up to date"), "{}", text(&second));

    let client = db.connect().await.unwrap();
    client
        .batch_execute(
            "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch)
             VALUES ('acme/books', 'acme', 'books', 't_acme_books_1_0000000000', 1)",
        )
        .await
        .unwrap();
    let status = pgtenant(&["status", "--database-url", url]);
    let shown = text(&status);
    assert!(status.status.success(), "{shown}");
    assert!(
        shown.contains("acme/books") && shown.contains("free") && shown.contains("replica_id"),
        "{shown}"
    );

    let json = pgtenant(&["status", "--json", "--database-url", url]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(value["tenants"][0]["tenant"], "acme/books");
    assert_eq!(value["control_plane_version"], 1);
}

#[test]
fn bad_arguments_say_what_to_do() {
    let unknown = pgtenant(&["setup", "--frobnicate"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        text(&unknown).contains("unknown option"),
        "{}",
        text(&unknown)
    );
    let no_url = pgtenant(&["setup"]);
    assert!(!no_url.status.success());
    assert!(
        text(&no_url).contains("--database-url"),
        "{}",
        text(&no_url)
    );
    let help = pgtenant(&["help"]);
    assert!(help.status.success() && text(&help).contains("COMMANDS"));
}

#[test]
fn the_demo_runs_on_a_throwaway_postgres() {
    let demo = pgtenant(&["demo"]);
    let shown = text(&demo);
    assert!(demo.status.success(), "{shown}");
    for expected in [
        "replica-c serves acme/invoices at epoch 2",
        "replica-a took over globex/payroll at epoch 2",
        "replica-a took over acme/invoices at epoch 3: sum 242",
        "refused (fenced",
    ] {
        assert!(
            shown.contains(expected),
            "{expected:?} missing from:\n{shown}"
        );
    }
}
