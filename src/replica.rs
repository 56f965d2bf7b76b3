//! What one replica's router, handles and background tasks share: the options, the data-path
//! pool, the liveness, the handles served, the release batcher and the event channels.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{broadcast, Notify};
use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::handle::HandleInner;
use crate::id::TenantId;
use crate::liveness::{Liveness, Notice};
use crate::options::RouterOptions;
use crate::release::ReleaseQueue;

/// Events buffered per subscriber before it starts missing them.
pub(crate) const EVENT_BUFFER: usize = 1024;

pub(crate) struct Shared {
    pub(crate) options: RouterOptions,
    pub(crate) pool: Pool,
    pub(crate) liveness: Liveness,
    /// `idle_in_transaction_session_timeout` for fenced transactions: one ttl, as text.
    pub(crate) idle_timeout_ms: String,
    pub(crate) events: broadcast::Sender<Event>,
    pub(crate) notices: broadcast::Sender<Notice>,
    /// Tenants served or draining here.
    pub(crate) handles: Mutex<HashMap<TenantId, Arc<HandleInner>>>,
    /// Releases of this router's leases, batched.
    pub(crate) releases: ReleaseQueue,
    /// Tenants being acquired, one gate per tenant so concurrent opens share one acquisition.
    pub(crate) opening: Mutex<HashMap<TenantId, Arc<tokio::sync::Mutex<()>>>>,
    /// Acquisition tasks running (they outlive an open that timed out); close() waits for them
    /// so that no acquisition commits after the replica deregistered.
    pub(crate) acquiring: AtomicUsize,
    pub(crate) acquired: Notify,
    pub(crate) closed: AtomicBool,
    /// Why the last re-registration failed, while the replica is not registered.
    pub(crate) registration: Mutex<Option<RegistrationFailure>>,
    /// The fencing in force, and why session fencing could not hold when it fell back.
    pub(crate) fencing: crate::sessions::Mode,
    pub(crate) fencing_fallback: Option<String>,
    /// Session fencing: which pooled connections are bound to which incarnation.
    pub(crate) bindings: crate::sessions::Bindings,
    /// What the data path knows of each pooled connection (signal, tenant it is clean for).
    pub(crate) data_sessions: crate::data_sessions::DataSessions,
    /// Citus or not, and where new tenant schemas go (see `citus.rs`).
    pub(crate) placement: crate::citus::Placement,
}

pub(crate) struct RegistrationFailure {
    pub(crate) message: String,
    /// Set when only someone's action ends it: returned by opens instead of `ReplicaDown`.
    pub(crate) lasting: Option<Error>,
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it: the maps it guards
/// are consistent after every single operation.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    pub(crate) fn new(
        options: RouterOptions,
        pool: Pool,
        notices: broadcast::Sender<Notice>,
        (fencing, fencing_fallback): (crate::sessions::Mode, Option<String>),
    ) -> Shared {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Shared {
            idle_timeout_ms: crate::liveness::millis(options.ttl).to_string(),
            releases: ReleaseQueue::start(pool.clone()),
            options,
            pool,
            liveness: Liveness::new(),
            events,
            notices,
            handles: Mutex::new(HashMap::new()),
            opening: Mutex::new(HashMap::new()),
            acquiring: AtomicUsize::new(0),
            acquired: Notify::new(),
            closed: AtomicBool::new(false),
            registration: Mutex::new(None),
            fencing,
            fencing_fallback,
            bindings: crate::sessions::Bindings::default(),
            data_sessions: crate::data_sessions::DataSessions::default(),
            placement: crate::citus::Placement::default(),
        }
    }

    /// `ReplicaDown` says "registering again"; when only someone's action will end that (a
    /// newer control plane, say), the cause itself is the truer answer.
    pub(crate) fn explain_down(&self, error: Error) -> Error {
        if !matches!(error, Error::ReplicaDown { .. }) {
            return error;
        }
        lock(&self.registration)
            .as_ref()
            .and_then(|failure| failure.lasting.as_ref())
            .and_then(Error::lasting_copy)
            .or_else(|| self.bindings.lasting(&self.options.replica_id))
            .unwrap_or(error)
    }

    pub(crate) fn emit(&self, event: Event) {
        // No subscriber is not an error, and a slow one lags instead of blocking us.
        let _ = self.events.send(event);
    }

    /// The handle of a tenant served or draining here.
    pub(crate) fn handle(&self, id: &TenantId) -> Option<Arc<HandleInner>> {
        lock(&self.handles).get(id).cloned()
    }

    /// Forgets a handle that ended; only the exact handle, not a newer one for the same tenant.
    pub(crate) fn detach(&self, handle: &Arc<HandleInner>) {
        let mut handles = lock(&self.handles);
        if handles
            .get(&handle.id)
            .is_some_and(|current| Arc::ptr_eq(current, handle))
        {
            handles.remove(&handle.id);
            crate::metrics::leases_held(&self.options.replica_id, handles.len());
        }
    }

    pub(crate) fn session_fencing(&self) -> bool {
        self.fencing == crate::sessions::Mode::Session
    }

    /// The pool's size, for bookkeeping sized by it.
    pub(crate) fn pool_size(&self) -> usize {
        self.pool.status().max_size
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Refuses a handoff target that is not a registered, live replica, before anything
    /// changes: a reservation for it would keep the tenant from everyone for the window.
    pub(crate) async fn ensure_live_replica(&self, replica: &str) -> Result<()> {
        let client = self
            .pool
            .get()
            .await
            .map_err(crate::error::pool_error("check a handoff target"))?;
        let alive: Option<bool> = client
            .query_typed_opt(
                "SELECT alive FROM pgtenant.replica_liveness WHERE replica_id = $1",
                &[(&replica, Type::TEXT)],
            )
            .await
            .and_then(|row| row.map(|row| row.try_get(0)).transpose())
            .map_err(Error::db("check a handoff target"))?;
        match alive {
            Some(true) => Ok(()),
            Some(false) => Err(Error::NoSuchReplica {
                replica_id: replica.to_owned(),
                message: format!("replica {replica} is registered but not alive"),
            }),
            None => Err(Error::NoSuchReplica {
                replica_id: replica.to_owned(),
                message: format!("no replica {replica} has ever registered with this database"),
            }),
        }
    }

    /// Waits until no acquisition task runs, or `timeout`.
    pub(crate) async fn acquisitions_done(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, async {
            loop {
                let done = self.acquired.notified();
                if self.acquiring.load(Ordering::Acquire) == 0 {
                    return;
                }
                done.await;
            }
        })
        .await;
    }

    /// Every lease of the current incarnation is gone for good.
    pub(crate) fn lose_incarnation(&self, reason: &str) {
        self.liveness.end();
        let lost: Vec<Arc<HandleInner>> = lock(&self.handles).drain().map(|(_, h)| h).collect();
        crate::metrics::leases_held(&self.options.replica_id, 0);
        for handle in lost {
            handle.mark_lost(reason);
        }
    }
}

/// Runs futures concurrently on this task and waits for all (no extra dependency for it).
pub(crate) async fn join_all<F: std::future::Future<Output = ()>>(
    futures: impl Iterator<Item = F>,
) {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}
