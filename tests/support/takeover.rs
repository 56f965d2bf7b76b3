//! Takeover and serving again: opening a tenant while its old holder's lease runs out, and how
//! soon a replica process must serve again after a fault ([`SERVE_AGAIN_BOUND`], DESIGN G9).

use std::time::Duration;

use pgtenant::{Router, TenantHandle, TenantId};

use super::child::ReplicaProcess;

/// Opens `id`, retrying while its holder is still alive by the database's account, for at most
/// `limit`.
pub(crate) async fn take_over(router: &Router, id: &TenantId, limit: Duration) -> TenantHandle {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match router.open(id).await {
            Ok(handle) => return handle,
            Err(pgtenant::Error::LeaseHeld { expires_in, .. })
                if std::time::Instant::now() < deadline =>
            {
                let wait = expires_in.unwrap_or_default().max(Duration::from_millis(2));
                tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            }
            Err(other) => panic!("takeover of {id} failed: {other}"),
        }
    }
}

/// How long after its last fault ended a replica must serve again (DESIGN G9): 3 × ttl plus
/// the tests' reconnect backoff (100 ms doubling to 1 s) and room for a loaded machine.
pub(crate) const SERVE_AGAIN_BOUND: Duration = Duration::from_millis(3 * 1500 + 1000 + 2500);

/// Asks `child` to open `ledger` and write to it until a write is acknowledged (G9); returns how
/// long that took, or panics past `bound` with the last refusal.
pub(crate) async fn serves_again(
    child: &mut ReplicaProcess,
    ledger: &str,
    seq: i64,
    bound: Duration,
) -> Duration {
    let started = std::time::Instant::now();
    let mut last = String::new();
    while started.elapsed() < bound {
        let opened = child
            .request(&format!("open {ledger}"))
            .await
            .unwrap_or_default();
        if opened.starts_with("opened") {
            let wrote = child
                .request(&format!("write {ledger} {seq}"))
                .await
                .unwrap_or_default();
            if wrote.starts_with("ok") {
                return started.elapsed();
            }
            last = wrote;
        } else {
            last = opened;
        }
        // A refusal is answered at once; this is the retry pace of a client, not a wait for
        // a condition the test could observe.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "replica {} did not serve again within {bound:?} (G9); last answer: {last}",
        child.replica
    );
}
