//! Lease releases, batched: the releases that wait while one batch commits go together into the
//! next, one transaction for all of them.
//!
//! Each release NOTIFYs `pgtenant_free`, and PostgreSQL serializes notifying commits (a
//! database-wide lock held through the commit's WAL flush), so one release per transaction tops
//! out at a few hundred per second however many run at once. Batched, `close()` of thousands of
//! tenants and mass handoffs go at the rate of batches, while a lone release still goes out at
//! once, in a batch of one.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::liveness::millis;
use crate::router::{pool_error, release_lease};

/// At most this many releases per transaction: keeps row locks and the statement small.
const MAX_BATCH: usize = 256;

/// What [`ReleaseQueue::release`] asks of the batcher.
struct Request {
    id: TenantId,
    epoch: i64,
    incarnation: i64,
    event: &'static str,
    reserve: Option<(String, Duration)>,
    reply: oneshot::Sender<Result<bool>>,
}

/// The router's way to its release batcher, a task that lives as long as this queue.
pub(crate) struct ReleaseQueue {
    requests: mpsc::UnboundedSender<Request>,
}

impl ReleaseQueue {
    /// Starts the batcher for `replica`'s releases on connections from `pool`.
    pub(crate) fn start(pool: Pool, replica: String) -> ReleaseQueue {
        let (requests, incoming) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, replica, incoming));
        ReleaseQueue { requests }
    }

    /// Releases the lease (`pgtenant.release`): `Ok(false)` when it was no longer this
    /// incarnation's at this epoch. `reserve` keeps the tenant for a replica for a window.
    pub(crate) async fn release(
        &self,
        id: &TenantId,
        epoch: i64,
        incarnation: i64,
        event: &'static str,
        reserve: Option<(&str, Duration)>,
    ) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            id: id.clone(),
            epoch,
            incarnation,
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

async fn run(pool: Pool, replica: String, mut incoming: mpsc::UnboundedReceiver<Request>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while incoming.recv_many(&mut batch, MAX_BATCH).await > 0 {
        if batch.len() == 1 {
            for request in batch.drain(..) {
                let outcome = release_one(&pool, &replica, &request).await;
                let _ = request.reply.send(outcome);
            }
            continue;
        }
        // One order for every batch, so two transactions never lock tenant rows crosswise.
        batch.sort_by(|a, b| a.id.key().cmp(b.id.key()));
        match release_batch(&pool, &replica, &batch).await {
            Ok(released) => {
                for (request, released) in batch.drain(..).zip(released) {
                    let _ = request.reply.send(Ok(released));
                }
            }
            Err(error) => {
                // Each release alone, so each caller gets its own outcome and error.
                tracing::warn!(%error, size = batch.len(), "batched release failed; releasing one by one");
                for request in batch.drain(..) {
                    let outcome = release_one(&pool, &replica, &request).await;
                    let _ = request.reply.send(outcome);
                }
            }
        }
    }
}

async fn release_batch(pool: &Pool, replica: &str, batch: &[Request]) -> Result<Vec<bool>> {
    let client = pool.get().await.map_err(pool_error("release leases"))?;
    let keys: Vec<&str> = batch.iter().map(|r| r.id.key()).collect();
    let epochs: Vec<i64> = batch.iter().map(|r| r.epoch).collect();
    let incarnations: Vec<i64> = batch.iter().map(|r| r.incarnation).collect();
    let events: Vec<&str> = batch.iter().map(|r| r.event).collect();
    let reserve_for: Vec<Option<&str>> = batch
        .iter()
        .map(|r| r.reserve.as_ref().map(|(replica, _)| replica.as_str()))
        .collect();
    let reserve_ms: Vec<Option<i32>> = batch
        .iter()
        .map(|r| r.reserve.as_ref().map(|(_, window)| millis(*window)))
        .collect();
    // One statement is one transaction: all of them commit, with one WAL flush, or none does.
    let rows = client
        .query_typed(
            "SELECT r.ord, pgtenant.release(r.key, r.epoch, $1, r.incarnation, r.event,
                                            r.reserve_for, r.reserve_ms)
               FROM unnest($2::text[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::int4[])
                    WITH ORDINALITY AS r(key, epoch, incarnation, event, reserve_for, reserve_ms, ord)
              ORDER BY r.ord",
            &[
                (&replica, Type::TEXT),
                (&keys, Type::TEXT_ARRAY),
                (&epochs, Type::INT8_ARRAY),
                (&incarnations, Type::INT8_ARRAY),
                (&events, Type::TEXT_ARRAY),
                (&reserve_for, Type::TEXT_ARRAY),
                (&reserve_ms, Type::INT4_ARRAY),
            ],
        )
        .await
        .map_err(Error::db(format!("release {} leases", batch.len())))?;
    let mut released = vec![false; batch.len()];
    for row in rows {
        let ord: i64 = row.try_get(0).map_err(Error::db("read a release"))?;
        let ok: bool = row.try_get(1).map_err(Error::db("read a release"))?;
        if let Some(slot) = usize::try_from(ord - 1)
            .ok()
            .and_then(|i| released.get_mut(i))
        {
            *slot = ok;
        }
    }
    Ok(released)
}

async fn release_one(pool: &Pool, replica: &str, request: &Request) -> Result<bool> {
    let client = pool.get().await.map_err(pool_error("release a lease"))?;
    let reserve = request
        .reserve
        .as_ref()
        .map(|(replica, window)| (replica.as_str(), *window));
    release_lease(
        &client,
        &request.id,
        request.epoch,
        replica,
        request.incarnation,
        request.event,
        reserve,
    )
    .await
}
