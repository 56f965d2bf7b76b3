//! Routers as the tests start them: short leases ([`TTL`]), the fencing under test, tenant and
//! replica ids, and work on tenant handles (concurrent callers, work held in flight).

use std::time::Duration;

use pgtenant::{Fencing, Router, RouterOptions, TenantHandle, TenantId};
use tokio::sync::oneshot;

/// Short leases so takeover tests finish quickly; margin and period leave room for jitter.
pub(crate) const TTL: Duration = Duration::from_millis(1500);

/// The fencing the tests' routers use: `PGTENANT_TEST_FENCING=session|transaction` (inherited by
/// replica child processes), else the default, which is session fencing on a direct server.
/// `.ci/run` runs the lease and takeover tests once more with `transaction`.
pub(crate) fn fencing() -> Fencing {
    match std::env::var("PGTENANT_TEST_FENCING").as_deref() {
        Ok("session") => Fencing::Session,
        Ok("transaction") => Fencing::Transaction,
        _ => Fencing::Auto,
    }
}

pub(crate) fn options(url: &str, replica: &str) -> RouterOptions {
    let options = RouterOptions::from_url(replica, url)
        .expect("url")
        .ttl(TTL)
        .margin(Duration::from_millis(400))
        .heartbeat_period(Duration::from_millis(300))
        .reconnect_backoff(Duration::from_millis(100), Duration::from_secs(1))
        .pool_size(8)
        .fencing(fencing());
    // A child process whose lease must outlive the test (ms).
    let options = match std::env::var("PGTENANT_TEST_TTL").map(|ms| ms.parse::<u64>()) {
        Ok(Ok(ttl_ms)) => options.ttl(Duration::from_millis(ttl_ms)),
        _ => options,
    };
    // A child process of a placement test: placement on, with this stability window (ms).
    match std::env::var("PGTENANT_TEST_PLACEMENT").map(|ms| ms.parse::<u64>()) {
        Ok(Ok(stable_ms)) => placed(options, replica, Duration::from_millis(stable_ms)),
        _ => options,
    }
}

/// `options` with placement on, stable after `stable_for`, reached at `test://<replica>`.
pub(crate) fn placed(options: RouterOptions, replica: &str, stable_for: Duration) -> RouterOptions {
    options
        .placement(true)
        .placement_stable_for(stable_for)
        .address(format!("test://{replica}"))
}

pub(crate) async fn router(url: &str, replica: &str) -> Router {
    Router::start(options(url, replica))
        .await
        .expect("router starts")
}

pub(crate) fn replica(id: &str) -> pgtenant::ReplicaId {
    pgtenant::ReplicaId::new(id).expect("a valid replica id")
}

pub(crate) fn tenant(name: &str) -> TenantId {
    TenantId::new("acme", name).expect("valid id")
}

/// Polls all the futures concurrently on this task, as concurrent callers would.
pub(crate) async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    futures_util::future::join_all(futures).await
}

/// Starts work on `handle` that stays in flight until `release` fires; returns once it runs.
pub(crate) async fn hold_work(
    handle: &TenantHandle,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<pgtenant::Result<()>>,
) {
    let (release, released) = oneshot::channel::<()>();
    let (started_tx, started) = oneshot::channel::<()>();
    let handle = handle.clone();
    let task = tokio::spawn(async move {
        handle
            .run(move |tx| {
                Box::pin(async move {
                    tx.execute("SELECT 1", &[]).await?;
                    let _ = started_tx.send(());
                    let _ = released.await;
                    Ok::<_, pgtenant::Error>(())
                })
            })
            .await
    });
    started.await.expect("work started");
    (release, task)
}
