//! Placement benchmark (#30): a fleet of replicas with `RouterOptions::placement` on, serving a
//! steady write load across every tenant, while replicas join, restart one after another, and
//! crash.
//!
//! Run with `cargo run --release --example bench_placement` (PostgreSQL on 127.0.0.1:5432, or
//! whatever `pgtenant_testkit::TestDatabase::create` finds; only 127.0.0.1 is accepted);
//! `-- --tenants N` for a smaller fleet, `-- --rounds R` for the join's rounds, `-- --rate Q`
//! for the load, `-- --moves-per-second M` for the rebalancing rate, `-- --retry-pause-max-ms
//! P` for the load's longest pause between two tries of a request. In one run:
//!
//! 1. **Join.** 4 replicas (routers in this process) hold `N` open tenants (10 000), each at its
//!    home; a 5th joins. Measured: the time from its start until every replica holds exactly
//!    the tenants whose home it is (`converge_s`, which includes the stability window), the
//!    tenants moved (`moved`, against the joiner's `share`, and any moved between the old
//!    replicas), the spread of the replicas' counts around the mean, failed requests, and the
//!    load's p99 latency during the move against the same load just before it. The joiner then
//!    closes (its tenants go to their next homes) and joins again: `--rounds` times, medians.
//! 2. **Rolling restart.** Each of the 5 replicas in turn closes (handing each tenant to its
//!    next home) and starts again under the same id, under the load; the next one goes once the
//!    fleet is back at home. Measured: the longest any request waited to be served (retries
//!    included, from its first attempt), the longest a tenant was without an owner by the
//!    control plane's history (handed off → acquired), lost acknowledged writes (every
//!    acknowledged row is looked for at the end), and the spread at the end.
//! 3. **Crash.** A 6th replica, a child process, receives its share and is SIGKILLed. Measured:
//!    the time until every one of its tenants is held again (by its next home, unasked), and the
//!    largest number any survivor took over against an even split.
//!
//! The load: `--rate` requests a second (300), each due at a fixed time and timed from then
//! (an open loop), each a fenced `INSERT … ON CONFLICT DO NOTHING` of a unique sequence number
//! into a random tenant, entering at a random replica and sent on
//! at most once (`Router::route`, then `Router::route_forwarded` at the owner), retried while
//! the tenant is between owners or its owner unreachable, after 5 ms doubled each time up to
//! 200 ms (up to 10 s: then it counts as failed).
//!
//! It ends with one machine-readable line per part (`placement-bench:`, `placement-rolling:`,
//! `placement-kill:`) and writes a Markdown report to `/tmp/bench_placement.md`.

#[path = "common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{arg, cpu_model, fresh_database, median, ms, server_info, xorshift};
use pgtenant::{Event, Route, Router, RouterOptions, TenantHandle, TenantId};

const COMMAND: &str = "cargo run --release --example bench_placement";
const REPORT_PATH: &str = "/tmp/bench_placement.md";
const CHILD_ENV: &str = "PGTENANT_BENCH_PLACEMENT_CHILD";
const URL_ENV: &str = "PGTENANT_BENCH_PLACEMENT_URL";

const REPLICAS: usize = 4;
const POOL_SIZE: usize = 16;
const TTL: Duration = Duration::from_secs(2);
const STABLE_FOR: Duration = Duration::from_secs(1);
/// `RouterOptions::placement_moves_per_second`'s default.
const MOVES_PER_SECOND: usize = 2_000;
/// The load's requests a second (`--rate`): well below what this machine serves (~700/s).
const LOAD_RATE: usize = 300;
const CREATE_CONCURRENCY: usize = 32;
/// The load's steady window before a join, to compare its p99 with.
const BASELINE: Duration = Duration::from_secs(4);
/// A request not served within this counts as failed.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// A request that was not served (its owner unreachable, the tenant between owners) is tried
/// again after this, doubled each time up to [`RETRY_PAUSE_MAX_MS`], as an HTTP client backs
/// off. Every try is a `route`, most of them a `locate` (one read): retried every 5 ms, or up
/// to every 40 ms, the requests for a crashed replica's tenants (sent to it until its heartbeat
/// expires) made the 300 requests a second 855–999 tries a second (580–690 with 200 ms), which
/// took the two cores from the takeovers and the load alike.
const RETRY_PAUSE: Duration = Duration::from_millis(5);
/// The longest pause between two tries of a request (`--retry-pause-max-ms`).
const RETRY_PAUSE_MAX_MS: usize = 200;
/// Tries of the load's requests so far (each a `route`, most of them a `locate`).
static TRIES: AtomicU64 = AtomicU64::new(0);
/// Any convergence longer than this is a failure of the run.
const CONVERGE_LIMIT: Duration = Duration::from_secs(120);
/// A convergence this slow prints what is away from home (once), to say why.
const SLOW_CONVERGENCE: Duration = Duration::from_secs(30);

const MIGRATIONS: [(&str, &str); 1] = [(
    "V1__entries",
    "CREATE TABLE entries (seq bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())",
)];

fn options(url: &str, name: &str) -> RouterOptions {
    RouterOptions::from_url(name, url)
        .expect("database url")
        .tenant_migrations(MIGRATIONS)
        .expect("migrations")
        .ttl(TTL)
        .pool_size(POOL_SIZE)
        .max_open_tenants(100_000)
        .address(format!("bench://{name}"))
        .placement(true)
        .placement_stable_for(STABLE_FOR)
        // `--moves-per-second`: the rebalancing rate, to weigh convergence against the load's
        // p99 (the library's default unless given).
        .placement_moves_per_second(arg("--moves-per-second", MOVES_PER_SECOND))
}

fn tenant(i: usize) -> TenantId {
    TenantId::new("bench", &format!("t{i}")).expect("tenant id")
}

/// The routers of this process by replica id; `entries` are those a request may enter at (a
/// closing replica still answers forwarded requests, as a real one does until it exits).
#[derive(Default)]
struct Fleet {
    routers: Mutex<BTreeMap<String, Router>>,
    entries: Mutex<Vec<String>>,
}

impl Fleet {
    fn get(&self, name: &str) -> Option<Router> {
        self.routers.lock().expect("fleet").get(name).cloned()
    }

    fn add(&self, name: &str, router: Router) {
        self.routers
            .lock()
            .expect("fleet")
            .insert(name.to_owned(), router);
        self.entries.lock().expect("fleet").push(name.to_owned());
    }

    /// Stops sending new requests to `name`; forwarded ones still reach it until `remove`.
    fn retire(&self, name: &str) {
        self.entries.lock().expect("fleet").retain(|n| n != name);
    }

    fn remove(&self, name: &str) -> Option<Router> {
        self.retire(name);
        self.routers.lock().expect("fleet").remove(name)
    }

    fn entry(&self, pick: u64) -> Option<Router> {
        let entries = self.entries.lock().expect("fleet");
        if entries.is_empty() {
            return None;
        }
        let name = &entries[(pick % entries.len() as u64) as usize];
        self.get(name)
    }

    fn names(&self) -> Vec<String> {
        self.routers
            .lock()
            .expect("fleet")
            .keys()
            .cloned()
            .collect()
    }
}

/// What the load saw.
#[derive(Default)]
struct LoadLog {
    /// (when it ended, how long it took from its first attempt, its tenant) of each served
    /// request.
    served: Mutex<Vec<(Instant, Duration, usize)>>,
    /// When each failed request gave up.
    failed: Mutex<Vec<Instant>>,
    /// Acknowledged (tenant, seq).
    acked: Mutex<Vec<(usize, i64)>>,
}

impl LoadLog {
    fn latencies_between(&self, from: Instant, to: Instant) -> Vec<Duration> {
        self.latencies_of(from, to, |_| true)
    }

    /// Those of the requests to the tenants `which` accepts.
    fn latencies_of(
        &self,
        from: Instant,
        to: Instant,
        which: impl Fn(usize) -> bool,
    ) -> Vec<Duration> {
        self.served
            .lock()
            .expect("log")
            .iter()
            .filter(|(at, _, i)| *at >= from && *at <= to && which(*i))
            .map(|(_, took, _)| *took)
            .collect()
    }

    fn failed_between(&self, from: Instant, to: Instant) -> usize {
        self.failed
            .lock()
            .expect("log")
            .iter()
            .filter(|at| **at >= from && **at <= to)
            .count()
    }
}

/// The `p`th percentile, zero for no values.
fn percentile_d(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    common::percentile_d(values, p)
}

async fn insert(handle: &TenantHandle, seq: i64) -> pgtenant::Result<()> {
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO entries (seq) VALUES ($1) ON CONFLICT (seq) DO NOTHING",
                    &[&seq],
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
}

/// One request: enter at a random replica, go where `route` says (one hop at most), retry
/// while the tenant is between owners. True when acknowledged.
async fn request(
    fleet: &Fleet,
    id: &TenantId,
    seq: i64,
    seed: &mut u64,
    pause_max: Duration,
) -> bool {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut pause = RETRY_PAUSE;
    while Instant::now() < deadline {
        TRIES.fetch_add(1, Ordering::Relaxed);
        let Some(entry) = fleet.entry(xorshift(seed)) else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let served = match entry.route(id, false).await {
            Ok(Route::Here(handle)) => insert(&handle, seq).await.is_ok(),
            Ok(Route::There { owner, .. }) => match fleet.get(owner.as_str()) {
                Some(owner) => match owner.route_forwarded(id, false).await {
                    Ok(Route::Here(handle)) => insert(&handle, seq).await.is_ok(),
                    _ => false,
                },
                // Not reachable (crashed, or between a restart's close and start).
                None => false,
            },
            Err(_) => false,
        };
        if served {
            return true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(pause_max);
    }
    false
}

/// Runs the load until `stop`: `rate` requests a second, each due at a fixed time (an open
/// loop). A slow request does not hold back the next, and each is timed from when it was due,
/// so a stall shows in the latencies instead of thinning the load, and the load stays below
/// what the machine can serve: a closed loop of 16 tasks ran these 2 cores flat out, and its
/// p99 (40-60 ms for one INSERT) measured its own queue, which any extra work lengthens.
fn start_load(
    fleet: Arc<Fleet>,
    tenants: usize,
    log: Arc<LoadLog>,
    stop: Arc<AtomicBool>,
    rate: usize,
) -> tokio::task::JoinHandle<()> {
    let pause_max = Duration::from_millis(arg("--retry-pause-max-ms", RETRY_PAUSE_MAX_MS) as u64);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut running = tokio::task::JoinSet::new();
        let mut n: i64 = 0;
        while !stop.load(Ordering::Relaxed) {
            let due = ticks.tick().await.into_std();
            let i = (xorshift(&mut seed) % tenants as u64) as usize;
            n += 1;
            let (fleet, log) = (fleet.clone(), log.clone());
            let mut request_seed = seed ^ n as u64;
            running.spawn(async move {
                if request(&fleet, &tenant(i), n, &mut request_seed, pause_max).await {
                    log.served
                        .lock()
                        .expect("log")
                        .push((Instant::now(), due.elapsed(), i));
                    log.acked.lock().expect("log").push((i, n));
                } else {
                    log.failed.lock().expect("log").push(Instant::now());
                }
            });
            while running.try_join_next().is_some() {}
        }
        while running.join_next().await.is_some() {}
    })
}

/// How many tenants each live replica is the home of, by the database.
async fn home_counts(admin: &tokio_postgres::Client) -> BTreeMap<String, usize> {
    admin
        .query(
            "SELECT home, count(*) FROM pgtenant.placement WHERE home IS NOT NULL GROUP BY home",
            &[],
        )
        .await
        .expect("home counts")
        .iter()
        .map(|row| (row.get(0), row.get::<_, i64>(1) as usize))
        .collect()
}

/// How many tenants each replica holds, by the database.
async fn held_counts(admin: &tokio_postgres::Client) -> BTreeMap<String, usize> {
    admin
        .query(
            "SELECT owner, count(*) FROM pgtenant.tenants WHERE owner IS NOT NULL GROUP BY owner",
            &[],
        )
        .await
        .expect("held counts")
        .iter()
        .map(|row| (row.get(0), row.get::<_, i64>(1) as usize))
        .collect()
}

/// Waits until every in-process router holds exactly the tenants whose home it is (and, when
/// `expected` names replicas of other processes, the database says so for them). Returns when,
/// or, after [`CONVERGE_LIMIT`], what was still away from home (printed with each tenant's row
/// and its last events, so a run that does not converge reports instead of stopping).
async fn converged(
    fleet: &Fleet,
    admin: &tokio_postgres::Client,
    expected: &BTreeMap<String, usize>,
) -> Result<Instant, usize> {
    let limit = Instant::now() + CONVERGE_LIMIT;
    let mut slow_at = Some(Instant::now() + SLOW_CONVERGENCE);
    loop {
        if slow_at.is_some_and(|at| Instant::now() >= at) {
            slow_at = None;
            eprintln!("slow to converge ({SLOW_CONVERGENCE:?} so far):");
            not_converged(fleet, admin, expected).await;
        }
        let here = fleet.names();
        let local_done = here.iter().all(|name| {
            fleet
                .get(name)
                .is_some_and(|r| r.open_count() == expected.get(name).copied().unwrap_or(0))
        });
        let remote: Vec<&String> = expected.keys().filter(|n| !here.contains(n)).collect();
        let remote_done = remote.is_empty() || {
            let held = held_counts(admin).await;
            remote
                .iter()
                .all(|name| held.get(*name).copied().unwrap_or(0) == expected[*name])
        };
        if local_done && remote_done {
            return Ok(Instant::now());
        }
        if Instant::now() >= limit {
            eprintln!("gave up after {CONVERGE_LIMIT:?}:");
            return Err(not_converged(fleet, admin, expected).await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints what is away from home after a convergence timeout; how many tenants.
async fn not_converged(
    fleet: &Fleet,
    admin: &tokio_postgres::Client,
    expected: &BTreeMap<String, usize>,
) -> usize {
    eprintln!(
        "not converged: expected {expected:?}, held (database) {:?}, open (routers) {:?}",
        held_counts(admin).await,
        local_counts(fleet)
    );
    let away = admin
        .query(
            "SELECT p.tenant, coalesce(p.owner, '-'), coalesce(p.home, '-'),
                    coalesce(t.reserved_for, '-'), coalesce(t.reserved_until::text, '-'), t.epoch,
                    coalesce((SELECT string_agg(format('%s %s e%s %s %s', h.at::time, h.event,
                                     h.epoch, coalesce(h.replica_id, ''), coalesce(h.detail, '')), ' | '
                                     ORDER BY h.at)
                                FROM (SELECT * FROM pgtenant.history h WHERE h.tenant_key = p.tenant
                                       ORDER BY h.at DESC LIMIT 8) h), '')
               FROM pgtenant.placement p JOIN pgtenant.tenants t ON t.key = p.tenant
              WHERE NOT p.at_home",
            &[],
        )
        .await
        .unwrap_or_default();
    for row in &away {
        eprintln!(
            "  away: {} owner={} home={} reserved_for={} until={} epoch={} history: {}",
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, String>(2),
            row.get::<_, String>(3),
            row.get::<_, String>(4),
            row.get::<_, i64>(5),
            row.get::<_, String>(6)
        );
    }
    away.len().max(1)
}

fn spread_pct(counts: &BTreeMap<String, usize>) -> f64 {
    if counts.is_empty() {
        return 0.0;
    }
    let mean = counts.values().sum::<usize>() as f64 / counts.len() as f64;
    counts
        .values()
        .map(|&n| (n as f64 - mean).abs() / mean * 100.0)
        .fold(0.0, f64::max)
}

fn local_counts(fleet: &Fleet) -> BTreeMap<String, usize> {
    fleet
        .names()
        .into_iter()
        .filter_map(|name| fleet.get(&name).map(|r| (name, r.open_count())))
        .collect()
}

/// The `HandedOff` targets received so far, counted.
fn drain_moves(
    events: &mut [tokio::sync::broadcast::Receiver<Event>],
    moved: &mut std::collections::HashSet<String>,
) -> BTreeMap<String, usize> {
    let mut moves = BTreeMap::new();
    for events in events {
        while let Ok(event) = events.try_recv() {
            match event {
                Event::HandedOff { to, tenant, .. } => {
                    moved.insert(tenant.key().to_owned());
                    let to = to.map_or_else(|| "(anyone)".to_owned(), |to| to.as_str().to_owned());
                    *moves.entry(to).or_default() += 1;
                }
                Event::Lost { tenant, reason, .. } => {
                    eprintln!("lost {tenant} during a move: {reason}");
                }
                _ => {}
            }
        }
    }
    moves
}

struct JoinRound {
    converge: Duration,
    /// From the joiner's registration, by the database clock (s): the first move to it, the
    /// last move to it, its last acquisition.
    timeline: (f64, f64, f64),
    moved: usize,
    moved_elsewhere: usize,
    share: usize,
    spread_pct: f64,
    failed: usize,
    p99_base: Duration,
    p99_move: Duration,
    /// The p99 during the move of the requests to tenants that did not move: what the move
    /// costs the others (CPU, connections), apart from the moved tenants' own wait.
    p99_unmoved: Duration,
    /// Requests served a second: before the join, from its start to a second after it
    /// converged.
    throughput: (f64, f64),
    /// Tenants away from home when convergence timed out (0: converged).
    unconverged: usize,
}

async fn join_round(
    url: &str,
    fleet: &Fleet,
    admin: &tokio_postgres::Client,
    log: &LoadLog,
    joiner: &str,
) -> JoinRound {
    let base_from = Instant::now();
    tokio::time::sleep(BASELINE).await;
    let base_to = Instant::now();
    let mut events: Vec<_> = fleet
        .names()
        .iter()
        .filter_map(|n| fleet.get(n))
        .map(|r| r.subscribe())
        .collect();
    let started = Instant::now();
    let router = Router::start(options(url, joiner))
        .await
        .expect("the joiner starts");
    fleet.add(joiner, router);
    let expected = home_counts(admin).await;
    let (done, unconverged) = match converged(fleet, admin, &expected).await {
        Ok(at) => (at, 0),
        Err(away) => (Instant::now(), away),
    };
    // The load's latency through the move and a second after it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let move_to = Instant::now();
    let mut moved_keys = std::collections::HashSet::new();
    let moves = drain_moves(&mut events, &mut moved_keys);
    let moved = moves.get(joiner).copied().unwrap_or(0);
    let p99 = |values: &[Duration]| percentile_d(values, 99.0);
    let timeline = admin
        .query_one(
            "WITH reg AS (SELECT max(at) AS at FROM pgtenant.history
                           WHERE event = 'registered' AND replica_id = $1)
             SELECT extract(epoch FROM min(h.at) - reg.at)::float8,
                    extract(epoch FROM max(h.at) - reg.at)::float8,
                    (SELECT extract(epoch FROM max(a.at) - reg.at)::float8 FROM pgtenant.history a
                      WHERE a.event = 'acquired' AND a.replica_id = $1 AND a.at >= reg.at)
               FROM pgtenant.history h, reg
              WHERE h.event = 'handed_off' AND h.detail = 'reserved for ' || $1 AND h.at >= reg.at
              GROUP BY reg.at",
            &[&joiner],
        )
        .await
        .map(|row| {
            (
                row.get::<_, Option<f64>>(0).unwrap_or(0.0),
                row.get::<_, Option<f64>>(1).unwrap_or(0.0),
                row.get::<_, Option<f64>>(2).unwrap_or(0.0),
            )
        })
        .unwrap_or_default();
    let (base, during) = (
        log.latencies_between(base_from, base_to),
        log.latencies_between(started, move_to),
    );
    JoinRound {
        timeline,
        converge: done - started,
        moved,
        moved_elsewhere: moves.values().sum::<usize>() - moved,
        share: expected.get(joiner).copied().unwrap_or(0),
        spread_pct: spread_pct(&local_counts(fleet)),
        failed: log.failed_between(started, move_to),
        throughput: (
            base.len() as f64 / (base_to - base_from).as_secs_f64(),
            during.len() as f64 / (move_to - started).as_secs_f64(),
        ),
        p99_base: p99(&base),
        p99_move: p99(&during),
        p99_unmoved: p99(
            &log.latencies_of(started, move_to, |i| !moved_keys.contains(tenant(i).key()))
        ),
        unconverged,
    }
}

/// The longest a tenant was without an owner during `[from, to]` by the control plane's
/// history: each handoff or release to the tenant's next acquisition, in ms.
async fn longest_gap_ms(admin: &tokio_postgres::Client, from_epoch_s: f64) -> f64 {
    admin
        .query_one(
            "WITH ends AS (
                 SELECT h.tenant_key, h.at,
                        (SELECT min(n.at) FROM pgtenant.history n
                          WHERE n.tenant_key = h.tenant_key AND n.at >= h.at
                            AND n.event IN ('acquired', 'created')) AS next_at
                   FROM pgtenant.history h
                  WHERE h.event IN ('handed_off', 'released') AND h.tenant_key IS NOT NULL
                    AND h.at >= to_timestamp($1))
             SELECT coalesce(max(extract(epoch FROM next_at - at) * 1000), 0)::float8 FROM ends",
            &[&from_epoch_s],
        )
        .await
        .expect("history gaps")
        .get(0)
}

async fn db_now(admin: &tokio_postgres::Client) -> f64 {
    admin
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .expect("now")
        .get(0)
}

/// The child process of part 3: a replica with the fleet's options that holds what it is given.
fn child_main(name: &str) {
    let url = std::env::var(URL_ENV).expect("url");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let _router = Router::start(options(&url, name))
            .await
            .expect("child router");
        println!("ready");
        std::future::pending::<()>().await;
    });
}

fn main() {
    if let Ok(name) = std::env::var(CHILD_ENV) {
        child_main(&name);
        return;
    }
    let tenants = arg("--tenants", 10_000);
    let rounds = arg("--rounds", 3).max(1);
    let rate = arg("--rate", LOAD_RATE);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(tenants, rounds, rate));
}

async fn run(tenants: usize, rounds: usize, rate: usize) {
    let (db, admin) = fresh_database().await;
    let url = db.url().to_owned();
    let server = server_info(&admin).await;
    let fleet = Arc::new(Fleet::default());
    let names: Vec<String> = (1..=REPLICAS).map(|i| format!("r{i}")).collect();
    for name in &names {
        let router = Router::start(options(&url, name))
            .await
            .expect("router starts");
        fleet.add(name, router);
    }
    // Every tenant created at its home (route, then route_forwarded at the home).
    let created = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut creators = Vec::new();
    for _ in 0..CREATE_CONCURRENCY {
        let (fleet, next) = (fleet.clone(), next.clone());
        creators.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= tenants {
                    return;
                }
                let id = tenant(i);
                let entry = fleet.entry(i as u64).expect("a replica");
                let route = entry.route(&id, true).await.expect("route");
                if let Route::There { owner, .. } = route {
                    let home = fleet.get(owner.as_str()).expect("home in the fleet");
                    home.route_forwarded(&id, true)
                        .await
                        .expect("create at home");
                }
            }
        }));
    }
    for creator in creators {
        creator.await.expect("creator");
    }
    let expected = home_counts(&admin).await;
    let mut unconverged = converged(&fleet, &admin, &expected)
        .await
        .err()
        .unwrap_or(0);
    eprintln!(
        "{tenants} tenants created and at home in {:.1} s",
        created.elapsed().as_secs_f64()
    );

    let log = Arc::new(LoadLog::default());
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(fleet.clone(), tenants, log.clone(), stop.clone(), rate);

    // Part 1: a 5th replica joins, `rounds` times (closing in between).
    let mut joins = Vec::new();
    for round in 0..rounds {
        let joined = join_round(&url, &fleet, &admin, &log, "r5").await;
        eprintln!(
            "join {}: converged in {:.2} s (moves from {:.2} to {:.2} s after it registered, last pickup {:.2} s), moved {} (share {}, {} elsewhere), spread {:.1} %, failed {}, p99 {:.1} → {:.1} ms ({:.1} ms for the tenants that did not move), {:.0} → {:.0} requests/s",
            round + 1,
            joined.converge.as_secs_f64(),
            joined.timeline.0,
            joined.timeline.1,
            joined.timeline.2,
            joined.moved,
            joined.share,
            joined.moved_elsewhere,
            joined.spread_pct,
            joined.failed,
            ms(joined.p99_base),
            ms(joined.p99_move),
            ms(joined.p99_unmoved),
            joined.throughput.0,
            joined.throughput.1
        );
        joins.push(joined);
        if round + 1 < rounds {
            let leaving = fleet.remove("r5").expect("r5");
            leaving.close().await;
            let expected = home_counts(&admin).await;
            unconverged += converged(&fleet, &admin, &expected)
                .await
                .err()
                .unwrap_or(0);
        }
    }

    // Part 2: a rolling restart of every replica.
    let rolling_from = Instant::now();
    let rolling_db_from = db_now(&admin).await;
    let mut steps = Vec::new();
    for name in fleet.names() {
        let step = Instant::now();
        fleet.retire(&name);
        let router = fleet.get(&name).expect("in the fleet");
        let report = router.close().await;
        fleet.remove(&name);
        drop(router);
        let again = Router::start(options(&url, &name)).await.expect("restarts");
        fleet.add(&name, again);
        let expected = home_counts(&admin).await;
        unconverged += converged(&fleet, &admin, &expected)
            .await
            .err()
            .unwrap_or(0);
        eprintln!(
            "restarted {name}: handed off {} (failed {}), back at home after {:.2} s",
            report.handed_off.len(),
            report.failed.len(),
            step.elapsed().as_secs_f64()
        );
        steps.push(step.elapsed());
    }
    let rolling_to = Instant::now();
    let rolling_waits = log.latencies_between(rolling_from, rolling_to);
    let max_wait = rolling_waits.iter().max().copied().unwrap_or_default();
    let rolling_failed = log.failed_between(rolling_from, rolling_to);
    let max_gap_ms = longest_gap_ms(&admin, rolling_db_from).await;
    let rolling_spread = spread_pct(&local_counts(&fleet));

    // Part 3: a 6th replica in a child process receives its share and is SIGKILLed.
    let exe = std::env::current_exe().expect("this example");
    let mut child = std::process::Command::new(exe)
        .env(CHILD_ENV, "r6")
        .env(URL_ENV, &url)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("child replica");
    let stdout = child.stdout.take().expect("stdout");
    let ready = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .expect("child output");
    assert_eq!(ready.expect("child ready").trim(), "ready");
    let with_child = home_counts(&admin).await;
    unconverged += converged(&fleet, &admin, &with_child)
        .await
        .err()
        .unwrap_or(0);
    let victims = held_counts(&admin).await.get("r6").copied().unwrap_or(0);
    let mut events: Vec<_> = fleet
        .names()
        .iter()
        .filter_map(|n| fleet.get(n))
        .map(|r| r.subscribe())
        .collect();
    // When r6's heartbeat row expires (the survivors cannot tell a kill sooner), and the kill,
    // by the database clock.
    let expires_at: f64 = admin
        .query_one(
            "SELECT extract(epoch FROM expires_at)::float8 FROM pgtenant.replicas WHERE replica_id = 'r6'",
            &[],
        )
        .await
        .expect("r6's expiry")
        .get(0);
    let killed_db = db_now(&admin).await;
    let killed = Instant::now();
    let tries_before = TRIES.load(Ordering::Relaxed);
    let _ = child.kill();
    let _ = child.wait();
    // Served again: nothing held by r6 or free (one indexed count; at home is checked after).
    let limit = Instant::now() + CONVERGE_LIMIT;
    loop {
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pgtenant.tenants
                  WHERE schema_name IS NOT NULL AND (owner IS NULL OR owner = 'r6')",
                &[],
            )
            .await
            .expect("tenants")
            .get(0);
        if left == 0 {
            break;
        }
        if Instant::now() >= limit {
            eprintln!("{left} of r6's tenants not served again within {CONVERGE_LIMIT:?}");
            unconverged += left as usize;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served_again = killed.elapsed();
    let tries_per_s =
        (TRIES.load(Ordering::Relaxed) - tries_before) as f64 / served_again.as_secs_f64();
    eprintln!(
        "the load tried {tries_per_s:.0} requests a second until r6's tenants were served again"
    );
    // After the wait: the placement view computes the home of every tenant (a few hundred ms
    // of both cores at 10 000), which ran beside the takeovers when read at the kill.
    let survivors = home_counts(&admin).await;
    // The first and the last takeover of r6's tenants, after the kill (s).
    let takeovers = admin
        .query_one(
            "SELECT extract(epoch FROM min(at))::float8 - $1, extract(epoch FROM max(at))::float8 - $1
               FROM pgtenant.history
              WHERE event = 'broken' AND replica_id = 'r6' AND at >= to_timestamp($1)",
            &[&killed_db],
        )
        .await
        .map(|row| {
            (
                row.get::<_, Option<f64>>(0).unwrap_or(0.0),
                row.get::<_, Option<f64>>(1).unwrap_or(0.0),
            )
        })
        .unwrap_or_default();
    let expired_after = (expires_at - killed_db).max(0.0);
    // Per survivor: takeovers, in how many transactions (a batch shares one now(), which
    // `acquired_at` records), from when to when (the transactions' starts).
    for row in admin
        .query(
            "SELECT t.owner, count(*), count(DISTINCT t.acquired_at),
                    extract(epoch FROM min(t.acquired_at))::float8 - $1,
                    extract(epoch FROM max(t.acquired_at))::float8 - $1
               FROM pgtenant.tenants t
              WHERE t.key IN (SELECT h.tenant_key FROM pgtenant.history h
                               WHERE h.event = 'broken' AND h.replica_id = 'r6'
                                 AND h.at >= to_timestamp($1))
              GROUP BY t.owner ORDER BY t.owner",
            &[&killed_db],
        )
        .await
        .expect("takeovers")
    {
        eprintln!(
            "{} took over {} of r6's tenants in {} transactions, {:.2} to {:.2} s after the kill",
            row.get::<_, String>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2),
            row.get::<_, f64>(3),
            row.get::<_, f64>(4)
        );
    }
    let away: i64 = admin
        .query_one(
            "SELECT count(*) FROM pgtenant.placement WHERE NOT at_home",
            &[],
        )
        .await
        .expect("placement")
        .get(0);
    let mut took: HashMap<String, usize> = HashMap::new();
    for (events, name) in events.iter_mut().zip(fleet.names()) {
        while let Ok(event) = events.try_recv() {
            if let Event::Acquired {
                took_over_from: Some(from),
                ..
            } = event
            {
                if from.as_str() == "r6" {
                    *took.entry(name.clone()).or_default() += 1;
                }
            }
        }
    }
    let even = victims as f64 / fleet.names().len() as f64;
    let max_share_ratio = took.values().copied().max().unwrap_or(0) as f64 / even.max(1.0);

    stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    // Every acknowledged row, looked for.
    let acked = std::mem::take(&mut *log.acked.lock().expect("log"));
    let mut by_tenant: HashMap<usize, Vec<i64>> = HashMap::new();
    for (i, seq) in &acked {
        by_tenant.entry(*i).or_default().push(*seq);
    }
    let schemas: HashMap<String, String> = admin
        .query(
            "SELECT key, schema_name FROM pgtenant.tenants WHERE schema_name IS NOT NULL",
            &[],
        )
        .await
        .expect("schemas")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let mut lost = 0;
    for (i, seqs) in &by_tenant {
        let schema = &schemas[tenant(*i).key()];
        let found: i64 = admin
            .query_one(
                &format!("SELECT count(*) FROM \"{schema}\".entries WHERE seq = ANY($1)"),
                &[seqs],
            )
            .await
            .expect("acked rows")
            .get(0);
        lost += seqs.len() - found as usize;
    }

    for name in fleet.names() {
        if let Some(router) = fleet.remove(&name) {
            router.close().await;
        }
    }

    let converge = median(
        &joins
            .iter()
            .map(|j| j.converge.as_secs_f64())
            .collect::<Vec<_>>(),
    );
    let moved = median(&joins.iter().map(|j| j.moved as f64).collect::<Vec<_>>());
    let share = median(&joins.iter().map(|j| j.share as f64).collect::<Vec<_>>());
    let elsewhere: usize = joins.iter().map(|j| j.moved_elsewhere).sum();
    let spread = median(&joins.iter().map(|j| j.spread_pct).collect::<Vec<_>>());
    let failed: usize = joins.iter().map(|j| j.failed).sum();
    let join_unconverged: usize = joins.iter().map(|j| j.unconverged).sum();
    unconverged += join_unconverged;
    let p99_delta = median(
        &joins
            .iter()
            .map(|j| ms(j.p99_move) - ms(j.p99_base))
            .collect::<Vec<_>>(),
    );
    let p99_delta_unmoved = median(
        &joins
            .iter()
            .map(|j| ms(j.p99_unmoved) - ms(j.p99_base))
            .collect::<Vec<_>>(),
    );
    let mut report = String::new();
    let _ = writeln!(report, "# Placement benchmark\n");
    let _ = writeln!(
        report,
        "`{COMMAND}`, {} (PostgreSQL {}), CPU {}, {} tenants, {} replicas in this process + 1 \
         child, ttl {:?}, stability window {:?}, {} moves/s, a load of {rate} requests/s \
         (retried after 5 ms doubling to {} ms), pool \
         {POOL_SIZE} per replica.\n",
        server.date,
        server.pg_version,
        cpu_model().unwrap_or_default(),
        tenants,
        REPLICAS + 1,
        TTL,
        STABLE_FOR,
        arg("--moves-per-second", MOVES_PER_SECOND),
        arg("--retry-pause-max-ms", RETRY_PAUSE_MAX_MS)
    );
    let _ = writeln!(report, "## Join ({rounds} rounds)\n");
    let _ = writeln!(
        report,
        "converge: from the joiner's start until every replica holds exactly its homes; first \
         move, last move, last pickup: after the joiner registered, by the database clock (the \
         first move waits for the {STABLE_FOR:?} stability window).\n"
    );
    let _ = writeln!(
        report,
        "| round | converge s | first move s | last move s | last pickup s | moved | share | moved between others | spread % | failed | p99 before ms | p99 during ms | p99 during, unmoved tenants ms |"
    );
    let _ = writeln!(
        report,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (i, j) in joins.iter().enumerate() {
        let _ = writeln!(
            report,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {:.1} | {} | {:.1} | {:.1} | {:.1} |",
            i + 1,
            j.converge.as_secs_f64(),
            j.timeline.0,
            j.timeline.1,
            j.timeline.2,
            j.moved,
            j.share,
            j.moved_elsewhere,
            j.spread_pct,
            j.failed,
            ms(j.p99_base),
            ms(j.p99_move),
            ms(j.p99_unmoved)
        );
    }
    let _ = writeln!(report, "\n## Rolling restart\n");
    let _ = writeln!(
        report,
        "Steps (close, start again, back at home): {}. Longest wait of a request: {:.0} ms; \
         longest a tenant had no owner (history): {max_gap_ms:.0} ms; failed requests: \
         {rolling_failed}; spread at the end {rolling_spread:.1} %. Requests served during the \
         restart: {}, p99 {:.1} ms.",
        steps
            .iter()
            .map(|s| format!("{:.2} s", s.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        ms(max_wait),
        rolling_waits.len(),
        ms(percentile_d(&rolling_waits, 99.0))
    );
    let _ = writeln!(report, "\n## Crash\n");
    let _ = writeln!(
        report,
        "r6 held {victims} tenants when SIGKILLed; all held again by their next homes after \
         {:.2} s (ttl {:?}; its heartbeat row expired {expired_after:.2} s after the kill; \
         takeovers from {:.2} to {:.2} s), {away} away from home then; taken over per survivor: \
         {took:?} (homes among survivors: {survivors:?}).",
        served_again.as_secs_f64(),
        TTL,
        takeovers.0,
        takeovers.1
    );
    let _ = writeln!(
        report,
        "\nAcknowledged writes: {}; lost: {lost}. Tenants still away from home when a wait for \
         convergence gave up ({CONVERGE_LIMIT:?}; 0 when every wait converged): {unconverged}.",
        acked.len()
    );
    let lines = [
        format!(
            "placement-bench: tenants={tenants} replicas={REPLICAS}+1 converge_s={converge:.2} moved={moved:.0} share={share:.0} moved_between_others={elsewhere} spread_pct={spread:.1} failed={failed} p99_delta_ms={p99_delta:.1} p99_delta_unmoved_ms={p99_delta_unmoved:.1} unconverged={join_unconverged}"
        ),
        format!(
            "placement-rolling: tenants={tenants} replicas={} max_unserved_ms={:.0} max_gap_ms={max_gap_ms:.0} failed={rolling_failed} lost={lost} spread_pct={rolling_spread:.1} unconverged_total={unconverged}",
            REPLICAS + 1,
            ms(max_wait)
        ),
        format!(
            "placement-kill: tenants={victims} served_again_s={:.2} ttl_s={:.1} expired_after_s={expired_after:.2} takeovers_s={:.2}..{:.2} max_share_ratio={max_share_ratio:.2} away_from_home={away}",
            served_again.as_secs_f64(),
            TTL.as_secs_f64(),
            takeovers.0,
            takeovers.1
        ),
    ];
    let _ = writeln!(report, "\n```\n{}\n```", lines.join("\n"));
    std::fs::write(REPORT_PATH, &report).expect("report");
    println!("{report}");
    for line in lines {
        println!("{line}");
    }
}
