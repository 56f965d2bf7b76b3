//! Releases (DESIGN §5 "Handoff", "Abandon", "Close"): every call of `pgtenant.release`, the
//! drain before a voluntary end, directed handoffs, and answering other replicas' handoff
//! requests.
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

use tokio::sync::broadcast;
use tracing::warn;

use crate::control;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::handle::{HandleInner, TenantHandle};
use crate::id::TenantId;
use crate::lease::{Epoch, HandleState, Journal};
use crate::liveness::{millis, Credentials, Notice, HANDOFF_CHANNEL};
use crate::options::{validate_replica_id, HandoffPolicy};
use crate::replica::{lock, Shared};
use crate::sqlstate;

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
    let rows = control::call(
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
                .find_map(|r| r.3.map(|(replica, _)| replica.to_owned()))
                .unwrap_or_default(),
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

/// Stops taking new work, waits for the work in flight (however long), then releases.
pub(crate) async fn release(handle: &Arc<HandleInner>) -> Result<()> {
    if !handle.transition(HandleState::Serving, HandleState::Released) {
        return Ok(());
    }
    handle.wait_idle().await;
    give_back(handle, Journal::Released, None).await
}

/// Releases at once, without waiting for work in flight; that work either commits before the
/// next owner's acquisition (which waits for it) or fails.
pub(crate) async fn abandon(handle: &Arc<HandleInner>) -> Result<()> {
    if !(handle.transition(HandleState::Serving, HandleState::Released)
        || handle.transition(HandleState::Draining, HandleState::Released))
    {
        return Ok(());
    }
    let router = &handle.router;
    if router.session_fencing() {
        // No fence stops that work once the lease is released: it ends first (its transaction
        // rolls back). Work not yet on a backend finds the handle released and stops.
        let backends = handle.backends_in_flight();
        if let Err(error) =
            crate::sessions::terminate_work(&router.pool, &handle.credentials, &backends).await
        {
            // The lease stays held (and expires with the replica if it comes to that) rather
            // than be released under work that may still commit.
            router.detach(handle);
            return Err(error);
        }
    }
    give_back(handle, Journal::Released, None).await
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

/// Releases the lease (reserved for `to` when given) and reports how it ended.
async fn give_back(handle: &Arc<HandleInner>, event: Journal, to: Option<&str>) -> Result<()> {
    let router = &handle.router;
    router.detach(handle);
    let reservation = to.map(|replica| (replica, router.options.reservation));
    let released = match router
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
            // tenant is already drained, so it is released for anyone rather than kept.
            warn!(tenant = %handle.id, to = %replica_id, "handoff target gone; released without a reservation");
            router
                .releases
                .release(&handle.id, handle.epoch, &handle.credentials, event, None)
                .await?
        }
        released => released?,
    };
    let (tenant, epoch) = (handle.id.clone(), handle.epoch);
    router.emit(match (released, event) {
        (false, _) => Event::Lost {
            tenant,
            epoch,
            reason: "already taken over when released".to_owned(),
        },
        (true, Journal::HandedOff) => Event::HandedOff {
            tenant,
            epoch,
            to: to.map(str::to_owned),
        },
        (true, Journal::Released) => Event::Released { tenant, epoch },
    });
    Ok(())
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
                let handle = TenantHandle::from_inner(inner);
                if let Err(error) = handle.handoff_to(&request.requester).await {
                    warn!(%tenant, %error, "requested handoff failed");
                }
            });
        }
    }
}
