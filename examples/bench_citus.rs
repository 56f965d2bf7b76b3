//! pgtenant on Citus beside plain PostgreSQL, in one run (BENCHMARKS.md "Citus"):
//!
//! 1. fenced (`TenantHandle::run`) vs pinned (an unfenced transaction with `search_path` pinned
//!    to the tenant's schema, pipelined ahead of the work) one-INSERT transactions at 1, 8 and
//!    32 clients, one tenant per client;
//! 2. latencies: warm open, handoff to another replica, takeover of a dead owner (its lease
//!    session terminated), cold open (creation with three tenant migrations);
//! 3. where the time goes: a fenced transaction with no work (BEGIN, fence, COMMIT: the
//!    coordinator alone) against one that inserts (plus the worker), and the pinned insert.
//!
//! Plain PostgreSQL is a durable throwaway cluster of the test kit; Citus a coordinator and two
//! workers of the test kit (same settings, same machine). Needs Citus installed.
//!
//! ```sh
//! cargo run --release --example bench_citus            # about 3 minutes on 2 cores
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtenant::pool::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use pgtenant::postgres::types::{ToSql, Type};
use pgtenant::postgres::NoTls;
use pgtenant::{Router, RouterOptions, TenantHandle, TenantId};
use pgtenant_testkit::{CitusCluster, LocalCluster, TestDatabase};

const CLIENTS: [usize; 3] = [1, 8, 32];
const ROUNDS: usize = 3;
const WINDOW: Duration = Duration::from_secs(2);
const LATENCY_SAMPLES: usize = 15;

const MIGRATIONS: [(&str, &str); 3] = [
    (
        "V1__entries",
        "CREATE TABLE entries (memo text, amount bigint)",
    ),
    (
        "V2__accounts",
        "CREATE TABLE accounts (id bigint PRIMARY KEY, name text)",
    ),
    (
        "V3__index",
        "CREATE INDEX entries_amount ON entries (amount)",
    ),
];

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn options(url: &str, replica: &str) -> RouterOptions {
    RouterOptions::from_url(replica, url)
        .expect("url")
        .pool_size(40)
        .ttl(Duration::from_secs(5))
        .tenant_migrations(MIGRATIONS)
        .expect("migrations")
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
        .build()
        .expect("pool")
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Fenced,
    Pinned,
}

async fn fenced_insert(handle: &TenantHandle, n: i64) -> bool {
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO entries VALUES ('bench', $1)", &[&n])
                    .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .is_ok()
}

async fn fenced_empty(handle: &TenantHandle) -> bool {
    handle
        .run(|_tx| Box::pin(async move { Ok::<_, pgtenant::Error>(()) }))
        .await
        .is_ok()
}

async fn pinned_insert(pool: &Pool, schema: &str, n: i64) -> bool {
    let Ok(mut client) = pool.get().await else {
        return false;
    };
    let Ok(tx) = client.transaction().await else {
        return false;
    };
    let path = format!("{schema}, pg_temp");
    // query_typed: Parse, Bind and Execute in one go, so the INSERT is parsed after the
    // search_path is set (a prepare would resolve `entries` before).
    let pin_params: [(&(dyn ToSql + Sync), Type); 1] = [(&path, Type::TEXT)];
    let insert_params: [(&(dyn ToSql + Sync), Type); 1] = [(&n, Type::INT8)];
    let (pinned, inserted) = tokio::join!(
        tx.query_typed("SELECT set_config('search_path', $1, true)", &pin_params),
        tx.query_typed("INSERT INTO entries VALUES ('bench', $1)", &insert_params),
    );
    pinned.is_ok() && inserted.is_ok() && tx.commit().await.is_ok()
}

/// Committed transactions per second of `clients` tasks, one tenant each, for WINDOW.
async fn throughput(mode: Mode, handles: &[TenantHandle], pool: &Pool, clients: usize) -> f64 {
    let deadline = Instant::now() + WINDOW;
    let tasks: Vec<_> = handles[..clients]
        .iter()
        .cloned()
        .map(|handle| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let schema = handle.schema().to_owned();
                let mut done = 0u64;
                let mut n = 0i64;
                while Instant::now() < deadline {
                    n += 1;
                    let ok = match mode {
                        Mode::Fenced => fenced_insert(&handle, n).await,
                        Mode::Pinned => pinned_insert(&pool, &schema, n).await,
                    };
                    done += u64::from(ok);
                }
                done
            })
        })
        .collect();
    let started = Instant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("client task");
    }
    total as f64 / started.elapsed().as_secs_f64().max(WINDOW.as_secs_f64())
}

/// Median latency of `f`, LATENCY_SAMPLES times after one warm-up.
async fn latency<F, Fut>(mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let _ = f().await;
    let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES {
        samples.push(ms(f().await));
    }
    median(&mut samples)
}

struct Figures {
    /// (clients, fenced tx/s, pinned tx/s) medians over rounds.
    throughput: Vec<(usize, f64, f64)>,
    fenced_empty_ms: f64,
    fenced_insert_ms: f64,
    pinned_insert_ms: f64,
    warm_open_ms: f64,
    handoff_ms: f64,
    takeover_ms: f64,
    cold_open_ms: f64,
}

async fn measure(name: &str, url: &str) -> Figures {
    let mut admin = {
        let (client, connection) = pgtenant::postgres::connect(url, NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
    };
    pgtenant::setup(&mut admin).await.expect("setup");
    let a = Router::start(options(url, "bench-a"))
        .await
        .expect("router a");
    let b = Router::start(options(url, "bench-b"))
        .await
        .expect("router b");
    let ids: Vec<TenantId> = (0..32)
        .map(|i| TenantId::new("bench", &format!("t{i}")).expect("id"))
        .collect();
    let mut handles = Vec::new();
    for id in &ids {
        handles.push(a.open_or_create(id).await.expect("create"));
    }
    let pool = baseline_pool(url, 40);

    eprintln!("[bench] {name}: throughput");
    let mut throughput_rows = Vec::new();
    for clients in CLIENTS {
        let (mut fenced, mut pinned) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Alternate which mode goes first, so drift hits both alike.
            let order = if round % 2 == 0 {
                [Mode::Fenced, Mode::Pinned]
            } else {
                [Mode::Pinned, Mode::Fenced]
            };
            for mode in order {
                let tps = throughput(mode, &handles, &pool, clients).await;
                match mode {
                    Mode::Fenced => fenced.push(tps),
                    Mode::Pinned => pinned.push(tps),
                }
            }
        }
        let row = (clients, median(&mut fenced), median(&mut pinned));
        eprintln!(
            "[bench]   {name} clients={clients}: fenced {:.0} tx/s, pinned {:.0} tx/s",
            row.1, row.2
        );
        throughput_rows.push(row);
    }

    eprintln!("[bench] {name}: latencies");
    let one = handles[0].clone();
    let fenced_empty_ms = latency(|| {
        let one = one.clone();
        async move {
            let t = Instant::now();
            assert!(fenced_empty(&one).await);
            t.elapsed()
        }
    })
    .await;
    let fenced_insert_ms = latency(|| {
        let one = one.clone();
        async move {
            let t = Instant::now();
            assert!(fenced_insert(&one, 1).await);
            t.elapsed()
        }
    })
    .await;
    let schema = one.schema().to_owned();
    let pinned_insert_ms = latency(|| {
        let (pool, schema) = (pool.clone(), schema.clone());
        async move {
            let t = Instant::now();
            assert!(pinned_insert(&pool, &schema, 1).await);
            t.elapsed()
        }
    })
    .await;

    // Warm open: release, then open again (one acquisition).
    let id = ids[1].clone();
    let held = handles[1].clone();
    held.release().await.expect("release");
    let warm_open_ms = latency(|| {
        let (a, id) = (a.clone(), id.clone());
        async move {
            let t = Instant::now();
            let handle = a.open(&id).await.expect("open");
            let took = t.elapsed();
            handle.release().await.expect("release");
            took
        }
    })
    .await;

    // Handoff: the holder hands off (drain + release), the other replica opens.
    let id = ids[2].clone();
    handles[2].release().await.expect("release");
    let handoff_ms = {
        let mut holder_is_a = true;
        let mut holder = a.open(&id).await.expect("open");
        let mut samples = Vec::new();
        for _ in 0..=LATENCY_SAMPLES {
            let taker = if holder_is_a { &b } else { &a };
            let t = Instant::now();
            holder.handoff().await.expect("handoff");
            holder = taker.open(&id).await.expect("open after handoff");
            samples.push(ms(t.elapsed()));
            holder_is_a = !holder_is_a;
        }
        holder.release().await.expect("release");
        samples.remove(0);
        median(&mut samples)
    };

    // Takeover of a dead owner: a third replica opens, its lease session is terminated, the
    // other opens as soon as the database lets it.
    let id = ids[3].clone();
    handles[3].release().await.expect("release");
    let mut takeovers = Vec::new();
    for i in 0..=5 {
        let victim = Router::start(options(url, &format!("victim-{i}")))
            .await
            .expect("victim");
        let _held = victim.open(&id).await.expect("victim opens");
        let t = Instant::now();
        admin
            .execute(
                "SELECT pg_terminate_backend(backend_pid) FROM pgtenant.replicas WHERE replica_id = $1",
                &[&format!("victim-{i}")],
            )
            .await
            .expect("terminate");
        let handle = loop {
            match b.open(&id).await {
                Ok(handle) => break handle,
                Err(_) => tokio::task::yield_now().await,
            }
        };
        takeovers.push(ms(t.elapsed()));
        handle.release().await.expect("release");
        drop(victim);
    }
    takeovers.remove(0);
    let takeover_ms = median(&mut takeovers);

    // Cold open: creation with the three migrations.
    let mut cold = Vec::new();
    for i in 0..LATENCY_SAMPLES {
        let id = TenantId::new("cold", &format!("c{i}")).expect("id");
        let t = Instant::now();
        let handle = a.open_or_create(&id).await.expect("create");
        cold.push(ms(t.elapsed()));
        handle.release().await.expect("release");
    }
    let cold_open_ms = median(&mut cold);

    drop(handles);
    a.close().await;
    b.close().await;
    Figures {
        throughput: throughput_rows,
        fenced_empty_ms,
        fenced_insert_ms,
        pinned_insert_ms,
        warm_open_ms,
        handoff_ms,
        takeover_ms,
        cold_open_ms,
    }
}

#[tokio::main]
async fn main() {
    pgtenant_testkit::citus_installed().unwrap_or_else(|why| {
        panic!(
            "needs Citus ({why}): {}",
            pgtenant_testkit::INSTALL_CITUS_HINT
        )
    });
    let plain_cluster = LocalCluster::start().await.expect("plain cluster");
    let plain_db: TestDatabase = plain_cluster.create_database().await.expect("plain db");
    let citus_cluster = Arc::new(CitusCluster::start(2).await.expect("citus cluster"));
    let citus_db = citus_cluster.create_database().await.expect("citus db");
    let plain = measure("postgres", plain_db.url()).await;
    let citus = measure("citus", citus_db.url()).await;

    println!(
        "### Fenced vs pinned one-INSERT transactions (tx/s, median of {ROUNDS} rounds of {} s)\n",
        WINDOW.as_secs()
    );
    println!("| clients | PG fenced | PG pinned | PG fenced/pinned | Citus fenced | Citus pinned | Citus fenced/pinned | Citus/PG fenced |");
    println!("|---|---|---|---|---|---|---|---|");
    for ((clients, pf, pp), (_, cf, cp)) in plain.throughput.iter().zip(&citus.throughput) {
        println!(
            "| {clients} | {pf:.0} | {pp:.0} | {:.2} | {cf:.0} | {cp:.0} | {:.2} | {:.2} |",
            pf / pp,
            cf / cp,
            cf / pf
        );
    }
    println!("\n### Latencies (ms, medians of {LATENCY_SAMPLES}; takeover of 5)\n");
    println!("| | PostgreSQL | Citus | Citus/PG |");
    println!("|---|---|---|---|");
    let rows = [
        (
            "fenced tx, no work (coordinator only)",
            plain.fenced_empty_ms,
            citus.fenced_empty_ms,
        ),
        (
            "fenced one-INSERT tx",
            plain.fenced_insert_ms,
            citus.fenced_insert_ms,
        ),
        (
            "pinned one-INSERT tx",
            plain.pinned_insert_ms,
            citus.pinned_insert_ms,
        ),
        (
            "warm open (acquire)",
            plain.warm_open_ms,
            citus.warm_open_ms,
        ),
        (
            "handoff to another replica (drain, release, open)",
            plain.handoff_ms,
            citus.handoff_ms,
        ),
        (
            "takeover of a dead owner (terminate → open)",
            plain.takeover_ms,
            citus.takeover_ms,
        ),
        (
            "cold open: create with 3 migrations",
            plain.cold_open_ms,
            citus.cold_open_ms,
        ),
    ];
    for (what, p, c) in rows {
        println!("| {what} | {p:.2} | {c:.2} | {:.1} |", c / p);
    }
    println!(
        "\nWorker part of a Citus fenced INSERT (fenced insert − fenced empty): {:.2} ms; on PostgreSQL {:.2} ms.",
        citus.fenced_insert_ms - citus.fenced_empty_ms,
        plain.fenced_insert_ms - plain.fenced_empty_ms
    );
}
