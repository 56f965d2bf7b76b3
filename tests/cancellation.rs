//! Cancelled and stuck work (DESIGN G3 "Cancel-safe", issue 25): an HTTP framework drops a
//! handler's future when its client disconnects, `timeout` and `select!` drop futures too, and
//! a COMMIT already on the wire commits whatever the client does. Work the router stopped
//! waiting for must never commit after its lease moved, and its connection must serve no one
//! before its transaction is over. Every test runs under both fencings.
//!
//! The witness: a deferred constraint trigger on the ledger runs inside each COMMIT (after a
//! random sleep of up to 15 ms, so cancellations land mid-COMMIT; 300 ms for a request named
//! `slow…`) and records the tenant's
//! epoch as the control plane has it at that moment. A row whose recorded epoch is above its
//! own was committed after a later epoch had been granted: a stale commit.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgtenant::{Fencing, Router, TenantHandle, TenantId};
use support::{database, options, tenant};

/// The ledger, and the trigger that stamps each row with the epoch current at its COMMIT.
const LEDGER: (&str, &str) = (
    "V1__ledger_with_commit_stamps",
    "CREATE TABLE log (id bigserial PRIMARY KEY, request text NOT NULL, epoch bigint NOT NULL);
     CREATE TABLE stamps (request text NOT NULL, row_epoch bigint NOT NULL,
                          epoch_at_commit bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
     CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         PERFORM pg_sleep(CASE WHEN NEW.request LIKE 'slow%' THEN 0.3 ELSE random() * 0.015 END);
         INSERT INTO stamps (request, row_epoch, epoch_at_commit)
         SELECT NEW.request, NEW.epoch, t.epoch FROM pgtenant.tenants t
          WHERE t.schema_name = current_schema();
         RETURN NULL;
     END $$;
     CREATE CONSTRAINT TRIGGER stamp AFTER INSERT ON log DEFERRABLE INITIALLY DEFERRED
         FOR EACH ROW EXECUTE FUNCTION stamp();",
);

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

async fn replica(url: &str, name: &str, fencing: Fencing) -> Router {
    Router::start(
        options(url, name)
            .fencing(fencing)
            .tenant_migrations([LEDGER])
            .expect("migrations"),
    )
    .await
    .expect("router")
}

/// Inserts one row for `request` under `handle`'s epoch.
async fn insert(handle: &TenantHandle, request: &str) -> pgtenant::Result<()> {
    let epoch = handle.epoch().get();
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO log (request, epoch) VALUES ($1, $2)",
                    &[&request, &epoch],
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
}

/// The same, at most once per request id.
async fn insert_once(handle: &TenantHandle, request: &str) -> pgtenant::Result<i64> {
    let epoch = handle.epoch().get();
    handle
        .run_once(request, |tx| {
            Box::pin(async move {
                let row = tx
                    .query_one(
                        "INSERT INTO log (request, epoch) VALUES ($1, $2) RETURNING id",
                        &[&request, &epoch],
                    )
                    .await?;
                Ok::<_, pgtenant::Error>(row.get(0))
            })
        })
        .await
}

/// Rows committed after their epoch was superseded, and every request's row count.
async fn verdict(handle: &TenantHandle) -> (Vec<(String, i64, i64)>, BTreeMap<String, i64>) {
    handle
        .read(|tx| {
            Box::pin(async move {
                let stale = tx
                    .query(
                        "SELECT request, row_epoch, epoch_at_commit FROM stamps
                          WHERE epoch_at_commit > row_epoch",
                        &[],
                    )
                    .await?
                    .iter()
                    .map(|row| (row.get(0), row.get(1), row.get(2)))
                    .collect();
                let counts = tx
                    .query("SELECT request, count(*) FROM log GROUP BY request", &[])
                    .await?
                    .iter()
                    .map(|row| (row.get(0), row.get(1)))
                    .collect();
                Ok::<_, pgtenant::Error>((stale, counts))
            })
        })
        .await
        .expect("read the verdict")
}

/// Opens `id` on `router` as soon as the previous owner lets it go (woken by its NOTIFY).
async fn open_when_free(router: &Router, id: &TenantId) -> TenantHandle {
    router
        .wait_for(id, Duration::from_secs(20))
        .await
        .unwrap_or_else(|error| panic!("{} could not open {id}: {error}", router.replica_id()))
}

/// Several connections in the pool, so that what follows a cut does not happen to queue behind
/// the cut work on its own connection (the pool hands out the oldest idle connection first).
async fn warm_pool(handle: &TenantHandle) {
    let warm: Vec<_> = (0..3)
        .map(|n| insert(handle, ["warm0", "warm1", "warm2"][n]))
        .collect();
    for done in support::join_all(warm).await {
        done.expect("warm-up write");
    }
}

#[derive(Default)]
struct Tally {
    runs: AtomicUsize,
    cut: AtomicUsize,
    acked: Mutex<BTreeSet<String>>,
}

/// Four writers whose runs are cut at random points (a `timeout` of 0–25 ms around runs whose
/// COMMIT alone takes up to 15 ms), while the tenant moves between two replicas every 50–300 ms
/// by handoff, release or abandon. With `once`, each request is retried until it succeeds,
/// through `run_once`.
async fn storm(fencing: Fencing, once: bool) {
    let (db, _client) = database().await;
    let (a, b) = (
        replica(db.url(), "storm-a", fencing).await,
        replica(db.url(), "storm-b", fencing).await,
    );
    let id = tenant(if once { "once" } else { "storm" });
    let first = a.open_or_create(&id).await.expect("create");
    let current: Arc<Mutex<TenantHandle>> = Arc::new(Mutex::new(first));
    let tally = Arc::new(Tally::default());
    let next = Arc::new(AtomicI64::new(0));
    let end = Instant::now() + Duration::from_secs(8);
    let mut writers = Vec::new();
    for writer in 0..4_u64 {
        let (current, tally, next) = (current.clone(), tally.clone(), next.clone());
        writers.push(tokio::spawn(async move {
            let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (writer + 1);
            while Instant::now() < end {
                let request = format!("w{writer}-{}", next.fetch_add(1, Ordering::Relaxed));
                loop {
                    let handle = current.lock().unwrap().clone();
                    let cut = Duration::from_micros(xorshift(&mut seed) % 25_000);
                    tally.runs.fetch_add(1, Ordering::Relaxed);
                    let attempt = async {
                        if once {
                            insert_once(&handle, &request).await.map(drop)
                        } else {
                            insert(&handle, &request).await
                        }
                    };
                    match tokio::time::timeout(cut, attempt).await {
                        Ok(Ok(())) => {
                            tally.acked.lock().unwrap().insert(request.clone());
                            break;
                        }
                        // Refused (the tenant is moving): try again shortly, as a client would.
                        Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(1)).await,
                        Err(_) => {
                            tally.cut.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if !once || Instant::now() >= end {
                        break;
                    }
                }
            }
        }));
    }
    let mover = {
        let (current, a, b, id) = (current.clone(), a.clone(), b.clone(), id.clone());
        tokio::spawn(async move {
            let mut seed = 0x2545_F491_4F6C_DD1D_u64;
            let mut moves = 0;
            let mut here_is_a = true;
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(50 + xorshift(&mut seed) % 250)).await;
                let handle = current.lock().unwrap().clone();
                let ended = match xorshift(&mut seed) % 4 {
                    0 => handle.abandon().await,
                    1 => handle.release().await,
                    _ => handle.handoff().await,
                };
                if ended.is_err() {
                    continue;
                }
                let target = if here_is_a { &b } else { &a };
                let next = open_when_free(target, &id).await;
                *current.lock().unwrap() = next;
                here_is_a = !here_is_a;
                moves += 1;
            }
            moves
        })
    };
    for writer in writers {
        writer.await.expect("writer");
    }
    let moves = mover.await.expect("mover");
    // Both halves: every replica serves again, and nothing stale or lost.
    let last = current.lock().unwrap().clone();
    last.handoff().await.expect("hand off for the check");
    for (checked, router) in [&a, &b].into_iter().enumerate() {
        let handle = open_when_free(router, &id).await;
        insert(&handle, &format!("after-{}", router.replica_id()))
            .await
            .expect("serves again after the storm");
        if checked == 0 {
            handle.handoff().await.expect("hand over to the other");
        } else {
            let (stale, counts) = verdict(&handle).await;
            let acked = tally.acked.lock().unwrap().clone();
            let missing: Vec<_> = acked.iter().filter(|r| !counts.contains_key(*r)).collect();
            let duplicated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
            let committed_after_cut = counts
                .keys()
                .filter(|r| !acked.contains(*r) && !r.starts_with("after-"))
                .count();
            println!(
                "storm ({fencing:?}, once: {once}): {} runs, {} cut, {moves} moves, {} acknowledged, \
                 {} rows committed by runs their caller stopped waiting for, {} stale, {} duplicated",
                tally.runs.load(Ordering::Relaxed),
                tally.cut.load(Ordering::Relaxed),
                acked.len(),
                committed_after_cut,
                stale.len(),
                duplicated.len()
            );
            assert!(
                stale.is_empty(),
                "rows committed after their epoch was superseded: {stale:?}"
            );
            assert!(missing.is_empty(), "acknowledged but missing: {missing:?}");
            if once {
                assert!(duplicated.is_empty(), "requests done twice: {duplicated:?}");
            }
            assert!(
                tally.cut.load(Ordering::Relaxed) >= 100,
                "too few cancellations to mean anything"
            );
            assert!(moves >= 10, "too few moves to mean anything: {moves}");
        }
    }
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_work_never_commits_after_its_lease_moved_under_session_fencing() {
    storm(Fencing::Session, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_work_never_commits_after_its_lease_moved_under_transaction_fencing() {
    storm(Fencing::Transaction, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_idempotent_runs_are_done_once_under_session_fencing() {
    storm(Fencing::Session, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_idempotent_runs_are_done_once_under_transaction_fencing() {
    storm(Fencing::Transaction, true).await;
}

/// A replica that releases a tenant and opens it again while the old handle's work is still in
/// flight: the re-acquisition by the same incarnation neither seals nor waits on a fence in the
/// database, so it must wait for that work here (seen once in 1.46 M acknowledged writes: a
/// write of epoch 1992 committed 1 ms after the same incarnation acquired epoch 1993).
async fn reopen_during_release(fencing: Fencing) {
    let (db, _client) = database().await;
    let router = replica(db.url(), "reopener", fencing).await;
    let id = tenant("reopen");
    let handle = router.open_or_create(&id).await.expect("create");
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let work = {
        let handle = handle.clone();
        tokio::spawn(async move {
            let epoch = handle.epoch().get();
            handle
                .run(move |tx| {
                    Box::pin(async move {
                        tx.execute("SELECT 1", &[]).await?;
                        let _ = started_tx.send(());
                        let _ = wait.await;
                        tx.execute(
                            "INSERT INTO log (request, epoch) VALUES ('in flight', $1)",
                            &[&epoch],
                        )
                        .await?;
                        Ok::<_, pgtenant::Error>(())
                    })
                })
                .await
        })
    };
    started.await.expect("work started");
    let release = tokio::spawn({
        let handle = handle.clone();
        async move { handle.release().await }
    });
    while handle.state() == pgtenant::HandleState::Serving {
        tokio::task::yield_now().await;
    }
    let reopen = tokio::spawn({
        let (router, id) = (router.clone(), id.clone());
        async move { router.open(&id).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !reopen.is_finished(),
        "the tenant was acquired again while work of its previous lease was in flight"
    );
    go.send(()).expect("release the work");
    work.await
        .expect("work")
        .expect("the work commits under its lease");
    release.await.expect("release").expect("released");
    let reopened = reopen.await.expect("reopen").expect("opened again");
    assert!(reopened.epoch() > handle.epoch());
    let (stale, _) = verdict(&reopened).await;
    assert!(
        stale.is_empty(),
        "committed after its epoch was superseded: {stale:?}"
    );
    router.close().await;
}

#[tokio::test]
async fn reopening_waits_for_the_previous_leases_work_under_session_fencing() {
    reopen_during_release(Fencing::Session).await;
}

#[tokio::test]
async fn reopening_waits_for_the_previous_leases_work_under_transaction_fencing() {
    reopen_during_release(Fencing::Transaction).await;
}

/// A guard whose commit future is dropped mid-COMMIT keeps its work counted in flight until
/// the connection answers, so the handoff after it waits, and the next owner never sees the row
/// appear under its epoch.
async fn dropped_guard_commit(fencing: Fencing) {
    let (db, _client) = database().await;
    let (a, b) = (
        replica(db.url(), "guard-a", fencing).await,
        replica(db.url(), "guard-b", fencing).await,
    );
    let id = tenant("guard");
    let handle = a.open_or_create(&id).await.expect("create");
    warm_pool(&handle).await;
    let mut connection = handle.connect().await.expect("connect");
    let tx = connection.begin().await.expect("begin");
    let epoch = handle.epoch().get();
    tx.execute(
        "INSERT INTO log (request, epoch) VALUES ('slow guard', $1)",
        &[&epoch],
    )
    .await
    .expect("insert");
    // The COMMIT goes on the wire at the first poll and takes 300 ms; the caller gives up at 20.
    let cut = tokio::time::timeout(Duration::from_millis(20), tx.commit()).await;
    assert!(cut.is_err(), "the commit was cut");
    assert_eq!(handle.in_flight(), 1, "the cut commit still counts");
    drop(connection);
    handle.handoff().await.expect("hand off");
    let next = open_when_free(&b, &id).await;
    insert(&next, "next owner")
        .await
        .expect("next owner writes");
    let (stale, counts) = verdict(&next).await;
    assert!(
        stale.is_empty(),
        "committed after its epoch was superseded: {stale:?}"
    );
    assert_eq!(
        counts.get("slow guard").copied(),
        Some(1),
        "the cut commit committed, before the handoff"
    );
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn a_guards_dropped_commit_counts_in_flight_until_answered_under_session_fencing() {
    dropped_guard_commit(Fencing::Session).await;
}

#[tokio::test]
async fn a_guards_dropped_commit_counts_in_flight_until_answered_under_transaction_fencing() {
    dropped_guard_commit(Fencing::Transaction).await;
}

/// The same for `run`: a run cut mid-COMMIT, then the lease handed to another replica at once.
async fn dropped_run_commit(fencing: Fencing) {
    let (db, _client) = database().await;
    let (a, b) = (
        replica(db.url(), "run-a", fencing).await,
        replica(db.url(), "run-b", fencing).await,
    );
    let id = tenant("cut");
    let handle = a.open_or_create(&id).await.expect("create");
    warm_pool(&handle).await;
    let cut = tokio::time::timeout(Duration::from_millis(20), insert(&handle, "slow run")).await;
    assert!(cut.is_err(), "the run was cut");
    handle.handoff().await.expect("hand off");
    let next = open_when_free(&b, &id).await;
    insert(&next, "next owner")
        .await
        .expect("next owner writes");
    let (stale, counts) = verdict(&next).await;
    assert!(
        stale.is_empty(),
        "committed after its epoch was superseded: {stale:?}"
    );
    assert_eq!(
        counts.get("slow run").copied(),
        Some(1),
        "the cut run committed, before the handoff"
    );
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn a_run_dropped_mid_commit_lands_before_the_handoff_under_session_fencing() {
    dropped_run_commit(Fencing::Session).await;
}

#[tokio::test]
async fn a_run_dropped_mid_commit_lands_before_the_handoff_under_transaction_fencing() {
    dropped_run_commit(Fencing::Transaction).await;
}

/// A request id is checked before anything runs.
#[tokio::test]
async fn a_bad_request_id_is_refused_before_anything_runs() {
    let (db, _client) = database().await;
    let router = replica(db.url(), "ids", support::fencing()).await;
    let handle = router.open_or_create(&tenant("ids")).await.expect("create");
    for bad in [String::new(), "x".repeat(201)] {
        let error = insert_once(&handle, &bad).await.unwrap_err();
        assert_eq!(error.kind(), pgtenant::ErrorKind::InvalidInput, "{error}");
    }
    let (_, counts) = verdict(&handle).await;
    assert!(counts.is_empty());
    // The recorded outcome comes back, and the table is the tenant's, in psql too.
    let first = insert_once(&handle, "same").await.expect("first");
    let second = insert_once(&handle, "same").await.expect("second");
    assert_eq!(first, second);
    let recorded: i64 = handle
        .read(|tx| {
            Box::pin(async move {
                let row = tx
                    .query_one("SELECT count(*) FROM pgtenant_requests", &[])
                    .await?;
                Ok::<_, pgtenant::Error>(row.get(0))
            })
        })
        .await
        .expect("read");
    assert_eq!(recorded, 1);
    router.close().await;
}
