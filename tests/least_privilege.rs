//! Least privilege (DESIGN G8): the application's role cannot write the control plane, cannot
//! act for another replica, and the sweep trusts nothing it reads; an old control plane is
//! upgraded under a running replica of the previous release.

mod support;

use std::time::Duration;

use pgtenant::admin::{SetupOptions, SweepOptions};
use pgtenant::{Error, Router};
use pgtenant_testkit::TestDatabase;
use support::{granted, options, tenant};

fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(|c| c.code())
}

#[tokio::test]
async fn the_app_role_runs_the_router_but_cannot_touch_the_control_plane() {
    let (_db, admin, app, _operator) = granted().await;
    // The full protocol as the application's role: create, fenced work, handoff, forget,
    // restore, close.
    let a = Router::start(options(app.url(), "app-a"))
        .await
        .expect("router a");
    let b = Router::start(options(app.url(), "app-b"))
        .await
        .expect("router b");
    let mine = a
        .open_or_create(&tenant("mine"))
        .await
        .expect("open as app");
    support::create_log(&mine).await;
    support::append(&mine, "a", 1)
        .await
        .expect("fenced write as app");
    let theirs = b
        .open_or_create(&tenant("theirs"))
        .await
        .expect("b's tenant");
    mine.handoff_to("app-b").await.expect("handoff as app");
    let moved = b.open(&tenant("mine")).await.expect("b takes it");
    assert_eq!(
        support::count_rows(&moved, "SELECT count(*) FROM log").await,
        1
    );
    moved
        .forget(pgtenant::ActiveWork::Refuse)
        .await
        .expect("forget as app");
    let back = b.restore(&tenant("mine")).await.expect("restore as app");
    assert_eq!(
        support::count_rows(&back, "SELECT count(*) FROM log").await,
        1
    );

    // Now the same role, directly: no table of the control plane is writable.
    let client = app.connect().await.expect("connect as app");
    for sql in [
        "UPDATE pgtenant.tenants SET epoch = epoch + 1",
        "INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name) VALUES ('x', 'acme/theirs', 1, 'x')",
        "DELETE FROM pgtenant.history",
        "UPDATE pgtenant.replicas SET expires_at = now()",
        "SELECT * FROM pgtenant.replica_secrets",
        "SELECT * FROM pgtenant.trash",
    ] {
        let error = client.batch_execute(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&error), Some("42501"), "{sql}: {error:?}");
    }
    // Acting for b without b's secret is refused, through the V3 functions and the V1 ones.
    let incarnation = b.incarnation().expect("b registered");
    let key = theirs.id().key().to_owned();
    let epoch = theirs.epoch();
    let refused = client
        .query(
            "SELECT * FROM pgtenant.release('app-b', $1, 'not-the-secret', ARRAY[$2], ARRAY[$3::bigint],
                                            ARRAY['released'], ARRAY[NULL::text], ARRAY[NULL::int])",
            &[&incarnation, &key, &epoch],
        )
        .await
        .expect_err("release for b");
    assert_eq!(sqlstate(&refused), Some("PTA01"), "{refused:?}");
    let refused = client
        .query(
            "SELECT * FROM pgtenant.acquire($1, 'acme', 'theirs', 'app-b', $2, 'not-the-secret', false)",
            &[&key, &incarnation],
        )
        .await
        .expect_err("acquire as b");
    assert_eq!(sqlstate(&refused), Some("PTA01"), "{refused:?}");
    for sql in [
        "SELECT pgtenant.release('acme/theirs', 1, 'app-b', 1, 'released', NULL, NULL)",
        "SELECT * FROM pgtenant.acquire('acme/theirs', 'acme', 'theirs', 'app-b', 1, false)",
        "SELECT pgtenant.clear_quarantine('acme/theirs', 'app')",
        "SELECT pgtenant.grant_roles(NULL, NULL)",
    ] {
        let error = client.batch_execute(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&error), Some("42501"), "{sql}: {error:?}");
    }
    // Nor from inside a tenant's work.
    let inside = back
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute("UPDATE pgtenant.tenants SET epoch = epoch + 1")
                    .await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .expect_err("work cannot write the control plane");
    assert_eq!(inside.sqlstate(), Some("42501"), "{inside}");
    // b still holds its tenant at its epoch, and serves it.
    let row = admin
        .query_one(
            "SELECT owner, epoch FROM pgtenant.tenants WHERE key = $1",
            &[&key],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, pgtenant::Epoch>(1)),
        ("app-b".to_owned(), epoch)
    );
    support::create_log(&theirs).await;
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn setup_refuses_a_role_that_does_not_exist_before_changing_anything() {
    let db = TestDatabase::create().await.expect("test database");
    let mut admin = db.connect().await.expect("connect");
    let error =
        pgtenant::admin::setup_with(&mut admin, &SetupOptions::default().app_role("nobody_here"))
            .await
            .expect_err("no such role");
    assert!(
        matches!(&error, Error::InvalidOption { option: "app_role", reason, .. } if reason.contains("does not exist")),
        "{error}"
    );
    assert_eq!(
        pgtenant::admin::control_plane_version(&admin)
            .await
            .unwrap(),
        0
    );
}

/// The forged rows of issue #8: the application's role (before V3, when it could) wrote trash
/// rows naming schemas pgtenant never made. The sweep, run by a superuser, leaves them alone
/// and reports them, while it still sweeps what pgtenant did trash.
#[tokio::test]
async fn the_sweep_drops_only_derived_schemas_owned_by_the_tenant_owner() {
    let (db, admin, app, operator) = granted().await;
    let router = Router::start(options(app.url(), "sweeper-app"))
        .await
        .expect("router");
    let gone = router
        .open_or_create(&tenant("gone"))
        .await
        .expect("tenant");
    support::create_log(&gone).await;
    let trashed = gone
        .forget(pgtenant::ActiveWork::Refuse)
        .await
        .expect("forget");
    router.close().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA billing; CREATE TABLE billing.invoices (id int);
             INSERT INTO pgtenant.tenants (key, organization, ledger, epoch, forgotten_at_epoch)
             VALUES ('role/one', 'role', 'one', 1, 1);
             INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name, trashed_at)
             VALUES ('billing', 'role/one', 1, 'billing', now() - interval '30 days');
             -- A derived-looking name, but the schema belongs to the superuser.
             CREATE SCHEMA trash_{forged};
             INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name, trashed_at)
             VALUES ('trash_{forged}', 'role/one', 1, '{forged}', now() - interval '30 days')",
            forged = pgtenant::TenantId::new("role", "one")
                .unwrap()
                .schema_name(1)
        ))
        .await
        .expect("forged rows");
    // The application's own schema, of the right owner but a name no tenant's life derives.
    app.connect()
        .await
        .expect("connect as app")
        .batch_execute("CREATE SCHEMA app_private; CREATE TABLE app_private.settings (id int)")
        .await
        .expect("app's schema");
    admin
        .batch_execute(
            "INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name, trashed_at)
             VALUES ('app_private', 'role/one', 1, 'app_private', now() - interval '30 days')",
        )
        .await
        .expect("forged row");
    let mut superuser = db.connect().await.expect("connect");
    let report = pgtenant::admin::sweep(
        &mut superuser,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep");
    let refused: Vec<&str> = report.refused.iter().map(|(s, _)| s.as_str()).collect();
    assert!(refused.contains(&"billing"), "{report:?}");
    assert!(refused.contains(&"app_private"), "{report:?}");
    assert!(
        refused
            .iter()
            .any(|s| s.starts_with("trash_t_role__one_1_")),
        "{report:?}"
    );
    assert!(report.swept.contains(&trashed), "{report:?}");
    let billing: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_namespace
              WHERE nspname IN ('billing', 'app_private') OR nspname LIKE 'trash_t_role%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(billing, 3, "every foreign schema is still there");

    // The operator role sweeps too (as a member of the application's role, to drop its
    // schemas), and refuses the same rows.
    admin
        .batch_execute(&format!("GRANT {} TO {}", app.name(), operator.name()))
        .await
        .unwrap();
    let mut as_operator = operator.connect().await.expect("connect as operator");
    let again = pgtenant::admin::sweep(
        &mut as_operator,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep as operator");
    assert_eq!(again.refused.len(), 3, "{again:?}");
}

/// An old control plane (V2, the previous release) is upgraded in place while a replica of
/// that release holds a tenant and writes: it keeps writing across the upgrade, releases with
/// its own functions, and a replica of this release takes over with every write in place.
#[tokio::test]
async fn a_v2_control_plane_is_upgraded_under_a_running_replica_of_the_previous_release() {
    let db = TestDatabase::create().await.expect("test database");
    let mut admin = db.connect().await.expect("connect");
    support::control_plane_at(&mut admin, 2).await;

    // The previous release's replica, speaking its own SQL.
    let lease = db.connect().await.expect("lease session");
    support::take_liveness_lock(&lease, "old").await;
    let incarnation: i64 = lease
        .query_one(
            "SELECT incarnation FROM pgtenant.register('old', 60000, NULL)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let row = lease
        .query_one(
            "SELECT epoch, lock_key FROM pgtenant.acquire('acme/legacy', 'acme', 'legacy', 'old', $1, true)",
            &[&incarnation],
        )
        .await
        .unwrap();
    let (epoch, tenant_lock): (i64, i32) = (row.get(0), row.get(1));
    let schema = "t_acme_legacy_1_0000000000";
    lease
        .batch_execute(&format!(
            "BEGIN; CREATE SCHEMA {schema}; CREATE TABLE {schema}.log (n bigint PRIMARY KEY);
             UPDATE pgtenant.tenants SET schema_name = '{schema}' WHERE key = 'acme/legacy'; COMMIT"
        ))
        .await
        .unwrap();

    // Its fenced writes, as it made them: BEGIN; fence; work; COMMIT.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let (progress, mut acked) = tokio::sync::watch::channel(0_i64);
    let mut writer = db.connect().await.expect("data session");
    let writing = tokio::spawn(async move {
        let mut n = 0_i64;
        while stopped.try_recv().is_err() {
            let tx = writer.transaction().await.expect("begin");
            tx.query(
                "SELECT pgtenant.fence($1, $2, $3, '60000')",
                &[&"acme/legacy", &epoch, &tenant_lock],
            )
            .await
            .expect("the old fence passes across the upgrade");
            tx.execute("INSERT INTO log VALUES ($1)", &[&n])
                .await
                .expect("write");
            tx.commit().await.expect("commit");
            n += 1;
            progress.send_replace(n);
        }
        n
    });
    acked.wait_for(|n| *n >= 20).await.expect("writing");
    let upgrade = pgtenant::setup(&mut admin).await.expect("upgrade to V3");
    assert_eq!(upgrade.applied, support::migration_names(2));
    let at_upgrade = *acked.borrow();
    acked
        .wait_for(|n| *n >= at_upgrade + 20)
        .await
        .expect("still writing after the upgrade");
    let _ = stop.send(());
    let written = writing.await.expect("writer");
    // Its heartbeat and its release still work too.
    let renewed = lease
        .execute(
            "UPDATE pgtenant.replicas SET expires_at = clock_timestamp() + interval '60 seconds'
              WHERE replica_id = 'old' AND incarnation = $1 AND expires_at > clock_timestamp()",
            &[&incarnation],
        )
        .await
        .unwrap();
    assert_eq!(renewed, 1);
    let released: bool = lease
        .query_one(
            "SELECT pgtenant.release('acme/legacy', $1, 'old', $2, 'released', NULL, NULL)",
            &[&epoch, &incarnation],
        )
        .await
        .unwrap()
        .get(0);
    assert!(released);

    // This release's replica takes the tenant over and finds every acknowledged write.
    let router = support::router(db.url(), "new").await;
    let handle = router.open(&tenant("legacy")).await.expect("take over");
    assert!(handle.epoch() > epoch);
    assert_eq!(
        support::count_rows(&handle, "SELECT count(*) FROM log").await,
        written
    );
    router.close().await;
}

/// A role that runs setup but may not grant CREATE on the database to the application's role
/// gets a refusal saying what to do, and nothing changes (a GRANT without the grant option is
/// only a warning in PostgreSQL).
#[tokio::test]
async fn setup_refuses_grants_it_cannot_give_before_changing_anything() {
    let db = TestDatabase::create().await.expect("test database");
    let admin = db.connect().await.expect("connect");
    let owner = db.create_role("owner").await.unwrap();
    let app = db.create_role("app").await.unwrap();
    admin
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE \"{}\" TO {owner}; GRANT {app} TO {owner};",
            db.name(),
            owner = owner.name(),
            app = app.name()
        ))
        .await
        .unwrap();
    let mut as_owner = owner.connect().await.unwrap();
    let error =
        pgtenant::admin::setup_with(&mut as_owner, &SetupOptions::default().app_role(app.name()))
            .await
            .expect_err("cannot grant CREATE");
    assert!(
        matches!(&error, Error::InvalidOption { option: "app_role", reason, .. } if reason.contains("GRANT CREATE ON DATABASE")),
        "{error}"
    );
    assert_eq!(
        pgtenant::admin::control_plane_version(&admin)
            .await
            .unwrap(),
        0,
        "nothing was changed"
    );
}
