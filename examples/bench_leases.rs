//! Benchmarks of pgtenant's lease machinery against a plain tokio-postgres baseline.
//!
//! Run with `cargo run --release --example bench_leases` (PostgreSQL on 127.0.0.1:5432, or
//! whatever `pgtenant_testkit::TestDatabase::create` finds). It measures, in one run:
//!
//! 1. throughput of a fenced transaction (`TenantHandle::run`) against the identical unfenced
//!    tokio-postgres transaction (bare, and with `search_path` pinned as a schema-per-tenant
//!    application pins it), at 1, 8 and 32 concurrent clients, rounds interleaved, with the
//!    client's and the server's CPU time per transaction;
//! 2. takeover latency after the owning replica process is SIGKILLed (the example re-executes
//!    itself as the owner: `bench_leases child <url> <replica> <ledger>`);
//! 3. the cost of the heartbeat statement with 1, 1 000 and 100 000 held tenants.
//!
//! It prints a Markdown report and writes it to `/tmp/bench_leases.md` (BENCHMARKS.md collects the three reports).

#[path = "common/mod.rs"]
mod common;

use common::{
    cpu_model, cpu_seconds, fresh_database, median, median_d, ms, percentile_d, server_info,
    ServerInfo,
};
use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtenant::pool::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use pgtenant::postgres::types::Type;
use pgtenant::postgres::NoTls;
use pgtenant::{Router, RouterOptions, TenantHandle, TenantId};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinSet;

const COMMAND: &str = "cargo run --release --example bench_leases";
const CONCURRENCY: [usize; 3] = [1, 8, 32];
const ROUNDS: usize = 5;
const ROUND: Duration = Duration::from_secs(2);
const WARMUP: Duration = Duration::from_millis(500);
const TAKEOVERS: usize = 30;
const CHILD_TTL: Duration = Duration::from_secs(2);
const HEARTBEAT_SAMPLES: usize = 200;
const STATUS_SAMPLES: usize = 50;
const HELD: [i64; 3] = [1, 1_000, 100_000];

/// The fenced side's statement: `search_path` is the tenant schema inside `handle.run`.
const FENCED_INSERT: &str = "INSERT INTO tput (client_id, n) VALUES ($1, $2)";

/// `HEARTBEAT_SQL` of src/liveness.rs without `AND backend_pid = pg_backend_pid()`: only the
/// lease session itself could satisfy that condition.
const HEARTBEAT_EQUIVALENT_SQL: &str = "UPDATE pgtenant.replicas
        SET expires_at = clock_timestamp() + $3::integer * interval '1 millisecond'
      WHERE replica_id = $1 AND incarnation = $2 AND released_at IS NULL
        AND expires_at > clock_timestamp()
  RETURNING incarnation";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// `tx.execute(&str, ..)`: prepare, then execute (two round trips for the INSERT).
    Prepared,
    /// `tx.execute_typed(&str, ..)`: one round trip for the INSERT.
    Typed,
    /// Four `execute_typed` INSERTs per transaction: the fence's fixed cost over more work.
    Batch4,
}

/// Every variant, in report order.
const VARIANTS: [Variant; 3] = [Variant::Prepared, Variant::Typed, Variant::Batch4];

impl Variant {
    fn title(self) -> &'static str {
        match self {
            Variant::Prepared => {
                "A. `tx.execute(&str, ..)` on both sides (prepare + execute: BEGIN, Parse/Describe, Bind/Execute, COMMIT = 4 round trips)"
            }
            Variant::Typed => {
                "B. `tx.execute_typed(&str, ..)` on both sides (BEGIN, Parse/Bind/Execute, COMMIT = 3 round trips)"
            }
            Variant::Batch4 => {
                "C. four `tx.execute_typed(&str, ..)` INSERTs per transaction on both sides (BEGIN, 4 × Parse/Bind/Execute, COMMIT)"
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fenced,
    /// The same transaction without pgtenant, on a fully qualified table.
    Unfenced,
    /// The same transaction without pgtenant as a schema-per-tenant application must write it:
    /// `search_path` pinned for the transaction (pipelined ahead of the work, like the fence),
    /// unqualified table names.
    Pinned,
}

/// Every mode, in the order of the first round; later rounds rotate it.
const MODES: [Mode; 3] = [Mode::Fenced, Mode::Unfenced, Mode::Pinned];

/// The baseline's statements.
#[derive(Clone)]
struct Baseline {
    /// `INSERT INTO baseline.tput_cN …`
    qualified: Arc<str>,
    /// `INSERT INTO tput_cN …`, under `search_path = baseline`.
    unqualified: Arc<str>,
}

/// The pinning statement of [`Mode::Pinned`].
const PIN_SQL: &str = "SELECT set_config('search_path', $1, true)";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        let [_, _, url, replica, ledger] = &args[..] else {
            panic!("usage: bench_leases child <url> <replica> <ledger>");
        };
        child(url, replica, ledger).await;
        return;
    }
    let started = Instant::now();

    let (db, admin) = fresh_database().await;
    let url = db.url().to_owned();
    let server = server_info(&admin).await;
    admin
        .batch_execute("CREATE SCHEMA baseline")
        .await
        .expect("baseline schema");

    eprintln!("[bench] part 1: throughput");
    let throughput = bench_throughput(&url, &admin).await;
    eprintln!("[bench] part 2: takeover");
    let takeover = bench_takeover(&url).await;
    eprintln!("[bench] part 3: heartbeat");
    let (heartbeat, interleaved) = bench_heartbeat(&url, &admin).await;

    let wall = started.elapsed();
    let info = RunInfo { server };
    let report = render(
        &info,
        &throughput,
        &takeover,
        &heartbeat,
        &interleaved,
        wall,
    );
    println!("{report}");
    let path = "/tmp/bench_leases.md";
    std::fs::write(path, &report).expect("write /tmp/bench_leases.md");
    eprintln!(
        "[bench] wrote {path} (wall time {:.1} s)",
        wall.as_secs_f64()
    );
    drop(admin);
    drop(db);
}

// ---------------------------------------------------------------------------------------
// Part 1: throughput
// ---------------------------------------------------------------------------------------

struct ThroughputRow {
    variant: Variant,
    clients: usize,
    fenced: Vec<f64>,
    unfenced: Vec<f64>,
    pinned: Vec<f64>,
    /// Per round: CPU µs per committed transaction, (client, server).
    fenced_cpu: Vec<(f64, f64)>,
    unfenced_cpu: Vec<(f64, f64)>,
    pinned_cpu: Vec<(f64, f64)>,
    errors: u64,
}

async fn bench_throughput(url: &str, admin: &pgtenant::postgres::Client) -> Vec<ThroughputRow> {
    let mut rows = Vec::new();
    for clients in CONCURRENCY {
        // Fenced side: a router whose data-path pool has `clients` connections, one tenant.
        let router = Router::start(
            RouterOptions::from_url(format!("tput-c{clients}"), url)
                .expect("options")
                .pool_size(clients),
        )
        .await
        .expect("router starts");
        let id = TenantId::new("bench", &format!("tput-c{clients}")).expect("tenant id");
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

        // Unfenced side: a deadpool pool of the same size and recycling, an identical table.
        let table = format!("baseline.tput_c{clients}");
        admin
            .batch_execute(&format!(
                "CREATE TABLE {table} (client_id integer NOT NULL, n bigint NOT NULL)"
            ))
            .await
            .expect("create baseline table");
        let baseline = Baseline {
            qualified: format!("INSERT INTO {table} (client_id, n) VALUES ($1, $2)").into(),
            unqualified: format!("INSERT INTO tput_c{clients} (client_id, n) VALUES ($1, $2)")
                .into(),
        };
        let pool = baseline_pool(url, clients);

        for variant in VARIANTS {
            let mut row = ThroughputRow {
                variant,
                clients,
                fenced: Vec::new(),
                unfenced: Vec::new(),
                pinned: Vec::new(),
                fenced_cpu: Vec::new(),
                unfenced_cpu: Vec::new(),
                pinned_cpu: Vec::new(),
                errors: 0,
            };
            for mode in MODES {
                let warmup = round(mode, variant, clients, WARMUP, &handle, &pool, &baseline).await;
                row.errors += warmup.failed;
            }
            for r in 0..ROUNDS {
                let mut order = MODES;
                order.rotate_left(r % MODES.len());
                for mode in order {
                    let result =
                        round(mode, variant, clients, ROUND, &handle, &pool, &baseline).await;
                    row.errors += result.failed;
                    let (tps, cpu) = match mode {
                        Mode::Fenced => (&mut row.fenced, &mut row.fenced_cpu),
                        Mode::Unfenced => (&mut row.unfenced, &mut row.unfenced_cpu),
                        Mode::Pinned => (&mut row.pinned, &mut row.pinned_cpu),
                    };
                    tps.push(result.tps);
                    cpu.push((result.client_us, result.server_us));
                }
            }
            eprintln!(
                "[bench]   {} clients={clients}: fenced {:.0} tx/s, unfenced {:.0} tx/s, pinned {:.0} tx/s",
                match variant {
                    Variant::Prepared => "A",
                    Variant::Typed => "B",
                    Variant::Batch4 => "C",
                },
                median(&row.fenced),
                median(&row.unfenced),
                median(&row.pinned)
            );
            rows.push(row);
        }
        pool.close();
        drop(handle);
        router.close().await;
    }
    rows
}

fn baseline_pool(url: &str, size: usize) -> Pool {
    let config: pgtenant::postgres::Config = url.parse().expect("url");
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .expect("baseline pool")
}

/// One round's result.
#[derive(Default)]
struct RoundResult {
    /// Committed transactions per second.
    tps: f64,
    failed: u64,
    /// CPU microseconds per committed transaction: this process (the client), the server.
    client_us: f64,
    server_us: f64,
}

/// One round: `clients` tasks each run transactions back to back until the deadline.
async fn round(
    mode: Mode,
    variant: Variant,
    clients: usize,
    length: Duration,
    handle: &TenantHandle,
    pool: &Pool,
    baseline: &Baseline,
) -> RoundResult {
    let cpu_before = cpu_seconds();
    let start = Instant::now();
    let deadline = start + length;
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let handle = handle.clone();
        let pool = pool.clone();
        let baseline = baseline.clone();
        let client_id = i32::try_from(client).expect("client id");
        tasks.spawn(async move {
            let (mut done, mut failed) = (0_u64, 0_u64);
            let mut n: i64 = 0;
            while Instant::now() < deadline {
                n += 1;
                let result = match mode {
                    Mode::Fenced => fenced_tx(&handle, variant, client_id, n).await,
                    Mode::Unfenced => {
                        unfenced_tx(&pool, variant, &baseline.qualified, None, client_id, n).await
                    }
                    Mode::Pinned => {
                        let pin = Some("baseline");
                        unfenced_tx(&pool, variant, &baseline.unqualified, pin, client_id, n).await
                    }
                };
                match result {
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
    let (client_us, server_us) = match (cpu_before, cpu_seconds()) {
        (Some((c0, s0)), Some((c1, s1))) if done > 0 => {
            ((c1 - c0) * 1e6 / done as f64, (s1 - s0) * 1e6 / done as f64)
        }
        _ => (f64::NAN, f64::NAN),
    };
    RoundResult {
        tps: done as f64 / elapsed.as_secs_f64(),
        failed,
        client_us,
        server_us,
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
                match variant {
                    Variant::Prepared => {
                        tx.execute(FENCED_INSERT, &[&client_id, &n]).await?;
                    }
                    Variant::Typed => {
                        tx.execute_typed(
                            FENCED_INSERT,
                            &[(&client_id, Type::INT4), (&n, Type::INT8)],
                        )
                        .await?;
                    }
                    Variant::Batch4 => {
                        for k in 0..4 {
                            let n = n * 4 + k;
                            tx.execute_typed(
                                FENCED_INSERT,
                                &[(&client_id, Type::INT4), (&n, Type::INT8)],
                            )
                            .await?;
                        }
                    }
                }
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .map_err(|e| e.to_string())
}

/// The baseline transaction; with `pin`, `search_path` is set to that schema for the
/// transaction by a prepared statement sent ahead of the work in the same flight.
async fn unfenced_tx(
    pool: &Pool,
    variant: Variant,
    sql: &str,
    pin: Option<&str>,
    client_id: i32,
    n: i64,
) -> Result<(), String> {
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    let pin_statement = match pin {
        Some(_) => Some(
            client
                .prepare_cached(PIN_SQL)
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    let work = async {
        match variant {
            Variant::Prepared => {
                tx.execute(sql, &[&client_id, &n]).await?;
            }
            Variant::Typed => {
                tx.execute_typed(sql, &[(&client_id, Type::INT4), (&n, Type::INT8)])
                    .await?;
            }
            Variant::Batch4 => {
                for k in 0..4 {
                    let n = n * 4 + k;
                    tx.execute_typed(sql, &[(&client_id, Type::INT4), (&n, Type::INT8)])
                        .await?;
                }
            }
        }
        Ok::<_, pgtenant::postgres::Error>(())
    };
    match (&pin_statement, pin) {
        // try_join polls the pin first, so its messages go out ahead of the work's.
        (Some(statement), Some(schema)) => {
            let params: [&(dyn pgtenant::postgres::types::ToSql + Sync); 1] = [&schema];
            tokio::try_join!(tx.query(statement, &params), work).map(|_| ())
        }
        _ => work.await,
    }
    .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// Part 2: takeover after the owner process is SIGKILLed
// ---------------------------------------------------------------------------------------

/// The owner process: opens the tenant, creates its table, says "ready", then waits forever.
async fn child(url: &str, replica: &str, ledger: &str) {
    let router = Router::start(
        RouterOptions::from_url(replica, url)
            .expect("options")
            .ttl(CHILD_TTL)
            .pool_size(2),
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
                tx.execute("INSERT INTO takeover_log (n) VALUES ($1)", &[&0_i64])
                    .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .expect("child writes");
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
    latencies: Vec<Duration>,
    attempts: Vec<u32>,
}

async fn bench_takeover(url: &str) -> TakeoverResult {
    let exe = std::env::current_exe().expect("current exe");
    let router = Router::start(
        RouterOptions::from_url("takeover-survivor", url)
            .expect("options")
            .ttl(CHILD_TTL)
            .pool_size(4),
    )
    .await
    .expect("survivor router starts");
    let mut result = TakeoverResult {
        latencies: Vec::new(),
        attempts: Vec::new(),
    };
    for i in 0..TAKEOVERS {
        let ledger = format!("t{i}");
        let replica = format!("takeover-owner-{i}");
        let mut owner = tokio::process::Command::new(&exe)
            .args(["child", url, &replica, &ledger])
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
        let id = TenantId::new("takeover", &ledger).expect("tenant id");

        let killed_at = Instant::now();
        owner.start_kill().expect("SIGKILL owner");
        let mut attempts = 0_u32;
        let handle = loop {
            attempts += 1;
            match router.open(&id).await {
                Ok(handle) => break handle,
                Err(pgtenant::Error::LeaseHeld { .. }) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(error) => panic!("takeover of {id} failed: {error}"),
            }
        };
        handle
            .run(|tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO takeover_log (n) VALUES ($1)", &[&1_i64])
                        .await?;
                    Ok::<_, pgtenant::Error>(())
                })
            })
            .await
            .expect("fenced insert after takeover");
        let latency = killed_at.elapsed();
        result.latencies.push(latency);
        result.attempts.push(attempts);
        owner.wait().await.expect("reap owner");
        handle.release().await.expect("release");
    }
    router.close().await;
    result
}

// ---------------------------------------------------------------------------------------
// Part 3: heartbeat cost against held tenants
// ---------------------------------------------------------------------------------------

/// (held tenants, heartbeat samples) per replica of the interleaved check.
type Interleaved = Vec<(i64, Vec<Duration>)>;

struct HeartbeatRow {
    held: i64,
    heartbeat: Vec<Duration>,
    status: Vec<Duration>,
    status_no_jit: Vec<Duration>,
    plan_note: String,
}

async fn bench_heartbeat(
    url: &str,
    admin: &pgtenant::postgres::Client,
) -> (Vec<HeartbeatRow>, Interleaved) {
    let replica = "heartbeat-bench";
    let router = Router::start(
        RouterOptions::from_url(replica, url)
            .expect("options")
            .ttl(Duration::from_secs(10))
            .pool_size(2),
    )
    .await
    .expect("heartbeat router starts");
    let incarnation = router.incarnation().expect("registered").get();
    let mut rows = Vec::new();
    let mut have: i64 = 0;
    for held in HELD {
        admin
            .execute(
                "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, owner, owner_incarnation)
                 SELECT 'hb/l' || g, 'hb', 'l' || g, NULL, 1, $1, $2
                   FROM generate_series($3::bigint, $4::bigint) AS g",
                &[&replica, &incarnation, &(have + 1), &held],
            )
            .await
            .expect("insert held tenants");
        have = held;
        admin
            .batch_execute("VACUUM ANALYZE pgtenant.tenants")
            .await
            .expect("vacuum analyze");
        let counted: i64 = admin
            .query_one(
                "SELECT tenants_held FROM pgtenant.replica_status WHERE replica_id = $1",
                &[&replica],
            )
            .await
            .expect("replica_status")
            .get(0);
        assert_eq!(counted, held, "replica_status counts the held tenants");

        let mut heartbeat = Vec::with_capacity(HEARTBEAT_SAMPLES);
        for i in 0..HEARTBEAT_SAMPLES + 20 {
            let elapsed = heartbeat_once(admin, replica, incarnation).await;
            if i >= 20 {
                heartbeat.push(elapsed);
            }
        }
        let status = time_status(admin).await;
        let plan_note = explain_status(admin).await;
        admin.batch_execute("SET jit = off").await.expect("jit off");
        let status_no_jit = time_status(admin).await;
        admin.batch_execute("RESET jit").await.expect("reset jit");
        eprintln!(
            "[bench]   held={held}: heartbeat median {:.3} ms, replica_status median {:.3} ms",
            ms(median_d(&heartbeat)),
            ms(median_d(&status))
        );
        rows.push(HeartbeatRow {
            held,
            heartbeat,
            status,
            status_no_jit,
            plan_note,
        });
    }
    let interleaved = interleaved_heartbeats(url, admin, replica, incarnation).await;
    router.close().await;
    (rows, interleaved)
}

/// One heartbeat-equivalent statement for (replica, incarnation), timed; it must renew.
async fn heartbeat_once(
    admin: &pgtenant::postgres::Client,
    replica: &str,
    incarnation: i64,
) -> Duration {
    let ttl_ms: i32 = 10_000;
    let t = Instant::now();
    let renewed = admin
        .query_typed_opt(
            HEARTBEAT_EQUIVALENT_SQL,
            &[
                (&replica, Type::TEXT),
                (&incarnation, Type::INT8),
                (&ttl_ms, Type::INT4),
            ],
        )
        .await
        .expect("heartbeat-equivalent statement");
    let elapsed = t.elapsed();
    assert!(
        renewed.is_some(),
        "the heartbeat-equivalent statement renewed"
    );
    elapsed
}

/// The noise-fair check: two more replicas holding 1 and 1 000 tenants next to the one holding
/// 100 000, heartbeats sent round robin (rotating who goes first), so drift hits all three alike.
async fn interleaved_heartbeats(
    url: &str,
    admin: &pgtenant::postgres::Client,
    big_replica: &str,
    big_incarnation: i64,
) -> Vec<(i64, Vec<Duration>)> {
    let mut routers = Vec::new();
    let mut replicas = Vec::new();
    for (held, org) in [(1_i64, "hb1"), (1_000, "hb1k")] {
        let replica = format!("heartbeat-{org}");
        let router = Router::start(
            RouterOptions::from_url(replica.clone(), url)
                .expect("options")
                .ttl(Duration::from_secs(10))
                .pool_size(1),
        )
        .await
        .expect("heartbeat router starts");
        let incarnation = router.incarnation().expect("registered").get();
        admin
            .execute(
                "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, owner, owner_incarnation)
                 SELECT $1 || '/l' || g, $1, 'l' || g, NULL, 1, $2, $3
                   FROM generate_series(1, $4::bigint) AS g",
                &[&org, &replica, &incarnation, &held],
            )
            .await
            .expect("insert held tenants");
        routers.push(router);
        replicas.push((held, replica, incarnation));
    }
    replicas.push((HELD[2], big_replica.to_owned(), big_incarnation));
    admin
        .batch_execute("VACUUM ANALYZE pgtenant.tenants")
        .await
        .expect("vacuum analyze");
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); replicas.len()];
    for i in 0..HEARTBEAT_SAMPLES + 20 {
        for k in 0..replicas.len() {
            let j = (i + k) % replicas.len();
            let (_, replica, incarnation) = &replicas[j];
            let elapsed = heartbeat_once(admin, replica, *incarnation).await;
            if i >= 20 {
                samples[j].push(elapsed);
            }
        }
    }
    for router in routers {
        router.close().await;
    }
    replicas
        .iter()
        .zip(samples)
        .map(|((held, _, _), s)| (*held, s))
        .collect()
}

/// `SELECT * FROM pgtenant.replica_status`, timed `STATUS_SAMPLES` times after 5 untimed runs.
async fn time_status(admin: &pgtenant::postgres::Client) -> Vec<Duration> {
    let mut status = Vec::with_capacity(STATUS_SAMPLES);
    for i in 0..STATUS_SAMPLES + 5 {
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

/// What EXPLAIN ANALYZE says about replica_status: replica rows, the planner's estimate of the
/// tenants counted per replica, execution time and JIT time.
async fn explain_status(admin: &pgtenant::postgres::Client) -> String {
    let replicas: i64 = admin
        .query_one("SELECT count(*) FROM pgtenant.replicas", &[])
        .await
        .expect("count replicas")
        .get(0);
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
    let estimate = lines
        .iter()
        .find(|l| l.contains("on tenants t"))
        .and_then(|l| l.split("rows=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("?")
        .to_owned();
    let execution = find("Execution Time").unwrap_or_default();
    let jit = find("Timing: Generation")
        .and_then(|l| l.split("Total").nth(1).map(|t| t.trim().to_owned()))
        .map_or_else(|| "no JIT".to_owned(), |total| format!("JIT {total}"));
    format!("{replicas} replica rows, est. {estimate} tenant rows per replica; {execution}; {jit}")
}

// ---------------------------------------------------------------------------------------
// Statistics and the report
// ---------------------------------------------------------------------------------------

fn list(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where and when the run happened.
struct RunInfo {
    server: ServerInfo,
}

fn render(
    info: &RunInfo,
    throughput: &[ThroughputRow],
    takeover: &TakeoverResult,
    heartbeat: &[HeartbeatRow],
    interleaved: &[(i64, Vec<Duration>)],
    wall: Duration,
) -> String {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = cpu_model().unwrap_or_else(|| "unknown".to_owned());
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# pgtenant benchmarks\n");
    let _ = writeln!(
        w,
        "Reproduce with `{COMMAND}` (needs PostgreSQL on 127.0.0.1:5432, trust auth; \
         source: examples/bench_leases.rs).\n"
    );
    let _ = writeln!(w, "- Command: `{COMMAND}`");
    let _ = writeln!(w, "- Date: {}", info.server.date);
    let _ = writeln!(
        w,
        "- Machine: nproc = {nproc} ({cpu}); shared and noisy, the benchmark and PostgreSQL share the cores"
    );
    let _ = writeln!(w, "- PostgreSQL: {}", info.server.pg_version);
    let _ = writeln!(w, "- Server settings: {}", info.server.settings);
    let _ = writeln!(
        w,
        "- Wall time of the whole run: {:.1} s\n",
        wall.as_secs_f64()
    );

    let _ = writeln!(w, "## 1. Fenced vs unfenced transaction throughput\n");
    let _ = writeln!(
        w,
        "Each transaction: BEGIN; INSERT INTO <table> (client_id, n) VALUES ($1, $2); COMMIT. \
         **Fenced**: `TenantHandle::run` on one tenant (table in the tenant schema; the fence statement \
         is pipelined ahead of the INSERT). **Unfenced**: `client.transaction()` on a connection from a \
         deadpool pool (same size, same fast recycling) into an identical table `baseline.tput_c<N>`, \
         fully qualified. **Pinned**: the unfenced transaction as a schema-per-tenant application \
         without pgtenant writes it: `set_config('search_path', 'baseline', true)` (prepared) pipelined \
         ahead of the same INSERT with an unqualified table name. Pool size = clients on every side. \
         {ROUNDS} rounds of {} s per mode and concurrency, the mode order rotating every round, after \
         a {} ms warm-up of each. Values are committed tx/s; the target is fenced / unfenced ≥ 0.95; \
         fenced / pinned is what the fence costs beyond the routing any such application pays.\n",
        ROUND.as_secs(),
        WARMUP.as_millis()
    );
    let paired = |a: &[f64], b: &[f64]| -> f64 {
        let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
        median(&ratios)
    };
    for variant in VARIANTS {
        let _ = writeln!(w, "### {}\n", variant.title());
        let _ = writeln!(
            w,
            "| clients | fenced tx/s | unfenced tx/s | pinned tx/s | fenced / unfenced | per-round median | fenced / pinned | per-round median | target met | failed tx |"
        );
        let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|");
        for row in throughput.iter().filter(|r| r.variant == variant) {
            let (f, u, p) = (
                median(&row.fenced),
                median(&row.unfenced),
                median(&row.pinned),
            );
            let ratio = f / u;
            let _ = writeln!(
                w,
                "| {} | {f:.0} | {u:.0} | {p:.0} | {ratio:.3} | {:.3} | {:.3} | {:.3} | {} | {} |",
                row.clients,
                paired(&row.fenced, &row.unfenced),
                f / p,
                paired(&row.fenced, &row.pinned),
                if ratio >= 0.95 { "yes" } else { "no" },
                row.errors
            );
        }
        let _ = writeln!(
            w,
            "\nCPU per committed transaction (µs, median over rounds; client = this process, \
             server = every `postgres` process): on separate machines the server's CPU bounds \
             throughput, so unfenced / fenced server CPU is the ratio a server-bound deployment \
             would see.\n"
        );
        let _ = writeln!(
            w,
            "| clients | client fenced | client unfenced | client pinned | server fenced | server unfenced | server pinned | server unfenced / fenced | server pinned / fenced |"
        );
        let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for row in throughput.iter().filter(|r| r.variant == variant) {
            let client = |cpu: &[(f64, f64)]| median(&cpu.iter().map(|c| c.0).collect::<Vec<_>>());
            let server = |cpu: &[(f64, f64)]| median(&cpu.iter().map(|c| c.1).collect::<Vec<_>>());
            let sf = server(&row.fenced_cpu);
            let _ = writeln!(
                w,
                "| {} | {:.0} | {:.0} | {:.0} | {sf:.0} | {:.0} | {:.0} | {:.3} | {:.3} |",
                row.clients,
                client(&row.fenced_cpu),
                client(&row.unfenced_cpu),
                client(&row.pinned_cpu),
                server(&row.unfenced_cpu),
                server(&row.pinned_cpu),
                server(&row.unfenced_cpu) / sf,
                server(&row.pinned_cpu) / sf,
            );
        }
        let _ = writeln!(w, "\nPer-round tx/s (medians above):\n");
        for row in throughput.iter().filter(|r| r.variant == variant) {
            let _ = writeln!(
                w,
                "- {} clients: fenced [{}]; unfenced [{}]; pinned [{}]",
                row.clients,
                list(&row.fenced),
                list(&row.unfenced),
                list(&row.pinned)
            );
        }
        let _ = writeln!(w);
    }

    let _ = writeln!(w, "## 2. Takeover latency after the owner process dies\n");
    let _ = writeln!(
        w,
        "Real processes: for each of {TAKEOVERS} iterations a fresh tenant is opened by a child process \
         (this example re-executed as `bench_leases child <url> <replica> <ledger>`, Router ttl {} s), \
         which prints `ready` and sleeps. The parent SIGKILLs it, then loops `router.open(&id)` \
         (retrying after 1 ms on `Error::LeaseHeld`) and runs one fenced INSERT. Time = from just \
         before the SIGKILL to that INSERT's commit. Nearest-rank percentiles: with {TAKEOVERS} \
         samples p99 is the maximum.\n",
        CHILD_TTL.as_secs()
    );
    let lat = &takeover.latencies;
    let p99 = percentile_d(lat, 99.0);
    let _ = writeln!(
        w,
        "| samples | min | median | p90 | p99 | max | open attempts (median / max) | p99 < 100 ms |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|:---:|");
    let mut attempts = takeover.attempts.clone();
    attempts.sort_unstable();
    let _ = writeln!(
        w,
        "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {} / {} | {} |\n",
        lat.len(),
        ms(percentile_d(lat, 0.0)),
        ms(median_d(lat)),
        ms(percentile_d(lat, 90.0)),
        ms(p99),
        ms(percentile_d(lat, 100.0)),
        attempts[attempts.len() / 2],
        attempts[attempts.len() - 1],
        if p99 < Duration::from_millis(100) {
            "yes"
        } else {
            "no"
        }
    );
    let _ = writeln!(
        w,
        "All samples (ms): {}\n",
        lat.iter()
            .map(|d| format!("{:.1}", ms(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let _ = writeln!(w, "## 3. Heartbeat cost against held tenants\n");
    let _ = writeln!(
        w,
        "One replica started with `Router::start` (ttl 10 s); it is made to hold 1, 1 000 and \
         100 000 tenants by inserting rows straight into `pgtenant.tenants` (owner = the replica, \
         owner_incarnation = `router.incarnation()`, schema_name NULL) with `INSERT … SELECT FROM \
         generate_series`, followed by `VACUUM ANALYZE pgtenant.tenants`; `replica_status.tenants_held` \
         is checked to equal the target. The heartbeat's `backend_pid = pg_backend_pid()` condition \
         can only hold on the replica's own lease session, so the statement timed here is the \
         heartbeat of src/liveness.rs **without that condition**, sent with `query_typed_opt` (TEXT, \
         INT8, INT4; the same call the router makes) from a separate connection; each run must \
         return the incarnation (a real renewal). {HEARTBEAT_SAMPLES} timed runs per size after 20 \
         untimed ones; `SELECT * FROM pgtenant.replica_status` is timed {STATUS_SAMPLES} times per \
         size (after 5 untimed) for information, then again with `SET jit = off` on that session, and \
         explained once. Times are client-side round trips on 127.0.0.1. \
         Sizes are measured in sequence (1, then 1 000, then 100 000), not interleaved.\n"
    );
    let _ = writeln!(
        w,
        "| held tenants | heartbeat median | heartbeat p99 | replica_status median | replica_status p99 | replica_status median, `SET jit = off` |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|");
    for row in heartbeat {
        let _ = writeln!(
            w,
            "| {} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
            row.held,
            ms(median_d(&row.heartbeat)),
            ms(percentile_d(&row.heartbeat, 99.0)),
            ms(median_d(&row.status)),
            ms(percentile_d(&row.status, 99.0)),
            ms(median_d(&row.status_no_jit))
        );
    }
    let _ = writeln!(
        w,
        "
`EXPLAIN ANALYZE SELECT * FROM pgtenant.replica_status` (one run, default jit setting):
"
    );
    for row in heartbeat {
        let _ = writeln!(w, "- {} held: {}", row.held, row.plan_note);
    }
    if let (Some(first), Some(last)) = (heartbeat.first(), heartbeat.last()) {
        let _ = writeln!(
            w,
            "\nRatio {} / {} held: heartbeat median ×{:.2}, heartbeat p99 ×{:.2}; replica_status median ×{:.1}.",
            last.held,
            first.held,
            median_d(&last.heartbeat).as_secs_f64() / median_d(&first.heartbeat).as_secs_f64(),
            percentile_d(&last.heartbeat, 99.0).as_secs_f64()
                / percentile_d(&first.heartbeat, 99.0).as_secs_f64(),
            median_d(&last.status).as_secs_f64() / median_d(&first.status).as_secs_f64(),
        );
    }
    let _ = writeln!(
        w,
        "\nInterleaved check (noise-fair): two more replicas, started with `Router::start` and made to \
         hold 1 and 1 000 tenants the same way, next to the one holding 100 000 (table: {} tenant rows \
         in all). The three heartbeat-equivalent statements are sent round robin, rotating which goes \
         first, {HEARTBEAT_SAMPLES} timed each after 20 untimed rounds.\n",
        interleaved.iter().map(|(h, _)| h).sum::<i64>()
    );
    let _ = writeln!(
        w,
        "| held tenants | heartbeat median | heartbeat p90 | heartbeat p99 |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|");
    for (held, samples) in interleaved {
        let _ = writeln!(
            w,
            "| {held} | {:.3} ms | {:.3} ms | {:.3} ms |",
            ms(median_d(samples)),
            ms(percentile_d(samples, 90.0)),
            ms(percentile_d(samples, 99.0))
        );
    }
    if let (Some((h1, s1)), Some((hn, sn))) = (
        interleaved.iter().min_by_key(|(h, _)| *h),
        interleaved.iter().max_by_key(|(h, _)| *h),
    ) {
        let _ = writeln!(
            w,
            "\nRatio {hn} / {h1} held (interleaved): heartbeat median ×{:.2}, p99 ×{:.2}.",
            median_d(sn).as_secs_f64() / median_d(s1).as_secs_f64(),
            percentile_d(sn, 99.0).as_secs_f64() / percentile_d(s1, 99.0).as_secs_f64()
        );
    }
    out
}
