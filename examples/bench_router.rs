//! Benchmarks of pgtenant's router: handoff latency, warm open rate and memory per open tenant.
//!
//! Run with `cargo run --release --example bench_router` (PostgreSQL on 127.0.0.1:5432, or
//! whatever `pgtenant_testkit::TestDatabase::create` finds; only 127.0.0.1 is accepted). It
//! measures, in one run:
//!
//! 1. handoff of an idle tenant to a replica parked in `Router::wait_for` (two routers in this
//!    process, ttl 10 s so only the release's NOTIFY can wake the waiter), for tenants whose
//!    ledger is empty, ~1 MB and ~100 MB, interleaved;
//! 2. warm `Router::open` rate of one fresh router over 5 000 existing, free tenants at 1, 8 and
//!    32 concurrent tokio tasks;
//! 3. the router's memory per open tenant with 10 000 tenants open: resident set size delta, and
//!    the exact live-heap delta counted by a global allocator wrapper installed in this example.
//!
//! It prints a Markdown report and writes it to `/tmp/bench_router.md`.
#![allow(
    unsafe_code,
    reason = "the counting GlobalAlloc of part 3 forwards to System, each call with its SAFETY comment"
)]

#[path = "common/mod.rs"]
mod common;

use common::{
    cpu_model, fresh_database, handoff_once, median, median_d, mib, ms, percentile_d, server_info,
    HandoffSample, ServerInfo, PARK_SLEEP, WAIT_TIMEOUT,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgtenant::{Router, RouterOptions, TenantHandle, TenantId};
use tokio::task::JoinSet;

const COMMAND: &str = "cargo run --release --example bench_router";
const REPORT_PATH: &str = "/tmp/bench_router.md";

// Part 1.
const HANDOFFS: usize = 200;
const HANDOFF_WARMUP: usize = 10;
const HANDOFF_TTL: Duration = Duration::from_secs(10);
const HANDOFF_POOL: usize = 4;
/// Ledgers: (ledger name, rows of 1 000 bytes). One row takes ~1.17 kB on disk (7 per page).
const LEDGERS: [(&str, i64); 3] = [("empty", 0), ("one-mb", 900), ("hundred-mb", 90_000)];

// Parts 2 and 3.
const POOL_SIZE: usize = 16;
const WARM_TENANTS: usize = 5_000;
const MEM_TENANTS: usize = 10_000;
const CREATE_CONCURRENCY: usize = 32;
const RELEASE_CONCURRENCY: usize = 16;
const CONCURRENCY: [usize; 3] = [1, 8, 32];
const OPEN_ROUNDS: usize = 5;
const OPEN_WARMUP: usize = 256;
const MEM_CONCURRENCY: usize = 32;

// ---------------------------------------------------------------------------------------
// A counting allocator: the exact live heap, for part 3.
// ---------------------------------------------------------------------------------------

/// The system allocator, counting live requested bytes and allocation calls.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to `System`; the counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Resident set size in bytes (VmRSS of /proc/self/status).
fn rss_bytes() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kb: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

fn live_heap() -> i64 {
    LIVE_BYTES.load(Ordering::Relaxed) as i64
}

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let (db, admin) = fresh_database().await;
    let url = db.url().to_owned();
    let server = server_info(&admin).await;

    let load_start = loadavg();
    let mut phases: Vec<(&'static str, Duration)> = Vec::new();
    let mut phase = Instant::now();
    eprintln!("[bench] part 1: handoff to a parked waiter");
    let handoff = bench_handoff(&url, &admin).await;
    phases.push(("1. handoff (incl. filling the ledgers)", phase.elapsed()));
    phase = Instant::now();
    eprintln!("[bench] creating {MEM_TENANTS} tenants");
    let ids: Arc<Vec<TenantId>> = Arc::new(
        (0..MEM_TENANTS)
            .map(|i| TenantId::new("warm", &format!("l{i:05}")).expect("tenant id"))
            .collect(),
    );
    let creation = create_tenants(&url, &ids).await;
    phases.push(("creating the tenants of parts 2 and 3", phase.elapsed()));
    phase = Instant::now();
    eprintln!("[bench] part 2: warm open rate");
    let open_rate = bench_open_rate(&url, &admin, &ids).await;
    phases.push((
        "2. warm open rate (incl. router starts, warm-ups, freeing)",
        phase.elapsed(),
    ));
    phase = Instant::now();
    eprintln!("[bench] part 3: memory per open tenant");
    let memory = bench_memory(&url, &admin, &ids).await;
    phases.push(("3. memory (incl. releasing all)", phase.elapsed()));

    let wall = started.elapsed();
    let info = RunInfo {
        server,
        load: format!("{load_start} at the start, {} at the end", loadavg()),
        phases,
    };
    let report = render(&info, &handoff, creation, &open_rate, &memory, wall);
    println!("{report}");
    std::fs::write(REPORT_PATH, &report).expect("write the report");
    eprintln!(
        "[bench] wrote {REPORT_PATH} (wall time {:.1} s)",
        wall.as_secs_f64()
    );
    drop(admin);
    drop(db);
}

// ---------------------------------------------------------------------------------------
// Part 1: handoff of an idle tenant to a parked waiter
// ---------------------------------------------------------------------------------------

struct LedgerHandoff {
    ledger: &'static str,
    rows: i64,
    table_bytes: i64,
    /// `handoff()` called → the waiter's `wait_for` returned its handle (the headline).
    to_handle: Vec<Duration>,
    /// How long `handoff()` itself took (drain + release statement).
    handoff_call: Vec<Duration>,
    /// `handoff()` called → the new owner's first fenced read committed.
    to_first_read: Vec<Duration>,
}

async fn bench_handoff(url: &str, admin: &pgtenant::postgres::Client) -> Vec<LedgerHandoff> {
    let mut routers = Vec::new();
    for name in ["handoff-a", "handoff-b"] {
        let router = Router::start(
            RouterOptions::from_url(name, url)
                .expect("options")
                .ttl(HANDOFF_TTL)
                .pool_size(HANDOFF_POOL),
        )
        .await
        .expect("router starts");
        routers.push(Arc::new(router));
    }

    // Each ledger: its id, its current holder (router index) and the holder's handle.
    let mut ledgers = Vec::new();
    let mut results = Vec::new();
    for (ledger, rows) in LEDGERS {
        let id = TenantId::new("handoff", ledger).expect("tenant id");
        let handle = routers[0].open_or_create(&id).await.expect("create tenant");
        handle
            .run(move |tx| {
                Box::pin(async move {
                    tx.batch_execute(
                        "CREATE TABLE ledger_data (id bigint PRIMARY KEY, payload text NOT NULL)",
                    )
                    .await?;
                    tx.execute(
                        "INSERT INTO ledger_data (id, payload)
                         SELECT g, repeat('x', 1000) FROM generate_series(1, $1::bigint) AS g",
                        &[&rows],
                    )
                    .await?;
                    Ok::<_, pgtenant::Error>(())
                })
            })
            .await
            .expect("fill the ledger");
        let qualified = format!("{}.ledger_data", handle.schema());
        admin
            .batch_execute(&format!("VACUUM ANALYZE {qualified}"))
            .await
            .expect("vacuum the ledger");
        admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
        let table_bytes: i64 = admin
            .query_one(
                "SELECT pg_total_relation_size($1::text::regclass)",
                &[&qualified],
            )
            .await
            .expect("table size")
            .get(0);
        // The CHECKPOINT above wrote the fill's dirty pages now, not during the timed handoffs.
        eprintln!(
            "[bench]   ledger {ledger}: {rows} rows, {:.1} MiB",
            table_bytes as f64 / 1048576.0
        );
        ledgers.push((id, 0_usize, handle));
        results.push(LedgerHandoff {
            ledger,
            rows,
            table_bytes,
            to_handle: Vec::with_capacity(HANDOFFS),
            handoff_call: Vec::with_capacity(HANDOFFS),
            to_first_read: Vec::with_capacity(HANDOFFS),
        });
    }

    for i in 0..HANDOFF_WARMUP + HANDOFFS {
        for k in 0..ledgers.len() {
            let j = (i + k) % ledgers.len();
            let (id, holder, handle) = &mut ledgers[j];
            let waiter = 1 - *holder;
            let (sample, to_first_read) = handoff_then_read(&routers[waiter], id, handle).await;
            *holder = waiter;
            *handle = sample.new_handle;
            if i >= HANDOFF_WARMUP {
                results[j].to_handle.push(sample.to_handle);
                results[j].handoff_call.push(sample.handoff_call);
                results[j].to_first_read.push(to_first_read);
            }
        }
        if (i + 1) % 50 == 0 {
            eprintln!("[bench]   {} handoff rounds", i + 1);
        }
    }
    for (_, _, handle) in &ledgers {
        handle.release().await.expect("release");
    }
    for router in routers {
        router.close().await;
    }
    for r in &results {
        eprintln!(
            "[bench]   {}: median {:.2} ms, p99 {:.2} ms",
            r.ledger,
            ms(median_d(&r.to_handle)),
            ms(percentile_d(&r.to_handle, 99.0))
        );
    }
    results
}

/// A handoff, then the new owner's first fenced read.
async fn handoff_then_read(
    waiter: &Arc<Router>,
    id: &TenantId,
    holder: &TenantHandle,
) -> (HandoffSample, Duration) {
    let sample = handoff_once(waiter, id, holder).await;
    sample
        .new_handle
        .read(|tx| {
            Box::pin(async move {
                tx.query("SELECT length(payload) FROM ledger_data LIMIT 1", &[])
                    .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .expect("first fenced read");
    let to_first_read = sample.began.elapsed();
    (sample, to_first_read)
}

// ---------------------------------------------------------------------------------------
// Tenant creation (untimed setup for parts 2 and 3)
// ---------------------------------------------------------------------------------------

/// Creates every tenant through one router (open_or_create, then release), returns the rate.
async fn create_tenants(url: &str, ids: &Arc<Vec<TenantId>>) -> f64 {
    let router = Arc::new(
        Router::start(
            RouterOptions::from_url("creator", url)
                .expect("options")
                .pool_size(POOL_SIZE),
        )
        .await
        .expect("router starts"),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..CREATE_CONCURRENCY {
        let (router, ids, next) = (router.clone(), ids.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { return };
                let handle = router.open_or_create(id).await.expect("create tenant");
                handle.release().await.expect("release new tenant");
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("creator task");
    }
    let rate = ids.len() as f64 / t0.elapsed().as_secs_f64();
    eprintln!("[bench]   created {} tenants at {rate:.0}/s", ids.len());
    router.close().await;
    rate
}

/// Opens `ids[range]` with `concurrency` tasks; returns the handles, per-open latencies and
/// the elapsed time of the whole batch.
async fn open_batch(
    router: &Arc<Router>,
    ids: &Arc<Vec<TenantId>>,
    range: std::ops::Range<usize>,
    concurrency: usize,
) -> (Vec<TenantHandle>, Vec<Duration>, Duration) {
    let (start, end) = (range.start, range.end);
    let count = end - start;
    let next = Arc::new(AtomicUsize::new(start));
    let t0 = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..concurrency {
        let (router, ids, next) = (router.clone(), ids.clone(), next.clone());
        tasks.spawn(async move {
            let mut handles = Vec::new();
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return (handles, latencies);
                }
                let t = Instant::now();
                let handle = router.open(&ids[i]).await.expect("open tenant");
                latencies.push(t.elapsed());
                handles.push(handle);
            }
        });
    }
    let mut handles = Vec::with_capacity(count);
    let mut latencies = Vec::with_capacity(count);
    while let Some(result) = tasks.join_next().await {
        let (h, l) = result.expect("open task");
        handles.extend(h);
        latencies.extend(l);
    }
    let elapsed = t0.elapsed();
    assert_eq!(handles.len(), count, "every open succeeded");
    (handles, latencies, elapsed)
}

/// Releases handles, `RELEASE_CONCURRENCY` at a time.
async fn release_all(handles: Vec<TenantHandle>) {
    let queue = Arc::new(Mutex::new(handles));
    let mut tasks = JoinSet::new();
    for _ in 0..RELEASE_CONCURRENCY {
        let queue = queue.clone();
        tasks.spawn(async move {
            loop {
                let next = queue.lock().expect("queue").pop();
                let Some(handle) = next else { return };
                handle.release().await.expect("release");
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("release task");
    }
}

// ---------------------------------------------------------------------------------------
// Part 2: warm open rate
// ---------------------------------------------------------------------------------------

struct OpenRateRow {
    concurrency: usize,
    /// Opens per second, one per round.
    rates: Vec<f64>,
    latencies: Vec<Duration>,
}

async fn bench_open_rate(
    url: &str,
    admin: &pgtenant::postgres::Client,
    ids: &Arc<Vec<TenantId>>,
) -> Vec<OpenRateRow> {
    let mut rows: Vec<OpenRateRow> = CONCURRENCY
        .iter()
        .map(|&concurrency| OpenRateRow {
            concurrency,
            rates: Vec::new(),
            latencies: Vec::new(),
        })
        .collect();
    for round in 0..OPEN_ROUNDS {
        for k in 0..rows.len() {
            let j = (round + k) % rows.len();
            let concurrency = rows[j].concurrency;
            admin
                .batch_execute("VACUUM ANALYZE pgtenant.tenants")
                .await
                .expect("vacuum tenants");
            // A fresh router per batch, its pool filled by an untimed warm-up on tenants outside
            // the measured set (32 tasks > 16 connections).
            let replica = format!("warm-open-r{round}-c{concurrency}");
            let router = Arc::new(
                Router::start(
                    RouterOptions::from_url(replica.clone(), url)
                        .expect("options")
                        .pool_size(POOL_SIZE),
                )
                .await
                .expect("router starts"),
            );
            let warmup = WARM_TENANTS..WARM_TENANTS + OPEN_WARMUP;
            let (warm, _, _) = open_batch(&router, ids, warmup, 32).await;
            drop(warm);

            let (handles, latencies, elapsed) =
                open_batch(&router, ids, 0..WARM_TENANTS, concurrency).await;
            let rate = WARM_TENANTS as f64 / elapsed.as_secs_f64();
            eprintln!("[bench]   round {round} concurrency {concurrency}: {rate:.0} opens/s");
            assert_eq!(router.open_count(), WARM_TENANTS + OPEN_WARMUP);
            rows[j].rates.push(rate);
            rows[j].latencies.extend(latencies);
            drop(handles);

            // Untimed: free every tenant of this router in one statement (the row state a
            // release leaves, without its NOTIFY), then close the router, whose releases now
            // find nothing to release.
            let freed = admin
                .execute(
                    "UPDATE pgtenant.tenants
                        SET owner = NULL, owner_incarnation = NULL,
                            reserved_for = NULL, reserved_until = NULL
                      WHERE owner = $1",
                    &[&replica],
                )
                .await
                .expect("free the tenants");
            assert_eq!(freed, (WARM_TENANTS + OPEN_WARMUP) as u64);
            router.close().await;
        }
    }
    rows
}

// ---------------------------------------------------------------------------------------
// Part 3: memory per open tenant
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct MemPoint {
    rss: i64,
    heap: i64,
}

async fn mem_point() -> MemPoint {
    // Let background tasks (lease session notices, pool recycling) settle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    MemPoint {
        rss: rss_bytes(),
        heap: live_heap(),
    }
}

struct MemoryResult {
    before: MemPoint,
    open: MemPoint,
    released: MemPoint,
    open_count: usize,
    allocations_per_open: f64,
    open_rate: f64,
    release_rate: f64,
    /// `close()` of a router holding the other half.
    close_time: Duration,
}

async fn bench_memory(
    url: &str,
    admin: &pgtenant::postgres::Client,
    ids: &Arc<Vec<TenantId>>,
) -> MemoryResult {
    admin
        .batch_execute("VACUUM ANALYZE pgtenant.tenants")
        .await
        .expect("vacuum tenants");
    let router = Arc::new(
        Router::start(
            RouterOptions::from_url("memory", url)
                .expect("options")
                .pool_size(POOL_SIZE),
        )
        .await
        .expect("router starts"),
    );
    // Warm-up: pool connections and task machinery exist before the baseline.
    let (handles, _, _) = open_batch(&router, ids, 0..OPEN_WARMUP, MEM_CONCURRENCY).await;
    release_all(handles).await;

    let before = mem_point().await;
    let allocs_before = allocations();
    let (handles, _, elapsed) = open_batch(&router, ids, 0..MEM_TENANTS, MEM_CONCURRENCY).await;
    let allocs_after = allocations();
    // The router keeps every open tenant; the application's handles are not counted.
    drop(handles);
    let open_count = router.open_count();
    assert_eq!(open_count, MEM_TENANTS, "every tenant is open");
    let open = mem_point().await;
    eprintln!(
        "[bench]   {MEM_TENANTS} open: RSS +{:.0} B/tenant, live heap +{:.0} B/tenant",
        (open.rss - before.rss) as f64 / MEM_TENANTS as f64,
        (open.heap - before.heap) as f64 / MEM_TENANTS as f64
    );

    // Half released by the application's tasks, the other half by close().
    let half = MEM_TENANTS / 2;
    let handles: Vec<TenantHandle> = ids[..half]
        .iter()
        .map(|id| router.handle_of(id).expect("open handle"))
        .collect();
    let t0 = Instant::now();
    release_all(handles).await;
    let release_rate = half as f64 / t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let report = router.close().await;
    let close_time = t0.elapsed();
    assert_eq!(
        report.handed_off.len(),
        MEM_TENANTS - half,
        "close hands off the rest"
    );
    let released = mem_point().await;
    MemoryResult {
        before,
        open,
        released,
        open_count,
        allocations_per_open: (allocs_after - allocs_before) as f64 / MEM_TENANTS as f64,
        open_rate: MEM_TENANTS as f64 / elapsed.as_secs_f64(),
        release_rate,
        close_time,
    }
}

// ---------------------------------------------------------------------------------------
// Statistics and the report
// ---------------------------------------------------------------------------------------

struct RunInfo {
    server: ServerInfo,
    /// Load averages (1, 5, 15 min) at the start and the end.
    load: String,
    phases: Vec<(&'static str, Duration)>,
}

/// The 1, 5 and 15 minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" / "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn yes_no(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "no"
    }
}

fn render(
    info: &RunInfo,
    handoff: &[LedgerHandoff],
    creation_rate: f64,
    open_rate: &[OpenRateRow],
    memory: &MemoryResult,
    wall: Duration,
) -> String {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = cpu_model().unwrap_or_else(|| "unknown".to_owned());
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# pgtenant router benchmarks\n");
    let _ = writeln!(
        w,
        "- Command: `{COMMAND}` (source: examples/bench_router.rs)"
    );
    let _ = writeln!(w, "- Date: {}", info.server.date);
    let _ = writeln!(w, "- Source: {}", common::source_revision());
    let _ = writeln!(
        w,
        "- Machine: nproc = {nproc} ({cpu}); shared and noisy, the benchmark and PostgreSQL share the cores"
    );
    let _ = writeln!(w, "- PostgreSQL: {}", info.server.pg_version);
    let _ = writeln!(w, "- Server settings: {}", info.server.settings);
    let _ = writeln!(
        w,
        "- Load average (1 / 5 / 15 min, {nproc} cores): {}",
        info.load
    );
    let _ = writeln!(
        w,
        "- Wall time of the whole run: {:.1} s ({})\n",
        wall.as_secs_f64(),
        info.phases
            .iter()
            .map(|(name, d)| format!("{name}: {:.1} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // Part 1.
    let _ = writeln!(w, "## 1. Handoff of an idle tenant to a waiting replica\n");
    let _ = writeln!(
        w,
        "Two routers in this process, `handoff-a` and `handoff-b` (ttl {} s, so a waiter's \
         LeaseHeld back-off lasts until the holder's heartbeat expiry, seconds away: only the \
         release's NOTIFY on `pgtenant_free` can wake it in time; pool_size {HANDOFF_POOL}). Three \
         tenants, each with a table `ledger_data (id bigint PRIMARY KEY, payload text)` filled in \
         a fenced transaction with `INSERT … SELECT g, repeat('x', 1000) FROM generate_series(1, \
         rows)`, then `VACUUM ANALYZE` and `CHECKPOINT` (so the fill's writes do not land during \
         the timed handoffs). Per handoff: the waiting router spawns `wait_for(&id, {} s)`; after {} ms the \
         benchmark checks it is parked (the task entered `wait_for`, the router has no \
         acquisition in flight — its open got `LeaseHeld` — and the task has not returned); then \
         the clock starts, the holder calls `handle.handoff()`, and the clock stops when \
         `wait_for` returns the handle (timestamp taken inside the waiting task). Roles \
         alternate, so each tenant goes A→B, B→A, …; the three tenants are interleaved round \
         robin (rotating which goes first) so machine noise hits them alike. {HANDOFF_WARMUP} \
         untimed rounds, then {HANDOFFS} timed handoffs per tenant. Nearest-rank percentiles.\n",
        HANDOFF_TTL.as_secs(),
        WAIT_TIMEOUT.as_secs(),
        PARK_SLEEP.as_millis()
    );
    let _ = writeln!(
        w,
        "| tenant ledger | rows | `ledger_data` size | samples | median | p90 | p99 | max | p99 < 20 ms |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|:---:|");
    for r in handoff {
        let p99 = percentile_d(&r.to_handle, 99.0);
        let _ = writeln!(
            w,
            "| {} | {} | {:.2} MiB | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
            r.ledger,
            r.rows,
            mib(r.table_bytes),
            r.to_handle.len(),
            ms(median_d(&r.to_handle)),
            ms(percentile_d(&r.to_handle, 90.0)),
            ms(p99),
            ms(percentile_d(&r.to_handle, 100.0)),
            yes_no(p99 < Duration::from_millis(20))
        );
    }
    let _ = writeln!(
        w,
        "\nBreakdown (same samples): how long the holder's `handoff()` call took (drain, then the \
         `pgtenant.release` statement whose commit sends the NOTIFY), and the time from \
         `handoff()` to the new owner's first fenced read (`handle.read`: `SELECT length(payload) \
         FROM ledger_data LIMIT 1`) committing.\n"
    );
    let _ = writeln!(
        w,
        "| tenant ledger | `handoff()` median | `handoff()` p99 | to first fenced read: median | p90 | p99 | max |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|");
    for r in handoff {
        let _ = writeln!(
            w,
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            r.ledger,
            ms(median_d(&r.handoff_call)),
            ms(percentile_d(&r.handoff_call, 99.0)),
            ms(median_d(&r.to_first_read)),
            ms(percentile_d(&r.to_first_read, 90.0)),
            ms(percentile_d(&r.to_first_read, 99.0)),
            ms(percentile_d(&r.to_first_read, 100.0))
        );
    }
    if let (Some(small), Some(big)) = (
        handoff.iter().find(|r| r.ledger == "one-mb"),
        handoff.iter().find(|r| r.ledger == "hundred-mb"),
    ) {
        let ratio = |p: f64| {
            percentile_d(&big.to_handle, p).as_secs_f64()
                / percentile_d(&small.to_handle, p).as_secs_f64()
        };
        let med = median_d(&big.to_handle).as_secs_f64() / median_d(&small.to_handle).as_secs_f64();
        let _ = writeln!(
            w,
            "\nLedger size ({:.0} MiB vs {:.1} MiB, ×{:.0} data): handoff time ratio {} / {}: \
             median ×{med:.2}, p90 ×{:.2}, p99 ×{:.2}, max ×{:.2} (target: flat, ≈ ×1; no data \
             moves, a handoff only rewrites the tenant's control row).",
            mib(big.table_bytes),
            mib(small.table_bytes),
            big.table_bytes as f64 / small.table_bytes as f64,
            big.ledger,
            small.ledger,
            ratio(90.0),
            ratio(99.0),
            ratio(100.0)
        );
    }

    // Part 2.
    let _ = writeln!(w, "\n## 2. Warm open rate per replica\n");
    let _ = writeln!(
        w,
        "{MEM_TENANTS} tenants were created beforehand through one router (`open_or_create` then \
         `release`, {CREATE_CONCURRENCY} tasks, pool_size {POOL_SIZE}: {creation_rate:.0} \
         tenants/s including their schemas; untimed setup). Each timed batch uses a **fresh \
         router** (`warm-open-r<round>-c<tasks>`, **pool_size {POOL_SIZE}**, default ttl 10 s) \
         whose pool is first filled by an untimed warm-up of {OPEN_WARMUP} opens at 32 tasks on \
         tenants outside the measured set; then it opens the first {WARM_TENANTS} tenants \
         (existing, free) with `router.open(&id)` from 1, 8 or 32 tokio tasks pulling ids from a \
         shared counter; opens/s = {WARM_TENANTS} / wall time of the batch. Afterwards, untimed: \
         one `UPDATE pgtenant.tenants SET owner = NULL, owner_incarnation = NULL, reserved_for = \
         NULL, reserved_until = NULL WHERE owner = <replica>` frees them (the row state a release \
         leaves, without 5 000 NOTIFYing commits, which PostgreSQL serializes: see the release \
         rate in part 3), the router is closed and `VACUUM ANALYZE pgtenant.tenants` runs before \
         the next batch. {OPEN_ROUNDS} rounds, concurrencies rotated within each round. Latency \
         percentiles are over every open of every round (nearest rank). Each open is one \
         `pgtenant.acquire` statement on a pooled connection (plus the router's own bookkeeping: a per-tenant gate and a spawned task).\n"
    );
    let _ = writeln!(
        w,
        "| concurrency | opens/s per round | opens/s (median) | ≥ 2 000/s | open latency median | p90 | p99 | max |"
    );
    let _ = writeln!(w, "|---:|---|---:|:---:|---:|---:|---:|---:|");
    for row in open_rate {
        let rate = median(&row.rates);
        let _ = writeln!(
            w,
            "| {} | {} | {rate:.0} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            row.concurrency,
            row.rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            yes_no(rate >= 2000.0),
            ms(median_d(&row.latencies)),
            ms(percentile_d(&row.latencies, 90.0)),
            ms(percentile_d(&row.latencies, 99.0)),
            ms(percentile_d(&row.latencies, 100.0))
        );
    }
    if let (Some(one), Some(last)) = (open_rate.first(), open_rate.last()) {
        let _ = writeln!(
            w,
            "\nScaling: {} tasks / {} task = ×{:.2} (median opens/s). Every open is a committed \
             write (the epoch bump and a `pgtenant.history` row) under `synchronous_commit = on`, \
             so one task waits for one WAL flush per open; concurrent tasks share flushes.",
            last.concurrency,
            one.concurrency,
            median(&last.rates) / median(&one.rates)
        );
    }

    // Part 3.
    let m = memory;
    let per = |a: i64, b: i64| (b - a) as f64 / MEM_TENANTS as f64;
    let rss_per = per(m.before.rss, m.open.rss);
    let heap_per = per(m.before.heap, m.open.heap);
    let _ = writeln!(
        w,
        "\n## 3. Router memory per open tenant at {MEM_TENANTS} open\n"
    );
    let _ = writeln!(
        w,
        "A fresh router, `memory` (pool_size {POOL_SIZE}), after an untimed warm-up of \
         {OPEN_WARMUP} opens and releases (pool connections and task machinery exist before the \
         baseline), opens all {MEM_TENANTS} existing tenants with {MEM_CONCURRENCY} tasks \
         ({:.0} opens/s), then drops the returned `TenantHandle`s: the router itself keeps every \
         open tenant (checked: `open_count()` = {}), so the delta is the router's own state. Each \
         reading is taken after a 300 ms settle. **RSS** is `VmRSS` from `/proc/self/status` \
         (includes allocator slack and fragmentation left by the transient allocations of the \
         opens). **Live heap** is exact: this example installs a `#[global_allocator]` that wraps \
         the system allocator and counts requested bytes (allocated − freed), so it excludes \
         malloc's per-chunk headers and free memory; it is process-wide, so a few KiB of \
         unrelated buffers (connection buffers, notices) may move with it. The memory of the \
         PostgreSQL backends is not included.\n",
        m.open_rate, m.open_count
    );
    let _ = writeln!(
        w,
        "| measure | before | {MEM_TENANTS} open | per open tenant | ≤ 2 KiB | after releasing all |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|:---:|---:|");
    let _ = writeln!(
        w,
        "| RSS (VmRSS) | {:.2} MiB | {:.2} MiB | **{rss_per:.0} B** | {} | {:.2} MiB |",
        mib(m.before.rss),
        mib(m.open.rss),
        yes_no(rss_per <= 2048.0),
        mib(m.released.rss)
    );
    let _ = writeln!(
        w,
        "| live heap (counted) | {:.2} MiB | {:.2} MiB | **{heap_per:.0} B** | {} | {:.2} MiB |",
        mib(m.before.heap),
        mib(m.open.heap),
        yes_no(heap_per <= 2048.0),
        mib(m.released.heap)
    );
    let _ = writeln!(
        w,
        "\nReleasing the tenants afterwards: the first {} with `handle.release()` from \
         {RELEASE_CONCURRENCY} tasks, {:.0} releases/s; then `router.close()` hands off the other {} \
         (default `close_concurrency` 8) in {:.2} s, {:.0} handoffs/s. Every release's commit \
         carries a NOTIFY, and PostgreSQL serializes notifying commits, so the router batches the \
         releases that wait while one commits into one transaction.\n",
        MEM_TENANTS / 2,
        m.release_rate,
        MEM_TENANTS - MEM_TENANTS / 2,
        m.close_time.as_secs_f64(),
        (MEM_TENANTS - MEM_TENANTS / 2) as f64 / m.close_time.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "Heap allocation calls during the {MEM_TENANTS} opens: {:.1} per open (transient ones \
         included: the open's task, the statement's buffers, rows). Live heap per tenant left \
         after releasing all {MEM_TENANTS} and closing: {:.0} B (the handle map keeps its grown capacity). \
         For scale, public sizes: `size_of::<TenantHandle>()` = {} B (an `Arc` to the private \
         per-tenant state), `size_of::<TenantId>()` = {} B plus its key string on the heap.",
        m.allocations_per_open,
        per(m.before.heap, m.released.heap),
        size_of::<TenantHandle>(),
        size_of::<TenantId>()
    );
    out
}
