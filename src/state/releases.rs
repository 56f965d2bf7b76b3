//! The one call of `pgtenant.release` (DESIGN §5 "Handoff", "Abandon", "Close"), and the
//! router's release batcher, which every voluntary end goes through.
//!
//! Releases are batched. Each NOTIFYs `pgtenant_free`, and PostgreSQL serializes notifying
//! commits (a database-wide lock held through the commit's WAL flush), so one release per
//! transaction tops out at a few hundred per second however many run at once. Batched,
//! `close()` of thousands of tenants and mass handoffs go at the rate of batches, while a lone
//! release still goes out at once, in a batch of one.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::Type;

use crate::db;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, Journal};
use crate::replica_id::ReplicaId;
use crate::sqlstate;
use crate::state::credentials::{millis, Credentials};

/// At most this many releases per transaction: keeps row locks and the statement small.
const MAX_BATCH: usize = 256;

/// One release: the tenant, the lease's epoch, the journal event (`released`, `handed_off`),
/// and an optional reservation (target replica, window).
pub(crate) type Release<'a> = (&'a TenantId, Epoch, Journal, Option<(&'a str, Duration)>);

/// What [`ReleaseQueue::release`] asks of the batcher.
struct Request {
    id: TenantId,
    epoch: Epoch,
    credentials: Arc<Credentials>,
    event: Journal,
    reserve: Option<(String, Duration)>,
    reply: oneshot::Sender<Result<bool>>,
}

impl Request {
    fn as_release(&self) -> Release<'_> {
        (
            &self.id,
            self.epoch,
            self.event,
            self.reserve
                .as_ref()
                .map(|(replica, window)| (replica.as_str(), *window)),
        )
    }
}

/// The router's way to its release batcher, a task that lives as long as this queue.
pub(crate) struct ReleaseQueue {
    requests: mpsc::UnboundedSender<Request>,
}

impl ReleaseQueue {
    /// Starts the batcher for releases on connections from `pool`.
    pub(crate) fn start(pool: Pool) -> ReleaseQueue {
        let (requests, incoming) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, incoming));
        ReleaseQueue { requests }
    }

    /// Releases the lease: `Ok(false)` when it was no longer this incarnation's at this
    /// epoch. `reserve` keeps the tenant for a live replica for a window.
    pub(crate) async fn release(
        &self,
        id: &TenantId,
        epoch: Epoch,
        credentials: &Arc<Credentials>,
        event: Journal,
        reserve: Option<(&str, Duration)>,
    ) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            id: id.clone(),
            epoch,
            credentials: credentials.clone(),
            event,
            reserve: reserve.map(|(replica, window)| (replica.to_owned(), window)),
            reply,
        };
        // The batcher ends only when this queue is dropped, or if it panicked.
        self.requests
            .send(request)
            .map_err(|_| Error::RouterClosed)?;
        answer.await.map_err(|_| Error::RouterClosed)?
    }
}

async fn run(pool: Pool, mut incoming: mpsc::UnboundedReceiver<Request>) {
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
        let releases: Vec<Release<'_>> = group.iter().map(Request::as_release).collect();
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
                let outcome = release_on(pool, &request.credentials, &[request.as_release()])
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
    release_now(&client, credentials, releases).await
}

/// Releases leases of one incarnation in one statement (one transaction: all of them commit,
/// with one WAL flush, or none does): for each, true when released, false when the lease was
/// no longer the caller's at that epoch.
pub(crate) async fn release_now(
    client: &tokio_postgres::Client,
    credentials: &Credentials,
    releases: &[Release<'_>],
) -> Result<Vec<bool>> {
    let keys: Vec<&str> = releases.iter().map(|r| r.0.key()).collect();
    let epochs: Vec<i64> = releases.iter().map(|r| r.1.get()).collect();
    let events: Vec<&str> = releases.iter().map(|r| r.2.as_str()).collect();
    let reserve_for: Vec<Option<&str>> = releases
        .iter()
        .map(|r| r.3.map(|(replica, _)| replica))
        .collect();
    let reserve_ms: Vec<Option<i32>> = releases
        .iter()
        .map(|r| r.3.map(|(_, window)| millis(window)))
        .collect();
    let (secret, incarnation) = (credentials.secret(), credentials.incarnation.get());
    let context = || match releases {
        [(id, ..)] => format!("release tenant {id}"),
        _ => format!("release {} leases", releases.len()),
    };
    let rows = db::call(
        client,
        "SELECT ord, released FROM pgtenant.release($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&keys, Type::TEXT_ARRAY),
            (&epochs, Type::INT8_ARRAY),
            (&events, Type::TEXT_ARRAY),
            (&reserve_for, Type::TEXT_ARRAY),
            (&reserve_ms, Type::INT4_ARRAY),
        ],
    )
    .await
    .map_err(|error| match error.as_db_error() {
        Some(db) if db.code().code() == sqlstate::NO_SUCH_REPLICA => Error::NoSuchReplica {
            replica_id: releases
                .iter()
                .find_map(|r| r.3.map(|(replica, _)| ReplicaId::unchecked(replica)))
                .unwrap_or_else(|| ReplicaId::unchecked("")),
            message: db.message().to_owned(),
        },
        _ => Error::db_with(context)(error),
    })?;
    let mut released = vec![false; releases.len()];
    for row in rows {
        let ord: i64 = row.try_get(0).map_err(Error::db_with(context))?;
        let ok: bool = row.try_get(1).map_err(Error::db_with(context))?;
        if let Some(slot) = usize::try_from(ord - 1)
            .ok()
            .and_then(|i| released.get_mut(i))
        {
            *slot = ok;
        }
    }
    Ok(released)
}
