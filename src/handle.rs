//! Tenant handles: the only way to a tenant's ledger, bound to one tenant and one epoch.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{CancelToken, Transaction};

use crate::control;
use crate::error::{Error, Result, SQLSTATE_FENCED, SQLSTATE_FORGOTTEN};
use crate::event::Event;
use crate::id::TenantId;
use crate::liveness::Credentials;
use crate::router::{pool_error, Shared};

/// A boxed, sendable future borrowing a transaction: what work passed to
/// [`TenantHandle::run`] returns (`|tx| Box::pin(async move { … })`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How often `forget(ActiveWork::Cancel)` repeats its cancel requests while work remains.
const CANCEL_REPEAT: std::time::Duration = std::time::Duration::from_millis(50);

const SERVING: u8 = 0;
const DRAINING: u8 = 1;
const RELEASED: u8 = 2;
const LOST: u8 = 3;
const FORGOTTEN: u8 = 4;

/// The first statement of every fenced transaction: the fence (the tenant's advisory lock held
/// shared + the epoch check) pins search_path for this transaction only, and an
/// idle-in-transaction timeout bounds how long a paused owner can hold up a successor. Both
/// forms take (key, epoch, lock key, idle ms) and always return one row or raise.
const FENCE_SQL: &str = "SELECT pgtenant.fence($1, $2, $3, $4)";
/// The read-only variant: the same checks without the lock.
const FENCE_READ_SQL: &str = "SELECT pgtenant.fence_read($1, $2, $3, $4)";
/// The fences' parameter types, for the unnamed (uncached) form.
const FENCE_TYPES: [Type; 4] = [Type::TEXT, Type::INT8, Type::INT4, Type::TEXT];
/// Ends a fenced transaction. The fence opened the cursor in this transaction; if the work
/// ended that transaction itself (COMMIT, ROLLBACK), the cursor is gone, CLOSE fails and
/// nothing the work did after that commits: one message, no extra round trip.
const COMMIT_SQL: &str = "CLOSE pgtenant_fenced; COMMIT";
/// SQLSTATE of CLOSE for a cursor that does not exist.
const INVALID_CURSOR_NAME: &str = "34000";

pub(crate) struct HandleInner {
    pub(crate) id: TenantId,
    pub(crate) epoch: i64,
    pub(crate) incarnation: i64,
    /// What the incarnation that holds this lease presents to the control plane.
    pub(crate) credentials: Arc<Credentials>,
    /// The tenant's fence lock key (`pgtenant.tenants.lock_key`).
    pub(crate) lock_key: i32,
    /// The version this tenure's open migrated from, when it ran migrations.
    pub(crate) migrated_from: Option<i64>,
    schema: String,
    state: AtomicU8,
    in_flight: AtomicUsize,
    idle: Notify,
    /// Woken when the tenure ends (released, handed off, lost, forgotten).
    ended: Notify,
    /// Cancel tokens of the transactions in flight, for `forget(ActiveWork::Cancel)`.
    cancels: std::sync::Mutex<Vec<(u64, CancelToken)>>,
    next_work: std::sync::atomic::AtomicU64,
    router: Arc<Shared>,
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

impl HandleInner {
    pub(crate) fn new(
        id: TenantId,
        (epoch, credentials, lock_key, migrated_from): (i64, Arc<Credentials>, i32, Option<i64>),
        schema: String,
        router: Arc<Shared>,
    ) -> Self {
        HandleInner {
            id,
            epoch,
            incarnation: credentials.incarnation,
            credentials,
            lock_key,
            migrated_from,
            schema,
            state: AtomicU8::new(SERVING),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            ended: Notify::new(),
            cancels: std::sync::Mutex::new(Vec::new()),
            next_work: std::sync::atomic::AtomicU64::new(0),
            router,
        }
    }

    pub(crate) fn is_serving(&self) -> bool {
        self.state.load(Ordering::Acquire) == SERVING
            && self.router.liveness.incarnation() == self.incarnation
    }

    pub(crate) fn schema(&self) -> &str {
        &self.schema
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.state.load(Ordering::Acquire) == DRAINING
    }

    fn transition(&self, from: u8, to: u8) -> bool {
        let moved = self
            .state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved && matches!(to, RELEASED | LOST | FORGOTTEN) {
            self.ended.notify_waiters();
        }
        moved
    }

    pub(crate) fn is_forgotten(&self) -> bool {
        self.state.load(Ordering::Acquire) == FORGOTTEN
    }

    /// Waits until the tenure has ended, or `timeout`; true when it ended.
    pub(crate) async fn wait_ended(&self, timeout: std::time::Duration) -> bool {
        let ended = || {
            matches!(
                self.state.load(Ordering::Acquire),
                RELEASED | LOST | FORGOTTEN
            )
        };
        tokio::time::timeout(timeout, async {
            loop {
                let notified = self.ended.notified();
                if ended() {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }

    /// Ends the tenure for good, once; reports it.
    pub(crate) fn mark_lost(self: &Arc<Self>, router: &Shared, reason: &str) {
        if self.transition(SERVING, LOST) || self.transition(DRAINING, LOST) {
            tracing::warn!(tenant = %self.id, epoch = self.epoch, reason, "lease lost");
            router.detach(self);
            router.emit(Event::Lost {
                tenant: self.id.key().to_owned(),
                epoch: self.epoch,
                reason: reason.to_owned(),
            });
        }
    }

    fn lease_lost(&self, reason: &'static str) -> Error {
        Error::LeaseLost {
            tenant: self.id.key().to_owned(),
            epoch: self.epoch,
            reason,
        }
    }

    /// Whether new work may start: the tenure is on, the incarnation current, and the local
    /// deadline not passed.
    fn admit(self: &Arc<Self>) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            DRAINING => {
                return Err(Error::Draining {
                    tenant: self.id.key().to_owned(),
                })
            }
            RELEASED => return Err(self.lease_lost("released")),
            LOST => return Err(self.lease_lost("lost")),
            FORGOTTEN => return Err(self.lease_lost("forgotten")),
            _ => {}
        }
        if self.router.liveness.incarnation() != self.incarnation {
            self.mark_lost(&self.router, "the replica lost its incarnation");
            return Err(self.lease_lost("lost"));
        }
        if !self.router.liveness.within_deadline() {
            return Err(Error::ExpiredLocally {
                tenant: self.id.key().to_owned(),
                epoch: self.epoch,
            });
        }
        Ok(())
    }

    fn fence_error(self: &Arc<Self>, error: tokio_postgres::Error) -> Error {
        match error.code().map(|c| c.code()) {
            Some(SQLSTATE_FENCED) => {
                self.mark_lost(&self.router, "fenced");
                Error::Fenced {
                    tenant: self.id.key().to_owned(),
                    epoch: self.epoch,
                    message: error
                        .as_db_error()
                        .map(|db| db.message().to_owned())
                        .unwrap_or_default(),
                }
            }
            Some(SQLSTATE_FORGOTTEN) => {
                self.mark_lost(&self.router, "forgotten");
                Error::Forgotten {
                    tenant: self.id.key().to_owned(),
                    epoch: self.epoch,
                }
            }
            _ => Error::db(format!("fence tenant {} at epoch {}", self.id, self.epoch))(error),
        }
    }
}

/// Counts one unit of in-flight work; the count drops even when the work is cancelled.
struct InFlight<'a>(&'a HandleInner);

impl<'a> InFlight<'a> {
    fn enter(handle: &'a HandleInner) -> Self {
        handle.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(handle)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Keeps a transaction's cancel token reachable by `forget(ActiveWork::Cancel)` while it runs.
struct CancelOnForget<'a> {
    handle: &'a HandleInner,
    work: u64,
}

impl<'a> CancelOnForget<'a> {
    fn register(handle: &'a HandleInner, token: CancelToken) -> Self {
        let work = handle.next_work.fetch_add(1, Ordering::Relaxed);
        lock_cancels(handle).push((work, token));
        CancelOnForget { handle, work }
    }
}

impl Drop for CancelOnForget<'_> {
    fn drop(&mut self) {
        lock_cancels(self.handle).retain(|(work, _)| *work != self.work);
    }
}

fn lock_cancels(handle: &HandleInner) -> std::sync::MutexGuard<'_, Vec<(u64, CancelToken)>> {
    handle
        .cancels
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
            .field("tenant", &self.inner.id.key())
            .field("epoch", &self.inner.epoch)
            .field("schema", &self.inner.schema)
            .finish()
    }
}

impl TenantHandle {
    pub(crate) fn from_inner(inner: Arc<HandleInner>) -> Self {
        TenantHandle { inner }
    }

    pub(crate) fn inner(&self) -> &HandleInner {
        &self.inner
    }

    /// The tenant.
    pub fn id(&self) -> &TenantId {
        &self.inner.id
    }

    /// The epoch this handle's lease was acquired at: its fencing token.
    pub fn epoch(&self) -> i64 {
        self.inner.epoch
    }

    /// The tenant's live schema.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Whether the handle still serves (not released, not lost). A true answer can be stale a
    /// moment later; the fence is what decides.
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
    /// (pipelined), so it costs no extra round trip. `search_path` is pinned for this
    /// transaction only. If the work fails, is cancelled (the future dropped) or panics, the
    /// transaction rolls back and the pooled connection keeps no state. `Ok` means committed.
    ///
    /// # Errors
    /// The work's own error; or, converted into `E`: [`Error::Fenced`] / [`Error::Forgotten`]
    /// when PostgreSQL refused the epoch (nothing committed, the handle is over),
    /// [`Error::ExpiredLocally`] (retryable), [`Error::LeaseLost`], database errors.
    #[tracing::instrument(name = "pgtenant.run", skip_all, fields(tenant = %self.inner.id, epoch = self.inner.epoch))]
    pub async fn run<T, E, F>(&self, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    {
        self.fenced(false, work).await
    }

    /// Like [`TenantHandle::run`] in a `READ ONLY` transaction whose fence skips the row lock.
    #[tracing::instrument(name = "pgtenant.read", skip_all, fields(tenant = %self.inner.id, epoch = self.inner.epoch))]
    pub async fn read<T, E, F>(&self, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    {
        self.fenced(true, work).await
    }

    async fn fenced<T, E, F>(&self, read_only: bool, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    {
        let inner = &self.inner;
        inner.admit()?;
        let _in_flight = InFlight::enter(inner);
        let mut object = inner
            .router
            .pool
            .get()
            .await
            .map_err(pool_error("get a connection for tenant work"))?;
        let stuck = std::sync::atomic::AtomicBool::new(false);
        let outcome = self.fenced_on(&mut object, &stuck, read_only, work).await;
        if stuck.load(Ordering::Acquire) {
            // A connection that stopped answering must never hold a pool slot.
            tracing::warn!(tenant = %inner.id, "closing a data connection that stopped answering");
            drop(deadpool_postgres::Object::take(object));
        }
        outcome
    }

    /// A fenced transaction on `object`; sets `stuck` when the server stopped answering.
    async fn fenced_on<T, E, F>(
        &self,
        object: &mut deadpool_postgres::Object,
        stuck: &std::sync::atomic::AtomicBool,
        read_only: bool,
        work: F,
    ) -> Result<T, E>
    where
        E: From<Error>,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    {
        let inner = &self.inner;
        let router = &inner.router;
        // Prepared once per pooled connection: the fence then costs the server no parse or plan.
        let sql = if read_only { FENCE_READ_SQL } else { FENCE_SQL };
        let fence_statement = if router.options.statement_cache {
            Some(
                object
                    .prepare_cached(sql)
                    .await
                    .map_err(Error::db("prepare the fence"))?,
            )
        } else {
            None
        };
        let bound = router.options.stuck_timeout;
        let client: &mut tokio_postgres::Client = object;
        let _cancel = CancelOnForget::register(inner, client.cancel_token());
        // READ WRITE (or READ ONLY) explicitly: data sessions default to read-only, so work
        // that ends this transaction itself cannot write afterwards.
        let begun = tokio::time::timeout(
            bound,
            client.build_transaction().read_only(read_only).start(),
        )
        .await;
        let tx = match begun {
            Ok(begun) => begun.map_err(Error::db("begin tenant transaction"))?,
            Err(_) => {
                stuck.store(true, Ordering::Release);
                return Err(Error::stuck("begin tenant transaction", bound).into());
            }
        };
        let key = inner.id.key();
        let params: [&(dyn ToSql + Sync); 4] =
            [&key, &inner.epoch, &inner.lock_key, &router.idle_timeout_ms];
        let fence = async {
            match &fence_statement {
                Some(statement) => tx.query(statement, &params).await,
                None => {
                    let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                        .iter()
                        .zip(FENCE_TYPES)
                        .map(|(param, ty)| (*param, ty))
                        .collect();
                    tx.query_typed(sql, &typed).await
                }
            }
        };
        // The fence goes on the wire first (join! polls in order) and its reply is consumed as
        // it arrives, concurrently with the work: a reply split by a ParameterStatus, NOTICE or
        // NOTIFY must not sit unread, or the connection stops reading the socket (issue #15).
        let (fenced, outcome) = tokio::join!(fence, work(&tx));
        if let Err(error) = fenced {
            // The work saw an aborted transaction; the fence's refusal is the real story.
            return Err(inner.fence_error(error).into());
        }
        let value = outcome?;
        match tokio::time::timeout(bound, tx.batch_execute(COMMIT_SQL)).await {
            Ok(Ok(())) => {
                // Committed: the driver's transaction must not send its ROLLBACK on drop (it
                // holds only a borrow of the connection, so forgetting it leaks nothing).
                std::mem::forget(tx);
                Ok(value)
            }
            Ok(Err(error)) if error.code().map(|c| c.code()) == Some(INVALID_CURSOR_NAME) => {
                Err(Error::TransactionEnded {
                    tenant: inner.id.key().to_owned(),
                    epoch: inner.epoch,
                }
                .into())
            }
            Ok(Err(error)) => {
                Err(Error::db(format!("commit tenant {} work", inner.id))(error).into())
            }
            Err(_) => {
                stuck.store(true, Ordering::Release);
                Err(Error::stuck("commit tenant work", bound).into())
            }
        }
    }

    /// Waits until no work is in flight.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let idle = self.inner.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Stops taking new work, waits for the work in flight (however long), then releases the
    /// lease. The next owner sees everything this handle committed.
    #[tracing::instrument(name = "pgtenant.release", skip_all, fields(tenant = %self.inner.id, epoch = self.inner.epoch))]
    pub async fn release(&self) -> Result<()> {
        if !self.inner.transition(SERVING, RELEASED) {
            return Ok(());
        }
        self.wait_idle().await;
        self.give_back("released", None).await
    }

    /// Hands the tenant off: refuses new work ([`Error::Draining`]), waits up to the drain
    /// timeout for the work in flight, then releases the lease and wakes replicas waiting for
    /// it ([`Router::wait_for`](crate::Router::wait_for)). No data moves.
    ///
    /// # Errors
    /// [`Error::DrainTimeout`] when work is still running at the deadline: the tenant keeps
    /// serving here. [`Error::LeaseLost`] when the lease ended meanwhile.
    #[tracing::instrument(name = "pgtenant.handoff", skip_all, fields(tenant = %self.inner.id, epoch = self.inner.epoch))]
    pub async fn handoff(&self) -> Result<()> {
        self.hand_over(None).await
    }

    /// Like [`TenantHandle::handoff`], and reserves the tenant for `replica` for the
    /// reservation window, so no other replica takes it first.
    #[tracing::instrument(name = "pgtenant.handoff_to", skip_all, fields(tenant = %self.inner.id, epoch = self.inner.epoch, to = replica))]
    pub async fn handoff_to(&self, replica: &str) -> Result<()> {
        crate::options::validate_replica_id("replica", replica)?;
        self.inner.router.ensure_live_replica(replica).await?;
        self.hand_over(Some(replica)).await
    }

    async fn hand_over(&self, to: Option<&str>) -> Result<()> {
        let inner = &self.inner;
        if !inner.transition(SERVING, DRAINING) {
            return Err(match inner.state.load(Ordering::Acquire) {
                DRAINING => Error::Draining {
                    tenant: inner.id.key().to_owned(),
                },
                LOST => inner.lease_lost("lost"),
                _ => inner.lease_lost("released"),
            });
        }
        inner.router.emit(Event::Draining {
            tenant: inner.id.key().to_owned(),
            epoch: inner.epoch,
            in_flight: self.in_flight(),
        });
        let timeout = inner.router.options.drain_timeout;
        if tokio::time::timeout(timeout, self.wait_idle())
            .await
            .is_err()
        {
            let in_flight = self.in_flight();
            inner.router.emit(Event::DrainTimeout {
                tenant: inner.id.key().to_owned(),
                epoch: inner.epoch,
                in_flight,
            });
            // A failed drain leaves the tenant serving, unless the lease ended meanwhile.
            inner.transition(DRAINING, SERVING);
            return Err(Error::DrainTimeout {
                tenant: inner.id.key().to_owned(),
                in_flight,
                timeout,
            });
        }
        if !inner.transition(DRAINING, RELEASED) {
            return Err(inner.lease_lost("lost"));
        }
        self.give_back("handed_off", to).await
    }

    /// Stops serving at once and releases the lease without waiting for work in flight; that
    /// work either commits before the next owner's acquisition (which waits for it) or fails.
    #[tracing::instrument(name = "pgtenant.abandon", skip_all, fields(tenant = %self.inner.id, epoch = self.inner.epoch))]
    pub async fn abandon(&self) -> Result<()> {
        if !(self.inner.transition(SERVING, RELEASED) || self.inner.transition(DRAINING, RELEASED))
        {
            return Ok(());
        }
        self.give_back("released", None).await
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
    #[tracing::instrument(name = "pgtenant.forget", skip_all, fields(tenant = %self.inner.id, epoch = self.inner.epoch, ?active))]
    pub async fn forget(&self, active: ActiveWork) -> Result<String> {
        let inner = &self.inner;
        inner.admit()?;
        if !inner.transition(SERVING, DRAINING) {
            return Err(Error::Draining {
                tenant: inner.id.key().to_owned(),
            });
        }
        let in_flight = self.in_flight();
        if active == ActiveWork::Refuse && in_flight > 0 {
            inner.transition(DRAINING, SERVING);
            return Err(Error::Busy {
                tenant: inner.id.key().to_owned(),
                in_flight,
            });
        }
        let timeout = inner.router.options.drain_timeout;
        let drained = if active == ActiveWork::Cancel {
            // A cancel reaches only the statement running at that moment: repeat it until the
            // work ends, so work between statements is caught at its next one.
            tokio::time::timeout(timeout, async {
                loop {
                    let tokens: Vec<CancelToken> =
                        lock_cancels(inner).iter().map(|(_, t)| t.clone()).collect();
                    for token in tokens {
                        let _ = inner.router.options.connector.cancel(token).await;
                    }
                    if tokio::time::timeout(CANCEL_REPEAT, self.wait_idle())
                        .await
                        .is_ok()
                    {
                        return;
                    }
                }
            })
            .await
        } else {
            tokio::time::timeout(timeout, self.wait_idle()).await
        };
        if drained.is_err() {
            inner.transition(DRAINING, SERVING);
            return Err(Error::DrainTimeout {
                tenant: inner.id.key().to_owned(),
                in_flight: self.in_flight(),
                timeout,
            });
        }
        let router = &inner.router;
        let client = router
            .pool
            .get()
            .await
            .map_err(pool_error("forget a tenant"))?;
        let credentials = &inner.credentials;
        let (key, secret) = (inner.id.key(), credentials.secret());
        let forgotten = control::call(
            &client,
            "SELECT pgtenant.forget($1, $2, $3, $4, $5)",
            &[
                (&key, Type::TEXT),
                (&inner.epoch, Type::INT8),
                (&credentials.replica, Type::TEXT),
                (&credentials.incarnation, Type::INT8),
                (&secret, Type::TEXT),
            ],
        )
        .await
        .and_then(|rows| match rows.first() {
            Some(row) => row.try_get::<_, String>(0),
            None => Ok(String::new()),
        });
        let trash = match forgotten {
            Ok(trash) => trash,
            Err(error) => {
                let error = inner.fence_error(error);
                inner.transition(DRAINING, SERVING);
                return Err(error);
            }
        };
        inner.transition(DRAINING, FORGOTTEN);
        router.detach(inner);
        tracing::info!(tenant = %inner.id, epoch = inner.epoch, %trash, "forgotten");
        router.emit(Event::Forgotten {
            tenant: inner.id.key().to_owned(),
            epoch: inner.epoch,
            trash: trash.clone(),
        });
        Ok(trash)
    }

    async fn give_back(&self, event: &'static str, to: Option<&str>) -> Result<()> {
        let inner = &self.inner;
        let router = &inner.router;
        router.detach(inner);
        let released = match router
            .releases
            .release(
                &inner.id,
                inner.epoch,
                &inner.credentials,
                event,
                to.map(|replica| (replica, router.options.reservation)),
            )
            .await
        {
            Err(Error::NoSuchReplica { replica_id, .. }) => {
                // The target died between the check before the drain and this release: the
                // tenant is already drained, so it is released for anyone rather than kept.
                tracing::warn!(tenant = %inner.id, to = %replica_id, "handoff target gone; released without a reservation");
                router
                    .releases
                    .release(&inner.id, inner.epoch, &inner.credentials, event, None)
                    .await?
            }
            released => released?,
        };
        let tenant = inner.id.key().to_owned();
        let epoch = inner.epoch;
        router.emit(match (released, event) {
            (false, _) => Event::Lost {
                tenant,
                epoch,
                reason: "already taken over when released".to_owned(),
            },
            (true, "handed_off") => Event::HandedOff {
                tenant,
                epoch,
                to: to.map(str::to_owned),
            },
            (true, _) => Event::Released { tenant, epoch },
        });
        Ok(())
    }
}
