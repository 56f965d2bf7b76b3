//! Least privilege (DESIGN G8): the application's role cannot write the control plane, cannot
//! act for another replica, and the sweep trusts nothing it reads; an old control plane is
//! upgraded under a running replica of the previous release.

mod support;

use std::time::Duration;

use pgtenant::admin::SweepOptions;
use pgtenant::SetupOptions;
use pgtenant::{Error, Router};
use pgtenant_testkit::TestDatabase;
use support::{granted, options, sqlstate, tenant};

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
    mine.handoff_to(&support::replica("app-b"))
        .await
        .expect("handoff as app");
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
    let error = pgtenant::setup_with(&mut admin, &SetupOptions::default().app_role("nobody_here"))
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
    let error = pgtenant::setup_with(&mut as_owner, &SetupOptions::default().app_role(app.name()))
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

/// Issue 26, item 2: any role can NOTIFY. A role with no grants at all sends a handoff request
/// in the form replicas send, naming a live replica as the requester; the owner, under the
/// default `HandoffPolicy::Accept`, must not act on it: the control plane holds no request
/// that requester's incarnation wrote. A genuine request sent after it (notices arrive in
/// commit order, and the owner checks them one at a time) shows the forged one was seen and
/// ignored, and the request path itself keeps working.
#[tokio::test]
async fn a_forged_handoff_request_moves_nothing() {
    let (db, admin, app, _operator) = granted().await;
    let owner = Router::start(options(app.url(), "owner"))
        .await
        .expect("owner");
    let asker = Router::start(options(app.url(), "asker"))
        .await
        .expect("asker");
    let kept = owner.open_or_create(&tenant("kept")).await.expect("kept");
    support::create_log(&kept).await;
    let _asked = owner.open_or_create(&tenant("asked")).await.expect("asked");
    let epoch = kept.epoch();
    let mut events = owner.subscribe();

    let nobody = db.create_role("nobody").await.expect("role");
    let forger = nobody.connect().await.expect("connect as nobody");
    forger
        .batch_execute(r#"NOTIFY pgtenant_handoff, '{"tenant":"acme/kept","requester":"asker"}'"#)
        .await
        .expect("any role may NOTIFY");
    let moved = asker
        .request_handoff(&tenant("asked"), Duration::from_secs(20))
        .await
        .expect("a genuine request is answered");
    loop {
        match events.recv().await.expect("owner events") {
            pgtenant::Event::HandoffRequested { tenant, .. } if tenant == *moved.id() => break,
            pgtenant::Event::HandoffRequested {
                tenant, requester, ..
            } => {
                panic!("the owner answered a forged request for {tenant} from {requester}")
            }
            _ => {}
        }
    }
    // Nor can that role write a request, or the application's role one for another replica.
    let error = forger
        .batch_execute("SELECT pgtenant.request_handoff('acme/kept', 'asker', 1, 'guess')")
        .await
        .expect_err("no grant");
    assert_eq!(sqlstate(&error), Some("42501"), "{error:?}");
    let incarnation = asker.incarnation().expect("asker registered").get();
    let error = app
        .connect()
        .await
        .expect("connect as app")
        .query(
            "SELECT pgtenant.request_handoff('acme/kept', 'asker', $1, 'not-the-secret')",
            &[&incarnation],
        )
        .await
        .expect_err("wrong secret");
    assert_eq!(sqlstate(&error), Some("PTA01"), "{error:?}");

    // The forged request's tenant: still the owner's, same epoch, no reservation, serving.
    let row = admin
        .query_one(
            "SELECT owner, epoch, reserved_for FROM pgtenant.tenants WHERE key = 'acme/kept'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, Option<String>>(0),
            row.get::<_, pgtenant::Epoch>(1),
            row.get::<_, Option<String>>(2)
        ),
        (Some("owner".to_owned()), epoch, None)
    );
    support::append(&kept, "owner", 1)
        .await
        .expect("the owner keeps serving");
    let left: i64 = admin
        .query_one("SELECT count(*) FROM pgtenant.handoff_requests", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the genuine request was consumed");
    owner.close().await;
    asker.close().await;
}

/// The forger's creation of `payroll/other` at `epoch`, as a replica of this release makes it.
struct Creation<'a> {
    lease: &'a tokio_postgres::Client,
    epoch: i64,
    incarnation: i64,
    secret: &'a str,
}

impl Creation<'_> {
    async fn record(
        &self,
        schema: &str,
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.lease
            .query(
                "SELECT pgtenant.schema_created('payroll/other', $1, 'forger', $2, $3, $4, 1)",
                &[&self.epoch, &self.incarnation, &self.secret, &schema],
            )
            .await
    }
}

/// Issue 26, item 3: the control plane records and renames only schemas it can vouch for. As
/// the application's role, through the functions a replica calls: a schema of another owner,
/// a derived name of another owner, a derived name made before the creating transaction, and
/// a restore into a name pgtenant does not derive are each refused with nothing changed; a
/// record made before this release (the superuser writes it here, as the old schema_created
/// accepted it) is not renamed by forget, nor a forged trash row by restore.
#[tokio::test]
async fn the_control_plane_acts_only_on_schemas_it_can_vouch_for() {
    let (_db, admin, app, _operator) = granted().await;
    admin
        .batch_execute(
            "CREATE SCHEMA t_payroll_other_app; CREATE TABLE t_payroll_other_app.salaries (n int)",
        )
        .await
        .unwrap();
    let lease = app.connect().await.expect("lease session as app");
    let (incarnation, secret) = support::register_by_hand(&lease, "forger").await;
    let epoch: i64 = lease
        .query_one(
            "SELECT epoch FROM pgtenant.acquire('payroll/other', 'payroll', 'other', 'forger', $1, $2, true)",
            &[&incarnation, &secret],
        )
        .await
        .expect("acquire for creation")
        .get(0);
    let derived = pgtenant::TenantId::new("payroll", "other")
        .unwrap()
        .schema_name(epoch);
    let creation = Creation {
        lease: &lease,
        epoch,
        incarnation,
        secret: &secret,
    };
    let recorded = || async {
        admin
            .query_one(
                "SELECT schema_name FROM pgtenant.tenants WHERE key = 'payroll/other'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, Option<String>>(0)
    };
    // Another owner's schema, under any name.
    let error = creation
        .record("t_payroll_other_app")
        .await
        .expect_err("a foreign schema");
    assert_eq!(sqlstate(&error), Some("PTV01"), "{error:?}");
    // The derived name, but the superuser's.
    admin
        .batch_execute(&format!("CREATE SCHEMA {derived}"))
        .await
        .unwrap();
    let error = creation.record(&derived).await.expect_err("not the app's");
    assert_eq!(sqlstate(&error), Some("PTV01"), "{error:?}");
    assert!(format!("{error:?}").contains("owned by"), "{error:?}");
    // The derived name, the application's, but made before this transaction.
    admin
        .batch_execute(&format!("DROP SCHEMA {derived}"))
        .await
        .unwrap();
    lease
        .batch_execute(&format!("CREATE SCHEMA {derived}"))
        .await
        .unwrap();
    let error = creation.record(&derived).await.expect_err("made earlier");
    assert_eq!(sqlstate(&error), Some("PTV01"), "{error:?}");
    assert!(
        format!("{error:?}").contains("not created by this transaction"),
        "{error:?}"
    );
    assert_eq!(recorded().await, None, "nothing was recorded");
    // The way creation does it: made in the same transaction, derived, the application's.
    lease
        .batch_execute(&format!(
            "DROP SCHEMA {derived}; BEGIN READ WRITE; CREATE SCHEMA {derived}"
        ))
        .await
        .unwrap();
    creation
        .record(&derived)
        .await
        .expect("a schema it can vouch for");
    lease.batch_execute("COMMIT").await.unwrap();
    assert_eq!(recorded().await, Some(derived.clone()));

    // A record of a foreign schema made before this release: forget refuses to rename it.
    admin
        .batch_execute(
            "UPDATE pgtenant.tenants SET schema_name = 't_payroll_other_app' WHERE key = 'payroll/other'",
        )
        .await
        .unwrap();
    let error = lease
        .query(
            "SELECT pgtenant.forget('payroll/other', $1, 'forger', $2, $3)",
            &[&epoch, &incarnation, &secret],
        )
        .await
        .expect_err("forget a foreign schema");
    assert_eq!(sqlstate(&error), Some("PTV01"), "{error:?}");
    let row = admin
        .query_one(
            "SELECT t.schema_name, t.forgotten_at_epoch, to_regnamespace('t_payroll_other_app') IS NOT NULL,
                    (SELECT count(*) FROM pgtenant.trash)
               FROM pgtenant.tenants t WHERE t.key = 'payroll/other'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, Option<String>>(0),
            row.get::<_, i64>(1),
            row.get::<_, bool>(2),
            row.get::<_, i64>(3)
        ),
        (Some("t_payroll_other_app".to_owned()), 0, true, 0),
        "nothing changed"
    );

    // Through the public API: a tenant whose schema now belongs to someone else is not
    // forgotten (a typed error), and serves on.
    let router = Router::start(options(app.url(), "app-r"))
        .await
        .expect("router");
    let mine = router
        .open_or_create(&tenant("given-away"))
        .await
        .expect("create");
    admin
        .batch_execute(&format!(
            "ALTER SCHEMA {} OWNER TO CURRENT_USER",
            mine.schema()
        ))
        .await
        .unwrap();
    match mine.forget(pgtenant::ActiveWork::Refuse).await {
        Err(Error::ForeignSchema { message, .. }) => {
            assert!(message.contains("owned by"), "{message}")
        }
        other => panic!("expected ForeignSchema, got {other:?}"),
    }
    assert!(mine.is_serving(), "still serving");

    // A forged trash row naming the superuser's schema under a derived trash name: restore
    // refuses it and renames nothing.
    let gone = pgtenant::TenantId::new("payroll", "gone").unwrap();
    let forged = format!("trash_{}", gone.schema_name(1));
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {forged};
             INSERT INTO pgtenant.tenants (key, organization, ledger, epoch, forgotten_at_epoch)
             VALUES ('payroll/gone', 'payroll', 'gone', 1, 1);
             INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name)
             VALUES ('{forged}', 'payroll/gone', 1, '{}')",
            gone.schema_name(1)
        ))
        .await
        .unwrap();
    match router.restore(&gone).await {
        Err(Error::RestoreRefused { reason, .. }) => {
            assert!(reason.contains("not one pgtenant made"), "{reason}")
        }
        other => panic!(
            "expected RestoreRefused, got {:?}",
            other.map(|h| h.schema().to_owned())
        ),
    }
    let still: bool = admin
        .query_one("SELECT to_regnamespace($1) IS NOT NULL", &[&forged])
        .await
        .unwrap()
        .get(0);
    assert!(still, "the superuser's schema keeps its name");

    // A genuine trash row, restored by hand into a name pgtenant does not derive for the new
    // life (the right epoch, another hash): refused.
    let back = router
        .open_or_create(&tenant("back"))
        .await
        .expect("create");
    let trashed = back
        .forget(pgtenant::ActiveWork::Refuse)
        .await
        .expect("forget");
    let next: i64 = admin
        .query_one(
            "SELECT pgtenant.next_epoch(epoch) FROM pgtenant.tenants WHERE key = 'acme/back'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let error = lease
        .query(
            "SELECT * FROM pgtenant.restore('acme/back', 'forger', $1, $2, $3)",
            &[
                &incarnation,
                &secret,
                &format!("t_acme__back_{next}_0123456789"),
            ],
        )
        .await
        .expect_err("a name pgtenant does not derive");
    assert_eq!(sqlstate(&error), Some("PTV01"), "{error:?}");
    let kept: bool = admin
        .query_one("SELECT to_regnamespace($1) IS NOT NULL", &[&trashed])
        .await
        .unwrap()
        .get(0);
    assert!(kept, "the trashed schema is still in the trash");
    let restored = router.restore(&tenant("back")).await.expect("restore");
    assert_eq!(restored.schema(), tenant("back").schema_name(next));
    router.close().await;
}

/// Issue 26, item 7: fleet status is for the roles setup granted. A role with no grants can
/// call none of the status functions (they run as the control plane's owner); the application
/// and operator roles read the views as before, the operators `status_report` too.
#[tokio::test]
async fn status_is_for_the_granted_roles_only() {
    let (db, _admin, app, operator) = granted().await;
    let router = Router::start(options(app.url(), "seen"))
        .await
        .expect("router");
    let nobody = db.create_role("nobody").await.expect("role");
    let nobody = nobody.connect().await.expect("connect as nobody");
    for sql in [
        "SELECT * FROM pgtenant.status_report(0)",
        "SELECT * FROM pgtenant.replica_status_rows()",
        "SELECT * FROM pgtenant.fleet_status_rows(0)",
        "SELECT * FROM pgtenant.sweep_backlog_rows(0)",
        "SELECT * FROM pgtenant.replica_status",
        "SELECT * FROM pgtenant.fleet_status",
        "SELECT * FROM pgtenant.lease_status",
    ] {
        let error = nobody.batch_execute(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&error), Some("42501"), "{sql}: {error:?}");
    }
    let app = app.connect().await.expect("connect as app");
    let operator = operator.connect().await.expect("connect as operator");
    for (client, sql) in [
        (&app, "SELECT count(*) FROM pgtenant.replica_status"),
        (&app, "SELECT count(*) FROM pgtenant.fleet_status"),
        (&operator, "SELECT count(*) FROM pgtenant.replica_status"),
        (&operator, "SELECT count(*) FROM pgtenant.fleet_status"),
        (&operator, "SELECT count(*) FROM pgtenant.status_report(0)"),
    ] {
        client.query_one(sql, &[]).await.expect(sql);
    }
    pgtenant::admin::status_report(&operator, Duration::from_secs(3600))
        .await
        .expect("status as operator");
    router.close().await;
}

/// What PUBLIC (every role) can use in schema `pgtenant`, from the catalogs: exactly this list
/// (issue 26's class search: a future grant to PUBLIC fails here). USAGE on the schema, so a
/// role the work switched to still reaches the fence, whose scrub switches it back, and
/// functions that run with the caller's rights and touch only its own session or what its
/// own grants let it read. No relation, no sequence, no SECURITY DEFINER function. And every
/// SECURITY DEFINER function has a fixed search_path.
#[tokio::test]
async fn public_can_use_only_the_allow_listed_objects() {
    const PUBLIC_FUNCTIONS: [&str; 17] = [
        "pgtenant.enter(text,text)",
        "pgtenant.epoch_floor()",
        "pgtenant.fence(text,bigint)",
        "pgtenant.fence(text,bigint,integer,text)",
        "pgtenant.fence(text,bigint,integer,text,boolean,boolean)", // V14: the one fence
        "pgtenant.fence_read(text,bigint,integer,text)",
        "pgtenant.fence_read_signalled(text,bigint,integer,text)",
        "pgtenant.fence_refusal(text,bigint,bigint,text,text,bigint)",
        "pgtenant.fence_refusal_before_failover(text,bigint)",
        "pgtenant.fence_signalled(text,bigint,integer,text)",
        // V15: placement. home reads the replicas with the caller's rights (readers of the
        // placement view and locate have them); the other two compute only.
        "pgtenant.home(text)",
        "pgtenant.home_among(text,text[],double precision[])",
        "pgtenant.lock_namespace()",
        "pgtenant.next_epoch(bigint)",
        "pgtenant.placement_score(text,text,double precision)",
        "pgtenant.reset_session(text)",
        "pgtenant.tenant_lock_namespace()",
    ];
    let (_db, admin, _app, _operator) = granted().await;
    let functions: Vec<String> = admin
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
              WHERE p.pronamespace = 'pgtenant'::regnamespace
                AND has_function_privilege('public', p.oid, 'EXECUTE')
              ORDER BY p.oid::regprocedure::text COLLATE \"C\"",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(functions, PUBLIC_FUNCTIONS, "functions PUBLIC can execute");
    let definer: Vec<String> = admin
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
              WHERE p.pronamespace = 'pgtenant'::regnamespace AND p.prosecdef
                AND (has_function_privilege('public', p.oid, 'EXECUTE')
                     OR NOT coalesce(EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search\\_path=%'), false))
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(
        definer.is_empty(),
        "SECURITY DEFINER functions open to PUBLIC or without a fixed search_path: {definer:?}"
    );
    let relations: Vec<String> = admin
        .query(
            "SELECT c.oid::regclass::text FROM pg_class c
              WHERE c.relnamespace = 'pgtenant'::regnamespace
                AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
                AND CASE WHEN c.relkind = 'S'
                         THEN has_sequence_privilege('public', c.oid, 'SELECT, USAGE, UPDATE')
                         ELSE has_table_privilege('public', c.oid,
                                  'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
                              OR has_any_column_privilege('public', c.oid, 'SELECT, INSERT, UPDATE, REFERENCES')
                    END
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(
        relations.is_empty(),
        "relations PUBLIC can use: {relations:?}"
    );
    let schema = admin
        .query_one(
            "SELECT has_schema_privilege('public', 'pgtenant', 'USAGE'),
                    has_schema_privilege('public', 'pgtenant', 'CREATE')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((schema.get(0), schema.get(1)), (true, false));
}

/// The control plane vouches for a schema by deriving its name itself
/// (`pgtenant.derived_schema_names`): it must derive exactly what the library does, for short
/// and longest ids (whose readable parts are shortened), hyphens, and epochs of every length,
/// after a failover's floor too. Salted names are checked by creation itself
/// (`tests/ledgers.rs`, creation_survives_a_taken_schema_name).
#[tokio::test]
async fn the_control_plane_derives_the_names_the_library_derives() {
    let (_db, admin) = support::database().await;
    let long = "a".repeat(29) + "z";
    let longest = "Z".repeat(127) + "9";
    let ids = [
        ("acme", "one"),
        ("a", "b"),
        ("a-b", "c"),
        ("a", "b-c"),
        ("0rg-9", "ledger-2024-q1"),
        (long.as_str(), "x"),
        ("x", long.as_str()),
        (long.as_str(), long.as_str()),
        // The id rules of #27: case kept, dots and underscores, 128 bytes.
        ("3F2C1A9E-8B7D-4C6E-9F1A-2B3C4D5E6F70", "main"),
        ("Acme.Com", "org_2NxX.k"),
        ("01HV5Z6Q3C8M9D2K7W4T0R1YXE", longest.as_str()),
    ];
    for (organization, ledger) in ids {
        let id = pgtenant::TenantId::new(organization, ledger).expect("valid id");
        for epoch in [
            0_i64,
            1,
            9,
            10,
            12_345,
            (1 << 40) + 1,
            999_999_999_999_999_999,
        ] {
            let names: Vec<String> = admin
                .query(
                    "SELECT pgtenant.derived_schema_names($1, $2)",
                    &[&id.key(), &epoch],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            assert_eq!(names.len(), 9, "{id} at {epoch}: {names:?}");
            assert_eq!(names[0], id.schema_name(epoch), "{id} at {epoch}");
            let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
            assert_eq!(distinct.len(), 9, "{id} at {epoch}: {names:?}");
            assert!(
                names.iter().all(|name| name.len() <= 57),
                "{id} at {epoch}: {names:?}"
            );
        }
    }
    let none: i64 = admin
        .query_one(
            "SELECT count(*) FROM pgtenant.derived_schema_names('-not/valid', 1)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(none, 0);
}

/// During an upgrade, replicas of the previous release act on any NOTIFY on
/// `pgtenant_handoff` whose payload is `{"tenant", "requester"}`: a request of this release
/// (a row, then that NOTIFY from the control plane) still reaches them in that form. (The
/// other way round, a request of the previous release is a bare NOTIFY, which this release's
/// owners ignore like the forged one above.)
#[tokio::test]
async fn a_request_still_reaches_an_owner_of_the_previous_release() {
    let (_db, _admin, app, _operator) = granted().await;
    // The previous release's owner: registered and holding the tenant, its lease session
    // listening as that release's did.
    let (old, mut connection) = app.config().connect(tokio_postgres::NoTls).await.unwrap();
    let (notices, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let Ok(tokio_postgres::AsyncMessage::Notification(n)) = message {
                let _ = notices.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    let (incarnation, secret) = support::register_by_hand(&old, "old-owner").await;
    let epoch: i64 = old
        .query_one(
            "SELECT epoch FROM pgtenant.acquire('acme/wanted', 'acme', 'wanted', 'old-owner', $1, $2, true)",
            &[&incarnation, &secret],
        )
        .await
        .expect("the old owner holds the tenant")
        .get(0);
    let schema = tenant("wanted").schema_name(epoch);
    old.batch_execute(&format!("BEGIN READ WRITE; CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    old.query(
        "SELECT pgtenant.schema_created('acme/wanted', $1, 'old-owner', $2, $3, $4, 0)",
        &[&epoch, &incarnation, &secret, &schema],
    )
    .await
    .expect("created");
    old.batch_execute("COMMIT").await.unwrap();
    old.batch_execute("LISTEN pgtenant_handoff").await.unwrap();

    let new = Router::start(options(app.url(), "new-asker"))
        .await
        .expect("router");
    match new
        .request_handoff(&tenant("wanted"), Duration::from_millis(300))
        .await
    {
        Err(Error::OpenTimeout { .. } | Error::LeaseHeld { .. }) => {}
        other => panic!("expected a timeout, got {:?}", other.map(|h| h.epoch())),
    }
    let (channel, payload) = heard.recv().await.expect("a notice");
    assert_eq!(channel, "pgtenant_handoff");
    let request: serde_json::Value = serde_json::from_str(&payload).expect("JSON");
    assert_eq!(
        request,
        serde_json::json!({"tenant": "acme/wanted", "requester": "new-asker"})
    );
    new.close().await;
}

/// The previous release's control plane (V10, its roles granted by its setup) is brought to
/// this one's under a replica of that release, speaking its own SQL as the application's role:
/// its fenced writes go on across the upgrade, its heartbeat and status reads still work (the
/// migration grants the recorded roles the status functions PUBLIC loses), and it forgets a
/// tenant it created (a schema the control plane can vouch for), which this release restores.
#[tokio::test]
async fn a_v10_control_plane_is_upgraded_under_a_running_replica_of_the_previous_release() {
    let db = TestDatabase::create().await.expect("test database");
    let mut admin = db.connect().await.expect("connect");
    let app = db.create_role("app").await.expect("app role");
    let operator = db.create_role("op").await.expect("operator role");
    support::control_plane_at(&mut admin, 10).await;
    admin
        .execute(
            "SELECT pgtenant.grant_roles($1::text::name, $2::text::name)",
            &[&app.name(), &operator.name()],
        )
        .await
        .expect("the previous release's grants");

    let lease = app.connect().await.expect("lease session as app");
    let (incarnation, secret) = support::register_by_hand(&lease, "old").await;
    let row = lease
        .query_one(
            "SELECT epoch, lock_key FROM pgtenant.acquire('acme/kept', 'acme', 'kept', 'old', $1, $2, true)",
            &[&incarnation, &secret],
        )
        .await
        .expect("acquire");
    let (epoch, tenant_lock): (i64, i32) = (row.get(0), row.get(1));
    let schema = tenant("kept").schema_name(epoch);
    lease
        .batch_execute(&format!(
            "BEGIN READ WRITE; CREATE SCHEMA {schema}; CREATE TABLE {schema}.log (n bigint PRIMARY KEY)"
        ))
        .await
        .unwrap();
    lease
        .query(
            "SELECT pgtenant.schema_created('acme/kept', $1, 'old', $2, $3, $4, 0)",
            &[&epoch, &incarnation, &secret, &schema],
        )
        .await
        .expect("created");
    lease.batch_execute("COMMIT").await.unwrap();

    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let (progress, mut acked) = tokio::sync::watch::channel(0_i64);
    let mut writer = app.connect().await.expect("data session as app");
    let writing = tokio::spawn(async move {
        let mut n = 0_i64;
        while stopped.try_recv().is_err() {
            let tx = writer.transaction().await.expect("begin");
            tx.query(
                "SELECT pgtenant.fence($1, $2, $3, '60000')",
                &[&"acme/kept", &epoch, &tenant_lock],
            )
            .await
            .expect("the fence passes across the upgrade");
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
    let upgrade = pgtenant::setup(&mut admin).await.expect("upgrade");
    assert_eq!(upgrade.applied, support::migration_names(10));
    let at_upgrade = *acked.borrow();
    acked
        .wait_for(|n| *n >= at_upgrade + 20)
        .await
        .expect("still writing after the upgrade");
    let _ = stop.send(());
    let written = writing.await.expect("writer");

    let renewed: bool = lease
        .query_one(
            "SELECT pgtenant.heartbeat('old', $1, $2, 60000)",
            &[&incarnation, &secret],
        )
        .await
        .expect("heartbeat")
        .get(0);
    assert!(renewed);
    for sql in [
        "SELECT count(*) FROM pgtenant.replica_status",
        "SELECT count(*) FROM pgtenant.fleet_status",
        // V15: the grants of replica_status reach locate.
        "SELECT count(*) FROM pgtenant.locate('acme/kept')",
    ] {
        lease.query_one(sql, &[]).await.expect(sql);
    }
    let as_operator = operator.connect().await.expect("connect as operator");
    as_operator
        .query_one("SELECT owner FROM pgtenant.locate('acme/kept')", &[])
        .await
        .expect("the operator locates");
    pgtenant::admin::status_report(&as_operator, Duration::from_secs(3600))
        .await
        .expect("status as operator");
    let trashed: String = lease
        .query_one(
            "SELECT pgtenant.forget('acme/kept', $1, 'old', $2, $3)",
            &[&epoch, &incarnation, &secret],
        )
        .await
        .expect("the old replica forgets its tenant")
        .get(0);
    assert_eq!(trashed, format!("trash_{schema}"));

    let router = Router::start(options(app.url(), "new"))
        .await
        .expect("router");
    let back = router.restore(&tenant("kept")).await.expect("restore");
    assert_eq!(
        support::count_rows(&back, "SELECT count(*) FROM log").await,
        written
    );
    router.close().await;
}
