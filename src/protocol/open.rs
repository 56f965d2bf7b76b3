//! The open path (DESIGN §5 "Open path", "Acquire tenant"'s last sentence): a tenant served
//! here already is returned as it is; concurrent opens of one tenant in this replica share one
//! acquisition; capacity (`max_open_tenants`) counts those opening; the whole open is bounded by
//! `open_timeout`, and an acquisition that arrives late is given back. `wait_for` opens once the
//! tenant is free, woken by the release's NOTIFY or at the owner's expiry. The acquisition
//! itself is `acquire.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use tracing::{info, Instrument};

use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::HandleState;
use crate::protocol::acquire::acquire;
use crate::sqlstate;
use crate::state::liveness::FREE_CHANNEL;
use crate::state::replica::{HeldLease, Replica};
use crate::sync::lock;

/// Serving here already, draining here, or None.
fn local(shared: &Replica, id: &TenantId) -> Option<Result<Arc<HeldLease>>> {
    let inner = shared.handle(id)?;
    match inner.state() {
        HandleState::Serving if inner.is_serving() => Some(Ok(inner)),
        HandleState::Draining => Some(Err(Error::Draining { tenant: id.clone() })),
        _ => None,
    }
}

/// [`Router::open`](crate::Router::open) and `open_or_create`: concurrent opens of one tenant
/// share one acquisition, capacity counts those opening, and the whole open is bounded. An
/// acquisition runs in a task that holds the tenant's gate until it ends, so an open that timed
/// out (and its caller's retries) never starts a second acquisition beside it: the next open
/// waits for the gate, within its own bound, and then finds the tenant served here, or free.
#[tracing::instrument(skip_all, fields(tenant = %id))]
pub(crate) async fn open(
    shared: &Arc<Replica>,
    id: &TenantId,
    create: bool,
) -> Result<Arc<HeldLease>> {
    // A tenant still served here is served while the router closes, until its handoff drains
    // it: a closing replica answers for what it holds (a rolling restart's requests for the
    // last of 2 000 tenants in the close queue otherwise waited for the whole close).
    if let Some(found) = local(shared, id) {
        return found;
    }
    if shared.is_closed() {
        return Err(Error::RouterClosed);
    }
    let timeout = shared.options.open_timeout;
    let started = Instant::now();
    let gate = {
        let mut opening = lock(&shared.opening);
        match opening.get(id) {
            Some(gate) => gate.clone(),
            None => {
                let max = shared.options.max_open_tenants;
                if lock(&shared.handles).len() + opening.len() >= max {
                    return Err(Error::AtCapacity { max });
                }
                opening.entry(id.clone()).or_default().clone()
            }
        }
    };
    let result = match tokio::time::timeout(timeout, gate.clone().lock_owned()).await {
        Ok(turn) => match local(shared, id) {
            Some(found) => found,
            None => {
                bounded(
                    shared,
                    id,
                    create,
                    turn,
                    timeout.saturating_sub(started.elapsed()),
                )
                .await
            }
        },
        Err(_) => Err(Error::open_timeout(id.clone(), timeout)),
    };
    release_gate(shared, id, &gate);
    crate::metrics::open_finished(started.elapsed(), result.is_ok());
    result.map_err(|error| shared.explain_down(error))
}

/// Removes the tenant's gate once nobody else holds it: the map's copy and the caller's are the
/// only two left (a waiting open, or an acquisition task still running, holds another).
fn release_gate(shared: &Replica, id: &TenantId, gate: &Arc<tokio::sync::Mutex<()>>) {
    let mut opening = lock(&shared.opening);
    if Arc::strong_count(gate) <= 2 {
        opening.remove(id);
    }
}

/// One acquisition task running, counted until it ends (even by a panic): close() waits for
/// them.
struct Running(Arc<Replica>);

impl Running {
    fn begin(shared: &Arc<Replica>) -> Running {
        shared.acquiring.fetch_add(1, Ordering::AcqRel);
        Running(shared.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.acquiring.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.acquired.notify_waiters();
        }
    }
}

/// Runs the acquisition in its own task, which holds the tenant's gate (`turn`) until it ends,
/// so that a timeout (or a caller that stops waiting) can neither strand a lease (a late success
/// finds nobody to take it and gives it back) nor let a second acquisition start beside it.
async fn bounded(
    shared: &Arc<Replica>,
    id: &TenantId,
    create: bool,
    turn: tokio::sync::OwnedMutexGuard<()>,
    timeout: Duration,
) -> Result<Arc<HeldLease>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (task_shared, task_id) = (shared.clone(), id.clone());
    let running = Running::begin(shared);
    tokio::spawn(
        async move {
            let _running = running;
            let result = acquire(&task_shared, &task_id, create).await;
            if let Err(Ok(late)) = tx.send(result) {
                info!("open gave up before the lease arrived: releasing it");
                let _ = crate::protocol::abandon::abandon(&late).await;
            }
            let gate = tokio::sync::OwnedMutexGuard::mutex(&turn).clone();
            drop(turn);
            release_gate(&task_shared, &task_id, &gate);
        }
        .in_current_span(),
    );
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(result)) => result,
        // The task ended without answering (it panicked), or the bound passed.
        Ok(Err(_)) | Err(_) => Err(Error::open_timeout(id.clone(), shared.options.open_timeout)),
    }
}

/// Opens many existing tenants with one acquisition statement (`acquire::acquire_batch`): what
/// rebalancing picks up; (opened, left for the ordinary open). The batch takes the open gate
/// of each tenant it acquires, so an open of one of them meanwhile waits for it and then finds
/// the tenant served here. Left out of the batch: tenants served or drained here, being opened
/// already, beyond capacity, or with work of an earlier lease of this incarnation still running
/// (returned, for the ordinary open, which waits for it). Of those the batch did not acquire,
/// all are returned but the ones an ordinary open would only be refused again. The batch runs
/// in its own task, so a caller that stops waiting strands no lease.
pub(crate) async fn open_many(shared: &Arc<Replica>, ids: Vec<TenantId>) -> (usize, Vec<TenantId>) {
    let Ok(credentials) = shared.current_credentials() else {
        return (0, Vec::new());
    };
    let mut batch = Vec::with_capacity(ids.len());
    let mut turns = Vec::with_capacity(ids.len());
    let mut rest = Vec::new();
    for id in ids {
        if shared.is_closed() {
            break;
        }
        if local(shared, &id).is_some() {
            continue;
        }
        if shared.earlier_work(&id, &credentials).is_some() {
            rest.push(id);
            continue;
        }
        let mut opening = lock(&shared.opening);
        if opening.contains_key(&id)
            || lock(&shared.handles).len() + opening.len() >= shared.options.max_open_tenants
        {
            continue;
        }
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let Ok(turn) = gate.clone().try_lock_owned() else {
            continue;
        };
        opening.insert(id.clone(), gate);
        turns.push(turn);
        batch.push(id);
    }
    if batch.is_empty() {
        return (0, rest);
    }
    let task_shared = shared.clone();
    let running = Running::begin(shared);
    let task = tokio::spawn(
        async move {
            let _running = running;
            let result =
                crate::protocol::acquire::acquire_batch(&task_shared, &batch, credentials).await;
            for (id, turn) in batch.iter().zip(turns) {
                let gate = tokio::sync::OwnedMutexGuard::mutex(&turn).clone();
                drop(turn);
                release_gate(&task_shared, id, &gate);
            }
            match result {
                Ok(done) => {
                    // An ordinary open would only meet these again.
                    let hopeless = [
                        sqlstate::HELD,
                        sqlstate::NO_TENANT,
                        sqlstate::QUARANTINED,
                        sqlstate::NOT_REGISTERED,
                    ];
                    let refused = done
                        .refused
                        .into_iter()
                        .filter(|(_, code)| !hopeless.contains(&code.as_str()))
                        .map(|(id, _)| id);
                    (done.opened, refused.collect())
                }
                Err(error) => {
                    info!(%error, tenants = batch.len(), "a batched acquisition failed");
                    (0, batch)
                }
            }
        }
        .in_current_span(),
    );
    match task.await {
        Ok((opened, refused)) => {
            rest.extend(refused);
            (opened, rest)
        }
        Err(_) => (0, rest),
    }
}

/// [`Router::wait_for`](crate::Router::wait_for): opens once the tenant is free, woken by the
/// release's NOTIFY or, for an owner that died or stalled, at its expiry.
pub(crate) async fn wait_for(
    shared: &Arc<Replica>,
    id: &TenantId,
    timeout: Duration,
) -> Result<Arc<HeldLease>> {
    // Pauses between attempts are short (ttl, backoff); the cap keeps `now + pause` finite.
    const LONGEST_PAUSE: Duration = Duration::from_secs(3600);
    let deadline = Instant::now().checked_add(timeout);
    let mut notices = shared.notices.subscribe();
    let (first, max) = shared.options.reconnect_backoff;
    let mut backoff = first;
    loop {
        let pause = match open(shared, id, false).await {
            Ok(handle) => return Ok(handle),
            Err(Error::LeaseHeld { expires_in, .. }) => {
                expires_in.unwrap_or(shared.options.ttl) + Duration::from_millis(5)
            }
            Err(error) if error.is_retryable() => {
                let pause = backoff;
                backoff = backoff.saturating_mul(2).min(max);
                pause
            }
            Err(error) => return Err(error),
        };
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            return Err(Error::open_timeout(id.clone(), timeout));
        }
        let wake = now + pause.min(LONGEST_PAUSE);
        let wake = deadline.map_or(wake, |deadline| wake.min(deadline));
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => break,
                notice = notices.recv() => match notice {
                    Ok(n) if n.channel == FREE_CHANNEL && n.payload == id.key() => break,
                    Ok(_) => continue,
                    // Missed some: the one we wait for may be among them.
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
    }
}
