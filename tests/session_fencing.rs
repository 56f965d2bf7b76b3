//! Session fencing (DESIGN §5 "Data sessions and session fencing"): connections bound to an
//! incarnation, sealed and terminated before an epoch moves away from it; a replica's own work
//! in flight terminated before a voluntary end releases; the start-up checks and the fallback.

mod support;

use std::time::{Duration, Instant};

use pgtenant::{Error, Fencing, Router};
use pgtenant_testkit::TestDatabase;
use support::{
    append, count_rows, create_log, database, options, take_over, tenant, ReplicaProcess,
};

const CHILD: &str = "replica_child";

/// Entry point of the replica child processes (does nothing when run as a plain test).
#[test]
#[ignore = "entry point of the replica child processes"]
fn replica_child() {
    support::child_main();
}

fn session(url: &str, replica: &str) -> pgtenant::RouterOptions {
    options(url, replica).fencing(Fencing::Session)
}

/// The backends bound to a replica, from the view an operator reads.
async fn bound_backends(client: &tokio_postgres::Client, replica: &str) -> Vec<i32> {
    client
        .query(
            "SELECT pid FROM pgtenant.session_status WHERE replica_id = $1 AND backend_alive",
            &[&replica],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn alive(client: &tokio_postgres::Client, pids: &[i32]) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
            &[&pids],
        )
        .await
        .unwrap()
        .get(0)
}

/// An owner paused mid-transaction past its expiry, with idle bound connections too: the
/// contender seals its incarnation and its backends are gone by the time the epoch moved; after
/// SIGCONT nothing the old owner sends commits, on old connections or new ones.
#[tokio::test]
async fn a_paused_owners_sessions_are_terminated_before_the_epoch_moves() {
    let (db, client) = database().await;
    let mut child = ReplicaProcess::spawn(CHILD, db.url(), "sleeper");
    child.ready().await;
    assert!(child
        .request("open nap")
        .await
        .unwrap()
        .starts_with("opened"));
    // Several connections bound to its incarnation, most of them idle afterwards.
    let spread = child.request("spread nap 1 6").await.unwrap();
    assert_eq!(spread, "ok 6");
    child.send("hold nap 100 500");
    assert_eq!(child.reply().await.unwrap(), "holding");
    let bound = bound_backends(&client, "sleeper").await;
    assert!(bound.len() >= 2, "idle bound connections: {bound:?}");
    assert_eq!(alive(&client, &bound).await, bound.len() as i64);
    child.pause();

    let contender = Router::start(session(db.url(), "waker")).await.unwrap();
    let id = tenant("nap");
    let handle = take_over(&contender, &id, Duration::from_secs(30)).await;
    // The seal and the epoch move are one transaction that waited for each backend to exit.
    assert_eq!(alive(&client, &bound).await, 0, "sealed sessions are gone");
    let sealed: Option<bool> = client
        .query_one(
            "SELECT sealed_at IS NOT NULL FROM pgtenant.replica_status WHERE replica_id = 'sleeper'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sealed, Some(true));
    append(&handle, "waker", 1)
        .await
        .expect("the new owner commits");

    child.resume();
    let held = child.reply().await.unwrap();
    assert!(held.starts_with("error"), "the paused transaction: {held}");
    // Its pool opens new connections now, which cannot bind to a sealed incarnation.
    let late = child.request("spread nap 200 3").await.unwrap();
    assert!(late.starts_with("error"), "late writes: {late}");
    assert_eq!(
        count_rows(
            &handle,
            "SELECT count(*) FROM log WHERE writer = 'sleeper' AND seq >= 100"
        )
        .await,
        0,
        "nothing the old owner sent after the pause committed"
    );
    assert_eq!(
        count_rows(&handle, "SELECT count(*) FROM log WHERE writer = 'sleeper'").await,
        6
    );
    contender.close().await;
}

/// Issue 18's reproduction: a replica paused past its expiry, one of its tenants taken over
/// (which seals its incarnation), then resumed. It registers again under the same replica id and
/// must serve again within the bound (G9): a seal bars its own incarnation, never a later one.
/// Up to V7 the seal stayed on the replica row and every later incarnation's bind was refused.
#[tokio::test]
async fn a_replica_sealed_while_paused_serves_again_under_the_same_id() {
    let (db, client) = database().await;
    let mut a = ReplicaProcess::spawn(CHILD, db.url(), "a");
    a.ready().await;
    assert!(a
        .request("open payroll")
        .await
        .unwrap()
        .starts_with("opened"));
    assert!(a
        .request("write payroll 1")
        .await
        .unwrap()
        .starts_with("ok"));
    a.pause();
    let b = Router::start(session(db.url(), "b")).await.unwrap();
    let taken = take_over(&b, &tenant("payroll"), Duration::from_secs(30)).await;
    append(&taken, "b", 2).await.expect("the new owner commits");
    let sealed: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtenant.seals WHERE replica_id = 'a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sealed, 1, "the takeover sealed a's incarnation");
    a.resume();
    let resumed = Instant::now();
    let took = support::serves_again(&mut a, "travel", 1, support::SERVE_AGAIN_BOUND).await;
    println!(
        "a serves again {took:?} after SIGCONT ({:?})",
        resumed.elapsed()
    );
    // Its old handle stays refused: the tenant is b's now.
    let late = a.request("write payroll 3").await.unwrap();
    assert!(late.starts_with("error"), "the old handle wrote: {late}");
    let state: String = client
        .query_one(
            "SELECT state FROM pgtenant.replica_status WHERE replica_id = 'a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "alive", "replica_status for the new incarnation");
    b.close().await;
}

/// A refusal that registering again does not cure (here a trigger refuses every bind of the
/// replica, as a broken control plane would): after a few fresh incarnations it is reported as
/// such (`Error::SessionsRefused`, not retryable; `Event::SessionsRefused` with `retryable:
/// false`; the summary not serving), the replica backs off instead of registering many times a
/// second, and it serves again once the cause is gone (G9).
#[tokio::test]
async fn a_refusal_no_new_incarnation_cures_is_reported_and_not_retried_in_a_loop() {
    let (db, client) = database().await;
    client
        .batch_execute(
            "CREATE FUNCTION public.refuse_binds() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.replica_id = 'refused' THEN
                     RAISE EXCEPTION USING ERRCODE = 'PTE02', MESSAGE = 'binds refused by the test',
                         DETAIL = 'no new incarnation cures this';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_binds BEFORE INSERT ON pgtenant.sessions
             FOR EACH ROW EXECUTE FUNCTION public.refuse_binds();",
        )
        .await
        .unwrap();
    let router = Router::start(
        session(db.url(), "refused")
            .reconnect_backoff(Duration::from_millis(100), Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let mut events = router.subscribe();
    let id = tenant("refusals");
    let write = |handle: &pgtenant::TenantHandle, seq: i64| {
        let handle = handle.clone();
        async move {
            support::try_create_log(&handle).await?;
            append(&handle, "refused", seq).await
        }
    };
    let started = Instant::now();
    let mut last = None;
    let mut seq = 0;
    while router.summary().serving || last.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the refusal was never reported as lasting: {last:?}"
        );
        seq += 1;
        let wrote = match router.open_or_create(&id).await {
            Ok(handle) => write(&handle, seq).await,
            Err(error) => Err(error),
        };
        match wrote {
            Ok(()) => panic!("a write passed although every bind is refused"),
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // a client's retry pace
    }
    // Lasting now: the error says so, the summary too.
    let refused = loop {
        seq += 1;
        let wrote = match router.open_or_create(&id).await {
            Ok(handle) => write(&handle, seq).await,
            Err(error) => Err(error),
        };
        match wrote {
            Err(error @ Error::SessionsRefused { .. }) => break error,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Ok(()) => panic!("a write passed although every bind is refused"),
        }
    };
    assert!(!refused.is_retryable(), "{refused}");
    assert_eq!(refused.kind(), pgtenant::ErrorKind::Replica);
    assert!(
        refused
            .to_string()
            .contains("no new incarnation cures this"),
        "the database's words: {refused}"
    );
    let summary = router.summary();
    assert!(!summary.serving);
    assert!(
        summary
            .registration_error
            .as_deref()
            .is_some_and(|e| e.contains("refused to bind")),
        "{summary:?}"
    );
    let mut lasting_event = false;
    while let Ok(event) = events.try_recv() {
        if let pgtenant::Event::SessionsRefused {
            retryable: false, ..
        } = event
        {
            lasting_event = true;
        }
    }
    assert!(lasting_event, "an event said the refusal is lasting");
    // Backing off: over two seconds of a client retrying every 20 ms, a few registrations,
    // not the ~20 a second of a refusal retried in a loop.
    let count_registrations = || async {
        client
            .query_one(
                "SELECT count(*) FROM pgtenant.history WHERE event = 'registered' AND replica_id = 'refused'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let before = count_registrations().await;
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(2) {
        seq += 1;
        if let Ok(handle) = router.open_or_create(&id).await {
            let _ = write(&handle, seq).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // a client's retry pace
    }
    let registered = count_registrations().await - before;
    assert!(
        registered <= 4,
        "{registered} registrations in 2 s: the refusal is retried in a loop"
    );
    // The cause goes away: the replica serves again within its longest backoff and a few ttls.
    client
        .batch_execute("DROP TRIGGER refuse_binds ON pgtenant.sessions")
        .await
        .unwrap();
    let cured = Instant::now();
    loop {
        assert!(
            cured.elapsed() < support::SERVE_AGAIN_BOUND,
            "the replica did not serve again after the cause went away"
        );
        seq += 1;
        if let Ok(handle) = router.open_or_create(&id).await {
            if write(&handle, seq).await.is_ok() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // a client's retry pace
    }
    let summary = router.summary();
    assert!(
        summary.serving && summary.registration_error.is_none(),
        "{summary:?}"
    );
    println!(
        "served again {:?} after the cause went away",
        cured.elapsed()
    );
    router.close().await;
}

/// A data connection opened while a seal is in progress: its bind waits for the seal and is then
/// refused, so no backend of a sealed incarnation ever runs work.
#[tokio::test]
async fn a_connection_bound_during_a_seal_is_refused() {
    let (db, client) = database().await;
    let owner = Router::start(session(db.url(), "sealed-owner").pool_size(2))
        .await
        .unwrap();
    let handle = owner.open_or_create(&tenant("mid-seal")).await.unwrap();
    create_log(&handle).await; // binds the first connection
    let incarnation = owner.incarnation().unwrap();
    // Keep that connection busy, so the next work needs a new one.
    let mut busy = handle.connect().await.unwrap();
    let held = busy.begin().await.unwrap();

    // A sealer mid-seal: the replica row is sealed but not yet committed.
    let mut sealer = db.connect().await.unwrap();
    let seal = sealer.transaction().await.unwrap();
    seal.execute(
        "SELECT pgtenant.seal_incarnation('sealed-owner', $1)",
        &[&incarnation],
    )
    .await
    .unwrap();
    let late = {
        let handle = handle.clone();
        tokio::spawn(async move { append(&handle, "sealed-owner", 1).await })
    };
    // The new connection's bind waits for the seal…
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND query LIKE '%pgtenant.bind%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bind never waited on the seal"
        );
        tokio::time::sleep(Duration::from_millis(5)).await; // polling a condition
    }
    seal.commit().await.unwrap();
    // …and is refused once it committed.
    match late.await.unwrap() {
        Err(Error::ReplicaDown { .. }) => {}
        other => panic!("expected the bind to be refused, got {other:?}"),
    }
    drop(held);
    drop(busy);
    let written: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {}.log", handle.schema()),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(written, 0);
    owner.close().await;
}

/// Sealing an incarnation that is sealed already takes no lock on its replica row (control
/// plane V20): batched takeovers of a dead replica's tenants at several survivors each sealed
/// it, and each held the row until its batch committed, so they ran one after another.
#[tokio::test]
async fn sealing_a_sealed_incarnation_waits_for_nobody() {
    let (db, _client) = database().await;
    let owner = Router::start(session(db.url(), "twice-sealed").pool_size(2))
        .await
        .unwrap();
    let incarnation = owner.incarnation().unwrap();
    let first = db.connect().await.unwrap();
    first
        .execute(
            "SELECT pgtenant.seal_incarnation('twice-sealed', $1)",
            &[&incarnation],
        )
        .await
        .unwrap();
    // A transaction holding the row as a batch that sealed it and has not committed does.
    let mut holder = db.connect().await.unwrap();
    let holding = holder.transaction().await.unwrap();
    holding
        .execute(
            "SELECT 1 FROM pgtenant.replicas WHERE replica_id = 'twice-sealed' FOR NO KEY UPDATE",
            &[],
        )
        .await
        .unwrap();
    let mut second = db.connect().await.unwrap();
    let sealing = second.transaction().await.unwrap();
    sealing
        .batch_execute("SET LOCAL lock_timeout = '200ms'")
        .await
        .unwrap();
    sealing
        .execute(
            "SELECT pgtenant.seal_incarnation('twice-sealed', $1)",
            &[&incarnation],
        )
        .await
        .expect("a second seal does not wait for the row");
    drop(sealing);
    drop(holding);
    drop(owner);
}

/// Work stuck past a handoff's drain timeout, then the replica closes: its backend is terminated
/// before the release, so the next owner's commits come after it and see none of its writes.
#[tokio::test]
async fn work_stuck_past_the_drain_is_terminated_before_the_next_owner_commits() {
    let (db, _client) = database().await;
    let owner =
        Router::start(session(db.url(), "stuck-owner").drain_timeout(Duration::from_millis(200)))
            .await
            .unwrap();
    let id = tenant("stuck");
    let handle = owner.open_or_create(&id).await.unwrap();
    create_log(&handle).await;
    let (started, running) = tokio::sync::oneshot::channel();
    let stuck = {
        let handle = handle.clone();
        tokio::spawn(async move {
            handle
                .run(move |tx| {
                    Box::pin(async move {
                        tx.execute("INSERT INTO log VALUES (1, 1, 'stuck', 0)", &[])
                            .await?;
                        let _ = started.send(());
                        tx.execute("SELECT pg_sleep(3)", &[]).await?;
                        Ok::<_, Error>(())
                    })
                })
                .await
        })
    };
    running.await.unwrap();
    assert!(matches!(
        handle.handoff().await,
        Err(Error::DrainTimeout { .. })
    ));
    let report = owner.close().await;
    assert_eq!(report.failed.len(), 1, "{report:?}");

    let next = Router::start(session(db.url(), "next-owner"))
        .await
        .unwrap();
    let taken = next.open(&id).await.expect("free after close");
    append(&taken, "next-owner", 1).await.unwrap();
    assert!(
        stuck.await.unwrap().is_err(),
        "the stuck work did not commit"
    );
    assert_eq!(
        count_rows(&taken, "SELECT count(*) FROM log WHERE writer = 'stuck'").await,
        0
    );
    next.close().await;
}

/// Abandon does not wait: under session fencing it terminates the work in flight (which rolls
/// back) before releasing, since no fence would stop that work afterwards.
#[tokio::test]
async fn abandon_terminates_the_work_in_flight_before_releasing() {
    let (db, _client) = database().await;
    let owner = Router::start(session(db.url(), "quitter")).await.unwrap();
    let contender = Router::start(session(db.url(), "taker")).await.unwrap();
    let id = tenant("quit");
    let handle = owner.open_or_create(&id).await.unwrap();
    create_log(&handle).await;
    let (started, running) = tokio::sync::oneshot::channel();
    let long = {
        let handle = handle.clone();
        tokio::spawn(async move {
            handle
                .run(move |tx| {
                    Box::pin(async move {
                        tx.execute("INSERT INTO log VALUES (1, 1, 'quitter', 0)", &[])
                            .await?;
                        let _ = started.send(());
                        tx.execute("SELECT pg_sleep(2)", &[]).await?;
                        Ok::<_, Error>(())
                    })
                })
                .await
        })
    };
    running.await.unwrap();
    handle.abandon().await.unwrap();
    assert!(long.await.unwrap().is_err(), "terminated, not committed");
    let taken = contender.open(&id).await.unwrap();
    assert_eq!(count_rows(&taken, "SELECT count(*) FROM log").await, 0);
    owner.close().await;
    contender.close().await;
}

/// Where the control plane's owner may not terminate the data sessions (here they log in as a
/// role the owner is no member of, and the owner lacks pg_signal_backend), an explicit
/// `Fencing::Session` refuses to start, saying so, and the default falls back to transaction
/// fencing with the reason in the summary. The sessions act as the application's role (the
/// login's default `role`), so the tenant schemas are that role's, as the control plane
/// requires of the schemas it records and renames (and the owner, a member of it, can rename
/// them).
#[tokio::test]
async fn without_the_right_to_terminate_sessions_start_says_so_and_the_default_falls_back() {
    let db = TestDatabase::create().await.expect("test database");
    let admin = db.connect().await.unwrap();
    let owner = db.create_role("owner").await.unwrap();
    let app = db.create_role("app").await.unwrap();
    let member = db.create_role("member").await.unwrap();
    admin
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE \"{db}\" TO {owner} WITH GRANT OPTION;
             GRANT {app} TO {owner};
             GRANT {app} TO {member};
             ALTER ROLE {member} SET role = {app};",
            db = db.name(),
            owner = owner.name(),
            app = app.name(),
            member = member.name(),
        ))
        .await
        .unwrap();
    let mut as_owner = owner.connect().await.unwrap();
    pgtenant::setup_with(
        &mut as_owner,
        &pgtenant::SetupOptions::default().app_role(app.name()),
    )
    .await
    .expect("setup by a non-superuser owner");

    match Router::start(options(member.url(), "strict").fencing(Fencing::Session)).await {
        Err(Error::InvalidOption { option, reason, .. }) => {
            assert_eq!(option, "fencing");
            assert!(reason.contains("pg_signal_backend"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let router = Router::start(options(member.url(), "lenient").fencing(Fencing::Auto))
        .await
        .expect("falls back");
    let summary = router.summary();
    assert_eq!(summary.fencing, Fencing::Transaction);
    assert!(
        summary
            .fencing_fallback
            .as_deref()
            .is_some_and(|reason| reason.contains("pg_signal_backend")),
        "{summary:?}"
    );
    // And it works, fenced per transaction.
    let handle = router.open_or_create(&tenant("fallback")).await.unwrap();
    create_log(&handle).await;
    append(&handle, "lenient", 1).await.unwrap();
    router.close().await;
}

/// A lease session registered by hand as `replica`, with session fencing declared: (client,
/// its backend pid, incarnation, secret).
async fn session_fenced_lease(
    db: &TestDatabase,
    replica: &str,
) -> (tokio_postgres::Client, i32, i64, String) {
    let lease = db.connect().await.unwrap();
    let pid: i32 = lease
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let (incarnation, secret) = support::register_by_hand(&lease, replica).await;
    lease
        .execute(
            "SELECT pgtenant.declare_session_fencing($1, $2, $3)",
            &[&replica, &incarnation, &secret],
        )
        .await
        .unwrap();
    (lease, pid, incarnation, secret)
}

/// Closes a lease session and waits until its backend is gone: the server ends it (and frees
/// its liveness lock) once it reads the disconnect.
async fn end_lease_session(
    admin: &tokio_postgres::Client,
    lease: tokio_postgres::Client,
    pid: i32,
) {
    drop(lease);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(admin, &[pid]).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the lease session's backend did not exit"
        );
        tokio::task::yield_now().await;
    }
}

/// A data connection binds only to an incarnation whose lease session is alive: once the lease
/// session is gone (killed, or lost with the server in a failover), its replica row outlives it
/// by up to a ttl, and no acquirer needs to seal an incarnation that holds nothing. V6's bind
/// requires the liveness lock held by the registering backend; before, this bind passed.
#[tokio::test]
async fn a_connection_cannot_bind_to_an_incarnation_whose_lease_session_is_gone() {
    let (db, admin) = database().await;
    let (lease, lease_pid, incarnation, secret) = session_fenced_lease(&db, "gone").await;
    let bind = "SELECT pgtenant.bind('gone', $1, $2)";
    let data = db.connect().await.unwrap();
    data.query_one(bind, &[&incarnation, &secret])
        .await
        .expect("a live incarnation binds");

    end_lease_session(&admin, lease, lease_pid).await;
    let heartbeat_left: bool = admin
        .query_one(
            "SELECT expires_at > clock_timestamp() FROM pgtenant.replicas WHERE replica_id = 'gone'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(heartbeat_left, "the row outlives the session");
    let other = db.connect().await.unwrap();
    let refused = other
        .query_one(bind, &[&incarnation, &secret])
        .await
        .expect_err("a connection bound to an incarnation whose lease session is gone");
    assert_eq!(
        refused.code().map(|code| code.code()),
        Some("PTE02"),
        "{refused}"
    );
}

/// The race between seal_owner and acquire: the owner is alive when the contender's seal_owner
/// looks (nothing sealed), and its lease session ends before acquire looks (owner dead, taken
/// over at once). Its bound data session must still be gone once the epoch has moved: the
/// epoch's own UPDATE seals (V7). Without that, the data session lives on under the old epoch.
#[tokio::test]
async fn a_takeover_seals_the_owner_even_when_it_died_after_seal_owner_looked() {
    let (db, admin) = database().await;
    let (lease, lease_pid, incarnation, secret) = session_fenced_lease(&db, "racing").await;
    let acquire = "SELECT epoch FROM pgtenant.acquire('org/race', 'org', 'race', $1, $2, $3, true)";
    let first: i64 = lease
        .query_one(acquire, &[&"racing", &incarnation, &secret])
        .await
        .expect("the owner acquires")
        .get(0);
    let data = db.connect().await.unwrap();
    data.query_one(
        "SELECT pgtenant.bind('racing', $1, $2)",
        &[&incarnation, &secret],
    )
    .await
    .expect("the owner's data session binds");
    let data_pid: i32 = data
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);

    let mut taker = db.connect().await.unwrap();
    let (taker_incarnation, taker_secret) = support::register_by_hand(&taker, "taker").await;
    let tx = taker.transaction().await.unwrap();
    let sealed: i32 = tx
        .query_one(
            "SELECT pgtenant.seal_owner('org/race', 'taker', $1, $2, 5000)",
            &[&taker_incarnation, &taker_secret],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sealed, 0, "a live owner is not sealed");
    end_lease_session(&admin, lease, lease_pid).await;
    let second: i64 = tx
        .query_one(acquire, &[&"taker", &taker_incarnation, &taker_secret])
        .await
        .expect("a dead owner is taken over at once")
        .get(0);
    assert!(second > first);
    assert_eq!(
        alive(&admin, &[data_pid]).await,
        0,
        "the old owner's bound data session outlived the UPDATE that moved its epoch"
    );
    tx.commit().await.unwrap();
    assert!(
        data.simple_query("SELECT 1").await.is_err(),
        "the old owner's data session still answers"
    );
}

/// Rolling upgrade from V7 under running replicas: V8 keeps every signature, so a V7 replica's
/// lease session and data sessions go on calling the same functions across it. A replica id
/// that V7's stale seal had stopped (sealed at incarnation 1, registered again as 2, every bind
/// of 2 refused) binds again once V8 is in; an incarnation that is really sealed (not alive)
/// keeps its seal, now in `pgtenant.seals`.
#[tokio::test]
async fn v8_applies_under_running_v7_replicas_and_frees_an_id_a_stale_seal_stopped() {
    let db = TestDatabase::create().await.expect("database");
    let mut admin = db.connect().await.unwrap();
    support::control_plane_at(&mut admin, 7).await;
    let declare = "SELECT pgtenant.declare_session_fencing($1, $2, $3)";
    let bind = "SELECT pgtenant.bind($1, $2, $3)";

    // "stuck": incarnation 1 sealed as V7's takeover seals, then registered again on the same
    // lease session (it still holds the liveness lock), as a resumed replica does.
    let lease = db.connect().await.unwrap();
    let (first, first_secret) = support::register_by_hand(&lease, "stuck").await;
    lease
        .execute(declare, &[&"stuck", &first, &first_secret])
        .await
        .unwrap();
    admin
        .execute(
            "UPDATE pgtenant.replicas SET sealed_at = clock_timestamp() WHERE replica_id = 'stuck'",
            &[],
        )
        .await
        .unwrap();
    let row = lease
        .query_one(
            "SELECT incarnation, secret FROM pgtenant.register('stuck', 60000, NULL)",
            &[],
        )
        .await
        .unwrap();
    let (second, secret): (i64, String) = (row.get(0), row.get(1));
    lease
        .execute(declare, &[&"stuck", &second, &secret])
        .await
        .unwrap();
    let data = db.connect().await.unwrap();
    let refused = data
        .query_one(bind, &[&"stuck", &second, &secret])
        .await
        .expect_err("V7 refuses a later incarnation of a sealed id");
    assert_eq!(refused.code().map(|c| c.code()), Some("PTE02"));

    // "dead": sealed at its current incarnation, its lease session gone.
    let dead_lease = db.connect().await.unwrap();
    let (dead, dead_secret) = support::register_by_hand(&dead_lease, "dead").await;
    dead_lease
        .execute(declare, &[&"dead", &dead, &dead_secret])
        .await
        .unwrap();
    drop(dead_lease);
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin
        .query_one(
            "SELECT lock_held FROM pgtenant.replica_liveness WHERE replica_id = 'dead'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the dead session's lock went");
        tokio::time::sleep(Duration::from_millis(10)).await; // polling a condition
    }
    admin
        .execute(
            "UPDATE pgtenant.replicas SET sealed_at = clock_timestamp() WHERE replica_id = 'dead'",
            &[],
        )
        .await
        .unwrap();

    let report = pgtenant::setup(&mut admin)
        .await
        .expect("V8 under running replicas");
    assert_eq!(report.applied, support::migration_names(7));

    // The V7 replica goes on: its heartbeat renews, and its binds pass now.
    let renewed: bool = lease
        .query_one(
            "SELECT pgtenant.heartbeat('stuck', $1, $2, 60000)",
            &[&second, &secret],
        )
        .await
        .unwrap()
        .get(0);
    assert!(renewed);
    let pid: i32 = data
        .query_one(bind, &[&"stuck", &second, &secret])
        .await
        .expect("V8 binds a later incarnation of an id sealed before")
        .get(0);
    assert!(pid > 0);
    let states: Vec<(String, String, bool)> = admin
        .query(
            "SELECT replica_id, state, sealed_at IS NOT NULL FROM pgtenant.replica_status ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(
        states,
        vec![
            ("dead".to_owned(), "sealed".to_owned(), true),
            ("stuck".to_owned(), "alive".to_owned(), false)
        ]
    );
    let kept: i64 = admin
        .query_one(
            "SELECT count(*) FROM pgtenant.seals WHERE replica_id = 'dead' AND incarnation = $1",
            &[&dead],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1, "the real seal was carried over");
}

/// The hot path (issue 19): on a connection pgtenant opened, a session-fenced transaction sends
/// what an unfenced schema-per-tenant one sends, `BEGIN READ WRITE`, the `search_path` pin, the
/// work and `COMMIT`: no marker cursor is open while the work runs (the transaction's end is
/// read from the server's parameter reports instead), and the session is reset only when the
/// connection changes tenant: what a tenant's work left in the session is still there for that
/// tenant's next transaction, and gone for the next tenant's.
#[tokio::test]
async fn a_session_fenced_transaction_sends_the_pin_alone_and_resets_only_between_tenants() {
    let (db, _client) = database().await;
    let router = Router::start(session(db.url(), "hot-path").pool_size(1))
        .await
        .unwrap();
    let one = router.open_or_create(&tenant("hot-one")).await.unwrap();
    let two = router.open_or_create(&tenant("hot-two")).await.unwrap();
    let text = |handle: &pgtenant::TenantHandle, sql: &'static str| {
        let handle = handle.clone();
        async move {
            handle
                .run(move |tx| {
                    Box::pin(async move {
                        let row = tx.query_one(sql, &[]).await?;
                        Ok::<_, Error>(row.get::<_, String>(0))
                    })
                })
                .await
                .unwrap()
        }
    };
    for _ in 0..2 {
        assert_eq!(
            text(
                &one,
                "SELECT count(*)::text FROM pg_cursors WHERE name = 'pgtenant_fenced'"
            )
            .await,
            "0",
            "no marker cursor"
        );
    }
    text(
        &one,
        "SELECT set_config('application_name', 'left by one', false)",
    )
    .await;
    assert_eq!(
        text(&one, "SELECT current_setting('application_name')").await,
        "left by one",
        "no reset between transactions of one tenant"
    );
    assert_ne!(
        text(&two, "SELECT current_setting('application_name')").await,
        "left by one",
        "the reset runs when the connection changes tenant"
    );
    assert_eq!(
        text(&two, "SELECT current_setting('search_path')").await,
        format!("{}, pg_temp", two.schema())
    );
    router.close().await;
}
