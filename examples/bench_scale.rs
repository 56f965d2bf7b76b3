//! How pgtenant scales with the number of tenants in one database (issue 21): 1 000, 10 000
//! and 100 000 tenants, each a schema made by tenant migrations through pgtenant.
//!
//! Run with `cargo run --release --example bench_scale` (PostgreSQL on 127.0.0.1:5432, or
//! whatever `pgtenant_testkit::TestDatabase::create` finds; only 127.0.0.1 is accepted; the
//! database is created fresh and dropped at the end). `-- --quick` runs 200 and 1 000 tenants
//! with fewer samples (a CI-sized smoke run, not a measurement); `-- --sizes 1000,10000` picks
//! the sizes; `-- --recycle N` asks for data connections closed after N distinct tenants (see
//! [`memory_options`]). For each size, growing the same database:
//!
//! 1. creation rate (`open_or_create` then `release`, 4 lanes, a fresh router per 5 000
//!    tenants so no backend serves more than 5 000 of them);
//! 2. the catalog: `pg_class` and `pg_attribute` rows and bytes, all of `pg_catalog`, the
//!    database;
//! 3. cold open (`Router::open` of a free tenant this router never saw) and the first fenced
//!    transaction after it, p50 and p99; warm open rate (`Router::open` of a tenant the router
//!    serves, 8 tasks);
//! 4. `migrate_all` with one new migration for every tenant (8 lanes) and with nothing to do;
//! 5. forget rate (`TenantHandle::forget`, 4 lanes) and sweep rate (`admin::sweep`, retention
//!    0), and the sweep's per-schema object listing as V8's code did it and as now;
//! 6. status at 100 replica rows registered by hand (lease sessions of one connection: 90
//!    alive, 5 stalled, 5 whose lease session is gone) holding every tenant, 10 tenants
//!    quarantined, some trash unswept: `replica_status`, `lease_status`, `lease_rows`,
//!    `fleet_status`, `admin::list_tenants` with each filter, the `pgtenant` binary's `status`
//!    and `tenants`; V8's `replica_status` and listing SQL side by side; all of it right after
//!    the owners were written (the visibility map cleared, statistics fresh) and after
//!    `VACUUM`;
//! 7. at the largest size, the memory of one data connection's backend after it served K
//!    distinct tenants (a router with `pool_size(1)`; per tenant two INSERTs and a SELECT),
//!    from `pg_backend_memory_contexts` on that same connection.
//!
//! Autovacuum may be off on the benchmark server: after each creation phase the benchmark runs
//! `VACUUM ANALYZE` on the control plane and `ANALYZE` on the big catalogs, as autovacuum would.
//!
//! It prints a Markdown report, writes it to `/tmp/bench_scale.md` (docs/scale.md keeps the
//! reports), and ends with machine-readable lines (`scale-bench: size=N …`).

#[path = "common/mod.rs"]
mod common;

use common::{
    cpu_model, fresh_database, load_average, median, median_d, mib, ms, percentile_d, server_info,
    ServerInfo,
};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgtenant::admin::{SweepOptions, TenantQuery};
use pgtenant::postgres::{Client, NoTls};
use pgtenant::TenantState;
use pgtenant::{ActiveWork, MigrationOutcome, Router, RouterOptions, TenantHandle, TenantId};
use tokio::task::JoinSet;

const COMMAND: &str = "cargo run --release --example bench_scale";
const REPORT_PATH: &str = "/tmp/bench_scale.md";
const CITUS_REPORT_PATH: &str = "/tmp/bench_scale_citus.md";

/// Every tenant's schema: five tables, two indexes besides the primary keys, a sequence.
const BASE_MIGRATIONS: [(&str, &str); 3] = [
    (
        "V1__accounts_entries",
        "CREATE SEQUENCE ids;
         CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL,
                                kind smallint NOT NULL DEFAULT 0,
                                created_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE entries (id bigint PRIMARY KEY, account bigint NOT NULL REFERENCES accounts,
                               amount numeric(18, 2) NOT NULL, memo text,
                               at timestamptz NOT NULL DEFAULT now());
         CREATE INDEX entries_account ON entries (account, at);",
    ),
    (
        "V2__invoices",
        "CREATE TABLE invoices (number bigint PRIMARY KEY, account bigint NOT NULL REFERENCES accounts,
                                total numeric(18, 2) NOT NULL,
                                issued_at timestamptz NOT NULL DEFAULT now());
         CREATE INDEX invoices_account ON invoices (account);",
    ),
    (
        "V3__settings_audit",
        "CREATE TABLE settings (name text PRIMARY KEY, value jsonb NOT NULL);
         CREATE TABLE audit (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(),
                             actor text NOT NULL, action text NOT NULL, detail jsonb);",
    ),
];

/// The base migrations and `extra` more, one per size so far: each size's `migrate_all`
/// brings every tenant one migration further.
///
/// The added column is nullable without a default on purpose. On PostgreSQL 15.20 an `ALTER
/// TABLE … ADD COLUMN` with a default (or NOT NULL) also reads pg_partitioned_table, pg_index
/// and pg_statistic_ext from end to end (`find_composite_type_dependencies`, looking for
/// whole-row uses of the table's type; seen with gdb on `heap_beginscan`), so its cost grows
/// with every index in the database, whoever runs it: part 4 times that statement on its own
/// ([`alter_costs`]), and `migrate_all` is timed with a migration whose own cost does not
/// grow, so that what grows is pgtenant's.
fn migrations(extra: usize) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = BASE_MIGRATIONS
        .iter()
        .map(|(name, sql)| ((*name).to_owned(), (*sql).to_owned()))
        .collect();
    for i in 0..extra {
        all.push((
            format!("V{}__note_{i}", BASE_MIGRATIONS.len() + 1 + i),
            format!("ALTER TABLE accounts ADD COLUMN note_{i} text"),
        ));
    }
    all
}

/// The per-tenant work of the memory part, and the first transaction after a cold open: two
/// INSERTs and a SELECT. Returns the backend's pid.
const WORK_INSERT_ACCOUNT: &str =
    "INSERT INTO accounts (id, name) VALUES (nextval('ids'), 'bench') RETURNING id";
const WORK_INSERT_ENTRY: &str = "INSERT INTO entries (id, account, amount) VALUES ($1, $1, 1.00)";
const WORK_SELECT: &str = "SELECT count(*), pg_backend_pid() FROM entries";

/// How much of everything a run does.
#[derive(Clone, Debug)]
struct Config {
    quick: bool,
    sizes: Vec<usize>,
    create_lanes: usize,
    /// Tenants per creating router: its connections close with it.
    chunk: usize,
    cold_samples: usize,
    warm_tenants: usize,
    warm_tasks: usize,
    warm_rounds: usize,
    warm_round: Duration,
    victims: usize,
    /// Forgotten after each sweep and left in the trash, so status shows a backlog.
    pending_trash: usize,
    forget_lanes: usize,
    migrate_lanes: usize,
    replicas: usize,
    quarantined: usize,
    status_samples: usize,
    memory_ks: Vec<usize>,
    recycle: Option<usize>,
    /// `--citus N`: only part 8, N tenants on a Citus coordinator and two workers.
    citus: Option<usize>,
}

fn full() -> Config {
    Config {
        quick: false,
        sizes: vec![1_000, 10_000, 100_000],
        create_lanes: 4,
        chunk: 5_000,
        cold_samples: 300,
        warm_tenants: 1_000,
        warm_tasks: 8,
        warm_rounds: 3,
        warm_round: Duration::from_secs(1),
        victims: 500,
        pending_trash: 10,
        forget_lanes: 4,
        migrate_lanes: 8,
        replicas: 100,
        quarantined: 10,
        status_samples: 30,
        memory_ks: vec![100, 1_000, 10_000],
        recycle: None,
        citus: None,
    }
}

fn quick() -> Config {
    Config {
        quick: true,
        sizes: vec![200, 1_000],
        cold_samples: 50,
        warm_tenants: 200,
        warm_rounds: 2,
        warm_round: Duration::from_millis(300),
        victims: 50,
        status_samples: 5,
        memory_ks: vec![100, 1_000],
        ..full()
    }
}

fn parse_args() -> Config {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cfg = if args.iter().any(|a| a == "--quick") {
        quick()
    } else {
        full()
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => {}
            "--sizes" => {
                i += 1;
                let list = args.get(i).expect("--sizes takes a list, e.g. 1000,10000");
                cfg.sizes = list
                    .split(',')
                    .map(|n| n.trim().parse().expect("--sizes: whole numbers"))
                    .collect();
                cfg.sizes.sort_unstable();
                cfg.sizes.dedup();
                assert!(
                    cfg.sizes.first().is_some_and(|n| *n >= 10),
                    "--sizes: at least 10 tenants"
                );
            }
            "--citus" => {
                i += 1;
                let n = args.get(i).expect("--citus takes a number of tenants");
                let n: usize = n.parse().expect("--citus: a whole number");
                assert!(n >= 40, "--citus: at least 40 tenants");
                cfg.citus = Some(n);
            }
            "--recycle" => {
                i += 1;
                let n = args.get(i).expect("--recycle takes a number of tenants");
                cfg.recycle = Some(n.parse().expect("--recycle: a whole number"));
            }
            other => {
                panic!("unknown argument {other:?}: use --quick, --sizes 1000,10000, --recycle N")
            }
        }
        i += 1;
    }
    let largest = *cfg.sizes.last().expect("a size");
    cfg.memory_ks.retain(|k| *k <= largest);
    cfg.cold_samples = cfg.cold_samples.min(largest);
    cfg.warm_tenants = cfg.warm_tenants.min(largest);
    cfg
}

/// The `i`-th tenant: 100 ledgers per organization, keys in index order.
fn tenant(i: usize) -> TenantId {
    TenantId::new(&format!("org{:04}", i / 100), &format!("l{i:06}")).expect("tenant id")
}

/// `count` distinct indexes below `size`, spread over it (a stride coprime with every size).
fn spread(size: usize, count: usize, offset: usize) -> Vec<usize> {
    const STRIDE: usize = 7_919;
    let stride = if size.is_multiple_of(STRIDE) {
        1
    } else {
        STRIDE
    };
    (0..count.min(size))
        .map(|k| (offset + k * stride) % size)
        .collect()
}

fn options(url: &str, replica: &str, pool: usize, extra: usize) -> RouterOptions {
    RouterOptions::from_url(replica, url)
        .expect("router options")
        .ttl(Duration::from_secs(30))
        .pool_size(pool)
        .open_timeout(Duration::from_secs(300))
        .tenant_migrations(migrations(extra))
        .expect("tenant migrations")
}

/// The memory part's router: one data connection, so one backend serves every tenant.
///
/// Without `--recycle` the connection is never recycled (the default bound,
/// `pgtenant::limits::DEFAULT_MAX_TENANTS_PER_CONNECTION`, is lifted) so the run shows how a backend grows;
/// `--recycle N` closes it once it has served N distinct tenants, and the run shows memory flat
/// past N. Part 7 reads the memory of whichever backend the pool's connection has at each K.
fn memory_options(url: &str, extra: usize, recycle: Option<usize>) -> RouterOptions {
    options(url, "memory", 1, extra).max_tenants_per_connection(recycle.unwrap_or(1_000_000))
}

async fn start(options: RouterOptions) -> Arc<Router> {
    Arc::new(Router::start(options).await.expect("router starts"))
}

/// Two INSERTs and a SELECT in one fenced transaction; the backend's pid.
async fn work(handle: &TenantHandle) -> i32 {
    handle
        .run(|tx| {
            Box::pin(async move {
                let id: i64 = tx.query_one(WORK_INSERT_ACCOUNT, &[]).await?.get(0);
                tx.execute(WORK_INSERT_ENTRY, &[&id]).await?;
                let row = tx.query_one(WORK_SELECT, &[]).await?;
                Ok::<_, pgtenant::Error>(row.get::<_, i32>(1))
            })
        })
        .await
        .expect("the work commits")
}

// ---------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------

#[derive(Default, Clone)]
struct Catalog {
    pg_class_rows: i64,
    pg_attribute_rows: i64,
    pg_namespace_rows: i64,
    pg_class_bytes: i64,
    pg_attribute_bytes: i64,
    pg_depend_bytes: i64,
    catalog_bytes: i64,
    database_bytes: i64,
}

/// One status query's timings, in the two states of the table.
#[derive(Clone)]
struct StatusTiming {
    label: String,
    /// Right after the owners were written: visibility map cleared, statistics fresh.
    churned: Vec<Duration>,
    /// After VACUUM.
    vacuumed: Vec<Duration>,
    rows: usize,
}

#[derive(Default, Clone)]
struct SizeResult {
    size: usize,
    created: usize,
    create_wall: Duration,
    create_latencies: Vec<Duration>,
    catalog: Catalog,
    cold_open: Vec<Duration>,
    cold_first_tx: Vec<Duration>,
    warm_rates: Vec<f64>,
    migrate_count: usize,
    migrate_wall: Duration,
    migrate_not_migrated: usize,
    migrate_noop: Vec<Duration>,
    /// `ALTER TABLE accounts ADD COLUMN … NOT NULL DEFAULT 0` in a rolled-back transaction.
    alter_default: Vec<Duration>,
    /// The same column, nullable without a default.
    alter_nullable: Vec<Duration>,
    forget_count: usize,
    forget_wall: Duration,
    forget_latencies: Vec<Duration>,
    swept: usize,
    sweep_wall: Duration,
    objects_old: Vec<Duration>,
    objects_new: Vec<Duration>,
    status: Vec<StatusTiming>,
    fleet_line: String,
    plan_notes: Vec<String>,
}

struct MemoryRow {
    k: usize,
    cache_bytes: i64,
    total_bytes: i64,
    backends: usize,
}

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

#[tokio::main]
async fn main() {
    let cfg = parse_args();
    if let Some(n) = cfg.citus {
        let report = citus(&cfg, n).await;
        println!("{report}");
        std::fs::write(CITUS_REPORT_PATH, &report).expect("write the report");
        eprintln!("[bench] report written to {CITUS_REPORT_PATH}");
        return;
    }
    let started = Instant::now();
    let (db, admin) = fresh_database().await;
    let url = db.url().to_owned();
    let server = server_info(&admin).await;
    let load_start = load_average();
    install_v8_copies(&admin).await;
    eprintln!("[bench] {cfg:?}");
    let cli = cli_binary();

    let lease = connect(&url).await;
    let mut phases: Vec<(String, Duration)> = Vec::new();
    let mut results: Vec<SizeResult> = Vec::new();
    let mut memory: Vec<MemoryRow> = Vec::new();
    let mut have = 0;
    for (index, &size) in cfg.sizes.iter().enumerate() {
        let mut r = SizeResult {
            size,
            ..SizeResult::default()
        };
        // Tenants created now are at the version the previous sizes migrated everybody to.
        let extra = index;
        let mut phase = Instant::now();
        eprintln!("[bench] size {size}: creating tenants {have}..{size}");
        let (wall, latencies) = create_range(&url, have..size, extra, &cfg).await;
        r.created = size - have;
        r.create_wall = wall;
        r.create_latencies = latencies;
        have = size;
        maintain(&admin).await;
        phases.push((format!("{size}: create"), phase.elapsed()));
        phase = Instant::now();

        r.catalog = catalog(&admin).await;
        eprintln!("[bench]   cold and warm opens");
        (r.cold_open, r.cold_first_tx) = cold_opens(&url, size, extra, &cfg).await;
        r.warm_rates = warm_opens(&url, size, extra, &cfg).await;
        phases.push((format!("{size}: opens"), phase.elapsed()));
        phase = Instant::now();

        eprintln!("[bench]   migrate_all");
        migrate(&url, size, extra, &cfg, &mut r).await;
        alter_costs(&admin, size, &mut r).await;
        maintain(&admin).await;
        phases.push((format!("{size}: migrate_all"), phase.elapsed()));
        phase = Instant::now();

        eprintln!("[bench]   forget and sweep");
        forget_and_sweep(&url, &db, index, extra + 1, &cfg, &mut r).await;
        time_object_listing(&admin, size, &mut r).await;
        maintain(&admin).await;
        phases.push((format!("{size}: forget, sweep"), phase.elapsed()));
        phase = Instant::now();

        eprintln!("[bench]   status at {} replicas", cfg.replicas);
        status(
            &admin,
            &lease,
            &url,
            size,
            extra + 1,
            &cfg,
            cli.as_deref(),
            &mut r,
        )
        .await;
        phases.push((format!("{size}: status"), phase.elapsed()));

        if index + 1 == cfg.sizes.len() && !cfg.memory_ks.is_empty() {
            let phase = Instant::now();
            eprintln!("[bench]   backend memory per tenant served");
            memory = backend_memory(&url, size, extra + 1, &cfg).await;
            phases.push((format!("{size}: memory"), phase.elapsed()));
        }
        print_size(&r);
        results.push(r);
    }
    drop(lease);
    let wall = started.elapsed();
    let report = render(
        &cfg,
        &server,
        &format!("{load_start} at the start, {} at the end", load_average()),
        &phases,
        &results,
        &memory,
        cli.is_some(),
        wall,
    );
    println!("{report}");
    std::fs::write(REPORT_PATH, &report).expect("write the report");
    eprintln!(
        "[bench] report written to {REPORT_PATH}; wall {:.0} s",
        wall.as_secs_f64()
    );
    drop(admin);
    drop(db);
}

async fn connect(url: &str) -> Client {
    let (client, connection) = pgtenant::postgres::connect(url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// What autovacuum would have done after a burst of writes (it may be off here).
async fn maintain(admin: &Client) {
    for sql in [
        "VACUUM ANALYZE pgtenant.tenants",
        "VACUUM ANALYZE pgtenant.trash",
        "VACUUM ANALYZE pgtenant.replicas",
        "VACUUM ANALYZE pgtenant.history",
        "ANALYZE pg_catalog.pg_class",
        "ANALYZE pg_catalog.pg_attribute",
        "ANALYZE pg_catalog.pg_namespace",
        "ANALYZE pg_catalog.pg_depend",
        "ANALYZE pg_catalog.pg_type",
    ] {
        admin.batch_execute(sql).await.expect(sql);
    }
}

/// The `pgtenant` command, if built (`cargo build --release -p pgtenant-cli`), or
/// `$PGTENANT_CLI_BIN`.
fn cli_binary() -> Option<std::path::PathBuf> {
    std::env::var_os("PGTENANT_CLI_BIN")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            Some(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/pgtenant"))
        })
        .filter(|path| path.is_file())
}

// ---------------------------------------------------------------------------------------
// 1. creation
// ---------------------------------------------------------------------------------------

/// Creates tenants `range` (open_or_create, release), `create_lanes` at a time, a fresh router
/// per chunk; the wall time and each open_or_create's latency.
async fn create_range(
    url: &str,
    range: std::ops::Range<usize>,
    extra: usize,
    cfg: &Config,
) -> (Duration, Vec<Duration>) {
    let t0 = Instant::now();
    let mut latencies = Vec::with_capacity(range.len());
    let mut chunk_start = range.start;
    while chunk_start < range.end {
        let chunk_end = (chunk_start + cfg.chunk).min(range.end);
        let router = start(options(
            url,
            &format!("creator-{chunk_start}"),
            cfg.create_lanes + 1,
            extra,
        ))
        .await;
        let next = Arc::new(AtomicUsize::new(chunk_start));
        let t_chunk = Instant::now();
        let mut lanes = JoinSet::new();
        for _ in 0..cfg.create_lanes {
            let (router, next) = (router.clone(), next.clone());
            lanes.spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= chunk_end {
                        return mine;
                    }
                    let t = Instant::now();
                    let handle = router.open_or_create(&tenant(i)).await.expect("create");
                    mine.push(t.elapsed());
                    assert!(handle.created(), "tenant {i} was new");
                    handle.release().await.expect("release");
                }
            });
        }
        while let Some(lane) = lanes.join_next().await {
            latencies.extend(lane.expect("creation lane"));
        }
        router.close().await;
        eprintln!(
            "[bench]   created {chunk_end} ({:.0}/s in this chunk, {:.0} s so far)",
            (chunk_end - chunk_start) as f64 / t_chunk.elapsed().as_secs_f64(),
            t0.elapsed().as_secs_f64()
        );
        chunk_start = chunk_end;
    }
    (t0.elapsed(), latencies)
}

// ---------------------------------------------------------------------------------------
// 2. catalog
// ---------------------------------------------------------------------------------------

async fn catalog(admin: &Client) -> Catalog {
    let row = admin
        .query_one(
            "SELECT (SELECT count(*) FROM pg_class), (SELECT count(*) FROM pg_attribute),
                    (SELECT count(*) FROM pg_namespace),
                    pg_total_relation_size('pg_class'), pg_total_relation_size('pg_attribute'),
                    pg_total_relation_size('pg_depend'),
                    (SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c
                      WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r'),
                    pg_database_size(current_database())",
            &[],
        )
        .await
        .expect("catalog size");
    Catalog {
        pg_class_rows: row.get(0),
        pg_attribute_rows: row.get(1),
        pg_namespace_rows: row.get(2),
        pg_class_bytes: row.get(3),
        pg_attribute_bytes: row.get(4),
        pg_depend_bytes: row.get(5),
        catalog_bytes: row.get(6),
        database_bytes: row.get(7),
    }
}

// ---------------------------------------------------------------------------------------
// 3. opens
// ---------------------------------------------------------------------------------------

/// Cold opens of free tenants this router never saw, one at a time, each followed by its
/// first fenced transaction and a release.
async fn cold_opens(
    url: &str,
    size: usize,
    extra: usize,
    cfg: &Config,
) -> (Vec<Duration>, Vec<Duration>) {
    let router = start(options(url, &format!("cold-{size}"), 2, extra)).await;
    let (mut open, mut first) = (Vec::new(), Vec::new());
    for i in spread(size, cfg.cold_samples, size / 3) {
        let t = Instant::now();
        let handle = router.open(&tenant(i)).await.expect("cold open");
        open.push(t.elapsed());
        let t = Instant::now();
        work(&handle).await;
        first.push(t.elapsed());
        handle.release().await.expect("release");
    }
    router.close().await;
    (open, first)
}

/// Warm `Router::open` rate: tenants this router serves already, `warm_tasks` tasks.
async fn warm_opens(url: &str, size: usize, extra: usize, cfg: &Config) -> Vec<f64> {
    let router = start(options(url, &format!("warm-{size}"), 8, extra)).await;
    let ids: Arc<Vec<TenantId>> = Arc::new(
        spread(size, cfg.warm_tenants, size / 2)
            .into_iter()
            .map(tenant)
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let mut openers = JoinSet::new();
    for _ in 0..8 {
        let (router, ids, next) = (router.clone(), ids.clone(), next.clone());
        openers.spawn(async move {
            let mut handles = Vec::new();
            while let Some(id) = ids.get(next.fetch_add(1, Ordering::Relaxed)) {
                handles.push(router.open(id).await.expect("open"));
            }
            handles
        });
    }
    let mut handles = Vec::new();
    while let Some(h) = openers.join_next().await {
        handles.extend(h.expect("opener"));
    }
    let mut rates = Vec::new();
    for _ in 0..cfg.warm_rounds {
        let deadline = Instant::now() + cfg.warm_round;
        let t0 = Instant::now();
        let mut tasks = JoinSet::new();
        for task in 0..cfg.warm_tasks {
            let (router, ids) = (router.clone(), ids.clone());
            tasks.spawn(async move {
                let mut k = task * ids.len() / 8;
                let mut count = 0_u64;
                while Instant::now() < deadline {
                    let handle = router.open(&ids[k % ids.len()]).await.expect("warm open");
                    drop(handle);
                    k += 1;
                    count += 1;
                }
                count
            });
        }
        let mut total = 0;
        while let Some(count) = tasks.join_next().await {
            total += count.expect("warm task");
        }
        rates.push(total as f64 / t0.elapsed().as_secs_f64());
    }
    drop(handles);
    router.close().await;
    rates
}

// ---------------------------------------------------------------------------------------
// 4. migrate_all
// ---------------------------------------------------------------------------------------

async fn migrate(url: &str, size: usize, extra: usize, cfg: &Config, r: &mut SizeResult) {
    let router = start(options(
        url,
        &format!("migrator-{size}"),
        cfg.migrate_lanes + 2,
        extra + 1,
    ))
    .await;
    let done = AtomicUsize::new(0);
    let t0 = Instant::now();
    let results = router
        .migrate_all(cfg.migrate_lanes, |_| {
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(10_000) {
                eprintln!("[bench]     migrated {n}");
            }
        })
        .await
        .expect("migrate_all");
    r.migrate_wall = t0.elapsed();
    r.migrate_count = results.len();
    r.migrate_not_migrated = results
        .iter()
        .filter(|m| !matches!(m.outcome, MigrationOutcome::Migrated { .. }))
        .count();
    if let Some(bad) = results
        .iter()
        .find(|m| !matches!(m.outcome, MigrationOutcome::Migrated { .. }))
    {
        eprintln!("[bench]     not migrated: {} {:?}", bad.tenant, bad.outcome);
    }
    for _ in 0..7 {
        let t = Instant::now();
        let again = router
            .migrate_all(cfg.migrate_lanes, |_| {})
            .await
            .expect("migrate_all with nothing to do");
        r.migrate_noop.push(t.elapsed());
        assert!(again.is_empty(), "nothing left to migrate");
    }
    router.close().await;
}

/// PostgreSQL's own cost of one `ALTER TABLE … ADD COLUMN`, with a default and without, on 20
/// tenant schemas, each in a transaction rolled back (no commit, nothing changes), one
/// backend: what a migration costs whoever runs it.
async fn alter_costs(admin: &Client, size: usize, r: &mut SizeResult) {
    let keys: Vec<String> = spread(size, 21, 29)
        .into_iter()
        .map(|i| tenant(i).key().to_owned())
        .collect();
    let schemas: Vec<String> = admin
        .query(
            "SELECT schema_name FROM pgtenant.tenants WHERE key = ANY($1)",
            &[&keys],
        )
        .await
        .expect("schemas")
        .iter()
        .map(|row| row.get(0))
        .collect();
    for (i, schema) in schemas.iter().enumerate() {
        for (column, out) in [
            ("integer NOT NULL DEFAULT 0", &mut r.alter_default),
            ("integer", &mut r.alter_nullable),
        ] {
            let sql = format!(
                "BEGIN; ALTER TABLE \"{schema}\".accounts ADD COLUMN bench_probe {column}; ROLLBACK;"
            );
            let t = Instant::now();
            admin.batch_execute(&sql).await.expect("alter probe");
            if i > 0 {
                out.push(t.elapsed());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5. forget and sweep
// ---------------------------------------------------------------------------------------

async fn forget_and_sweep(
    url: &str,
    db: &pgtenant_testkit::TestDatabase,
    index: usize,
    version: usize,
    cfg: &Config,
    r: &mut SizeResult,
) {
    let router = start(options(
        url,
        &format!("forgetter-{}", r.size),
        cfg.forget_lanes + 1,
        version,
    ))
    .await;
    let victim = |j: usize| TenantId::new("victims", &format!("s{index}-{j:05}")).expect("id");
    let mut handles = Vec::with_capacity(cfg.victims);
    for j in 0..cfg.victims {
        handles.push(router.open_or_create(&victim(j)).await.expect("victim"));
    }
    let queue = Arc::new(Mutex::new(handles));
    let t0 = Instant::now();
    let mut lanes = JoinSet::new();
    for _ in 0..cfg.forget_lanes {
        let queue = queue.clone();
        lanes.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let next = queue.lock().expect("queue").pop();
                let Some(handle) = next else { return mine };
                let t = Instant::now();
                handle.forget(ActiveWork::Refuse).await.expect("forget");
                mine.push(t.elapsed());
            }
        });
    }
    while let Some(lane) = lanes.join_next().await {
        r.forget_latencies.extend(lane.expect("forget lane"));
    }
    r.forget_wall = t0.elapsed();
    r.forget_count = cfg.victims;

    let mut sweeper = db.connect().await.expect("connect the sweeper");
    let t0 = Instant::now();
    let report = pgtenant::admin::sweep(
        &mut sweeper,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep");
    r.sweep_wall = t0.elapsed();
    r.swept = report.swept.len();
    assert!(
        report.deferred.is_empty() && report.refused.is_empty() && report.unknown.is_empty(),
        "the sweep dropped everything: deferred {:?}, refused {:?}, unknown {:?}",
        report.deferred,
        report.refused,
        report.unknown
    );
    // Some trash for the status part to show.
    for j in 0..cfg.pending_trash {
        let handle = router
            .open_or_create(&victim(cfg.victims + j))
            .await
            .expect("pending victim");
        handle.forget(ActiveWork::Refuse).await.expect("forget");
    }
    router.close().await;
}

/// The sweep's query for a schema's objects as V8's code had it (pg_class by relnamespace,
/// which no index leads with) and as now (pg_depend), on live tenant schemas (read only).
const OBJECTS_OLD_SQL: &str = "SELECT c.relname, c.relkind::text FROM pg_class c
       JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
      ORDER BY c.relispartition DESC, c.relkind = 'S', c.relname
      LIMIT $2";
const OBJECTS_NEW_SQL: &str = "SELECT c.relname, c.relkind::text
       FROM pg_depend d
       JOIN pg_class c ON c.oid = d.objid
      WHERE d.refclassid = 'pg_namespace'::regclass
        AND d.refobjid = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = $1)
        AND d.refobjsubid = 0
        AND d.classid = 'pg_class'::regclass
        AND d.deptype = 'n'
        AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
      ORDER BY c.relispartition DESC, c.relkind = 'S', c.relname
      LIMIT $2";

async fn time_object_listing(admin: &Client, size: usize, r: &mut SizeResult) {
    let schemas: Vec<String> = {
        let keys: Vec<String> = spread(size, 10, 17)
            .into_iter()
            .map(|i| tenant(i).key().to_owned())
            .collect();
        admin
            .query(
                "SELECT schema_name FROM pgtenant.tenants WHERE key = ANY($1)",
                &[&keys],
            )
            .await
            .expect("schemas")
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let batch = 20_i64;
    for (i, schema) in schemas.iter().enumerate() {
        for (sql, out) in [
            (OBJECTS_OLD_SQL, &mut r.objects_old),
            (OBJECTS_NEW_SQL, &mut r.objects_new),
        ] {
            let t = Instant::now();
            let rows = admin.query(sql, &[schema, &batch]).await.expect("objects");
            if i > 0 {
                out.push(t.elapsed());
            }
            assert_eq!(rows.len(), 7, "six relations and refinery's history table");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 6. status
// ---------------------------------------------------------------------------------------

/// V8's replica_status function, the listing's SQL before lease_rows: timed side by side
/// with V10's (schema bench_v8 of the benchmark's database).
async fn install_v8_copies(admin: &Client) {
    admin
        .batch_execute(
            "CREATE SCHEMA bench_v8;
             CREATE FUNCTION bench_v8.replica_status_rows()
             RETURNS TABLE (replica_id text, alive boolean, lock_held boolean, incarnation bigint,
                            tenants_held bigint, expires_in interval, backend_pid integer, host text,
                            started_at timestamptz, released_at timestamptz, sessions bigint,
                            sealed_at timestamptz, state text)
             LANGUAGE sql STABLE SET jit = off SET search_path = pg_catalog, pgtenant AS $$
             SELECT r.replica_id, l.alive, l.lock_held, r.incarnation,
                    (SELECT count(*) FROM pgtenant.tenants t
                      WHERE t.owner = r.replica_id AND t.owner_incarnation = r.incarnation),
                    CASE WHEN l.alive THEN date_trunc('milliseconds', r.expires_at - now()) END,
                    r.backend_pid, r.host, r.started_at, r.released_at,
                    (SELECT count(*) FROM pgtenant.sessions s
                      WHERE s.replica_id = r.replica_id AND s.incarnation = r.incarnation),
                    s.sealed_at,
                    CASE WHEN r.released_at IS NOT NULL THEN 'released'
                         WHEN s.sealed_at IS NOT NULL THEN 'sealed'
                         WHEN l.alive THEN 'alive'
                         WHEN NOT l.lock_held THEN 'lease session gone'
                         ELSE 'expired' END
             FROM pgtenant.replicas r
             JOIN pgtenant.replica_liveness l USING (replica_id)
             LEFT JOIN pgtenant.seals s ON s.replica_id = r.replica_id AND s.incarnation = r.incarnation
             ORDER BY r.replica_id
             $$;",
        )
        .await
        .expect("V8 copies");
}

/// The listing's first page as admin::list_tenants sent it before V10, its unset filters bound
/// as NULL (as the driver bound them; every plan was a custom one).
const V8_PAGE_SQL: &str =
    "SELECT s.tenant, s.state, s.owner, s.epoch, s.owner_alive, s.schema, s.version,
        t.forgotten_at_epoch, s.quarantine_cause, s.quarantine_repair,
        to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
        to_char(s.acquired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
   FROM pgtenant.lease_status s JOIN pgtenant.tenants t ON t.key = s.tenant
  WHERE (NULL::text IS NULL OR s.owner = NULL::text)
    AND (NULL::text IS NULL OR s.state = NULL::text)
    AND (NULL::bool IS NULL OR (s.quarantine_cause IS NOT NULL) = NULL::bool)
  ORDER BY s.tenant LIMIT 100";

/// Registers `n` replicas by hand on `lease` (one connection holding every liveness lock, as
/// many lease sessions would): every 20th from the second is stalled (a 1 ms ttl, its lock
/// held), every 20th from the third has lost its lease session (lock released).
async fn register_fleet(lease: &Client, n: usize) {
    for k in 0..n {
        let id = format!("fleet-r{k:03}");
        let locked: bool = lease
            .query_one(
                "SELECT pg_try_advisory_lock(pgtenant.lock_namespace(), pgtenant.replica_lock_key($1))",
                &[&id],
            )
            .await
            .expect("liveness lock")
            .get(0);
        assert!(locked, "the liveness lock of {id} is ours");
        let ttl: i32 = if k % 20 == 1 { 1 } else { 3_600_000 };
        lease
            .query_one(
                "SELECT incarnation FROM pgtenant.register($1, $2, 'bench_scale')",
                &[&id, &ttl],
            )
            .await
            .expect("register");
        if k % 20 == 2 {
            loop {
                let unlocked: bool = lease
                    .query_one(
                        "SELECT pg_advisory_unlock(pgtenant.lock_namespace(), pgtenant.replica_lock_key($1))",
                        &[&id],
                    )
                    .await
                    .expect("unlock")
                    .get(0);
                if !unlocked {
                    break;
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn status(
    admin: &Client,
    lease: &Client,
    url: &str,
    size: usize,
    version: usize,
    cfg: &Config,
    cli: Option<&std::path::Path>,
    r: &mut SizeResult,
) {
    register_fleet(lease, cfg.replicas).await;
    let n = i32::try_from(cfg.replicas).expect("replicas");
    let assigned = admin
        .execute(
            "UPDATE pgtenant.tenants t
                SET owner = f.replica_id, owner_incarnation = f.incarnation, acquired_at = now()
               FROM (SELECT replica_id, incarnation,
                            (row_number() OVER (ORDER BY replica_id) - 1)::int AS k
                       FROM pgtenant.replicas WHERE replica_id LIKE 'fleet-r%') f
              WHERE t.schema_name IS NOT NULL AND t.organization <> 'victims'
                AND t.lock_key % $1 = f.k",
            &[&n],
        )
        .await
        .expect("assign owners");
    assert_eq!(assigned as usize, size, "every tenant has an owner");
    let quarantined: Vec<String> = spread(size, cfg.quarantined, 3)
        .into_iter()
        .map(|i| tenant(i).key().to_owned())
        .collect();
    admin
        .execute(
            "UPDATE pgtenant.tenants SET owner = NULL, owner_incarnation = NULL,
                    quarantine_cause = 'bench_scale: a migration failed', quarantine_repair = 'none',
                    quarantined_at = now()
              WHERE key = ANY($1)",
            &[&quarantined],
        )
        .await
        .expect("quarantine");
    // Fresh statistics, as autovacuum's ANALYZE would have; the visibility map stays cleared.
    admin
        .batch_execute("ANALYZE pgtenant.tenants")
        .await
        .expect("analyze");

    let one = tenant(size / 2).key().to_owned();
    let near_end = tenant(size - 50);
    let queries: Vec<(&str, String)> = vec![
        (
            "replica_status (V10)",
            "SELECT * FROM pgtenant.replica_status".into(),
        ),
        (
            "replica_status (V8's function)",
            "SELECT * FROM bench_v8.replica_status_rows()".into(),
        ),
        (
            "lease_status, one tenant",
            format!("SELECT * FROM pgtenant.lease_status WHERE tenant = '{one}'"),
        ),
        (
            "lease_status LIMIT 100",
            "SELECT * FROM pgtenant.lease_status LIMIT 100".into(),
        ),
        (
            "lease_status WHERE state = 'quarantined'",
            "SELECT * FROM pgtenant.lease_status WHERE state = 'quarantined'".into(),
        ),
        (
            "lease_status count by state",
            "SELECT state, count(*) FROM pgtenant.lease_status GROUP BY state".into(),
        ),
        (
            "lease_rows count by state",
            "SELECT state, count(*) FROM pgtenant.lease_rows GROUP BY state".into(),
        ),
        (
            "lease_status, every row",
            "SELECT * FROM pgtenant.lease_status".into(),
        ),
        ("fleet_status", "SELECT * FROM pgtenant.fleet_status".into()),
        (
            "status_report (both, one pass)",
            "SELECT * FROM pgtenant.status_report(604800000)".into(),
        ),
        (
            "sweep_backlog (reads every schema name)",
            "SELECT * FROM pgtenant.sweep_backlog".into(),
        ),
        (
            "V8's listing page (lease_status JOIN tenants)",
            V8_PAGE_SQL.into(),
        ),
    ];
    let code_version = i64::try_from(BASE_MIGRATIONS.len() + version).expect("version");
    let pages: Vec<(&str, TenantQuery)> = {
        let mut list = Vec::new();
        list.push(("list_tenants: first page", TenantQuery::default()));
        let mut q = TenantQuery::default();
        q.quarantined = Some(true);
        list.push(("list_tenants --quarantined", q));
        let mut q = TenantQuery::default();
        q.state = Some(TenantState::Held);
        list.push(("list_tenants --state held", q));
        let mut q = TenantQuery::default();
        q.state = Some(TenantState::Stalled);
        list.push(("list_tenants --state stalled", q));
        let mut q = TenantQuery::default();
        q.state = Some(TenantState::Forgotten);
        list.push(("list_tenants --state forgotten", q));
        let mut q = TenantQuery::default();
        q.behind = Some(pgtenant::SchemaVersion::new(
            i32::try_from(code_version).expect("version"),
        ));
        list.push(("list_tenants --behind (none)", q));
        let mut q = TenantQuery::default();
        q.owner = Some(pgtenant::ReplicaId::new("fleet-r007").expect("a replica id"));
        list.push(("list_tenants --owner", q));
        let mut q = TenantQuery::default();
        q.after = Some(near_end);
        list.push(("list_tenants: last page", q));
        list
    };
    let mut commands: Vec<(&str, Vec<&str>)> = Vec::new();
    if cli.is_some() {
        commands.push(("`pgtenant status`", vec!["status"]));
        commands.push(("`pgtenant status --json`", vec!["status", "--json"]));
        commands.push(("`pgtenant tenants`", vec!["tenants"]));
        commands.push((
            "`pgtenant tenants --quarantined`",
            vec!["tenants", "--quarantined"],
        ));
        commands.push(("`pgtenant sweep --dry-run`", vec!["sweep", "--dry-run"]));
    }

    let mut timings: Vec<StatusTiming> = Vec::new();
    for vacuumed in [false, true] {
        if vacuumed {
            admin
                .batch_execute("VACUUM ANALYZE pgtenant.tenants")
                .await
                .expect("vacuum");
        }
        let mut k = 0;
        for (label, sql) in &queries {
            let (samples, rows) = time_sql(admin, sql, cfg.status_samples).await;
            record(&mut timings, k, label, samples, rows, vacuumed);
            k += 1;
        }
        for (label, query) in &pages {
            let mut samples = Vec::new();
            let mut rows = 0;
            for i in 0..cfg.status_samples + 3 {
                let t = Instant::now();
                let page = pgtenant::admin::list_tenants(admin, query)
                    .await
                    .expect("list_tenants");
                if i >= 3 {
                    samples.push(t.elapsed());
                }
                rows = page.len();
            }
            record(&mut timings, k, label, samples, rows, vacuumed);
            k += 1;
        }
        for (label, args) in &commands {
            let binary = cli.expect("the binary");
            let mut samples = Vec::new();
            let mut bytes = 0;
            for i in 0..cfg.status_samples.min(10) + 2 {
                let t = Instant::now();
                let output = tokio::process::Command::new(binary)
                    .args(args)
                    .args(["--database-url", url])
                    .env_remove("DATABASE_URL")
                    .output()
                    .await
                    .expect("run pgtenant");
                let elapsed = t.elapsed();
                assert!(
                    output.status.success(),
                    "pgtenant {args:?}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                if i >= 2 {
                    samples.push(elapsed);
                }
                bytes = output.stdout.len();
                if i == 0 && !vacuumed && args == &vec!["status"] {
                    r.fleet_line = String::from_utf8_lossy(&output.stdout)
                        .lines()
                        .take(8)
                        .collect::<Vec<_>>()
                        .join("\n");
                }
            }
            record(&mut timings, k, label, samples, bytes, vacuumed);
            k += 1;
        }
    }
    // The plans of what missed the target, at this size.
    for t in &timings {
        if ms(median_d(&t.vacuumed)) > 50.0 {
            if let Some((_, sql)) = queries.iter().find(|(label, _)| *label == t.label) {
                r.plan_notes
                    .push(format!("{}: {}", t.label, explain(admin, sql).await));
            }
        }
    }
    r.status = timings;

    // Back to a fleet of free tenants for the next size.
    admin
        .execute(
            "UPDATE pgtenant.tenants SET owner = NULL, owner_incarnation = NULL,
                    quarantine_cause = NULL, quarantine_repair = NULL, quarantined_at = NULL
              WHERE owner LIKE 'fleet-r%' OR quarantine_cause LIKE 'bench_scale:%'",
            &[],
        )
        .await
        .expect("free the tenants");
    admin
        .batch_execute("VACUUM ANALYZE pgtenant.tenants")
        .await
        .expect("vacuum");
}

fn record(
    timings: &mut Vec<StatusTiming>,
    k: usize,
    label: &str,
    samples: Vec<Duration>,
    rows: usize,
    vacuumed: bool,
) {
    if vacuumed {
        timings[k].vacuumed = samples;
    } else {
        timings.push(StatusTiming {
            label: label.to_owned(),
            churned: samples,
            vacuumed: Vec::new(),
            rows,
        });
    }
}

/// `sql` timed `samples` times after 3 untimed runs (simple protocol: what psql does); the
/// row count.
async fn time_sql(admin: &Client, sql: &str, samples: usize) -> (Vec<Duration>, usize) {
    let mut out = Vec::with_capacity(samples);
    let mut rows = 0;
    for i in 0..samples + 3 {
        let t = Instant::now();
        let messages = admin.simple_query(sql).await.expect(sql);
        if i >= 3 {
            out.push(t.elapsed());
        }
        rows = messages
            .iter()
            .filter(|m| matches!(m, pgtenant::postgres::SimpleQueryMessage::Row(_)))
            .count();
    }
    (out, rows)
}

/// EXPLAIN ANALYZE's verdict on a query: execution time, JIT time, the top plan nodes.
async fn explain(admin: &Client, sql: &str) -> String {
    let lines: Vec<String> = admin
        .simple_query(&format!("EXPLAIN (ANALYZE, FORMAT TEXT) {sql}"))
        .await
        .expect("explain")
        .iter()
        .filter_map(|m| match m {
            pgtenant::postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    let execution = lines
        .iter()
        .find(|l| l.contains("Execution Time"))
        .map(|l| l.trim().to_owned())
        .unwrap_or_default();
    let jit = lines
        .iter()
        .find(|l| l.contains("Timing: Generation"))
        .and_then(|l| l.split("Total").nth(1).map(|t| format!("JIT {}", t.trim())))
        .unwrap_or_else(|| "no JIT".to_owned());
    let nodes: Vec<String> = lines
        .iter()
        .filter(|l| l.trim_start().starts_with("->") || !l.starts_with(' '))
        .take(4)
        .map(|l| {
            let l = l.trim().trim_start_matches("-> ");
            l.split("  (").next().unwrap_or(l).to_owned()
        })
        .collect();
    format!("{execution}; {jit}; plan: {}", nodes.join(" / "))
}

// ---------------------------------------------------------------------------------------
// 7. backend memory
// ---------------------------------------------------------------------------------------

async fn backend_memory(url: &str, size: usize, version: usize, cfg: &Config) -> Vec<MemoryRow> {
    let router = start(memory_options(url, version, cfg.recycle)).await;
    let max_k = cfg.memory_ks.iter().copied().max().unwrap_or(0);
    let order = spread(size, max_k, 11);
    let mut rows = vec![read_memory(&router, 0, &mut Vec::new()).await];
    let mut pids: Vec<i32> = Vec::new();
    for (k, i) in order.into_iter().enumerate() {
        let handle = router.open(&tenant(i)).await.expect("open");
        let pid = work(&handle).await;
        if !pids.contains(&pid) {
            pids.push(pid);
        }
        handle.release().await.expect("release");
        if cfg.memory_ks.contains(&(k + 1)) {
            let row = read_memory(&router, k + 1, &mut pids).await;
            eprintln!(
                "[bench]     K = {}: CacheMemoryContext {:.1} MiB, all {:.1} MiB",
                row.k,
                mib(row.cache_bytes),
                mib(row.total_bytes)
            );
            rows.push(row);
        }
    }
    router.close().await;
    rows
}

/// The memory contexts of the router's one data connection's backend: CacheMemoryContext with
/// everything under it, and every context together. The view lists contexts depth first, so
/// a context's descendants are the rows after it with a greater level.
async fn read_memory(router: &Router, k: usize, pids: &mut Vec<i32>) -> MemoryRow {
    let client = router.connection().await.expect("the data connection");
    let rows = client
        .query(
            "SELECT name, level, total_bytes, pg_backend_pid() FROM pg_backend_memory_contexts",
            &[],
        )
        .await
        .expect("pg_backend_memory_contexts");
    let (mut cache, mut total, mut in_cache) = (0_i64, 0_i64, None::<i32>);
    for row in &rows {
        let (name, level, bytes): (String, i32, i64) = (row.get(0), row.get(1), row.get(2));
        total += bytes;
        match in_cache {
            Some(top) if level > top => cache += bytes,
            _ if name == "CacheMemoryContext" => {
                in_cache = Some(level);
                cache += bytes;
            }
            _ => in_cache = None,
        }
    }
    if let Some(row) = rows.first() {
        let pid: i32 = row.get(3);
        if !pids.contains(&pid) {
            pids.push(pid);
        }
    }
    MemoryRow {
        k,
        cache_bytes: cache,
        total_bytes: total,
        backends: pids.len().max(1),
    }
}

// ---------------------------------------------------------------------------------------
// 8. Citus
// ---------------------------------------------------------------------------------------

/// A row of part 8's table: its label, how to read it off a node, decimals per tenant.
type Metric<'a> = (&'a str, &'a dyn Fn(&NodeSizes) -> f64, usize);

/// One node's catalog, and on the coordinator Citus's metadata and the control plane.
struct NodeSizes {
    catalog: Catalog,
    /// pg_dist_partition, pg_dist_shard, pg_dist_placement, pg_dist_schema rows.
    citus_rows: [i64; 4],
    control_plane_bytes: i64,
}

async fn node_sizes(client: &Client) -> NodeSizes {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_dist_partition), (SELECT count(*) FROM pg_dist_shard),
                    (SELECT count(*) FROM pg_dist_placement), (SELECT count(*) FROM pg_dist_schema),
                    coalesce((SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c
                               WHERE c.relnamespace = to_regnamespace('pgtenant') AND c.relkind = 'r'), 0)",
            &[],
        )
        .await
        .expect("citus metadata");
    NodeSizes {
        catalog: catalog(client).await,
        citus_rows: [row.get(0), row.get(1), row.get(2), row.get(3)],
        control_plane_bytes: row.get(4),
    }
}

/// Part 8: `n` tenants (in two steps, a quarter then all) on a Citus coordinator and two
/// workers of the test kit, on this machine: every tenant schema a distributed schema (the
/// default with Citus). What each node holds per tenant, and a coordinator data connection's
/// memory after it served tenants.
async fn citus(cfg: &Config, n: usize) -> String {
    let t0 = Instant::now();
    let cluster = Arc::new(
        pgtenant_testkit::CitusCluster::start(2)
            .await
            .expect("a Citus cluster (bash ../shared/scripts/install-citus.sh)"),
    );
    let db = cluster.create_database().await.expect("a Citus database");
    let url = db.url().to_owned();
    let mut admin = db.connect().await.expect("connect");
    pgtenant::setup(&mut admin).await.expect("setup");
    let server = server_info(&admin).await;
    let mut workers = Vec::new();
    for port in cluster.worker_ports() {
        workers.push(
            connect(&format!(
                "postgres://postgres@127.0.0.1:{port}/{}",
                db.name()
            ))
            .await,
        );
    }
    let steps = [n / 4, n];
    let mut rows: Vec<(usize, f64, Vec<NodeSizes>)> = Vec::new();
    let mut have = 0;
    for step in steps {
        eprintln!("[bench] citus: creating tenants {have}..{step}");
        let (wall, _) = create_range(&url, have..step, 0, cfg).await;
        let rate = per_s(step - have, wall);
        have = step;
        let mut nodes = vec![node_sizes(&admin).await];
        for worker in &workers {
            nodes.push(node_sizes(worker).await);
        }
        rows.push((step, rate, nodes));
    }
    eprintln!("[bench] citus: coordinator memory");
    let k = cfg
        .memory_ks
        .iter()
        .copied()
        .filter(|k| *k <= n)
        .max()
        .unwrap_or(100)
        .min(n);
    let router = start(memory_options(&url, 0, None)).await;
    let mut pids = Vec::new();
    let before = read_memory(&router, 0, &mut pids).await;
    for i in spread(n, k, 5) {
        let handle = router.open(&tenant(i)).await.expect("open");
        work(&handle).await;
        handle.release().await.expect("release");
    }
    let after = read_memory(&router, k, &mut pids).await;
    router.close().await;

    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "## 8. On Citus: {n} tenants, a coordinator and two workers\n"
    );
    let _ = writeln!(
        w,
        "- Command: `{COMMAND} -- --citus {n}`; {}; {}; wall {:.0} s\n",
        server.pg_version,
        server.date,
        t0.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        w,
        "Three PostgreSQL servers of the test kit on this machine (durable), Citus schema-based \
         sharding: every tenant schema is a distributed schema placed on one worker, the control \
         plane stays local on the coordinator. Same tenant migrations as part 1 (five tables, two \
         indexes, a sequence), created the same way ({} lanes). Per tenant: the difference between \
         the two steps divided by the tenants created in between.\n",
        cfg.create_lanes
    );
    let (small, large) = (&rows[0], &rows[1]);
    let per = |f: &dyn Fn(&NodeSizes) -> f64, node: usize| {
        (f(&large.2[node]) - f(&small.2[node])) / (large.0 - small.0) as f64
    };
    let _ = writeln!(
        w,
        "| | coordinator at {a} | at {b} | per tenant | worker 1 at {b} | per tenant | worker 2 at {b} | per tenant |",
        a = small.0,
        b = large.0
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let metrics: [Metric; 9] = [
        ("pg_class rows", &|s| s.catalog.pg_class_rows as f64, 1),
        (
            "pg_attribute rows",
            &|s| s.catalog.pg_attribute_rows as f64,
            1,
        ),
        (
            "pg_namespace rows",
            &|s| s.catalog.pg_namespace_rows as f64,
            2,
        ),
        (
            "all of pg_catalog (KiB)",
            &|s| s.catalog.catalog_bytes as f64 / 1024.0,
            1,
        ),
        (
            "the database (KiB)",
            &|s| s.catalog.database_bytes as f64 / 1024.0,
            1,
        ),
        ("pg_dist_partition rows", &|s| s.citus_rows[0] as f64, 2),
        ("pg_dist_shard rows", &|s| s.citus_rows[1] as f64, 2),
        ("pg_dist_schema rows", &|s| s.citus_rows[3] as f64, 2),
        (
            "control plane, tables + indexes (KiB)",
            &|s| s.control_plane_bytes as f64 / 1024.0,
            2,
        ),
    ];
    for (label, f, d) in metrics {
        let _ = writeln!(
            w,
            "| {label} | {:.0} | {:.0} | {:.d$} | {:.0} | {:.d$} | {:.0} | {:.d$} |",
            f(&small.2[0]),
            f(&large.2[0]),
            per(f, 0),
            f(&large.2[1]),
            per(f, 1),
            f(&large.2[2]),
            per(f, 2),
        );
    }
    let _ = writeln!(
        w,
        "\nCreation rate: {:.0} tenants/s for the first {}, {:.0}/s for the next {}. A coordinator \
         data connection (pool_size 1) that served {k} tenants (the work of part 3 in each): \
         CacheMemoryContext {:.1} → {:.1} MiB, all contexts {:.1} → {:.1} MiB ({:.1} KiB per tenant).",
        small.1,
        small.0,
        large.1,
        large.0 - small.0,
        mib(before.cache_bytes),
        mib(after.cache_bytes),
        mib(before.total_bytes),
        mib(after.total_bytes),
        (after.total_bytes - before.total_bytes) as f64 / 1024.0 / k as f64
    );
    drop(admin);
    drop(workers);
    drop(db);
    out
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

fn per_s(count: usize, wall: Duration) -> f64 {
    count as f64 / wall.as_secs_f64().max(1e-9)
}

fn print_size(r: &SizeResult) {
    eprintln!(
        "[bench]   size {}: created {:.0}/s, cold open p50 {:.2} ms, warm {:.0}/s, migrate {:.0}/s, noop {:.1} ms, forget {:.0}/s, sweep {:.1}/s",
        r.size,
        per_s(r.created, r.create_wall),
        ms(median_d(&r.cold_open)),
        median(&r.warm_rates),
        per_s(r.migrate_count, r.migrate_wall),
        ms(median_d(&r.migrate_noop)),
        per_s(r.forget_count, r.forget_wall),
        per_s(r.swept, r.sweep_wall)
    );
}

fn size_label(n: usize) -> String {
    if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// A row of the per-size table: the values, then each consecutive ratio.
fn row(w: &mut String, metric: &str, values: &[f64], decimals: usize) {
    let mut cells: Vec<String> = values.iter().map(|v| format!("{v:.decimals$}")).collect();
    for pair in values.windows(2) {
        cells.push(if pair[0] > 0.0 {
            format!("{:.2}×", pair[1] / pair[0])
        } else {
            "–".to_owned()
        });
    }
    let _ = writeln!(w, "| {metric} | {} |", cells.join(" | "));
}

#[allow(clippy::too_many_arguments)]
fn render(
    cfg: &Config,
    server: &ServerInfo,
    load: &str,
    phases: &[(String, Duration)],
    results: &[SizeResult],
    memory: &[MemoryRow],
    have_cli: bool,
    wall: Duration,
) -> String {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = cpu_model().unwrap_or_else(|| "unknown".to_owned());
    let mut out = String::new();
    let w = &mut out;
    let sizes: Vec<String> = results.iter().map(|r| size_label(r.size)).collect();
    let _ = writeln!(
        w,
        "# pgtenant at scale: {} tenants in one database{}\n",
        sizes.join(" / "),
        if cfg.quick { " (quick run)" } else { "" }
    );
    let _ = writeln!(
        w,
        "- Command: `{COMMAND}{}` (source: examples/bench_scale.rs)",
        if cfg.quick { " -- --quick" } else { "" }
    );
    let _ = writeln!(w, "- Date: {}", server.date);
    let _ = writeln!(w, "- Source: {}", common::source_revision());
    let _ = writeln!(
        w,
        "- Machine: nproc = {nproc} ({cpu}); shared, the benchmark and PostgreSQL share the cores"
    );
    let _ = writeln!(w, "- PostgreSQL: {}", server.pg_version);
    let _ = writeln!(w, "- Server settings: {}", server.settings);
    let _ = writeln!(w, "- Load average (1 / 5 / 15 min): {load}");
    let _ = writeln!(
        w,
        "- Wall time of the whole run: {:.0} s ({:.1} min): {}\n",
        wall.as_secs_f64(),
        wall.as_secs_f64() / 60.0,
        phases
            .iter()
            .map(|(name, d)| format!("{name} {:.0} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let _ = writeln!(
        w,
        "Each tenant is a schema from three tenant migrations (five tables: `accounts`, `entries`, \
         `invoices`, `settings`, `audit`; two indexes besides the primary keys; a sequence; two \
         foreign keys), plus one `ALTER TABLE accounts ADD COLUMN note_<n> text` migration per size so \
         far, and refinery's history table. Tenants are created with `Router::open_or_create` then \
         `release`, {} lanes, a new router per {} tenants; the sizes grow one database. After \
         each burst of writes the benchmark runs `VACUUM ANALYZE` on the control plane and \
         `ANALYZE` on pg_class, pg_attribute, pg_namespace, pg_depend and pg_type, as autovacuum \
         would (it is off on this server). Routers use the defaults (session fencing on this \
         direct server) with a 30 s ttl. Latencies are client-side on 127.0.0.1, nearest-rank \
         percentiles; rates are tenants (or opens) per second of wall time.\n",
        cfg.create_lanes, cfg.chunk
    );

    // Per size.
    let ratio_heads: Vec<String> = sizes
        .windows(2)
        .map(|p| format!("{} / {}", p[1], p[0]))
        .collect();
    let _ = writeln!(w, "## 1. Per size, with the slope between sizes\n");
    let _ = writeln!(
        w,
        "| | {} | {} |",
        sizes.join(" | "),
        ratio_heads.join(" | ")
    );
    let _ = writeln!(
        w,
        "|---|{}|",
        vec!["---:"; sizes.len() + ratio_heads.len()].join("|")
    );
    let col = |f: &dyn Fn(&SizeResult) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
    row(
        w,
        "tenants created in this step",
        &col(&|r| r.created as f64),
        0,
    );
    row(
        w,
        "creation rate (tenants/s)",
        &col(&|r| per_s(r.created, r.create_wall)),
        0,
    );
    row(
        w,
        "creation p50 (ms, open_or_create)",
        &col(&|r| ms(percentile_d(&r.create_latencies, 50.0))),
        1,
    );
    row(
        w,
        "creation p99 (ms)",
        &col(&|r| ms(percentile_d(&r.create_latencies, 99.0))),
        1,
    );
    row(
        w,
        "cold open p50 (ms)",
        &col(&|r| ms(percentile_d(&r.cold_open, 50.0))),
        2,
    );
    row(
        w,
        "cold open p99 (ms)",
        &col(&|r| ms(percentile_d(&r.cold_open, 99.0))),
        2,
    );
    row(
        w,
        "first transaction after it p50 (ms)",
        &col(&|r| ms(percentile_d(&r.cold_first_tx, 50.0))),
        2,
    );
    row(
        w,
        "first transaction after it p99 (ms)",
        &col(&|r| ms(percentile_d(&r.cold_first_tx, 99.0))),
        2,
    );
    row(
        w,
        "warm open rate (opens/s, median)",
        &col(&|r| median(&r.warm_rates)),
        0,
    );
    row(
        w,
        "forget rate (tenants/s)",
        &col(&|r| per_s(r.forget_count, r.forget_wall)),
        0,
    );
    row(
        w,
        "forget p50 (ms)",
        &col(&|r| ms(percentile_d(&r.forget_latencies, 50.0))),
        2,
    );
    row(
        w,
        "sweep rate (schemas/s)",
        &col(&|r| per_s(r.swept, r.sweep_wall)),
        1,
    );
    row(
        w,
        "sweep: a schema's objects, V8's query (ms, median)",
        &col(&|r| ms(median_d(&r.objects_old))),
        2,
    );
    row(
        w,
        "sweep: a schema's objects, pg_depend (ms, median)",
        &col(&|r| ms(median_d(&r.objects_new))),
        3,
    );
    row(
        w,
        "migrate_all, one new migration (tenants/s)",
        &col(&|r| per_s(r.migrate_count, r.migrate_wall)),
        0,
    );
    row(
        w,
        "migrate_all, one new migration (s, all tenants)",
        &col(&|r| r.migrate_wall.as_secs_f64()),
        1,
    );
    row(
        w,
        "migrate_all, nothing to do (ms, median of 7)",
        &col(&|r| ms(median_d(&r.migrate_noop))),
        2,
    );
    row(
        w,
        "PostgreSQL: ADD COLUMN … NOT NULL DEFAULT 0 (ms, median)",
        &col(&|r| ms(median_d(&r.alter_default))),
        2,
    );
    row(
        w,
        "PostgreSQL: ADD COLUMN, nullable (ms, median)",
        &col(&|r| ms(median_d(&r.alter_nullable))),
        2,
    );
    row(
        w,
        "pg_class rows",
        &col(&|r| r.catalog.pg_class_rows as f64),
        0,
    );
    row(
        w,
        "pg_attribute rows",
        &col(&|r| r.catalog.pg_attribute_rows as f64),
        0,
    );
    row(
        w,
        "pg_namespace rows",
        &col(&|r| r.catalog.pg_namespace_rows as f64),
        0,
    );
    row(
        w,
        "pg_class (MiB)",
        &col(&|r| mib(r.catalog.pg_class_bytes)),
        1,
    );
    row(
        w,
        "pg_attribute (MiB)",
        &col(&|r| mib(r.catalog.pg_attribute_bytes)),
        1,
    );
    row(
        w,
        "pg_depend (MiB)",
        &col(&|r| mib(r.catalog.pg_depend_bytes)),
        1,
    );
    row(
        w,
        "all of pg_catalog (MiB)",
        &col(&|r| mib(r.catalog.catalog_bytes)),
        1,
    );
    row(
        w,
        "the database (MiB)",
        &col(&|r| mib(r.catalog.database_bytes)),
        1,
    );
    row(
        w,
        "catalog bytes per tenant (KiB)",
        &col(&|r| r.catalog.catalog_bytes as f64 / 1024.0 / r.size as f64),
        1,
    );
    row(
        w,
        "database bytes per tenant (KiB)",
        &col(&|r| r.catalog.database_bytes as f64 / 1024.0 / r.size as f64),
        1,
    );
    let bad: Vec<String> = results
        .iter()
        .filter(|r| r.migrate_not_migrated > 0)
        .map(|r| format!("{} at {}", r.migrate_not_migrated, size_label(r.size)))
        .collect();
    let _ = writeln!(
        w,
        "\nCold open: `Router::open` of a free tenant ({} per size, spread over the key space) by a \
         router that never saw it, one at a time; then the tenant's first fenced transaction \
         (`{WORK_INSERT_ACCOUNT}`, `{WORK_INSERT_ENTRY}`, `{WORK_SELECT}`), then `release`. Warm \
         open: {} tenants opened first, then {} tasks call `Router::open` on them for {} ms, {} \
         rounds. `migrate_all({})`: every tenant is free, so each one is opened (which migrates \
         it) and released; outcomes other than Migrated: {}. Forget: {} new tenants, \
         `forget(ActiveWork::Refuse)` from {} lanes; then `admin::sweep` with retention 0 drops \
         them (and the {} left in the trash by the previous size). The object listing is the \
         sweep's per-batch query on 9 live tenant schemas (read only), V8's and V10's. The two \
         PostgreSQL rows time one `ALTER TABLE <tenant>.accounts ADD COLUMN` in a transaction \
         rolled back, on 20 tenants from one backend: with a default, PostgreSQL 15 reads all of \
         pg_index (and pg_statistic_ext, pg_partitioned_table) for each such statement.\n",
        cfg.cold_samples,
        cfg.warm_tenants,
        cfg.warm_tasks,
        cfg.warm_round.as_millis(),
        cfg.warm_rounds,
        cfg.migrate_lanes,
        if bad.is_empty() { "none".to_owned() } else { bad.join(", ") },
        cfg.victims,
        cfg.forget_lanes,
        cfg.pending_trash
    );

    // Status.
    let _ = writeln!(
        w,
        "## 2. Status with {} replica rows holding every tenant\n",
        cfg.replicas
    );
    let _ = writeln!(
        w,
        "{} replicas registered by hand on one connection (its liveness locks, `pgtenant.register`): \
         90 alive, 5 stalled (1 ms ttl, lock held), 5 whose lease session is gone (lock released); \
         every live tenant given to one of them by an UPDATE, {} of them quarantined; besides, the \
         benchmark's own routers' released rows. Each query is timed {} times after 3 untimed runs \
         (simple protocol, as psql; `list_tenants` through the library, the `pgtenant` binary as a \
         process, connection included: {}): median / p99 in ms, right after the UPDATE (visibility \
         map cleared, statistics fresh) and after `VACUUM`. Default settings (JIT on).\n",
        cfg.replicas,
        cfg.quarantined,
        cfg.status_samples,
        if have_cli { "10 runs" } else { "not built, `cargo build --release -p pgtenant-cli`" }
    );
    let _ = writeln!(
        w,
        "| query | rows (largest) | {} |",
        results
            .iter()
            .map(|r| format!(
                "{} updated | {} vacuumed",
                size_label(r.size),
                size_label(r.size)
            ))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(
        w,
        "|---|---:|{}|",
        vec!["---:"; results.len() * 2].join("|")
    );
    if let Some(last) = results.last() {
        for (k, t) in last.status.iter().enumerate() {
            let cells: Vec<String> = results
                .iter()
                .flat_map(|r| {
                    let s = &r.status[k];
                    [
                        format!(
                            "{:.1} / {:.1}",
                            ms(median_d(&s.churned)),
                            ms(percentile_d(&s.churned, 99.0))
                        ),
                        format!(
                            "{:.1} / {:.1}",
                            ms(median_d(&s.vacuumed)),
                            ms(percentile_d(&s.vacuumed, 99.0))
                        ),
                    ]
                })
                .collect();
            let unit = if t.label.starts_with('`') { " B" } else { "" };
            let _ = writeln!(
                w,
                "| {} | {}{unit} | {} |",
                t.label,
                t.rows,
                cells.join(" | ")
            );
        }
        for note in &last.plan_notes {
            let _ = writeln!(
                w,
                "\n- Over 50 ms at {} (vacuumed), EXPLAIN ANALYZE: {note}",
                size_label(last.size)
            );
        }
        if !last.fleet_line.is_empty() {
            let _ = writeln!(
                w,
                "\n`pgtenant status` at {}, its first lines:\n\n```\n{}\n```",
                size_label(last.size),
                last.fleet_line
            );
        }
    }

    // Memory.
    if !memory.is_empty() {
        let _ = writeln!(
            w,
            "\n## 3. One data connection's backend after K distinct tenants\n"
        );
        let _ = writeln!(
            w,
            "A router with `pool_size(1)` opens K tenants one after the other ({} in all), runs the \
             work above in each and releases it; then `pg_backend_memory_contexts` is read on the \
             same pooled connection: CacheMemoryContext with every context under it, and all \
             contexts. {}\n",
            size_label(results.last().map_or(0, |r| r.size)),
            match cfg.recycle {
                Some(n) => format!(
                    "`--recycle {n}` was asked for, but this build's RouterOptions has no \
                     `max_tenants_per_connection`: measured without recycling."
                ),
                None => "No recycling: one backend serves them all.".to_owned(),
            }
        );
        let _ = writeln!(w, "| K | CacheMemoryContext (MiB) | all contexts (MiB) | per tenant since K = 0 (KiB, all) | backends |");
        let _ = writeln!(w, "|---:|---:|---:|---:|---:|");
        let base = memory.first().map_or(0, |m| m.total_bytes);
        for m in memory {
            let per = if m.k > 0 {
                format!("{:.1}", (m.total_bytes - base) as f64 / 1024.0 / m.k as f64)
            } else {
                "–".to_owned()
            };
            let _ = writeln!(
                w,
                "| {} | {:.1} | {:.1} | {per} | {} |",
                m.k,
                mib(m.cache_bytes),
                mib(m.total_bytes),
                m.backends
            );
        }
    }

    // Targets.
    if let Some(last) = results.last() {
        let _ = writeln!(w, "\n## 4. Targets at {} tenants\n", size_label(last.size));
        let _ = writeln!(w, "| target | measured | met |");
        let _ = writeln!(w, "|---|---:|:---:|");
        let noop = ms(median_d(&last.migrate_noop));
        let _ = writeln!(
            w,
            "| `migrate_all` with nothing to do < 1 s | {noop:.1} ms | {} |",
            yes(noop < 1000.0)
        );
        let rate = per_s(last.migrate_count, last.migrate_wall);
        let _ = writeln!(
            w,
            "| `migrate_all`, one new migration ≥ 500 tenants/s | {rate:.0}/s | {} |",
            yes(rate >= 500.0)
        );
        let warm = median(&last.warm_rates);
        let _ = writeln!(
            w,
            "| warm open ≥ 2 000/s per replica (DESIGN §8) | {warm:.0}/s | {} |",
            yes(warm >= 2000.0)
        );
        for t in &last.status {
            if t.label.contains("V8")
                || t.label.contains("every row")
                || t.label.contains("lease_status count")
            {
                continue;
            }
            let worst = ms(median_d(&t.churned)).max(ms(median_d(&t.vacuumed)));
            let _ = writeln!(
                w,
                "| {} < 50 ms (median, worse state) | {worst:.1} ms | {} |",
                t.label,
                yes(worst < 50.0)
            );
        }
    }

    // Machine-readable lines.
    let _ = writeln!(w);
    for r in results {
        let status_of = |label: &str| {
            r.status
                .iter()
                .find(|t| t.label == label)
                .map_or(f64::NAN, |t| ms(median_d(&t.vacuumed)))
        };
        let _ = writeln!(
            w,
            "scale-bench: size={} create_per_s={:.0} cold_open_p50_ms={:.2} cold_open_p99_ms={:.2} warm_open_per_s={:.0} migrate_per_s={:.0} migrate_noop_ms={:.2} forget_per_s={:.0} sweep_per_s={:.1} replica_status_ms={:.1} fleet_status_ms={:.1} pg_class_rows={} catalog_mib={:.0}",
            r.size,
            per_s(r.created, r.create_wall),
            ms(percentile_d(&r.cold_open, 50.0)),
            ms(percentile_d(&r.cold_open, 99.0)),
            median(&r.warm_rates),
            per_s(r.migrate_count, r.migrate_wall),
            ms(median_d(&r.migrate_noop)),
            per_s(r.forget_count, r.forget_wall),
            per_s(r.swept, r.sweep_wall),
            status_of("replica_status (V10)"),
            status_of("fleet_status"),
            r.catalog.pg_class_rows,
            mib(r.catalog.catalog_bytes)
        );
    }
    for m in memory {
        let _ = writeln!(
            w,
            "scale-bench-memory: k={} cache_mib={:.1} total_mib={:.1}",
            m.k,
            mib(m.cache_bytes),
            mib(m.total_bytes)
        );
    }
    out
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}
