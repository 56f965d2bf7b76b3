//! Handoff (DESIGN §5 "Handoff (lock transfer)"): refuse new work, drain within the drain
//! timeout (a failed drain leaves the tenant serving), then release the lease, optionally
//! reserved for a target replica, through the release batcher (`state/releases.rs`), whose
//! NOTIFY wakes a replica waiting for the tenant. Also handoff requests (`request_handoff`'s
//! row, which the control plane authenticates, and its NOTIFY) and answering other replicas'
//! requests once the control plane confirms them (G8). The plain release, which drains however
//! long, is `release.rs`.

use std::sync::Arc;

use tokio::sync::broadcast;
use tracing::{debug, warn};

use crate::db;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::TenantId;
use crate::lease::{Epoch, HandleState, Journal};
use crate::options::HandoffPolicy;
use crate::protocol::release::give_back;
use crate::refusal::{self, Scope};
use crate::replica_id::ReplicaId;
use crate::state::lifecycle::Step;
use crate::state::liveness::{Notice, HANDOFF_CHANNEL};
use crate::state::replica::{HeldLease, Replica};
use crate::sync::lock;

/// A handoff reserved for `replica`, refused before anything changes unless it names a
/// registered, live replica.
pub(crate) async fn hand_over_to(handle: &Arc<HeldLease>, replica: &ReplicaId) -> Result<()> {
    ensure_live_replica(&handle.replica, replica).await?;
    hand_over(handle, Some(replica)).await
}

/// A handoff: refuse new work, drain within the drain timeout, release (reserved for `to`).
pub(crate) async fn hand_over(handle: &Arc<HeldLease>, to: Option<&ReplicaId>) -> Result<()> {
    if !handle.step(Step::Drain) {
        return Err(match handle.state() {
            HandleState::Draining => Error::Draining {
                tenant: handle.id.clone(),
            },
            HandleState::Lost => handle.lease_lost("lost"),
            _ => handle.lease_lost("released"),
        });
    }
    let replica = &handle.replica;
    replica.emit(Event::Draining {
        tenant: handle.id.clone(),
        epoch: handle.epoch,
        in_flight: handle.in_flight(),
    });
    let timeout = replica.options.drain_timeout;
    let started = std::time::Instant::now();
    let drained = tokio::time::timeout(timeout, handle.wait_idle()).await;
    crate::metrics::drain_time(started.elapsed());
    if drained.is_err() {
        let in_flight = handle.in_flight();
        replica.emit(Event::DrainTimeout {
            tenant: handle.id.clone(),
            epoch: handle.epoch,
            in_flight,
        });
        // A failed drain leaves the tenant serving, unless the lease ended meanwhile.
        handle.step(Step::Resume);
        return Err(Error::DrainTimeout {
            tenant: handle.id.clone(),
            in_flight,
            timeout,
        });
    }
    if !handle.step(Step::HandOff) {
        return Err(handle.lease_lost("lost"));
    }
    give_back(handle, Journal::HandedOff, to).await
}

/// Asks the owner of `id` (whoever it is) to hand it to this replica: a row written by
/// `pgtenant.request_handoff`, which checks this incarnation's secret, and the NOTIFY on
/// `pgtenant_handoff` that wakes every replica's lease session (G8: the NOTIFY alone, which any
/// role can send, makes no owner act).
pub(crate) async fn request(shared: &Replica, id: &TenantId) -> Result<()> {
    let credentials = shared.current_credentials()?;
    let client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("request a handoff"))?;
    let scope = Scope {
        doing: "request a handoff",
        tenant: Some(id),
        epoch: Epoch::new(0),
        replica: credentials.replica.as_str(),
    };
    db::leases::request_handoff(&client, id, &credentials)
        .await
        .map_err(|error| refusal::map(error, &scope))?;
    Ok(())
}

/// Whether the request a notice announces is real: `pgtenant.take_handoff_request` consumes the
/// row the requester's live incarnation wrote for this tenant, which this replica holds under
/// `inner`'s lease. A notice without such a row (forged by any role that can NOTIFY, or a
/// request of a replica of the previous release, which writes none) is not.
async fn take_request(inner: &HeldLease, requester: &str) -> Result<bool> {
    let shared = &inner.replica;
    let client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("check a handoff request"))?;
    let credentials = &inner.credentials;
    db::leases::take_handoff_request(&client, credentials, &inner.id, requester).await
}

/// Answers other replicas' handoff requests for tenants served here, by policy, once the
/// control plane confirms each. Holds only a weak reference so it ends with the router. The
/// checks run one at a time: a flood of forged notices costs one statement each, never more
/// than one connection, and what the flood outruns is dropped with the oldest notices (a
/// genuine request among them times out at its requester, as a refused one does).
pub(crate) async fn serve_requests(
    shared: std::sync::Weak<Replica>,
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
        if crate::replica_id::check("requester", &request.requester).is_err()
            || shared.options.replica_id == request.requester
        {
            continue;
        }
        let requester = ReplicaId::unchecked(request.requester);
        let Some(inner) = lock(&shared.handles)
            .get(&tenant)
            .filter(|h| h.is_serving())
            .cloned()
        else {
            continue;
        };
        drop(shared);
        match take_request(&inner, requester.as_str()).await {
            Ok(true) => {}
            Ok(false) => {
                debug!(%tenant, %requester, "handoff notice without a request: ignored");
                continue;
            }
            Err(error) => {
                warn!(%tenant, %error, "could not check a handoff request");
                continue;
            }
        }
        let accepted = inner.replica.options.handoff_policy == HandoffPolicy::Accept;
        inner.replica.emit(Event::HandoffRequested {
            tenant: tenant.clone(),
            requester: requester.clone(),
            accepted,
        });
        if accepted {
            tokio::spawn(async move {
                if let Err(error) = hand_over_to(&inner, &requester).await {
                    warn!(%tenant, %error, "requested handoff failed");
                }
            });
        }
    }
}

/// Refuses a handoff target that is not a registered, live replica, before anything changes: it
/// would not pick the tenant up (and a reservation for it binds nobody, control plane V21).
async fn ensure_live_replica(shared: &Replica, replica: &ReplicaId) -> Result<()> {
    let client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("check a handoff target"))?;
    match db::replicas::replica_liveness(&client, replica).await? {
        Some(true) => Ok(()),
        Some(false) => Err(Error::NoSuchReplica {
            replica_id: replica.clone(),
            message: format!("replica {replica} is registered but not alive"),
        }),
        None => Err(Error::NoSuchReplica {
            replica_id: replica.clone(),
            message: format!("no replica {replica} has ever registered with this database"),
        }),
    }
}
