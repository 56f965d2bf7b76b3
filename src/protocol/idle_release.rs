//! Idle release (DESIGN §5 "Placement": "idle tenants can be handed off after a configurable
//! idle time"; G10): with [`RouterOptions::idle_release`](crate::RouterOptions::idle_release),
//! a tenant no work has used for that long is handed off (`handoff.rs`), so that placement is
//! not pinned by tenants nobody uses, and the next request opens the tenant wherever it lands.
//!
//! A tenant counts as used from the end of its last work (`HeldLease::idle_for`, zero while
//! work is in flight), so one served without pause is never released. The check runs every
//! quarter of the idle time (between 50 ms and 10 s): a tenant is released between `idle` and
//! `1.25 × idle` after its last work. A handoff that finds work admitted meanwhile waits for it
//! (the drain) like any other, so nothing admitted is cut short.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use crate::state::replica::{HeldLease, Replica};

/// Hands off `replica`'s tenants idle for `idle`, until the router shuts down or is dropped.
pub(crate) async fn release_idle(
    replica: Weak<Replica>,
    idle: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let period = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let Some(replica) = replica.upgrade() else {
            return;
        };
        let idle_ones: Vec<Arc<HeldLease>> = crate::sync::lock(&replica.handles)
            .values()
            .filter(|handle| handle.is_serving() && handle.idle_for() >= idle)
            .cloned()
            .collect();
        drop(replica);
        for handle in idle_ones {
            if let Err(error) = crate::protocol::handoff::hand_over(&handle, None).await {
                // Work arrived (the drain gave up) or the tenure ended meanwhile: the next
                // round looks again.
                debug!(tenant = %handle.id, %error, "idle release did not hand the tenant off");
            }
        }
    }
}
