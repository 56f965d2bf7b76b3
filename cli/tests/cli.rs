//! The `pgtenant` command line against real PostgreSQL.

use std::process::{Command, Output};

use pgtenant_testkit::{LocalCluster, TestDatabase};

fn pgtenant(args: &[&str]) -> Output {
    pgtenant_with_root_cert(args, None)
}

/// With `PGSSLROOTCERT` set to `root` (or unset).
fn pgtenant_with_root_cert(args: &[&str], root: Option<&std::path::Path>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pgtenant"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("PGSSLROOTCERT");
    if let Some(root) = root {
        command.env("PGSSLROOTCERT", root);
    }
    command.output().expect("run pgtenant")
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
        text(&first).contains(
            "applied V1__control_plane, V2__owner_index_with_key, V3__least_privilege_and_hygiene"
        ),
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
    assert_eq!(
        value["control_plane_version"],
        pgtenant::supported_version()
    );
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

#[tokio::test]
async fn tenants_show_trash_sweep_migrate_and_clear() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    assert!(pgtenant(&["setup", "--database-url", url]).status.success());
    let dir = std::env::temp_dir().join(format!("pgtenant-cli-migrations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("V1__accounts.sql"),
        "CREATE TABLE accounts (id bigint PRIMARY KEY);",
    )
    .unwrap();

    // Two tenants, made through the library.
    let options = pgtenant::RouterOptions::from_url("maker", url).unwrap();
    let router = pgtenant::Router::start(options).await.unwrap();
    for ledger in ["books", "sales"] {
        let id = pgtenant::TenantId::new("acme", ledger).unwrap();
        router
            .open_or_create(&id)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let doomed = router
        .open(&pgtenant::TenantId::new("acme", "sales").unwrap())
        .await
        .unwrap();
    doomed.forget(pgtenant::ActiveWork::Drain).await.unwrap();
    router.close().await;

    let listed = text(&pgtenant(&["tenants", "--database-url", url]));
    assert!(
        listed.contains("acme/books") && listed.contains("free") && listed.contains("forgotten"),
        "{listed}"
    );
    let json = pgtenant(&[
        "tenants",
        "--state",
        "free",
        "--json",
        "--database-url",
        url,
    ]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(value.as_array().unwrap().len(), 1);
    let bad = pgtenant(&["tenants", "--state", "nonsense", "--database-url", url]);
    assert!(
        !bad.status.success() && text(&bad).contains("is not a state"),
        "{}",
        text(&bad)
    );

    let shown = text(&pgtenant(&["show", "acme/books", "--database-url", url]));
    assert!(
        shown.contains("schema: t_acme__books_1_") && shown.contains("version: 0"),
        "{shown}"
    );
    let hostile = pgtenant(&[
        "show",
        "acme/x'; DROP SCHEMA pgtenant; --",
        "--database-url",
        url,
    ]);
    assert!(
        !hostile.status.success() && text(&hostile).contains("not allowed"),
        "{}",
        text(&hostile)
    );

    let migrated = pgtenant(&[
        "migrate",
        "--dir",
        dir.to_str().unwrap(),
        "--database-url",
        url,
    ]);
    assert!(migrated.status.success(), "{}", text(&migrated));
    assert!(
        text(&migrated).contains("1 tenant(s) behind: 1 migrated"),
        "{}",
        text(&migrated)
    );
    let shown = text(&pgtenant(&[
        "show",
        "acme/books",
        "--json",
        "--database-url",
        url,
    ]));
    let value: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(value["version"], 1);

    let trash = text(&pgtenant(&["trash", "--database-url", url]));
    assert!(trash.contains("trash_t_acme__sales_1_"), "{trash}");
    let kept = text(&pgtenant(&["sweep", "--database-url", url]));
    assert!(
        kept.contains("swept 0 schema(s)") && kept.contains("kept 1"),
        "{kept}"
    );
    let swept = text(&pgtenant(&[
        "sweep",
        "--retention",
        "0s",
        "--database-url",
        url,
    ]));
    assert!(swept.contains("swept 1 schema(s)"), "{swept}");
    let bad = pgtenant(&["sweep", "--retention", "soon", "--database-url", url]);
    assert!(!bad.status.success() && text(&bad).contains("not a duration"));

    let clear = text(&pgtenant(&["clear", "acme/books", "--database-url", url]));
    assert!(clear.contains("was not quarantined"), "{clear}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// TLS as psql does it, against a server that refuses unencrypted connections:
/// `sslmode=require` encrypts; with `PGSSLROOTCERT` the server's certificate must chain to
/// that CA; `sslmode=disable` is refused by the server, and the command says why.
#[tokio::test]
async fn tls_follows_sslmode_and_pgsslrootcert() {
    let cluster = LocalCluster::start_tls().await.expect("a TLS cluster");
    let db = cluster.create_database().await.expect("database");
    let ca = cluster.tls_root_certificate().expect("its CA").to_owned();
    let url = |mode: &str| format!("{}?sslmode={mode}", db.url());

    let encrypted = pgtenant(&["setup", "--database-url", &url("require")]);
    assert!(encrypted.status.success(), "{}", text(&encrypted));
    let verified =
        pgtenant_with_root_cert(&["status", "--database-url", &url("require")], Some(&ca));
    assert!(verified.status.success(), "{}", text(&verified));
    let by_default = pgtenant(&["status", "--database-url", db.url()]);
    assert!(
        by_default.status.success(),
        "prefer encrypts: {}",
        text(&by_default)
    );

    let plain = pgtenant(&["status", "--database-url", &url("disable")]);
    assert!(!plain.status.success());
    assert!(text(&plain).contains("no encryption"), "{}", text(&plain));

    // Another CA's certificate authenticates nothing here.
    let other = LocalCluster::start_tls()
        .await
        .expect("a second TLS cluster");
    let stranger = other.tls_root_certificate().expect("its CA");
    let refused = pgtenant_with_root_cert(
        &["status", "--database-url", &url("require")],
        Some(stranger),
    );
    assert!(
        !refused.status.success(),
        "a certificate of another CA was accepted"
    );
    assert!(
        text(&refused).to_lowercase().contains("certificate"),
        "{}",
        text(&refused)
    );
}

/// A database whose control plane is behind this pgtenant: `status` says so and what to run,
/// and `setup` upgrades it.
#[tokio::test]
async fn status_points_an_outdated_control_plane_to_setup() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    // A control plane exactly as the first release set it up: its migration, by refinery.
    let mut client = db.connect().await.expect("connect");
    client
        .batch_execute("CREATE SCHEMA pgtenant")
        .await
        .expect("schema");
    let first_release = [refinery::Migration::unapplied(
        "V1__control_plane",
        include_str!("../../migrations/V1__control_plane.sql"),
    )
    .expect("migration")];
    let mut runner = refinery::Runner::new(&first_release);
    runner.set_migration_table_name("pgtenant.refinery_schema_history");
    runner.run_async(&mut client).await.expect("version 1");
    let status = pgtenant(&["status", "--database-url", url]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(
        text(&status).contains("control plane version 1: this pgtenant needs 3")
            && text(&status).contains("pgtenant setup"),
        "{}",
        text(&status)
    );
    let upgrade = pgtenant(&["setup", "--database-url", url]);
    assert!(
        text(&upgrade)
            .contains("applied V2__owner_index_with_key, V3__least_privilege_and_hygiene"),
        "{}",
        text(&upgrade)
    );
}
