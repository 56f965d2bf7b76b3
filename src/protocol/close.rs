//! Close (DESIGN §5 "Close"): refuse new opens, wait for acquisitions in flight, hand off
//! every open tenant `close_concurrency` at a time (with placement on, each to its next home,
//! DESIGN §5 "Placement"), wait for forgets under way, and report the
//! tenants whose handoff failed. The router then stops the heartbeat task, which deregisters
//! the incarnation and frees the liveness lock (`heartbeat.rs`, `replica_start.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::warn;

use crate::error::Error;
use crate::id::TenantId;
use crate::lease::{Epoch, HandleState};
use crate::protocol::handoff::hand_over;
use crate::replica_id::ReplicaId;
use crate::state::replica::{HeldLease, Replica};
use crate::sync::{in_lanes, lock};

/// What [`Router::close`](crate::Router::close) did. Serializes (for a shutdown log line) with each failure as
/// `{"tenant", "kind", "message"}`.
#[derive(Debug, Default, serde::Serialize)]
#[non_exhaustive]
pub struct CloseReport {
    /// Tenants handed off.
    pub handed_off: Vec<TenantId>,
    /// Tenants whose forget was under way when close began: waited for (up to the drain
    /// timeout) and forgotten.
    pub forgotten: Vec<TenantId>,
    /// Tenants whose handoff failed, with why (a drain timeout, a lost lease, the database).
    /// Their leases ended with the replica's deregistration all the same.
    #[serde(serialize_with = "serialize_failures")]
    pub failed: Vec<(TenantId, Error)>,
}

fn serialize_failures<S: serde::Serializer>(
    failed: &[(TenantId, Error)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    #[derive(serde::Serialize)]
    struct Failure<'a> {
        tenant: &'a TenantId,
        kind: crate::ErrorKind,
        message: String,
    }
    serializer.collect_seq(failed.iter().map(|(tenant, error)| Failure {
        tenant,
        kind: error.kind(),
        message: error.to_string(),
    }))
}

/// Hands off every tenant served here, `close_concurrency` at a time, once `shared` is marked
/// closed (so no open adds one).
pub(crate) async fn hand_off_all(shared: &Replica) -> CloseReport {
    // An acquisition in flight either fails or installs its handle, sees the router closed
    // and gives the lease back: wait for them all before handing off and deregistering.
    let options = &shared.options;
    shared
        .acquisitions_done(options.open_timeout.saturating_add(options.drain_timeout))
        .await;
    let queue: Vec<Arc<HeldLease>> = lock(&shared.handles).values().cloned().collect();
    let homes = if options.placement {
        leave(shared).await;
        next_homes(shared, queue.len()).await
    } else {
        HashMap::new()
    };
    let report = Mutex::new(CloseReport::default());
    let (report_ref, homes) = (&report, &homes);
    in_lanes(queue, options.close_concurrency, |inner| async move {
        let id = inner.id.clone();
        let home = homes.get(&id).filter(|(epoch, _)| *epoch == inner.epoch);
        match hand_over(&inner, home.map(|(_, home)| home)).await {
            Ok(()) => lock(report_ref).handed_off.push(id),
            // A forget (or another handoff) is under way: wait for it to finish.
            Err(Error::Draining { .. }) if inner.wait_ended(options.drain_timeout).await => {
                let mut report = lock(report_ref);
                if inner.state() == HandleState::Forgotten {
                    report.forgotten.push(id);
                } else {
                    report.handed_off.push(id);
                }
            }
            Err(error) => {
                warn!(tenant = %id, %error, "handoff on close failed");
                lock(report_ref).failed.push((id, error));
            }
        }
    })
    .await;
    // Connections parked for tenants now handed off go back to the pool, to be closed with it.
    shared.parking.clear();
    report
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// With placement on, this replica stops being a home before it hands its tenants off, so the
/// others stop moving tenants to it meanwhile (at 10 000 tenants they moved 1 to 3 back to it
/// before it deregistered, which it then refused to open). Best effort: a tenant handed to it
/// all the same is taken by its home once it is gone (`pgtenant.orphaned_homes`).
async fn leave(shared: &Replica) {
    let left = async {
        let credentials = shared.current_credentials()?;
        let client = shared
            .pool
            .get()
            .await
            .map_err(crate::error::pool_error("stop being a home"))?;
        crate::db::replicas::leave(&client, &credentials).await
    };
    if let Err(error) = left.await {
        warn!(%error, "could not stop being a home before closing; handing off all the same");
    }
}

/// With placement on, each tenant's next home: its home among the other live, stable replicas
/// (`pgtenant.placement_moves` as if this replica had left), so a rolling restart hands each
/// tenant to the replica it belongs on next, warm, rather than to whoever asks first. Empty
/// when the database cannot say (the tenants are then released for anyone, as without
/// placement).
async fn next_homes(shared: &Replica, held: usize) -> HashMap<TenantId, (Epoch, ReplicaId)> {
    let options = &shared.options;
    let client = match shared.pool.get().await {
        Ok(client) => client,
        Err(error) => {
            warn!(%error, "no connection to find the tenants' next homes; releasing them for anyone");
            return HashMap::new();
        }
    };
    match crate::db::placement::placement_moves(
        &client,
        &options.replica_id,
        options.placement_stable_for,
        true,
        held.saturating_add(1),
    )
    .await
    {
        Ok(moves) => moves
            .into_iter()
            .map(|m| (m.tenant, (m.epoch, m.home)))
            .collect(),
        Err(error) => {
            warn!(%error, "could not find the tenants' next homes; releasing them for anyone");
            HashMap::new()
        }
    }
}
