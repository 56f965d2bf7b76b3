//! Benchmarks of pgtenant's ledger operations: forget and handoff against ledger size, cold
//! open rate with migrations, and `Router::migrate_all` over many tenants.
//!
//! Run with `cargo run --release --example bench_ledgers` (PostgreSQL on 127.0.0.1:5432, or
//! whatever `pgtenant_testkit::TestDatabase::create` finds; only 127.0.0.1 is accepted). It
//! measures, in one run, each part on its own fresh database (dropped at the end of the part):
//!
//! 1. `TenantHandle::forget` and handoff (holder's `handoff()` start → the waiter's
//!    `Router::wait_for` returning) for a tenant with a ~1 MB ledger and one with a ~1 GB ledger
//!    (~500 MB when less than 8 GB of disk is free), sizes interleaved;
//! 2. cold `Router::open_or_create` rate of tenants that do not exist yet, with tenant
//!    migrations creating 10 indexed tables, at concurrency 1 and 8;
//! 3. creating up to 10 000 tenants at version 1 (open_or_create + release, concurrency 8),
//!    then `Router::migrate_all(8, ..)` bringing them to version 2 (`ALTER TABLE .. ADD COLUMN`).
//!
//! It prints a Markdown report and writes it to `/tmp/bench_ledgers.md`.

#[path = "common/mod.rs"]
mod common;

use common::{
    cpu_model, fresh_database, handoff_once, median_d, mib, ms, server_info, ServerInfo, PARK_SLEEP,
};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgtenant::postgres::Client;
use pgtenant::{ActiveWork, MigrationOutcome, Router, RouterOptions, TenantHandle, TenantId};
use tokio::task::JoinSet;

const COMMAND: &str = "cargo run --release --example bench_ledgers";
const REPORT_PATH: &str = "/tmp/bench_ledgers.md";

// Part 1.
const SMALL_TARGET: i64 = 1 << 20;
const BIG_TARGET: i64 = 1 << 30;
const BIG_TARGET_LOW_DISK: i64 = 500 << 20;
/// Below this much free disk the big ledger is scaled down to `BIG_TARGET_LOW_DISK`.
const LOW_DISK_BYTES: u64 = 8_000_000_000;
const SMALL_CHUNK_ROWS: i64 = 256;
const BIG_CHUNK_ROWS: i64 = 50_000;
const FILL_SQL: &str = "INSERT INTO blob SELECT g, repeat(md5(g::text), 30)
                          FROM generate_series($1::bigint, $2::bigint) g";
const FORGETS: usize = 30;
const HANDOFFS: usize = 50;
const HANDOFF_WARMUP: usize = 4;
const TTL: Duration = Duration::from_secs(10);
const LEDGER_POOL: usize = 4;
const FORGET_P99_TARGET: Duration = Duration::from_millis(50);
const HANDOFF_P99_TARGET: Duration = Duration::from_millis(20);
/// "Flat" when the big ledger's median is within this factor of the small one's (either way).
const FLAT_FACTOR: f64 = 1.5;

// Part 2.
const COLD_TABLES: usize = 10;
const COLD_CONCURRENCY: [usize; 2] = [1, 8];
const COLD_WINDOW: Duration = Duration::from_secs(15);
const COLD_MAX: usize = 300;
const POOL_SIZE: usize = 16;

// Part 3.
const MIGRATE_TARGET: usize = 10_000;
const MIGRATE_PROBE: usize = 1_000;
const CREATE_BUDGET: Duration = Duration::from_secs(180);
const MIGRATE_CONCURRENCY: usize = 8;
const V1_SQL: &str = "CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL)";
const V2_SQL: &str = "ALTER TABLE accounts ADD COLUMN balance bigint NOT NULL DEFAULT 0";

// ---------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let disk = free_disk();
    let min_free = disk.iter().map(|(_, bytes, _)| *bytes).min().unwrap_or(0);
    let big_target = if min_free < LOW_DISK_BYTES {
        BIG_TARGET_LOW_DISK
    } else {
        BIG_TARGET
    };
    eprintln!(
        "[bench] free disk (min of /work, /var/lib/postgresql): {:.1} GB; big ledger target {:.0} MiB",
        min_free as f64 / 1e9,
        mib(big_target)
    );

    let activity = Arc::new(Mutex::new(Vec::new()));
    let sampler = tokio::spawn(sample_activity(started, activity.clone()));
    let mut windows = Vec::new();

    let (db, admin) = fresh_database().await;
    let mut info = run_info(&admin).await;
    eprintln!("[bench] part 1: forget and handoff against ledger size");
    let from = started.elapsed();
    let part1 = bench_ledgers(db.url(), &admin, big_target).await;
    windows.push(("1. forget and handoff", from, started.elapsed()));
    drop(admin);
    drop(db);

    let (db, admin) = fresh_database().await;
    eprintln!("[bench] part 2: cold open rate");
    let from = started.elapsed();
    let part2 = bench_cold(db.url(), &admin).await;
    windows.push(("2. cold open rate", from, started.elapsed()));
    drop(admin);
    drop(db);

    let (db, admin) = fresh_database().await;
    eprintln!("[bench] part 3: migrate_all");
    let from = started.elapsed();
    let part3 = bench_migrate_all(db.url(), &admin).await;
    windows.push(("3. migrate_all", from, started.elapsed()));
    drop(admin);
    drop(db);
    sampler.abort();
    let activity = summarize_activity(&activity.lock().expect("activity"), &windows);

    let wall = started.elapsed();
    info.disk = disk;
    info.big_target = big_target;
    info.activity = activity;
    info.wall = wall;
    let report = render(&info, &part1, &part2, &part3);
    println!("{report}");
    std::fs::write(REPORT_PATH, &report).expect("write the report");
    eprintln!(
        "[bench] wrote {REPORT_PATH} (wall time {:.1} s)",
        wall.as_secs_f64()
    );
}

struct RunInfo {
    disk: Vec<(String, u64, String)>,
    big_target: i64,
    activity: Vec<PartActivity>,
    wall: Duration,
    server: ServerInfo,
    nproc: usize,
    cpu: String,
}

async fn run_info(admin: &Client) -> RunInfo {
    let server = server_info(admin).await;
    let cpu = cpu_model().unwrap_or_else(|| "unknown CPU".to_owned());
    RunInfo {
        disk: Vec::new(),
        big_target: BIG_TARGET,
        activity: Vec::new(),
        wall: Duration::ZERO,
        server,
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu,
    }
}

/// `(mount point asked for, available bytes, df -h line)` for /work and /var/lib/postgresql.
fn free_disk() -> Vec<(String, u64, String)> {
    let mut out = Vec::new();
    for path in ["/work", "/var/lib/postgresql"] {
        let bytes = std::process::Command::new("df")
            .args(["-B1", "--output=avail", path])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().nth(1).and_then(|l| l.trim().parse::<u64>().ok()))
            .unwrap_or(0);
        let human = std::process::Command::new("df")
            .args(["-h", "--output=source,size,used,avail,pcent,target", path])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| {
                s.lines()
                    .nth(1)
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .unwrap_or_else(|| "df failed".to_owned());
        out.push((path.to_owned(), bytes, human));
    }
    out
}

/// One sample of the machine: time since start, 1-minute load average, and the other
/// processes of interest running (other benchmarks, compilers), by name.
type ActivitySample = (Duration, f64, Vec<String>);

/// Samples the machine once a second until aborted: the load the benchmark shares.
async fn sample_activity(started: Instant, into: Arc<Mutex<Vec<ActivitySample>>>) {
    let me = std::process::id();
    let parent = std::os::unix::process::parent_id();
    loop {
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(f64::NAN);
        let mut others = Vec::new();
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                if pid == me || pid == parent {
                    continue;
                }
                let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                let comm = comm.trim();
                if comm.starts_with("bench_") || comm == "rustc" || comm == "cargo" {
                    others.push(comm.to_owned());
                }
            }
        }
        others.sort();
        others.dedup();
        into.lock()
            .expect("activity")
            .push((started.elapsed(), load, others));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Per part: (name, duration, samples, highest load average, "name ×seconds" of others seen).
type PartActivity = (&'static str, Duration, usize, f64, String);

fn summarize_activity(
    samples: &[ActivitySample],
    windows: &[(&'static str, Duration, Duration)],
) -> Vec<PartActivity> {
    windows
        .iter()
        .map(|(name, from, to)| {
            let inside: Vec<&ActivitySample> = samples
                .iter()
                .filter(|(at, _, _)| at >= from && at <= to)
                .collect();
            let max_load = inside.iter().map(|(_, l, _)| *l).fold(0.0, f64::max);
            let mut seen: Vec<(String, usize)> = Vec::new();
            for (_, _, others) in &inside {
                for other in others {
                    match seen.iter_mut().find(|(n, _)| n == other) {
                        Some((_, count)) => *count += 1,
                        None => seen.push((other.clone(), 1)),
                    }
                }
            }
            let seen = if seen.is_empty() {
                "none".to_owned()
            } else {
                seen.iter()
                    .map(|(n, c)| format!("`{n}` in {c} samples"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            (*name, *to - *from, inside.len(), max_load, seen)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Part 1: forget and handoff against ledger size
// ---------------------------------------------------------------------------------------

struct Ledger {
    name: &'static str,
    id: TenantId,
    rows: i64,
    bytes: i64,
    fill: Duration,
    /// Untimed preparation after the fill: VACUUM ANALYZE + CHECKPOINT.
    settle: Duration,
    forget: Vec<Duration>,
    restore: Vec<Duration>,
    handoff: Vec<Duration>,
    handoff_call: Vec<Duration>,
}

struct Part1 {
    ledgers: Vec<Ledger>,
}

async fn table_bytes(admin: &Client, schema: &str) -> i64 {
    admin
        .query_one(
            "SELECT pg_total_relation_size(to_regclass($1))",
            &[&format!("{schema}.blob")],
        )
        .await
        .expect("table size")
        .get(0)
}

/// Creates the tenant on `router` and fills its `blob` table in chunks until it is at least
/// `target` bytes (pg_total_relation_size: heap, TOAST and the primary key index).
async fn create_and_fill(
    router: &Router,
    admin: &Client,
    name: &'static str,
    target: i64,
    chunk: i64,
) -> (Ledger, TenantHandle) {
    let id = TenantId::new("ledgers", name).expect("tenant id");
    let began = Instant::now();
    let handle = router.open_or_create(&id).await.expect("create tenant");
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(
                    "CREATE TABLE blob (id bigint PRIMARY KEY, payload text NOT NULL)",
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .expect("create the blob table");
    let mut rows = 0_i64;
    let mut bytes = 0_i64;
    while bytes < target {
        let (from, to) = (rows + 1, rows + chunk);
        handle
            .run(move |tx| {
                Box::pin(async move {
                    tx.execute(FILL_SQL, &[&from, &to]).await?;
                    Ok::<_, pgtenant::Error>(())
                })
            })
            .await
            .expect("fill the ledger");
        rows = to;
        bytes = table_bytes(admin, handle.schema()).await;
        if chunk >= 10_000 {
            eprintln!(
                "[bench]   {name}: {rows} rows, {:.0} MiB after {:.1} s",
                mib(bytes),
                began.elapsed().as_secs_f64()
            );
        }
    }
    let fill = began.elapsed();
    let settled = Instant::now();
    // The table in steady state: no autovacuum of the fill during the timed part, no dirty
    // pages of it left for a checkpoint in the middle of the samples.
    admin
        .batch_execute(&format!("VACUUM ANALYZE {}.blob", handle.schema()))
        .await
        .expect("vacuum the ledger");
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
    let settle = settled.elapsed();
    bytes = table_bytes(admin, handle.schema()).await;
    eprintln!(
        "[bench]   ledger {name}: {rows} rows, {bytes} bytes ({:.1} MiB), fill {:.1} s, vacuum+checkpoint {:.1} s",
        mib(bytes),
        fill.as_secs_f64(),
        settle.as_secs_f64()
    );
    let ledger = Ledger {
        name,
        id,
        rows,
        bytes,
        fill,
        settle,
        forget: Vec::with_capacity(FORGETS),
        restore: Vec::with_capacity(FORGETS),
        handoff: Vec::with_capacity(HANDOFFS),
        handoff_call: Vec::with_capacity(HANDOFFS),
    };
    (ledger, handle)
}

async fn start_router(url: &str, replica: &str, pool: usize) -> Arc<Router> {
    Arc::new(
        Router::start(
            RouterOptions::from_url(replica, url)
                .expect("options")
                .ttl(TTL)
                .pool_size(pool),
        )
        .await
        .expect("router starts"),
    )
}

async fn bench_ledgers(url: &str, admin: &Client, big_target: i64) -> Part1 {
    let a = start_router(url, "ledger-a", LEDGER_POOL).await;
    let b = start_router(url, "ledger-b", LEDGER_POOL).await;

    let (small, small_handle) =
        create_and_fill(&a, admin, "one-mb", SMALL_TARGET, SMALL_CHUNK_ROWS).await;
    let (big, big_handle) = create_and_fill(&a, admin, "one-gb", big_target, BIG_CHUNK_ROWS).await;
    let mut ledgers = [small, big];
    let mut first: [Option<TenantHandle>; 2] = [Some(small_handle), Some(big_handle)];

    // Forget: the first iteration forgets the freshly filled life; every later one restores
    // the trashed schema (a new life with the same data) and forgets it again.
    for i in 0..FORGETS {
        for k in 0..ledgers.len() {
            let j = (i + k) % ledgers.len();
            let ledger = &mut ledgers[j];
            let handle = match first[j].take() {
                Some(handle) => handle,
                None => {
                    let began = Instant::now();
                    let handle = a.restore(&ledger.id).await.expect("restore");
                    ledger.restore.push(began.elapsed());
                    handle
                }
            };
            let bytes = table_bytes(admin, handle.schema()).await;
            assert_eq!(
                bytes, ledger.bytes,
                "{}: the restored life lost data",
                ledger.name
            );
            let began = Instant::now();
            let trash = handle.forget(ActiveWork::Drain).await.expect("forget");
            ledger.forget.push(began.elapsed());
            assert!(trash.starts_with("trash_"), "unexpected trash name {trash}");
        }
        if (i + 1) % 10 == 0 {
            eprintln!("[bench]   {} forget rounds", i + 1);
        }
    }
    for ledger in &ledgers {
        eprintln!(
            "[bench]   forget {}: median {:.2} ms, p99 {:.2} ms",
            ledger.name,
            ms(median_d(&ledger.forget)),
            ms(percentile(&ledger.forget, 99.0))
        );
    }

    // Handoff: both tenants restored on A once more, then passed A → B → A …
    let routers = [a.clone(), b.clone()];
    let mut held: Vec<(usize, TenantHandle)> = Vec::new();
    for ledger in &ledgers {
        let handle = a.restore(&ledger.id).await.expect("restore for handoffs");
        assert_eq!(table_bytes(admin, handle.schema()).await, ledger.bytes);
        held.push((0, handle));
    }
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
    for i in 0..HANDOFF_WARMUP + HANDOFFS {
        for k in 0..ledgers.len() {
            let j = (i + k) % ledgers.len();
            let (holder, handle) = &mut held[j];
            let waiter = 1 - *holder;
            let sample = handoff_once(&routers[waiter], &ledgers[j].id, handle).await;
            *holder = waiter;
            *handle = sample.new_handle;
            if i >= HANDOFF_WARMUP {
                ledgers[j].handoff.push(sample.to_handle);
                ledgers[j].handoff_call.push(sample.handoff_call);
            }
        }
        if (i + 1) % 10 == 0 {
            eprintln!("[bench]   {} handoff rounds", i + 1);
        }
    }
    for (_, handle) in &held {
        handle.release().await.expect("release");
    }
    for ledger in &ledgers {
        eprintln!(
            "[bench]   handoff {}: median {:.2} ms, p99 {:.2} ms",
            ledger.name,
            ms(median_d(&ledger.handoff)),
            ms(percentile(&ledger.handoff, 99.0))
        );
    }
    a.close().await;
    b.close().await;
    Part1 {
        ledgers: ledgers.into(),
    }
}

// ---------------------------------------------------------------------------------------
// Part 2: cold open rate
// ---------------------------------------------------------------------------------------

struct ColdRow {
    concurrency: usize,
    opened: usize,
    elapsed: Duration,
    latency: Vec<Duration>,
}

fn cold_migrations() -> refinery::Runner {
    let migrations: Vec<refinery::Migration> = (1..=COLD_TABLES)
        .map(|k| {
            refinery::Migration::unapplied(
                &format!("V{k}__table_t{k}"),
                &format!(
                    "CREATE TABLE t{k} (id bigint PRIMARY KEY, v text, at timestamptz DEFAULT now());
                     CREATE INDEX t{k}_at ON t{k} (at)"
                ),
            )
            .expect("migration")
        })
        .collect();
    refinery::Runner::new(&migrations)
}

async fn bench_cold(url: &str, admin: &Client) -> Vec<ColdRow> {
    let router = Arc::new(
        Router::start(
            RouterOptions::from_url("cold", url)
                .expect("options")
                .ttl(TTL)
                .pool_size(POOL_SIZE)
                .migrations(cold_migrations()),
        )
        .await
        .expect("router starts"),
    );
    let mut rows = Vec::new();
    for concurrency in COLD_CONCURRENCY {
        let next = Arc::new(AtomicUsize::new(0));
        let handles = Arc::new(Mutex::new(Vec::new()));
        let began = Instant::now();
        let mut workers = JoinSet::new();
        for _ in 0..concurrency {
            let (router, next, handles) = (router.clone(), next.clone(), handles.clone());
            workers.spawn(async move {
                let mut latency = Vec::new();
                loop {
                    if began.elapsed() >= COLD_WINDOW {
                        break;
                    }
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= COLD_MAX {
                        break;
                    }
                    let id =
                        TenantId::new("cold", &format!("c{concurrency}-{n}")).expect("tenant id");
                    let t = Instant::now();
                    let handle = router.open_or_create(&id).await.expect("cold open");
                    latency.push(t.elapsed());
                    handles.lock().expect("handles").push(handle);
                }
                latency
            });
        }
        let mut latency = Vec::new();
        while let Some(done) = workers.join_next().await {
            latency.extend(done.expect("worker"));
        }
        let elapsed = began.elapsed();
        let handles = std::mem::take(&mut *handles.lock().expect("handles"));
        // Each new tenant must have its 10 tables (spot check on the first one).
        let schema = handles[0].schema().to_owned();
        let tables: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename ~ '^t[0-9]+$'",
                &[&schema],
            )
            .await
            .expect("count tables")
            .get(0);
        assert_eq!(tables, COLD_TABLES as i64, "tables in {schema}");
        let opened = latency.len();
        eprintln!(
            "[bench]   concurrency {concurrency}: {opened} cold opens in {:.1} s = {:.1}/s",
            elapsed.as_secs_f64(),
            opened as f64 / elapsed.as_secs_f64()
        );
        release_all(handles, 8).await;
        rows.push(ColdRow {
            concurrency,
            opened,
            elapsed,
            latency,
        });
    }
    router.close().await;
    rows
}

async fn release_all(handles: Vec<TenantHandle>, lanes: usize) {
    let queue = Arc::new(Mutex::new(handles));
    let mut set = JoinSet::new();
    for _ in 0..lanes {
        let queue = queue.clone();
        set.spawn(async move {
            loop {
                let next = queue.lock().expect("queue").pop();
                let Some(handle) = next else { return };
                handle.release().await.expect("release");
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("release lane");
    }
}

// ---------------------------------------------------------------------------------------
// Part 3: migrate_all
// ---------------------------------------------------------------------------------------

struct Part3 {
    probe: usize,
    probe_time: Duration,
    projected: Duration,
    created: usize,
    create_time: Duration,
    migrate_time: Duration,
    total: usize,
    migrated: usize,
    up_to_date: usize,
    other: Vec<String>,
    at_v2: i64,
    with_column: i64,
}

fn runner(with_v2: bool) -> refinery::Runner {
    let mut migrations =
        vec![refinery::Migration::unapplied("V1__accounts", V1_SQL).expect("migration V1")];
    if with_v2 {
        migrations
            .push(refinery::Migration::unapplied("V2__balance", V2_SQL).expect("migration V2"));
    }
    refinery::Runner::new(&migrations)
}

/// Creates tenants `mig/t<from>` … `mig/t<to - 1>` (open_or_create + release), 8 at a time.
async fn create_tenants(router: &Arc<Router>, from: usize, to: usize) {
    let next = Arc::new(AtomicUsize::new(from));
    let mut workers = JoinSet::new();
    for _ in 0..MIGRATE_CONCURRENCY {
        let (router, next) = (router.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= to {
                    return;
                }
                let id = TenantId::new("mig", &format!("t{n}")).expect("tenant id");
                let handle = router.open_or_create(&id).await.expect("create tenant");
                handle.release().await.expect("release");
                if (n + 1) % 1000 == 0 {
                    eprintln!("[bench]   created ~{}", n + 1);
                }
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("creation worker");
    }
}

async fn bench_migrate_all(url: &str, admin: &Client) -> Part3 {
    let v1 = Arc::new(
        Router::start(
            RouterOptions::from_url("mig-v1", url)
                .expect("options")
                .ttl(TTL)
                .pool_size(POOL_SIZE)
                .migrations(runner(false)),
        )
        .await
        .expect("router starts"),
    );
    let began = Instant::now();
    create_tenants(&v1, 0, MIGRATE_PROBE).await;
    let probe_time = began.elapsed();
    let rate = MIGRATE_PROBE as f64 / probe_time.as_secs_f64();
    let projected = Duration::from_secs_f64(MIGRATE_TARGET as f64 / rate);
    eprintln!(
        "[bench]   {MIGRATE_PROBE} tenants in {:.1} s ({rate:.0}/s): 10 000 projected at {:.0} s",
        probe_time.as_secs_f64(),
        projected.as_secs_f64()
    );
    let created = if projected <= CREATE_BUDGET {
        create_tenants(&v1, MIGRATE_PROBE, MIGRATE_TARGET).await;
        MIGRATE_TARGET
    } else {
        eprintln!(
            "[bench]   over the {CREATE_BUDGET:?} budget: migrating the {MIGRATE_PROBE} only"
        );
        MIGRATE_PROBE
    };
    let create_time = began.elapsed();
    v1.close().await;
    let at_v1: i64 = admin
        .query_one(
            "SELECT count(*) FROM pgtenant.tenants WHERE schema_version = 1 AND schema_name IS NOT NULL",
            &[],
        )
        .await
        .expect("count v1")
        .get(0);
    assert_eq!(at_v1, created as i64, "tenants at version 1");
    admin
        .batch_execute("VACUUM ANALYZE pgtenant.tenants")
        .await
        .expect("vacuum");
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");

    let v2 = Router::start(
        RouterOptions::from_url("mig-v2", url)
            .expect("options")
            .ttl(TTL)
            .pool_size(POOL_SIZE)
            .migrations(runner(true)),
    )
    .await
    .expect("router starts");
    let began = Instant::now();
    let results = v2
        .migrate_all(MIGRATE_CONCURRENCY, |step| {
            if step.done % 1000 == 0 || step.done == step.total {
                eprintln!("[bench]   migrated {}/{}", step.done, step.total);
            }
        })
        .await
        .expect("migrate_all");
    let migrate_time = began.elapsed();
    v2.close().await;

    let (mut migrated, mut up_to_date, mut other) = (0, 0, Vec::new());
    for r in &results {
        match &r.outcome {
            MigrationOutcome::Migrated { from, to } if *from == 1 && *to == 2 => migrated += 1,
            MigrationOutcome::UpToDate => up_to_date += 1,
            outcome => other.push(format!("{}: {outcome:?}", r.tenant)),
        }
    }
    let at_v2: i64 = admin
        .query_one(
            "SELECT count(*) FROM pgtenant.tenants WHERE schema_version = 2 AND schema_name IS NOT NULL",
            &[],
        )
        .await
        .expect("count v2")
        .get(0);
    let with_column: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_attribute a
               JOIN pg_class c ON c.oid = a.attrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relname = 'accounts' AND a.attname = 'balance' AND NOT a.attisdropped
                AND n.nspname IN (SELECT schema_name FROM pgtenant.tenants)",
            &[],
        )
        .await
        .expect("count columns")
        .get(0);
    eprintln!(
        "[bench]   migrate_all: {} tenants in {:.1} s; {migrated} migrated, {} other; {at_v2} at v2, {with_column} with the column",
        results.len(),
        migrate_time.as_secs_f64(),
        other.len()
    );
    Part3 {
        probe: MIGRATE_PROBE,
        probe_time,
        projected,
        created,
        create_time,
        migrate_time,
        total: results.len(),
        migrated,
        up_to_date,
        other,
        at_v2,
        with_column,
    }
}

// ---------------------------------------------------------------------------------------
// Statistics and report
// ---------------------------------------------------------------------------------------

/// Nearest-rank percentile.
fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

/// `| n | min | median | p90 | p99 | max |` cells, in ms.
fn stat_cells(v: &[Duration]) -> String {
    let min = v.iter().min().copied().unwrap_or_default();
    let max = v.iter().max().copied().unwrap_or_default();
    format!(
        "{} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms",
        v.len(),
        ms(min),
        ms(median_d(v)),
        ms(percentile(v, 90.0)),
        ms(percentile(v, 99.0)),
        ms(max)
    )
}

fn samples_line(v: &[Duration]) -> String {
    v.iter()
        .map(|d| format!("{:.1}", ms(*d)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn flatness(small: Duration, big: Duration) -> (f64, bool) {
    let ratio = big.as_secs_f64() / small.as_secs_f64();
    (ratio, (1.0 / FLAT_FACTOR..=FLAT_FACTOR).contains(&ratio))
}

fn render(info: &RunInfo, part1: &Part1, part2: &[ColdRow], part3: &Part3) -> String {
    let (disk, big_target, activity, wall) =
        (&info.disk, info.big_target, &info.activity, info.wall);
    let mut r = String::new();
    let w = &mut r;
    let _ = writeln!(w, "# pgtenant ledger benchmarks\n");
    let _ = writeln!(
        w,
        "Reproduce with `{COMMAND}` (needs PostgreSQL on 127.0.0.1:5432, trust auth; source: examples/bench_ledgers.rs). Each part runs on its own fresh database, dropped at the end of the part.\n"
    );
    let _ = writeln!(w, "- Command: `{COMMAND}`");
    let _ = writeln!(w, "- Date: {}", info.server.date);
    let _ = writeln!(
        w,
        "- Machine: nproc = {} ({}); shared and noisy, the benchmark and PostgreSQL share the cores",
        info.nproc, info.cpu
    );
    let _ = writeln!(w, "- PostgreSQL: {}", info.server.pg_version);
    let _ = writeln!(w, "- Server settings: {}", info.server.settings);
    for (path, bytes, human) in disk {
        let _ = writeln!(
            w,
            "- Free disk at start, `{path}`: {:.1} GB (`df -h`: {human})",
            *bytes as f64 / 1e9
        );
    }
    if big_target < BIG_TARGET {
        let _ = writeln!(
            w,
            "- **Less than 8 GB free: the big ledger was scaled down to {:.0} MiB.**",
            mib(big_target)
        );
    } else {
        let _ = writeln!(
            w,
            "- At least 8 GB free: the big ledger is the full ~1 GiB."
        );
    }
    let _ = writeln!(
        w,
        "- Wall time of the whole run: {:.1} s\n",
        wall.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "Machine activity, sampled once a second by this benchmark (1-minute load average; other processes named `bench_*`, `rustc` or `cargo` running at the same time, e.g. other benchmarks or builds on this shared machine):\n"
    );
    let _ = writeln!(
        w,
        "| part | duration | samples | highest load average | other processes seen |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---|");
    for (name, duration, samples, load, seen) in activity {
        let _ = writeln!(
            w,
            "| {name} | {:.1} s | {samples} | {load:.2} | {seen} |",
            duration.as_secs_f64()
        );
    }
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "Percentiles are nearest-rank (with 30 or 50 samples p99 is the maximum); the median of an even count is the mean of the two middle samples.\n"
    );

    // Part 1.
    let ledgers = &part1.ledgers;
    let _ = writeln!(w, "## 1. Forget and handoff against ledger size\n");
    let _ = writeln!(
        w,
        "Two routers A and B in this process (ttl 10 s, data-path pool {LEDGER_POOL} each). Each tenant has one table `blob (id bigint PRIMARY KEY, payload text NOT NULL)` filled through `handle.run` with `INSERT INTO blob SELECT g, repeat(md5(g::text), 30) FROM generate_series(..) g` in chunks ({SMALL_CHUNK_ROWS} rows for the small ledger, {BIG_CHUNK_ROWS} for the big one) until `pg_total_relation_size` (heap + TOAST + index) reaches the target; then `VACUUM ANALYZE` and `CHECKPOINT` (untimed), so no autovacuum of the fill or checkpoint of its pages runs during the samples.\n"
    );
    let _ = writeln!(
        w,
        "| ledger | rows | pg_total_relation_size | fill time | vacuum + checkpoint |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|");
    for l in ledgers {
        let _ = writeln!(
            w,
            "| {} | {} | {} B ({:.1} MiB) | {:.2} s | {:.2} s |",
            l.name,
            l.rows,
            l.bytes,
            mib(l.bytes),
            l.fill.as_secs_f64(),
            l.settle.as_secs_f64()
        );
    }
    let _ = writeln!(w);

    let _ = writeln!(w, "### Forget (`handle.forget(ActiveWork::Drain)`)\n");
    let _ = writeln!(
        w,
        "{FORGETS} forgets per ledger, sizes alternating. Iteration 1 forgets the freshly filled life (open_or_create + fill); every later iteration first runs `router.restore(&id)` (untimed: it brings the trashed schema back as a new life with all its data; the size is checked to be unchanged each time), then times `forget` alone, from the call to its return (the trash schema's name). No work in flight.\n"
    );
    let _ = writeln!(
        w,
        "| ledger | samples | min | median | p90 | p99 | max | p99 < {} ms |",
        FORGET_P99_TARGET.as_millis()
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|:---:|");
    for l in ledgers {
        let _ = writeln!(
            w,
            "| {} | {} | {} |",
            l.name,
            stat_cells(&l.forget),
            yes(percentile(&l.forget, 99.0) < FORGET_P99_TARGET)
        );
    }
    let (ratio, flat) = flatness(median_d(&ledgers[0].forget), median_d(&ledgers[1].forget));
    let _ = writeln!(
        w,
        "\nRatio of medians {} / {}: **{ratio:.2}** (flat, i.e. within ×{FLAT_FACTOR} either way: {}).\n",
        ledgers[1].name,
        ledgers[0].name,
        yes(flat)
    );
    let _ = writeln!(
        w,
        "For information, the untimed `restore` between forgets (also a schema rename, plus the lease): {}.\n",
        ledgers
            .iter()
            .map(|l| format!(
                "{} median {:.2} ms, p99 {:.2} ms",
                l.name,
                ms(median_d(&l.restore)),
                ms(percentile(&l.restore, 99.0))
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for l in ledgers {
        let _ = writeln!(
            w,
            "- forget samples, {} (ms): {}",
            l.name,
            samples_line(&l.forget)
        );
    }
    let _ = writeln!(w);

    let _ = writeln!(
        w,
        "### Handoff (holder's `handoff()` → waiter's `wait_for`)\n"
    );
    let _ = writeln!(
        w,
        "Both tenants restored once more on A, then handed A → B → A → …, sizes alternating, {HANDOFF_WARMUP} untimed warm-up handoffs per ledger then {HANDOFFS} timed ones (25 each way). Each handoff: the waiter's `wait_for(&id, 10 s)` starts in a task, the holder sleeps {} ms and checks the waiter is parked (its open attempt got `LeaseHeld` and is over, `wait_for` has not returned; with ttl 10 s only the release's NOTIFY can wake it in time), then times from calling `handle.handoff()` to `wait_for` returning the new handle on the other router (whose epoch is checked to be higher). `handoff() call` is how long the holder's `handoff()` itself took.\n",
        PARK_SLEEP.as_millis()
    );
    let _ = writeln!(
        w,
        "| ledger | samples | min | median | p90 | p99 | max | p99 < {} ms | `handoff()` call median / p99 |",
        HANDOFF_P99_TARGET.as_millis()
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|:---:|---:|");
    for l in ledgers {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.2} ms / {:.2} ms |",
            l.name,
            stat_cells(&l.handoff),
            yes(percentile(&l.handoff, 99.0) < HANDOFF_P99_TARGET),
            ms(median_d(&l.handoff_call)),
            ms(percentile(&l.handoff_call, 99.0))
        );
    }
    let (ratio, flat) = flatness(median_d(&ledgers[0].handoff), median_d(&ledgers[1].handoff));
    let _ = writeln!(
        w,
        "\nRatio of medians {} / {}: **{ratio:.2}** (flat, i.e. within ×{FLAT_FACTOR} either way: {}).\n",
        ledgers[1].name,
        ledgers[0].name,
        yes(flat)
    );
    for l in ledgers {
        let _ = writeln!(
            w,
            "- handoff samples, {} (ms): {}",
            l.name,
            samples_line(&l.handoff)
        );
    }
    let _ = writeln!(w);

    // Part 2.
    let _ = writeln!(w, "## 2. Cold open rate\n");
    let _ = writeln!(
        w,
        "One router (ttl 10 s, pool {POOL_SIZE}) whose tenant migrations are V1..V{COLD_TABLES}, each `CREATE TABLE tK (id bigint PRIMARY KEY, v text, at timestamptz DEFAULT now()); CREATE INDEX tK_at ON tK (at)`. Each sample is `router.open_or_create(&id)` of a tenant that does not exist yet (row, schema, the {COLD_TABLES} migrations and refinery's history, in one transaction). `concurrency` tokio tasks take tenant numbers from a shared counter until {} s or {COLD_MAX} tenants, whichever first; rate = tenants opened / wall time of the phase. The handles are kept until the phase ends, then released (untimed). The first tenant's schema is checked to hold the {COLD_TABLES} tables.\n",
        COLD_WINDOW.as_secs()
    );
    let _ = writeln!(
        w,
        "| concurrency | tenants opened | elapsed | cold opens/s | latency: samples | min | median | p90 | p99 | max |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in part2 {
        let _ = writeln!(
            w,
            "| {} | {} | {:.1} s | **{:.1}** | {} |",
            row.concurrency,
            row.opened,
            row.elapsed.as_secs_f64(),
            row.opened as f64 / row.elapsed.as_secs_f64(),
            stat_cells(&row.latency)
        );
    }
    let _ = writeln!(w);

    // Part 3.
    let p = part3;
    let _ = writeln!(w, "## 3. `migrate_all` over many tenants\n");
    let _ = writeln!(
        w,
        "Router `mig-v1` (pool {POOL_SIZE}) with migrations [V1 = `{V1_SQL}`] creates tenants with {MIGRATE_CONCURRENCY} tokio tasks, each `open_or_create` then `release`. The first {} are timed as a probe; the remaining ones up to {MIGRATE_TARGET} are created only if the probe's rate projects 10 000 within {} s. Then `mig-v1` closes, `VACUUM ANALYZE pgtenant.tenants; CHECKPOINT` runs (untimed), and a second router `mig-v2` with [V1, V2 = `{V2_SQL}`] runs `migrate_all({MIGRATE_CONCURRENCY}, ..)` (every tenant is free: each is opened, which migrates it under its lease, and released).\n",
        p.probe,
        CREATE_BUDGET.as_secs()
    );
    let _ = writeln!(w, "| step | tenants | time | tenants/s |");
    let _ = writeln!(w, "|---|---:|---:|---:|");
    let _ = writeln!(
        w,
        "| creation probe (open_or_create + release, concurrency {MIGRATE_CONCURRENCY}) | {} | {:.1} s | {:.0} |",
        p.probe,
        p.probe_time.as_secs_f64(),
        p.probe as f64 / p.probe_time.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "| creation, projected for {MIGRATE_TARGET} from the probe | {MIGRATE_TARGET} | {:.0} s | — |",
        p.projected.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "| creation, all (probe included) | {} | {:.1} s | {:.0} |",
        p.created,
        p.create_time.as_secs_f64(),
        p.created as f64 / p.create_time.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "| **`migrate_all({MIGRATE_CONCURRENCY}, ..)` V1 → V2** | {} | **{:.1} s** | **{:.0}** |",
        p.total,
        p.migrate_time.as_secs_f64(),
        p.total as f64 / p.migrate_time.as_secs_f64()
    );
    let _ = writeln!(w);
    if p.created < MIGRATE_TARGET {
        let _ = writeln!(
            w,
            "The probe projected more than {} s for {MIGRATE_TARGET} creations, so only {} tenants were created and migrated.\n",
            CREATE_BUDGET.as_secs(),
            p.created
        );
    }
    let all = p.migrated == p.created && p.total == p.created && p.other.is_empty();
    let _ = writeln!(
        w,
        "Outcomes: {} of {} tenants came back `Migrated {{ from: 1, to: 2 }}`, {} `UpToDate`, {} other. After the run {} tenants are at version 2 in `pgtenant.tenants` and {} live tenant schemas have `accounts.balance`. All {} migrated: {}.\n",
        p.migrated,
        p.total,
        p.up_to_date,
        p.other.len(),
        p.at_v2,
        p.with_column,
        p.created,
        yes(all && p.at_v2 == p.created as i64 && p.with_column == p.created as i64)
    );
    for line in p.other.iter().take(10) {
        let _ = writeln!(w, "- {line}");
    }
    r
}
