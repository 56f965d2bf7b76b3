//! Alarm benchmark (#31): how late tenant alarms fire, how fast one replica fires them, and
//! that each fired exactly once.
//!
//! Run with `cargo run --release --example bench_alarms` (PostgreSQL on 127.0.0.1:5432, or
//! whatever `pgtenant_testkit::TestDatabase::create` finds); `-- --tenants N --alarms A
//! --window-s W --burst B` to change the sizes. One replica (a router in this process) with an
//! alarm handler that inserts one row per firing into the tenant's `effects` table, in the
//! firing's fenced transaction (`fired_at` is the database's clock at that insert):
//!
//! 1. **Spread.** `N` tenants (10 000) are created; each schedules `A / N` alarms (100 000 in
//!    all) in one transaction, due at random instants over a `W`-second window (60 s) that
//!    starts 30 s after scheduling began. Measured: lateness (`fired_at - due`) p50 / p99 / max,
//!    and the cost of the due-tenant read (`pgtenant.due_alarms`) with every tenant hinted.
//! 2. **Burst.** `B` alarms (20 000) spread over the tenants, all due at one instant. Measured:
//!    the sustained firing rate (`B` over the time from that instant to the last firing).
//!
//!    Beside it, the **unfenced baseline**: the same number of alarms inserted straight into
//!    the tenants' tables and fired by 16 plain connections without pgtenant, one transaction
//!    per firing (the due row `FOR UPDATE SKIP LOCKED`, the effect, the delete, the commit; no
//!    fence, no alarm lock, no hint): what this machine allows, and the ratio.
//! 3. **Kill.** A second replica, a child process with a `--kill-ttl-ms` ttl (2 000), creates
//!    `K` tenants (`--kill-tenants`, 1 000) and schedules `--kill-alarms` (5 000) on them, due
//!    at random instants over `--kill-window-s` (4 s) from the moment it is SIGKILLed. This
//!    replica, which holds none of them, wakes each tenant when its first alarm is due (once
//!    the dead incarnation's lease lapsed) and fires. Measured: lateness p50 / p99 of those
//!    alarms, and each tenant's takeover (acquired by this replica minus the later of the kill
//!    and the tenant's first due time) p50 / p99: the target is lateness p99 ≤ takeover p99 +
//!    50 ms.
//!
//! 4. **Scale** (before the kill, on this replica's tenants): `--million` alarms (1 000 000)
//!    due in an hour, inserted in bulk by each tenant's work (one `schedule_alarm` each would
//!    take minutes; what is measured is what their presence costs), then one alarm per tenant
//!    due at once among them. Measured: resident memory, the due-tenant read, the burst's rate.
//!
//! Then every tenant's `effects` are read back: `lost` (scheduled, never committed), `duplicated`
//! (committed more than once) and `early` (committed before due) must be 0. The replica's
//! resident memory is read before and after scheduling.
//!
//! It ends with machine-readable lines, `alarm-bench:`, `alarm-bench-scale:` and
//! `alarm-bench-kill:`, and writes a Markdown report to
//! `/tmp/bench_alarms.md`.

#[path = "common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{arg, cpu_model, fresh_database, median, server_info, xorshift};
use pgtenant::{Alarm, Router, RouterOptions, TenantHandle, TenantId};

const COMMAND: &str = "cargo run --release --example bench_alarms";
const REPORT_PATH: &str = "/tmp/bench_alarms.md";
const CREATE_CONCURRENCY: usize = 32;
/// Below the pool's 16 connections: the firing task shares the pool (at 32, schedules waited
/// past the pool's wait timeout at 10 000 tenants).
const SCHEDULE_CONCURRENCY: usize = 8;
/// The spread's window starts this long after scheduling began (scheduling must end first).
const LEAD: Duration = Duration::from_secs(30);
/// The burst is due this long after it is scheduled.
const BURST_LEAD: Duration = Duration::from_secs(10);
/// How long to wait for every alarm of a phase after its last due time.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// Connections of the unfenced baseline: as many as the firing task's lanes.
const BASELINE_LANES: usize = 16;
/// Set in the child process of the kill phase: its replica id.
const CHILD_ENV: &str = "PGTENANT_BENCH_ALARMS_CHILD";
/// The child's database URL.
const URL_ENV: &str = "PGTENANT_BENCH_ALARMS_URL";
/// The child's sizes: tenants, alarms, window in ms, ttl in ms.
const KILL_ENV: &str = "PGTENANT_BENCH_ALARMS_KILL";
/// How long after the child's scheduling ends it is killed (and its alarms' window starts).
const KILL_LEAD: Duration = Duration::from_secs(1);

const MIGRATIONS: [(&str, &str); 1] = [(
    "V1__effects",
    "CREATE TABLE effects (name text NOT NULL, alarm_id bigint NOT NULL,
                           due timestamptz NOT NULL,
                           fired_at timestamptz NOT NULL DEFAULT clock_timestamp())",
)];

fn tenant(i: usize) -> TenantId {
    TenantId::new("alarms", &format!("t{i}")).expect("tenant id")
}

fn options(url: &str, fired: Arc<AtomicUsize>) -> RouterOptions {
    options_as("alarms-bench", url, fired)
}

fn options_as(replica: &str, url: &str, fired: Arc<AtomicUsize>) -> RouterOptions {
    RouterOptions::from_url(replica, url)
        .expect("database url")
        .tenant_migrations(MIGRATIONS)
        .expect("migrations")
        .max_open_tenants(1_000_000)
        .alarm_handler(move |tx, alarm: Alarm| {
            let fired = fired.clone();
            Box::pin(async move {
                let due = alarm.due.duration_since(UNIX_EPOCH)?.as_secs_f64();
                tx.execute(
                    "INSERT INTO effects (name, alarm_id, due) VALUES ($1, $2, to_timestamp($3))",
                    &[&alarm.name, &alarm.id, &due],
                )
                .await?;
                fired.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
        })
}

/// The process's resident memory, in MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Runs `work(i)` for `0..n`, `lanes` at a time.
async fn for_each<F, Fut>(n: usize, lanes: usize, work: F)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let work = Arc::new(work);
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..lanes)
        .map(|_| {
            let (work, next) = (work.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= n {
                        return;
                    }
                    work(i).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("lane");
    }
}

/// Schedules `alarms[i]` (name, due) for tenant `i`, one transaction per tenant.
async fn schedule_all(
    handles: &Arc<Vec<TenantHandle>>,
    alarms: Arc<Vec<Vec<(String, SystemTime)>>>,
) {
    let handles = handles.clone();
    for_each(handles.len(), SCHEDULE_CONCURRENCY, move |i| {
        let (handles, alarms) = (handles.clone(), alarms.clone());
        async move {
            let mine = alarms[i].clone();
            if mine.is_empty() {
                return;
            }
            retrying("schedule", || {
                let mine = mine.clone();
                handles[i].run(move |tx| {
                    Box::pin(async move {
                        for (name, due) in &mine {
                            tx.schedule_alarm(name, *due, &()).await?;
                        }
                        Ok::<_, pgtenant::Error>(())
                    })
                })
            })
            .await;
        }
    })
    .await;
}

/// Runs `attempt` until it succeeds, again after 20 ms while its error is retryable (the pool
/// busy, a lease being renewed); any other error ends the benchmark, saying `what` failed.
async fn retrying<F, Fut>(what: &str, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = pgtenant::Result<()>>,
{
    loop {
        match attempt().await {
            Ok(()) => return,
            Err(error) if error.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{what}: {error}"),
        }
    }
}

/// The due-tenant read every replica makes each second, median of 20, in ms.
async fn due_read_ms(admin: &tokio_postgres::Client) -> f64 {
    let mut took = Vec::new();
    for _ in 0..20 {
        let at = Instant::now();
        admin
            .query(
                "SELECT * FROM pgtenant.due_alarms('alarms-bench', 2000, 1000, false)",
                &[],
            )
            .await
            .expect("due_alarms");
        took.push(at.elapsed().as_secs_f64() * 1000.0);
    }
    median(&took)
}

/// Waits until `fired` reaches `target`, up to `limit`; whether it did.
async fn wait_fired(fired: &AtomicUsize, target: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while fired.load(Ordering::Relaxed) < target {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// What the tenants' `effects` say of the alarms named `prefix…`: (lateness in ms of each
/// committed firing, duplicated, early).
async fn effects(
    admin: &tokio_postgres::Client,
    schemas: &[String],
    prefix: &str,
) -> (Vec<f64>, usize, usize) {
    let (lateness, duplicated, early, _) = effects_since(admin, schemas, prefix, f64::MIN).await;
    (lateness, duplicated, early)
}

/// As [`effects`], with the lateness only of alarms due at or after `since_ms` (Unix ms, the
/// database's clock); the fourth value counts those left out (committed, due before).
async fn effects_since(
    admin: &tokio_postgres::Client,
    schemas: &[String],
    prefix: &str,
    since_ms: f64,
) -> (Vec<f64>, usize, usize, usize) {
    let mut left_out = 0;
    let mut lateness = Vec::new();
    let (mut duplicated, mut early) = (0, 0);
    let pattern = format!("{prefix}%");
    for schema in schemas {
        let rows = admin
            .query(
                &format!(
                    "SELECT extract(epoch FROM min(fired_at) - due)::float8 * 1000, count(*),
                            extract(epoch FROM due)::float8 * 1000
                       FROM \"{schema}\".effects WHERE name LIKE $1 GROUP BY alarm_id, due"
                ),
                &[&pattern],
            )
            .await
            .expect("effects");
        for row in rows {
            let late: f64 = row.get(0);
            let count: i64 = row.get(1);
            duplicated += (count - 1) as usize;
            if late < 0.0 {
                early += 1;
            }
            let due_ms: f64 = row.get(2);
            if due_ms >= since_ms {
                lateness.push(late);
            } else {
                left_out += 1;
            }
        }
    }
    lateness.sort_by(f64::total_cmp);
    (lateness, duplicated, early, left_out)
}

async fn run(
    tenants: usize,
    alarms: usize,
    window: Duration,
    burst: usize,
    million: usize,
    kill: (usize, usize, Duration, u64),
) {
    let (db, admin) = fresh_database().await;
    let server = server_info(&admin).await;
    let fired = Arc::new(AtomicUsize::new(0));
    let router = Router::start(options(db.url(), fired.clone()))
        .await
        .expect("router starts");

    let created = Instant::now();
    let slots: Arc<Vec<std::sync::Mutex<Option<TenantHandle>>>> =
        Arc::new((0..tenants).map(|_| std::sync::Mutex::new(None)).collect());
    {
        let (router, slots) = (router.clone(), slots.clone());
        for_each(tenants, CREATE_CONCURRENCY, move |i| {
            let (router, slots) = (router.clone(), slots.clone());
            async move {
                let handle = router.open_or_create(&tenant(i)).await.expect("create");
                // The alarm table is made on a tenant's first alarm call (DDL: about 20 ms
                // here); made now, so the spread's schedules measure scheduling alone (at
                // 10 000 tenants they took 196 s with it, past the window's start).
                handle
                    .run(|tx| {
                        Box::pin(async move {
                            tx.cancel_alarm("warm-up").await?;
                            Ok::<_, pgtenant::Error>(())
                        })
                    })
                    .await
                    .expect("alarm table");
                *slots[i].lock().expect("slot") = Some(handle);
            }
        })
        .await;
    }
    let handles: Arc<Vec<TenantHandle>> = Arc::new(
        slots
            .iter()
            .map(|slot| slot.lock().expect("slot").take().expect("created"))
            .collect(),
    );
    let schemas: Vec<String> = handles.iter().map(|h| h.schema().to_owned()).collect();
    eprintln!(
        "{tenants} tenants created in {:.1} s",
        created.elapsed().as_secs_f64()
    );

    // Phase 1: spread over the window.
    let rss_before = rss_mib();
    let scheduling = Instant::now();
    let start = SystemTime::now() + LEAD;
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let window_us = window.as_micros().max(1) as u64;
    let per_tenant: Vec<Vec<(String, SystemTime)>> = (0..tenants)
        .map(|i| {
            let n = alarms / tenants + usize::from(i < alarms % tenants);
            (0..n)
                .map(|k| {
                    let offset = Duration::from_micros(xorshift(&mut seed) % window_us);
                    (format!("spread-{k}"), start + offset)
                })
                .collect()
        })
        .collect();
    schedule_all(&handles, Arc::new(per_tenant)).await;
    let scheduled_in = scheduling.elapsed();
    let scheduled_at_ms: f64 = admin
        .query_one(
            "SELECT extract(epoch FROM clock_timestamp())::float8 * 1000",
            &[],
        )
        .await
        .expect("now")
        .get(0);
    let rss_scheduled = rss_mib();
    eprintln!(
        "{alarms} alarms scheduled in {:.1} s (the window starts {:.1} s after scheduling began)",
        scheduled_in.as_secs_f64(),
        LEAD.as_secs_f64()
    );
    // The due-tenant read with every tenant hinted, each replica's poll.
    let due_read_ms = due_read_ms(&admin).await;
    let window_end =
        Instant::now() + start.duration_since(SystemTime::now()).unwrap_or_default() + window;
    let spread_done = wait_fired(
        &fired,
        alarms,
        window_end.saturating_duration_since(Instant::now()) + DRAIN_LIMIT,
    )
    .await;
    // Lateness only of alarms due after scheduling ended: one due while this replica was still
    // scheduling measures the scheduling too (at 10 000 tenants it can outlast the lead).
    let (lateness, duplicated, early, left_out) =
        effects_since(&admin, &schemas, "spread-", scheduled_at_ms).await;
    let lost = alarms.saturating_sub(lateness.len() + left_out);
    if left_out > 0 {
        eprintln!(
            "spread: {left_out} alarms were due before scheduling ended: left out of the lateness"
        );
    }
    eprintln!(
        "spread: {} fired (all: {spread_done}), lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        lateness.len(),
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness.last().copied().unwrap_or(0.0)
    );

    // Phase 2: a burst due at one instant.
    let before_burst = fired.load(Ordering::Relaxed);
    let burst_due = SystemTime::now() + BURST_LEAD;
    let per_tenant: Vec<Vec<(String, SystemTime)>> = (0..tenants)
        .map(|i| {
            let n = burst / tenants + usize::from(i < burst % tenants);
            (0..n).map(|k| (format!("burst-{k}"), burst_due)).collect()
        })
        .collect();
    schedule_all(&handles, Arc::new(per_tenant)).await;
    let burst_done = wait_fired(&fired, before_burst + burst, BURST_LEAD + DRAIN_LIMIT).await;
    let (burst_lateness, burst_duplicated, burst_early) = effects(&admin, &schemas, "burst-").await;
    let drained_ms = burst_lateness.last().copied().unwrap_or(0.0);
    let rate = if drained_ms > 0.0 {
        burst_lateness.len() as f64 / (drained_ms / 1000.0)
    } else {
        0.0
    };
    let burst_lost = burst.saturating_sub(burst_lateness.len());
    eprintln!(
        "burst: {} of {burst} fired (all: {burst_done}) in {:.2} s after due: {rate:.0}/s",
        burst_lateness.len(),
        drained_ms / 1000.0
    );

    // Phase 2b: the same burst, unfenced: the baseline.
    let baseline = baseline_burst(&db, &admin, &schemas, burst).await;
    eprintln!("baseline: {burst} unfenced firings at {baseline:.0}/s");

    // Phase 4 (before the kill, on this replica's tenants): `--million` alarms scheduled far
    // ahead, then a burst among them.
    let scale = scale_phase(&admin, &handles, &schemas, &fired, million).await;

    // Phase 3: the owner of other tenants SIGKILLed as their alarms come due.
    let killed = kill_phase(db.url(), &admin, &fired, kill.0, kill.1, kill.2, kill.3).await;
    eprintln!(
        "kill: {} fired, lateness p50 {:.1} ms, p99 {:.1} ms; takeover p50 {:.1} ms, p99 {:.1} ms",
        killed.lateness.len(),
        percentile(&killed.lateness, 50.0),
        percentile(&killed.lateness, 99.0),
        percentile(&killed.takeover, 50.0),
        percentile(&killed.takeover, 99.0),
    );
    router.close().await;

    let lost = lost + burst_lost;
    let duplicated = duplicated + burst_duplicated;
    let early = early + burst_early;
    let line = format!(
        "alarm-bench: tenants={tenants} alarms={alarms} window_s={} lateness_p50_ms={:.1} lateness_p99_ms={:.1} lateness_max_ms={:.1} due_while_scheduling={left_out} burst={burst} rate_per_s={rate:.0} baseline_rate_per_s={baseline:.0} rate_ratio={:.2} lost={lost} duplicated={duplicated} early={early} due_read_ms={due_read_ms:.2} rss_mib={rss_scheduled:.0}",
        window.as_secs(),
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness.last().copied().unwrap_or(0.0),
        if baseline > 0.0 { rate / baseline } else { 0.0 },
    );
    let mut report = String::new();
    let _ = writeln!(report, "# Alarm benchmark\n");
    let _ = writeln!(
        report,
        "`{COMMAND}`, {} (PostgreSQL {}), CPU {}, one replica, {tenants} tenants.\n",
        server.date,
        server.pg_version,
        cpu_model().unwrap_or_default()
    );
    let _ = writeln!(
        report,
        "Spread: {alarms} alarms due over {} s, scheduled in {:.1} s; lateness p50 {:.1} ms, p99 \
         {:.1} ms, max {:.1} ms. Due-tenant read with {tenants} tenants hinted: {due_read_ms:.2} ms \
         (median of 20). Burst: {burst} alarms due at one instant, all fired {:.2} s later \
         ({rate:.0}/s; the same burst fired without pgtenant by {BASELINE_LANES} plain \
         connections, one transaction per firing, no fence: {baseline:.0}/s). Lost {lost}, duplicated {duplicated}, early {early}. Resident memory \
         {rss_before:.0} MiB before scheduling, {rss_scheduled:.0} MiB after.\n",
        window.as_secs(),
        scheduled_in.as_secs_f64(),
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness.last().copied().unwrap_or(0.0),
        drained_ms / 1000.0
    );
    let kill_line = format!(
        "alarm-bench-kill: tenants={} alarms={} ttl_ms={} lateness_p50_ms={:.1} lateness_p99_ms={:.1} takeover_p50_ms={:.1} takeover_p99_ms={:.1} lost={} duplicated={} early={}",
        killed.tenants,
        killed.alarms,
        killed.ttl_ms,
        percentile(&killed.lateness, 50.0),
        percentile(&killed.lateness, 99.0),
        percentile(&killed.takeover, 50.0),
        percentile(&killed.takeover, 99.0),
        killed.lost,
        killed.duplicated,
        killed.early,
    );
    let _ = writeln!(
        report,
        "Kill: a second replica (ttl {} ms) held {} tenants with {} alarms due over {} s from \
         the moment it was SIGKILLed; this replica fired them with lateness p50 {:.1} ms, p99 \
         {:.1} ms, against each tenant's takeover (acquired here minus the later of the kill and \
         its first due time) p50 {:.1} ms, p99 {:.1} ms. Lost {}, duplicated {}, early {}.\n",
        killed.ttl_ms,
        killed.tenants,
        killed.alarms,
        kill.2.as_secs(),
        percentile(&killed.lateness, 50.0),
        percentile(&killed.lateness, 99.0),
        percentile(&killed.takeover, 50.0),
        percentile(&killed.takeover, 99.0),
        killed.lost,
        killed.duplicated,
        killed.early,
    );
    let scale_line = format!(
        "alarm-bench-scale: tenants={tenants} alarms={} rss_mib={:.0} due_read_ms={:.2} burst={} rate_per_s={:.0} lost={} duplicated={}",
        scale.alarms, scale.rss_mib, scale.due_read_ms, scale.burst, scale.rate, scale.lost, scale.duplicated
    );
    let _ = writeln!(
        report,
        "Scale: {} alarms due in an hour inserted over the tenants in {:.1} s (in bulk, by each \
         tenant's work); resident memory {:.0} MiB; due-tenant read {:.2} ms (median of 20); a \
         burst of one alarm per tenant among them fired at {:.0}/s; lost {}, duplicated {}.\n",
        scale.alarms,
        scale.inserted_s,
        scale.rss_mib,
        scale.due_read_ms,
        scale.rate,
        scale.lost,
        scale.duplicated,
    );
    let _ = writeln!(report, "```\n{line}\n{scale_line}\n{kill_line}\n```");
    std::fs::write(REPORT_PATH, &report).expect("report");
    println!("{report}");
    println!("{line}");
    println!("{scale_line}");
    println!("{kill_line}");
    drop(db);
}

fn kill_tenant(i: usize) -> TenantId {
    TenantId::new("alarms", &format!("kill-{i}")).expect("tenant id")
}

/// The child of the kill phase: a replica that creates its tenants, schedules their alarms due
/// over the window from `KILL_LEAD` after scheduling ends, prints `ready <window start, unix
/// ms>`, and waits to be killed.
fn child_main(name: &str) {
    let url = std::env::var(URL_ENV).expect("url");
    let sizes: Vec<u64> = std::env::var(KILL_ENV)
        .expect("sizes")
        .split(',')
        .map(|n| n.parse().expect("a size"))
        .collect();
    let (tenants, alarms, window_ms, ttl_ms) =
        (sizes[0] as usize, sizes[1] as usize, sizes[2], sizes[3]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let fired = Arc::new(AtomicUsize::new(0));
        let router =
            Router::start(options_as(name, &url, fired).ttl(Duration::from_millis(ttl_ms)))
                .await
                .expect("child router");
        let slots: Arc<Vec<std::sync::Mutex<Option<TenantHandle>>>> =
            Arc::new((0..tenants).map(|_| std::sync::Mutex::new(None)).collect());
        {
            let (router, slots) = (router.clone(), slots.clone());
            for_each(tenants, CREATE_CONCURRENCY, move |i| {
                let (router, slots) = (router.clone(), slots.clone());
                async move {
                    let handle = router
                        .open_or_create(&kill_tenant(i))
                        .await
                        .expect("create");
                    *slots[i].lock().expect("slot") = Some(handle);
                }
            })
            .await;
        }
        let handles: Arc<Vec<TenantHandle>> = Arc::new(
            slots
                .iter()
                .map(|slot| slot.lock().expect("slot").take().expect("created"))
                .collect(),
        );
        // Scheduled in two steps: first far ahead (the tables, the hints), then moved into the
        // window once its start is known, so that none is due before the kill.
        let far = SystemTime::now() + Duration::from_secs(3600);
        let placeholders: Vec<Vec<(String, SystemTime)>> = (0..tenants)
            .map(|i| {
                let n = alarms / tenants + usize::from(i < alarms % tenants);
                (0..n).map(|k| (format!("kill-{k}"), far)).collect()
            })
            .collect();
        schedule_all(&handles, Arc::new(placeholders.clone())).await;
        let estimate = Instant::now();
        schedule_all(&handles, Arc::new(placeholders)).await;
        let start = SystemTime::now() + estimate.elapsed() + KILL_LEAD;
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        let per_tenant: Vec<Vec<(String, SystemTime)>> = (0..tenants)
            .map(|i| {
                let n = alarms / tenants + usize::from(i < alarms % tenants);
                (0..n)
                    .map(|k| {
                        let offset = Duration::from_millis(xorshift(&mut seed) % window_ms.max(1));
                        (format!("kill-{k}"), start + offset)
                    })
                    .collect()
            })
            .collect();
        schedule_all(&handles, Arc::new(per_tenant)).await;
        let start_ms = start
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis();
        println!("ready {start_ms}");
        std::future::pending::<()>().await;
    });
}

/// Phase 2b: `burst` alarms inserted straight into the tenants' tables, due now (the router
/// never hears of them: no hint), then fired by `LANES` plain connections without pgtenant,
/// one transaction per firing as pgtenant's: the oldest due row `FOR UPDATE SKIP LOCKED`, the
/// handler's insert, the delete, the commit; no fence, no alarm lock, no hint. The firings per
/// second, the unfenced baseline of the burst's rate.
async fn baseline_burst(
    db: &pgtenant_testkit::TestDatabase,
    admin: &tokio_postgres::Client,
    schemas: &[String],
    burst: usize,
) -> f64 {
    let tenants = schemas.len();
    for (i, schema) in schemas.iter().enumerate() {
        let n = i64::try_from(burst / tenants + usize::from(i < burst % tenants)).unwrap_or(0);
        if n == 0 {
            continue;
        }
        admin
            .execute(
                &format!(
                    "INSERT INTO \"{schema}\".pgtenant_alarms (name, due_at, payload)
                     SELECT 'base-' || g, now(), 'null' FROM generate_series(1, $1::int8) g"
                ),
                &[&n],
            )
            .await
            .expect("baseline alarms");
    }
    let schemas = Arc::new(schemas.to_vec());
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut lanes = Vec::new();
    for _ in 0..BASELINE_LANES {
        let mut client = db.connect().await.expect("connect");
        let (schemas, next) = (schemas.clone(), next.clone());
        lanes.push(tokio::spawn(async move {
            let mut fired = 0_usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(schema) = schemas.get(i) else {
                    return fired;
                };
                let due_sql = format!(
                    "SELECT name, seq, due_at FROM \"{schema}\".pgtenant_alarms
                      WHERE due_at <= now() AND failed_at IS NULL AND name LIKE 'base-%'
                      ORDER BY due_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED"
                );
                let effect_sql = format!(
                    "INSERT INTO \"{schema}\".effects (name, alarm_id, due) VALUES ($1, $2, $3)"
                );
                let fired_sql = format!(
                    "DELETE FROM \"{schema}\".pgtenant_alarms WHERE name = $1 AND seq = $2"
                );
                loop {
                    let tx = client.transaction().await.expect("begin");
                    let Some(row) = tx.query_typed_opt(&due_sql, &[]).await.expect("due") else {
                        tx.commit().await.expect("commit");
                        break;
                    };
                    let (name, seq, due): (String, i64, SystemTime) =
                        (row.get(0), row.get(1), row.get(2));
                    use tokio_postgres::types::Type;
                    tx.query_typed(
                        &effect_sql,
                        &[
                            (&name, Type::TEXT),
                            (&seq, Type::INT8),
                            (&due, Type::TIMESTAMPTZ),
                        ],
                    )
                    .await
                    .expect("effect");
                    tx.query_typed(&fired_sql, &[(&name, Type::TEXT), (&seq, Type::INT8)])
                        .await
                        .expect("delete");
                    tx.commit().await.expect("commit");
                    fired += 1;
                }
            }
        }));
    }
    let mut fired = 0;
    for lane in lanes {
        fired += lane.await.expect("lane");
    }
    fired as f64 / started.elapsed().as_secs_f64()
}

/// What the scale phase measured.
struct ScalePhase {
    alarms: usize,
    inserted_s: f64,
    rss_mib: f64,
    due_read_ms: f64,
    rate: f64,
    burst: usize,
    lost: usize,
    duplicated: usize,
}

/// Phase 4: `total` alarms due in an hour spread over the tenants (inserted in bulk by each
/// tenant's work: `schedule_alarm` one by one would take minutes, and what is measured is what
/// their presence costs), then a burst of one alarm per tenant due at once among them.
async fn scale_phase(
    admin: &tokio_postgres::Client,
    handles: &Arc<Vec<TenantHandle>>,
    schemas: &[String],
    fired: &AtomicUsize,
    total: usize,
) -> ScalePhase {
    let tenants = handles.len();
    let inserting = Instant::now();
    {
        let handles = handles.clone();
        for_each(tenants, SCHEDULE_CONCURRENCY, move |i| {
            let handles = handles.clone();
            let n = i64::try_from(total / tenants + usize::from(i < total % tenants)).unwrap_or(0);
            async move {
                retrying("insert", || {
                    handles[i].run(move |tx| {
                        Box::pin(async move {
                            tx.execute(
                                "INSERT INTO pgtenant_alarms (name, due_at, payload)
                                     SELECT 'far-' || g, now() + interval '1 hour'
                                                         + g * interval '1 millisecond', 'null'
                                       FROM generate_series(1, $1::int8) g",
                                &[&n],
                            )
                            .await?;
                            // Through the API once, so the hint counts them.
                            tx.schedule_alarm(
                                "far-0",
                                SystemTime::now() + Duration::from_secs(3600),
                                &(),
                            )
                            .await?;
                            Ok::<_, pgtenant::Error>(())
                        })
                    })
                })
                .await;
            }
        })
        .await;
    }
    let inserted_s = inserting.elapsed().as_secs_f64();
    let rss = rss_mib();
    let due_read_ms = due_read_ms(admin).await;
    eprintln!(
        "scale: {total} alarms inserted in {inserted_s:.1} s; rss {rss:.0} MiB; due read {:.2} ms",
        due_read_ms
    );
    let before = fired.load(Ordering::Relaxed);
    let due = SystemTime::now() + BURST_LEAD;
    let per_tenant: Vec<Vec<(String, SystemTime)>> = (0..tenants)
        .map(|_| vec![("scale-0".to_owned(), due)])
        .collect();
    schedule_all(handles, Arc::new(per_tenant)).await;
    wait_fired(fired, before + tenants, BURST_LEAD + DRAIN_LIMIT).await;
    let (lateness, duplicated, _) = effects(admin, schemas, "scale-").await;
    let drained_ms = lateness.last().copied().unwrap_or(0.0);
    let rate = if drained_ms > 0.0 {
        lateness.len() as f64 / (drained_ms / 1000.0)
    } else {
        0.0
    };
    ScalePhase {
        alarms: total,
        inserted_s,
        rss_mib: rss,
        due_read_ms,
        rate,
        burst: tenants,
        lost: tenants.saturating_sub(lateness.len()),
        duplicated,
    }
}

/// What the kill phase measured.
struct KillPhase {
    tenants: usize,
    alarms: usize,
    lateness: Vec<f64>,
    takeover: Vec<f64>,
    lost: usize,
    duplicated: usize,
    early: usize,
    ttl_ms: u64,
}

/// Phase 3: a child replica schedules alarms on its tenants and is SIGKILLed as they come due;
/// `fired` counts this replica's firings.
async fn kill_phase(
    url: &str,
    admin: &tokio_postgres::Client,
    fired: &AtomicUsize,
    tenants: usize,
    alarms: usize,
    window: Duration,
    ttl_ms: u64,
) -> KillPhase {
    use std::io::BufRead as _;
    let exe = std::env::current_exe().expect("this example");
    let mut child = std::process::Command::new(exe)
        .env(CHILD_ENV, "alarms-victim")
        .env(URL_ENV, url)
        .env(
            KILL_ENV,
            format!("{tenants},{alarms},{},{ttl_ms}", window.as_millis()),
        )
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
    .expect("child output")
    .expect("child ready");
    let start_ms: u64 = ready
        .trim()
        .strip_prefix("ready ")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("the child said {ready:?}"));
    let start = UNIX_EPOCH + Duration::from_millis(start_ms);
    let before = fired.load(Ordering::Relaxed);
    tokio::time::sleep(start.duration_since(SystemTime::now()).unwrap_or_default()).await;
    let _ = child.kill();
    let _ = child.wait();
    let killed_at: f64 = admin
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .expect("now")
        .get(0);
    eprintln!("kill: the child held {tenants} tenants with {alarms} alarms; SIGKILLed");
    wait_fired(fired, before + alarms, window + DRAIN_LIMIT).await;
    let rows = admin
        .query(
            "SELECT t.schema_name,
                    extract(epoch FROM t.acquired_at)::float8 * 1000
               FROM pgtenant.tenants t WHERE t.key LIKE 'alarms/kill-%'",
            &[],
        )
        .await
        .expect("kill tenants");
    let schemas: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    let (lateness, duplicated, early) = effects(admin, &schemas, "kill-").await;
    // Each tenant's takeover: acquired here minus the later of the kill and its first due.
    let mut takeover = Vec::new();
    for row in &rows {
        let schema: String = row.get(0);
        let acquired_ms: f64 = row.get(1);
        let first_due: Option<f64> = admin
            .query_one(
                &format!("SELECT extract(epoch FROM min(due))::float8 * 1000 FROM \"{schema}\".effects WHERE name LIKE 'kill-%'"),
                &[],
            )
            .await
            .expect("first due")
            .get(0);
        if let Some(first_due) = first_due {
            takeover.push(acquired_ms - first_due.max(killed_at * 1000.0));
        }
    }
    takeover.sort_by(f64::total_cmp);
    KillPhase {
        tenants,
        alarms,
        lost: alarms.saturating_sub(lateness.len()),
        lateness,
        takeover,
        duplicated,
        early,
        ttl_ms,
    }
}

fn main() {
    if let Ok(name) = std::env::var(CHILD_ENV) {
        child_main(&name);
        return;
    }
    let tenants = arg("--tenants", 10_000).max(1);
    let alarms = arg("--alarms", 100_000);
    let window = Duration::from_secs(arg("--window-s", 60) as u64);
    let burst = arg("--burst", 20_000);
    let million = arg("--million", 1_000_000);
    let kill = (
        arg("--kill-tenants", 1_000).max(1),
        arg("--kill-alarms", 5_000),
        Duration::from_secs(arg("--kill-window-s", 4) as u64),
        arg("--kill-ttl-ms", 2_000) as u64,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(tenants, alarms, window, burst, million, kill));
}
