//! Release (DESIGN §5 "Handoff", its voluntary end without a target or a bound): stop taking
//! new work, wait for the work in flight however long it takes, then give the lease back
//! (`give_back`, the one way every protocol ends a lease), which NOTIFYs a replica waiting for
//! the tenant. A handoff is the same
//! with a drain timeout and an optional reservation (`handoff.rs`); abandon does not wait
//! (`abandon.rs`).

//!
//! Releases are batched. Each NOTIFYs `pgtenant_free`, and PostgreSQL serializes notifying
//! commits (a database-wide lock held through the commit's WAL flush), so one release per
//! transaction tops out at a few hundred per second however many run at once. Batched,
//! `close()` of thousands of tenants and mass handoffs go at the rate of batches, while a lone
//! release still goes out at once, in a batch of one.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tracing::warn;

use crate::credentials::Credentials;
use crate::db;
use crate::db::leases::Release;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::TenantId;
use crate::lease::{Epoch, Journal};
use crate::replica_id::ReplicaId;
use crate::state::lifecycle::Step;
use crate::state::releases::{Request, Requests};
use crate::state::replica::{HeldLease, Replica};

/// At most this many releases per transaction: keeps row locks and the statement small.
const MAX_BATCH: usize = 256;

/// Stops taking new work, waits for the work in flight (however long), then releases.
pub(crate) async fn release(handle: &Arc<HeldLease>) -> Result<()> {
    if !handle.step(Step::Release) {
        return Ok(());
    }
    handle.wait_idle().await;
    give_back(handle, Journal::Released, None).await
}

/// Releases `handle`'s lease (reserved for `to` when given) and reports how it ended. The
/// caller has stopped the handle's work already: drained it, or terminated what was in flight.
pub(crate) async fn give_back(
    handle: &Arc<HeldLease>,
    event: Journal,
    to: Option<&ReplicaId>,
) -> Result<()> {
    let replica = &handle.replica;
    // The handle stays in the replica's map, released, until the control plane has answered:
    // an acquisition of the tenant here meanwhile waits for that answer
    // (`Replica::earlier_work_done`), rather than acquiring it again under the same incarnation (which the control plane allows, and
    // which made a reserved handoff lose its tenant back to its owner: the release then found
    // the epoch moved and reported it lost; seen under load in examples/bench_placement.rs,
    // about one join in two).
    let released = released_by(handle, event, to).await;
    replica.detach(handle);
    let released = released?;
    let (tenant, epoch) = (handle.id.clone(), handle.epoch);
    replica.emit(match (released, event) {
        (false, _) => Event::Lost {
            tenant,
            epoch,
            reason: "already taken over when released".to_owned(),
        },
        (true, Journal::HandedOff) => Event::HandedOff {
            tenant,
            epoch,
            to: to.cloned(),
        },
        (true, Journal::Released) => Event::Released { tenant, epoch },
    });
    Ok(())
}

/// The release itself, through the batcher; whether the control plane released it.
async fn released_by(
    handle: &Arc<HeldLease>,
    event: Journal,
    to: Option<&ReplicaId>,
) -> Result<bool> {
    let replica = &handle.replica;
    let reservation = to.map(|target| (target.as_str(), replica.options.reservation));
    let released = match replica
        .releases
        .release(
            &handle.id,
            handle.epoch,
            &handle.credentials,
            event,
            reservation,
        )
        .await
    {
        Err(Error::NoSuchReplica { replica_id, .. }) => {
            // The target died between the check before the drain and this release: the
            // tenant is already drained, so it is released for anyone rather than kept. With
            // placement on, it is reserved for this replica instead: picked up here again at
            // once (or, when this replica is closing, by its home, `pgtenant.orphaned_homes`),
            // where a release for anyone left it free until a request came (seen at 10 000
            // tenants when a home restarted just as a tenant was being moved to it).
            let fallback = replica.options.placement.then(|| {
                (
                    handle.credentials.replica.as_str(),
                    replica.options.reservation,
                )
            });
            warn!(tenant = %handle.id, to = %replica_id, back_here = fallback.is_some(), "handoff target gone; released without it");
            replica
                .releases
                .release(
                    &handle.id,
                    handle.epoch,
                    &handle.credentials,
                    event,
                    fallback,
                )
                .await?
        }
        released => released?,
    };
    Ok(released)
}

/// Gives a lease acquired in vain straight back, before any handle served it (a schema ahead
/// of the code, a migration that failed for a reason other than the migration): on `client`,
/// at once, not batched. A failure is logged: the lease ends with its expiry.
pub(crate) async fn give_back_unused(
    shared: &Replica,
    client: &tokio_postgres::Client,
    id: &TenantId,
    epoch: Epoch,
    credentials: &Credentials,
) {
    let released =
        db::leases::release(client, credentials, &[(id, epoch, Journal::Released, None)]).await;
    if let Err(error) = released {
        warn!(tenant = %id, %error, replica = %shared.options.replica_id, "could not give the lease back; it ends with its expiry");
    }
}

/// Starts the release batcher for the queue whose end is `incoming`, on connections from
/// `pool`: it ends when the queue is dropped.
pub(crate) fn start_batcher(pool: Pool, incoming: Requests) {
    tokio::spawn(run(pool, incoming));
}

async fn run(pool: Pool, mut incoming: Requests) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while incoming.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // One order for every batch, so two transactions never lock tenant rows crosswise;
        // one statement per incarnation, whose credentials it carries.
        batch.sort_by(|a: &Request, b: &Request| {
            (a.credentials.incarnation, a.id.key()).cmp(&(b.credentials.incarnation, b.id.key()))
        });
        while !batch.is_empty() {
            let incarnation = batch[0].credentials.incarnation;
            let same = batch
                .iter()
                .take_while(|r| r.credentials.incarnation == incarnation)
                .count();
            let group: Vec<Request> = batch.drain(..same).collect();
            release_group(&pool, group).await;
        }
    }
}

async fn release_group(pool: &Pool, mut group: Vec<Request>) {
    let outcome = {
        let releases: Vec<Release<'_>> = group.iter().map(as_release).collect();
        release_on(pool, &group[0].credentials, &releases).await
    };
    crate::metrics::releases_batched(group.len());
    match outcome {
        Ok(released) => {
            for (request, released) in group.into_iter().zip(released) {
                let _ = request.reply.send(Ok(released));
            }
        }
        Err(error) if group.len() == 1 => {
            if let Some(request) = group.pop() {
                let _ = request.reply.send(Err(error));
            }
        }
        Err(error) => {
            // Each release alone, so each caller gets its own outcome and error.
            tracing::warn!(%error, size = group.len(), "batched release failed; releasing one by one");
            for request in group {
                let outcome = release_on(pool, &request.credentials, &[as_release(&request)])
                    .await
                    .map(|released| released.first().copied().unwrap_or(false));
                let _ = request.reply.send(outcome);
            }
        }
    }
}

async fn release_on(
    pool: &Pool,
    credentials: &Credentials,
    releases: &[Release<'_>],
) -> Result<Vec<bool>> {
    let client = pool.get().await.map_err(pool_error("release leases"))?;
    db::leases::release(&client, credentials, releases).await
}

/// A queued request as the control-plane call takes it.
fn as_release(request: &Request) -> Release<'_> {
    (
        &request.id,
        request.epoch,
        request.event,
        request
            .reserve
            .as_ref()
            .map(|(replica, window)| (replica.as_str(), *window)),
    )
}
