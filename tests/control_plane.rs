//! Control plane: idempotent, concurrent-safe setup; newer databases refused; views readable.

mod support;

use pgtenant::admin::supported_version;
use pgtenant::{setup, Error};
use pgtenant_testkit::TestDatabase;

async fn fresh() -> (TestDatabase, tokio_postgres::Client) {
    let db = TestDatabase::create().await.expect("test database");
    let client = db.connect().await.expect("connect");
    (db, client)
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

const OBJECTS_IN_CONTROL_SCHEMA: &str =
    "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgtenant'";

#[tokio::test]
async fn setup_twice_creates_once_then_does_nothing() {
    let (_db, mut client) = fresh().await;
    assert_eq!(
        pgtenant::admin::control_plane_version(&client)
            .await
            .unwrap(),
        0
    );

    let first = setup(&mut client).await.expect("first setup");
    assert_eq!(first.applied, support::migration_names(0));
    assert_eq!(first.version, supported_version());
    let objects = count(&client, OBJECTS_IN_CONTROL_SCHEMA).await;
    assert!(objects > 5, "tables and views exist, found {objects}");

    let second = setup(&mut client).await.expect("second setup");
    assert!(
        second.applied.is_empty(),
        "second run applied {:?}",
        second.applied
    );
    assert_eq!(second.version, supported_version());
    assert_eq!(count(&client, OBJECTS_IN_CONTROL_SCHEMA).await, objects);
    for table in ["replicas", "tenants", "trash", "history"] {
        count(&client, &format!("SELECT count(*) FROM pgtenant.{table}")).await;
    }
}

#[tokio::test]
async fn eight_concurrent_setups_on_a_fresh_database_all_succeed() {
    let (db, client) = fresh().await;
    let mut runs = Vec::new();
    for _ in 0..8 {
        let mut client = db.connect().await.expect("connect");
        runs.push(tokio::spawn(async move { setup(&mut client).await }));
    }
    let mut applied = 0;
    for run in runs {
        let report = run.await.expect("task").expect("setup succeeds");
        assert_eq!(report.version, supported_version());
        applied += report.applied.len();
    }
    assert_eq!(
        applied,
        support::CONTROL_PLANE.len(),
        "exactly one setup applies the migrations"
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtenant.refinery_schema_history"
        )
        .await,
        support::CONTROL_PLANE.len() as i64
    );
}

/// A database set up by the first release (control plane V1) is brought to the current version
/// by the next `setup`, which applies only what is missing; until then routers refuse it.
#[tokio::test]
async fn a_control_plane_at_version_1_is_upgraded_in_place() {
    let (db, mut client) = fresh().await;
    support::control_plane_at(&mut client, 1).await;
    assert_eq!(
        pgtenant::admin::control_plane_version(&client)
            .await
            .unwrap(),
        1
    );
    match pgtenant::Router::start(pgtenant::RouterOptions::from_url("early", db.url()).unwrap())
        .await
    {
        Err(Error::ControlPlaneOutdated { .. }) => {}
        Err(other) => panic!("expected ControlPlaneOutdated, got {other}"),
        Ok(_) => panic!("a router started on an outdated control plane"),
    }

    let upgrade = setup(&mut client).await.expect("upgrade");
    assert_eq!(upgrade.applied, support::migration_names(1));
    let columns: String = client
        .query_one(
            "SELECT pg_get_indexdef('pgtenant.tenants_owner'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        columns.contains("(owner, owner_incarnation, key)"),
        "{columns}"
    );
}

#[tokio::test]
async fn a_newer_control_plane_is_refused_before_anything_changes() {
    let (_db, mut client) = fresh().await;
    setup(&mut client).await.expect("setup");
    client
        .execute(
            "INSERT INTO pgtenant.refinery_schema_history (version, name, applied_on, checksum)
             VALUES (999, 'from_the_future', '2030-01-01T00:00:00Z', '1')",
            &[],
        )
        .await
        .expect("pretend a newer pgtenant ran");
    let objects = count(&client, OBJECTS_IN_CONTROL_SCHEMA).await;

    let error = setup(&mut client).await.expect_err("refused");
    assert!(
        matches!(error, Error::ControlPlaneTooNew { found: 999, supported, .. } if supported == supported_version()),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("999") && message.contains("upgrade pgtenant"),
        "{message}"
    );
    assert!(!error.is_retryable());
    assert_eq!(count(&client, OBJECTS_IN_CONTROL_SCHEMA).await, objects);
}

#[tokio::test]
async fn database_errors_show_sqlstate_and_message_and_are_classified() {
    let (db, admin) = fresh().await;
    // A role that may connect but not create schemas.
    let role = format!("nopriv_{}", db.name());
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; REVOKE CREATE ON DATABASE \"{}\" FROM PUBLIC, {role};",
            db.name()
        ))
        .await
        .expect("role");
    let mut config = db.config();
    config.user(&role);
    let (mut client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);

    let error = setup(&mut client).await.expect_err("no privilege");
    let message = error.to_string();
    assert_eq!(error.sqlstate(), Some("42501"), "{message}");
    assert!(
        message.contains("permission denied") && message.contains("SQLSTATE 42501"),
        "{message}"
    );
    assert!(
        !error.is_retryable(),
        "a privilege problem is not fixed by retrying"
    );
    assert!(
        std::error::Error::source(&error).is_some(),
        "the driver error is kept as source"
    );
    drop(client);

    // A connection cut by the server: unavailable, retryable.
    let (victim, connection) = db
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    let error = pgtenant::admin::control_plane_version(&victim)
        .await
        .expect_err("connection is gone");
    assert!(error.is_retryable(), "{error}");
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .ok();
}

#[tokio::test]
async fn status_views_explain_replicas_and_leases() {
    let (db, mut client) = fresh().await;
    setup(&mut client).await.expect("setup");
    client
        .batch_execute(
            "INSERT INTO pgtenant.replicas (replica_id, incarnation, expires_at) VALUES
                 ('live', 1, now() + interval '1 minute'),
                 ('dead', 1, now() + interval '1 minute');
             INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, owner, owner_incarnation)
             VALUES ('acme/a', 'acme', 'a', 't_acme_a_1_0000000000', 1, 'live', 1),
                    ('acme/b', 'acme', 'b', 't_acme_b_1_0000000000', 1, 'dead', 1),
                    ('acme/c', 'acme', 'c', 't_acme_c_1_0000000000', 3, NULL, NULL);",
        )
        .await
        .expect("rows");
    // The live replica's liveness lock, held by another session as its lease session would.
    let lease_session = db.connect().await.expect("connect");
    let key: i32 = client
        .query_one(
            "SELECT lock_key FROM pgtenant.replicas WHERE replica_id = 'live'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let locked: bool = lease_session
        .query_one(
            "SELECT pg_try_advisory_lock(pgtenant.lock_namespace(), $1)",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    assert!(locked);

    let rows = client
        .query(
            "SELECT tenant, state, owner_alive FROM pgtenant.lease_status",
            &[],
        )
        .await
        .expect("lease_status");
    let states: Vec<(String, String, Option<bool>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        states,
        vec![
            ("acme/a".into(), "held".into(), Some(true)),
            ("acme/b".into(), "owner_gone".into(), Some(false)),
            ("acme/c".into(), "free".into(), None),
        ]
    );
    let rows = client
        .query(
            "SELECT replica_id, alive, lock_held, tenants_held FROM pgtenant.replica_status",
            &[],
        )
        .await
        .expect("replica_status");
    let replicas: Vec<(String, bool, bool, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        replicas,
        vec![
            ("dead".into(), false, false, 1),
            ("live".into(), true, true, 1)
        ]
    );

    // A stalled replica: lock still held, heartbeat expired.
    client
        .execute("UPDATE pgtenant.replicas SET expires_at = now() - interval '1 second' WHERE replica_id = 'live'", &[])
        .await
        .unwrap();
    let row = client
        .query_one(
            "SELECT state, expires_in = interval '0' FROM pgtenant.lease_status WHERE tenant = 'acme/a'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "stalled");
    assert!(
        row.get::<_, bool>(1),
        "an expired lease shows 0 left, not a negative interval"
    );
}
