//! Bounded backend memory (issue 21): PostgreSQL never gives back the catalog caches a backend
//! filled for the tenant schemas it touched, so a pooled data connection that served many
//! tenants grows without bound. `RouterOptions::max_tenants_per_connection` closes a connection
//! once it served that many distinct tenants: its backend's memory stays flat past the bound.

mod support;

use pgtenant::{Router, TenantHandle};
use support::{database, options, tenant};

const TENANTS: usize = 150;

/// Five tables with an index each: every tenant adds a few dozen KB of catalog cache to each
/// backend that touches it.
async fn touch(handle: &TenantHandle) -> (i32, i64) {
    handle
        .run(|tx| {
            Box::pin(async move {
                for t in 0..5 {
                    tx.batch_execute(&format!(
                        "CREATE TABLE IF NOT EXISTS t{t} (id bigint PRIMARY KEY, v text);
                         INSERT INTO t{t} VALUES (1, 'x') ON CONFLICT DO NOTHING;
                         SELECT count(*) FROM t{t}"
                    ))
                    .await?;
                }
                let row = tx
                    .query_one(
                        // The catalog caches and their children (each relation's index info is
                        // a context of its own under CacheMemoryContext), bytes in use: the
                        // blocks allocated (total_bytes) grow by doubling, so a step of 1 MB
                        // can fall inside the first connection's life or after it depending on
                        // what else the backend looked up (V12's creation-time checks moved it).
                        "SELECT pg_backend_pid(), (SELECT sum(used_bytes)::bigint
                           FROM pg_backend_memory_contexts
                          WHERE name = 'CacheMemoryContext' OR parent = 'CacheMemoryContext')",
                        &[],
                    )
                    .await?;
                Ok::<_, pgtenant::Error>((row.get(0), row.get(1)))
            })
        })
        .await
        .expect("tenant work")
}

/// Serves `TENANTS` tenants one after the other on a one-connection pool; returns the backends
/// seen and the cache memory after each tenant.
async fn serve(url: &str, replica: &str, max_tenants: usize) -> (usize, Vec<i64>) {
    let router = Router::start(
        options(url, replica)
            .pool_size(1)
            .max_tenants_per_connection(max_tenants),
    )
    .await
    .expect("router");
    let mut pids = std::collections::BTreeSet::new();
    let mut memory = Vec::new();
    for i in 0..TENANTS {
        let handle = router
            .open_or_create(&tenant(&format!("{replica}-{i}")))
            .await
            .expect("open");
        let (pid, cache) = touch(&handle).await;
        pids.insert(pid);
        memory.push(cache);
    }
    router.close().await;
    (pids.len(), memory)
}

#[tokio::test]
async fn a_connection_is_recycled_after_serving_its_bound_of_tenants_and_backend_memory_stays_flat()
{
    let (db, _client) = database().await;
    const BOUND: usize = 10;
    let (bounded_backends, bounded) = serve(db.url(), "bounded", BOUND).await;
    let (unbounded_backends, unbounded) = serve(db.url(), "unbounded", 1_000_000).await;
    let kb = |bytes: i64| bytes / 1024;
    // Within the first connection's life both runs are alike; past it, only the bounded one
    // starts again from a fresh backend.
    let first_life = |memory: &[i64]| memory[..=BOUND].iter().copied().max().unwrap_or(0);
    let past = |memory: &[i64]| memory[BOUND + 1..].iter().copied().max().unwrap_or(0);
    println!(
        "CacheMemoryContext and its children over {TENANTS} tenants on one pooled connection: \
         bound {BOUND}: at most {} KB in the first connection's life, at most {} KB after it \
         ({bounded_backends} backends); no bound: {} KB then, {} KB at the end (1 backend)",
        kb(first_life(&bounded)),
        kb(past(&bounded)),
        kb(first_life(&unbounded)),
        kb(*unbounded.last().unwrap_or(&0))
    );
    // A connection goes once it served more than BOUND: BOUND + 1 tenants each.
    assert!(
        bounded_backends >= TENANTS / (BOUND + 1),
        "the connection was recycled every {} tenants: {bounded_backends} backends",
        BOUND + 1
    );
    assert_eq!(
        unbounded_backends, 1,
        "without a bound one backend served them all"
    );
    assert!(
        past(&bounded) <= first_life(&bounded) + 256 * 1024,
        "flat past the bound: {bounded:?}"
    );
    assert!(
        *unbounded.last().unwrap_or(&0) > first_life(&unbounded) + 512 * 1024,
        "without the bound the caches grow: {unbounded:?}"
    );
}

#[tokio::test]
async fn a_bound_of_zero_is_refused_before_anything_starts() {
    let (db, _client) = database().await;
    let refused = Router::start(options(db.url(), "zero").max_tenants_per_connection(0))
        .await
        .expect_err("zero refused");
    assert!(
        matches!(&refused, pgtenant::Error::InvalidOption { option, .. } if *option == "max_tenants_per_connection"),
        "{refused}"
    );
}
