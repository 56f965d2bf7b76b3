//! Silent network partitions (DESIGN G9, threat model): replica processes in network namespaces
//! whose links the tests cut with nftables drop rules (no RST, no FIN), against a cluster of the
//! test's own listening on the links (`tests/support/netns.rs`).
//!
//! * A lost node: its link is cut for good and its process killed; the same replica id
//!   started on another address registers within the documented bound, because PostgreSQL
//!   ends the old lease session (and its liveness lock) within `tcp_user_timeout`, whatever is
//!   in flight to it.
//! * Partitioned mid-stream and mid-COPY: a replica on the host side takes the tenant over and
//!   commits within 3 × ttl + backoff, nothing of the stale transaction commits, and the
//!   partitioned replica serves again once its link heals.
//! * The history driver with partitions: 0 lost, 0 stale, live.
//!
//! Every test skips with one line where the machine cannot make a namespace (not root, no
//! `ip` or `nft`); `PGTENANT_REQUIRE_NETNS=1` (`.ci/run`) makes that a failure. Run them under
//! both fencings: `PGTENANT_TEST_FENCING=session|transaction`.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use pgtenant::{Error, Router, TenantHandle};
use support::netns::{self, Link, Partitions};
use support::{
    append, describe, say, serves_again, take_over, tenant, try_create_log, Faults, APPEND_SQL,
    SERVE_AGAIN_BOUND, TTL,
};
use tokio::sync::mpsc;

/// This file's own replica processes ([`partition_child`]).
const CHILD: &str = "partition_child";
/// The history driver's replica processes ([`support::child_main`]).
const HISTORY_CHILD: &str = "replica_child";

/// How long PostgreSQL may keep the session of a client that went silent, with the tests'
/// options: `tcp_user_timeout` defaults to the ttl (1.5 s here), and the documented bound is
/// 2 × tcp_user_timeout + one keepalive interval (2 s) (docs/guide.md, "Detection bounds").
const SESSION_BOUND: Duration = Duration::from_millis(2 * TTL.as_millis() as u64 + 2000);

/// Room for this machine (two cores shared by several test runs) and, for a respawn, for the
/// process to start and retry at its pace (100 ms).
const SLACK: Duration = Duration::from_secs(3);

/// Entry point of the history driver's replica processes. Before [`support::child_main`]
/// starts the router it waits until the replica id is free, as an orchestrator restarting a
/// replica would: a predecessor killed just after its link healed can leave a lease session
/// the server has not yet seen end (its last packets were lost in the cut), for at most the
/// TCP bound ([`SESSION_BOUND`]).
#[test]
#[ignore = "entry point of the replica child processes"]
fn replica_child() {
    if let (Ok(url), Ok(replica)) = (
        std::env::var("PGTENANT_CHILD_URL"),
        std::env::var("PGTENANT_CHILD_REPLICA"),
    ) {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            let started = Instant::now();
            loop {
                let held: bool = client
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pgtenant.replica_status
                                         WHERE replica_id = $1 AND lock_held)",
                        &[&replica],
                    )
                    .await
                    .expect("replica_status")
                    .get(0);
                if !held {
                    if started.elapsed() > Duration::from_millis(200) {
                        eprintln!(
                            "replica_child: {replica} waited {:?} for its id (a predecessor's \
                             lease session the server had not yet seen end)",
                            started.elapsed()
                        );
                    }
                    break;
                }
                assert!(
                    started.elapsed() < SESSION_BOUND + SLACK,
                    "replica id {replica} still held after {SESSION_BOUND:?} + {SLACK:?}"
                );
                // An orchestrator's restart pace; there is no event for another session's end.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    support::child_main();
}

/// Entry point of this file's replica processes: `open <ledger>` and `write <ledger> <seq>` as
/// in [`support::child_main`], plus
/// * `stream <ledger> <seq>`: in one fenced transaction, writes row `seq`, then reads a 5 GB
///   result, saying `streaming` at its first row; answers when the result ends or fails;
/// * `copy <ledger> <seq>`: in one fenced transaction, `COPY log FROM STDIN` with one row
///   (one CopyData, flushed, no CopyDone), says `copying`, then waits for the next line on
///   stdin before sending CopyDone and committing.
///
/// Its start retries while the replica id is in use (a lost node's lease session still holds
/// it), as an orchestrator restarting a replaced node would, and the ready line says how many
/// times it was refused: `ready <incarnation> <refusals>`.
#[test]
#[ignore = "entry point of the replica child processes"]
fn partition_child() {
    let Ok(url) = std::env::var("PGTENANT_CHILD_URL") else {
        return; // run as an ordinary (ignored) test: nothing to do
    };
    let replica = std::env::var("PGTENANT_CHILD_REPLICA").expect("replica id");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let mut refused = 0_u32;
        let router = loop {
            match Router::start(support::options(&url, &replica)).await {
                Ok(router) => break router,
                Err(Error::ReplicaIdInUse { .. }) => {
                    refused += 1;
                    // The pace of an orchestrator's restarts, not a wait for a condition.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(other) => panic!("replica {replica} could not start: {other}"),
            }
        };
        say(&format!(
            "ready {} {refused}",
            router.incarnation().map_or(0, |i| i.get())
        ));
        let mut commands = support::stdin_lines();
        let mut handles: HashMap<String, TenantHandle> = HashMap::new();
        while let Some(line) = commands.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match words.as_slice() {
                ["open", ledger] => match router.open_or_create(&tenant(ledger)).await {
                    Ok(handle) => match try_create_log(&handle).await {
                        Ok(()) => {
                            let epoch = handle.epoch();
                            handles.insert((*ledger).to_owned(), handle);
                            format!("opened {epoch}")
                        }
                        Err(e) => describe(&e),
                    },
                    Err(e) => describe(&e),
                },
                ["write", ledger, seq] => match handles.get(*ledger) {
                    Some(handle) => {
                        match append(handle, &replica, seq.parse().expect("seq")).await {
                            Ok(()) => format!("ok {seq} {}", handle.epoch()),
                            Err(e) => describe(&e),
                        }
                    }
                    None => "error NotOpen".to_owned(),
                },
                ["stream", ledger, seq] => match handles.get(*ledger) {
                    Some(handle) => match stream(handle, &replica, seq.parse().expect("seq")).await
                    {
                        Ok(rows) => format!("ok {seq} {rows}"),
                        Err(e) => describe(&e),
                    },
                    None => "error NotOpen".to_owned(),
                },
                ["copy", ledger, seq] => match handles.get(*ledger) {
                    Some(handle) => {
                        let seq = seq.parse().expect("seq");
                        match copy(handle, &replica, seq, &mut commands).await {
                            Ok(rows) => format!("ok {seq} {rows}"),
                            Err(e) => describe(&e),
                        }
                    }
                    None => "error NotOpen".to_owned(),
                },
                _ => format!("error BadCommand {line}"),
            };
            say(&reply);
        }
    });
}

/// Writes row `seq`, then reads a large result in the same fenced transaction (its backend
/// ends up blocked sending, `ClientWrite`, once the reader's link is cut).
async fn stream(handle: &TenantHandle, writer: &str, seq: i64) -> pgtenant::Result<u64> {
    let (epoch, writer) = (handle.epoch(), writer.to_owned());
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.execute(APPEND_SQL, &[&epoch, &seq, &writer]).await?;
                let none: [i64; 0] = [];
                let rows = tx
                    .query_raw(
                        "SELECT repeat('x', 1000) FROM generate_series(1, 5000000)",
                        none,
                    )
                    .await?;
                let mut rows = std::pin::pin!(rows);
                let mut read = 0_u64;
                while let Some(row) = rows.next().await {
                    row?;
                    read += 1;
                    if read == 1 {
                        say("streaming");
                    }
                }
                Ok::<_, Error>(read)
            })
        })
        .await
}

/// `COPY log FROM STDIN` with one row sent and flushed, then nothing (the backend waits in
/// `ClientRead`) until the next line on `commands`; then CopyDone and COMMIT.
async fn copy(
    handle: &TenantHandle,
    writer: &str,
    seq: i64,
    commands: &mut mpsc::UnboundedReceiver<String>,
) -> pgtenant::Result<u64> {
    let row = format!("{}\t{seq}\t{writer}\t0\n", handle.epoch());
    // CopyInSink takes a `Buf`; a static slice is one without another dependency.
    let row: &'static [u8] = Box::leak(row.into_bytes().into_boxed_slice());
    handle
        .run(move |tx| {
            Box::pin(async move {
                let sink = tx
                    .copy_in("COPY log (epoch, seq, writer, seen_max_epoch) FROM STDIN")
                    .await?;
                let mut sink = std::pin::pin!(sink);
                sink.send(row).await?;
                say("copying");
                let _ = commands.recv().await;
                Ok::<_, Error>(sink.as_mut().finish().await?)
            })
        })
        .await
}

/// How many backends of the cluster's database a client at `address` has.
async fn backends_from(admin: &tokio_postgres::Client, address: std::net::Ipv4Addr) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND client_addr = $1::text::inet",
            &[&address.to_string()],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

/// Polls until backend `pid` is gone, for at most `limit`; returns when it went (measured
/// from `since`), or None past the limit.
async fn backend_gone(
    admin: &tokio_postgres::Client,
    pid: i32,
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    while since.elapsed() < limit {
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if left == 0 {
            return Some(since.elapsed());
        }
        // Observing the server's state: there is no event for another session's end.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// The pid of the one backend of `address` whose activity matches `pattern` (a LIKE pattern
/// on its query, or its application name), waiting for it to show.
async fn backend_of(
    admin: &tokio_postgres::Client,
    address: std::net::Ipv4Addr,
    pattern: &str,
) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                  WHERE client_addr = $1::text::inet
                    AND (query LIKE $2 OR application_name LIKE $2)
                  LIMIT 1",
                &[&address.to_string(), &pattern],
            )
            .await
            .expect("pg_stat_activity");
        if let Some(row) = row {
            return row.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "no backend from {address} matching {pattern}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Nothing stale (no row committed under an epoch below one already committed) and exactly
/// the `present` (writer, seq) rows of `writers`, none of `absent`.
fn assert_log(
    rows: &[(i64, i64, String, i64)],
    present: &[(&str, i64)],
    absent: &[(&str, i64)],
    what: &str,
) {
    let stale: Vec<_> = rows.iter().filter(|(e, _, _, seen)| seen > e).collect();
    assert!(stale.is_empty(), "{what}: stale rows {stale:?}");
    let has = |(writer, seq): &(&str, i64)| rows.iter().any(|r| r.2 == *writer && r.1 == *seq);
    for row in present {
        assert!(
            has(row),
            "{what}: acknowledged row {row:?} missing: {rows:?}"
        );
    }
    for row in absent {
        assert!(
            !has(row),
            "{what}: row {row:?} of a transaction cut off by the partition committed: {rows:?}"
        );
    }
}

/// The server's end of pgtenant's own data sessions has the TCP bounds (G9): `tcp_user_timeout`
/// (the ttl by default, 1.5 s in these tests, or the option) and keepalives that probe within
/// it, as startup options, which the session hygiene between tenants keeps (a session `SET` in
/// one tenant's work does not reach the next). A bound from the connection string out of range
/// is refused, naming where it came from (G7). The lease session's are shown by the lost-node
/// test below, which fails without them.
#[tokio::test]
async fn data_sessions_carry_the_tcp_bounds_on_the_servers_end() {
    let (db, _client) = support::database().await;
    let read = |handle: TenantHandle| async move {
        handle
            .run(|tx| {
                Box::pin(async move {
                    let row = tx
                        .query_one(
                            "SELECT current_setting('tcp_user_timeout'),
                                    (SELECT string_agg(setting, ' ' ORDER BY name) FROM pg_settings
                                      WHERE name LIKE 'tcp_keepalives_%')",
                            &[],
                        )
                        .await?;
                    let seen: (String, String) = (row.get(0), row.get(1));
                    // Session-level, in the tenant's work: must not reach the next tenant.
                    tx.batch_execute("SET SESSION tcp_user_timeout = 0").await?;
                    Ok::<_, Error>(seen)
                })
            })
            .await
    };
    for (options, user_timeout, keepalives) in [
        (support::options(db.url(), "bounds"), "1500", "3 1 2"),
        (
            support::options(db.url(), "bounds").tcp_user_timeout(Duration::from_secs(20)),
            "20000",
            "3 5 2",
        ),
    ] {
        let router = Router::start(options.pool_size(1)).await.expect("router");
        for ledger in ["bounds-a", "bounds-b"] {
            let handle = router.open_or_create(&tenant(ledger)).await.expect("open");
            let seen = read(handle).await;
            // Either the SET was refused, or it was reset before the next tenant's work.
            if let Ok((timeout, probes)) = seen {
                assert_eq!(
                    (timeout.as_str(), probes.as_str()),
                    (user_timeout, keepalives),
                    "{ledger}: tcp_user_timeout and keepalives_count, _idle, _interval"
                );
            }
        }
        let handle = router.open(&tenant("bounds-a")).await.expect("open");
        let (timeout, _) = read(handle).await.unwrap_or_default();
        assert_eq!(timeout, user_timeout, "after another tenant's session SET");
        router.close().await;
    }
    let from_url = format!("{}?tcp_user_timeout=7200", db.url());
    match Router::start(support::options(&from_url, "bounds")).await {
        Err(Error::InvalidOption { option, reason, .. }) => {
            assert_eq!(option, "tcp_user_timeout");
            assert!(reason.contains("connection string"), "{reason}");
        }
        Err(other) => panic!("expected InvalidOption, got {other}"),
        Ok(_) => panic!("a 2 h tcp_user_timeout was accepted"),
    }
}

/// A lost node: replica `node` in namespace A holds tenants; A's link is cut for good and the
/// process killed (as when a host dies behind a partition); a NOTIFY is pending to its lease
/// session, as in a running fleet, so the server keeps retransmitting to it. The same replica
/// id started in namespace B (a new address) must register within the documented bound: the
/// server ends the old lease session within 2 × tcp_user_timeout + 2 s, whatever was in flight.
/// Before the server-side `tcp_user_timeout`, the old session lived ~15 min (`tcp_retries2`),
/// refusing the respawn with `ReplicaIdInUse` all along.
/// Meanwhile a replica on the host side takes over one of the lost node's tenants after its
/// expiry (G9), and nothing acknowledged is lost (G4).
#[tokio::test]
async fn a_lost_nodes_replica_id_registers_again_on_a_new_address_within_the_bound() {
    if netns::skip("a_lost_nodes_replica_id_registers_again_on_a_new_address_within_the_bound") {
        return;
    }
    let (a, b) = (Link::new(), Link::new());
    let (cluster, db) = netns::cluster_on(&[&a, &b]).await;
    let admin = support::connect(db.url()).await;
    let mut lost = a.spawn(CHILD, &cluster.url_on(a.host_ip(), db.name()), "node");
    lost.ready().await;
    for ledger in ["lost-1", "lost-2"] {
        let opened = lost.request(&format!("open {ledger}")).await.unwrap();
        assert!(opened.starts_with("opened"), "{opened}");
        for seq in 1..=3 {
            let wrote = lost
                .request(&format!("write {ledger} {seq}"))
                .await
                .unwrap();
            assert!(wrote.starts_with("ok"), "{wrote}");
        }
    }
    let lease_pid = backend_of(&admin, a.inside, "pgtenant lease node").await;

    let watcher_admin = support::connect(db.url()).await;
    let host = support::router(db.url(), "host-side").await;

    a.cut();
    let cut_at = Instant::now();
    lost.kill(); // its FIN and RST vanish at the cut
    admin
        .batch_execute("NOTIFY pgtenant_free, 'acme/elsewhere'")
        .await
        .expect("notify");
    // The orchestrator starts the replacement at once, on another address.
    let mut respawned = b.spawn(CHILD, &cluster.url_on(b.host_ip(), db.name()), "node");

    // The lease session's end, watched on the side.
    let watcher = tokio::spawn(async move {
        backend_gone(&watcher_admin, lease_pid, cut_at, Duration::from_secs(60)).await
    });
    // Meanwhile a replica on the host side takes lost-2 over once the node's lease expired.
    let takeover = {
        let host = host.clone();
        tokio::spawn(async move {
            let taken = take_over(&host, &tenant("lost-2"), SERVE_AGAIN_BOUND).await;
            append(&taken, "host-side", 1)
                .await
                .expect("host-side write");
            cut_at.elapsed()
        })
    };
    let ready = respawned.reply().await.expect("ready line");
    let registered = cut_at.elapsed();
    let host_commit = takeover.await.expect("host-side takeover");
    assert!(ready.starts_with("ready"), "{ready}");
    let refusals: u32 = ready
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .expect("refusals");
    let session_end = watcher
        .await
        .expect("watcher")
        .expect("the lost node's lease session ended within a minute");
    let opened = respawned.request("open lost-1").await.unwrap();
    assert!(opened.starts_with("opened"), "{opened}");
    let wrote = respawned.request("write lost-1 4").await.unwrap();
    assert!(wrote.starts_with("ok"), "{wrote}");
    let respawn_commit = cut_at.elapsed();
    println!(
        "lost node: cut → host-side takeover committed {host_commit:?}; old lease session \
         ended {session_end:?}; respawn on a new address registered {registered:?} \
         ({refusals} ReplicaIdInUse refusals), committed {respawn_commit:?}"
    );
    assert!(
        session_end <= SESSION_BOUND + Duration::from_secs(1),
        "the lost node's lease session lived {session_end:?} after the cut, over {SESSION_BOUND:?}"
    );
    assert!(
        registered <= SESSION_BOUND + SLACK,
        "the respawn registered {registered:?} after the cut, over {SESSION_BOUND:?} + {SLACK:?}"
    );
    // Every backend of the lost node ends too (its data sessions: keepalives, bounded the same).
    let deadline = cut_at + SESSION_BOUND + SLACK;
    while backends_from(&admin, a.inside).await > 0 {
        assert!(
            Instant::now() < deadline,
            "backends of the lost node outlived {SESSION_BOUND:?} + {SLACK:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Both halves: nothing acknowledged lost, nothing stale, both tenants serving.
    let checker = support::router(db.url(), "checker").await;
    respawned.kill();
    host.close().await;
    for (ledger, present) in [
        (
            "lost-1",
            vec![("node", 1), ("node", 2), ("node", 3), ("node", 4)],
        ),
        (
            "lost-2",
            vec![("node", 1), ("node", 2), ("node", 3), ("host-side", 1)],
        ),
    ] {
        let handle = take_over(&checker, &tenant(ledger), Duration::from_secs(30)).await;
        assert_log(&support::log_rows(&handle).await, &present, &[], ledger);
    }
    checker.close().await;
}

/// What the partitioned owner is doing when its link is cut.
#[derive(Clone, Copy, Debug)]
enum Midway {
    /// Reading a large result: its backend blocks sending (`ClientWrite`).
    Stream,
    /// In a `COPY FROM STDIN` after one CopyData: its backend waits reading (`ClientRead`).
    Copy,
}

/// The owner of `mid`, in a namespace, is partitioned while `midway`; a replica on the host side
/// takes `mid` over and commits within 3 × ttl + backoff (G9, [`SERVE_AGAIN_BOUND`] with room
/// for this machine), in either fencing; nothing of the cut-off transaction commits (G1, G3);
/// once the link heals the partitioned replica serves again (G9).
async fn partitioned_midway(midway: Midway) {
    let link = Link::new();
    let (cluster, db) = netns::cluster_on(&[&link]).await;
    let admin = support::connect(db.url()).await;
    let mut owner = link.spawn(CHILD, &cluster.url_on(link.host_ip(), db.name()), "inside");
    owner.ready().await;
    for ledger in ["mid", "inside-own"] {
        let opened = owner.request(&format!("open {ledger}")).await.unwrap();
        assert!(opened.starts_with("opened"), "{opened}");
    }
    let wrote = owner.request("write mid 1").await.unwrap();
    assert!(wrote.starts_with("ok"), "{wrote}");
    let (command, started, pattern) = match midway {
        Midway::Stream => ("stream mid 2", "streaming", "%generate_series%"),
        Midway::Copy => ("copy mid 2", "copying", "COPY log%"),
    };
    let answer = owner.request(command).await.unwrap();
    assert_eq!(answer, started);
    let stale_pid = backend_of(&admin, link.inside, pattern).await;

    link.cut();
    let cut_at = Instant::now();
    let host = support::router(db.url(), "outside").await;
    let taken = take_over(&host, &tenant("mid"), SERVE_AGAIN_BOUND).await;
    append(&taken, "outside", 1)
        .await
        .expect("the host side commits");
    let committed = cut_at.elapsed();
    let ended = backend_gone(&admin, stale_pid, cut_at, SERVE_AGAIN_BOUND).await;
    println!(
        "partitioned mid-{midway:?} ({:?} fencing): cut → host-side takeover committed \
         {committed:?}; the stale backend ended {ended:?}",
        host.summary().fencing
    );
    assert!(
        committed <= SERVE_AGAIN_BOUND,
        "takeover committed {committed:?} after the cut, over 3 × ttl + backoff ({SERVE_AGAIN_BOUND:?})"
    );
    assert!(
        ended.is_some(),
        "the stale backend outlived {SERVE_AGAIN_BOUND:?}"
    );

    link.heal();
    let healed = Instant::now();
    if let Midway::Copy = midway {
        owner.send("finish"); // CopyDone, then COMMIT: refused
    }
    let cut_off = owner.reply().await.expect("the cut-off work answers");
    let answered = healed.elapsed();
    assert!(
        cut_off.starts_with("error"),
        "the transaction cut off by the partition: {cut_off}"
    );
    let back = serves_again(&mut owner, "inside-own", 1, SERVE_AGAIN_BOUND).await;
    println!(
        "partitioned mid-{midway:?}: after the heal, the cut-off work answered in {answered:?} \
         ({cut_off}); serving again {back:?} after that"
    );
    assert_log(
        &support::log_rows(&taken).await,
        &[("inside", 1), ("outside", 1)],
        &[("inside", 2)],
        "mid",
    );
    host.close().await;
}

#[tokio::test]
async fn a_tenant_partitioned_mid_stream_is_taken_over_within_the_bound() {
    if netns::skip("a_tenant_partitioned_mid_stream_is_taken_over_within_the_bound") {
        return;
    }
    partitioned_midway(Midway::Stream).await;
}

#[tokio::test]
async fn a_tenant_partitioned_mid_copy_is_taken_over_within_the_bound() {
    if netns::skip("a_tenant_partitioned_mid_copy_is_taken_over_within_the_bound") {
        return;
    }
    partitioned_midway(Midway::Copy).await;
}

/// The history driver with silent partitions besides every other fault it makes (kills,
/// pauses, terminations, writes cut at random points, pauses mid-stream and mid-COPY): each
/// replica in a namespace of its own, links cut for 0.5–3.5 s (half the time with a transaction
/// open across the cut, while another replica takes over a shared ledger the cut one held) and
/// healed. Both halves: 0 lost, 0 stale, live. Prints the figures: acknowledged writes, the
/// longest stretch without one, and the takeover times under partition.
#[tokio::test]
async fn history_checker_under_silent_partitions() {
    if netns::skip("history_checker_under_silent_partitions") {
        return;
    }
    let names = ["part-0", "part-1", "part-2"];
    let ledgers = ["part-a", "part-b"];
    let (partitions, _cluster, db) = Partitions::start(names.len()).await;
    let faults = Faults {
        terminate: true,
        cancel: true,
        stalls: true,
        partitions: Some(&partitions),
        ..Faults::default()
    };
    let seed = 0x51ed_2701_f3a5_c0de;
    let history =
        support::run_history(HISTORY_CHILD, db.url(), &names, &ledgers, seed, &faults).await;
    let stretch = history.assert_live(&names, &ledgers);
    let total = support::check_all(&history, db.url(), "part-checker", &names, &ledgers).await;
    let mut takeovers: Vec<Duration> = history
        .partitions
        .iter()
        .filter_map(|cut| cut.taken_over)
        .collect();
    takeovers.sort();
    let in_flight = history
        .partitions
        .iter()
        .filter(|cut| cut.in_flight)
        .count();
    println!(
        "partitions ({:?} fencing): {} cuts ({in_flight} with a transaction open across); \
         {total} acknowledged; longest stretch without an ack {stretch:?}; a cut replica's \
         shared ledger held at the cut, taken over and written by another replica: {} of {}, \
         median {:?}, max {:?}",
        support::fencing(),
        history.partitions.len(),
        takeovers.len(),
        history
            .partitions
            .iter()
            .filter(|cut| cut.ledger.is_some())
            .count(),
        takeovers.get(takeovers.len() / 2),
        takeovers.last()
    );
    assert!(
        total > 0 && !history.partitions.is_empty(),
        "the run exercised writes and partitions"
    );
}
