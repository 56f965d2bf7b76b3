//! Fresh databases and servers: a database with the control plane set up (as the superuser,
//! or with an application and an operator role granted), a throwaway server of the test's
//! own, a primary with a standby, the control plane exactly as an old release left it, and the
//! `postgres` user that runs the test kit's servers.

use pgtenant_testkit::TestDatabase;

pub(crate) async fn database() -> (TestDatabase, tokio_postgres::Client) {
    let db = TestDatabase::create().await.expect("test database");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup");
    (db, client)
}

/// A fresh database whose control plane is owned by the superuser, with a non-superuser
/// application role and operator role granted by `setup_with`.
pub(crate) async fn granted() -> (
    TestDatabase,
    tokio_postgres::Client,
    pgtenant_testkit::TestRole,
    pgtenant_testkit::TestRole,
) {
    let db = TestDatabase::create().await.expect("test database");
    let mut admin = db.connect().await.expect("connect");
    let app = db.create_role("app").await.expect("app role");
    let operator = db.create_role("op").await.expect("operator role");
    pgtenant::setup_with(
        &mut admin,
        &pgtenant::SetupOptions::default()
            .app_role(app.name())
            .operator_role(operator.name()),
    )
    .await
    .expect("setup with roles");
    (db, admin, app, operator)
}

/// The control-plane migrations of every release, in order.
pub(crate) const CONTROL_PLANE: [(&str, &str); 22] = [
    (
        "V1__control_plane",
        include_str!("../../migrations/V1__control_plane.sql"),
    ),
    (
        "V2__owner_index_with_key",
        include_str!("../../migrations/V2__owner_index_with_key.sql"),
    ),
    (
        "V3__least_privilege_and_hygiene",
        include_str!("../../migrations/V3__least_privilege_and_hygiene.sql"),
    ),
    (
        "V4__epoch_floor",
        include_str!("../../migrations/V4__epoch_floor.sql"),
    ),
    (
        "V5__session_fencing",
        include_str!("../../migrations/V5__session_fencing.sql"),
    ),
    (
        "V6__fence_floor",
        include_str!("../../migrations/V6__fence_floor.sql"),
    ),
    (
        "V7__seal_on_takeover",
        include_str!("../../migrations/V7__seal_on_takeover.sql"),
    ),
    (
        "V8__seal_per_incarnation",
        include_str!("../../migrations/V8__seal_per_incarnation.sql"),
    ),
    (
        "V9__fence_signalled",
        include_str!("../../migrations/V9__fence_signalled.sql"),
    ),
    (
        "V10__scale",
        include_str!("../../migrations/V10__scale.sql"),
    ),
    (
        "V11__untracked_work",
        include_str!("../../migrations/V11__untracked_work.sql"),
    ),
    (
        "V12__tenant_boundary",
        include_str!("../../migrations/V12__tenant_boundary.sql"),
    ),
    (
        "V13__first_day",
        include_str!("../../migrations/V13__first_day.sql"),
    ),
    (
        "V14__one_fence",
        include_str!("../../migrations/V14__one_fence.sql"),
    ),
    (
        "V15__placement",
        include_str!("../../migrations/V15__placement.sql"),
    ),
    (
        "V16__rebalancing",
        include_str!("../../migrations/V16__rebalancing.sql"),
    ),
    (
        "V17__leaving",
        include_str!("../../migrations/V17__leaving.sql"),
    ),
    (
        "V18__alarms",
        include_str!("../../migrations/V18__alarms.sql"),
    ),
    (
        "V19__alarm_requests",
        include_str!("../../migrations/V19__alarm_requests.sql"),
    ),
    (
        "V20__pickups_and_takeovers",
        include_str!("../../migrations/V20__pickups_and_takeovers.sql"),
    ),
    (
        "V21__reservations_of_the_dead",
        include_str!("../../migrations/V21__reservations_of_the_dead.sql"),
    ),
    (
        "V22__locate_with_a_kept_plan",
        include_str!("../../migrations/V22__locate_with_a_kept_plan.sql"),
    ),
];

/// The names of the control-plane migrations from index `from` on, as setup reports them.
pub(crate) fn migration_names(from: usize) -> Vec<String> {
    CONTROL_PLANE[from..]
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect()
}

/// Sets up the control plane exactly as the release whose newest migration is `version` did:
/// the same files, applied by refinery, so the next `pgtenant::setup` sees a real old database.
pub(crate) async fn control_plane_at(client: &mut tokio_postgres::Client, version: usize) {
    client
        .batch_execute("CREATE SCHEMA IF NOT EXISTS pgtenant")
        .await
        .expect("schema");
    let migrations: Vec<refinery::Migration> = CONTROL_PLANE[..version]
        .iter()
        .map(|(name, sql)| refinery::Migration::unapplied(name, sql).expect("migration"))
        .collect();
    let mut runner = refinery::Runner::new(&migrations);
    runner.set_migration_table_name("pgtenant.refinery_schema_history");
    runner.run_async(client).await.expect("old control plane");
}

/// A throwaway server of the test's own (one it may crash) with a database and the control
/// plane on it.
pub(crate) async fn own_server() -> (pgtenant_testkit::LocalCluster, TestDatabase) {
    let cluster = pgtenant_testkit::LocalCluster::start()
        .await
        .expect("throwaway cluster");
    let db = cluster.create_database().await.expect("database");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup");
    (cluster, db)
}

/// A primary with a streaming standby (the test kit's [`StandbyPair`]), with a database and
/// pgtenant's control plane on it, replicated to the standby; and the database's name.
///
/// [`StandbyPair`]: pgtenant_testkit::StandbyPair
pub(crate) async fn pair_with_control_plane(
    mode: pgtenant_testkit::Replication,
) -> (pgtenant_testkit::StandbyPair, String) {
    let pair = pgtenant_testkit::StandbyPair::start(mode)
        .await
        .expect("primary and standby");
    let db = pair.create_database().await.expect("database");
    let (mut client, connection) =
        tokio_postgres::connect(&pair.primary_url(&db), tokio_postgres::NoTls)
            .await
            .expect("connect to the primary");
    let driver = tokio::spawn(connection);
    pgtenant::setup(&mut client).await.expect("setup");
    drop(client);
    let _ = driver.await;
    pair.wait_for_standby()
        .await
        .expect("the standby has the control plane");
    (pair, db)
}

/// The uid and gid of the `postgres` user, which runs the test kit's servers and PgBouncer
/// (they refuse to run as root), from /etc/passwd.
pub(crate) fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres")).then(|| {
                (
                    fields[2].parse().expect("uid"),
                    fields[3].parse().expect("gid"),
                )
            })
        })
        .expect("a postgres user")
}
