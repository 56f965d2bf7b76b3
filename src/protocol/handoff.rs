//! Handoff (DESIGN §5 "Handoff (lock transfer)"): refuse new work, drain within the drain
//! timeout (a failed drain leaves the tenant serving), then release the lease, optionally
//! reserved for a target replica, through the release batcher (`state/releases.rs`), whose
//! NOTIFY wakes a replica waiting for the tenant. Also handoff requests (`request_handoff`'s
//! NOTIFY) and answering other replicas' requests. The plain release, which drains however
//! long, is `release.rs`.

use std::sync::Arc;

use tokio::sync::broadcast;
use tracing::warn;

use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::TenantId;
use crate::lease::{HandleState, Journal};
use crate::options::{validate_replica_id, HandoffPolicy};
use crate::state::leases::give_back;
use crate::state::liveness::{Notice, HANDOFF_CHANNEL};
use crate::state::shared::{HandleInner, Shared};
use crate::sync::lock;

/// A handoff reserved for `replica`, refused before anything changes unless it names a
/// registered, live replica.
pub(crate) async fn hand_over_to(handle: &Arc<HandleInner>, replica: &str) -> Result<()> {
    validate_replica_id("replica", replica)?;
    handle.router.ensure_live_replica(replica).await?;
    hand_over(handle, Some(replica)).await
}

/// A handoff: refuse new work, drain within the drain timeout, release (reserved for `to`).
pub(crate) async fn hand_over(handle: &Arc<HandleInner>, to: Option<&str>) -> Result<()> {
    if !handle.transition(HandleState::Serving, HandleState::Draining) {
        return Err(match handle.state() {
            HandleState::Draining => Error::Draining {
                tenant: handle.id.clone(),
            },
            HandleState::Lost => handle.lease_lost("lost"),
            _ => handle.lease_lost("released"),
        });
    }
    let router = &handle.router;
    router.emit(Event::Draining {
        tenant: handle.id.clone(),
        epoch: handle.epoch,
        in_flight: handle.in_flight(),
    });
    let timeout = router.options.drain_timeout;
    let started = std::time::Instant::now();
    let drained = tokio::time::timeout(timeout, handle.wait_idle()).await;
    crate::metrics::drain_time(started.elapsed());
    if drained.is_err() {
        let in_flight = handle.in_flight();
        router.emit(Event::DrainTimeout {
            tenant: handle.id.clone(),
            epoch: handle.epoch,
            in_flight,
        });
        // A failed drain leaves the tenant serving, unless the lease ended meanwhile.
        handle.transition(HandleState::Draining, HandleState::Serving);
        return Err(Error::DrainTimeout {
            tenant: handle.id.clone(),
            in_flight,
            timeout,
        });
    }
    if !handle.transition(HandleState::Draining, HandleState::Released) {
        return Err(handle.lease_lost("lost"));
    }
    give_back(handle, Journal::HandedOff, to).await
}

/// Asks the owner of `id` (whoever it is) to hand it to this replica: a NOTIFY on
/// `pgtenant_handoff` that every replica's lease session hears.
pub(crate) async fn request(shared: &Shared, id: &TenantId) -> Result<()> {
    let client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("request a handoff"))?;
    let payload = serde_json::json!({
        "tenant": id.key(),
        "requester": shared.options.replica_id,
    })
    .to_string();
    client
        .execute("SELECT pg_notify($1, $2)", &[&HANDOFF_CHANNEL, &payload])
        .await
        .map_err(Error::db_with(|| {
            format!("request a handoff of tenant {id}")
        }))?;
    Ok(())
}

/// Answers other replicas' handoff requests for tenants served here, by policy. Holds only a
/// weak reference so it ends with the router.
pub(crate) async fn serve_requests(
    shared: std::sync::Weak<Shared>,
    mut notices: broadcast::Receiver<Notice>,
) {
    #[derive(serde::Deserialize)]
    struct Request {
        tenant: String,
        requester: String,
    }
    loop {
        let notice = match notices.recv().await {
            Ok(notice) => notice,
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if notice.channel != HANDOFF_CHANNEL {
            continue;
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Ok(request) = serde_json::from_str::<Request>(&notice.payload) else {
            continue;
        };
        let Ok(tenant) = TenantId::parse(&request.tenant) else {
            continue;
        };
        if validate_replica_id("requester", &request.requester).is_err() {
            continue;
        }
        let Some(inner) = lock(&shared.handles)
            .get(&tenant)
            .filter(|h| h.is_serving())
            .cloned()
        else {
            continue;
        };
        let accepted = shared.options.handoff_policy == HandoffPolicy::Accept;
        shared.emit(Event::HandoffRequested {
            tenant: tenant.clone(),
            requester: request.requester.clone(),
            accepted,
        });
        if accepted {
            tokio::spawn(async move {
                if let Err(error) = hand_over_to(&inner, &request.requester).await {
                    warn!(%tenant, %error, "requested handoff failed");
                }
            });
        }
    }
}
