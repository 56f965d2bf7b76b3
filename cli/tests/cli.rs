//! The `pgtenant` command line against real PostgreSQL.

mod common;

use common::{assert_fails_saying, pgtenant, text};
use pgtenant_testkit::TestDatabase;

#[tokio::test]
async fn setup_twice_then_status() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();

    let status = pgtenant(&["status", "--database-url", url]);
    assert!(!status.status.success());
    assert!(
        text(&status).contains("no pgtenant control plane in this database: run `pgtenant setup`"),
        "{}",
        text(&status)
    );

    let first = pgtenant(&["setup", "--database-url", url]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains(
            "applied V1__control_plane, V2__owner_index_with_key, V3__least_privilege_and_hygiene, V4__epoch_floor"
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
        pgtenant::admin::supported_version()
    );
}

#[test]
fn bad_arguments_say_what_to_do() {
    let unknown = pgtenant(&["setup", "--frobnicate"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        text(&unknown).contains("unexpected argument '--frobnicate'"),
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
    assert!(help.status.success() && text(&help).contains("Commands:"));
}

/// `cargo run -p pgtenant-cli --features demo -- demo`; run with
/// `cargo test -p pgtenant-cli --features demo`.
#[cfg(feature = "demo")]
#[test]
fn the_demo_runs_on_a_throwaway_postgres() {
    let demo = pgtenant(&["demo"]);
    let shown = text(&demo);
    assert!(demo.status.success(), "{shown}");
    for expected in [
        "replica-c serves acme/invoices at epoch 2",
        "replica-a took over globex/payroll at epoch 2",
        "replica-a took over acme/invoices at epoch 3: sum 242",
    ] {
        assert!(
            shown.contains(expected),
            "{expected:?} missing from:\n{shown}"
        );
    }
    // The crashed owner's stale handle is refused: by the database (its connection was sealed,
    // so a new one cannot bind: fenced), or before anything is sent, because its router has seen
    // its lease session drop or, as the demo's "crash" is a dropped router, because the handle
    // knows its router is gone (issue 27 named that case instead of "registering again").
    assert!(
        [
            "stale handle tries to write: refused (fenced",
            "stale handle tries to write: refused (replica replica-c is not registered",
            "stale handle tries to write: refused (this replica's router was closed or dropped",
        ]
        .iter()
        .any(|refusal| shown.contains(refusal)),
        "the stale handle's refusal missing from:\n{shown}"
    );
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
    assert_eq!(value["tenants"].as_array().unwrap().len(), 1);
    let bad = pgtenant(&["tenants", "--state", "nonsense", "--database-url", url]);
    assert!(
        !bad.status.success() && text(&bad).contains("[possible values: held, stalled"),
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
        text(&status).contains(&format!(
            "control plane version 1: this pgtenant needs {}",
            pgtenant::admin::supported_version()
        )) && text(&status).contains("pgtenant setup"),
        "{}",
        text(&status)
    );
    let upgrade = pgtenant(&["setup", "--database-url", url]);
    assert!(
        text(&upgrade).contains(
            "applied V2__owner_index_with_key, V3__least_privilege_and_hygiene, V4__epoch_floor",
        ),
        "{}",
        text(&upgrade)
    );
}

/// `pgtenant alarms`: the tenants with alarms, from `pgtenant.alarms`.
#[tokio::test]
async fn alarms_lists_the_tenants_with_alarms() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    let setup = pgtenant(&["setup", "--database-url", url]);
    assert!(setup.status.success(), "{}", text(&setup));
    let empty = pgtenant(&["alarms", "--json", "--database-url", url]);
    assert!(empty.status.success(), "{}", text(&empty));
    assert_eq!(String::from_utf8_lossy(&empty.stdout).trim(), "[]");

    let options = pgtenant::RouterOptions::from_url("alarm-maker", url).unwrap();
    let router = pgtenant::Router::start(options).await.unwrap();
    let id = pgtenant::TenantId::new("acme", "reminders").unwrap();
    let handle = router.open_or_create(&id).await.unwrap();
    let due = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.schedule_alarm("close-period", due, &"2026-12").await?;
                tx.schedule_alarm("remind", due, &()).await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .unwrap();

    let listed = pgtenant(&["alarms", "--json", "--database-url", url]);
    assert!(listed.status.success(), "{}", text(&listed));
    let value: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(value[0]["tenant"], "acme/reminders");
    assert_eq!(value[0]["owner"], "alarm-maker");
    assert_eq!(value[0]["pending"], 2);
    assert_eq!(value[0]["failed"], 0);
    assert!(value[0]["next_due"].is_string(), "{value}");
    let table = text(&pgtenant(&["alarms", "--database-url", url]));
    assert!(
        table.contains("acme/reminders") && table.contains("alarm-maker"),
        "{table}"
    );
    router.close().await;
}

/// `pgtenant alarms failed`, `retry`, `clear`: parked alarms listed, and an operator's request
/// applied by the tenant's owner under its lease. Multi-threaded: the commands run as blocking
/// child processes while the router's firing task works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_failed_retry_and_clear_reach_the_owner() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime};
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    let setup = pgtenant(&["setup", "--database-url", url]);
    assert!(setup.status.success(), "{}", text(&setup));
    // The webhook is down until the test says otherwise; one attempt, then parked.
    let down = Arc::new(AtomicBool::new(true));
    let fired = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (webhook, log) = (down.clone(), fired.clone());
    let options = pgtenant::RouterOptions::from_url("alarm-owner", url)
        .unwrap()
        .alarm_max_attempts(1)
        .alarm_handler(move |_tx, alarm| {
            let (webhook, log) = (webhook.clone(), log.clone());
            Box::pin(async move {
                if webhook.load(Ordering::SeqCst) {
                    return Err("the webhook answered 503".into());
                }
                log.lock().unwrap().push(alarm.name.clone());
                Ok(())
            })
        });
    let router = pgtenant::Router::start(options).await.unwrap();
    let id = pgtenant::TenantId::new("acme", "hooks").unwrap();
    let handle = router.open_or_create(&id).await.unwrap();
    let now = SystemTime::now();
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.schedule_alarm("flaky", now, &()).await?;
                tx.schedule_alarm("broken", now, &()).await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let parked = loop {
        let listed = pgtenant(&["alarms", "failed", "--json", "--database-url", url]);
        assert!(listed.status.success(), "{}", text(&listed));
        let value: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        if value.as_array().map_or(0, Vec::len) == 2 {
            break value;
        }
        assert!(Instant::now() < deadline, "not parked: {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(parked[0]["tenant"], "acme/hooks");
    assert_eq!(parked[0]["attempts"], 1);
    assert_eq!(parked[0]["last_error"], "the webhook answered 503");
    let table = text(&pgtenant(&["alarms", "failed", "--database-url", url]));
    assert!(table.contains("broken") && table.contains("503"), "{table}");

    let unknown = pgtenant(&[
        "alarms",
        "retry",
        "acme/hooks",
        "nosuch",
        "--database-url",
        url,
    ]);
    assert_fails_saying(
        &unknown,
        "tenant acme/hooks has no parked alarm named \"nosuch\"",
    );
    let neither = pgtenant(&["alarms", "clear", "acme/hooks", "--database-url", url]);
    assert_eq!(
        neither.status.code(),
        Some(2),
        "a name or --all: {}",
        text(&neither)
    );

    down.store(false, Ordering::SeqCst);
    let retried = pgtenant(&[
        "alarms",
        "retry",
        "acme/hooks",
        "flaky",
        "--json",
        "--database-url",
        url,
    ]);
    assert!(retried.status.success(), "{}", text(&retried));
    let value: serde_json::Value = serde_json::from_slice(&retried.stdout).unwrap();
    assert_eq!(value["applied"], true, "{value}");
    assert_eq!(value["alarms"], serde_json::json!(["flaky"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while fired.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the retried alarm did not fire");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(*fired.lock().unwrap(), ["flaky"]);
    let cleared = pgtenant(&[
        "alarms",
        "clear",
        "acme/hooks",
        "--all",
        "--database-url",
        url,
    ]);
    assert!(
        text(&cleared).contains("broken cleared by its owner"),
        "{}",
        text(&cleared)
    );
    let left = pgtenant(&["alarms", "--json", "--database-url", url]);
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "[]");
    assert_eq!(
        *fired.lock().unwrap(),
        ["flaky"],
        "a cleared alarm never fires"
    );
    router.close().await;
}
