//! What a fleet operator reads (issue 21, control plane V10): `pgtenant.fleet_status`,
//! `pgtenant.sweep_backlog`, `pgtenant.lease_rows` and the listing built on it, the grouped
//! count of `replica_status`, and the sweep's object listing through pg_depend. Every count is
//! checked against `lease_status`, the definition of a tenant's state.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use pgtenant::admin::{SweepOptions, TenantQuery};
use pgtenant::SchemaVersion;
use pgtenant::{ActiveWork, Error, Router, TenantHandle, TenantState};
use pgtenant_testkit::TestDatabase;
use support::{options, tenant};

/// Tenants in every state lease_status knows, and the routers and sessions that keep them so.
struct Fleet {
    db: TestDatabase,
    admin: tokio_postgres::Client,
    router: Router,
    newer: Router,
    _held: Vec<TenantHandle>,
    /// The hand-registered lease session whose replica is stalled (its lock held).
    _stalled_session: tokio_postgres::Client,
    /// The lease sessions of the sealed (and stalled) replica and the re-registered one.
    _sessions: Vec<tokio_postgres::Client>,
}

const V1: (&str, &str) = (
    "V1__accounts",
    "CREATE TABLE accounts (id bigint PRIMARY KEY)",
);
const V2: (&str, &str) = ("V2__notes", "ALTER TABLE accounts ADD COLUMN note text");

/// held ×2 (router `ops-a`), stalled ×2 (`stalled-r`: lock held, heartbeat expired; `sealed-r`:
/// the same, and sealed), owner_gone ×1 (`gone-r`: its lease session closed),
/// owner_reregistered ×1 (`rereg-r`: alive under the incarnation after the one holding it),
/// free ×2 (one of them at version 2, by router `ops-new`), reserved ×1, quarantined ×1,
/// forgotten ×1 (in the trash).
async fn fleet() -> Fleet {
    let (db, admin) = support::database().await;
    let url = db.url().to_owned();
    let router = Router::start(
        options(&url, "ops-a")
            .tenant_migrations([V1])
            .expect("migrations"),
    )
    .await
    .expect("router a");
    let newer = Router::start(
        options(&url, "ops-new")
            .tenant_migrations([V1, V2])
            .expect("migrations"),
    )
    .await
    .expect("router new");
    let mut held = Vec::new();
    for name in ["held-1", "held-2"] {
        held.push(router.open_or_create(&tenant(name)).await.expect("held"));
    }
    for name in [
        "free-1",
        "reserved-1",
        "quarantined-1",
        "stalled-1",
        "sealed-1",
        "owner-gone-1",
        "rereg-1",
    ] {
        let handle = router.open_or_create(&tenant(name)).await.expect("create");
        handle.release().await.expect("release");
    }
    let at_two = newer
        .open_or_create(&tenant("free-2"))
        .await
        .expect("create at version 2");
    at_two.release().await.expect("release");
    let forgotten = router
        .open_or_create(&tenant("forgotten-1"))
        .await
        .expect("create");
    forgotten.forget(ActiveWork::Refuse).await.expect("forget");

    let stalled_session = db.connect().await.expect("a lease session");
    let (stalled_incarnation, _) = support::register_by_hand(&stalled_session, "stalled-r").await;
    let gone_session = db.connect().await.expect("a lease session");
    let (gone_incarnation, _) = support::register_by_hand(&gone_session, "gone-r").await;
    drop(gone_session);
    // Registered twice on one session: the tenant belongs to the first incarnation.
    let rereg_session = db.connect().await.expect("a lease session");
    let (rereg_incarnation, _) = support::register_by_hand(&rereg_session, "rereg-r").await;
    support::register_by_hand(&rereg_session, "rereg-r").await;
    // Sealed as a takeover under session fencing seals a stalled owner.
    let sealed_session = db.connect().await.expect("a lease session");
    let (sealed_incarnation, secret) = support::register_by_hand(&sealed_session, "sealed-r").await;
    sealed_session
        .execute(
            "SELECT pgtenant.declare_session_fencing('sealed-r', $1, $2)",
            &[&sealed_incarnation, &secret],
        )
        .await
        .expect("declare session fencing");
    admin
        .execute(
            "UPDATE pgtenant.replicas SET expires_at = now() - interval '1 second'
              WHERE replica_id IN ('stalled-r', 'sealed-r')",
            &[],
        )
        .await
        .expect("stall");
    admin
        .execute(
            "SELECT pgtenant.seal_incarnation('sealed-r', $1)",
            &[&sealed_incarnation],
        )
        .await
        .expect("seal");
    for (key, owner, incarnation) in [
        ("acme/stalled-1", "stalled-r", stalled_incarnation),
        ("acme/sealed-1", "sealed-r", sealed_incarnation),
        ("acme/owner-gone-1", "gone-r", gone_incarnation),
        ("acme/rereg-1", "rereg-r", rereg_incarnation),
    ] {
        admin
            .execute(
                "UPDATE pgtenant.tenants SET owner = $2, owner_incarnation = $3 WHERE key = $1",
                &[&key, &owner, &incarnation],
            )
            .await
            .expect("owner by hand");
    }
    admin
        .batch_execute(
            "UPDATE pgtenant.tenants SET reserved_for = 'ops-new', reserved_until = now() + interval '1 hour'
              WHERE key = 'acme/reserved-1';
             UPDATE pgtenant.tenants SET quarantine_cause = 'a migration failed', quarantine_repair = 'fix it',
                    quarantined_at = now()
              WHERE key = 'acme/quarantined-1';",
        )
        .await
        .expect("reserve and quarantine");
    // The lease session of gone-r is closed by now: its lock must be gone before we look.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held: bool = admin
            .query_one(
                "SELECT lock_held FROM pgtenant.replica_liveness WHERE replica_id = 'gone-r'",
                &[],
            )
            .await
            .expect("liveness")
            .get(0);
        if !held {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "gone-r's lock stays");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Fleet {
        db,
        admin,
        router,
        newer,
        _held: held,
        _stalled_session: stalled_session,
        _sessions: vec![sealed_session, rereg_session],
    }
}

/// Tenants per state, by lease_status (the definition).
async fn states_by_lease_status(client: &tokio_postgres::Client) -> BTreeMap<String, i64> {
    client
        .query(
            "SELECT state, count(*) FROM pgtenant.lease_status GROUP BY state",
            &[],
        )
        .await
        .expect("lease_status")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

#[tokio::test]
async fn fleet_status_counts_what_lease_status_says() {
    let fleet = fleet().await;
    let status = pgtenant::admin::fleet_status(&fleet.admin, Duration::from_secs(7 * 86_400))
        .await
        .expect("fleet_status");
    let by_view = states_by_lease_status(&fleet.admin).await;
    for state in TenantState::ALL {
        assert_eq!(
            status.count(state),
            by_view.get(state.as_str()).copied().unwrap_or(0),
            "{state}: {status:#?} against {by_view:?}"
        );
    }
    let expected = [
        (TenantState::Held, 2),
        (TenantState::Stalled, 2),
        (TenantState::OwnerGone, 1),
        (TenantState::OwnerReregistered, 1),
        (TenantState::Free, 2),
        (TenantState::Reserved, 1),
        (TenantState::Quarantined, 1),
        (TenantState::Forgotten, 1),
    ];
    for (state, count) in expected {
        assert_eq!(status.count(state), count, "{state}: {status:#?}");
    }
    assert_eq!(status.tenants, 11);
    assert_eq!(status.live, 10);
    assert_eq!(status.newest_version, Some(SchemaVersion::new(2)));
    // Below version 2 and not quarantined: every live tenant but free-2 and quarantined-1.
    assert_eq!(status.behind, 8, "{status:#?}");
    assert_eq!(
        status.versions,
        BTreeMap::from([(SchemaVersion::new(1), 9), (SchemaVersion::new(2), 1)])
    );
    assert_eq!((status.trashed, status.trash_due), (1, 0));
    assert!(status.oldest_trashed_at.is_some());
    // ops-a, ops-new, stalled-r, gone-r, rereg-r, sealed-r; three of them alive.
    assert_eq!((status.replicas, status.replicas_alive), (6, 3));

    // status_report is both halves from one pass: the same fleet, the same replica rows.
    let report = pgtenant::admin::status_report(&fleet.admin, Duration::from_secs(7 * 86_400))
        .await
        .expect("status_report");
    assert_eq!(report.fleet, status);
    let rows: Vec<(String, i64, String, bool)> = fleet
        .admin
        .query(
            "SELECT replica_id, tenants_held, state, coalesce(alive, false) FROM pgtenant.replica_status",
            &[],
        )
        .await
        .expect("replica_status")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let reported: Vec<(String, i64, String, bool)> = report
        .replicas
        .iter()
        .map(|r| {
            (
                r.replica_id.to_string(),
                r.tenants_held,
                r.state.to_string(),
                r.alive,
            )
        })
        .collect();
    assert_eq!(reported, rows);
    assert!(report
        .replicas
        .iter()
        .all(|r| r.started_at.as_deref().is_some_and(|at| at.ends_with('Z'))));

    // The same view with retention 0: the trash is due.
    let now = pgtenant::admin::fleet_status(&fleet.admin, Duration::ZERO)
        .await
        .expect("fleet_status, retention 0");
    assert_eq!(now.trash_due, 1);

    // fleet_status behind is what migrate_all would pick at that version.
    let behind = pgtenant::admin::list_tenants(&fleet.admin, &{
        let mut q = TenantQuery::default();
        q.behind = Some(SchemaVersion::new(2));
        q.quarantined = Some(false);
        q
    })
    .await
    .expect("behind");
    assert_eq!(behind.len() as i64, status.behind);
    fleet.router.close().await;
    fleet.newer.close().await;
    drop(fleet.db);
}

#[tokio::test]
async fn lease_status_is_lease_rows_in_tenant_order() {
    let fleet = fleet().await;
    let ordered: Vec<(String, String)> = fleet
        .admin
        .query("SELECT tenant, state FROM pgtenant.lease_status", &[])
        .await
        .expect("lease_status")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let mut sorted = ordered.clone();
    sorted.sort();
    assert_eq!(ordered, sorted, "lease_status comes ordered by tenant");
    let mut unordered: Vec<(String, String)> = fleet
        .admin
        .query("SELECT tenant, state FROM pgtenant.lease_rows", &[])
        .await
        .expect("lease_rows")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    unordered.sort();
    assert_eq!(unordered, sorted);
    // Every column lease_status had, unchanged (V8 readers select them by name), then the
    // one V13 added.
    let columns: Vec<String> = fleet
        .admin
        .query(
            "SELECT attname::text FROM pg_attribute
              WHERE attrelid = 'pgtenant.lease_status'::regclass AND attnum > 0 ORDER BY attnum",
            &[],
        )
        .await
        .expect("columns")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        columns,
        [
            "tenant",
            "state",
            "owner",
            "epoch",
            "owner_alive",
            "expires_in",
            "schema",
            "version",
            "quarantine_cause",
            "quarantine_repair",
            "reserved_for",
            "acquired_at",
            "created_at",
            "owner_incarnation"
        ]
    );
    fleet.router.close().await;
    fleet.newer.close().await;
}

/// Issue 27: after a pause and re-registration `lease_status` said `expired | owner_alive f`
/// while `replica_status` said the owner was `alive`. Every state of a tenant with an owner now
/// names what happened to the incarnation holding its lease, and the two views, the fleet's
/// counts, the admin API (what `pgtenant status` prints) and `Router::status` say the same.
#[tokio::test]
async fn lease_status_and_replica_status_agree_in_every_state() {
    let fleet = fleet().await;
    support::assert_views_agree(&fleet.admin).await;
    let pairs: std::collections::BTreeSet<(String, Option<String>)> = fleet
        .admin
        .query(
            "SELECT l.state, r.state FROM pgtenant.lease_status l
               LEFT JOIN pgtenant.replica_status r ON r.replica_id = l.owner",
            &[],
        )
        .await
        .expect("views")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let pair =
        |tenant: &str, replica: Option<&str>| (tenant.to_owned(), replica.map(str::to_owned));
    for expected in [
        pair("held", Some("alive")),
        pair("stalled", Some("stalled")),
        pair("stalled", Some("sealed")),
        pair("owner_gone", Some("gone")),
        // The contradiction of issue 27, now named: the owner is alive, as a newer incarnation.
        pair("owner_reregistered", Some("alive")),
        pair("free", None),
        pair("reserved", None),
        pair("quarantined", None),
        pair("forgotten", None),
    ] {
        assert!(pairs.contains(&expected), "{expected:?} not in {pairs:?}");
    }
    // The admin API (pgtenant status, pgtenant tenants) and Router::status say what the view
    // says, tenant by tenant, expires_in_ms included.
    let by_view: BTreeMap<String, (String, Option<i64>, Option<i64>)> = fleet
        .admin
        .query(
            "SELECT tenant, state, owner_incarnation,
                    (extract(epoch FROM expires_in) * 1000)::bigint
               FROM pgtenant.lease_status",
            &[],
        )
        .await
        .expect("lease_status")
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2), row.get(3))))
        .collect();
    let mut q = TenantQuery::default();
    q.limit = 1000;
    let records = pgtenant::admin::list_tenants(&fleet.admin, &q)
        .await
        .expect("list");
    assert_eq!(records.len(), by_view.len());
    for record in &records {
        let (state, incarnation, expires) = &by_view[record.tenant.key()];
        assert_eq!(record.state.as_str(), state, "{record:?}");
        let owner_incarnation = record.owner_incarnation.map(pgtenant::Incarnation::get);
        assert_eq!(&owner_incarnation, incarnation, "{record:?}");
        // Read a moment apart: the same None-ness, and a held lease's time only goes down.
        assert_eq!(
            record.expires_in_ms.is_some(),
            expires.is_some(),
            "{record:?}"
        );
        let status = fleet.router.status(&record.tenant).await.expect("status");
        assert_eq!(status.state, record.state, "{status:?}");
        assert_eq!(status.owner_alive, record.owner_alive, "{status:?}");
    }
    let json = serde_json::to_value(&records[0]).expect("json");
    assert!(json.get("expires_in_ms").is_some(), "{json}");
    fleet.router.close().await;
    fleet.newer.close().await;
}

#[tokio::test]
async fn replica_status_counts_each_incarnations_tenants() {
    let fleet = fleet().await;
    let held = |replica: &'static str| {
        let admin = &fleet.admin;
        async move {
            let row = admin
                .query_one(
                    "SELECT tenants_held, state FROM pgtenant.replica_status WHERE replica_id = $1",
                    &[&replica],
                )
                .await
                .expect("replica_status");
            (row.get::<_, i64>(0), row.get::<_, String>(1))
        }
    };
    assert_eq!(held("ops-a").await, (2, "alive".to_owned()));
    assert_eq!(held("ops-new").await, (0, "alive".to_owned()));
    assert_eq!(held("stalled-r").await, (1, "stalled".to_owned()));
    assert_eq!(held("gone-r").await, (1, "gone".to_owned()));
    assert_eq!(held("sealed-r").await, (1, "sealed".to_owned()));
    assert_eq!(held("rereg-r").await, (0, "alive".to_owned()));
    // A new incarnation of stalled-r holds none of the old one's tenants.
    support::register_by_hand(&fleet._stalled_session, "stalled-r").await;
    assert_eq!(held("stalled-r").await.0, 0);
    fleet.router.close().await;
    fleet.newer.close().await;
}

/// A tenant as lease_status has it: key, state, owner, version, live, quarantined.
type Listed = (String, String, Option<String>, i32, bool, bool);

#[tokio::test]
async fn every_listing_filter_agrees_with_lease_status() {
    let fleet = fleet().await;
    let client = &fleet.admin;
    let all: Vec<Listed> = client
        .query(
            "SELECT tenant, state, owner, version, schema IS NOT NULL, quarantine_cause IS NOT NULL
               FROM pgtenant.lease_status",
            &[],
        )
        .await
        .expect("lease_status")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    let keys = |query: &TenantQuery| {
        let query = query.clone();
        async move {
            pgtenant::admin::list_tenants(client, &query)
                .await
                .expect("list")
                .into_iter()
                .map(|r| r.tenant.key().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let expect = |keep: &dyn Fn(&Listed) -> bool| {
        all.iter()
            .filter(|t| keep(t))
            .map(|t| t.0.clone())
            .collect::<Vec<_>>()
    };
    for state in TenantState::ALL.into_iter().chain([TenantState::Absent]) {
        let mut q = TenantQuery::default();
        q.state = Some(state);
        assert_eq!(
            keys(&q).await,
            expect(&|t| t.1 == state.as_str()),
            "{state}"
        );
    }
    for quarantined in [true, false] {
        let mut q = TenantQuery::default();
        q.quarantined = Some(quarantined);
        assert_eq!(keys(&q).await, expect(&|t| t.5 == quarantined));
    }
    for version in [1, 2, 3] {
        let mut q = TenantQuery::default();
        q.behind = Some(SchemaVersion::new(version));
        assert_eq!(keys(&q).await, expect(&|t| t.4 && t.3 < version));
    }
    let mut q = TenantQuery::default();
    q.owner = Some(support::replica("ops-a"));
    q.state = Some(TenantState::Held);
    assert_eq!(
        keys(&q).await,
        expect(&|t| t.2.as_deref() == Some("ops-a") && t.1 == "held")
    );
    // Pages of 2, one after the other, give every tenant once, in order.
    let mut paged = Vec::new();
    let mut q = TenantQuery::default();
    q.limit = 2;
    loop {
        let page = pgtenant::admin::list_tenants(client, &q)
            .await
            .expect("page");
        q.after = page.last().map(|r| r.tenant.clone());
        let full = page.len() == 2;
        paged.extend(page.into_iter().map(|r| r.tenant.key().to_owned()));
        if !full {
            break;
        }
    }
    assert_eq!(paged, expect(&|_| true));
    // show_tenant reads the same record.
    let shown = pgtenant::admin::show_tenant(client, &tenant("forgotten-1"))
        .await
        .expect("show")
        .expect("a record");
    assert_eq!(shown.state, TenantState::Forgotten);
    assert!(shown.forgotten_at_epoch > 0 && shown.schema.is_none());
    fleet.router.close().await;
    fleet.newer.close().await;
}

#[tokio::test]
async fn the_sweep_backlog_is_what_the_sweep_then_does() {
    let fleet = fleet().await;
    let client = &fleet.admin;
    // A tenant-shaped schema no tenant names: the sweep reports it as unknown.
    client
        .batch_execute("CREATE SCHEMA t_acme_stray_1_0123456789")
        .await
        .expect("an orphan");
    let kept = pgtenant::admin::sweep_backlog(client, Duration::from_secs(86_400))
        .await
        .expect("backlog");
    assert_eq!(
        (kept.trash_due, kept.trash_kept, kept.orphan_schemas),
        (0, 1, 1)
    );
    assert!(kept.oldest_due_at.is_none());
    let due = pgtenant::admin::sweep_backlog(client, Duration::ZERO)
        .await
        .expect("backlog");
    assert_eq!(
        (due.trash_due, due.trash_kept, due.orphan_schemas),
        (1, 0, 1)
    );
    assert!(due.oldest_due_at.is_some());
    let mut sweeper = fleet.db.connect().await.expect("connect");
    let report = pgtenant::admin::sweep(
        &mut sweeper,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep");
    assert_eq!(report.swept.len() as i64, due.trash_due);
    assert_eq!(report.unknown, ["t_acme_stray_1_0123456789"]);
    let after = pgtenant::admin::sweep_backlog(client, Duration::ZERO)
        .await
        .expect("backlog");
    assert_eq!(
        (after.trash_due, after.trash_kept, after.orphan_schemas),
        (0, 0, 1)
    );
    fleet.router.close().await;
    fleet.newer.close().await;
}

/// The sweep finds a schema's objects through pg_depend now: every kind it drops, partitions
/// first, a few per transaction, and the schema goes.
#[tokio::test]
async fn the_sweep_drops_every_kind_of_object_found_through_pg_depend() {
    let (db, admin) = support::database().await;
    let router = support::router(db.url(), "ops-sweep").await;
    let handle = router
        .open_or_create(&tenant("every-kind"))
        .await
        .expect("create");
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(
                    "CREATE TABLE a (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, t text);
                     CREATE TABLE b (id serial, a bigint REFERENCES a);
                     CREATE SEQUENCE s;
                     CREATE TABLE p (k int, v text) PARTITION BY RANGE (k);
                     CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10);
                     CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (10) TO (20);
                     CREATE VIEW v AS SELECT * FROM a;
                     CREATE MATERIALIZED VIEW m AS SELECT count(*) FROM b;
                     CREATE TYPE c AS (x int);
                     CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';",
                )
                .await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .expect("objects");
    let schema = handle.forget(ActiveWork::Refuse).await.expect("forget");
    let mut sweeper = db.connect().await.expect("connect");
    let mut batches = Vec::new();
    let mut options = SweepOptions::with_retention(Duration::ZERO);
    options.objects_per_transaction = 2;
    let report = pgtenant::admin::sweep(&mut sweeper, &options, |s, dropped| {
        batches.push((s.to_owned(), dropped));
    })
    .await
    .expect("sweep");
    assert_eq!(report.swept, std::slice::from_ref(&schema));
    // Partitions first (p1, p2), then a and b (taking the view, the materialized view and
    // their sequences with them), then p and s.
    assert_eq!(batches.len(), 3, "small batches: {batches:?}");
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await
        .expect("namespace")
        .get(0);
    assert_eq!(left, 0, "{schema} is gone");
    router.close().await;
}

/// A control plane older than V10 (V8 here, exactly as its release set it up): the listing
/// still works on lease_status, and the fleet summary says what to run.
#[tokio::test]
async fn an_older_control_plane_lists_tenants_and_asks_for_setup() {
    let db = TestDatabase::create().await.expect("test database");
    let mut client = db.connect().await.expect("connect");
    support::control_plane_at(&mut client, 8).await;
    client
        .batch_execute(
            "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch)
             VALUES ('acme/old', 'acme', 'old', 't_acme_old_1_0000000000', 1)",
        )
        .await
        .expect("a tenant");
    let listed = pgtenant::admin::list_tenants(&client, &TenantQuery::default())
        .await
        .expect("list on V8");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, TenantState::Free);
    let shown = pgtenant::admin::show_tenant(&client, &tenant("old"))
        .await
        .expect("show on V8");
    assert!(shown.is_some());
    match pgtenant::admin::fleet_status(&client, Duration::ZERO).await {
        Err(Error::ControlPlaneOutdated {
            found: 8,
            needed: 10,
            ..
        }) => {}
        other => panic!("expected ControlPlaneOutdated, got {other:?}"),
    }
    match pgtenant::admin::sweep_backlog(&client, Duration::ZERO).await {
        Err(Error::ControlPlaneOutdated {
            found: 8,
            needed: 10,
            ..
        }) => {}
        other => panic!("expected ControlPlaneOutdated, got {other:?}"),
    }
    // setup brings V10; the same calls then answer.
    pgtenant::setup(&mut client).await.expect("upgrade");
    let status = pgtenant::admin::fleet_status(&client, Duration::ZERO)
        .await
        .expect("fleet on V10");
    assert_eq!(status.count(TenantState::Free), 1);
}

/// The application's and the operators' roles read the new views (setup_with grants them, and
/// V10 grants them where roles were granted before).
#[tokio::test]
async fn the_granted_roles_read_the_new_views() {
    let (_db, _admin, app, operator) = support::granted().await;
    let router = Router::start(options(app.url(), "ops-app"))
        .await
        .expect("router as app");
    router
        .open_or_create(&tenant("granted"))
        .await
        .expect("create as app");
    let as_app = app.connect().await.expect("connect as app");
    for sql in [
        "SELECT count(*) FROM pgtenant.lease_rows",
        "SELECT count(*) FROM pgtenant.fleet_status",
        "SELECT count(*) FROM pgtenant.lease_status",
        "SELECT count(*) FROM pgtenant.replica_status",
    ] {
        as_app.query_one(sql, &[]).await.expect(sql);
    }
    // The trash is not the application's, the backlog neither.
    let refused = as_app
        .query_one("SELECT count(*) FROM pgtenant.sweep_backlog", &[])
        .await
        .expect_err("the app role reads no sweep_backlog");
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"));
    let as_operator = operator.connect().await.expect("connect as operator");
    let fleet = pgtenant::admin::fleet_status(&as_operator, Duration::ZERO)
        .await
        .expect("fleet as operator");
    assert_eq!(fleet.count(TenantState::Held), 1);
    pgtenant::admin::sweep_backlog(&as_operator, Duration::ZERO)
        .await
        .expect("backlog as operator");
    let listed = pgtenant::admin::list_tenants(&as_operator, &TenantQuery::default())
        .await
        .expect("list as operator");
    assert_eq!(listed.len(), 1);
    router.close().await;
}

/// V13 makes `fleet_status` (and its function) again, since its columns are the states: the
/// privileges it had come with it, exactly, PUBLIC's too. Before the upgrade, this release's
/// operator API reads the older control plane (`expired` read as `owner_gone`).
#[tokio::test]
async fn the_upgrade_to_v13_keeps_who_may_read_fleet_status() {
    let db = TestDatabase::create().await.expect("test database");
    let mut admin = db.connect().await.expect("connect");
    // Every migration before V13.
    let before_13 = support::CONTROL_PLANE
        .iter()
        .position(|(name, _)| *name == "V13__first_day")
        .expect("V13 among the control plane's migrations");
    support::control_plane_at(&mut admin, before_13).await;
    let app = db.create_role("app").await.expect("app role");
    let operator = db.create_role("op").await.expect("operator role");
    let outsider = db
        .create_role("outsider")
        .await
        .expect("a role with no grants");
    admin
        .execute(
            "SELECT pgtenant.grant_roles($1::text::name, $2::text::name)",
            &[&app.name(), &operator.name()],
        )
        .await
        .expect("the grants before V13");
    // A tenant whose owner is gone, as control planes before 13 call it `expired`.
    let session = db.connect().await.expect("a lease session");
    let (incarnation, secret) = support::register_by_hand(&session, "old-r").await;
    session
        .query_one(
            "SELECT epoch FROM pgtenant.acquire('acme/gone', 'acme', 'gone', 'old-r', $1, $2, true)",
            &[&incarnation, &secret],
        )
        .await
        .expect("acquire");
    drop(session);
    let acl = "SELECT p.proacl::text, c.relacl::text FROM pg_proc p, pg_class c
                WHERE p.oid = 'pgtenant.fleet_status_rows(bigint)'::regprocedure
                  AND c.oid = 'pgtenant.fleet_status'::regclass";
    let before: (Option<String>, Option<String>) = {
        let row = admin.query_one(acl, &[]).await.expect("acl");
        (row.get(0), row.get(1))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let old = loop {
        let fleet = pgtenant::admin::fleet_status(&admin, Duration::ZERO)
            .await
            .expect("fleet of a control plane before 13");
        if fleet.count(TenantState::OwnerGone) == 1 || std::time::Instant::now() > deadline {
            break fleet;
        }
        // The lease session's lock goes with its backend, a moment after the client drops.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(old.count(TenantState::OwnerGone), 1, "{old:?}");
    let listed = pgtenant::admin::list_tenants(&admin, &TenantQuery::default())
        .await
        .expect("list before 13");
    assert_eq!(listed[0].state, TenantState::OwnerGone);
    assert_eq!(
        listed[0].owner_incarnation.map(pgtenant::Incarnation::get),
        Some(incarnation)
    );

    pgtenant::setup(&mut admin).await.expect("upgrade");
    let after: (Option<String>, Option<String>) = {
        let row = admin.query_one(acl, &[]).await.expect("acl");
        (row.get(0), row.get(1))
    };
    assert_eq!(after, before, "the same privileges");
    for role in [&app, &operator] {
        let client = role.connect().await.expect("connect");
        let fleet = pgtenant::admin::fleet_status(&client, Duration::ZERO)
            .await
            .expect("fleet_status");
        assert_eq!(fleet.count(TenantState::OwnerGone), 1, "{fleet:?}");
    }
    let client = outsider.connect().await.expect("connect as outsider");
    let refused = client
        .query_one("SELECT count(*) FROM pgtenant.fleet_status", &[])
        .await
        .expect_err("no grant, no read");
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"));
}
