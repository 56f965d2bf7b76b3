//! Tenant handles: the only way to a tenant's ledger, bound to one tenant and one epoch. This
//! file holds the handle's state (serving, draining, ended), the in-flight count every
//! voluntary end waits for, and the public methods, which delegate to their protocol's file:
//! `fence.rs` (fenced transactions), `release.rs` (release, handoff, abandon), `forget.rs`.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::CancelToken;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::fence::{TenantConnection, Tx};
use crate::id::TenantId;
use crate::lease::{Epoch, HandleState};
use crate::liveness::Credentials;
use crate::replica::Shared;
use crate::BoxFuture;

pub(crate) struct HandleInner {
    pub(crate) id: TenantId,
    pub(crate) epoch: Epoch,
    /// What the incarnation that holds this lease presents to the control plane.
    pub(crate) credentials: Arc<Credentials>,
    /// The tenant's fence lock key (`pgtenant.tenants.lock_key`).
    pub(crate) lock_key: i32,
    /// The version this tenure's open migrated from, when it ran migrations.
    pub(crate) migrated_from: Option<i64>,
    /// Whether this tenure began by creating the tenant.
    pub(crate) created: bool,
    pub(crate) schema: String,
    /// The tenant's key (`organization/ledger`), shared with the data path's bookkeeping.
    pub(crate) key: Arc<str>,
    /// `search_path` as the pin sets it: the schema, then `pg_temp` explicitly last (G6).
    pub(crate) search_path: String,
    state: AtomicU8,
    /// Held while work is admitted (state checked, in-flight count raised) and while the state
    /// changes: a voluntary end that moved the state and then found nothing in flight cannot
    /// miss work admitted a moment before (session fencing has no fence to stop it later).
    gate: Mutex<()>,
    in_flight: AtomicUsize,
    idle: Notify,
    /// Woken when the tenure ends (released, handed off, lost, forgotten).
    ended: Notify,
    /// Cancel tokens (and, under session fencing, backend pids) of the transactions in
    /// flight: `forget(ActiveWork::Cancel)` cancels them, `abandon` terminates them.
    cancels: Mutex<Vec<(u64, CancelToken, Option<i32>)>>,
    next_work: AtomicU64,
    pub(crate) router: Arc<Shared>,
}

/// What [`TenantHandle::forget`] does with work in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveWork {
    /// Refuse to forget while work is in flight ([`Error::Busy`]).
    Refuse,
    /// Stop taking work and wait for the work in flight, up to the drain timeout.
    Drain,
    /// Cancel the statements in flight (PostgreSQL cancel requests), then wait for the work to
    /// end, up to the drain timeout.
    Cancel,
}

/// A lease just acquired: what a handle is made of.
pub(crate) struct Acquired {
    pub(crate) epoch: Epoch,
    pub(crate) credentials: Arc<Credentials>,
    pub(crate) lock_key: i32,
    pub(crate) migrated_from: Option<i64>,
    pub(crate) schema: String,
    pub(crate) created: bool,
}

impl HandleInner {
    pub(crate) fn new(id: TenantId, lease: Acquired, router: Arc<Shared>) -> Self {
        HandleInner {
            key: Arc::from(id.key()),
            search_path: format!("{}, pg_temp", lease.schema),
            id,
            epoch: lease.epoch,
            credentials: lease.credentials,
            lock_key: lease.lock_key,
            migrated_from: lease.migrated_from,
            created: lease.created,
            schema: lease.schema,
            state: AtomicU8::new(HandleState::Serving.to_u8()),
            gate: Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            ended: Notify::new(),
            cancels: Mutex::new(Vec::new()),
            next_work: AtomicU64::new(0),
            router,
        }
    }

    pub(crate) fn state(&self) -> HandleState {
        HandleState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn is_serving(&self) -> bool {
        self.state() == HandleState::Serving
            && self.router.liveness.incarnation() == Some(self.credentials.incarnation)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn lock_gate(&self) -> MutexGuard<'_, ()> {
        self.gate
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves `from` → `to`; false when the handle was not in `from`.
    pub(crate) fn transition(&self, from: HandleState, to: HandleState) -> bool {
        let moved = {
            let _gate = self.lock_gate();
            self.state
                .compare_exchange(
                    from.to_u8(),
                    to.to_u8(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        };
        if moved && to.is_ended() {
            self.ended.notify_waiters();
        }
        moved
    }

    /// Waits until the tenure has ended, or `timeout`; true when it ended.
    pub(crate) async fn wait_ended(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, async {
            loop {
                let notified = self.ended.notified();
                if self.state().is_ended() {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }

    /// Waits until no work is in flight.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Ends the tenure for good, once; reports it.
    pub(crate) fn mark_lost(self: &Arc<Self>, reason: &str) {
        if self.transition(HandleState::Serving, HandleState::Lost)
            || self.transition(HandleState::Draining, HandleState::Lost)
        {
            tracing::warn!(tenant = %self.id, epoch = %self.epoch, reason, "lease lost");
            crate::metrics::lease_lost();
            self.router.detach(self);
            self.router.emit(Event::Lost {
                tenant: self.id.clone(),
                epoch: self.epoch,
                reason: reason.to_owned(),
            });
        }
    }

    pub(crate) fn lease_lost(&self, reason: &'static str) -> Error {
        Error::LeaseLost {
            tenant: self.id.clone(),
            epoch: self.epoch,
            reason,
        }
    }

    /// Whether new work may start: the tenure is on, the incarnation current, and the local
    /// deadline not passed.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<()> {
        let refusal = {
            let _gate = self.lock_gate();
            self.admission()
        };
        refusal.map_err(|refusal| self.refuse(refusal))
    }

    /// Admits one unit of work and counts it in flight, atomically with respect to the state's
    /// changes (see `gate`).
    pub(crate) fn begin_work(self: &Arc<Self>) -> Result<InFlight> {
        let refusal = {
            let _gate = self.lock_gate();
            match self.admission() {
                Ok(()) => return Ok(InFlight::enter(self)),
                Err(refusal) => refusal,
            }
        };
        Err(self.refuse(refusal))
    }

    /// After work registered its backend (session fencing), whether an `abandon` ended the
    /// tenure meanwhile: it terminates the backends it finds registered, so work registered
    /// after it must stop here (the cancel registry's lock orders the two).
    pub(crate) fn still_admitted(&self) -> Result<()> {
        match self.state() {
            HandleState::Serving | HandleState::Draining => Ok(()),
            HandleState::Released => Err(self.lease_lost("released")),
            HandleState::Lost => Err(self.lease_lost("lost")),
            HandleState::Forgotten => Err(self.lease_lost("forgotten")),
        }
    }

    fn admission(&self) -> std::result::Result<(), Refusal> {
        match self.state() {
            HandleState::Serving => {}
            HandleState::Draining => return Err(Refusal::Draining),
            HandleState::Released => return Err(Refusal::Ended("released")),
            HandleState::Lost => return Err(Refusal::Ended("lost")),
            HandleState::Forgotten => return Err(Refusal::Ended("forgotten")),
        }
        if self.router.liveness.incarnation() != Some(self.credentials.incarnation) {
            return Err(Refusal::IncarnationGone);
        }
        if !self.router.liveness.within_deadline() {
            return Err(Refusal::Expired);
        }
        Ok(())
    }

    fn refuse(self: &Arc<Self>, refusal: Refusal) -> Error {
        match refusal {
            Refusal::Draining => Error::Draining {
                tenant: self.id.clone(),
            },
            Refusal::Ended(reason) => self.lease_lost(reason),
            Refusal::IncarnationGone => {
                self.mark_lost("the replica lost its incarnation");
                self.lease_lost("lost")
            }
            Refusal::Expired => Error::ExpiredLocally {
                tenant: self.id.clone(),
                epoch: self.epoch,
            },
        }
    }

    /// A refusal of this handle's epoch by the database ends the tenure.
    pub(crate) fn refused(
        self: &Arc<Self>,
        error: tokio_postgres::Error,
        doing: &'static str,
    ) -> Error {
        let scope = crate::sqlstate::Scope {
            doing,
            tenant: Some(&self.id),
            epoch: self.epoch,
            replica: &self.credentials.replica,
        };
        let error = crate::sqlstate::map(error, &scope);
        match &error {
            Error::Fenced { .. } => {
                crate::metrics::fence_refused();
                self.mark_lost("fenced");
            }
            Error::Forgotten { .. } => self.mark_lost("forgotten"),
            _ => {}
        }
        error
    }

    /// The backends of the work in flight, where known (session fencing).
    pub(crate) fn backends_in_flight(&self) -> Vec<i32> {
        self.lock_cancels()
            .iter()
            .filter_map(|(_, _, pid)| *pid)
            .collect()
    }

    pub(crate) fn lock_cancels(&self) -> MutexGuard<'_, Vec<(u64, CancelToken, Option<i32>)>> {
        self.cancels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Why work was not admitted.
enum Refusal {
    Draining,
    Ended(&'static str),
    IncarnationGone,
    Expired,
}

/// Counts one unit of in-flight work; the count drops even when the work is cancelled.
pub(crate) struct InFlight {
    handle: Arc<HandleInner>,
}

impl InFlight {
    fn enter(handle: &Arc<HandleInner>) -> Self {
        handle.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            handle: handle.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.handle.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.handle.idle.notify_waiters();
        }
    }
}

/// Keeps a transaction's cancel token reachable by `forget(ActiveWork::Cancel)` while it runs.
pub(crate) struct CancelOnForget {
    handle: Arc<HandleInner>,
    work: u64,
}

impl CancelOnForget {
    pub(crate) fn register(
        handle: &Arc<HandleInner>,
        token: CancelToken,
        pid: Option<i32>,
    ) -> Self {
        let work = handle.next_work.fetch_add(1, Ordering::Relaxed);
        handle.lock_cancels().push((work, token, pid));
        CancelOnForget {
            handle: handle.clone(),
            work,
        }
    }
}

impl Drop for CancelOnForget {
    fn drop(&mut self) {
        let work = self.work;
        self.handle.lock_cancels().retain(|(w, _, _)| *w != work);
    }
}

/// A tenant's lease as this replica holds it: bound to one tenant and one epoch. Cheap to
/// clone; every clone is the same tenure.
///
/// Work runs in fenced transactions: PostgreSQL itself refuses to commit once the epoch is no
/// longer the tenant's, whatever clocks, pauses or networks do.
#[derive(Clone)]
pub struct TenantHandle {
    inner: Arc<HandleInner>,
}

impl std::fmt::Debug for TenantHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantHandle")
            .field("tenant", &self.inner.id)
            .field("epoch", &self.inner.epoch)
            .field("schema", &self.inner.schema)
            .field("state", &self.inner.state())
            .finish()
    }
}

impl TenantHandle {
    pub(crate) fn from_inner(inner: Arc<HandleInner>) -> Self {
        TenantHandle { inner }
    }

    pub(crate) fn inner(&self) -> &Arc<HandleInner> {
        &self.inner
    }

    /// Whether this tenure began by creating the tenant: true on the handle that
    /// [`Router::open_or_create`](crate::Router::open_or_create) returned when the tenant did
    /// not exist (and on its clones, and on what [`Router::handle_of`](crate::Router::handle_of)
    /// returns for it until it is released), false when it opened an existing tenant. For a
    /// `201 Created`, a log line, a metric. To seed a new tenant's data, use a tenant
    /// migration: it runs exactly once per tenant, in the transaction that creates it.
    pub fn created(&self) -> bool {
        self.inner.created
    }

    /// The tenant.
    pub fn id(&self) -> &TenantId {
        &self.inner.id
    }

    /// The epoch this handle's lease was acquired at: its fencing token.
    pub fn epoch(&self) -> Epoch {
        self.inner.epoch
    }

    /// The tenant's live schema.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Where the handle is in its tenure. [`HandleState::Serving`] can be stale a moment later;
    /// the fence is what decides.
    pub fn state(&self) -> HandleState {
        self.inner.state()
    }

    /// Whether the handle still serves (not released, not lost, and the replica's incarnation
    /// current). A true answer can be stale a moment later; the fence is what decides.
    pub fn is_serving(&self) -> bool {
        self.inner.is_serving()
    }

    /// Units of work running now.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    /// Runs `work` in a fenced read-write transaction on the tenant's schema and commits it.
    ///
    /// The fence statement is sent ahead of the work's first statement on the same connection
    /// (pipelined), so it costs no extra round trip. `search_path` is the tenant's schema (then
    /// `pg_temp`) for this transaction only. If the work fails, is cancelled (the future
    /// dropped) or panics, the transaction rolls back. `Ok` means committed. The work may
    /// borrow from the caller; `tx` derefs to the driver's transaction.
    ///
    /// ```no_run
    /// # async fn example(tenant: &pgtenant::TenantHandle, name: &str) -> pgtenant::Result<()> {
    /// tenant
    ///     .run(|tx| Box::pin(async move {
    ///         tx.execute("INSERT INTO accounts (name) VALUES ($1)", &[&name]).await?;
    ///         Ok::<_, pgtenant::Error>(())
    ///     }))
    ///     .await
    /// # }
    /// ```
    ///
    /// # Errors
    /// The work's own error; or, converted into `E`: [`Error::Fenced`] / [`Error::Forgotten`]
    /// when PostgreSQL refused the epoch (nothing committed, the handle is over),
    /// [`Error::TransactionEnded`] when the work ran `COMMIT` or `ROLLBACK` itself,
    /// [`Error::ExpiredLocally`] (retryable), [`Error::LeaseLost`], database errors.
    #[tracing::instrument(name = "pgtenant.run", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn run<'a, T, E, F>(&self, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
    {
        crate::fence::run(&self.inner, false, work).await
    }

    /// Like [`TenantHandle::run`] in a `READ ONLY` transaction whose fence skips the lock.
    #[tracing::instrument(name = "pgtenant.read", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn read<'a, T, E, F>(&self, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
    {
        crate::fence::run(&self.inner, true, work).await
    }

    /// A data connection for this tenant, on which [`TenantConnection::begin`] opens fenced
    /// transactions guard-style (`let tx = conn.begin().await?; …; tx.commit().await?`), so
    /// work can borrow and use `?` without closures. The connection holds a pool slot until
    /// dropped, and counts as work in flight for the drains of handoff and forget.
    ///
    /// # Errors
    /// As [`TenantHandle::run`] before any work: the handle not serving, the pool.
    pub async fn connect(&self) -> Result<TenantConnection> {
        TenantConnection::checkout(&self.inner).await
    }

    /// Stops taking new work, waits for the work in flight (however long), then releases the
    /// lease. The next owner sees everything this handle committed.
    #[tracing::instrument(name = "pgtenant.release", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn release(&self) -> Result<()> {
        crate::release::release(&self.inner).await
    }

    /// Hands the tenant off: refuses new work ([`Error::Draining`]), waits up to the drain
    /// timeout for the work in flight, then releases the lease and wakes replicas waiting for
    /// it ([`Router::wait_for`](crate::Router::wait_for)). No data moves.
    ///
    /// # Errors
    /// [`Error::DrainTimeout`] when work is still running at the deadline: the tenant keeps
    /// serving here. [`Error::LeaseLost`] when the lease ended meanwhile.
    #[tracing::instrument(name = "pgtenant.handoff", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn handoff(&self) -> Result<()> {
        crate::release::hand_over(&self.inner, None).await
    }

    /// Like [`TenantHandle::handoff`], and reserves the tenant for `replica` for the
    /// reservation window, so no other replica takes it first.
    ///
    /// # Errors
    /// [`Error::NoSuchReplica`] before anything changes when `replica` is not a registered,
    /// live replica; otherwise as [`TenantHandle::handoff`].
    #[tracing::instrument(name = "pgtenant.handoff_to", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch, to = replica))]
    pub async fn handoff_to(&self, replica: &str) -> Result<()> {
        crate::options::validate_replica_id("replica", replica)?;
        self.inner.router.ensure_live_replica(replica).await?;
        crate::release::hand_over(&self.inner, Some(replica)).await
    }

    /// Stops serving at once and releases the lease without waiting for work in flight; that
    /// work either commits before the next owner's acquisition (which waits for it) or fails.
    #[tracing::instrument(name = "pgtenant.abandon", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn abandon(&self) -> Result<()> {
        crate::release::abandon(&self.inner).await
    }

    /// Forgets the tenant (DESIGN §5): under the lease, after dealing with work in flight as
    /// `active` says, one transaction masks every epoch up to this one (PostgreSQL refuses
    /// their commits from now on), moves the schema to the trash with a catalog rename (time
    /// independent of the ledger's size), journals it and ends the lease. The id can then be
    /// created again as a new life, or restored from the trash within retention.
    ///
    /// Returns the trash schema's name.
    ///
    /// # Errors
    /// [`Error::Busy`] (Refuse, work in flight), [`Error::DrainTimeout`] (the tenant keeps
    /// serving), [`Error::Draining`] (already being handed off or forgotten),
    /// [`Error::Fenced`] / [`Error::LeaseLost`] when the lease is gone.
    #[tracing::instrument(name = "pgtenant.forget", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch, ?active))]
    pub async fn forget(&self, active: ActiveWork) -> Result<String> {
        crate::forget::forget(&self.inner, active).await
    }
}
