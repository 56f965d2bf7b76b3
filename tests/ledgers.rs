//! Tenant ledgers: creation with migrations, upgrades on open, quarantine on failure, schema
//! ahead, migrate_all, forget (G5), re-creation, sweep, restore, listing.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use pgtenant::admin::{SweepOptions, TenantQuery};
use pgtenant::SchemaVersion;
use pgtenant::{ActiveWork, Error, Event, MigrationOutcome, Router, TenantId};
use refinery::{Migration, Runner};
use support::{database, options, tenant};

fn migrations(list: &[(&str, &str)]) -> Runner {
    let migrations: Vec<Migration> = list
        .iter()
        .map(|(name, sql)| Migration::unapplied(name, sql).expect("migration"))
        .collect();
    Runner::new(&migrations)
}

const V1: (&str, &str) = (
    "V1__accounts",
    "CREATE TABLE accounts (id bigint PRIMARY KEY, name text)",
);
const V2: (&str, &str) = (
    "V2__entries",
    "CREATE TABLE entries (account bigint REFERENCES accounts, amount bigint)",
);
const V3_BROKEN: (&str, &str) = ("V3__broken", "ALTER TABLE nowhere ADD COLUMN x int");

async fn router_with(url: &str, name: &str, list: &[(&str, &str)]) -> Router {
    Router::start(options(url, name).migrations(migrations(list)))
        .await
        .expect("router")
}

async fn count(client: &tokio_postgres::Client, sql: &str, key: &str) -> i64 {
    client.query_one(sql, &[&key]).await.expect(sql).get(0)
}

async fn tables_in(client: &tokio_postgres::Client, schema: &str) -> BTreeSet<String> {
    client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relkind = 'r'",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn creation_runs_the_migrations_atomically_and_is_idempotent() {
    let (db, client) = database().await;
    let router = router_with(db.url(), "creator", &[V1, V2]).await;
    let id = tenant("created");
    let handle = router.open_or_create(&id).await.unwrap();
    let again = router.open_or_create(&id).await.unwrap();
    assert_eq!(again.epoch(), handle.epoch(), "idempotent");
    let tables = tables_in(&client, handle.schema()).await;
    assert!(
        tables.contains("accounts")
            && tables.contains("entries")
            && tables.contains("refinery_schema_history")
    );
    assert_eq!(router.status(&id).await.unwrap().version, 2);
    handle.release().await.unwrap();
    router
        .open_or_create(&id)
        .await
        .expect("idempotent after release too");

    // A creation whose migration fails leaves nothing half-built, and quarantines the tenant.
    let broken = router_with(db.url(), "broken", &[V1, V3_BROKEN]).await;
    let sick = tenant("half-built");
    match broken.open_or_create(&sick).await {
        Err(Error::Quarantined { cause, repair, .. }) => {
            assert!(
                cause.contains("V3__broken") && cause.contains("nowhere"),
                "{cause}"
            );
            assert!(repair.contains("clear the quarantine"), "{repair}");
        }
        other => panic!("expected Quarantined, got {other:?}"),
    }
    let schemas = count(
        &client,
        "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 't\\_acme\\_half%' AND $1 <> ''",
        "x",
    )
    .await;
    assert_eq!(schemas, 0, "no schema left behind");
    let status = broken.status(&sick).await.unwrap();
    assert_eq!(
        (status.state.as_str(), status.schema),
        ("quarantined", None)
    );
    router.close().await;
    broken.close().await;
}

#[tokio::test]
async fn open_upgrades_a_tenant_that_is_behind_and_a_failure_quarantines_it() {
    let (db, client) = database().await;
    let id = tenant("upgraded");
    let old = router_with(db.url(), "old-code", &[V1]).await;
    let schema = old.open_or_create(&id).await.unwrap().schema().to_owned();
    old.close().await;

    let new = router_with(db.url(), "new-code", &[V1, V2]).await;
    let mut events = new.subscribe();
    new.open(&id).await.expect("upgraded on open");
    loop {
        if let Event::Migrated { from, to, .. } = events.recv().await.unwrap() {
            assert_eq!((from, to), (SchemaVersion::new(1), SchemaVersion::new(2)));
            break;
        }
    }
    assert!(tables_in(&client, &schema).await.contains("entries"));
    assert_eq!(
        count(
            &client,
            "SELECT schema_version::bigint FROM pgtenant.tenants WHERE key = $1",
            id.key()
        )
        .await,
        2
    );
    new.close().await;

    let broken = router_with(db.url(), "broken-code", &[V1, V2, V3_BROKEN]).await;
    match broken.open(&id).await {
        Err(Error::Quarantined { cause, .. }) => {
            assert!(
                cause.contains("V3__broken") && cause.contains("SQLSTATE 42P01"),
                "{cause}"
            )
        }
        other => panic!("expected Quarantined, got {other:?}"),
    }
    let status = broken.status(&id).await.unwrap();
    assert_eq!(
        (status.state.as_str(), status.version),
        ("quarantined", SchemaVersion::new(2))
    );
    assert!(status.quarantine_cause.unwrap().contains("V3__broken"));
    assert!(
        !tables_in(&client, &schema).await.contains("x"),
        "the failed migration rolled back"
    );
    broken.close().await;
}

#[tokio::test]
async fn a_schema_ahead_of_the_code_is_refused_not_quarantined() {
    let (db, _client) = database().await;
    let id = tenant("ahead");
    let new = router_with(db.url(), "newer", &[V1, V2]).await;
    new.open_or_create(&id).await.unwrap();
    new.close().await;
    let old = router_with(db.url(), "older", &[V1]).await;
    match old.open(&id).await {
        Err(
            error @ Error::SchemaAhead {
                found, supported, ..
            },
        ) if found == 2 && supported == 1 => {
            assert!(error.to_string().contains("newer code"), "{error}");
        }
        other => panic!("expected SchemaAhead, got {other:?}"),
    }
    assert_eq!(
        old.status(&id).await.unwrap().state,
        "free",
        "left for newer replicas"
    );
    old.close().await;
}

/// A migration that fails when run twice, slowed down so runners would overlap: concurrent
/// opens from two replicas still run it exactly once.
#[tokio::test]
async fn concurrent_opens_never_run_two_migrators_on_one_schema() {
    let (db, client) = database().await;
    let slow = [
        (
            "V1__slow",
            "SELECT pg_sleep(0.3); CREATE TABLE once (id int)",
        ),
        ("V2__again", "CREATE TABLE twice (id int)"),
    ];
    let a = router_with(db.url(), "mig-a", &slow).await;
    let b = router_with(db.url(), "mig-b", &slow).await;
    let id = tenant("contended");
    let mut opens = Vec::new();
    for router in [&a, &b, &a, &b, &a, &b] {
        opens.push(router.open_or_create(&id));
    }
    let mut winners = BTreeSet::new();
    for result in support::join_all(opens).await {
        match result {
            Ok(handle) => {
                winners.insert(handle.epoch());
            }
            Err(Error::LeaseHeld { .. }) => {}
            Err(other) => panic!("unexpected: {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "one tenure");
    let schema: String = client
        .query_one(
            "SELECT schema_name FROM pgtenant.tenants WHERE key = $1",
            &[&id.key()],
        )
        .await
        .unwrap()
        .get(0);
    let runs: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.refinery_schema_history"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(runs, 2, "each migration ran once");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn migrate_all_over_1000_tenants_reports_each() {
    let (db, _client) = database().await;
    let old = std::sync::Arc::new(router_with(db.url(), "fleet-old", &[V1]).await);
    let ids: Vec<TenantId> = (0..1000).map(|i| tenant(&format!("fleet-{i}"))).collect();
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..8 {
        let (old, ids) = (old.clone(), ids.clone());
        lanes.spawn(async move {
            for id in ids.iter().skip(lane).step_by(8) {
                old.open_or_create(id)
                    .await
                    .expect("create")
                    .release()
                    .await
                    .expect("release");
            }
        });
    }
    while let Some(done) = lanes.join_next().await {
        done.unwrap();
    }
    // One tenant stays with a live replica that runs the old code.
    let held = old.open(&ids[0]).await.unwrap();

    let new = router_with(db.url(), "fleet-new", &[V1, V2]).await;
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let results = new
        .migrate_all(8, |step| {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            assert!(step.done <= step.total && step.total == 1000);
        })
        .await
        .unwrap();
    assert_eq!(results.len(), 1000);
    assert_eq!(seen.into_inner(), 1000, "progress after each tenant");
    let migrated = results
        .iter()
        .filter(|r| {
            matches!(r.outcome, MigrationOutcome::Migrated { from, to } if from == 1 && to == 2)
        })
        .count();
    assert_eq!(migrated, 999);
    let elsewhere: Vec<_> = results
        .iter()
        .filter(|r| matches!(&r.outcome, MigrationOutcome::HeldElsewhere { owner } if owner == "fleet-old"))
        .collect();
    assert_eq!(elsewhere.len(), 1);
    assert_eq!(elsewhere[0].tenant, ids[0].key());
    assert_eq!(
        held.schema(),
        new.status(&ids[0]).await.unwrap().schema.unwrap()
    );
    let again = new.migrate_all(8, |_| {}).await.unwrap();
    assert_eq!(again.len(), 1, "only the held one is still behind");
    assert!(matches!(
        new.migrate_all(0, |_| {}).await,
        Err(Error::InvalidOption {
            option: "concurrency",
            ..
        })
    ));
    new.close().await;
    old.close().await;
}

#[tokio::test]
async fn forget_masks_the_epoch_moves_the_schema_to_trash_and_a_new_life_sees_nothing() {
    let (db, client) = database().await;
    // The in-database fence refusing a forgotten epoch (under session fencing the zombie's
    // sessions are terminated by the takeover instead: tests/session_fencing.rs).
    let a = Router::start(
        options(db.url(), "forget-a")
            .pool_size(1)
            .fencing(pgtenant::Fencing::Transaction),
    )
    .await
    .unwrap();
    let b = Router::start(options(db.url(), "forget-b").fencing(pgtenant::Fencing::Transaction))
        .await
        .unwrap();
    let id = tenant("forgotten");
    let zombie = a.open_or_create(&id).await.unwrap();
    support::create_log(&zombie).await;
    support::append(&zombie, "a", 1).await.unwrap();
    let old_schema = zombie.schema().to_owned();

    // A zombie: its next work has passed every local check and waits for a connection…
    let parked = a.connection().await.unwrap();
    let pending = {
        let zombie = zombie.clone();
        tokio::spawn(async move { support::append(&zombie, "a", 2).await })
    };
    // …while its heartbeats stall, another replica takes over and forgets the tenant.
    let mut blocker = db.connect().await.unwrap();
    let stall = blocker.transaction().await.unwrap();
    stall
        .execute(
            "SELECT 1 FROM pgtenant.replicas WHERE replica_id = 'forget-a' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let owner = loop {
        match b.open(&id).await {
            Ok(handle) => break handle,
            Err(Error::LeaseHeld { expires_in, .. }) => {
                tokio::time::sleep(expires_in.unwrap_or_default() + Duration::from_millis(20)).await
            }
            Err(other) => panic!("{other}"),
        }
    };
    let trash = owner.forget(ActiveWork::Drain).await.expect("forget");
    assert_eq!(trash, format!("trash_{old_schema}"));
    drop(parked);
    match pending.await.unwrap() {
        Err(Error::Forgotten { epoch, .. }) => assert_eq!(epoch, zombie.epoch()),
        other => panic!("the zombie must not commit: {other:?}"),
    }
    stall.rollback().await.unwrap();
    for epoch in 1..=owner.epoch().get() {
        let error = client
            .query_one("SELECT pgtenant.fence($1, $2)", &[&id.key(), &epoch])
            .await
            .expect_err("every epoch up to the forgotten one is masked");
        assert_eq!(error.code().unwrap().code(), pgtenant::sqlstate::FORGOTTEN);
    }
    let status = b.status(&id).await.unwrap();
    assert_eq!((status.state.as_str(), status.schema), ("forgotten", None));
    assert!(matches!(
        b.open(&id).await,
        Err(Error::TenantNotFound { .. })
    ));
    let rows: i64 = client
        .query_one(&format!("SELECT count(*) FROM {trash}.log"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows, 1,
        "the trash holds what was acknowledged, and not the zombie's write"
    );

    // A new life: higher epoch, new schema, none of the old data.
    let reborn = b.open_or_create(&id).await.unwrap();
    assert!(reborn.epoch() > owner.epoch());
    assert_ne!(reborn.schema(), old_schema);
    let tables = tables_in(&client, reborn.schema()).await;
    assert!(
        tables.is_empty(),
        "sees nothing of the old life: {tables:?}"
    );
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn forget_refuses_drains_or_cancels_work_in_flight() {
    let (db, _client) = database().await;
    let router = Router::start(options(db.url(), "careful").drain_timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    let slow = |handle: &pgtenant::TenantHandle| {
        let handle = handle.clone();
        tokio::spawn(async move {
            handle
                .run(|tx| {
                    Box::pin(async move {
                        tx.execute("SELECT pg_sleep(2)", &[]).await?;
                        Ok::<_, Error>(())
                    })
                })
                .await
        })
    };
    let id = tenant("busy");
    let handle = router.open_or_create(&id).await.unwrap();
    let work = slow(&handle);
    while handle.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    assert!(matches!(
        handle.forget(ActiveWork::Refuse).await,
        Err(Error::Busy { in_flight: 1, .. })
    ));
    assert!(handle.is_serving(), "a refused forget changes nothing");
    let started = std::time::Instant::now();
    handle
        .forget(ActiveWork::Cancel)
        .await
        .expect("cancel then forget");
    let cancelled = work.await.unwrap();
    assert!(
        cancelled.is_err(),
        "the statement was cancelled: {cancelled:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "did not wait for the sleep to end"
    );

    let id = tenant("drained");
    let handle = router.open_or_create(&id).await.unwrap();
    let work = slow(&handle);
    while handle.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    handle
        .forget(ActiveWork::Drain)
        .await
        .expect("drain then forget");
    work.await
        .unwrap()
        .expect("the drained work committed first");
    router.close().await;
}

#[tokio::test]
async fn restore_brings_a_forgotten_tenant_back_as_a_new_life() {
    let (db, mut client) = database().await;
    let router = support::router(db.url(), "restorer").await;
    let id = tenant("restored");
    let handle = router.open_or_create(&id).await.unwrap();
    support::create_log(&handle).await;
    support::append(&handle, "r", 1).await.unwrap();
    let forgotten_at = handle.epoch();
    handle.forget(ActiveWork::Drain).await.unwrap();

    let back = router.restore(&id).await.expect("restore");
    assert!(back.epoch() > forgotten_at);
    assert_eq!(
        back.schema(),
        id.schema_name(back.epoch().get()),
        "named for its new life"
    );
    let rows = support::count_rows(&back, "SELECT count(*) FROM log").await;
    assert_eq!(rows, 1, "the data is back");
    support::append(&back, "r", 2)
        .await
        .expect("writable under the new epoch");
    match router.restore(&id).await {
        Err(Error::RestoreRefused { reason, .. }) => {
            assert!(reason.contains("new life"), "{reason}")
        }
        other => panic!("expected RestoreRefused, got {other:?}"),
    }

    // Forgotten and swept: nothing left to restore.
    back.forget(ActiveWork::Drain).await.unwrap();
    let report = pgtenant::admin::sweep(
        &mut client,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(report.swept.len(), 1);
    match router.restore(&id).await {
        Err(Error::RestoreRefused { reason, .. }) => {
            assert!(reason.contains("nothing"), "{reason}")
        }
        other => panic!("expected RestoreRefused, got {other:?}"),
    }
    router.close().await;
}

#[tokio::test]
async fn the_sweep_removes_masked_and_expired_schemas_and_never_a_live_one() {
    let (db, mut client) = database().await;
    let router = support::router(db.url(), "sweeper").await;
    let id = tenant("swept");
    let first = router.open_or_create(&id).await.unwrap();
    let first_schema = first.schema().to_owned();
    first.forget(ActiveWork::Drain).await.unwrap();
    let live = router.open_or_create(&tenant("alive")).await.unwrap();
    // What a superseded owner could leave behind: a schema of a forgotten epoch, outside the
    // trash (made by hand here, since fencing keeps pgtenant itself from doing it).
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {first_schema}; CREATE TABLE {first_schema}.leftover (id int)"
        ))
        .await
        .unwrap();
    // A tenant-shaped schema nobody accounts for.
    client
        .batch_execute("CREATE SCHEMA t_stranger_x_1_0123456789")
        .await
        .unwrap();

    let kept = pgtenant::admin::sweep(&mut client, &SweepOptions::default(), |_, _| {})
        .await
        .unwrap();
    assert_eq!(kept.masked, vec![first_schema.clone()]);
    assert_eq!(kept.swept, vec![first_schema.clone()]);
    assert_eq!(kept.kept, 1, "the trash is within retention");
    assert_eq!(kept.unknown, vec!["t_stranger_x_1_0123456789".to_owned()]);
    let expired = pgtenant::admin::sweep(
        &mut client,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(expired.swept, vec![format!("trash_{first_schema}")]);
    let exists = |schema: String| {
        let client = &client;
        async move {
            client
                .query_one("SELECT to_regnamespace($1) IS NOT NULL", &[&schema])
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    assert!(
        exists(live.schema().to_owned()).await,
        "the live schema is untouched"
    );
    assert!(
        exists("t_stranger_x_1_0123456789".to_owned()).await,
        "unknown schemas are left alone"
    );
    assert!(!exists(first_schema.clone()).await && !exists(format!("trash_{first_schema}")).await);
    let trash = pgtenant::admin::list_trash(&client).await.unwrap();
    assert!(trash[0].swept_at.is_some());
    assert_eq!(
        expired.history_pruned, 0,
        "the journal is within its retention"
    );

    // The journal is pruned by age.
    let mut prune = SweepOptions::default();
    prune.history_retention = Duration::ZERO;
    let pruned = pgtenant::admin::sweep(&mut client, &prune, |_, _| {})
        .await
        .unwrap();
    assert!(pruned.history_pruned > 0);
    let left: i64 = client
        .query_one("SELECT count(*) FROM pgtenant.history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    router.close().await;
}

#[tokio::test]
async fn a_sweep_stopped_mid_way_is_finished_by_the_next() {
    let (db, mut client) = database().await;
    let router = support::router(db.url(), "resumer").await;
    let handle = router.open_or_create(&tenant("many")).await.unwrap();
    let schema = handle.schema().to_owned();
    let ddl: String = (0..100)
        .map(|i| format!("CREATE TABLE {schema}.t{i} (id int PRIMARY KEY, v text);"))
        .collect();
    client.batch_execute(&ddl).await.unwrap();
    handle.forget(ActiveWork::Drain).await.unwrap();
    let trashed = format!("trash_{schema}");

    let (first_batch_tx, first_batch) = tokio::sync::oneshot::channel();
    let sweep_url = db.url().to_owned();
    let task = tokio::spawn(async move {
        let (mut own, connection) = tokio_postgres::connect(&sweep_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut signal = Some(first_batch_tx);
        let mut options = SweepOptions::with_retention(Duration::ZERO);
        options.objects_per_transaction = 10;
        let _ = pgtenant::admin::sweep(&mut own, &options, move |_, dropped| {
            if dropped > 0 {
                if let Some(signal) = signal.take() {
                    let _ = signal.send(());
                }
            }
        })
        .await;
    });
    first_batch.await.unwrap();
    task.abort(); // stopped between two transactions, as a killed sweeper would be
    let _ = task.await;
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relkind = 'r'",
            &[&trashed],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        left > 0 && left < 100,
        "stopped part way: {left} tables left"
    );
    let report = pgtenant::admin::sweep(
        &mut client,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(report.swept, vec![trashed.clone()]);
    let gone: bool = client
        .query_one("SELECT to_regnamespace($1) IS NULL", &[&trashed])
        .await
        .unwrap()
        .get(0);
    assert!(gone);
    router.close().await;
}

/// 2 000 tables of 4 relations each need more lock slots than a default cluster has: one DROP
/// SCHEMA … CASCADE fails with "out of shared memory"; the sweep succeeds. Run on the test
/// kit's own cluster, because exhausting the lock table hurts every session on the server.
#[tokio::test]
async fn the_sweep_drops_a_2000_table_schema_under_default_lock_limits() {
    // PostgreSQL's defaults (the test kit raises max_connections, which enlarges the lock table).
    let cluster =
        pgtenant_testkit::LocalCluster::start_with_settings(&[("max_connections", "100")])
            .await
            .expect("throwaway cluster");
    let db = cluster.create_database().await.unwrap();
    let mut client = db.connect().await.unwrap();
    pgtenant::setup(&mut client).await.unwrap();
    for (setting, default) in [
        ("max_locks_per_transaction", "64"),
        ("max_connections", "100"),
    ] {
        let value: String = client
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(value, default, "default lock limits");
    }
    let router = support::router(db.url(), "big").await;
    let handle = router.open_or_create(&tenant("big")).await.unwrap();
    let schema = handle.schema().to_owned();
    for batch in 0..20 {
        let ddl: String = (0..100)
            .map(|i| {
                format!(
                    "CREATE TABLE {schema}.t{} (id int PRIMARY KEY, v text);",
                    batch * 100 + i
                )
            })
            .collect();
        client
            .batch_execute(&format!("BEGIN; {ddl} COMMIT;"))
            .await
            .unwrap();
    }
    handle.forget(ActiveWork::Drain).await.unwrap();
    let trashed = format!("trash_{schema}");
    let error = client
        .batch_execute(&format!("BEGIN; DROP SCHEMA {trashed} CASCADE; COMMIT;"))
        .await
        .expect_err("one DROP SCHEMA CASCADE exhausts the lock table");
    assert_eq!(error.code().map(|c| c.code()), Some("53200"), "{error:?}");
    let _ = client.batch_execute("ROLLBACK").await;
    let mut reported = Vec::new();
    let report = pgtenant::admin::sweep(
        &mut client,
        &SweepOptions::with_retention(Duration::ZERO),
        |schema, dropped| reported.push((schema.to_owned(), dropped)),
    )
    .await
    .unwrap();
    assert_eq!(report.swept, vec![trashed]);
    // One report per transaction, each count once: 20 objects at a time up to 2 000.
    let counts: Vec<usize> = reported.iter().map(|(_, n)| *n).collect();
    assert_eq!(counts, (1..=100).map(|i| i * 20).collect::<Vec<_>>());
    router.close().await;
}

#[tokio::test]
async fn listing_pages_and_filters_and_refuses_hostile_filters() {
    let (db, client) = database().await;
    let router = router_with(db.url(), "lister", &[V1]).await;
    for i in 0..5 {
        router
            .open_or_create(&tenant(&format!("list-{i}")))
            .await
            .unwrap();
    }
    router
        .open_or_create(&tenant("list-free"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut query = TenantQuery::default();
    query.limit = 4;
    let page = pgtenant::admin::list_tenants(&client, &query)
        .await
        .unwrap();
    assert_eq!(page.len(), 4);
    query.after = Some(page[3].tenant.clone());
    let rest = pgtenant::admin::list_tenants(&client, &query)
        .await
        .unwrap();
    assert_eq!(rest.len(), 2, "keyset paging continues after the last key");
    let mut held = TenantQuery::default();
    held.owner = Some(support::replica("lister"));
    held.state = Some(pgtenant::TenantState::Held);
    assert_eq!(
        pgtenant::admin::list_tenants(&client, &held)
            .await
            .unwrap()
            .len(),
        5
    );
    let mut behind = TenantQuery::default();
    behind.behind = Some(SchemaVersion::new(2));
    assert_eq!(
        pgtenant::admin::list_tenants(&client, &behind)
            .await
            .unwrap()
            .len(),
        6
    );
    let one = pgtenant::admin::show_tenant(&client, &tenant("list-free"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (one.state.as_str(), one.version, one.owner),
        ("free", SchemaVersion::new(1), None)
    );
    assert!(pgtenant::admin::show_tenant(&client, &tenant("never"))
        .await
        .unwrap()
        .is_none());

    for (field, value) in [
        ("state", "held'; DROP TABLE x; --"),
        ("owner", "bad owner!"),
        ("after", "acme/x'; --"),
    ] {
        // Typed filters refuse hostile text where it becomes a filter.
        let refused = match field {
            "state" => value.parse::<pgtenant::TenantState>().err(),
            "after" => TenantId::parse(value).err(),
            // The owner filter is a ReplicaId: checked where it is made.
            _ => pgtenant::ReplicaId::new(value).map_err(Error::from).err(),
        };
        match refused {
            Some(Error::InvalidOption { .. } | Error::InvalidTenantId(_)) => {}
            other => panic!("{field}: expected a typed refusal, got {other:?}"),
        }
    }
    router.close().await;
}

#[tokio::test]
async fn close_waits_for_a_forget_under_way() {
    let (db, _client) = database().await;
    let router = std::sync::Arc::new(
        Router::start(options(db.url(), "closer").drain_timeout(Duration::from_secs(10)))
            .await
            .unwrap(),
    );
    let id = tenant("closing-forget");
    let handle = router.open_or_create(&id).await.unwrap();
    let (release, work) = support::hold_work(&handle).await;
    let mut events = router.subscribe();
    let forgetting = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.forget(ActiveWork::Drain).await })
    };
    // The forget is under way (draining) before close begins.
    while router.summary().draining == 0 {
        tokio::task::yield_now().await;
    }
    let closing = {
        let router = router.clone();
        tokio::spawn(async move { router.close().await })
    };
    release.send(()).unwrap();
    work.await.unwrap().unwrap();
    forgetting.await.unwrap().expect("forgotten");
    let report = closing.await.unwrap();
    assert_eq!(report.forgotten.len(), 1, "{report:?}");
    assert!(
        report.failed.is_empty() && report.handed_off.is_empty(),
        "{report:?}"
    );
    loop {
        if let Event::Forgotten { tenant, .. } = events.recv().await.unwrap() {
            assert_eq!(tenant, id.key());
            break;
        }
    }
}

/// A creation whose CREATE SCHEMA fails leaves nothing behind: no tenant row, no epoch
/// bump, no schema (acquisition and creation are one transaction).
#[tokio::test]
async fn a_failed_create_schema_leaves_nothing_behind() {
    let (db, client) = database().await;
    client
        .batch_execute(
            "CREATE FUNCTION refuse_schemas() RETURNS event_trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'no new schemas today'; END $$;
             CREATE EVENT TRIGGER refuse_schemas ON ddl_command_start
                 WHEN TAG IN ('CREATE SCHEMA') EXECUTE FUNCTION refuse_schemas();",
        )
        .await
        .unwrap();
    let router = router_with(db.url(), "creator", &[V1]).await;
    let id = tenant("refused");
    let error = router.open_or_create(&id).await.expect_err("refused");
    assert!(
        error.to_string().contains("no new schemas today"),
        "{error}"
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtenant.tenants WHERE key = $1",
            id.key()
        )
        .await,
        0,
        "no tenant row"
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtenant.history WHERE tenant_key = $1",
            id.key()
        )
        .await,
        0,
        "nothing journaled"
    );
    client
        .batch_execute("DROP EVENT TRIGGER refuse_schemas")
        .await
        .unwrap();
    let created = router.open_or_create(&id).await.expect("created now");
    assert_eq!(created.epoch(), 1, "the failed attempt used no epoch");
    router.close().await;
}

/// Creation never fails on a name collision: when the derived name is taken (here by a
/// schema made under it on purpose, as a crafted 40-bit hash collision would), the next
/// salted name is used, and the sweep still attributes it to its tenant.
#[tokio::test]
async fn creation_survives_a_taken_schema_name() {
    let (db, client) = database().await;
    let id = tenant("collided");
    let taken = id.schema_name(1);
    client
        .batch_execute(&format!("CREATE SCHEMA {taken}"))
        .await
        .unwrap();
    let router = router_with(db.url(), "collider", &[V1]).await;
    let handle = router.open_or_create(&id).await.expect("created anyway");
    assert_ne!(handle.schema(), taken);
    assert!(
        handle.schema().starts_with("t_acme__collided_1_"),
        "{}",
        handle.schema()
    );
    let mut client = client;
    let forgotten = handle.forget(ActiveWork::Refuse).await.expect("forget");
    router.close().await;
    let report = pgtenant::admin::sweep(
        &mut client,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .unwrap();
    // Both names derive from this tenant's forgotten life: the trashed one goes, and so does
    // the squatter, which is masked (an orphan of a forgotten epoch).
    assert_eq!(report.swept, vec![forgotten, taken.clone()]);
    assert_eq!(report.masked, vec![taken]);
    assert!(report.refused.is_empty(), "{report:?}");
}

/// The sweep prunes replicas that ended long ago and that no tenant names.
#[tokio::test]
async fn the_sweep_prunes_ended_replicas() {
    let (db, mut client) = database().await;
    let router = router_with(db.url(), "ended", &[]).await;
    router.close().await;
    let live = router_with(db.url(), "running", &[]).await;
    client
        .batch_execute(
            "UPDATE pgtenant.replicas SET released_at = now() - interval '30 days'
              WHERE replica_id = 'ended'",
        )
        .await
        .unwrap();
    let report = pgtenant::admin::sweep(&mut client, &SweepOptions::default(), |_, _| {})
        .await
        .unwrap();
    assert_eq!(report.replicas_pruned, 1, "{report:?}");
    let left: Vec<String> = client
        .query("SELECT replica_id FROM pgtenant.replicas ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec!["running".to_owned()]);
    live.close().await;
}

/// Issue 26, item 5: a restore is whole or refused. The sweep drops a trashed schema table by
/// table in small transactions and may stop between two (here the second table is locked, so
/// its drop times out and the schema is deferred); the first drop's transaction marked the
/// trash row, so restore refuses it, saying what to do, and changes nothing. The next sweep
/// finishes the schema, and then there is nothing to restore.
#[tokio::test]
async fn a_half_swept_schema_is_not_restored() {
    let (db, mut client) = database().await;
    let router = support::router(db.url(), "half").await;
    let id = tenant("half");
    let handle = router.open_or_create(&id).await.unwrap();
    let schema = handle.schema().to_owned();
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.a_first (id int); CREATE TABLE {schema}.b_second (id int);
             INSERT INTO {schema}.b_second VALUES (1)"
        ))
        .await
        .unwrap();
    let trashed = handle.forget(ActiveWork::Drain).await.unwrap();
    let forgotten: (i64, i64) = {
        let row = client
            .query_one(
                "SELECT epoch, forgotten_at_epoch FROM pgtenant.tenants WHERE key = $1",
                &[&id.key()],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };

    // A session that uses b_second: the sweep's drop of it waits, then gives up.
    let mut reader = db.connect().await.unwrap();
    let holding = reader.transaction().await.unwrap();
    holding
        .batch_execute(&format!(
            "LOCK TABLE {trashed}.b_second IN ACCESS SHARE MODE"
        ))
        .await
        .unwrap();
    let mut options = SweepOptions::with_retention(Duration::ZERO);
    options.objects_per_transaction = 1;
    options.lock_timeout = Duration::from_millis(200);
    let report = pgtenant::admin::sweep(&mut client, &options, |_, _| {})
        .await
        .unwrap();
    assert_eq!(
        report.deferred.iter().map(|(s, _)| s).collect::<Vec<_>>(),
        vec![&trashed],
        "{report:?}"
    );
    assert_eq!(
        tables_in(&client, &trashed).await,
        BTreeSet::from(["b_second".to_owned()])
    );
    let listed = pgtenant::admin::list_trash(&client).await.unwrap();
    assert!(
        listed
            .iter()
            .any(|t| t.schema == trashed && t.sweep_started_at.is_some() && t.swept_at.is_none()),
        "{listed:?}"
    );

    match router.restore(&id).await {
        Err(Error::RestoreRefused { reason, .. }) => assert!(
            reason.contains("being swept") && reason.contains("Let the sweep finish"),
            "{reason}"
        ),
        Err(other) => panic!("expected RestoreRefused, got {other}"),
        Ok(restored) => panic!(
            "restored {} with tables {:?}",
            restored.schema(),
            tables_in(&client, restored.schema()).await
        ),
    }
    // Nothing changed: still forgotten at the same epoch, the schema still in the trash.
    let row = client
        .query_one(
            "SELECT t.epoch, t.forgotten_at_epoch, t.schema_name IS NULL,
                    (SELECT count(*) FROM pgtenant.trash x WHERE x.schema_name = $2 AND x.swept_at IS NULL),
                    (SELECT count(*) FROM pgtenant.history h WHERE h.tenant_key = t.key AND h.event = 'restored')
               FROM pgtenant.tenants t WHERE t.key = $1",
            &[&id.key(), &trashed],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            row.get::<_, bool>(2),
            row.get::<_, i64>(3),
            row.get::<_, i64>(4)
        ),
        (forgotten, true, 1, 0)
    );
    assert_eq!(
        tables_in(&client, &trashed).await,
        BTreeSet::from(["b_second".to_owned()])
    );

    holding.rollback().await.unwrap();
    let report = pgtenant::admin::sweep(&mut client, &options, |_, _| {})
        .await
        .unwrap();
    assert_eq!(report.swept, vec![trashed], "{report:?}");
    match router.restore(&id).await {
        Err(Error::RestoreRefused { reason, .. }) => {
            assert!(reason.contains("nothing in the trash"), "{reason}")
        }
        other => panic!(
            "expected RestoreRefused, got {:?}",
            other.map(|h| h.epoch())
        ),
    }
    router.close().await;
}
