//! Tenant handles (DESIGN §1 "handle", §5 "Fenced transaction", "Handoff", "Abandon",
//! "Forget"): the only way to a tenant's ledger, bound to one tenant and one epoch. A thin
//! facade: the handle's state is `state/replica.rs` (`HeldLease`), and each public method
//! delegates to its protocol's file: `protocol/fenced_transaction.rs`, `protocol/handoff.rs`
//! (release, handoff), `protocol/abandon.rs`, `protocol/forget.rs`. `handle/statements.rs`
//! gives the work's transactions statement methods that return pgtenant's [`Error`].

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, HandleState};
use crate::protocol::fenced_transaction::{TenantConnection, Tx};
use crate::replica_id::ReplicaId;
use crate::state::replica::HeldLease;
use crate::sync::BoxFuture;

pub use crate::state::replica::ActiveWork;

mod statements;

/// A tenant's lease as this replica holds it: bound to one tenant and one epoch. Cheap to
/// clone; every clone is the same tenure.
///
/// Work runs in fenced transactions: PostgreSQL itself refuses to commit once the epoch is no
/// longer the tenant's, whatever clocks, pauses or networks do.
#[derive(Clone)]
pub struct TenantHandle {
    inner: Arc<HeldLease>,
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
    pub(crate) fn from_inner(inner: Arc<HeldLease>) -> Self {
        TenantHandle { inner }
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
    /// `pg_temp`) for this transaction only. If the work fails or panics, the transaction rolls
    /// back. `Ok` means committed. The work may borrow from the caller. `tx`'s statement methods
    /// (`execute`, `query`, `query_one`, …) return [`Error`], so the work's error type needs only
    /// `From<pgtenant::Error>`; it derefs to the driver's transaction for the rest.
    ///
    /// Cancel-safe: if this future is dropped (a client disconnected, a `timeout`, a
    /// `select!`) before it returns, the work may or may not have committed, exactly as if it
    /// had run to its end before the lease ended: a `COMMIT` already on the wire commits under
    /// this lease or not at all, never after the lease has moved. The work counts in flight,
    /// and its connection serves no one else, until its backend has answered (or, if it does not
    /// answer within the stuck timeout, has been terminated), so a handoff, release, abandon or
    /// forget waits for it. The same holds for [`Error::ConnectionStuck`] from the commit. To
    /// retry such an ambiguous outcome safely, use [`TenantHandle::run_once`].
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
        crate::protocol::fenced_transaction::run(&self.inner, false, work).await
    }

    /// Like [`TenantHandle::run`] in a `READ ONLY` transaction whose fence skips the lock.
    #[tracing::instrument(name = "pgtenant.read", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn read<'a, T, E, F>(&self, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
    {
        crate::protocol::fenced_transaction::run(&self.inner, true, work).await
    }

    /// Runs `work` at most once per `request` id: like [`TenantHandle::run`], and the outcome
    /// is recorded (as JSON) in the same fenced transaction as the work's effect, in the
    /// tenant's table `pgtenant_requests`. A later call with the same id, within
    /// [`RouterOptions::request_retention`](crate::RouterOptions::request_retention), returns
    /// the recorded outcome without running the work: retry freely after a timeout, a dropped
    /// future, a stuck COMMIT or a lost connection, whose outcome is otherwise unknown, and the
    /// work is done once. Concurrent calls with the same id: one commits, the others return its
    /// outcome. Errors are not recorded (nothing committed): a retry after an error runs the
    /// work again. Use the client's idempotency key, or a UUID per logical request.
    ///
    /// ```no_run
    /// # async fn example(tenant: &pgtenant::TenantHandle, request: &str) -> pgtenant::Result<()> {
    /// let id: i64 = tenant
    ///     .run_once(request, |tx| Box::pin(async move {
    ///         let row = tx.query_one("INSERT INTO payments (cents) VALUES (500) RETURNING id", &[]).await?;
    ///         Ok::<_, pgtenant::Error>(row.get(0))
    ///     }))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`TenantHandle::run`]; [`Error::InvalidOption`] for an empty request id or one over
    /// 200 bytes (before anything runs); [`Error::UnexpectedReply`] when the id's recorded
    /// outcome does not decode as `T` (the id was used for other work).
    #[tracing::instrument(name = "pgtenant.run_once", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn run_once<'a, T, E, F>(&self, request: &str, work: F) -> Result<T, E>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send,
        E: From<Error> + Send,
        F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>> + Send + 'a,
    {
        crate::protocol::fenced_transaction::once::run_once(&self.inner, request, work).await
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
        crate::protocol::release::release(&self.inner).await
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
        crate::protocol::handoff::hand_over(&self.inner, None).await
    }

    /// Like [`TenantHandle::handoff`], and reserves the tenant for `replica` for the
    /// reservation window, so no other replica takes it first while `replica` is alive.
    ///
    /// # Errors
    /// [`Error::NoSuchReplica`] before anything changes when `replica` is not a registered,
    /// live replica; otherwise as [`TenantHandle::handoff`].
    #[tracing::instrument(name = "pgtenant.handoff_to", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch, to = %replica))]
    pub async fn handoff_to(&self, replica: &ReplicaId) -> Result<()> {
        crate::protocol::handoff::hand_over_to(&self.inner, replica).await
    }

    /// Stops serving at once and releases the lease without waiting for work in flight; that
    /// work either commits before the next owner's acquisition (which waits for it) or fails.
    #[tracing::instrument(name = "pgtenant.abandon", skip_all, fields(tenant = %self.inner.id, epoch = %self.inner.epoch))]
    pub async fn abandon(&self) -> Result<()> {
        crate::protocol::abandon::abandon(&self.inner).await
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
        crate::protocol::forget::forget(&self.inner, active).await
    }
}
