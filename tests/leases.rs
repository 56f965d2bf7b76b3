//! Leases in one process: single owner (G1), growing epochs (G2), the DB-side fence (G3),
//! liveness, heartbeat expiry and resume, and what fenced work leaves on pooled connections.

mod support;

use std::time::{Duration, Instant};

use pgtenant::{Error, Event, Fencing, Router};
use support::{append, create_log, database, options, router, tenant};

#[tokio::test]
async fn two_replicas_race_for_a_tenant_100_times_and_exactly_one_wins() {
    let (db, _client) = database().await;
    let a = router(db.url(), "race-a").await;
    let b = router(db.url(), "race-b").await;
    for round in 0..100 {
        let id = tenant(&format!("race-{round}"));
        let (ra, rb) = tokio::join!(a.open_or_create(&id), b.open_or_create(&id));
        let (winner, loser_error) = match (ra, rb) {
            (Ok(_), Err(e)) => ("race-a", e),
            (Err(e), Ok(_)) => ("race-b", e),
            (ra, rb) => panic!("round {round}: exactly one must win: {ra:?} / {rb:?}"),
        };
        match loser_error {
            Error::LeaseHeld {
                owner, owner_alive, ..
            } => {
                assert_eq!(
                    owner, winner,
                    "round {round}: the loser's error names the winner"
                );
                assert!(owner_alive);
            }
            other => panic!("round {round}: expected LeaseHeld, got {other}"),
        }
    }
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn epochs_strictly_increase_across_1000_random_acquisitions_by_three_replicas() {
    let (db, client) = database().await;
    let routers = [
        router(db.url(), "epoch-0").await,
        router(db.url(), "epoch-1").await,
        router(db.url(), "epoch-2").await,
    ];
    let ids: Vec<_> = (0..5).map(|i| tenant(&format!("epochs-{i}"))).collect();
    let mut holder: Vec<Option<usize>> = vec![None; ids.len()];
    let mut last_epoch = vec![0_i64; ids.len()];
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for step in 0..1000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let (t, r) = ((seed % 5) as usize, ((seed >> 8) % 3) as usize);
        if let Some(h) = holder[t] {
            if h != r {
                let handle = routers[h].handle_of(&ids[t]).expect("holder serves it");
                handle.release().await.expect("release");
            }
        }
        let handle = routers[r]
            .open_or_create(&ids[t])
            .await
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        if holder[t] != Some(r) {
            assert!(
                handle.epoch() > last_epoch[t],
                "step {step}: epoch {} after {}",
                handle.epoch(),
                last_epoch[t]
            );
        }
        last_epoch[t] = handle.epoch().get();
        holder[t] = Some(r);
    }
    // The journal agrees: per tenant, acquisitions carry strictly increasing epochs.
    let violations: i64 = client
        .query_one(
            "SELECT count(*) FROM (
                 SELECT epoch, lag(epoch) OVER (PARTITION BY tenant_key ORDER BY id) AS previous
                 FROM pgtenant.history WHERE event = 'acquired') h
             WHERE epoch <= previous",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(violations, 0);
    for r in &routers {
        r.close().await;
    }
}

#[tokio::test]
async fn a_second_live_process_with_the_same_replica_id_is_refused_with_the_holder() {
    let (db, client) = database().await;
    let first = router(db.url(), "twin").await;
    let lease_pid: i32 = client
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgtenant lease twin'",
            &[],
        )
        .await
        .expect("the lease session is visible")
        .get(0);
    let error = Router::start(options(db.url(), "twin"))
        .await
        .expect_err("refused");
    match &error {
        Error::ReplicaIdInUse {
            replica_id,
            holder_pid,
            since,
            ..
        } => {
            assert_eq!(replica_id, "twin");
            assert_eq!(*holder_pid, lease_pid);
            assert!(since.is_some());
        }
        other => panic!("expected ReplicaIdInUse, got {other}"),
    }
    assert!(
        error.to_string().contains(&lease_pid.to_string()),
        "{error}"
    );
    let incarnation = first.incarnation().unwrap();
    first.close().await;
    let again = router(db.url(), "twin").await;
    assert!(
        again.incarnation().unwrap() > incarnation,
        "a restart is a new incarnation"
    );
    again.close().await;
}

#[tokio::test]
async fn invalid_options_are_refused_before_connecting() {
    let unreachable = "postgres://postgres@127.0.0.1:1/nowhere";
    let cases = [
        (options(unreachable, "bad id!"), "replica_id"),
        (
            options(unreachable, "").ttl(Duration::from_secs(5)),
            "replica_id",
        ),
        (
            options(unreachable, "ok").ttl(Duration::from_millis(10)),
            "ttl",
        ),
        (
            options(unreachable, "ok").heartbeat_period(Duration::from_secs(1)),
            "heartbeat_period",
        ),
        (
            options(unreachable, "ok").margin(Duration::from_millis(1300)),
            "margin",
        ),
        (options(unreachable, "ok").pool_size(0), "pool_size"),
    ];
    for (options, expected) in cases {
        match Router::start(options).await {
            Err(Error::InvalidOption { option, reason, .. }) => {
                assert_eq!(option, expected, "{reason}");
                assert!(!reason.is_empty());
            }
            Err(other) => panic!("{expected}: expected InvalidOption, got {other}"),
            Ok(_) => panic!("{expected}: accepted"),
        }
    }
    assert!(matches!(
        pgtenant::RouterOptions::from_url("ok", "not a url"),
        Err(Error::InvalidOption {
            option: "database_url",
            ..
        })
    ));
}

#[tokio::test]
async fn fenced_work_is_pinned_to_the_tenant_and_leaves_pooled_connections_clean() {
    let (db, admin) = database().await;
    let router = Router::start(options(db.url(), "pinned").pool_size(1))
        .await
        .unwrap();
    let handle = router.open_or_create(&tenant("pinned")).await.unwrap();
    create_log(&handle).await;
    let schema = handle.schema().to_owned();

    // Inside: search_path is the tenant's schema only, then pg_temp.
    let seen: String = handle
        .run(|tx| {
            Box::pin(
                async move { Ok::<_, Error>(tx.query_one("SHOW search_path", &[]).await?.get(0)) },
            )
        })
        .await
        .unwrap();
    // pg_temp named last: a temp object never shadows a ledger table (G6).
    assert_eq!(seen, format!("{schema}, pg_temp"));

    // The caller's own error type flows back, and its transaction rolls back.
    #[derive(Debug)]
    enum AppError {
        Rejected,
        Tenant(#[allow(dead_code)] Error),
    }
    impl From<Error> for AppError {
        fn from(e: Error) -> Self {
            AppError::Tenant(e)
        }
    }
    let outcome: Result<(), AppError> = handle
        .run(|tx| {
            Box::pin(async move {
                // One From (pgtenant::Error) is enough: tx's statements return it.
                tx.execute("INSERT INTO log VALUES (1, 1, 'x', 0)", &[])
                    .await?;
                Err(AppError::Rejected)
            })
        })
        .await;
    assert!(matches!(outcome, Err(AppError::Rejected)), "{outcome:?}");

    // Cancelled mid-transaction: the future is dropped while the server sleeps.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        handle.run(|tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO log VALUES (1, 2, 'x', 0)", &[])
                    .await?;
                tx.execute("SELECT pg_sleep(1)", &[]).await?;
                Ok::<_, Error>(())
            })
        }),
    )
    .await;
    assert!(cancelled.is_err(), "timed out");

    // A panic inside the work.
    let panicking = handle.clone();
    let joined = tokio::spawn(async move {
        panicking
            .run(|tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO log VALUES (1, 3, 'x', 0)", &[])
                        .await?;
                    panic!("application bug");
                    #[allow(unreachable_code)]
                    Ok::<_, Error>(())
                })
            })
            .await
    })
    .await;
    assert!(joined.is_err(), "the panic reaches the caller");

    // The pool's only connection: no open transaction, default search_path, no leftover rows.
    let connection = router.connection().await.unwrap();
    let row = connection
        .query_one(
            "SELECT pg_backend_pid(), current_setting('search_path'),
                    current_setting('idle_in_transaction_session_timeout')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(1), "\"$user\", public");
    assert_eq!(row.get::<_, String>(2), "0");
    let pid: i32 = row.get(0);
    let state: String = admin
        .query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "idle", "no transaction left open");
    drop(connection);
    let rows = support::count_rows(&handle, "SELECT count(*) FROM log").await;
    assert_eq!(
        rows, 0,
        "nothing of the failed, cancelled or panicked work committed"
    );
    router.close().await;
}

/// G3 enforced by PostgreSQL: a transaction that passed every local check, but reaches the
/// database after a takeover, is refused there and commits nothing.
#[tokio::test]
async fn a_stale_epoch_is_refused_by_the_database_itself() {
    let (db, client) = database().await;
    // The in-database fence of every transaction (session fencing's counterpart, which
    // terminates the stale owner's sessions instead, is in tests/session_fencing.rs).
    let old = Router::start(
        options(db.url(), "stale-old")
            .pool_size(1)
            .fencing(Fencing::Transaction),
    )
    .await
    .unwrap();
    let new = Router::start(options(db.url(), "stale-new").fencing(Fencing::Transaction))
        .await
        .unwrap();
    let id = tenant("stale");
    let handle = old.open_or_create(&id).await.unwrap();
    create_log(&handle).await;

    // Hold the old owner's only pooled connection, so its next work waits for it after
    // passing the local checks…
    let parked = old.connection().await.unwrap();
    let pending = {
        let handle = handle.clone();
        tokio::spawn(async move { append(&handle, "stale-old", 1).await })
    };
    // …and stall its heartbeats (they block on the replica row) until the lease expires.
    let mut blocker = db.connect().await.unwrap();
    let stall = blocker.transaction().await.unwrap();
    stall
        .execute(
            "SELECT 1 FROM pgtenant.replicas WHERE replica_id = 'stale-old' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let taken = acquire_after_expiry(&new, &id).await;
    assert_eq!(taken.epoch(), handle.epoch() + 1);

    drop(parked); // the stale work now reaches PostgreSQL
    match pending.await.unwrap() {
        Err(Error::Fenced { epoch, message, .. }) => {
            assert_eq!(epoch, handle.epoch());
            assert!(message.contains("fenced"), "{message}");
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    stall.rollback().await.unwrap();
    let rows = support::count_rows(&taken, "SELECT count(*) FROM log").await;
    assert_eq!(rows, 0, "the stale write is not in the ledger");
    // And in plain SQL, whatever the client: a stale epoch cannot pass the fence.
    let error = client
        .query_one(
            "SELECT pgtenant.fence($1, $2)",
            &[&id.key(), &handle.epoch()],
        )
        .await
        .expect_err("stale epoch");
    assert_eq!(error.code().unwrap().code(), pgtenant::sqlstate::FENCED);
    new.close().await;
}

/// Retries an open until the holder's lease has expired by the database clock, sleeping for the
/// time the database says is left.
async fn acquire_after_expiry(router: &Router, id: &pgtenant::TenantId) -> pgtenant::TenantHandle {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match router.open(id).await {
            Ok(handle) => return handle,
            Err(Error::LeaseHeld { expires_in, .. }) if Instant::now() < deadline => {
                tokio::time::sleep(expires_in.unwrap_or_default() + Duration::from_millis(20))
                    .await;
            }
            Err(other) => panic!("takeover failed: {other}"),
        }
    }
}

#[tokio::test]
async fn an_owners_in_flight_commit_lands_before_the_contenders_epoch() {
    let (db, _client) = database().await;
    // Under transaction fencing the contender's acquisition waits for the work in flight
    // (under session fencing, abandon terminates it: tests/session_fencing.rs).
    let transaction = |replica| options(db.url(), replica).fencing(Fencing::Transaction);
    let owner = Router::start(transaction("inflight-owner")).await.unwrap();
    let contender = Router::start(transaction("inflight-contender"))
        .await
        .unwrap();
    let id = tenant("inflight");
    let handle = owner.open_or_create(&id).await.unwrap();
    create_log(&handle).await;

    let (started_tx, started) = tokio::sync::oneshot::channel();
    let epoch = handle.epoch();
    let long = {
        let handle = handle.clone();
        tokio::spawn(async move {
            handle
                .run(move |tx| {
                    Box::pin(async move {
                        tx.execute("INSERT INTO log VALUES ($1, 1, 'owner', 0)", &[&epoch])
                            .await?;
                        let _ = started_tx.send(());
                        tx.execute("SELECT pg_sleep(0.5)", &[]).await?;
                        Ok::<_, Error>(())
                    })
                })
                .await
        })
    };
    started.await.unwrap();
    // The owner walks away without draining; its transaction is still open.
    handle.abandon().await.unwrap();
    let taken = contender
        .open(&id)
        .await
        .expect("the contender acquires once the commit landed");
    assert!(long.is_finished() || long.await.unwrap().is_ok());
    assert_eq!(taken.epoch(), epoch + 1);
    let rows: Vec<(pgtenant::Epoch, String)> = taken
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, Error>(
                    tx.query("SELECT epoch, writer FROM log", &[])
                        .await?
                        .iter()
                        .map(|r| (r.get(0), r.get(1)))
                        .collect(),
                )
            })
        })
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![(epoch, "owner".to_owned())],
        "the in-flight commit landed first"
    );
    assert!(matches!(
        append(&handle, "owner", 2).await,
        Err(Error::LeaseLost { .. })
    ));
    owner.close().await;
    contender.close().await;
}

#[tokio::test]
async fn failing_heartbeats_stop_handles_locally_and_a_later_heartbeat_resumes_them() {
    let (db, _client) = database().await;
    let router = router(db.url(), "lapse").await;
    let handle = router.open_or_create(&tenant("lapse")).await.unwrap();
    create_log(&handle).await;
    let mut events = router.subscribe();

    let mut blocker = db.connect().await.unwrap();
    let stall = blocker.transaction().await.unwrap();
    stall
        .execute(
            "SELECT 1 FROM pgtenant.replicas WHERE replica_id = 'lapse' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    // Each failed heartbeat is an event; after enough of them the local deadline has passed.
    let mut seq = 0;
    loop {
        match events.recv().await.unwrap() {
            Event::RenewFailed { .. } => {}
            _ => continue,
        }
        seq += 1;
        match append(&handle, "lapse", seq).await {
            Err(error @ Error::ExpiredLocally { .. }) => {
                assert!(error.is_retryable());
                break;
            }
            Ok(()) => {}
            Err(other) => panic!("expected ExpiredLocally, got {other}"),
        }
    }
    stall.rollback().await.unwrap();
    loop {
        if let Event::Resumed { .. } = events.recv().await.unwrap() {
            break;
        }
    }
    append(&handle, "lapse", 1000)
        .await
        .expect("serving again after the resume");
    router.close().await;
}

#[tokio::test]
async fn a_terminated_lease_session_loses_every_lease_and_the_replica_registers_again() {
    let (db, client) = database().await;
    let router = router(db.url(), "cut").await;
    let id = tenant("cut");
    let handle = router.open_or_create(&id).await.unwrap();
    create_log(&handle).await;
    for seq in 0..20 {
        append(&handle, "cut", seq).await.unwrap();
    }
    let incarnation = router.incarnation().unwrap();
    let mut events = router.subscribe();
    let cut_at = Instant::now();
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgtenant lease cut'",
            &[],
        )
        .await
        .unwrap();
    let mut lost = false;
    loop {
        match events.recv().await.unwrap() {
            Event::Lost { tenant, .. } if tenant == id.key() => {
                println!(
                    "lease session cut: leases lost after {:?}",
                    cut_at.elapsed()
                );
                lost = true;
            }
            Event::Registered {
                incarnation: new, ..
            } => {
                assert!(lost, "leases are lost before the new incarnation");
                assert!(new > incarnation);
                break;
            }
            _ => {}
        }
    }
    assert!(
        cut_at.elapsed() < Duration::from_secs(5),
        "noticed within the documented bound"
    );
    assert!(matches!(
        append(&handle, "cut", 99).await,
        Err(Error::LeaseLost { .. })
    ));
    let again = router.open(&id).await.expect("reacquire");
    assert!(again.epoch() > handle.epoch());
    let acked = support::count_rows(&again, "SELECT count(*) FROM log").await;
    assert_eq!(acked, 20, "every acknowledged write is present");
    router.close().await;
}

/// Releasing or forgetting one tenant reads one entry of the owner index, however many tenants
/// the owner holds: the statements name the tenant by key *and* owner, and a planner that picks
/// the owner index (stale statistics do that) must still go straight to the row. The primary
/// key is dropped inside the (rolled back) transaction so no other plan can hide a scan.
#[tokio::test]
async fn release_and_forget_read_one_owner_index_entry_however_many_tenants_are_held() {
    const HELD: i64 = 500;
    let (db, mut client) = database().await;
    let holder = router(db.url(), "many").await;
    let incarnation = holder.incarnation().expect("registered");
    client
        .execute(
            "INSERT INTO pgtenant.tenants (key, organization, ledger, epoch, owner, owner_incarnation)
             SELECT 'acme/held-' || g, 'acme', 'held-' || g, 1, 'many', $1
               FROM generate_series(1, $2::bigint) g",
            &[&incarnation, &HELD],
        )
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(
        "ALTER TABLE pgtenant.tenants DROP CONSTRAINT tenants_pkey CASCADE;
         SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off",
    )
    .await
    .unwrap();
    let entries_read = || async {
        tx.query_one(
            "SELECT pg_stat_get_xact_tuples_returned('pgtenant.tenants_owner'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
    };
    let before = entries_read().await;
    let released: bool = tx
        .query_one(
            "SELECT pgtenant.release('acme/held-250', 1, 'many', $1, 'released', NULL, NULL)",
            &[&incarnation],
        )
        .await
        .unwrap()
        .get(0);
    assert!(released);
    let by_release = entries_read().await - before;
    assert!(
        by_release <= 1,
        "one release read {by_release} owner-index entries of {HELD} held tenants"
    );
    // forget raises (the row has no schema) after finding the row: keep the transaction.
    tx.batch_execute("SAVEPOINT forget").await.unwrap();
    let before = entries_read().await;
    let refused = tx
        .query_one(
            "SELECT pgtenant.forget('acme/held-251', 1, 'many', $1)",
            &[&incarnation],
        )
        .await;
    assert_eq!(refused.unwrap_err().code().map(|c| c.code()), Some("PTF02"));
    tx.batch_execute("ROLLBACK TO SAVEPOINT forget")
        .await
        .unwrap();
    let by_forget = entries_read().await - before;
    assert!(
        by_forget <= 1,
        "one forget read {by_forget} owner-index entries of {HELD} held tenants"
    );
    tx.rollback().await.unwrap();
    holder.close().await;
}

/// A heartbeat every ttl/3 is no news: `Event::Renewed` only when asked for.
#[tokio::test]
async fn renewal_events_are_published_only_when_asked_for() {
    let (db, client) = database().await;
    let quiet = router(db.url(), "quiet").await;
    let mut quiet_events = quiet.subscribe();
    let expires_at = || async {
        client
            .query_one(
                "SELECT expires_at::text FROM pgtenant.replicas WHERE replica_id = 'quiet'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    let registered = expires_at().await;
    let chatty = Router::start(options(db.url(), "chatty").renewal_events(true))
        .await
        .unwrap();
    let mut chatty_events = chatty.subscribe();
    let mut renewals = 0;
    while renewals < 3 {
        if let Event::Renewed { .. } = chatty_events.recv().await.unwrap() {
            renewals += 1;
        }
    }
    // Three periods have passed for the quiet replica too: its row shows the heartbeats.
    let deadline = Instant::now() + Duration::from_secs(10);
    while expires_at().await == registered {
        assert!(Instant::now() < deadline, "the quiet replica never renewed");
        tokio::time::sleep(Duration::from_millis(50)).await; // polling the database's view
    }
    while let Ok(event) = quiet_events.try_recv() {
        assert!(
            !matches!(event, Event::Renewed { .. }),
            "published without renewal_events: {event:?}"
        );
    }
    quiet.close().await;
    chatty.close().await;
}
