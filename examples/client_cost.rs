//! What one transaction costs this process, by mode (issue #29): heap allocations, bytes
//! allocated, voluntary context switches, this process's and the server's CPU µs and the
//! latency per committed one-INSERT transaction,
//! under session fencing, transaction fencing, pinned through a deadpool pool (what a user
//! writes without pgtenant) and pinned on a connection of its own (the driver alone). One
//! client on a current-thread runtime, so every count is this transaction's own work, not
//! scheduling between threads; session − pinned is pgtenant's, pinned − direct the pool's.
//!
//! `cargo run --release --example client_cost` (PostgreSQL as for the other benchmarks);
//! `-- --transactions=N` per mode and round (default 5000), `-- --rounds=N` (default 5).
//! Ends with machine-readable lines (`client-cost: mode=… allocs=… bytes=… csw=… cpu_us=…
//! server_us=… latency_us=…`).

// A counting global allocator is the one way to count a transaction's allocations without
// another dependency; its unsafe methods only pass each call on to the system allocator.
#![allow(unsafe_code)]

#[path = "common/mod.rs"]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use common::{cpu_seconds_of, fresh_database, median, postmaster_of};
use pgtenant::pool::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pgtenant::postgres::types::Type;
use pgtenant::postgres::{Client, NoTls, Statement};
use pgtenant::{Fencing, Router, RouterOptions, TenantHandle, TenantId};

/// Counts every allocation of this process (relaxed atomics: one thread does the work).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and the caller's new size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const INSERT: &str = "INSERT INTO tput (client_id, n) VALUES ($1, $2)";
const PIN: &str = "SELECT pg_catalog.set_config('search_path', $1, true)";
const MODES: [&str; 4] = ["session", "transaction", "pinned", "direct"];

/// This process's and the server's CPU seconds (user + system), and this process's voluntary
/// context switches so far.
fn usage(postmaster: u32) -> (f64, f64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let switches = status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let (own, server) = cpu_seconds_of(postmaster).unwrap_or((f64::NAN, f64::NAN));
    (own, server, switches)
}

/// Per committed transaction: allocations, bytes, voluntary context switches, CPU µs of this
/// process and of the server.
#[derive(Default, Clone, Copy)]
struct Cost {
    allocations: f64,
    bytes: f64,
    switches: f64,
    cpu_us: f64,
    server_us: f64,
    /// Wall-clock µs per transaction: with one client, its latency.
    wall_us: f64,
}

struct Sides {
    session: TenantHandle,
    transaction: TenantHandle,
    pool: Pool,
    direct: Client,
    pin: Statement,
    schema: String,
    postmaster: u32,
}

async fn one(sides: &mut Sides, mode: &str, n: i64) {
    match mode {
        "session" => sides
            .session
            .run(move |tx| insert(tx, n))
            .await
            .expect("session"),
        "transaction" => sides
            .transaction
            .run(move |tx| insert(tx, n))
            .await
            .expect("transaction"),
        "pinned" => {
            let mut client = sides.pool.get().await.expect("pool");
            let pin = client.prepare_cached(PIN).await.expect("pin");
            pinned(&mut client, &pin, &sides.schema, n).await;
        }
        _ => {
            let pin = sides.pin.clone();
            let schema = sides.schema.clone();
            pinned(&mut sides.direct, &pin, &schema, n).await;
        }
    }
}

/// The fenced modes' work: one typed INSERT.
fn insert<'t>(tx: pgtenant::Tx<'t, '_>, n: i64) -> pgtenant::BoxFuture<'t, pgtenant::Result<()>> {
    Box::pin(async move {
        tx.execute_typed(INSERT, &[(&1_i32, Type::INT4), (&n, Type::INT8)])
            .await?;
        Ok(())
    })
}

/// BEGIN READ WRITE; the pin pipelined with the INSERT; COMMIT: bench_leases' pinned mode.
async fn pinned(client: &mut Client, pin: &Statement, schema: &str, n: i64) {
    let tx = client
        .build_transaction()
        .read_only(false)
        .start()
        .await
        .expect("begin");
    let params: [&(dyn pgtenant::postgres::types::ToSql + Sync); 1] = [&schema];
    let row: [(&(dyn pgtenant::postgres::types::ToSql + Sync), Type); 2] =
        [(&1_i32, Type::INT4), (&n, Type::INT8)];
    tokio::try_join!(tx.query(pin, &params), tx.execute_typed(INSERT, &row))
        .expect("pin and insert");
    tx.commit().await.expect("commit");
}

async fn measure(sides: &mut Sides, mode: &str, transactions: i64, base: i64) -> Cost {
    let (cpu0, server0, switches0) = usage(sides.postmaster);
    let started = std::time::Instant::now();
    let (allocations0, bytes0) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    for n in 0..transactions {
        one(sides, mode, base + n).await;
    }
    let wall = started.elapsed();
    // Read before `usage`, which allocates.
    let (allocations1, bytes1) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    let (cpu1, server1, switches1) = usage(sides.postmaster);
    let per = |d: f64| d / transactions as f64;
    Cost {
        allocations: per((allocations1 - allocations0) as f64),
        bytes: per((bytes1 - bytes0) as f64),
        switches: per((switches1 - switches0) as f64),
        cpu_us: per((cpu1 - cpu0) * 1e6),
        server_us: per((server1 - server0) * 1e6),
        wall_us: per(wall.as_secs_f64() * 1e6),
    }
}

async fn handle(url: &str, name: &str, fencing: Fencing) -> TenantHandle {
    let router = Router::start(
        RouterOptions::from_url(name, url)
            .expect("options")
            .pool_size(1)
            .fencing(fencing),
    )
    .await
    .expect("router");
    let id = TenantId::new("cost", name).expect("id");
    let handle = router.open_or_create(&id).await.expect("open");
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(
                    "CREATE TABLE tput (client_id integer NOT NULL, n bigint NOT NULL)",
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
        .expect("table");
    // The handle keeps its router's state alive; the router's background tasks run on.
    std::mem::forget(router);
    handle
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: i64| {
        args.iter()
            .find_map(|a| a.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let transactions = arg("--transactions=", 5000);
    let rounds = arg("--rounds=", 5);
    let (db, admin) = fresh_database().await;
    admin
        .batch_execute(
            "CREATE SCHEMA baseline;
             CREATE TABLE baseline.tput (client_id integer NOT NULL, n bigint NOT NULL)",
        )
        .await
        .expect("baseline");
    let url = db.url().to_owned();
    let config: pgtenant::postgres::Config = url.parse().expect("url");
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager).max_size(1).build().expect("pool");
    let (direct, connection) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);
    let pin = direct.prepare(PIN).await.expect("prepare");
    let backend: i32 = direct
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("backend")
        .get(0);
    let postmaster = postmaster_of(backend).expect("the server runs on this machine");
    let mut sides = Sides {
        session: handle(&url, "session", Fencing::Session).await,
        transaction: handle(&url, "transaction", Fencing::Transaction).await,
        pool,
        direct,
        pin,
        schema: "baseline".to_owned(),
        postmaster,
    };
    let mut costs: Vec<Vec<Cost>> = vec![Vec::new(); MODES.len()];
    let mut base = 0;
    for mode in MODES {
        measure(&mut sides, mode, transactions / 10, base).await;
        base += transactions;
    }
    for round in 0..rounds {
        // The order rotates every round.
        for k in 0..MODES.len() {
            let m = (k + round as usize) % MODES.len();
            costs[m].push(measure(&mut sides, MODES[m], transactions, base).await);
            base += transactions;
        }
    }
    println!(
        "Per committed one-INSERT transaction, one client, current-thread runtime, medians of \
         {rounds} rounds of {transactions}:\n"
    );
    println!(
        "| mode | allocations | bytes allocated | voluntary context switches | client CPU µs | server CPU µs | latency µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let medians: Vec<Cost> = costs
        .iter()
        .map(|c| {
            let of = |f: fn(&Cost) -> f64| median(&c.iter().map(f).collect::<Vec<_>>());
            Cost {
                allocations: of(|c| c.allocations),
                bytes: of(|c| c.bytes),
                switches: of(|c| c.switches),
                cpu_us: of(|c| c.cpu_us),
                server_us: of(|c| c.server_us),
                wall_us: of(|c| c.wall_us),
            }
        })
        .collect();
    for (mode, c) in MODES.iter().zip(&medians) {
        println!(
            "| {mode} | {:.1} | {:.0} | {:.2} | {:.1} | {:.1} | {:.0} |",
            c.allocations, c.bytes, c.switches, c.cpu_us, c.server_us, c.wall_us
        );
    }
    println!();
    for (mode, c) in MODES.iter().zip(&medians) {
        println!(
            "client-cost: mode={mode} allocs={:.1} bytes={:.0} csw={:.2} cpu_us={:.1} server_us={:.1} latency_us={:.0}",
            c.allocations, c.bytes, c.switches, c.cpu_us, c.server_us, c.wall_us
        );
    }
    drop(sides);
    drop(admin);
    drop(db);
}
