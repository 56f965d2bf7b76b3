//! Takeover across real processes: SIGKILL, SIGSTOP/SIGCONT, a database restart, and a
//! history checker under random kills and pauses (G1, G3, G4).

mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use pgtenant::{Error, Router, TenantHandle, TenantId};
use pgtenant_testkit::LocalCluster;
use support::{append, count_rows, create_log, database, router, tenant, ReplicaProcess};

const CHILD: &str = "replica_child";

/// Entry point of the replica child processes (does nothing when run as a plain test).
#[test]
#[ignore = "entry point of the replica child processes"]
fn replica_child() {
    support::child_main();
}

/// Opens, retrying while the holder is still alive by the database's account, sleeping for
/// whatever time the database says its lease has left.
async fn take_over(router: &Router, id: &TenantId, limit: Duration) -> TenantHandle {
    let deadline = Instant::now() + limit;
    loop {
        match router.open(id).await {
            Ok(handle) => return handle,
            Err(Error::LeaseHeld { expires_in, .. }) if Instant::now() < deadline => {
                let wait = expires_in.unwrap_or_default().max(Duration::from_millis(2));
                tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            }
            Err(other) => panic!("takeover of {id} failed: {other}"),
        }
    }
}

#[tokio::test]
async fn a_killed_owner_is_taken_over_at_once_and_nothing_acknowledged_is_lost() {
    let (db, _client) = database().await;
    let mut child = ReplicaProcess::spawn(CHILD, db.url(), "killed");
    child.ready().await;
    assert!(child
        .request("open killed")
        .await
        .unwrap()
        .starts_with("opened"));
    for seq in 0..10 {
        let reply = child.request(&format!("write killed {seq}")).await.unwrap();
        assert!(reply.starts_with("ok"), "{reply}");
    }
    let survivor = router(db.url(), "survivor").await;
    let id = tenant("killed");
    let killed_at = Instant::now();
    child.kill();
    let handle = take_over(&survivor, &id, Duration::from_secs(5)).await;
    append(&handle, "survivor", 0)
        .await
        .expect("first commit of the new owner");
    let takeover = killed_at.elapsed();
    println!("takeover after SIGKILL: {takeover:?} to the new owner's first commit");
    assert_eq!(
        count_rows(&handle, "SELECT count(*) FROM log WHERE writer = 'killed'").await,
        10
    );
    survivor.close().await;
}

#[tokio::test]
async fn a_paused_owner_is_taken_over_after_expiry_and_its_late_write_is_refused() {
    let (db, _client) = database().await;
    let mut child = ReplicaProcess::spawn(CHILD, db.url(), "paused");
    child.ready().await;
    assert!(child
        .request("open paused")
        .await
        .unwrap()
        .starts_with("opened"));
    assert!(child
        .request("write paused 1")
        .await
        .unwrap()
        .starts_with("ok"));
    // Pause it in the middle of a transaction that holds the tenant row.
    child.send("hold paused 2 300");
    assert_eq!(child.reply().await.unwrap(), "holding");
    child.pause();

    let other = router(db.url(), "patient").await;
    let id = tenant("paused");
    let handle = take_over(&other, &id, Duration::from_secs(30)).await;
    append(&handle, "patient", 1)
        .await
        .expect("the new owner commits");

    child.resume();
    let held = child.reply().await.unwrap();
    assert!(
        held.starts_with("error"),
        "the paused transaction cannot commit: {held}"
    );
    let late = child.request("write paused 3").await.unwrap();
    assert!(
        late.starts_with("error"),
        "the old owner's next write is refused: {late}"
    );
    assert_eq!(
        count_rows(
            &handle,
            "SELECT count(*) FROM log WHERE writer = 'paused' AND seq > 1"
        )
        .await,
        0,
        "nothing the old owner wrote after the takeover is in the ledger"
    );
    assert_eq!(
        count_rows(&handle, "SELECT count(*) FROM log WHERE writer = 'paused'").await,
        1
    );
    other.close().await;
}

/// The test kit's own throwaway cluster, never the shared service, is restarted under load.
#[tokio::test]
async fn a_database_restart_mid_load_loses_nothing_acknowledged() {
    let cluster = LocalCluster::start().await.expect("throwaway cluster");
    let db = cluster.create_database().await.expect("database");
    let mut client = db.connect().await.unwrap();
    pgtenant::setup(&mut client).await.unwrap();
    drop(client);
    let router = std::sync::Arc::new(router(db.url(), "restarted").await);
    let id = tenant("restart");
    let first = router.open_or_create(&id).await.unwrap();
    create_log(&first).await;

    let writer = {
        let (router, id, mut handle) = (router.clone(), id.clone(), first.clone());
        let (stop_tx, mut stop) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let (mut acked, mut refused, mut seq) = (BTreeSet::new(), 0_u32, 0_i64);
            let mut epochs = BTreeSet::new();
            while stop.try_recv().is_err() {
                seq += 1;
                match append(&handle, "restarted", seq).await {
                    Ok(()) => {
                        acked.insert(seq);
                        epochs.insert(handle.epoch());
                    }
                    Err(_) => {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                if !handle.is_serving() {
                    if let Ok(fresh) = router.open(&id).await {
                        handle = fresh;
                    }
                }
            }
            (acked, refused, epochs)
        });
        (stop_tx, task)
    };
    let mut events = router.subscribe();
    tokio::time::sleep(Duration::from_millis(300)).await; // some load before the restart
    cluster.restart().await.expect("restart");
    // Wait until the replica registered again and the writer got going on the new epoch.
    loop {
        if let pgtenant::Event::Registered { .. } = events.recv().await.unwrap() {
            break;
        }
    }
    loop {
        if let pgtenant::Event::Acquired { .. } = events.recv().await.unwrap() {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // some load after it
    let (stop, task) = writer;
    let _ = stop.send(());
    let (acked, refused, epochs) = task.await.unwrap();
    assert!(
        refused > 0,
        "writers were refused while the database was down"
    );
    assert!(
        epochs.len() >= 2,
        "writes landed before and after, on higher epochs: {epochs:?}"
    );
    let last = router.handle_of(&id).expect("serving after the restart");
    assert!(last.epoch() > first.epoch());
    let present: BTreeSet<i64> = last
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, Error>(
                    tx.query("SELECT seq FROM log", &[])
                        .await?
                        .iter()
                        .map(|r| r.get(0))
                        .collect(),
                )
            })
        })
        .await
        .unwrap();
    let missing: Vec<_> = acked.difference(&present).collect();
    assert!(missing.is_empty(), "acknowledged but missing: {missing:?}");
    router.close().await;
}

/// Several replica processes append (tenant, epoch, seq) rows while they are killed and paused
/// at random. Afterwards: no row was committed under an epoch lower than one already committed
/// for its tenant, and every acknowledged row is present.
#[tokio::test]
async fn history_checker_under_random_kills_and_pauses() {
    let (db, _client) = database().await;
    let names = ["hist-0", "hist-1", "hist-2"];
    let ledgers = ["hist-a", "hist-b"];
    let mut children: Vec<ReplicaProcess> = Vec::new();
    for name in names {
        let mut child = ReplicaProcess::spawn(CHILD, db.url(), name);
        child.ready().await;
        children.push(child);
    }
    let mut paused_until: Vec<Option<Instant>> = vec![None; names.len()];
    let mut acked: HashMap<&str, BTreeSet<(String, i64)>> = HashMap::new();
    let (mut seq, mut kills, mut pauses, mut refusals) = (0_i64, 0, 0, 0);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let end = Instant::now() + Duration::from_secs(8);
    while Instant::now() < end {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let c = (seed % names.len() as u64) as usize;
        let ledger = ledgers[((seed >> 8) % 2) as usize];
        if let Some(until) = paused_until[c] {
            if Instant::now() < until {
                continue;
            }
            children[c].resume();
            paused_until[c] = None;
        }
        match (seed >> 16) % 100 {
            0..=2 => {
                let old = std::mem::replace(
                    &mut children[c],
                    ReplicaProcess::spawn(CHILD, db.url(), names[c]),
                );
                old.kill();
                children[c].ready().await;
                kills += 1;
            }
            3..=5 => {
                children[c].pause();
                let millis = 200 + (seed >> 24) % 3000;
                paused_until[c] = Some(Instant::now() + Duration::from_millis(millis));
                pauses += 1;
            }
            6..=25 => {
                let _ = children[c].request(&format!("open {ledger}")).await;
            }
            _ => {
                seq += 1;
                let reply = children[c]
                    .request(&format!("write {ledger} {seq}"))
                    .await
                    .unwrap_or_default();
                if reply.starts_with("ok") {
                    acked
                        .entry(ledger)
                        .or_default()
                        .insert((names[c].to_owned(), seq));
                } else {
                    refusals += 1;
                }
            }
        }
    }
    for (child, paused) in children.iter().zip(&paused_until) {
        if paused.is_some() {
            child.resume();
        }
    }
    drop(children);
    let checker = router(db.url(), "hist-checker").await;
    let mut total = 0;
    for ledger in ledgers {
        let id = tenant(ledger);
        let handle = take_over(&checker, &id, Duration::from_secs(30)).await;
        let rows: Vec<(i64, i64, String, i64)> = handle
            .read(|tx| {
                Box::pin(async move {
                    Ok::<_, Error>(
                        tx.query("SELECT epoch, seq, writer, seen_max_epoch FROM log", &[])
                            .await?
                            .iter()
                            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                            .collect(),
                    )
                })
            })
            .await
            .unwrap();
        let stale: Vec<_> = rows
            .iter()
            .filter(|(epoch, _, _, seen)| seen > epoch)
            .collect();
        assert!(
            stale.is_empty(),
            "{ledger}: committed under an epoch lower than one already committed: {stale:?}"
        );
        let present: BTreeSet<(String, i64)> = rows
            .iter()
            .map(|(_, seq, writer, _)| (writer.clone(), *seq))
            .collect();
        let want = acked.remove(ledger).unwrap_or_default();
        let missing: Vec<_> = want.difference(&present).collect();
        assert!(
            missing.is_empty(),
            "{ledger}: acknowledged but missing: {missing:?}"
        );
        let epochs: BTreeSet<i64> = rows.iter().map(|r| r.0).collect();
        println!(
            "{ledger}: {} rows ({} acknowledged) over {} epochs",
            rows.len(),
            want.len(),
            epochs.len()
        );
        total += want.len();
    }
    println!("history checker: {kills} kills, {pauses} pauses, {refusals} refused writes, {total} acknowledged");
    assert!(
        total > 0 && kills + pauses > 0,
        "the run exercised writes and faults"
    );
    checker.close().await;
}
