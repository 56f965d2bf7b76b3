//! The history harness: replica processes append to shared and own ledgers while faults are
//! injected ([`run_history`], [`Faults`]), then the verdict, liveness ([`History::assert_live`])
//! and safety ([`check_all`], [`check_history`]), and whether the status views agreed
//! throughout ([`views_disagree`]).

use std::time::Duration;

use pgtenant::TenantHandle;

use super::alarm_workload::{
    alarm_command, check_alarms, drain_alarms, AlarmScheduling, AlarmVerdict, ALARMS_ENV,
};
use super::child::ReplicaProcess;
use super::log::log_rows;
use super::netns;
use super::routers::{router, tenant};
use super::takeover::{take_over, SERVE_AGAIN_BOUND};

/// What a history run acknowledged and saw.
#[derive(Default)]
pub(crate) struct History {
    /// Per ledger, the (writer, seq) pairs whose write was acknowledged.
    pub(crate) acked: std::collections::HashMap<String, std::collections::BTreeSet<(String, i64)>>,
    /// Per ledger, the epochs it was opened at, in the order the opens were answered.
    pub(crate) opened: std::collections::HashMap<String, Vec<i64>>,
    pub(crate) kills: u32,
    pub(crate) pauses: u32,
    pub(crate) terminations: u32,
    pub(crate) restarts: u32,
    pub(crate) failovers: u32,
    pub(crate) refusals: u32,
    /// Writes whose future the replica dropped at a random point (their rows may be committed).
    pub(crate) cuts: u32,
    /// Pauses that caught a replica in the middle of a large result or a COPY.
    pub(crate) stalls: u32,
    /// The partitions of a run with [`Faults::partitions`].
    pub(crate) partitions: Vec<netns::Cut>,
    /// Each replica's own ledger, in the order of the names.
    pub(crate) own: Vec<String>,
    /// When the run began, when its last fault ended (the last pause resumed, the last restart
    /// or promotion done, the last cut link healed and its work in flight answered), and when
    /// it ended.
    pub(crate) started: Option<std::time::Instant>,
    pub(crate) faults_ended: Option<std::time::Instant>,
    pub(crate) ended: Option<std::time::Instant>,
    /// Every acknowledged write: when its reply came, which replica, which ledger.
    pub(crate) acks: Vec<(std::time::Instant, String, String)>,
    /// The tenant and replica states the views showed while the run went on, as
    /// `tenant-state/replica-state` pairs (`-` for a tenant without an owner), and how often
    /// the views were read.
    pub(crate) states_seen: std::collections::BTreeSet<String>,
    pub(crate) views_read: u32,
    /// Where `lease_status` and `replica_status` told different stories, read after read.
    pub(crate) disagreements: Vec<String>,
    /// With [`Faults::alarms`]: every alarm scheduling the driver asked for, in order, and how
    /// long the wait for them to drain took after the quiet phase (and whether they did).
    pub(crate) alarms: Vec<AlarmScheduling>,
    pub(crate) alarm_drain: Option<(Duration, bool)>,
    /// Alarms that no replica asked could schedule (each answered `NotHeld`: it held none of
    /// the shared ledgers, and sent nothing).
    pub(crate) alarms_not_held: usize,
    /// The alarm verdict's counts, once [`history_test`] checked them.
    pub(crate) alarm_verdict: Option<AlarmVerdict>,
}

/// Where `lease_status`, `replica_status` and the fleet's counts tell different stories
/// (issue 27): each tenant with an owner against its owner's `replica_status` row (see
/// `TenantState`'s table), `owner_alive` and `expires_in` against the state, and each
/// replica's `tenants_held` against the tenants `lease_status` gives its incarnation. One
/// statement, so one `now()`; `pg_locks` is read once per view, so a lease session that ends
/// between the two reads can differ once (callers read again).
const VIEWS_DISAGREE_SQL: &str = "
SELECT l.tenant || ': ' || l.state || ' (owner ' || coalesce(l.owner, '-') || ' incarnation '
       || coalesce(l.owner_incarnation::text, '-') || ', owner_alive '
       || coalesce(l.owner_alive::text, '-') || ', expires_in '
       || coalesce(l.expires_in::text, '-') || ') beside replica_status '
       || coalesce(r.replica_id || ' ' || r.state || ' incarnation ' || r.incarnation, 'none')
  FROM pgtenant.lease_status l
  LEFT JOIN pgtenant.replica_status r ON r.replica_id = l.owner
 WHERE NOT coalesce(CASE l.state
     WHEN 'held' THEN r.state = 'alive' AND r.incarnation = l.owner_incarnation
                      AND l.owner_alive AND l.expires_in IS NOT NULL
     WHEN 'stalled' THEN r.state IN ('stalled', 'sealed') AND r.lock_held
                         AND r.incarnation = l.owner_incarnation AND NOT l.owner_alive
                         AND l.expires_in = interval '0'
     WHEN 'owner_gone' THEN r.state IN ('gone', 'sealed', 'released') AND NOT r.lock_held
                            AND r.incarnation = l.owner_incarnation AND NOT l.owner_alive
                            AND l.expires_in IS NULL
     WHEN 'owner_reregistered' THEN r.incarnation > l.owner_incarnation AND NOT l.owner_alive
                                    AND l.expires_in IS NULL
     ELSE l.owner IS NULL OR l.state = 'quarantined'
   END, false)
UNION ALL
SELECT 'replica ' || r.replica_id || ' (' || r.state || '): tenants_held ' || r.tenants_held
       || ', lease_status gives its incarnation ' || count(l.tenant)
  FROM pgtenant.replica_status r
  LEFT JOIN pgtenant.lease_status l ON l.owner = r.replica_id AND l.owner_incarnation = r.incarnation
 GROUP BY r.replica_id, r.state, r.tenants_held
HAVING r.tenants_held <> count(l.tenant)
UNION ALL
SELECT 'fleet_status ' || f.key || ' ' || f.value || ', lease_status ' || coalesce(c.n, 0)
  FROM jsonb_each_text((SELECT s.fleet FROM pgtenant.status_report(0) s)) f
  LEFT JOIN (SELECT state, count(*) AS n FROM pgtenant.lease_status GROUP BY state) c
         ON c.state = f.key
 WHERE f.key IN ('held', 'stalled', 'owner_gone', 'owner_reregistered', 'free', 'reserved',
                 'quarantined', 'forgotten')
   AND f.value::bigint <> coalesce(c.n, 0)";

/// The states the views show now, as `tenant-state/replica-state` pairs.
const STATE_PAIRS_SQL: &str = "
SELECT DISTINCT l.state || '/' || coalesce(r.state, '-')
  FROM pgtenant.lease_status l
  LEFT JOIN pgtenant.replica_status r ON r.replica_id = l.owner";

/// Reads the views and returns where they disagree, after up to three reads in a row (a
/// disagreement that a lease session ending between the views' two reads of `pg_locks` made
/// does not survive a second read); None when the session could not read them (a restart).
pub(crate) async fn views_disagree(client: &tokio_postgres::Client) -> Option<Vec<String>> {
    let mut last = Vec::new();
    for _ in 0..3 {
        let rows = client.query(VIEWS_DISAGREE_SQL, &[]).await.ok()?;
        last = rows.iter().map(|row| row.get(0)).collect();
        if last.is_empty() {
            break;
        }
    }
    Some(last)
}

/// Asserts that `lease_status`, `replica_status` and the fleet's counts agree
/// ([`views_disagree`]).
pub(crate) async fn assert_views_agree(client: &tokio_postgres::Client) {
    let disagreements = views_disagree(client).await.expect("read the views");
    assert!(
        disagreements.is_empty(),
        "the status views disagree:\n{}",
        disagreements.join("\n")
    );
}

/// The faults a history run injects, besides kills that respawn the same replica id and pauses
/// past the ttl (always on). Each is a real fault: a signal to a real process, a backend
/// terminated by the server, a server crashed with `-m immediate`, a standby promoted.
#[derive(Default)]
pub(crate) struct Faults<'a> {
    /// `pg_terminate_backend` of a replica's lease session, or of every data connection.
    pub(crate) terminate: bool,
    /// Two crash restarts of this server (`pg_ctl stop -m immediate`, then start).
    pub(crate) restarts: Option<&'a pgtenant_testkit::LocalCluster>,
    /// One failover: the primary crashes and the standby is promoted (the run's URL names both).
    pub(crate) failover: Option<&'a pgtenant_testkit::StandbyPair>,
    /// The application's faults: half the writes have their future dropped after a random
    /// 0–3 ms (before BEGIN, mid-work, or mid-COMMIT: each COMMIT sleeps up to 3 ms in a
    /// deferred trigger, see `try_create_stamped_log`).
    pub(crate) cancel: bool,
    /// Half the pauses catch the replica streaming a large result or in the middle of a COPY
    /// (its backend blocked sending, or waiting for data, inside a fenced transaction).
    pub(crate) stalls: bool,
    /// Each replica in a network namespace of its own, its link cut silently for 0.5–3.5 s
    /// (3 %, and at least every 3 s), half the time with a transaction open across the cut,
    /// while another replica takes over a shared ledger it held ([`netns::PartitionFaults`]).
    pub(crate) partitions: Option<&'a netns::Partitions>,
    /// Placement on in every replica (stable after 300 ms): rebalancing moves tenants to their
    /// homes, takes over a killed replica's tenants at their next homes, and moves them back
    /// once it is stable again. Each replica's own ledger is named so that it is its home.
    pub(crate) placement: bool,
    /// Not a fault, a workload (`alarm_workload.rs`, G11): every replica fires alarms, and in
    /// a fifth of the fault phase's turns (besides the turn's own pick, so the mix of faults,
    /// opens and writes stays the history's) the driver schedules one to three alarms with
    /// unique names in one fenced transaction, each due −0.5–2 s from the database's clock, on
    /// a shared ledger the picked replica holds or can open (the first of them from a random
    /// one on; asked of the next replica while it can do neither; never on a replica's own
    /// ledger, which another replica would then wake and keep from its owner); half the kills
    /// land 0–12 ms after such a command was sent. After the quiet phase the driver waits for
    /// the alarms to drain, and [`history_test`] adds the alarm verdict ([`check_alarms`]).
    pub(crate) alarms: bool,
}

/// How long a history run injects faults, and how long it goes on without any: the quiet part
/// is longer than [`SERVE_AGAIN_BOUND`], so every replica must have served again in it (G9).
/// `PGTENANT_HISTORY_SECS=F` makes the fault phase F seconds for a long run (the `fault_run`
/// tests, ignored by default).
fn phases() -> (Duration, Duration) {
    let fault = std::env::var("PGTENANT_HISTORY_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs);
    (fault, Duration::from_secs(10))
}

/// Each replica's own ledger: `<name>-own`, or with placement the first `<name>-own-<k>` whose
/// home among `names` is that replica (so that every replica always has something to serve).
async fn own_ledgers(
    admin: Option<&tokio_postgres::Client>,
    names: &[&str],
    placement: bool,
) -> Vec<String> {
    let mut own = Vec::new();
    for name in names {
        if !placement {
            own.push(format!("{name}-own"));
            continue;
        }
        let admin = admin.expect("an admin session to name the ledgers");
        let weights = vec![1.0_f64; names.len()];
        let mut k = 0;
        loop {
            let ledger = format!("{name}-own-{k}");
            let home: Option<String> = admin
                .query_one(
                    "SELECT pgtenant.home_among($1, $2, $3)",
                    &[&tenant(&ledger).key(), &names, &weights],
                )
                .await
                .expect("home")
                .get(0);
            if home.as_deref() == Some(*name) {
                own.push(ledger);
                break;
            }
            k += 1;
        }
    }
    own
}

/// A superuser session for the faults' SQL, opened again after a restart or a failover.
async fn admin_session(url: &str) -> Option<tokio_postgres::Client> {
    let config: tokio_postgres::Config = url.parse().ok()?;
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(5),
        config.connect(tokio_postgres::NoTls),
    )
    .await
    .ok()?
    .ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// Replica processes `names` (each started through the test binary's `child` entry point) open
/// the shared `ledgers` and one ledger of their own each, and append (tenant, epoch, seq) rows:
/// for the fault phase ([`phases`]) while they are killed and respawned under the same id (3 %), paused for
/// 0.2–3.2 s (3 %), and hit by `faults`, then for the quiet phase without a fault (xorshift
/// from `seed`). [`History::assert_live`] checks that the fleet served again.
pub(crate) async fn run_history(
    child: &str,
    url: &str,
    names: &[&str],
    ledgers: &[&str],
    mut seed: u64,
    faults: &Faults<'_>,
) -> History {
    assert!(
        !(faults.alarms && faults.partitions.is_some()),
        "the alarm workload does not run in network namespaces"
    );
    let spawn = |c: usize| match faults.partitions {
        Some(partitions) => partitions.spawn(child, c, names[c]),
        None if faults.placement || faults.alarms => {
            let mut env = Vec::new();
            if faults.placement {
                env.push(("PGTENANT_TEST_PLACEMENT", "300"));
            }
            if faults.alarms {
                env.push((ALARMS_ENV, "1"));
            }
            ReplicaProcess::spawn_with(child, url, names[c], &env)
        }
        None => ReplicaProcess::spawn(child, url, names[c]),
    };
    let mut children: Vec<ReplicaProcess> = Vec::new();
    for c in 0..names.len() {
        let mut process = spawn(c);
        process.ready().await;
        children.push(process);
    }
    let mut partitions = faults
        .partitions
        .map(|partitions| netns::PartitionFaults::new(partitions, ledgers));
    let mut admin = admin_session(url).await;
    let own = own_ledgers(admin.as_ref(), names, faults.placement).await;
    let mut paused_until: Vec<Option<std::time::Instant>> = vec![None; names.len()];
    let mut history = History::default();
    let mut seq = 0_i64;
    let (fault_phase, quiet_phase) = phases();
    let started = std::time::Instant::now();
    let faults_until = started + fault_phase;
    let end = faults_until + quiet_phase;
    let mut faults_ended = started;
    let mut next_view_read = started;
    // Crash restarts at a third and two thirds of the fault phase; the failover at half.
    let mut restarts_at: Vec<std::time::Instant> = match faults.restarts {
        Some(_) => vec![started + fault_phase / 3, started + fault_phase * 2 / 3],
        None => Vec::new(),
    };
    let mut failover_at = faults.failover.map(|_| started + fault_phase / 2);
    while std::time::Instant::now() < end {
        let now = std::time::Instant::now();
        if restarts_at.first().is_some_and(|at| now >= *at) {
            restarts_at.remove(0);
            let cluster = faults.restarts.expect("restarts");
            cluster.stop_immediate().await.expect("crash the server");
            cluster.start_again().await.expect("start the server again");
            history.restarts += 1;
            faults_ended = std::time::Instant::now();
            admin = admin_session(url).await;
        }
        if failover_at.is_some_and(|at| now >= at) {
            failover_at = None;
            let pair = faults.failover.expect("failover");
            pair.stop_primary_immediate()
                .await
                .expect("crash the primary");
            pair.promote_standby().await.expect("promote the standby");
            history.failovers += 1;
            faults_ended = std::time::Instant::now();
            admin = admin_session(url).await;
        }
        let faulting = now < faults_until;
        // The views, read as an operator would at any moment of the run (issue 27): every
        // 100 ms, which leaves the replicas' own work the most of the database.
        let reader = admin.as_ref().filter(|client| !client.is_closed());
        if let Some(client) = reader.filter(|_| now >= next_view_read) {
            next_view_read = now + Duration::from_millis(100);
            if let Some(found) = views_disagree(client).await {
                history.views_read += 1;
                history.disagreements.extend(found);
                if let Ok(rows) = client.query(STATE_PAIRS_SQL, &[]).await {
                    history
                        .states_seen
                        .extend(rows.iter().map(|row| row.get::<_, String>(0)));
                }
            }
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let c = (seed % names.len() as u64) as usize;
        // One pick in three goes to the replica's own ledger, which no other replica contends
        // for: every live replica has something it can always serve.
        let ledger = match (seed >> 8) % (ledgers.len() as u64 + 1) {
            pick if (pick as usize) < ledgers.len() => ledgers[pick as usize],
            _ => own[c].as_str(),
        };
        if let Some(until) = paused_until[c] {
            if std::time::Instant::now() < until && faulting {
                continue;
            }
            children[c].resume();
            paused_until[c] = None;
            faults_ended = std::time::Instant::now();
        }
        if let Some(partitions) = partitions.as_mut() {
            match partitions
                .turn(c, &mut children[c], &mut history, faulting)
                .await
            {
                netns::Turn::Skip => continue,
                netns::Turn::Ended => faults_ended = std::time::Instant::now(),
                netns::Turn::Go => {}
            }
        }
        let dice = if faulting { (seed >> 16) % 100 } else { 99 };
        // The alarm workload's picks: the shared ledgers from a random one on (the child
        // schedules on the first it holds), one to three alarms, each due in -500..2000 ms.
        let first = ((seed >> 44) % ledgers.len() as u64) as usize;
        let alarm_ledgers: Vec<&str> = ledgers[first..]
            .iter()
            .chain(&ledgers[..first])
            .copied()
            .collect();
        let new_alarms = |seq: &mut i64| {
            let mut bits = seed.rotate_left(23) ^ 0x2545_f491_4f6c_dd1d;
            bits ^= bits << 13;
            bits ^= bits >> 7;
            bits ^= bits << 17;
            (0..1 + bits % 3)
                .map(|_| {
                    bits ^= bits << 13;
                    bits ^= bits >> 7;
                    bits ^= bits << 17;
                    *seq += 1;
                    (format!("alarm-{seq}"), (bits % 2500) as i64 - 500)
                })
                .collect::<Vec<(String, i64)>>()
        };
        // Alarm schedulings ride along in a fifth of the fault phase's turns, besides the
        // turn's own pick (the mix of faults, opens and writes stays the history's).
        if faults.alarms && faulting && (seed >> 59).is_multiple_of(5) {
            let asked = new_alarms(&mut seq);
            // Asked of the replicas in turn from the one picked (paused ones aside) until one
            // holds a shared ledger, as a request goes round the fleet to an owner.
            let mut scheduling = None;
            for k in 0..names.len() {
                let d = (c + k) % names.len();
                if paused_until[d].is_some() {
                    continue;
                }
                let reply = children[d]
                    .request(&alarm_command(&asked, &alarm_ledgers))
                    .await;
                scheduling = AlarmScheduling::from_reply(&asked, names[d], reply.as_deref(), false);
                if scheduling.is_some() {
                    break;
                }
            }
            match scheduling {
                Some(schedulings) => history.alarms.extend(schedulings),
                None => history.alarms_not_held += asked.len(),
            }
        }
        match dice {
            0..=2 if faults.alarms && (seed >> 58).is_multiple_of(2) => {
                // A kill 0–12 ms after an alarm scheduling was sent: before, during or after
                // its COMMIT. What the child answered before it died decides the outcome.
                let asked = new_alarms(&mut seq);
                children[c].send(&alarm_command(&asked, &alarm_ledgers));
                tokio::time::sleep(Duration::from_micros((seed >> 32) % 12_000)).await;
                let old = std::mem::replace(&mut children[c], spawn(c));
                let replies = old.kill_collecting_replies().await;
                match AlarmScheduling::from_reply(
                    &asked,
                    names[c],
                    replies.first().map(String::as_str),
                    true,
                ) {
                    Some(schedulings) => history.alarms.extend(schedulings),
                    None => history.alarms_not_held += asked.len(),
                }
                children[c].ready().await;
                history.kills += 1;
                faults_ended = std::time::Instant::now();
            }
            0..=2 => {
                let old = std::mem::replace(&mut children[c], spawn(c));
                old.kill();
                children[c].ready().await;
                history.kills += 1;
                faults_ended = std::time::Instant::now();
            }
            3..=5 => {
                if faults.stalls && (seed >> 40).is_multiple_of(2) {
                    // On a ledger it holds (its own, which it opened first thing).
                    let work = if (seed >> 41).is_multiple_of(2) {
                        "stream"
                    } else {
                        "copy"
                    };
                    let reply = children[c]
                        .request(&format!("{work} {}", own[c]))
                        .await
                        .unwrap_or_default();
                    if reply == "streaming" || reply == "copying" {
                        history.stalls += 1;
                    }
                }
                children[c].pause();
                let millis = 200 + (seed >> 24) % 3000;
                paused_until[c] = Some(std::time::Instant::now() + Duration::from_millis(millis));
                history.pauses += 1;
            }
            6..=7 if faults.terminate => {
                if admin.as_ref().is_none_or(|client| client.is_closed()) {
                    admin = admin_session(url).await;
                }
                // Half the time the replica's lease session, half every data connection of
                // the database (the lease sessions, the faults' own session and the servers'
                // own processes excepted).
                let sql = if (seed >> 24).is_multiple_of(2) {
                    format!(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                          WHERE datname = current_database() AND application_name = 'pgtenant lease {}'",
                        names[c]
                    )
                } else {
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                      WHERE datname = current_database() AND backend_type = 'client backend'
                        AND pid <> pg_backend_pid() AND application_name NOT LIKE 'pgtenant lease %'
                        AND application_name NOT LIKE 'citus%'"
                        .to_owned()
                };
                if let Some(client) = &admin {
                    if client.simple_query(&sql).await.is_ok() {
                        history.terminations += 1;
                        faults_ended = std::time::Instant::now();
                    }
                }
            }
            26..=28 if partitions.is_some() => {
                seq += 1;
                if let Some(partitions) = partitions.as_mut() {
                    let child = &mut children[c];
                    partitions
                        .cut(c, child, &own[c], seq, seed, &mut history)
                        .await;
                }
            }
            8..=25 => {
                let reply = children[c]
                    .request(&format!("open {ledger}"))
                    .await
                    .unwrap_or_default();
                if let Some(epoch) = reply.strip_prefix("opened ") {
                    history
                        .opened
                        .entry(ledger.to_owned())
                        .or_default()
                        .push(epoch.parse().expect("epoch"));
                }
            }
            _ => {
                seq += 1;
                let command = if faults.cancel && faulting && (seed >> 32).is_multiple_of(2) {
                    // 0–3 ms: a fenced write here takes 1–6 ms, so most cuts land before the
                    // reply, many of them mid-COMMIT (the trigger sleeps up to 3 ms).
                    format!("cut {ledger} {seq} {}", (seed >> 20) % 3000)
                } else {
                    format!("write {ledger} {seq}")
                };
                let mut reply = children[c].request(&command).await.unwrap_or_default();
                if reply == "cut" {
                    history.cuts += 1;
                }
                if !faulting && reply.starts_with("error") {
                    // Without faults a replica opens what it needs (a lease lost in a fault,
                    // or a ledger it never opened), as an application would.
                    let opened = children[c]
                        .request(&format!("open {ledger}"))
                        .await
                        .unwrap_or_default();
                    if !opened.starts_with("opened ")
                        && std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some()
                    {
                        eprintln!("history: {} could not open {ledger}: {opened}", names[c]);
                    }
                    if let Some(epoch) = opened.strip_prefix("opened ") {
                        history
                            .opened
                            .entry(ledger.to_owned())
                            .or_default()
                            .push(epoch.parse().expect("epoch"));
                        seq += 1;
                        reply = children[c]
                            .request(&format!("write {ledger} {seq}"))
                            .await
                            .unwrap_or_default();
                    }
                }
                if reply.starts_with("ok") {
                    history
                        .acked
                        .entry(ledger.to_owned())
                        .or_default()
                        .insert((names[c].to_owned(), seq));
                    history.acks.push((
                        std::time::Instant::now(),
                        names[c].to_owned(),
                        ledger.to_owned(),
                    ));
                } else {
                    history.refusals += 1;
                    // PGTENANT_HISTORY_DEBUG=1: what the replicas answer once the faults ended.
                    if !faulting && std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some() {
                        eprintln!("history: {} refused a write to {ledger}: {reply}", names[c]);
                    }
                }
            }
        }
    }
    for (process, paused) in children.iter().zip(&paused_until) {
        if paused.is_some() {
            process.resume();
        }
    }
    if let Some(partitions) = partitions.as_mut() {
        partitions.heal_all(&mut history);
    }
    history.own = own;
    history.started = Some(started);
    history.faults_ended = Some(faults_ended);
    history.ended = Some(std::time::Instant::now());
    if faults.alarms {
        // The replicas still run (and fire); they are stopped when `children` is dropped.
        history.alarm_drain = Some(drain_alarms(url, &history, ledgers).await);
    }
    history
}

impl History {
    /// The operator's view of the run (issue 27): `lease_status`, `replica_status` and the
    /// fleet's counts agreed at every read, whatever state the faults left.
    pub(crate) fn assert_views_agreed(&self) {
        println!(
            "views: read {} times; tenant/replica states seen: {}",
            self.views_read,
            self.states_seen
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert!(
            self.disagreements.is_empty(),
            "the status views disagreed during the run:\n{}",
            self.disagreements.join("\n")
        );
    }

    /// The liveness half of the verdict (DESIGN G9): every replica id acknowledged writes in the
    /// last third of the run; each served again within [`SERVE_AGAIN_BOUND`] of the last fault's
    /// end; every shared ledger was written after it; and no stretch of the run went without an
    /// acknowledged write for over 10 s. Returns the longest such stretch.
    pub(crate) fn assert_live(&self, names: &[&str], ledgers: &[&str]) -> Duration {
        let (started, faults_ended, ended) = (
            self.started.expect("run"),
            self.faults_ended.expect("run"),
            self.ended.expect("run"),
        );
        let last_third = ended - (ended - started) / 3;
        let mut stretch = Duration::ZERO;
        let mut previous = started;
        for (at, _, _) in &self.acks {
            stretch = stretch.max(at.saturating_duration_since(previous));
            previous = previous.max(*at);
        }
        stretch = stretch.max(ended.saturating_duration_since(previous));
        let mut back = Vec::new();
        for name in names {
            let first_after = self
                .acks
                .iter()
                .find(|(at, replica, _)| replica == name && *at >= faults_ended)
                .map(|(at, _, _)| at.duration_since(faults_ended));
            let in_last_third = self
                .acks
                .iter()
                .any(|(at, replica, _)| replica == name && *at >= last_third);
            assert!(
                in_last_third,
                "replica {name} acknowledged no write in the last third of the run (G9)"
            );
            let first_after = first_after.expect("an ack after the faults");
            assert!(
                first_after <= SERVE_AGAIN_BOUND,
                "replica {name} served again {first_after:?} after the last fault, over {SERVE_AGAIN_BOUND:?} (G9)"
            );
            back.push(first_after);
        }
        for ledger in ledgers {
            assert!(
                self.acks
                    .iter()
                    .any(|(at, _, acked)| acked == ledger && *at >= faults_ended),
                "ledger {ledger} was not written after the last fault (G9)"
            );
        }
        println!(
            "liveness: {} acknowledged writes; last fault ended {:?} into the run; every replica \
             back within {:?}; longest stretch without an acknowledged write {stretch:?}",
            self.acks.len(),
            faults_ended - started,
            back.iter().max().copied().unwrap_or_default()
        );
        assert!(
            stretch <= Duration::from_secs(10),
            "{stretch:?} without an acknowledged write (G9)"
        );
        stretch
    }
}

/// The safety half of the verdict on every ledger of a run (shared and own), through a checker
/// replica that takes each over: see [`check_history`]. Returns how many writes were
/// acknowledged.
pub(crate) async fn check_all(
    history: &History,
    url: &str,
    checker: &str,
    names: &[&str],
    ledgers: &[&str],
) -> usize {
    let checker = router(url, checker).await;
    let own: Vec<String> = if history.own.is_empty() {
        names.iter().map(|name| format!("{name}-own")).collect()
    } else {
        history.own.clone()
    };
    let mut total = 0;
    for ledger in ledgers
        .iter()
        .copied()
        .chain(own.iter().map(String::as_str))
    {
        let handle = take_over(&checker, &tenant(ledger), Duration::from_secs(30)).await;
        total += check_history(&handle, ledger, history).await;
        let epochs = history.opened.get(ledger).cloned().unwrap_or_default();
        assert!(
            epochs.windows(2).all(|w| w[0] <= w[1]),
            "{ledger}: epochs went backwards: {epochs:?}"
        );
    }
    println!(
        "history: {} kills, {} pauses ({} mid-stream or mid-COPY), {} terminations, {} crash \
         restarts, {} failovers, {} writes cut, {} refused writes, {total} acknowledged",
        history.kills,
        history.pauses,
        history.stalls,
        history.terminations,
        history.restarts,
        history.failovers,
        history.cuts,
        history.refusals
    );
    checker.close().await;
    total
}

/// A whole history test: [`run_history`] with `faults`, then both halves of the verdict,
/// liveness ([`History::assert_live`]) and safety ([`check_all`], through a checker replica
/// named `checker`), and with [`Faults::alarms`] the alarm verdict ([`check_alarms`]). Returns
/// the history and how many writes were acknowledged.
pub(crate) async fn history_test(
    child: &str,
    url: &str,
    names: &[&str],
    ledgers: &[&str],
    seed: u64,
    faults: &Faults<'_>,
    checker: &str,
) -> (History, usize) {
    let mut history = run_history(child, url, names, ledgers, seed, faults).await;
    history.assert_views_agreed();
    history.assert_live(names, ledgers);
    let total = check_all(&history, url, checker, names, ledgers).await;
    if faults.alarms {
        history.alarm_verdict = Some(check_alarms(&history, url, ledgers).await);
    }
    (history, total)
}

/// The history's verdict on one ledger, read through `handle` (the checker's, which took it
/// over): no row committed under an epoch lower than one already committed for the tenant
/// (G1, G3) and every acknowledged row present (G4). Returns how many rows were acknowledged.
pub(crate) async fn check_history(handle: &TenantHandle, ledger: &str, history: &History) -> usize {
    let rows = log_rows(handle).await;
    let stale: Vec<_> = rows
        .iter()
        .filter(|(epoch, _, _, seen)| seen > epoch)
        .collect();
    assert!(
        stale.is_empty(),
        "{ledger}: committed under an epoch lower than one already committed: {stale:?}"
    );
    let stamped_stale: Vec<(String, i64, i64, i64)> = handle
        .read(|tx| {
            Box::pin(async move {
                if tx
                    .query_one("SELECT to_regclass('stamps') IS NOT NULL", &[])
                    .await?
                    .get::<_, bool>(0)
                {
                    Ok::<_, pgtenant::Error>(
                        tx.query(
                            "SELECT writer, seq, row_epoch, epoch_at_commit FROM stamps
                              WHERE epoch_at_commit > row_epoch",
                            &[],
                        )
                        .await?
                        .iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                        .collect(),
                    )
                } else {
                    Ok(Vec::new())
                }
            })
        })
        .await
        .expect("read the commit stamps");
    assert!(
        stamped_stale.is_empty(),
        "{ledger}: committed after a later epoch had been granted: {stamped_stale:?}"
    );
    let present: std::collections::BTreeSet<(String, i64)> = rows
        .iter()
        .map(|(_, seq, writer, _)| (writer.clone(), *seq))
        .collect();
    let want = history.acked.get(ledger).cloned().unwrap_or_default();
    let missing: Vec<_> = want.difference(&present).collect();
    assert!(
        missing.is_empty(),
        "{ledger}: acknowledged but missing: {missing:?}"
    );
    let distinct: std::collections::BTreeSet<i64> = rows.iter().map(|r| r.0).collect();
    println!(
        "{ledger}: {} rows ({} acknowledged) over {} epochs",
        rows.len(),
        want.len(),
        distinct.len()
    );
    want.len()
}
