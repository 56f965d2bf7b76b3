//! pgtenant on Citus schema-based sharding (issue #13), on a real cluster: a coordinator and two
//! workers from the test kit ([`Source::Citus`]). Each test skips with one line when Citus is
//! not installed (`PGTENANT_REQUIRE_CITUS=1` makes that a failure, as in CI).
//!
//! The whole G1–G5 suites (`tests/leases.rs`, `tests/takeover.rs`, `tests/ledgers.rs`) also run
//! on Citus with `PGTENANT_TESTKIT=citus`; this file holds what is Citus's own: where the
//! control plane and the tenant schemas live, atomic creation across nodes, forget/restore/
//! sweep of distributed schemas, the history checker under kills and pauses on the cluster,
//! `citus_schema_move` under write load, and issue #15's reply check where Citus reports every
//! `search_path` change.

mod support;

use std::time::{Duration, Instant};

use pgtenant::admin::SweepOptions;
use pgtenant::{ActiveWork, Error, Router};
use pgtenant_testkit::{skip_without_citus, Source, TestDatabase};
use support::{
    append, check_all, count_rows, create_log, options, router, run_history, take_over, tenant,
    Faults,
};

const CHILD: &str = "replica_child";

/// Entry point of the replica child processes (does nothing when run as a plain test).
#[test]
#[ignore = "entry point of the replica child processes"]
fn replica_child() {
    support::child_main();
}

/// A fresh database on the shared Citus cluster, with the control plane; None (after one
/// printed line) when Citus is not installed.
async fn citus_database(test: &str) -> Option<(TestDatabase, tokio_postgres::Client)> {
    if skip_without_citus(test) {
        return None;
    }
    let db = TestDatabase::create_from(Source::Citus)
        .await
        .expect("a database on the Citus cluster");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup on Citus");
    Some((db, client))
}

/// The URL of `db` for a session whose `citus.enable_schema_based_sharding` is on, as a user's
/// session may be: pgtenant must not follow it for its own schema.
fn sharding_on_url(db: &TestDatabase) -> String {
    format!(
        "{}?options=-c%20citus.enable_schema_based_sharding%3Don",
        db.url()
    )
}

async fn one_i64(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// How many schemas named like `pattern` (LIKE) each worker has.
async fn on_workers(client: &tokio_postgres::Client, pattern: &str) -> Vec<i64> {
    client
        .query(
            "SELECT result::bigint FROM run_command_on_workers(
                 format('SELECT count(*) FROM pg_namespace WHERE nspname LIKE %L', $1::text))",
            &[&pattern],
        )
        .await
        .expect("run_command_on_workers")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn is_distributed_schema(client: &tokio_postgres::Client, schema: &str) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_schema WHERE schemaid::regnamespace::text = $1)",
            &[&schema],
        )
        .await
        .expect("pg_dist_schema")
        .get(0)
}

/// The worker port holding `schema`'s shards.
async fn placement(client: &tokio_postgres::Client, schema: &str) -> i32 {
    client
        .query_one(
            "SELECT DISTINCT nodeport FROM citus_shards
              WHERE citus_table_type = 'schema' AND table_name::text LIKE $1 || '.%'",
            &[&schema],
        )
        .await
        .expect("one placement for the schema's shards")
        .get(0)
}

/// Setup, from sessions whose sharding setting is on, concurrently and again: the control plane
/// is one local schema on the coordinator — not a distributed schema, no Citus table in it,
/// nothing of it on the workers or in Citus's distributed objects.
#[tokio::test]
async fn setup_keeps_the_control_plane_local_whatever_the_sharding_setting_concurrently_and_again()
{
    let Some((db, client)) =
        citus_database("setup_keeps_the_control_plane_local_whatever_the_sharding_setting").await
    else {
        return;
    };
    client
        .batch_execute("DROP SCHEMA pgtenant CASCADE")
        .await
        .expect("start from nothing");
    let url = sharding_on_url(&db);
    let setups = (0..6).map(|_| pgtenant::setup_url(&url)).collect();
    let reports = support::join_all(setups).await;
    let applied: usize = reports
        .iter()
        .map(|report| report.as_ref().expect("setup on Citus").applied.len())
        .filter(|&n| n > 0)
        .count();
    assert_eq!(
        applied, 1,
        "exactly one of the concurrent setups applied the migrations"
    );
    let again = pgtenant::setup_url(&url).await.expect("setup again");
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(
        again.version,
        pgtenant::admin::control_plane_version(&client)
            .await
            .unwrap()
    );

    let sharding_on: String = {
        let (session, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect with sharding on");
        tokio::spawn(connection);
        session
            .query_one("SHOW citus.enable_schema_based_sharding", &[])
            .await
            .unwrap()
            .get(0)
    };
    assert_eq!(sharding_on, "on", "the sessions really had sharding on");
    assert!(!is_distributed_schema(&client, "pgtenant").await);
    assert_eq!(
        one_i64(
            &client,
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE 'pgtenant.%'"
        )
        .await,
        0,
        "no control-plane table is a Citus table"
    );
    assert_eq!(
        one_i64(
            &client,
            "SELECT count(*) FROM pg_dist_object WHERE classid = 'pg_namespace'::regclass
                AND objid = 'pgtenant'::regnamespace"
        )
        .await,
        0,
        "the control plane is not a distributed object"
    );
    assert_eq!(on_workers(&client, "pgtenant").await, vec![0, 0]);
    // And it works: a replica registers and leases through it.
    let router = router(db.url(), "setup-check").await;
    router
        .open_or_create(&tenant("after-setup"))
        .await
        .expect("open");
    router.close().await;
}

/// A control plane an earlier setup left as a distributed schema (sharding on, before this
/// release) is made local again by setup.
#[tokio::test]
async fn setup_makes_a_distributed_control_plane_local_again() {
    let Some((db, client)) =
        citus_database("setup_makes_a_distributed_control_plane_local_again").await
    else {
        return;
    };
    client
        .batch_execute(
            "DROP SCHEMA pgtenant CASCADE;
             SET citus.enable_schema_based_sharding = on;
             CREATE SCHEMA pgtenant;
             CREATE TABLE pgtenant.leftover (id int);
             RESET citus.enable_schema_based_sharding",
        )
        .await
        .expect("a distributed control-plane schema");
    assert!(is_distributed_schema(&client, "pgtenant").await);
    pgtenant::setup_url(db.url())
        .await
        .expect("setup repairs it");
    assert!(!is_distributed_schema(&client, "pgtenant").await);
    assert_eq!(
        one_i64(
            &client,
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE 'pgtenant.%'"
        )
        .await,
        0
    );
    let router = router(db.url(), "repaired").await;
    router
        .open_or_create(&tenant("repaired"))
        .await
        .expect("open");
    router.close().await;
}

/// Tenant migrations of several statements each, one of them `CREATE INDEX` (which Citus
/// propagates as the client's text, so a multi-statement text fails there).
const MIGRATIONS: [(&str, &str); 2] = [
    (
        "V1__accounts",
        "CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL DEFAULT 'a;b');
         CREATE INDEX accounts_name ON accounts (name);
         COMMENT ON TABLE accounts IS 'one; two'",
    ),
    (
        "V2__entries",
        "CREATE TABLE entries (account bigint REFERENCES accounts, amount bigint);
         CREATE INDEX entries_account ON entries (account);
         INSERT INTO accounts VALUES (1, $$opening; balance$$)",
    ),
];

/// By default on Citus, a new tenant's schema is a distributed schema (its tables on one
/// worker), made with its migrations in one transaction; a failing migration quarantines the
/// tenant and leaves no schema on any node. Off by option, the schema stays on the coordinator
/// even from a session with sharding on.
#[tokio::test]
async fn tenant_schemas_are_distributed_and_creation_with_migrations_is_atomic() {
    let Some((db, client)) =
        citus_database("tenant_schemas_are_distributed_and_creation_with_migrations_is_atomic")
            .await
    else {
        return;
    };
    let router = Router::start(
        options(db.url(), "distributed")
            .tenant_migrations(MIGRATIONS)
            .unwrap(),
    )
    .await
    .unwrap();
    let handle = router
        .open_or_create(&tenant("dist"))
        .await
        .expect("create");
    let schema = handle.schema().to_owned();
    assert!(is_distributed_schema(&client, &schema).await, "{schema}");
    let tables = one_i64(
        &client,
        &format!(
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE '{schema}.%'"
        ),
    )
    .await;
    assert_eq!(
        tables, 3,
        "accounts, entries and the migration history are distributed"
    );
    assert_eq!(
        count_rows(&handle, "SELECT count(*) FROM accounts").await,
        1,
        "the migrations ran"
    );
    // Fenced writes commit with one-phase commit: Citus commits the worker's transaction
    // before the coordinator's own commit, which releases the fence lock, so an acquisition
    // that moves the epoch waits for the worker's commit (README "Citus"). Two-phase commits
    // leave a row each in pg_dist_transaction until recovery; these leave none.
    let two_phase = "SELECT count(*) FROM pg_dist_transaction";
    let before = one_i64(&client, two_phase).await;
    for id in 2..22_i64 {
        handle
            .run(move |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO accounts VALUES ($1, 'x')", &[&id])
                        .await?;
                    Ok::<_, Error>(())
                })
            })
            .await
            .expect("fenced write");
    }
    let after = one_i64(&client, two_phase).await;
    // (Recovery may remove earlier records meanwhile, never add any.)
    assert!(
        after <= before,
        "fenced writes used two-phase commit: {before} -> {after} records"
    );

    // A creation whose second migration fails: quarantined, nothing left on any node.
    let failing = Router::start(
        options(db.url(), "failing")
            .tenant_migrations([
                MIGRATIONS[0],
                ("V2__broken", "CREATE TABLE fine (id int); SELECT 1 / 0"),
            ])
            .unwrap(),
    )
    .await
    .unwrap();
    let broken = tenant("broken");
    let error = failing.open_or_create(&broken).await.expect_err("fails");
    assert!(matches!(error, Error::Quarantined { .. }), "{error}");
    let pattern = format!("t_{}__{}%", broken.organization(), broken.ledger());
    assert_eq!(
        one_i64(
            &client,
            &format!("SELECT count(*) FROM pg_namespace WHERE nspname LIKE '{pattern}'")
        )
        .await,
        0,
        "no schema on the coordinator"
    );
    assert_eq!(
        on_workers(&client, &pattern).await,
        vec![0, 0],
        "nor on a worker"
    );
    assert_eq!(
        one_i64(
            &client,
            &format!(
                "SELECT count(*) FROM pg_dist_schema WHERE schemaid::regnamespace::text LIKE '{pattern}'"
            )
        )
        .await,
        0
    );
    failing.close().await;

    // distributed_schemas(false): local, whatever the session says.
    let local = Router::start(
        pgtenant::RouterOptions::from_url("local", &sharding_on_url(&db))
            .unwrap()
            .ttl(support::TTL)
            .margin(Duration::from_millis(400))
            .heartbeat_period(Duration::from_millis(300))
            .distributed_schemas(false)
            .tenant_migrations(MIGRATIONS)
            .unwrap(),
    )
    .await
    .unwrap();
    let kept = local.open_or_create(&tenant("kept")).await.expect("create");
    assert!(!is_distributed_schema(&client, kept.schema()).await);
    assert_eq!(
        one_i64(
            &client,
            &format!(
                "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE '{}.%'",
                kept.schema()
            )
        )
        .await,
        0,
        "its tables are plain local tables"
    );
    local.close().await;
    router.close().await;
}

/// On plain PostgreSQL, asking for distributed schemas is refused at start.
#[tokio::test]
async fn distributed_schemas_without_citus_is_refused() {
    let (db, _client) = support::database().await;
    let error = Router::start(options(db.url(), "no-citus").distributed_schemas(true))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            error,
            Error::InvalidOption {
                option: "distributed_schemas",
                ..
            }
        ),
        "{error}"
    );
}

/// Forget renames a distributed schema into the trash (still distributed, data kept); the old
/// handle can no longer commit (G5); a new life sees nothing; restore brings the data back; the
/// sweep drops a trashed distributed schema from every node.
#[tokio::test]
async fn forget_restore_and_sweep_work_on_distributed_schemas() {
    let Some((db, mut client)) =
        citus_database("forget_restore_and_sweep_work_on_distributed_schemas").await
    else {
        return;
    };
    let router = router(db.url(), "ledgers").await;
    let id = tenant("forgettable");
    let handle = router.open_or_create(&id).await.unwrap();
    create_log(&handle).await;
    append(&handle, "ledgers", 1).await.unwrap();
    let live = handle.schema().to_owned();
    assert!(is_distributed_schema(&client, &live).await);
    let trashed = handle.forget(ActiveWork::Refuse).await.expect("forget");
    assert!(is_distributed_schema(&client, &trashed).await, "{trashed}");
    assert!(!is_distributed_schema(&client, &live).await);
    let late = append(&handle, "ledgers", 2).await;
    assert!(late.is_err(), "a forgotten tenant's handle commits nothing");

    let restored = router.restore(&id).await.expect("restore");
    assert!(is_distributed_schema(&client, restored.schema()).await);
    assert_eq!(
        count_rows(&restored, "SELECT count(*) FROM log").await,
        1,
        "the data came back"
    );
    append(&restored, "ledgers", 3).await.expect("writes again");

    // Forgotten again, then swept with no retention: gone from every node.
    let trashed = restored.forget(ActiveWork::Refuse).await.expect("forget");
    let fresh = router.open_or_create(&id).await.expect("a new life");
    assert_eq!(
        count_rows(
            &fresh,
            "SELECT count(*) FROM pg_tables WHERE tablename = 'log' AND schemaname = current_schema()"
        )
        .await,
        0,
        "a new life sees nothing"
    );
    let report = pgtenant::admin::sweep(
        &mut client,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep");
    assert!(report.swept.contains(&trashed), "{report:?}");
    assert!(!is_distributed_schema(&client, &trashed).await);
    assert_eq!(on_workers(&client, &trashed).await, vec![0, 0]);
    router.close().await;
}

/// G1–G4 and G9 on the cluster: replica processes append (tenant, epoch, seq) rows to
/// distributed tables while they are killed and respawned under the same ids, paused, and their
/// sessions terminated, at random. Afterwards no row was committed under an epoch lower than
/// one already committed for its tenant (G1, G3), every acknowledged row is there (G4), the
/// epochs each tenant was opened at only grew (G2), and the fleet served again (G9).
#[tokio::test]
async fn history_checker_under_kills_and_pauses_on_citus() {
    let Some((db, client)) =
        citus_database("history_checker_under_kills_and_pauses_on_citus").await
    else {
        return;
    };
    let names = ["cit-0", "cit-1", "cit-2"];
    let ledgers = ["cit-a", "cit-b"];
    let faults = Faults {
        terminate: true,
        ..Faults::default()
    };
    let history = run_history(
        CHILD,
        db.url(),
        &names,
        &ledgers,
        0x2545_f491_4f6c_dd1d,
        &faults,
    )
    .await;
    history.assert_live(&names, &ledgers);
    // The run terminated every data connection of the database now and then, this test's own
    // session among them.
    drop(client);
    let client = db.connect().await.expect("connect again");
    let checker = router(db.url(), "cit-checker").await;
    for ledger in ledgers {
        let handle = take_over(&checker, &tenant(ledger), Duration::from_secs(30)).await;
        assert!(is_distributed_schema(&client, handle.schema()).await);
        let epochs = history.opened.get(ledger).cloned().unwrap_or_default();
        assert!(
            handle.epoch().get() > epochs.last().copied().unwrap_or(0),
            "{ledger}: the checker's epoch is above every earlier one"
        );
    }
    checker.close().await;
    let total = check_all(&history, db.url(), "cit-verifier", &names, &ledgers).await;
    assert!(
        total > 0 && history.kills + history.pauses > 0,
        "the run exercised writes and faults"
    );
}

/// `citus_schema_move` (online, by logical replication) of a leased tenant's schema between the
/// workers, three times, while its owner writes without pause: every acknowledged write is
/// there, none committed under a stale epoch, the lease (epoch, owner, serving handle) is
/// untouched, and afterwards the fence still refuses a superseded owner on the new placement.
///
/// The nodes run with `synchronous_commit = on` (the test kit's Citus default): with it off on
/// the workers, Citus's move itself loses commits acknowledged just before its cut-over, for
/// any client (measured with plain tokio-postgres inserts: 23–37 rows lost in 6 moves), and so
/// did this test now and then.
#[tokio::test]
async fn a_schema_move_under_write_load_loses_nothing_and_leaves_the_lease_alone() {
    const MOVES: usize = 3;
    let Some((db, client)) =
        citus_database("a_schema_move_under_write_load_loses_nothing_and_leaves_the_lease_alone")
            .await
    else {
        return;
    };
    let owner = router(db.url(), "mover").await;
    let id = tenant("moving");
    let handle = owner.open_or_create(&id).await.unwrap();
    create_log(&handle).await;
    let schema = handle.schema().to_owned();
    let epoch = handle.epoch();
    let first = placement(&client, &schema).await;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let writer = {
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut failures = Vec::new();
            let mut seq = 0;
            loop {
                if stopped.try_recv().is_ok() {
                    break;
                }
                seq += 1;
                match append(&handle, "mover", seq).await {
                    Ok(()) => acked.push(seq),
                    Err(error) => failures.push(error.to_string()),
                }
            }
            (acked, failures)
        })
    };
    // Writes are flowing before the move starts.
    while count_rows(&handle, "SELECT count(*) FROM log").await < 20 {
        tokio::task::yield_now().await;
    }
    // There and back again, and there once more: three moves under load.
    let mut move_times = Vec::new();
    let mut to = first;
    for _ in 0..MOVES {
        let from = placement(&client, &schema).await;
        to = client
            .query_one(
                "SELECT nodeport FROM pg_dist_node
                  WHERE shouldhaveshards AND noderole = 'primary' AND nodeport <> $1
                  ORDER BY nodeport LIMIT 1",
                &[&from],
            )
            .await
            .expect("another worker")
            .get(0);
        let moved_at = Instant::now();
        client
            .execute(
                "SELECT citus_schema_move($1::text::regnamespace, '127.0.0.1'::text, $2::int)",
                &[&schema, &to],
            )
            .await
            .expect("citus_schema_move");
        move_times.push(moved_at.elapsed());
        // Writes keep flowing after each move.
        let after_move = count_rows(&handle, "SELECT count(*) FROM log").await;
        while count_rows(&handle, "SELECT count(*) FROM log").await < after_move + 20 {
            tokio::task::yield_now().await;
        }
    }
    let _ = stop.send(());
    let (acked, failures) = writer.await.unwrap();
    assert_eq!(placement(&client, &schema).await, to, "the schema moved");
    assert_ne!(to, first);
    assert!(
        failures.is_empty(),
        "writes failed during the move: {failures:?}"
    );
    assert_eq!(handle.epoch(), epoch, "the lease did not move");
    assert!(handle.is_serving());
    let (row_epoch, row_owner): (i64, Option<String>) = {
        let row = client
            .query_one(
                "SELECT epoch, owner FROM pgtenant.tenants WHERE key = $1",
                &[&id.key()],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (row_epoch, row_owner.as_deref()),
        (epoch.get(), Some("mover"))
    );
    let present = support::log_seqs(&handle).await;
    let missing: Vec<_> = acked.iter().filter(|seq| !present.contains(seq)).collect();
    if !missing.is_empty() {
        // Where did they go? The old placement's shard is dropped only later (deferred).
        let by_node: Vec<String> = client
            .query(
                "SELECT nodeport::text || ': ' || coalesce(result, '') FROM run_command_on_workers(
                     format('SELECT string_agg(seq::text, '','' ORDER BY seq) FROM %s.log_%s
                              WHERE seq > (SELECT max(seq) - 40 FROM %s.log_%s)',
                            $1::text, (SELECT shardid FROM pg_dist_shard
                                        WHERE logicalrelid = ($1::text || '.log')::regclass),
                            $1::text, (SELECT shardid FROM pg_dist_shard
                                        WHERE logicalrelid = ($1::text || '.log')::regclass)))",
                &[&schema],
            )
            .await
            .map(|rows| rows.iter().map(|r| r.get(0)).collect())
            .unwrap_or_else(|e| vec![format!("{e:?}")]);
        println!("the last rows of each placement: {by_node:?}");
    }
    assert!(
        missing.is_empty(),
        "acknowledged but missing after the move: {missing:?} of {} acknowledged, {} present",
        acked.len(),
        present.len()
    );
    assert_eq!(
        count_rows(
            &handle,
            "SELECT count(*) FROM log WHERE seen_max_epoch > epoch"
        )
        .await,
        0
    );
    println!(
        "{MOVES} citus_schema_move under load took {move_times:?}; {} writes acknowledged",
        acked.len()
    );

    // The fence still holds on the new placement: a takeover refuses the superseded owner.
    let successor = router(db.url(), "successor").await;
    owner.close().await;
    let next = take_over(&successor, &id, Duration::from_secs(10)).await;
    assert!(next.epoch() > epoch);
    let stale = append(&handle, "mover", -1).await;
    assert!(stale.is_err(), "the superseded handle commits nothing");
    // And in the database itself, past every local check: a transaction under the old epoch
    // that writes the moved table is refused by the coordinator's fence and commits nothing.
    let mut raw = db.connect().await.expect("connect");
    let tx = raw.transaction().await.unwrap();
    let refused = tx
        .query_one("SELECT pgtenant.fence($1, $2)", &[&id.key(), &epoch.get()])
        .await
        .expect_err("a superseded epoch passes no fence");
    assert_eq!(
        refused.code().map(|code| code.code()),
        Some(pgtenant::sqlstate::FENCED)
    );
    drop(tx);
    append(&next, "successor", 1)
        .await
        .expect("the new owner writes");
    assert_eq!(
        count_rows(&next, "SELECT count(*) FROM log WHERE seq = -1").await,
        0
    );
    successor.close().await;
}

/// Issue #15 on Citus, which reports every `search_path` change: the fence's own
/// `set_config('search_path', …)` puts a ParameterStatus inside the fence's reply in every
/// fenced transaction. Thousands of them, two tenants alternating on ONE pooled connection,
/// plain work and work that also changes a reported setting, all within a bound.
#[tokio::test]
async fn thousands_of_fenced_transactions_never_stall_where_citus_reports_search_path() {
    const ROUNDS: usize = 2_000;
    const BOUND: Duration = Duration::from_secs(180);
    let Some((db, _client)) = citus_database(
        "thousands_of_fenced_transactions_never_stall_where_citus_reports_search_path",
    )
    .await
    else {
        return;
    };
    let router = Router::start(options(db.url(), "replies").pool_size(1))
        .await
        .expect("router");
    let handles = [
        router.open_or_create(&tenant("left")).await.expect("left"),
        router
            .open_or_create(&tenant("right"))
            .await
            .expect("right"),
    ];
    for handle in &handles {
        create_log(handle).await;
    }
    let rounds = async {
        for round in 0..ROUNDS {
            let handle = &handles[round % 2];
            let seq = round as i64;
            let result = if round % 3 == 0 {
                let sql = format!(
                    "SET application_name = 'round-{round}';
                     DO $$ BEGIN RAISE NOTICE 'round {round}'; END $$"
                );
                handle
                    .run(move |tx| {
                        Box::pin(async move {
                            tx.batch_execute(&sql).await?;
                            Ok::<_, Error>(())
                        })
                    })
                    .await
            } else {
                append(handle, "replies", seq).await
            };
            result.unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    };
    let started = Instant::now();
    tokio::time::timeout(BOUND, rounds)
        .await
        .expect("a fenced transaction stalled");
    println!(
        "{ROUNDS} fenced transactions on Citus through one connection in {:?}",
        started.elapsed()
    );
    let rows = count_rows(&handles[0], "SELECT count(*) FROM log").await
        + count_rows(&handles[1], "SELECT count(*) FROM log").await;
    assert_eq!(rows, (0..ROUNDS).filter(|r| r % 3 != 0).count() as i64);
    router.close().await;
}
