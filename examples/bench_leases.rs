//! Benchmarks of pgtenant's lease machinery against plain tokio-postgres baselines.
//!
//! Run with `cargo run --release --example bench_leases` (PostgreSQL on 127.0.0.1:5432, or
//! whatever `pgtenant_testkit::TestDatabase::create` finds); `-- --quick` runs fewer, shorter
//! rounds (a smoke run, not a measurement); `-- --hygiene-only` runs part 2 alone at 8 clients with
//! twice the rounds, `-- --takeover-only` part 3 alone. It measures, in one run:
//!
//! 1. throughput, side by side at 1, 8 and 32 clients, rounds interleaved, with the client's
//!    and the server's CPU time per transaction, of: a fenced transaction under session fencing
//!    and under transaction fencing (`TenantHandle::run`), the same transaction pinned
//!    (`search_path` set per transaction, as any schema-per-tenant application must), bare
//!    (unfenced, qualified names) and the peer pattern (a `FOR SHARE` read of a fencing row in
//!    every transaction, as Temporal does); one typed INSERT and four INSERTs per transaction;
//! 2. session hygiene A/B (issue #8): the fenced transaction with the fence's session scrub and
//!    with the same fence body minus the scrub, swapped in between ABBA-ordered rounds;
//! 3. takeover latency after the owning replica process is SIGKILLed, under both fencings (the
//!    example re-executes itself as the owner: `bench_leases child <url> <replica> <ledger>
//!    <fencing>`), the owner holding bound idle data sessions, so sealing is included;
//! 4. the cost of the heartbeat (`pgtenant.heartbeat`) with 1, 1 000 and 100 000 held tenants.
//!
//! It prints a Markdown report, writes it to `/tmp/bench_leases.md` (BENCHMARKS.md collects the
//! reports), and ends with machine-readable lines (`fence-bench: clients=N session/pinned=…`).

#[path = "common/mod.rs"]
mod common;

use common::{
    cpu_model, cpu_seconds_of, fresh_database, load_average, median, median_d, ms, percentile_d,
    postmaster_of, server_info, ServerInfo,
};
use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtenant::pool::Pool;
use pgtenant::postgres::types::{ToSql, Type};
use pgtenant::postgres::{Client, NoTls, Statement};
use pgtenant::{Fencing, Router, RouterOptions, TenantHandle, TenantId};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinSet;

const COMMAND: &str = "cargo run --release --example bench_leases";
const CONCURRENCY: [usize; 3] = [1, 8, 32];
const CHILD_TTL: Duration = Duration::from_secs(2);
/// The owner process's pool: that many data sessions are bound (session fencing) when it dies.
const CHILD_POOL: usize = 4;

/// How much of everything a run does.
#[derive(Clone, Copy)]
struct Config {
    quick: bool,
    /// Throughput rounds per mode, variant and concurrency.
    rounds: usize,
    round: Duration,
    warmup: Duration,
    /// Hygiene rounds per concurrency (ABBA order of on/off): half of them with the scrub.
    hygiene_rounds: usize,
    /// Takeovers per fencing.
    takeovers: usize,
    held: [i64; 3],
    heartbeat_samples: usize,
    status_samples: usize,
}

const FULL: Config = Config {
    quick: false,
    rounds: 5,
    round: Duration::from_secs(2),
    warmup: Duration::from_millis(500),
    hygiene_rounds: 8,
    takeovers: 30,
    held: [1, 1_000, 100_000],
    heartbeat_samples: 200,
    status_samples: 50,
};

const QUICK: Config = Config {
    quick: true,
    rounds: 2,
    round: Duration::from_millis(400),
    warmup: Duration::from_millis(200),
    hygiene_rounds: 4,
    takeovers: 8,
    held: [1, 1_000, 10_000],
    heartbeat_samples: 50,
    status_samples: 10,
};

/// The fenced side's statement: `search_path` is the tenant schema inside `handle.run`.
const FENCED_INSERT: &str = "INSERT INTO tput (client_id, n) VALUES ($1, $2)";
/// The pinned baseline's pin, prepared and pipelined ahead of the work.
const PIN_SQL: &str = "SELECT set_config('search_path', $1, true)";
/// The peer pattern's fencing read (Temporal's shard `range_id` check), pipelined ahead of the
/// work; the transaction commits only if it returned the expected value.
const PEER_SQL: &str = "SELECT range_id FROM baseline.shards WHERE shard_id = $1 FOR SHARE";
const PEER_RANGE: i64 = 7;
/// The real heartbeat (src/protocol/heartbeat.rs).
const HEARTBEAT_SQL: &str = "SELECT pgtenant.heartbeat($1, $2, $3, $4)";
const HEARTBEAT_TTL_MS: i32 = 60_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// One `execute_typed` INSERT (BEGIN, Parse/Bind/Execute, COMMIT: 3 round trips).
    One,
    /// Four `execute_typed` INSERTs per transaction: the fixed cost over more work.
    Four,
    /// pgbench's built-in TPC-B transaction (three UPDATEs, a SELECT, an INSERT), each
    /// statement sent with `execute(&str, …)` as application code does, one tenant per client.
    TpcB,
}

const VARIANTS: [Variant; 3] = [Variant::One, Variant::Four, Variant::TpcB];

impl Variant {
    fn title(self) -> &'static str {
        match self {
            Variant::One => "A. one `tx.execute_typed` INSERT per transaction",
            Variant::Four => "B. four `tx.execute_typed` INSERTs per transaction",
            Variant::TpcB => {
                "C. pgbench's TPC-B transaction, `tx.execute(&str, …)` per statement, one tenant per client"
            }
        }
    }

    /// Its name in machine-readable lines.
    fn name(self) -> &'static str {
        match self {
            Variant::One => "one",
            Variant::Four => "four",
            Variant::TpcB => "tpcb",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `TenantHandle::run` under `Fencing::Session`.
    Session,
    /// `TenantHandle::run` under `Fencing::Transaction`.
    Transaction,
    /// Unfenced, `search_path` pinned per transaction, unqualified table.
    Pinned,
    /// Unfenced, qualified table.
    Bare,
    /// Unfenced, qualified table, a `FOR SHARE` read of a fencing row per transaction.
    Peer,
    /// Pinned as above, on a connection of its own per client, no pool: the limit.
    Direct,
}

const MODES: [Mode; 6] = [
    Mode::Session,
    Mode::Transaction,
    Mode::Pinned,
    Mode::Bare,
    Mode::Peer,
    Mode::Direct,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Transaction => "transaction",
            Mode::Pinned => "pinned",
            Mode::Bare => "bare",
            Mode::Peer => "peer",
            Mode::Direct => "direct",
        }
    }

    fn index(self) -> usize {
        MODES.iter().position(|m| *m == self).expect("a mode")
    }
}

/// The hygiene A/B's workloads: (session fencing?, switching tenants?).
const HYGIENE_KINDS: [(bool, bool); 4] =
    [(true, false), (false, false), (true, true), (false, true)];

fn hygiene_kind_name(kind: (bool, bool)) -> &'static str {
    match kind {
        (true, false) => "session, one tenant",
        (false, false) => "transaction, one tenant",
        (true, true) => "session, two tenants alternating",
        (false, true) => "transaction, two tenants alternating",
    }
}

/// What one round runs.
#[derive(Clone, Copy)]
enum Job {
    Mode(Mode, Variant),
    /// One typed INSERT on the session (or transaction) fencing tenant; with `switching`,
    /// odd transactions go to a second tenant of the same router.
    Hygiene {
        session: bool,
        switching: bool,
    },
}

/// Everything a client task needs.
#[derive(Clone)]
struct Sides {
    session: TenantHandle,
    session2: TenantHandle,
    transaction: TenantHandle,
    transaction2: TenantHandle,
    /// The transaction-fencing router's data pool, used by the unfenced modes.
    pool: Pool,
    /// `INSERT INTO baseline.tput_cN …`
    qualified: Arc<str>,
    /// `INSERT INTO tput_cN …`, under `search_path = baseline`.
    unqualified: Arc<str>,
    shard: i32,
    postmaster: u32,
    /// TPC-B, one tenant per client (by client id): the session router's handles, the
    /// transaction router's, and the unfenced modes' schemas.
    tpcb_session: Arc<Vec<TenantHandle>>,
    tpcb_transaction: Arc<Vec<TenantHandle>>,
    tpcb_schemas: Arc<Vec<String>>,
    /// The direct mode's connections, one per client (by client id), each with its pin
    /// prepared.
    direct: Arc<Vec<tokio::sync::Mutex<(Client, Statement)>>>,
}

/// TPC-B's tables, as pgbench creates them (scale 1, with 1 000 accounts per tenant instead of
/// 100 000: each client has a tenant of its own, so no client waits for another's rows).
const TPCB_TABLES: &str = "
CREATE TABLE pgbench_branches (bid integer PRIMARY KEY, bbalance integer NOT NULL, filler char(88));
CREATE TABLE pgbench_tellers (tid integer PRIMARY KEY, bid integer, tbalance integer NOT NULL, filler char(84));
CREATE TABLE pgbench_accounts (aid integer PRIMARY KEY, bid integer, abalance integer NOT NULL, filler char(84));
CREATE TABLE pgbench_history (tid integer, bid integer, aid integer, delta integer, mtime timestamp, filler char(22));
INSERT INTO pgbench_branches VALUES (1, 0, NULL);
INSERT INTO pgbench_tellers SELECT t, 1, 0, NULL FROM generate_series(1, 10) t;
INSERT INTO pgbench_accounts SELECT a, 1, 0, NULL FROM generate_series(1, 1000) a;";
const TPCB_ACCOUNTS: i64 = 1_000;

/// TPC-B's five statements (pgbench's `tpcb-like` script), unqualified or in `schema`.
fn tpcb_statements(schema: Option<&str>) -> [String; 5] {
    let t = |table: &str| match schema {
        Some(schema) => format!("{schema}.{table}"),
        None => table.to_owned(),
    };
    [
        format!("UPDATE {} SET abalance = abalance + $1 WHERE aid = $2", t("pgbench_accounts")),
        format!("SELECT abalance FROM {} WHERE aid = $1", t("pgbench_accounts")),
        format!("UPDATE {} SET tbalance = tbalance + $1 WHERE tid = $2", t("pgbench_tellers")),
        format!("UPDATE {} SET bbalance = bbalance + $1 WHERE bid = $2", t("pgbench_branches")),
        format!(
            "INSERT INTO {} (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)",
            t("pgbench_history")
        ),
    ]
}

/// One TPC-B transaction's statements on `tx` (any `GenericClient`), with pgbench's random
/// choices drawn from `n`.
async fn tpcb_work(
    tx: &pgtenant::postgres::Transaction<'_>,
    sql: &[String; 5],
    n: i64,
) -> Result<(), pgtenant::postgres::Error> {
    // A cheap deterministic spread over the accounts and tellers (pgbench draws uniformly).
    let mix = n.wrapping_mul(0x9e37_79b9).rem_euclid(1 << 30);
    let aid = i32::try_from(mix % TPCB_ACCOUNTS + 1).expect("aid");
    let tid = i32::try_from(mix % 10 + 1).expect("tid");
    let (bid, delta) = (1_i32, i32::try_from(mix % 10_001 - 5_000).expect("delta"));
    tx.execute(&sql[0], &[&delta, &aid]).await?;
    tx.query(&sql[1], &[&aid]).await?;
    tx.execute(&sql[2], &[&delta, &tid]).await?;
    tx.execute(&sql[3], &[&delta, &bid]).await?;
    tx.execute(&sql[4], &[&tid, &bid, &aid, &delta]).await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        let [_, _, url, replica, ledger, fencing] = &args[..] else {
            panic!("usage: bench_leases child <url> <replica> <ledger> <session|transaction>");
        };
        child(url, replica, ledger, fencing == "session").await;
        return;
    }
    let mut cfg = if args.iter().any(|a| a == "--quick") {
        QUICK
    } else {
        FULL
    };
    // `--rounds=N`: that many throughput rounds per mode, variant and concurrency.
    if let Some(rounds) = args
        .iter()
        .find_map(|a| a.strip_prefix("--rounds="))
        .and_then(|n| n.parse().ok())
    {
        cfg.rounds = rounds;
    }
    // `--hygiene-only`: part 2 alone, at 8 clients (the target's), with twice the rounds.
    let hygiene_only = args.iter().any(|a| a == "--hygiene-only");
    if hygiene_only {
        cfg.hygiene_rounds *= 2;
    }
    let started = Instant::now();
    let mut loads = vec![("start", load_average())];

    let (db, admin) = fresh_database().await;
    let url = db.url().to_owned();
    let server = server_info(&admin).await;
    let backend: i32 = admin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("backend pid")
        .get(0);
    let postmaster = postmaster_of(backend).expect("the server runs on this machine");
    admin
        .batch_execute(
            "CREATE SCHEMA baseline;
             CREATE TABLE baseline.shards (shard_id integer PRIMARY KEY, range_id bigint NOT NULL)",
        )
        .await
        .expect("baseline schema");

    // `--takeover-only`: part 3 alone, with the full run's samples.
    if args.iter().any(|a| a == "--takeover-only") {
        let takeover = bench_takeover(&cfg, &url, &admin).await;
        for result in &takeover {
            println!(
                "takeover {}: samples={} sealed={} bound-rows-left={} seal-retries={}",
                result.name(),
                result.latencies.len(),
                result.sealed,
                result.left,
                result.seal_retries
            );
        }
        for line in summary_lines(&[], &[], &takeover) {
            println!("{line}");
        }
        return;
    }
    eprintln!("[bench] parts 1 and 2: throughput and hygiene");
    let mut throughput = Vec::new();
    let mut hygiene = Vec::new();
    if hygiene_only {
        let (_, row) = bench_clients(&cfg, &url, &admin, 8, postmaster, false).await;
        loads.push(("end", load_average()));
        let mut out = format!(
            "# Session hygiene A/B only (`{COMMAND} -- --hygiene-only`)\n\n- Date: {}\n- Load average (1/5/15 min): {}\n- Wall time: {:.1} s\n\n",
            server.date,
            loads
                .iter()
                .map(|(at, load)| format!("{at} {load}"))
                .collect::<Vec<_>>()
                .join("; "),
            started.elapsed().as_secs_f64()
        );
        render_hygiene(&mut out, &cfg, std::slice::from_ref(&row));
        println!("{out}");
        for line in summary_lines(&[], std::slice::from_ref(&row), &[]) {
            println!("{line}");
        }
        return;
    }
    // `--clients=1,8`: only these concurrencies; `--throughput-only`: part 1 alone.
    let concurrency: Vec<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("--clients="))
        .map(|list| list.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| CONCURRENCY.to_vec());
    let throughput_only = args.iter().any(|a| a == "--throughput-only");
    for clients in concurrency {
        let (rows, row) = bench_clients(&cfg, &url, &admin, clients, postmaster, true).await;
        throughput.extend(rows);
        hygiene.push(row);
        loads.push(("after throughput", load_average()));
    }
    let (takeover, heartbeat) = if throughput_only {
        (Vec::new(), None)
    } else {
        eprintln!("[bench] part 3: takeover");
        let takeover = bench_takeover(&cfg, &url, &admin).await;
        loads.push(("after takeover", load_average()));
        eprintln!("[bench] part 4: heartbeat");
        let heartbeat = bench_heartbeat(&cfg, &url, &admin).await;
        loads.push(("end", load_average()));
        (Vec::from(takeover), Some(heartbeat))
    };

    let wall = started.elapsed();
    let report = render(
        &cfg,
        &server,
        &loads,
        &throughput,
        &hygiene,
        &takeover,
        heartbeat.as_ref(),
        wall,
    );
    println!("{report}");
    let path = "/tmp/bench_leases.md";
    std::fs::write(path, &report).expect("write /tmp/bench_leases.md");
    for line in summary_lines(&throughput, &hygiene, &takeover) {
        println!("{line}");
    }
    eprintln!(
        "[bench] wrote {path} (wall time {:.1} s)",
        wall.as_secs_f64()
    );
    drop(admin);
    drop(db);
}

// ---------------------------------------------------------------------------------------
// Parts 1 and 2: throughput and hygiene, per concurrency
// ---------------------------------------------------------------------------------------

/// One round's numbers.
#[derive(Clone, Copy)]
struct Sample {
    /// Committed transactions per second.
    tps: f64,
    /// CPU microseconds per committed transaction: this process, the server.
    client_us: f64,
    server_us: f64,
}

struct ThroughputRow {
    variant: Variant,
    clients: usize,
    /// Per mode (in [`MODES`] order), per round.
    samples: [Vec<Sample>; 6],
    errors: u64,
}

impl ThroughputRow {
    fn tps(&self, mode: Mode) -> Vec<f64> {
        self.samples[mode.index()].iter().map(|s| s.tps).collect()
    }

    fn median_tps(&self, mode: Mode) -> f64 {
        median(&self.tps(mode))
    }

    /// Ratio of the medians.
    fn ratio(&self, a: Mode, b: Mode) -> f64 {
        self.median_tps(a) / self.median_tps(b)
    }

    /// Median of the per-round ratios (the two modes ran next to each other in each round).
    fn paired(&self, a: Mode, b: Mode) -> f64 {
        paired(&self.tps(a), &self.tps(b))
    }

    /// Median CPU µs per committed transaction of `mode`: the server's or this process's.
    fn cpu(&self, mode: Mode, server: bool) -> f64 {
        median(
            &self.samples[mode.index()]
                .iter()
                .map(|s| if server { s.server_us } else { s.client_us })
                .collect::<Vec<_>>(),
        )
    }
}

struct HygieneRow {
    clients: usize,
    /// [with the scrub, without][kind in HYGIENE_KINDS order], per round.
    samples: [[Vec<Sample>; 4]; 2],
    errors: u64,
}

impl HygieneRow {
    fn tps(&self, on: bool, kind: usize) -> Vec<f64> {
        self.samples[usize::from(!on)][kind]
            .iter()
            .map(|s| s.tps)
            .collect()
    }

    /// With / without, ratio of medians.
    fn ratio(&self, kind: usize) -> f64 {
        median(&self.tps(true, kind)) / median(&self.tps(false, kind))
    }
}

fn paired(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    median(&ratios)
}

async fn start_router(url: &str, name: &str, clients: usize, session: bool) -> Router {
    start_router_on(url, name, clients, session, None).await
}

/// A router on `pool` when given (the unfenced modes share it, so every mode runs on the same
/// connections), else on a pool of its own.
async fn start_router_on(
    url: &str,
    name: &str,
    clients: usize,
    session: bool,
    pool: Option<Pool>,
) -> Router {
    let fencing = if session {
        Fencing::Session
    } else {
        Fencing::Transaction
    };
    let mut options = RouterOptions::from_url(name, url)
        .expect("options")
        .pool_size(clients)
        .fencing(fencing);
    if let Some(pool) = pool {
        options = options.pool(pool);
    }
    let router = Router::start(options).await.expect("router starts");
    assert_eq!(router.summary().fencing, fencing, "fencing in force");
    router
}

async fn open_tenant(router: &Router, ledger: &str) -> TenantHandle {
    let id = TenantId::new("bench", ledger).expect("tenant id");
    let handle = router.open_or_create(&id).await.expect("open tenant");
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(
                    "CREATE TABLE IF NOT EXISTS tput (client_id integer NOT NULL, n bigint NOT NULL)",
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .expect("create tenant table");
    handle
}

async fn tpcb_tenant(router: &Router, ledger: &str) -> TenantHandle {
    let id = TenantId::new("bench", ledger).expect("tenant id");
    let handle = router.open_or_create(&id).await.expect("open tenant");
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(TPCB_TABLES).await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .expect("create the TPC-B tables");
    handle
}

async fn bench_clients(
    cfg: &Config,
    url: &str,
    admin: &Client,
    clients: usize,
    postmaster: u32,
    throughput: bool,
) -> (Vec<ThroughputRow>, HygieneRow) {
    let session_router = start_router(url, &format!("tput-s-c{clients}"), clients, true).await;
    // The data sessions pgtenant asks for (read-only by default); the router checks that.
    let mut config: pgtenant::postgres::Config = url.parse().expect("a connection string");
    config.options("-c default_transaction_read_only=on");
    let manager = pgtenant::pool::Manager::from_config(
        config.clone(),
        NoTls,
        pgtenant::pool::ManagerConfig {
            recycling_method: pgtenant::pool::RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(clients)
        .build()
        .expect("the shared data pool");
    let transaction_router = start_router_on(
        url,
        &format!("tput-t-c{clients}"),
        clients,
        false,
        Some(pool.clone()),
    )
    .await;
    let table = format!("baseline.tput_c{clients}");
    let shard = i32::try_from(clients).expect("shard id");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (client_id integer NOT NULL, n bigint NOT NULL);
             INSERT INTO baseline.shards VALUES ({shard}, {PEER_RANGE})"
        ))
        .await
        .expect("create baseline table");
    // TPC-B: a tenant of its own per client on each router, and a schema of its own per client
    // for the unfenced modes.
    let mut tpcb_session = Vec::new();
    let mut tpcb_transaction = Vec::new();
    let mut tpcb_schemas = Vec::new();
    if throughput {
        for k in 0..clients {
            tpcb_session.push(tpcb_tenant(&session_router, &format!("tpcb-s{clients}-{k}")).await);
            tpcb_transaction
                .push(tpcb_tenant(&transaction_router, &format!("tpcb-t{clients}-{k}")).await);
            let schema = format!("baseline_tpcb_c{clients}_{k}");
            admin
                .batch_execute(&format!(
                    "CREATE SCHEMA {schema}; SET search_path = {schema}; {TPCB_TABLES}; RESET search_path"
                ))
                .await
                .expect("TPC-B baseline schema");
            tpcb_schemas.push(schema);
        }
    }
    let mut direct = Vec::new();
    for _ in 0..clients {
        let (client, connection) = config.connect(NoTls).await.expect("a direct connection");
        tokio::spawn(connection);
        let pin = client.prepare(PIN_SQL).await.expect("prepare the pin");
        direct.push(tokio::sync::Mutex::new((client, pin)));
    }
    let sides = Sides {
        direct: Arc::new(direct),
        tpcb_session: Arc::new(tpcb_session),
        tpcb_transaction: Arc::new(tpcb_transaction),
        tpcb_schemas: Arc::new(tpcb_schemas),
        session: open_tenant(&session_router, &format!("s-c{clients}")).await,
        session2: open_tenant(&session_router, &format!("s2-c{clients}")).await,
        transaction: open_tenant(&transaction_router, &format!("t-c{clients}")).await,
        transaction2: open_tenant(&transaction_router, &format!("t2-c{clients}")).await,
        pool,
        qualified: format!("INSERT INTO {table} (client_id, n) VALUES ($1, $2)").into(),
        unqualified: format!("INSERT INTO tput_c{clients} (client_id, n) VALUES ($1, $2)").into(),
        shard,
        postmaster,
    };

    let mut rows = Vec::new();
    let variants: &[Variant] = if throughput { &VARIANTS } else { &[] };
    for &variant in variants {
        let mut row = ThroughputRow {
            variant,
            clients,
            samples: Default::default(),
            errors: 0,
        };
        for mode in MODES {
            let job = Job::Mode(mode, variant);
            row.errors += round(job, clients, cfg.warmup, &sides).await.1;
        }
        for r in 0..cfg.rounds {
            let mut order = MODES;
            order.rotate_left(r % MODES.len());
            for mode in order {
                let (sample, failed) =
                    round(Job::Mode(mode, variant), clients, cfg.round, &sides).await;
                row.errors += failed;
                row.samples[mode.index()].push(sample);
            }
        }
        eprintln!(
            "[bench]   {} clients={clients}: {}",
            match variant {
                Variant::One => "1",
                Variant::Four => "4",
                Variant::TpcB => "tpcb",
            },
            MODES
                .iter()
                .map(|m| format!("{} {:.0}", m.name(), row.median_tps(*m)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rows.push(row);
    }

    let hygiene = bench_hygiene(cfg, admin, clients, &sides).await;

    drop(sides);
    session_router.close().await;
    transaction_router.close().await;
    (rows, hygiene)
}

/// The fence and enter functions as installed, and the same bodies without the session scrub.
struct HygieneDefs {
    fence_on: String,
    fence_off: String,
    enter_on: String,
    enter_off: String,
}

const FENCE_SIGNATURE: &str = "pgtenant.fence(text,bigint,integer,text,boolean,boolean)";
const ENTER_SIGNATURE: &str = "pgtenant.enter(text, text)";

impl HygieneDefs {
    async fn load(admin: &Client) -> HygieneDefs {
        let def = |signature: &'static str| async move {
            admin
                .query_one(
                    "SELECT pg_get_functiondef($1::text::regprocedure)",
                    &[&signature],
                )
                .await
                .expect("function definition")
                .get::<_, String>(0)
        };
        let fence_on = def(FENCE_SIGNATURE).await;
        let enter_on = def(ENTER_SIGNATURE).await;
        HygieneDefs {
            fence_off: without_scrub(&fence_on),
            enter_off: without_scrub(&enter_on),
            fence_on,
            enter_on,
        }
    }

    async fn install(&self, admin: &Client, on: bool) {
        let (fence, enter) = if on {
            (&self.fence_on, &self.enter_on)
        } else {
            (&self.fence_off, &self.enter_off)
        };
        admin.batch_execute(fence).await.expect("replace fence");
        admin.batch_execute(enter).await.expect("replace enter");
        let scrubs: bool = admin
            .query_one(
                "SELECT bool_and(prosrc LIKE '%reset_session%') FROM pg_proc
                  WHERE oid IN ($1::text::regprocedure, $2::text::regprocedure)",
                &[&FENCE_SIGNATURE, &ENTER_SIGNATURE],
            )
            .await
            .expect("check the installed bodies")
            .get(0);
        assert_eq!(scrubs, on, "the installed fence and enter scrub iff on");
    }
}

/// The function definition without its hygiene block: `IF <the connection changed tenant or
/// role> THEN PERFORM pgtenant.reset_session(p_key); END IF;` (the fence's since V14: `IF NOT
/// p_signalled AND (<the same>) THEN …`).
fn without_scrub(def: &str) -> String {
    let start = def
        .find("IF NOT p_signalled AND (")
        .or_else(|| def.find("IF pg_catalog.current_setting('pgtenant.session_tenant'"))
        .expect("the scrub's condition");
    let reset = start
        + def[start..]
            .find("PERFORM pgtenant.reset_session(p_key);")
            .expect("the scrub");
    let end = reset + def[reset..].find("END IF;").expect("the scrub's end") + "END IF;".len();
    let stripped = format!("{}{}", &def[..start], &def[end..]);
    assert!(!stripped.contains("reset_session"), "one scrub only");
    stripped
}

async fn bench_hygiene(cfg: &Config, admin: &Client, clients: usize, sides: &Sides) -> HygieneRow {
    let defs = HygieneDefs::load(admin).await;
    let mut row = HygieneRow {
        clients,
        samples: Default::default(),
        errors: 0,
    };
    let job = |(session, switching): (bool, bool)| Job::Hygiene { session, switching };
    for on in [false, true] {
        defs.install(admin, on).await;
        for kind in HYGIENE_KINDS {
            row.errors += round(job(kind), clients, cfg.warmup, sides).await.1;
        }
    }
    // On, off, off, on, on, off, … (ABBA); the four workloads rotate within each round.
    let mut installed = true;
    for r in 0..cfg.hygiene_rounds {
        let on = matches!(r % 4, 0 | 3);
        if on != installed {
            defs.install(admin, on).await;
            installed = on;
        }
        let mut order = [0, 1, 2, 3];
        order.rotate_left(r % 4);
        for k in order {
            let (sample, failed) = round(job(HYGIENE_KINDS[k]), clients, cfg.round, sides).await;
            row.errors += failed;
            row.samples[usize::from(!on)][k].push(sample);
        }
    }
    defs.install(admin, true).await;
    eprintln!(
        "[bench]   hygiene clients={clients}: with/without {}",
        (0..4)
            .map(|k| format!(
                "{} {:.3}",
                hygiene_kind_name(HYGIENE_KINDS[k]),
                row.ratio(k)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    row
}

/// One round: `clients` tasks each run transactions back to back until the deadline. Returns
/// the round's numbers and its failed transactions.
async fn round(job: Job, clients: usize, length: Duration, sides: &Sides) -> (Sample, u64) {
    let cpu_before = cpu_seconds_of(sides.postmaster);
    let start = Instant::now();
    let deadline = start + length;
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let sides = sides.clone();
        let client_id = i32::try_from(client).expect("client id");
        tasks.spawn(async move {
            let (mut done, mut failed) = (0_u64, 0_u64);
            let mut n: i64 = 0;
            while Instant::now() < deadline {
                n += 1;
                match one_transaction(job, &sides, client_id, n).await {
                    Ok(()) => done += 1,
                    Err(error) => {
                        if failed == 0 {
                            eprintln!("[bench] transaction failed: {error}");
                        }
                        failed += 1;
                    }
                }
            }
            (done, failed)
        });
    }
    let (mut done, mut failed) = (0_u64, 0_u64);
    while let Some(result) = tasks.join_next().await {
        let (d, f) = result.expect("client task");
        done += d;
        failed += f;
    }
    let elapsed = start.elapsed();
    let (client_us, server_us) = match (cpu_before, cpu_seconds_of(sides.postmaster)) {
        (Some((c0, s0)), Some((c1, s1))) if done > 0 => {
            ((c1 - c0) * 1e6 / done as f64, (s1 - s0) * 1e6 / done as f64)
        }
        _ => (f64::NAN, f64::NAN),
    };
    let sample = Sample {
        tps: done as f64 / elapsed.as_secs_f64(),
        client_us,
        server_us,
    };
    (sample, failed)
}

async fn one_transaction(job: Job, sides: &Sides, client_id: i32, n: i64) -> Result<(), String> {
    let client = usize::try_from(client_id).expect("client id");
    match job {
        Job::Mode(Mode::Session, Variant::TpcB) => {
            tpcb_fenced(&sides.tpcb_session[client], n).await
        }
        Job::Mode(Mode::Transaction, Variant::TpcB) => {
            tpcb_fenced(&sides.tpcb_transaction[client], n).await
        }
        Job::Mode(Mode::Direct, variant) => {
            let mut direct = sides.direct[client].lock().await;
            let (connection, pin) = &mut *direct;
            let (schema, work) = match variant {
                Variant::TpcB => (sides.tpcb_schemas[client].as_str(), DirectWork::TpcB),
                Variant::One | Variant::Four => (
                    "baseline",
                    DirectWork::Inserts {
                        sql: &sides.unqualified,
                        inserts: if variant == Variant::One { 1 } else { 4 },
                        client_id,
                    },
                ),
            };
            direct_tx(connection, pin, schema, work, n).await
        }
        Job::Mode(mode, Variant::TpcB) => {
            let schema = &sides.tpcb_schemas[client];
            let extra = match mode {
                Mode::Pinned => Extra::Pin,
                Mode::Peer => Extra::Peer(sides.shard),
                _ => Extra::None,
            };
            tpcb_plain(&sides.pool, schema, extra, n).await
        }
        Job::Mode(Mode::Session, variant) => fenced_tx(&sides.session, variant, client_id, n).await,
        Job::Mode(Mode::Transaction, variant) => {
            fenced_tx(&sides.transaction, variant, client_id, n).await
        }
        Job::Mode(Mode::Pinned, variant) => {
            let sql = &sides.unqualified;
            plain_tx(&sides.pool, variant, sql, Extra::Pin, client_id, n).await
        }
        Job::Mode(Mode::Bare, variant) => {
            let sql = &sides.qualified;
            plain_tx(&sides.pool, variant, sql, Extra::None, client_id, n).await
        }
        Job::Mode(Mode::Peer, variant) => {
            let sql = &sides.qualified;
            let extra = Extra::Peer(sides.shard);
            plain_tx(&sides.pool, variant, sql, extra, client_id, n).await
        }
        Job::Hygiene { session, switching } => {
            let (first, second) = if session {
                (&sides.session, &sides.session2)
            } else {
                (&sides.transaction, &sides.transaction2)
            };
            let handle = if switching && n % 2 == 1 {
                second
            } else {
                first
            };
            fenced_tx(handle, Variant::One, client_id, n).await
        }
    }
}

async fn fenced_tx(
    handle: &TenantHandle,
    variant: Variant,
    client_id: i32,
    n: i64,
) -> Result<(), String> {
    handle
        .run(move |tx| {
            Box::pin(async move {
                let inserts = if variant == Variant::One { 1 } else { 4 };
                for k in 0..inserts {
                    let n = n * 4 + k;
                    tx.execute_typed(FENCED_INSERT, &[(&client_id, Type::INT4), (&n, Type::INT8)])
                        .await?;
                }
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .map_err(|e| e.to_string())
}

/// TPC-B through `TenantHandle::run`: unqualified names, `search_path` is the tenant's.
async fn tpcb_fenced(handle: &TenantHandle, n: i64) -> Result<(), String> {
    static SQL: std::sync::OnceLock<[String; 5]> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| tpcb_statements(None));
    handle
        .run(move |tx| {
            Box::pin(async move {
                tpcb_work(&tx, sql, n).await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .map_err(|e| e.to_string())
}

/// TPC-B unfenced on the data pool: pinned (`search_path` set per transaction, unqualified
/// names), bare (qualified names) or peer (qualified, and the fencing row's read).
async fn tpcb_plain(pool: &Pool, schema: &str, extra: Extra, n: i64) -> Result<(), String> {
    let sql = match extra {
        Extra::Pin => tpcb_statements(None),
        _ => tpcb_statements(Some(schema)),
    };
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    let statement = match extra {
        Extra::None => None,
        Extra::Pin => Some(client.prepare_cached(PIN_SQL).await),
        Extra::Peer(_) => Some(client.prepare_cached(PEER_SQL).await),
    }
    .transpose()
    .map_err(|e| e.to_string())?;
    let tx = client
        .build_transaction()
        .read_only(false)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let work = tpcb_work(&tx, &sql, n);
    let shard = match extra {
        Extra::Peer(shard) => shard,
        _ => 0,
    };
    let (pin, peer): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 1]) = ([&schema], [&shard]);
    match (extra, &statement) {
        (Extra::Pin, Some(statement)) => {
            tokio::try_join!(tx.query(statement, &pin), work).map_err(|e| e.to_string())?;
        }
        (Extra::Peer(_), Some(statement)) => {
            let (rows, ()) =
                tokio::try_join!(tx.query(statement, &peer), work).map_err(|e| e.to_string())?;
            let range: Option<i64> = rows.first().map(|row| row.get(0));
            if range != Some(PEER_RANGE) {
                return Err(format!("fenced: range_id {range:?}"));
            }
        }
        _ => work.await.map_err(|e| e.to_string())?,
    }
    tx.commit().await.map_err(|e| e.to_string())
}

/// The pinned transaction on a connection of the client's own: the prepared pin pipelined
/// ahead of the work, as in the pinned mode, with no pool in between. `tpcb` runs TPC-B's five
/// statements in the client's schema, else `inserts` INSERTs of `sql`.
async fn direct_tx(
    connection: &mut Client,
    pin: &Statement,
    schema: &str,
    work: DirectWork<'_>,
    n: i64,
) -> Result<(), String> {
    let tx = connection
        .build_transaction()
        .read_only(false)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let params: [&(dyn ToSql + Sync); 1] = [&schema];
    let done = async {
        match work {
            DirectWork::TpcB => tpcb_work(&tx, &tpcb_statements(None), n).await,
            DirectWork::Inserts {
                sql,
                inserts,
                client_id,
            } => {
                for k in 0..inserts {
                    let n = n * 4 + k;
                    tx.execute_typed(sql, &[(&client_id, Type::INT4), (&n, Type::INT8)])
                        .await?;
                }
                Ok(())
            }
        }
    };
    // try_join polls the pin first, so its messages go out ahead of the work's.
    tokio::try_join!(tx.query(pin, &params), done).map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

/// What a direct transaction runs.
enum DirectWork<'a> {
    TpcB,
    Inserts {
        sql: &'a str,
        inserts: i64,
        client_id: i32,
    },
}

/// What an unfenced transaction sends ahead of its work, in the same flight.
#[derive(Clone, Copy)]
enum Extra {
    None,
    /// `set_config('search_path', 'baseline', true)`.
    Pin,
    /// The fencing row's `FOR SHARE` read of this shard, checked before the commit.
    Peer(i32),
}

/// The unfenced transaction on a pooled data connection (`BEGIN READ WRITE`: pgtenant's data
/// sessions default to read-only), the extra statement prepared and pipelined ahead of the work.
async fn plain_tx(
    pool: &Pool,
    variant: Variant,
    sql: &str,
    extra: Extra,
    client_id: i32,
    n: i64,
) -> Result<(), String> {
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    let statement = match extra {
        Extra::None => None,
        Extra::Pin => Some(client.prepare_cached(PIN_SQL).await),
        Extra::Peer(_) => Some(client.prepare_cached(PEER_SQL).await),
    }
    .transpose()
    .map_err(|e| e.to_string())?;
    let tx = client
        .build_transaction()
        .read_only(false)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let work = async {
        let inserts = if variant == Variant::One { 1 } else { 4 };
        for k in 0..inserts {
            let n = n * 4 + k;
            tx.execute_typed(sql, &[(&client_id, Type::INT4), (&n, Type::INT8)])
                .await?;
        }
        Ok::<_, pgtenant::postgres::Error>(())
    };
    let schema = "baseline";
    let shard = match extra {
        Extra::Peer(shard) => shard,
        _ => 0,
    };
    let (param, statement): (&(dyn ToSql + Sync), _) = match (extra, &statement) {
        (Extra::Pin, Some(statement)) => (&schema, statement),
        (Extra::Peer(_), Some(statement)) => (&shard, statement),
        _ => {
            work.await.map_err(|e| e.to_string())?;
            return tx.commit().await.map_err(|e| e.to_string());
        }
    };
    // try_join polls the extra statement first, so its messages go out ahead of the work's.
    let params = [param];
    let (rows, ()) =
        tokio::try_join!(tx.query(statement, &params), work).map_err(|e| e.to_string())?;
    if let Extra::Peer(_) = extra {
        let range: Option<i64> = rows.first().map(|row| row.get(0));
        if range != Some(PEER_RANGE) {
            return Err(format!("fenced: range_id {range:?}"));
        }
    }
    tx.commit().await.map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// Part 3: takeover after the owner process is SIGKILLed
// ---------------------------------------------------------------------------------------

/// The owner process: opens the tenant, creates its table, binds `CHILD_POOL` data sessions
/// (that many transactions at once), says "ready", then waits forever.
async fn child(url: &str, replica: &str, ledger: &str, session: bool) {
    let fencing = if session {
        Fencing::Session
    } else {
        Fencing::Transaction
    };
    let router = Router::start(
        RouterOptions::from_url(replica, url)
            .expect("options")
            .ttl(CHILD_TTL)
            .pool_size(CHILD_POOL)
            .fencing(fencing),
    )
    .await
    .expect("child router starts");
    let id = TenantId::new("takeover", ledger).expect("tenant id");
    let handle = router
        .open_or_create(&id)
        .await
        .expect("child opens tenant");
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute("CREATE TABLE IF NOT EXISTS takeover_log (n bigint NOT NULL)")
                    .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .expect("child creates its table");
    let mut writers = JoinSet::new();
    for k in 0..CHILD_POOL {
        let handle = handle.clone();
        let k = i64::try_from(k).expect("k");
        writers.spawn(async move {
            handle
                .run(move |tx| {
                    Box::pin(async move {
                        tx.execute("SELECT pg_sleep(0.05)", &[]).await?;
                        tx.execute("INSERT INTO takeover_log (n) VALUES ($1)", &[&k])
                            .await?;
                        Ok::<_, pgtenant::Error>(())
                    })
                })
                .await
        });
    }
    while let Some(written) = writers.join_next().await {
        written.expect("writer").expect("child writes");
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready").expect("stdout");
        out.flush().expect("stdout");
    }
    std::future::pending::<()>().await;
    drop((router, handle));
}

struct TakeoverResult {
    session: bool,
    latencies: Vec<Duration>,
    attempts: Vec<u32>,
    /// Data sessions bound to the owner's incarnation when it was killed.
    bound: Vec<i64>,
    /// Takeovers after which the dead incarnation was sealed.
    sealed: usize,
    /// Bound sessions of dead owners left in `pgtenant.sessions` after the takeovers.
    left: i64,
    /// Open attempts refused with `Error::SealIncomplete` (retried).
    seal_retries: u32,
}

impl TakeoverResult {
    fn name(&self) -> &'static str {
        if self.session {
            "session"
        } else {
            "transaction"
        }
    }
}

/// The takeover configurations: session fencing or not.
const TAKEOVER_KINDS: [bool; 2] = [true, false];

async fn bench_takeover(cfg: &Config, url: &str, admin: &Client) -> [TakeoverResult; 2] {
    let exe = std::env::current_exe().expect("current exe");
    let mut survivors = Vec::new();
    for session in [true, false] {
        let name = if session {
            "takeover-survivor-s"
        } else {
            "takeover-survivor-t"
        };
        let fencing = if session {
            Fencing::Session
        } else {
            Fencing::Transaction
        };
        survivors.push(
            Router::start(
                RouterOptions::from_url(name, url)
                    .expect("options")
                    .ttl(CHILD_TTL)
                    .pool_size(4)
                    .fencing(fencing),
            )
            .await
            .expect("survivor router starts"),
        );
    }
    let mut results = TAKEOVER_KINDS.map(|session| TakeoverResult {
        session,
        latencies: Vec::new(),
        attempts: Vec::new(),
        bound: Vec::new(),
        sealed: 0,
        left: 0,
        seal_retries: 0,
    });
    for i in 0..cfg.takeovers {
        // Interleaved, rotating which configuration goes first.
        let mut order = [0, 1];
        order.rotate_left(i % 2);
        for k in order {
            let session = TAKEOVER_KINDS[k];
            let tag = if session { "s" } else { "t" };
            let ledger = format!("{tag}{i}");
            let replica = format!("takeover-owner-{tag}{i}");
            let fencing = if session { "session" } else { "transaction" };
            let mut owner = tokio::process::Command::new(&exe)
                .args(["child", url, &replica, &ledger, fencing])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn owner process");
            let stdout = owner.stdout.take().expect("owner stdout");
            let mut lines = BufReader::new(stdout).lines();
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("owner ready in time")
                .expect("read owner stdout");
            assert_eq!(line.as_deref(), Some("ready"), "owner process failed");
            let bound: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pgtenant.sessions WHERE replica_id = $1",
                    &[&replica],
                )
                .await
                .expect("count bound sessions")
                .get(0);
            let id = TenantId::new("takeover", &ledger).expect("tenant id");
            let router = &survivors[usize::from(!session)];

            let killed_at = Instant::now();
            owner.start_kill().expect("SIGKILL owner");
            let (mut attempts, mut seal_retries) = (0_u32, 0_u32);
            let handle = loop {
                attempts += 1;
                match router.open(&id).await {
                    Ok(handle) => break handle,
                    Err(pgtenant::Error::LeaseHeld { .. }) => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    // Retryable; counted (see the report).
                    Err(error @ pgtenant::Error::SealIncomplete { .. }) => {
                        eprintln!("[bench]   takeover of {id}: {error}");
                        seal_retries += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(error) => panic!("takeover of {id} failed: {error}"),
                }
            };
            handle
                .run(|tx| {
                    Box::pin(async move {
                        tx.execute("INSERT INTO takeover_log (n) VALUES ($1)", &[&-1_i64])
                            .await?;
                        Ok::<_, pgtenant::Error>(())
                    })
                })
                .await
                .expect("fenced insert after takeover");
            let latency = killed_at.elapsed();
            owner.wait().await.expect("reap owner");
            let (sealed, left): (bool, i64) = admin
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pgtenant.seals s
                                     WHERE s.replica_id = r.replica_id AND s.incarnation = r.incarnation),
                            (SELECT count(*) FROM pgtenant.sessions s WHERE s.replica_id = r.replica_id)
                       FROM pgtenant.replicas r WHERE r.replica_id = $1",
                    &[&replica],
                )
                .await
                .map(|row| (row.get(0), row.get(1)))
                .expect("seal state");
            if session && !sealed {
                eprintln!(
                    "[bench]   takeover of {id}: the dead owner's incarnation was NOT sealed"
                );
            }
            let result = &mut results[k];
            result.latencies.push(latency);
            result.attempts.push(attempts);
            result.seal_retries += seal_retries;
            result.bound.push(bound);
            result.sealed += usize::from(sealed);
            result.left += left;
            handle.release().await.expect("release");
        }
    }
    for router in survivors {
        router.close().await;
    }
    results
}

// ---------------------------------------------------------------------------------------
// Part 4: heartbeat cost against held tenants
// ---------------------------------------------------------------------------------------

struct HeartbeatResult {
    /// (held tenants, heartbeat samples) per replica.
    rows: Vec<(i64, Vec<Duration>)>,
    status: Vec<Duration>,
    status_no_jit: Vec<Duration>,
    plan_note: String,
}

/// One replica registered by hand on its own connection (liveness lock, `pgtenant.register`),
/// as a lease session does.
struct HandRegistered {
    held: i64,
    replica: String,
    incarnation: i64,
    secret: String,
    client: Client,
}

async fn bench_heartbeat(cfg: &Config, url: &str, admin: &Client) -> HeartbeatResult {
    let mut replicas = Vec::new();
    for held in cfg.held {
        let replica = format!("heartbeat-{held}");
        let (client, connection) = pgtenant::postgres::connect(url, NoTls)
            .await
            .expect("connect a lease session");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let locked: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock(pgtenant.lock_namespace(), pgtenant.replica_lock_key($1))",
                &[&replica],
            )
            .await
            .expect("take the liveness lock")
            .get(0);
        assert!(locked, "the liveness lock of {replica} is free");
        let row = client
            .query_one(
                "SELECT incarnation, secret FROM pgtenant.register($1, $2, NULL)",
                &[&replica, &HEARTBEAT_TTL_MS],
            )
            .await
            .expect("register");
        let (incarnation, secret): (i64, String) = (row.get(0), row.get(1));
        admin
            .execute(
                "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, owner, owner_incarnation)
                 SELECT $1 || '/l' || g, $1, 'l' || g, NULL, 1, $2, $3
                   FROM generate_series(1, $4::bigint) AS g",
                &[&format!("hb{held}"), &replica, &incarnation, &held],
            )
            .await
            .expect("insert held tenants");
        replicas.push(HandRegistered {
            held,
            replica,
            incarnation,
            secret,
            client,
        });
    }
    admin
        .batch_execute("VACUUM ANALYZE pgtenant.tenants")
        .await
        .expect("vacuum analyze");
    for r in &replicas {
        let counted: i64 = admin
            .query_one(
                "SELECT tenants_held FROM pgtenant.replica_status WHERE replica_id = $1",
                &[&r.replica],
            )
            .await
            .expect("replica_status")
            .get(0);
        assert_eq!(counted, r.held, "replica_status counts the held tenants");
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); replicas.len()];
    for i in 0..cfg.heartbeat_samples + 20 {
        for k in 0..replicas.len() {
            let j = (i + k) % replicas.len();
            let elapsed = heartbeat_once(&replicas[j]).await;
            if i >= 20 {
                samples[j].push(elapsed);
            }
        }
    }
    let status = time_status(admin, cfg.status_samples).await;
    let plan_note = explain_status(admin).await;
    admin.batch_execute("SET jit = off").await.expect("jit off");
    let status_no_jit = time_status(admin, cfg.status_samples).await;
    admin.batch_execute("RESET jit").await.expect("reset jit");
    HeartbeatResult {
        rows: replicas.iter().map(|r| r.held).zip(samples).collect(),
        status,
        status_no_jit,
        plan_note,
    }
}

/// One `pgtenant.heartbeat` call on the replica's own session, timed; it must renew.
async fn heartbeat_once(r: &HandRegistered) -> Duration {
    let t = Instant::now();
    let renewed: bool = r
        .client
        .query_typed(
            HEARTBEAT_SQL,
            &[
                (&r.replica, Type::TEXT),
                (&r.incarnation, Type::INT8),
                (&r.secret, Type::TEXT),
                (&HEARTBEAT_TTL_MS, Type::INT4),
            ],
        )
        .await
        .expect("heartbeat")
        .first()
        .expect("one row")
        .get(0);
    let elapsed = t.elapsed();
    assert!(renewed, "the heartbeat renewed");
    elapsed
}

/// `SELECT * FROM pgtenant.replica_status`, timed `samples` times after 5 untimed runs.
async fn time_status(admin: &Client, samples: usize) -> Vec<Duration> {
    let mut status = Vec::with_capacity(samples);
    for i in 0..samples + 5 {
        let t = Instant::now();
        admin
            .query("SELECT * FROM pgtenant.replica_status", &[])
            .await
            .expect("replica_status");
        if i >= 5 {
            status.push(t.elapsed());
        }
    }
    status
}

/// What EXPLAIN ANALYZE says about replica_status: execution time and JIT time.
async fn explain_status(admin: &Client) -> String {
    let lines: Vec<String> = admin
        .query(
            "EXPLAIN (ANALYZE, FORMAT TEXT) SELECT * FROM pgtenant.replica_status",
            &[],
        )
        .await
        .expect("explain replica_status")
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect();
    let find = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .map(|l| l.trim().to_owned())
    };
    let execution = find("Execution Time").unwrap_or_default();
    let jit = find("Timing: Generation")
        .and_then(|l| l.split("Total").nth(1).map(|t| t.trim().to_owned()))
        .map_or_else(|| "no JIT".to_owned(), |total| format!("JIT {total}"));
    format!("{execution}; {jit}")
}

// ---------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------

fn list(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn yes(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "no"
    }
}

/// The machine-readable lines: one per concurrency for one INSERT (`fence-bench:`), for four
/// (`fence-bench-4:`), for hygiene (`hygiene-bench:`), and one per fencing for takeover.
fn summary_lines(
    throughput: &[ThroughputRow],
    hygiene: &[HygieneRow],
    takeover: &[TakeoverResult],
) -> Vec<String> {
    let mut lines = Vec::new();
    // Medians of the per-round ratios (the modes of a round ran next to each other).
    for (variant, prefix) in [
        (Variant::One, "fence-bench"),
        (Variant::Four, "fence-bench-4"),
        (Variant::TpcB, "fence-bench-tpcb"),
    ] {
        for row in throughput.iter().filter(|r| r.variant == variant) {
            lines.push(format!(
                "{prefix}: clients={} session/pinned={:.3} transaction/pinned={:.3} bare/pinned={:.3} peer/pinned={:.3} session/peer={:.3} pinned/direct={:.3} session/direct={:.3} rounds={}",
                row.clients,
                row.paired(Mode::Session, Mode::Pinned),
                row.paired(Mode::Transaction, Mode::Pinned),
                row.paired(Mode::Bare, Mode::Pinned),
                row.paired(Mode::Peer, Mode::Pinned),
                row.paired(Mode::Session, Mode::Peer),
                row.paired(Mode::Pinned, Mode::Direct),
                row.paired(Mode::Session, Mode::Direct),
                row.tps(Mode::Session).len(),
            ));
        }
    }
    // CPU µs per committed transaction, per mode: this process (pgtenant, the pool and the
    // driver; session or transaction − pinned is pgtenant's own, pinned − direct the pool's)
    // and the server.
    for row in throughput {
        for (side, server) in [("client_us", false), ("server_us", true)] {
            lines.push(format!(
                "fence-bench-cpu: variant={} clients={} {side} {}",
                row.variant.name(),
                row.clients,
                MODES
                    .iter()
                    .map(|m| format!("{}={:.0}", m.name(), row.cpu(*m, server)))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
    }
    for row in hygiene {
        lines.push(format!(
            "hygiene-bench: clients={} session={:.3} transaction={:.3} session-switching={:.3} transaction-switching={:.3}",
            row.clients,
            row.ratio(0),
            row.ratio(1),
            row.ratio(2),
            row.ratio(3),
        ));
    }
    for t in takeover {
        lines.push(format!(
            "takeover-bench: fencing={} samples={} p50_ms={:.1} p99_ms={:.1}",
            t.name(),
            t.latencies.len(),
            ms(median_d(&t.latencies)),
            ms(percentile_d(&t.latencies, 99.0)),
        ));
    }
    lines
}

#[allow(clippy::too_many_arguments)]
fn render(
    cfg: &Config,
    server: &ServerInfo,
    loads: &[(&str, String)],
    throughput: &[ThroughputRow],
    hygiene: &[HygieneRow],
    takeover: &[TakeoverResult],
    heartbeat: Option<&HeartbeatResult>,
    wall: Duration,
) -> String {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = cpu_model().unwrap_or_else(|| "unknown".to_owned());
    let command = if cfg.quick {
        format!("{COMMAND} -- --quick")
    } else {
        COMMAND.to_owned()
    };
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "# Leases: fencing throughput, hygiene, takeover, heartbeat\n"
    );
    let _ = writeln!(
        w,
        "Reproduce with `{COMMAND}` (needs PostgreSQL on 127.0.0.1:5432, trust auth; \
         source: examples/bench_leases.rs; `-- --quick` for a short smoke run).\n"
    );
    let _ = writeln!(w, "- Command: `{command}`");
    let _ = writeln!(w, "- Date: {}", server.date);
    let _ = writeln!(
        w,
        "- Machine: nproc = {nproc} ({cpu}); shared and noisy, the benchmark and PostgreSQL share the cores"
    );
    let _ = writeln!(
        w,
        "- Load average (1/5/15 min): {}",
        loads
            .iter()
            .map(|(at, load)| format!("{at} {load}"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let _ = writeln!(w, "- PostgreSQL: {}", server.pg_version);
    let _ = writeln!(w, "- Server settings: {}", server.settings);
    let _ = writeln!(
        w,
        "- Wall time of the whole run: {:.1} s\n",
        wall.as_secs_f64()
    );

    let _ = writeln!(w, "### 1. Fenced, pinned, bare and peer throughput\n");
    let _ = writeln!(
        w,
        "Each transaction: BEGIN; one (A) or four (B) `INSERT INTO <table> (client_id, n) VALUES ($1, $2)` \
         sent with `execute_typed`; COMMIT. **session**: `TenantHandle::run` on a router with \
         `Fencing::Session` (`BEGIN READ WRITE`, the pin — `set_config` of `search_path`, read-write \
         and the commit check's setting, the statement pinned does with one setting — pipelined \
         ahead of the work, the commit check and `COMMIT` in one message). **transaction**: the same on \
         a router with `Fencing::Transaction` (`pgtenant.fence(key, epoch, lock, idle, read_only, \
         signalled)` instead of the pin). The \
         unfenced modes run on the transaction router's data pool (given to it with `RouterOptions::pool`, same size, \
         same connections, `BEGIN READ WRITE`): **pinned** pipelines a prepared \
         `set_config('search_path', 'baseline', true)` ahead of the INSERT into an unqualified table, \
         as any schema-per-tenant application must; **bare** inserts into the fully qualified table; \
         **peer** pipelines a prepared `SELECT range_id FROM baseline.shards WHERE shard_id = $1 FOR \
         SHARE` (one fencing row per shard, shared by every client, as Temporal's shard check) ahead \
         of the bare INSERT and commits only if it read the expected range_id; **direct** is pinned \
         on a connection of each client's own, no pool (the limit a pool can approach). Pool size = \
         clients. {} rounds of {} ms per mode, variant and concurrency, the order of the six modes rotating \
         every round, after a {} ms warm-up of each. Values are committed tx/s (median over rounds); \
         ratios are ratios of those medians, with the median of the per-round ratios in parentheses. \
         Targets (DESIGN §8): session ≥ 0.97 × pinned with one INSERT; transaction ≥ 0.95 × pinned \
         with four.\n",
        cfg.rounds,
        cfg.round.as_millis(),
        cfg.warmup.as_millis()
    );
    for variant in VARIANTS {
        let _ = writeln!(w, "#### {}\n", variant.title());
        let _ = writeln!(
            w,
            "| clients | session | transaction | pinned | bare | peer | direct | session / pinned | transaction / pinned | bare / pinned | peer / pinned | session / bare | session / peer | pinned / direct | target met | failed tx |"
        );
        let _ = writeln!(
            w,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|"
        );
        for row in throughput.iter().filter(|r| r.variant == variant) {
            let both =
                |a: Mode, b: Mode| format!("{:.3} ({:.3})", row.ratio(a, b), row.paired(a, b));
            let met = match variant {
                Variant::One => row.paired(Mode::Session, Mode::Pinned) >= 0.97,
                Variant::Four => row.paired(Mode::Transaction, Mode::Pinned) >= 0.95,
                Variant::TpcB => {
                    row.paired(Mode::Session, Mode::Pinned) >= 0.97
                        && row.paired(Mode::Transaction, Mode::Pinned) >= 0.95
                }
            };
            let _ = writeln!(
                w,
                "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.clients,
                row.median_tps(Mode::Session),
                row.median_tps(Mode::Transaction),
                row.median_tps(Mode::Pinned),
                row.median_tps(Mode::Bare),
                row.median_tps(Mode::Peer),
                row.median_tps(Mode::Direct),
                both(Mode::Session, Mode::Pinned),
                both(Mode::Transaction, Mode::Pinned),
                both(Mode::Bare, Mode::Pinned),
                both(Mode::Peer, Mode::Pinned),
                both(Mode::Session, Mode::Bare),
                both(Mode::Session, Mode::Peer),
                both(Mode::Pinned, Mode::Direct),
                match variant {
                    Variant::One => format!("session: {}", yes(met)),
                    Variant::Four => format!("transaction: {}", yes(met)),
                    Variant::TpcB => format!("both: {}", yes(met)),
                },
                row.errors
            );
        }
        let _ = writeln!(
            w,
            "\nCPU per committed transaction (µs, median over rounds; client = this process, \
             server = the postmaster under test and its children): on separate machines the \
             server's CPU bounds throughput.\n"
        );
        let _ = writeln!(
            w,
            "| clients | client: session | transaction | pinned | bare | peer | direct | server: session | transaction | pinned | bare | peer | direct | server pinned / session |"
        );
        let _ = writeln!(
            w,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for row in throughput.iter().filter(|r| r.variant == variant) {
            let cpu = |mode: Mode, server: bool| row.cpu(mode, server);
            let mut line = format!("| {} |", row.clients);
            for server in [false, true] {
                for mode in MODES {
                    let _ = write!(line, " {:.0} |", cpu(mode, server));
                }
            }
            let _ = writeln!(
                w,
                "{line} {:.3} |",
                cpu(Mode::Pinned, true) / cpu(Mode::Session, true)
            );
        }
        let _ = writeln!(w, "\nPer-round tx/s (medians above):\n");
        for row in throughput.iter().filter(|r| r.variant == variant) {
            let _ = writeln!(
                w,
                "- {} clients: {}",
                row.clients,
                MODES
                    .iter()
                    .map(|m| format!("{} [{}]", m.name(), list(&row.tps(*m))))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        let _ = writeln!(w);
    }

    render_hygiene(w, cfg, hygiene);
    // `--throughput-only` ran parts 1 and 2 alone.
    let Some(heartbeat) = heartbeat else {
        return out;
    };

    let _ = writeln!(
        w,
        "### 3. Takeover latency after the owner process dies, both fencings\n"
    );
    let _ = writeln!(
        w,
        "Real processes: for each of {} iterations per configuration a fresh \
         tenant is opened by a child process (this example re-executed as `bench_leases child <url> \
         <replica> <ledger> <fencing>`, Router ttl {} s, pool {CHILD_POOL}) that runs {CHILD_POOL} \
         transactions at once (so under session fencing {CHILD_POOL} data sessions are bound to its \
         incarnation and then idle), prints `ready` and sleeps. The parent counts the bound sessions, \
         SIGKILLs the child, then loops `router.open(&id)` on a survivor router of the same fencing \
         (retrying after 1 ms on `Error::LeaseHeld`, and on `Error::SealIncomplete`, which is \
         retryable and counted below) and runs one fenced INSERT. Under session \
         fencing the acquisition seals the dead incarnation and terminates (and waits for) its bound \
         backends before the epoch moves; each such takeover is checked to have sealed it. Sealing signals every bound backend, then waits for all together, \
         polling every 1 ms (V7; V5 waited 100 ms per backend); the two configurations interleaved, rotating. \
         Time = from just before the SIGKILL to that INSERT's commit. Nearest-rank percentiles (with 30 \
         samples p99 is the maximum).\n",
        cfg.takeovers,
        CHILD_TTL.as_secs()
    );
    let _ = writeln!(
        w,
        "| fencing | samples | min | median | p90 | p99 | max | open attempts (median / max) | bound sessions at the kill (median) | sealed | bound rows left | `SealIncomplete` retries | p99 < 100 ms |"
    );
    let _ = writeln!(
        w,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"
    );
    for t in takeover {
        let lat = &t.latencies;
        let p99 = percentile_d(lat, 99.0);
        let mut attempts = t.attempts.clone();
        attempts.sort_unstable();
        let mut bound = t.bound.clone();
        bound.sort_unstable();
        let _ = writeln!(
            w,
            "| {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {} / {} | {} | {} of {} | {} | {} | {} |",
            t.name(),
            lat.len(),
            ms(percentile_d(lat, 0.0)),
            ms(median_d(lat)),
            ms(percentile_d(lat, 90.0)),
            ms(p99),
            ms(percentile_d(lat, 100.0)),
            attempts[attempts.len() / 2],
            attempts[attempts.len() - 1],
            bound[bound.len() / 2],
            t.sealed,
            lat.len(),
            t.left,
            t.seal_retries,
            yes(p99 < Duration::from_millis(100)),
        );
    }
    let _ = writeln!(w);
    for t in takeover {
        let _ = writeln!(
            w,
            "- {} samples (ms): {}",
            t.name(),
            t.latencies
                .iter()
                .map(|d| format!("{:.1}", ms(*d)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(w);

    let _ = writeln!(w, "### 4. Heartbeat cost against held tenants\n");
    let _ = writeln!(
        w,
        "Three replicas, each registered by hand on its own connection as a lease session does \
         (liveness lock, `pgtenant.register(replica, ttl, NULL)`, which issues the incarnation's \
         secret), made to hold {} tenants by inserting rows into `pgtenant.tenants` (owner = the \
         replica and incarnation, schema_name NULL; `VACUUM ANALYZE` after; `replica_status.tenants_held` \
         checked). Each sample is one real `SELECT pgtenant.heartbeat(replica, incarnation, secret, \
         ttl)` (`query_typed`: TEXT, INT8, TEXT, INT4, as src/protocol/heartbeat.rs sends it) on the replica's own \
         session, which must return true (a renewal); the three replicas' heartbeats are sent round \
         robin, rotating which goes first, {} timed each after 20 untimed rounds. Then `SELECT * FROM \
         pgtenant.replica_status` (all {} tenants) is timed {} times after 5 untimed, with the default \
         jit setting and with `SET jit = off`. Client-side round trips on 127.0.0.1.\n",
        cfg.held
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(" / "),
        cfg.heartbeat_samples,
        cfg.held.iter().sum::<i64>(),
        cfg.status_samples
    );
    let _ = writeln!(
        w,
        "| held tenants | heartbeat median | heartbeat p90 | heartbeat p99 |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|");
    for (held, samples) in &heartbeat.rows {
        let _ = writeln!(
            w,
            "| {held} | {:.3} ms | {:.3} ms | {:.3} ms |",
            ms(median_d(samples)),
            ms(percentile_d(samples, 90.0)),
            ms(percentile_d(samples, 99.0))
        );
    }
    if let (Some((h1, s1)), Some((hn, sn))) = (heartbeat.rows.first(), heartbeat.rows.last()) {
        let _ = writeln!(
            w,
            "\nRatio {hn} / {h1} held: heartbeat median ×{:.2}, p99 ×{:.2}.",
            median_d(sn).as_secs_f64() / median_d(s1).as_secs_f64(),
            percentile_d(sn, 99.0).as_secs_f64() / percentile_d(s1, 99.0).as_secs_f64()
        );
    }
    let _ = writeln!(
        w,
        "\n`replica_status`: median {:.3} ms, p99 {:.3} ms; with `SET jit = off` median {:.3} ms. \
         EXPLAIN ANALYZE: {}.",
        ms(median_d(&heartbeat.status)),
        ms(percentile_d(&heartbeat.status, 99.0)),
        ms(median_d(&heartbeat.status_no_jit)),
        heartbeat.plan_note
    );
    out
}

/// Part 2 of the report.
fn render_hygiene(w: &mut String, cfg: &Config, hygiene: &[HygieneRow]) {
    let _ = writeln!(w, "### 2. Session hygiene A/B\n");
    let _ = writeln!(
        w,
        "The fence (`{FENCE_SIGNATURE}`) and the session-fencing entry (`{ENTER_SIGNATURE}`) \
         begin with the session scrub of issue #8: `IF <the connection's tenant, role or session user \
         changed> THEN PERFORM pgtenant.reset_session(key); END IF;` (three `current_setting` \
         comparisons on every transaction; the reset itself only when the connection changes tenant \
         or role). **with**: the functions as installed. **without**: the same bodies without that \
         block (`pg_get_functiondef` minus the block, installed with `CREATE OR REPLACE` between \
         rounds; everything else, the marker cursor and `READ WRITE` included, is the same). Same \
         routers and tenants as part 1, one typed INSERT per transaction through `TenantHandle::run`; \
         **one tenant**: every transaction on one tenant (the reset never fires after a connection's \
         first transaction); **two tenants alternating**: each client alternates between two tenants \
         of the same router, so a connection often changes tenant and the reset fires (the worst case \
         of this mechanism). {} rounds of {} ms per workload, with/without in ABBA order (with, \
         without, without, with, …), the four workloads rotating within each round, after a warm-up \
         of each. Target (issue #8): hygiene costs at most 3 % at 8 clients, i.e. with / without ≥ \
         0.97.\n",
        cfg.hygiene_rounds,
        cfg.round.as_millis()
    );
    let _ = writeln!(
        w,
        "| clients | workload | with tx/s | without tx/s | with / without | per-round median | server µs/tx with | without | target met (8 clients) |"
    );
    let _ = writeln!(w, "|---:|---|---:|---:|---:|---:|---:|---:|:---:|");
    for row in hygiene {
        for (k, kind) in HYGIENE_KINDS.iter().enumerate() {
            let server = |on: bool| {
                median(
                    &row.samples[usize::from(!on)][k]
                        .iter()
                        .map(|s| s.server_us)
                        .collect::<Vec<_>>(),
                )
            };
            let ratio = row.ratio(k);
            let _ = writeln!(
                w,
                "| {} | {} | {:.0} | {:.0} | {ratio:.3} | {:.3} | {:.0} | {:.0} | {} |",
                row.clients,
                hygiene_kind_name(*kind),
                median(&row.tps(true, k)),
                median(&row.tps(false, k)),
                paired(&row.tps(true, k), &row.tps(false, k)),
                server(true),
                server(false),
                if row.clients == 8 {
                    yes(ratio >= 0.97)
                } else {
                    "—"
                },
            );
        }
    }
    let _ = writeln!(w, "\nPer-round tx/s, with | without:\n");
    for row in hygiene {
        for (k, kind) in HYGIENE_KINDS.iter().enumerate() {
            let _ = writeln!(
                w,
                "- {} clients, {}: [{}] | [{}]; failed tx {}",
                row.clients,
                hygiene_kind_name(*kind),
                list(&row.tps(true, k)),
                list(&row.tps(false, k)),
                row.errors
            );
        }
    }
    let _ = writeln!(w);
}
