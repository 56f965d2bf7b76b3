//! Database failover (issue 14, DESIGN §9): a streaming standby is promoted under load, and
//! pgtenant keeps its promises.
//!
//! Real processes and real clusters: replica child processes write through a multi-host URL
//! (`target_session_attrs=read-write`, primary first) to a primary with a streaming standby
//! (the test kit's [`StandbyPair`]); the primary is stopped with `-m immediate` and the standby
//! promoted. With synchronous replication nothing acknowledged is lost; with asynchronous
//! replication the test reports what was lost, and shows that still no stale owner commits and
//! no (tenant, epoch) pair is issued to two owners, which only the epoch floor of control plane
//! V4 guarantees (see `without_the_floor_a_lossy_failover_reissues_an_epoch_to_another_owner`).
//!
//! Each test prints its figures (`cargo test --test failover -- --nocapture`); BENCHMARKS.md
//! ("Database failover") has a run's.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgtenant::{Error, Router, TenantHandle, TenantId};
use pgtenant_testkit::{Replication, StandbyPair};
use support::{
    append, connect, create_log, options, pair_with_control_plane, register_by_hand, sqlstate,
    tenant, ReplicaProcess,
};
use tokio::sync::watch;
use tokio_postgres::Client;

const CHILD: &str = "replica_child";

/// Entry point of the replica child processes (does nothing when run as a plain test).
#[test]
#[ignore = "entry point of the replica child processes"]
fn replica_child() {
    support::child_main();
}

/// The first epoch a server on timeline 2 (the first promotion) issues: (2 - 1) << 40.
const FLOOR_OF_TIMELINE_2: i64 = 1 << 40;

/// How long a replica may take to serve again after the promotion before the test fails.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);

/// How long the synchronous test leaves the database without a primary: a failover manager
/// takes that long, or longer, to notice the crash before it promotes.
const OUTAGE: Duration = Duration::from_secs(3);

/// One acknowledged write: `ok` came back, so it committed (G4).
#[derive(Debug, Clone)]
struct Ack {
    ledger: String,
    writer: String,
    seq: i64,
    epoch: i64,
    at: Instant,
}

type Acks = Arc<Mutex<Vec<Ack>>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A child replica writing to its ledgers in turn as fast as it is answered, until `stop`;
/// reopening a ledger whenever a write fails (lease lost at the failover, say). Every `ok` is
/// an acknowledged write.
fn drive(
    mut child: ReplicaProcess,
    ledgers: Vec<String>,
    acks: Acks,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<ReplicaProcess> {
    tokio::spawn(async move {
        let mut seq = 0_i64;
        while !*stop.borrow() {
            for ledger in &ledgers {
                seq += 1;
                let reply = child
                    .request(&format!("write {ledger} {seq}"))
                    .await
                    .expect("the replica process answers");
                if let Some(rest) = reply.strip_prefix("ok ") {
                    let epoch = rest
                        .split_whitespace()
                        .nth(1)
                        .and_then(|e| e.parse().ok())
                        .expect("ok <seq> <epoch>");
                    lock(&acks).push(Ack {
                        ledger: ledger.clone(),
                        writer: child.replica.clone(),
                        seq,
                        epoch,
                        at: Instant::now(),
                    });
                    continue;
                }
                // Lost lease, replica re-registering, database away: open again, and give a
                // replica that is between incarnations a moment.
                let opened = child
                    .request(&format!("open {ledger}"))
                    .await
                    .expect("the replica process answers");
                if std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some() {
                    eprintln!("failover: {} {ledger}: {reply} / {opened}", child.replica);
                }
                if !opened.starts_with("opened") {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        child
    })
}

/// The child replicas' ledgers, with the epoch each was first opened at: an acknowledged
/// write under that epoch was committed before the failover (its lease was lost in it), one
/// under a higher epoch after it. Told apart by epoch, not by when the test read the reply,
/// which can be late.
struct Leases {
    first: BTreeMap<String, i64>,
}

impl Leases {
    fn ledgers(&self) -> Vec<String> {
        self.first.keys().cloned().collect()
    }

    fn before_failover(&self, acks: &[Ack]) -> Vec<Ack> {
        acks.iter()
            .filter(|ack| self.first.get(&ack.ledger) == Some(&ack.epoch))
            .cloned()
            .collect()
    }

    fn after_failover<'a>(&self, acks: &'a [Ack], writer: &str) -> Vec<&'a Ack> {
        acks.iter()
            .filter(|ack| {
                ack.writer == writer && self.first.get(&ack.ledger).is_some_and(|e| ack.epoch > *e)
            })
            .collect()
    }

    /// From `promoted` to `writer`'s first commit on a new lease.
    fn back_after(&self, acks: &[Ack], writer: &str, promoted: Instant) -> Duration {
        self.after_failover(acks, writer)
            .iter()
            .map(|ack| ack.at.saturating_duration_since(promoted))
            .min()
            .unwrap_or_default()
    }

    /// Whether every one of `writers` made `count` commits on new leases.
    fn all_back(&self, acks: &Acks, writers: &[String], count: usize) -> bool {
        let acks = lock(acks);
        writers
            .iter()
            .all(|writer| self.after_failover(&acks, writer).len() >= count)
    }
}

/// Spawns `count` child replicas named `{prefix}-{i}`, each owning two ledgers of its own.
async fn start_writers(
    url: &str,
    prefix: &str,
    count: usize,
    acks: &Acks,
    stop: &watch::Receiver<bool>,
) -> (Leases, Vec<tokio::task::JoinHandle<ReplicaProcess>>) {
    let mut first = BTreeMap::new();
    let mut tasks = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}-{i}");
        let mut child = ReplicaProcess::spawn(CHILD, url, &name);
        child.ready().await;
        let ledgers = vec![format!("{name}-a"), format!("{name}-b")];
        for ledger in &ledgers {
            let reply = child.request(&format!("open {ledger}")).await.unwrap();
            let epoch = reply
                .strip_prefix("opened ")
                .and_then(|epoch| epoch.parse().ok())
                .unwrap_or_else(|| panic!("{name} opens {ledger}: {reply}"));
            first.insert(ledger.clone(), epoch);
        }
        tasks.push(drive(child, ledgers, acks.clone(), stop.clone()));
    }
    (Leases { first }, tasks)
}

/// Polls until `condition` holds (every 10 ms), or panics after `limit` saying `what`.
async fn until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Opens `id`, retrying while the router re-registers or the database is away.
async fn open_when_back(router: &Router, id: &TenantId) -> TenantHandle {
    let deadline = Instant::now() + RECOVERY_BOUND;
    loop {
        match router.open(id).await {
            Ok(handle) => return handle,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{} could not open {id}: {error}", router.replica_id()),
        }
    }
}

/// What the promoted server holds for one ledger: its rows, its current epoch and owner.
struct Ledger {
    rows: Vec<(i64, i64, String, i64)>,
    epoch: i64,
    owner: Option<String>,
    lock_key: i32,
}

async fn read_ledger(client: &Client, ledger: &str) -> Ledger {
    let id = tenant(ledger);
    let key = id.key();
    let row = client
        .query_one(
            "SELECT schema_name, epoch, owner, lock_key FROM pgtenant.tenants WHERE key = $1",
            &[&key],
        )
        .await
        .unwrap_or_else(|e| panic!("tenant {key}: {e}"));
    let schema: String = row.get(0);
    let rows = client
        .query(
            &format!("SELECT epoch, seq, writer, seen_max_epoch FROM \"{schema}\".log"),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("{schema}.log: {e}"))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    Ledger {
        rows,
        epoch: row.get(1),
        owner: row.get(2),
        lock_key: row.get(3),
    }
}

/// What a writer whose client-side checks failed would do with a handle of `epoch` (a paused
/// or cut-off process): a fenced transaction, straight to the server. Only the fence, inside
/// PostgreSQL, stands in its way.
async fn stale_commit(
    client: &mut Client,
    ledger: &str,
    epoch: i64,
    lock_key: i32,
) -> Result<(), tokio_postgres::Error> {
    let id = tenant(ledger);
    let key = id.key();
    let tx = client.transaction().await?;
    tx.query_one(
        "SELECT pgtenant.fence($1, $2, $3, '0')",
        &[&key, &epoch, &lock_key],
    )
    .await?;
    tx.execute(
        "INSERT INTO log (epoch, seq, writer, seen_max_epoch) VALUES ($1, -1, 'stale', 0)",
        &[&epoch],
    )
    .await?;
    tx.commit().await
}

/// Per (ledger, epoch), every writer seen committing or acknowledged under it.
fn owners_by_epoch<'a>(
    entries: impl Iterator<Item = (&'a str, i64, &'a str)>,
) -> BTreeMap<(String, i64), BTreeSet<String>> {
    let mut owners: BTreeMap<(String, i64), BTreeSet<String>> = BTreeMap::new();
    for (ledger, epoch, writer) in entries {
        owners
            .entry((ledger.to_owned(), epoch))
            .or_default()
            .insert(writer.to_owned());
    }
    owners
}

/// A lease that will be lost: before the standby is cut off, `a` holds `ledger` and that is
/// replicated; after, `a` releases it and `b` acquires it (the next epoch) and commits a write,
/// acknowledged by the primary alone. Returns the epoch replicated, `b`'s (lost) epoch and
/// handle, and when the standby was cut off.
async fn lose_a_handoff(
    pair: &StandbyPair,
    a: &Router,
    b: &Router,
    ledger: &str,
) -> (i64, i64, TenantHandle, Instant) {
    let id = tenant(ledger);
    let first = a.open_or_create(&id).await.expect("a creates the ledger");
    create_log(&first).await;
    append(&first, a.replica_id().as_str(), 1)
        .await
        .expect("a writes");
    let replicated = first.epoch().get();
    pair.wait_for_standby()
        .await
        .expect("the standby has a's lease");
    pair.detach_standby().await.expect("cut the standby off");
    let detached = Instant::now();
    first.release().await.expect("a releases");
    let second = b.open(&id).await.expect("b acquires");
    append(&second, b.replica_id().as_str(), 2)
        .await
        .expect("b's write is acknowledged");
    (replicated, second.epoch().get(), second, detached)
}

/// Synchronous replication: replicas write under load, the primary crashes (`-m immediate`),
/// the standby is promoted. Every acknowledged write is on the new primary, every epoch there
/// is above every epoch acknowledged before, the replicas re-register and serve again, and a
/// handle from before the failover cannot commit: neither a paused replica's nor a raw fenced
/// transaction with a pre-failover epoch.
#[tokio::test]
async fn synchronous_failover_loses_nothing_acknowledged_and_no_old_handle_commits() {
    let (pair, db) = pair_with_control_plane(Replication::Synchronous).await;
    let url = pair.url(&db);
    let acks: Acks = Arc::default();
    let (stop_tx, stop) = watch::channel(false);
    let (leases, writers) = start_writers(&url, "sync", 3, &acks, &stop).await;
    let ledgers = leases.ledgers();

    // A replica that will sleep through the failover with a lease it held before it.
    let mut sleeper = ReplicaProcess::spawn(CHILD, &url, "sync-sleeper");
    sleeper.ready().await;
    assert!(sleeper
        .request("open sync-sleeper")
        .await
        .unwrap()
        .starts_with("opened"));
    let reply = sleeper.request("write sync-sleeper 1").await.unwrap();
    assert!(reply.starts_with("ok"), "{reply}");

    until("load before the failover", RECOVERY_BOUND, || {
        lock(&acks).len() >= 60
    })
    .await;
    sleeper.pause();
    // A replica with the library's default backoff (1 s, doubling to 30 s) through an outage
    // as long as a failover manager's detection: only standbys answer meanwhile, so it keeps
    // trying every second instead of backing off to 2, 4, 8 s.
    let patient = Router::start(
        options(&url, "sync-patient")
            .reconnect_backoff(Duration::from_secs(1), Duration::from_secs(30)),
    )
    .await
    .expect("a replica with the default backoff");
    let held = patient
        .open_or_create(&tenant("sync-patient"))
        .await
        .expect("it holds a tenant");
    create_log(&held).await;
    // A tenant forgotten before the failover, to be restored after it: restore names the new
    // life's schema after the epoch it bumps to, which the floor sets.
    let forgotten = patient
        .open_or_create(&tenant("sync-restored"))
        .await
        .expect("a tenant to forget");
    create_log(&forgotten).await;
    append(&forgotten, "sync-patient", 1)
        .await
        .expect("a write before it is forgotten");
    forgotten
        .forget(pgtenant::ActiveWork::Refuse)
        .await
        .expect("forget");
    let crashed = Instant::now();
    pair.stop_primary_immediate()
        .await
        .expect("crash the primary");
    tokio::time::sleep(OUTAGE).await; // the outage itself, not a wait for anything
    pair.promote_standby().await.expect("promote the standby");
    let promoted = Instant::now();
    let back = {
        let patient = patient.clone();
        tokio::spawn(async move {
            let handle = open_when_back(&patient, &tenant("sync-patient")).await;
            append(&handle, "sync-patient", 1)
                .await
                .expect("the patient replica commits again");
            promoted.elapsed()
        })
    };
    // Every replica commits again, each on a new lease.
    let writer_names: Vec<String> = (0..3).map(|i| format!("sync-{i}")).collect();
    until("every replica to commit again", RECOVERY_BOUND, || {
        leases.all_back(&acks, &writer_names, 5)
    })
    .await;

    // The sleeper's tenant is taken over on the new primary; when the sleeper wakes, its
    // pre-failover handle cannot commit.
    let taker = Router::start(options(&url, "sync-taker"))
        .await
        .expect("a replica starts on the promoted server");
    let taken = open_when_back(&taker, &tenant("sync-sleeper")).await;
    append(&taken, "sync-taker", 1)
        .await
        .expect("the new owner commits");
    let restored = taker
        .restore(&tenant("sync-restored"))
        .await
        .expect("a tenant forgotten before the failover is restored after it");
    assert!(
        restored.epoch().get() >= FLOOR_OF_TIMELINE_2
            && restored
                .schema()
                .contains(&format!("_{}_", restored.epoch())),
        "restored at epoch {} as {}",
        restored.epoch(),
        restored.schema()
    );
    assert_eq!(
        support::count_rows(&restored, "SELECT count(*) FROM log").await,
        1,
        "the restored life has its data"
    );
    sleeper.resume();
    let late = sleeper.request("write sync-sleeper 2").await.unwrap();
    assert!(
        late.starts_with("error"),
        "a handle from before the failover committed: {late}"
    );

    let _ = stop_tx.send(true);
    for writer in writers {
        drop(writer.await.expect("writer task"));
    }
    drop(sleeper);
    let acks = lock(&acks).clone();
    let before = leases.before_failover(&acks);
    let firsts: Vec<Duration> = writer_names
        .iter()
        .map(|name| leases.back_after(&acks, name, promoted))
        .collect();

    let mut client = connect(&pair.standby_url(&db)).await;
    assert_eq!(
        pair.timeline(pair.standby_port()).await.unwrap(),
        2,
        "the promoted server writes timeline 2"
    );
    let mut present = BTreeSet::new();
    let mut committed = Vec::new();
    for ledger in ledgers
        .iter()
        .chain(std::iter::once(&"sync-sleeper".to_owned()))
    {
        let state = read_ledger(&client, ledger).await;
        let acked_before = before
            .iter()
            .filter(|ack| &ack.ledger == ledger)
            .map(|ack| ack.epoch)
            .max()
            .unwrap_or(1);
        assert!(
            state.epoch > acked_before && state.epoch >= FLOOR_OF_TIMELINE_2,
            "{ledger}: epoch {} on the new primary, {acked_before} acknowledged before",
            state.epoch
        );
        for (epoch, seq, writer, seen) in &state.rows {
            assert!(
                seen <= epoch,
                "{ledger}: {writer}/{seq} committed under epoch {epoch} after epoch {seen}"
            );
            present.insert((ledger.clone(), writer.clone(), *seq));
            committed.push((ledger.clone(), *epoch, writer.clone()));
        }
    }
    let lost: Vec<&Ack> = acks
        .iter()
        .filter(|ack| !present.contains(&(ack.ledger.clone(), ack.writer.clone(), ack.seq)))
        .collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    let owners = owners_by_epoch(
        committed
            .iter()
            .map(|(l, e, w)| (l.as_str(), *e, w.as_str())),
    );
    let shared: Vec<_> = owners.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(shared.is_empty(), "epochs with two owners: {shared:?}");
    assert!(
        !present.contains(&("sync-sleeper".to_owned(), "sync-sleeper".to_owned(), 2)),
        "the sleeper's late write is not in the ledger"
    );

    // A raw fenced transaction with an epoch acknowledged before the failover is refused.
    let old = before.last().expect("writes before the failover").clone();
    let lock_key = read_ledger(&client, &old.ledger).await.lock_key;
    let refused = stale_commit(&mut client, &old.ledger, old.epoch, lock_key)
        .await
        .expect_err("a pre-failover epoch committed on the new primary");
    assert_eq!(
        sqlstate(&refused),
        Some(pgtenant::sqlstate::FENCED),
        "{refused}"
    );

    let patient_back = back.await.expect("the patient replica");
    // Doubling from 1 s would have it try at 1, 3, 7 s after the crash, so 3.8 s after a
    // promotion at about OUTAGE + 0.2 s (measured: 3.9 s); trying every second, it is back
    // within about 1 s (measured: 0.86-1.01 s). 2.5 s leaves room for a loaded machine.
    assert!(
        patient_back < Duration::from_millis(2500),
        "the replica with the default backoff took {patient_back:?} after the promotion"
    );

    let slowest = firsts.iter().max().copied().unwrap_or_default();
    println!(
        "failover (synchronous): crash to promotion {:?} ({OUTAGE:?} outage); promotion to the \
         first commit by a reacquiring replica {:?}, to all 3 committing again {slowest:?} \
         (first backoff 100 ms), with the default backoff (1 s) {patient_back:?}; acknowledged \
         {} writes ({} before the failover), lost 0",
        promoted - crashed,
        firsts.iter().min().copied().unwrap_or_default(),
        acks.len(),
        before.len(),
    );
    taker.close().await;
    patient.close().await;
}

/// Asynchronous replication: the same under load, with the standby cut off for a while before
/// the crash, so that the failover certainly loses acknowledged writes and acquisitions. The
/// test reports what was lost, and shows that no (tenant, epoch) pair has two owners, that
/// every epoch on the new primary is above every epoch acknowledged before (lost ones
/// included), and that a handle of a lost acquisition cannot commit: the epoch floor.
#[tokio::test]
async fn asynchronous_failover_reports_its_losses_and_no_stale_owner_commits() {
    let (pair, db) = pair_with_control_plane(Replication::Asynchronous).await;
    let url = pair.url(&db);
    let acks: Acks = Arc::default();
    let (stop_tx, stop) = watch::channel(false);
    let (leases, writers) = start_writers(&url, "async", 3, &acks, &stop).await;
    let mut ledgers = leases.ledgers();
    let a = Router::start(options(&url, "async-a")).await.expect("a");
    let b = Router::start(options(&url, "async-b")).await.expect("b");

    until("load before the standby is cut off", RECOVERY_BOUND, || {
        lock(&acks).len() >= 30
    })
    .await;
    // From here on the primary acknowledges what the standby never receives, the handoff
    // of `async-handoff` from a to b included.
    let (replicated, lost_epoch, b_handle, detached) =
        lose_a_handoff(&pair, &a, &b, "async-handoff").await;
    ledgers.push("async-handoff".to_owned());
    until("load after the standby is cut off", RECOVERY_BOUND, || {
        lock(&acks).iter().filter(|ack| ack.at > detached).count() >= 30
    })
    .await;
    let crashed = Instant::now();
    pair.stop_primary_immediate()
        .await
        .expect("crash the primary");
    pair.promote_standby().await.expect("promote the standby");
    let promoted = Instant::now();
    let lost_handoff = Ack {
        ledger: "async-handoff".to_owned(),
        writer: "async-b".to_owned(),
        seq: 2,
        epoch: lost_epoch,
        at: crashed,
    };

    // a, not b, takes the tenant back first: without the floor it would get b's epoch again.
    let again = open_when_back(&a, &tenant("async-handoff")).await;
    append(&again, "async-a", 3)
        .await
        .expect("a commits after the failover");
    assert!(
        !b_handle.is_serving(),
        "b's pre-failover handle still serves"
    );
    let writer_names: Vec<String> = (0..3).map(|i| format!("async-{i}")).collect();
    until("every replica to commit again", RECOVERY_BOUND, || {
        leases.all_back(&acks, &writer_names, 5)
    })
    .await;
    let _ = stop_tx.send(true);
    for writer in writers {
        drop(writer.await.expect("writer task"));
    }
    let mut acks = lock(&acks).clone();
    let mut before = leases.before_failover(&acks);
    before.push(lost_handoff.clone());
    let firsts: Vec<Duration> = writer_names
        .iter()
        .map(|name| leases.back_after(&acks, name, promoted))
        .collect();
    acks.push(lost_handoff);
    acks.push(Ack {
        ledger: "async-handoff".to_owned(),
        writer: "async-a".to_owned(),
        seq: 3,
        epoch: again.epoch().get(),
        at: Instant::now(),
    });
    let mut client = connect(&pair.standby_url(&db)).await;
    let mut present = BTreeSet::new();
    let mut committed: Vec<(String, i64, String)> = Vec::new();
    for ledger in &ledgers {
        let state = read_ledger(&client, ledger).await;
        let acked_before = before
            .iter()
            .filter(|ack| &ack.ledger == ledger)
            .map(|ack| ack.epoch)
            .max()
            .unwrap_or(1);
        assert!(
            state.epoch > acked_before,
            "{ledger}: epoch {} on the new primary is not above the {acked_before} acknowledged \
             before the failover (lost acquisitions included)",
            state.epoch
        );
        for (epoch, seq, writer, seen) in &state.rows {
            assert!(
                seen <= epoch,
                "{ledger}: {writer}/{seq} committed under epoch {epoch} after epoch {seen}"
            );
            present.insert((ledger.clone(), writer.clone(), *seq));
            committed.push((ledger.clone(), *epoch, writer.clone()));
        }
        if let Some(owner) = &state.owner {
            committed.push((ledger.clone(), state.epoch, owner.clone()));
        }
    }
    // No (tenant, epoch) pair has two owners, over everything acknowledged before the
    // failover (lost or not), everything on the new primary and everything acknowledged after.
    let owners = owners_by_epoch(
        acks.iter()
            .map(|ack| (ack.ledger.as_str(), ack.epoch, ack.writer.as_str()))
            .chain(
                committed
                    .iter()
                    .map(|(l, e, w)| (l.as_str(), *e, w.as_str())),
            ),
    );
    let shared: Vec<_> = owners.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(
        shared.is_empty(),
        "epochs issued to two owners across the failover: {shared:?}"
    );
    // The handle of the lost acquisition cannot commit on the new primary.
    let state = read_ledger(&client, "async-handoff").await;
    assert_eq!(
        state.owner.as_deref(),
        Some("async-a"),
        "a holds the tenant again"
    );
    assert!(
        replicated < lost_epoch && lost_epoch < state.epoch,
        "epochs {replicated} (replicated), {lost_epoch} (lost), {} (after the failover)",
        state.epoch
    );
    let refused = stale_commit(&mut client, "async-handoff", lost_epoch, state.lock_key)
        .await
        .expect_err("the lost acquisition's handle committed on the new primary");
    assert_eq!(
        sqlstate(&refused),
        Some(pgtenant::sqlstate::FENCED),
        "{refused}"
    );

    let lost: Vec<&Ack> = acks
        .iter()
        .filter(|ack| !present.contains(&(ack.ledger.clone(), ack.writer.clone(), ack.seq)))
        .collect();
    let pre_failover: BTreeSet<(String, String, i64)> = before
        .iter()
        .map(|ack| (ack.ledger.clone(), ack.writer.clone(), ack.seq))
        .collect();
    assert!(
        lost.iter().all(|ack| pre_failover.contains(&(
            ack.ledger.clone(),
            ack.writer.clone(),
            ack.seq
        ))),
        "only writes acknowledged before the failover can be lost: {lost:?}"
    );
    assert!(
        !lost.is_empty(),
        "the standby was cut off, so the failover loses what was acknowledged since"
    );
    println!(
        "failover (asynchronous, standby cut off {:?} before the crash): crash to promotion \
         {:?}; promotion to the first commit by a reacquiring replica {:?}, to all 3 committing \
         again {:?}; acknowledged {} writes ({} before the failover), lost {} (acknowledged \
         after the cut-off); epochs of the handed-off tenant: {replicated} replicated, \
         {lost_epoch} lost, {} after the failover",
        crashed - detached,
        promoted - crashed,
        firsts.iter().min().copied().unwrap_or_default(),
        firsts.iter().max().copied().unwrap_or_default(),
        acks.len(),
        before.len(),
        lost.len(),
        state.epoch,
    );
    a.close().await;
    b.close().await;
}

/// The control experiment for the floor: the same lossy handoff with `pgtenant.next_epoch`
/// put back to `current + 1` (no floor). The promoted server then issues the lost epoch again,
/// to another owner, and the lost acquisition's handle commits beside it: what DESIGN §9
/// measured, and what `asynchronous_failover_reports_its_losses_and_no_stale_owner_commits`
/// shows the floor prevents.
#[tokio::test]
async fn without_the_floor_a_lossy_failover_reissues_an_epoch_to_another_owner() {
    let (pair, db) = pair_with_control_plane(Replication::Asynchronous).await;
    let primary = connect(&pair.primary_url(&db)).await;
    primary
        .batch_execute(
            "CREATE OR REPLACE FUNCTION pgtenant.epoch_floor() RETURNS bigint
             LANGUAGE sql AS $$ SELECT 0::bigint $$",
        )
        .await
        .expect("remove the floor");
    drop(primary);
    let url = pair.url(&db);
    let a = Router::start(options(&url, "nofloor-a")).await.expect("a");
    let b = Router::start(options(&url, "nofloor-b")).await.expect("b");
    let (_, lost_epoch, _b_handle, _) = lose_a_handoff(&pair, &a, &b, "nofloor").await;
    pair.stop_primary_immediate()
        .await
        .expect("crash the primary");
    pair.promote_standby().await.expect("promote the standby");
    let again = open_when_back(&a, &tenant("nofloor")).await;
    assert_eq!(
        again.epoch().get(),
        lost_epoch,
        "without the floor, the promoted server issues the lost epoch again"
    );
    let mut client = connect(&pair.standby_url(&db)).await;
    let state = read_ledger(&client, "nofloor").await;
    stale_commit(&mut client, "nofloor", lost_epoch, state.lock_key)
        .await
        .expect("without the floor, the lost acquisition's handle passes the fence");
    println!(
        "without the floor: epoch {lost_epoch} was issued to nofloor-b before the failover and \
         to nofloor-a after it, and nofloor-b's handle committed beside nofloor-a's"
    );
    a.close().await;
    b.close().await;
}

/// A lost handoff leaves the promoted server showing the tenant at its previous owner's epoch,
/// which a newer owner had superseded, with acknowledged writes, before the crash. A handle of
/// that surviving epoch (a writer whose client-side checks did not stop it) is refused by the
/// fence itself, in both variants, until the tenant is acquired again at or above the floor
/// (V6: without the floor check in the fence, the stale commit passes).
#[tokio::test]
async fn the_fence_refuses_an_epoch_that_survived_a_lost_handoff() {
    let (pair, db) = pair_with_control_plane(Replication::Asynchronous).await;
    let url = pair.url(&db);
    let a = Router::start(options(&url, "survivor-a")).await.expect("a");
    let b = Router::start(options(&url, "survivor-b")).await.expect("b");
    let (survived, lost, _b_handle, _) = lose_a_handoff(&pair, &a, &b, "survivor").await;
    pair.stop_primary_immediate()
        .await
        .expect("crash the primary");
    pair.promote_standby().await.expect("promote the standby");

    let mut client = connect(&pair.standby_url(&db)).await;
    let state = read_ledger(&client, "survivor").await;
    assert_eq!(
        (state.epoch, state.owner.as_deref()),
        (survived, Some("survivor-a")),
        "the handoff to b (epoch {lost}) was lost: a's epoch survived"
    );
    let refused = stale_commit(&mut client, "survivor", survived, state.lock_key)
        .await
        .expect_err("a handle of the surviving, superseded epoch committed after the failover");
    assert_eq!(sqlstate(&refused), Some("PTF01"), "{refused}");
    let message = refused.as_db_error().map(|db| db.message().to_owned());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("before the database's last failover")),
        "{message:?}"
    );
    let read = client
        .query_one(
            "SELECT pgtenant.fence_read($1, $2, $3, '0')",
            &[&tenant("survivor").key(), &survived, &state.lock_key],
        )
        .await
        .expect_err("the read fence passed a pre-failover epoch");
    assert_eq!(sqlstate(&read), Some("PTF01"), "{read}");
    // Acquired again, the tenant is served at the floor and its writes commit.
    let again = open_when_back(&a, &tenant("survivor")).await;
    assert!(again.epoch().get() >= FLOOR_OF_TIMELINE_2);
    append(&again, a.replica_id().as_str(), 3)
        .await
        .expect("a writes after reacquiring");
    a.close().await;
    b.close().await;
}

/// Incarnation numbers are re-issued after a lossy failover too: a registration the standby
/// never saw is lost, and the replica's next one gets the same number. The secret issued with
/// each registration is what keeps a survivor of the lost incarnation from acting for the new
/// one (V4's comment has the argument); without that check its heartbeat would renew the new
/// incarnation and its acquisitions would pass.
#[tokio::test]
async fn a_lossy_failover_reissues_an_incarnation_but_not_its_secret() {
    let (pair, db) = pair_with_control_plane(Replication::Asynchronous).await;
    let lease = connect(&pair.primary_url(&db)).await;
    let (first, _) = register_by_hand(&lease, "raw").await;
    pair.wait_for_standby().await.unwrap();
    pair.detach_standby().await.unwrap();
    // Registered again and acquiring, on the primary alone.
    let (lost, lost_secret) = register_by_hand(&lease, "raw").await;
    assert_eq!(lost, first + 1);
    lease
        .query_one(
            "SELECT epoch FROM pgtenant.acquire('acme/raw', 'acme', 'raw', 'raw', $1, $2, true)",
            &[&lost, &lost_secret],
        )
        .await
        .expect("the lost incarnation acquires");
    pair.stop_primary_immediate().await.unwrap();
    pair.promote_standby().await.unwrap();
    drop(lease);

    let session = connect(&pair.standby_url(&db)).await;
    let (reissued, secret) = register_by_hand(&session, "raw").await;
    assert_eq!(
        reissued, lost,
        "the promoted server issues the lost incarnation number again"
    );
    let orphans: i64 = session
        .query_one(
            "SELECT count(*) FROM pgtenant.tenants WHERE owner = 'raw' AND owner_incarnation = $1",
            &[&reissued],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(orphans, 0, "no lease names the re-issued incarnation");
    // The survivor of the lost incarnation, with the secret it was given, acts for nobody.
    let heartbeat = "SELECT pgtenant.heartbeat('raw', $1, $2, 60000)";
    let refused = session
        .query_one(heartbeat, &[&reissued, &lost_secret])
        .await
        .expect_err("the lost incarnation's secret renewed the re-issued incarnation");
    assert_eq!(sqlstate(&refused), Some("PTA01"), "{refused}");
    let refused = session
        .query_one(
            "SELECT epoch FROM pgtenant.acquire('acme/raw', 'acme', 'raw', 'raw', $1, $2, true)",
            &[&reissued, &lost_secret],
        )
        .await
        .expect_err("the lost incarnation's secret acquired a tenant");
    assert_eq!(sqlstate(&refused), Some("PTA01"), "{refused}");
    // The re-issued incarnation's own secret works, and its epochs start at the floor.
    let renewed: bool = session
        .query_one(heartbeat, &[&reissued, &secret])
        .await
        .unwrap()
        .get(0);
    assert!(renewed);
    let epoch: i64 = session
        .query_one(
            "SELECT epoch FROM pgtenant.acquire('acme/raw', 'acme', 'raw', 'raw', $1, $2, true)",
            &[&reissued, &secret],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(epoch, FLOOR_OF_TIMELINE_2);
    println!(
        "incarnation {lost} of replica raw was lost in the failover and issued again; the lost \
         one's secret was refused (PTA01)"
    );
}

/// Connection handling with several hosts: hosts are tried in order and standbys skipped,
/// whatever `target_session_attrs` says (pgtenant writes on every connection, and its data
/// sessions are read-only by default, which tokio-postgres' own read-write test would take for
/// a standby); a standby alone is refused with a retryable error naming it; cancel requests
/// reach the server the work runs on; `target_session_attrs=read-only` is refused up front.
#[tokio::test]
async fn several_hosts_reach_the_primary_and_skip_the_standby() {
    let (pair, db) = pair_with_control_plane(Replication::Asynchronous).await;
    let standby_first = |attrs: &str| {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs={attrs}",
            pair.standby_port(),
            pair.primary_port()
        )
    };
    for attrs in ["read-write", "any"] {
        let router = Router::start(options(&standby_first(attrs), &format!("hosts-{attrs}")))
            .await
            .unwrap_or_else(|e| panic!("target_session_attrs={attrs}: {e}"));
        let handle = router
            .open_or_create(&tenant(&format!("hosts-{attrs}")))
            .await
            .unwrap_or_else(|e| panic!("target_session_attrs={attrs}: {e}"));
        create_log(&handle).await;
        append(&handle, router.replica_id().as_str(), 1)
            .await
            .unwrap_or_else(|e| panic!("target_session_attrs={attrs}: {e}"));

        // Work in flight is cancelled where it runs, through the same list of hosts.
        let slow = handle.clone();
        let work = tokio::spawn(async move {
            slow.run(|tx| {
                Box::pin(async move {
                    tx.execute("SELECT pg_sleep(30)", &[]).await?;
                    Ok::<_, Error>(())
                })
            })
            .await
        });
        until("the slow work to start", RECOVERY_BOUND, || {
            handle.in_flight() > 0
        })
        .await;
        let started = Instant::now();
        handle
            .forget(pgtenant::ActiveWork::Cancel)
            .await
            .unwrap_or_else(|e| panic!("target_session_attrs={attrs}: forget: {e}"));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(work.await.unwrap().is_err(), "the cancelled work failed");
        router.close().await;
    }

    let alone = pair.standby_url(&db);
    let error = Router::start(options(&alone, "hosts-standby"))
        .await
        .expect_err("a router started on a standby");
    let text = error.to_string();
    assert_eq!(
        error.sqlstate(),
        Some(pgtenant::sqlstate::NOT_PRIMARY),
        "{text}"
    );
    assert!(error.is_retryable(), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{} is a standby", pair.standby_port())),
        "{text}"
    );

    let read_only = standby_first("read-only");
    match Router::start(options(&read_only, "hosts-read-only")).await {
        Err(Error::InvalidOption { reason, .. }) => {
            assert!(reason.contains("read-write"), "{reason}")
        }
        other => panic!("target_session_attrs=read-only: {other:?}"),
    }
}

/// G9 across a synchronous failover: replica processes write while they are killed and
/// respawned under the same ids, paused past the ttl and their sessions terminated, and halfway
/// through the fault phase the primary crashes and the standby is promoted. Afterwards every
/// replica id serves again within the bound, no stretch went without an acknowledged write for
/// over 10 s, nothing acknowledged is lost and nothing stale committed. With V7's seal on the
/// replica row, a replica sealed before the failover stayed sealed on the promoted server too.
#[tokio::test]
async fn the_fleet_serves_again_after_a_synchronous_failover_under_faults() {
    let (pair, db) = pair_with_control_plane(Replication::Synchronous).await;
    let url = pair.url(&db);
    let names = ["fo-0", "fo-1", "fo-2"];
    let ledgers = ["fo-a", "fo-b"];
    let faults = support::Faults {
        terminate: true,
        failover: Some(&pair),
        ..support::Faults::default()
    };
    let seed = 0x9e37_79b9_7f4a_7c15;
    let (history, total) =
        support::history_test(CHILD, &url, &names, &ledgers, seed, &faults, "fo-checker").await;
    assert!(
        total > 0 && history.failovers == 1,
        "the run exercised writes and the failover"
    );
}

/// Issue 18's fault run across a synchronous failover, long: four replicas, six shared tenants,
/// kills, pauses, terminations, the failover halfway through `PGTENANT_HISTORY_SECS`.
#[tokio::test]
#[ignore = "a long fault run: set PGTENANT_HISTORY_SECS"]
async fn fault_run_across_a_synchronous_failover() {
    let (pair, db) = pair_with_control_plane(Replication::Synchronous).await;
    let url = pair.url(&db);
    let names = ["run-0", "run-1", "run-2", "run-3"];
    let ledgers = ["run-a", "run-b", "run-c", "run-d", "run-e", "run-f"];
    let faults = support::Faults {
        terminate: true,
        failover: Some(&pair),
        ..support::Faults::default()
    };
    let seed = 0x853c_49e6_748f_ea9b;
    support::history_test(CHILD, &url, &names, &ledgers, seed, &faults, "run-checker").await;
}
