//! Fenced transactions (DESIGN §5 "Fenced transaction", "Data sessions and session fencing"):
//! `BEGIN READ WRITE`, the entry (the fence, or under session fencing the pin), the work, then
//! the commit check and `COMMIT` in one message.
//!
//! The fence refuses a stale, released or forgotten epoch inside PostgreSQL; under session
//! fencing the connection's binding does (`session_fencing/`). Every entry sets the
//! transaction-local `pgtenant.fenced`, and the commit sends, in the same message as `COMMIT`
//! and ahead of it, a check that fails once anything ended the transaction the entry began (the work's own
//! COMMIT, ROLLBACK or PREPARE TRANSACTION, whatever it did to session characteristics): then
//! nothing after that point commits and `run` reports [`Error::TransactionEnded`]. A work that
//! left its transaction aborted (it swallowed a statement's error) fails the check too instead
//! of being reported as committed. Two ways in:
//! * [`TenantHandle::run`](crate::TenantHandle::run) / `read` take the work as a closure; the
//!   entry travels with the work's first statement (no extra round trip) and its reply is read
//!   concurrently with the work's, so nothing the server interleaves (ParameterStatus, NOTICE,
//!   NOTIFY) can leave it unread and stall the connection.
//! * [`TenantConnection::begin`] returns a guard that derefs to the driver's transaction, for
//!   work that borrows freely and uses `?`; it waits for the fence's verdict before returning
//!   (one round trip more than `run`).
//!
//! Both are cancel-safe (`settle.rs`): whatever point a caller drops the future at, the work
//! counts in flight until nothing it sent can still commit, so no voluntary end of the lease
//! commits before it; and its connection serves nobody else before its transaction is over.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Statement, Transaction};

use crate::db;
use crate::db::fence::{self, Form};
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::protocol::fenced_transaction::settle::{SessionState, WorkSession};
use crate::sqlstate;
use crate::state::alarms::TxAlarms;
use crate::state::replica::{CancelOnForget, HeldLease, Replica};
use crate::sync::BoxFuture;

pub(crate) mod once;
pub(crate) mod settle;

/// The transaction [`TenantHandle::run`](crate::TenantHandle::run) hands its work: its
/// statement methods (`execute`, `query`, …) return pgtenant's [`Error`], and it derefs to the
/// driver's [`Transaction`] for the rest. `'a` is what the work may borrow from its caller.
#[derive(Clone, Copy)]
pub struct Tx<'t, 'a> {
    transaction: &'t Transaction<'t>,
    lease: &'t Arc<HeldLease>,
    /// What this transaction did to the tenant's alarms (`protocol/alarms.rs`).
    alarms: &'t TxAlarms,
    // Implies 'a: 't for every 't the work is called with, so the work may capture borrows
    // that live as long as the call to `run`, not 'static ones only.
    _borrows: PhantomData<&'t &'a ()>,
}

impl<'t> Deref for Tx<'t, '_> {
    type Target = Transaction<'t>;

    fn deref(&self) -> &Transaction<'t> {
        self.transaction
    }
}

impl<'t> Tx<'t, '_> {
    /// The lease this transaction runs under.
    pub(crate) fn lease(&self) -> &'t Arc<HeldLease> {
        self.lease
    }

    /// What this transaction did to the tenant's alarms.
    pub(crate) fn alarm_notes(&self) -> &'t TxAlarms {
        self.alarms
    }
}

impl std::fmt::Debug for Tx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tx")
    }
}

/// How this transaction is fenced: the fence statement; or (session fencing) the bound
/// connection's backend and either the pin alone (a connection that reports the transaction
/// signal, so the client knows when to reset the session) or the enter statement, which
/// decides the reset itself. Every form sets the commit check's setting.
enum Entry {
    Fence {
        statement: Option<Statement>,
        read_only: bool,
        /// The connection reports the transaction signal.
        signalled: bool,
        /// On a connection that reports the transaction signal, the client decides the reset
        /// (without the signal the fence does): whether the session is reset first.
        reset: bool,
    },
    Session {
        pid: i32,
        enter: Option<Statement>,
    },
    Pinned {
        pid: i32,
        pin: Option<Statement>,
        /// The connection changes tenant: reset the session first.
        reset: bool,
    },
}

impl Entry {
    fn backend(&self) -> Option<i32> {
        match self {
            Entry::Fence { .. } => None,
            Entry::Session { pid, .. } | Entry::Pinned { pid, .. } => Some(*pid),
        }
    }
}

/// An entry, prepared for this connection, and what its `BEGIN` says.
struct Entered {
    entry: Entry,
    characteristics: crate::wire::Characteristics,
}

/// Prepares this connection's entry: the fence, or the binding (once per connection and
/// incarnation) and the enter statement. Statements are prepared once per
/// pooled connection (the server then neither parses nor plans them), or sent unnamed behind a
/// pooler that keeps no prepared statements.
async fn entry(
    handle: &HeldLease,
    client: &deadpool_postgres::Object,
    read_only: bool,
) -> Result<Entered> {
    let replica = &handle.replica;
    let cached = replica.options.statement_cache;
    let pid = if replica.session_fencing() {
        Some(
            crate::protocol::session_fencing::bind::bound(replica, client, &handle.credentials)
                .await?,
        )
    } else {
        None
    };
    let entered = match replica.data_sessions.enter(client, &handle.key) {
        Some(entered) => entered,
        None => {
            let (signal, characteristics) = db::sessions::probe(client).await?;
            replica.data_sessions.learn(client, signal, characteristics)
        }
    };
    let entry = match (pid, entered.signal.is_some()) {
        (Some(pid), true) => Entry::Pinned {
            pid,
            pin: prepared(client, cached, Form::Pin, "prepare the pin").await?,
            reset: entered.reset,
        },
        (Some(pid), false) => Entry::Session {
            pid,
            enter: prepared(client, cached, Form::Enter, "prepare the entry statement").await?,
        },
        (None, signalled) => Entry::Fence {
            statement: prepared(client, cached, Form::Fence, "prepare the fence").await?,
            read_only,
            signalled,
            reset: signalled && entered.reset,
        },
    };
    Ok(Entered {
        entry,
        characteristics: entered.characteristics,
    })
}

/// `form` prepared once per pooled connection (the server then neither parses nor plans it),
/// or None to send it unnamed when the statement cache is off.
async fn prepared(
    client: &deadpool_postgres::Object,
    cached: bool,
    form: Form,
    context: &'static str,
) -> Result<Option<Statement>> {
    if !cached {
        return Ok(None);
    }
    fence::prepare(client, form)
        .await
        .map(Some)
        .map_err(Error::db(context))
}

/// Runs `statement` after the session reset when `reset` (the connection changes tenant): the
/// reset goes on the wire first, both in the same flight.
async fn after_reset<F>(
    handle: &HeldLease,
    tx: &Transaction<'_>,
    reset: bool,
    statement: F,
) -> std::result::Result<(), tokio_postgres::Error>
where
    F: std::future::Future<Output = std::result::Result<(), tokio_postgres::Error>>,
{
    if !reset {
        return statement.await;
    }
    // join! polls in order, and each request goes on the wire at its first poll.
    let (reset, done) = tokio::join!(fence::reset_session(tx, &handle.key), statement);
    reset.and(done)
}

/// Sends the entry (the fence, the enter statement or the pin) on `tx` and reads its reply.
async fn send_entry(
    handle: &HeldLease,
    tx: &Transaction<'_>,
    entry: &Entry,
) -> std::result::Result<(), tokio_postgres::Error> {
    match entry {
        Entry::Pinned { pin, reset, .. } => {
            let pinned = fence::pin(tx, pin.as_ref(), &handle.search_path);
            after_reset(handle, tx, *reset, pinned).await
        }
        Entry::Session { enter, .. } => {
            fence::enter(tx, enter.as_ref(), handle.id.key(), &handle.schema).await
        }
        Entry::Fence {
            statement,
            read_only,
            signalled,
            reset,
        } => {
            let fenced = fence::fence(
                tx,
                statement.as_ref(),
                *read_only,
                *signalled,
                handle.id.key(),
                handle.epoch,
                handle.lock_key,
                &handle.replica.idle_timeout_ms,
            );
            after_reset(handle, tx, *reset, fenced).await
        }
    }
}

/// A pooled data connection for `tenant`'s work: the one parked for it (clean for it: no
/// session reset), else an idle one of the pool, else, rather than wait while a connection
/// is idle, the one parked longest for another tenant, else wait for the pool.
pub(crate) async fn tenant_connection(
    shared: &Replica,
    tenant: &str,
) -> std::result::Result<deadpool_postgres::Object, deadpool_postgres::PoolError> {
    if let Some(object) = shared.parking.take(tenant) {
        return Ok(object);
    }
    let now = deadpool_postgres::Timeouts {
        wait: Some(Duration::ZERO),
        ..shared.pool.timeouts()
    };
    match shared.pool.timeout_get(&now).await {
        Err(deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => {}
        got => return got,
    }
    if let Some(object) = shared.parking.steal() {
        return Ok(object);
    }
    shared.pool.get().await
}

/// The admission sequence of both ways in (`run` and `TenantConnection::begin`), the work
/// already counted in flight in `state`: the connection's entry (bound under session fencing),
/// its cancel token and backend registered where `forget(ActiveWork::Cancel)` and `abandon`
/// find them, the admission checked again (an `abandon` in between terminated only the
/// backends registered before it), then BEGIN. In this order: a backend registered after
/// `abandon` looked must not start work.
async fn admit<'c>(
    handle: &Arc<HeldLease>,
    object: &'c mut deadpool_postgres::Object,
    state: &mut SessionState,
    read_only: bool,
) -> Result<(Entered, Transaction<'c>)> {
    let entered = entry(handle, object, read_only).await?;
    let backend = entered.entry.backend();
    state.register_cancel(
        CancelOnForget::register(handle, object.cancel_token(), backend),
        backend,
    );
    handle.still_admitted()?;
    let tx = begin(handle, object, state, read_only, entered.characteristics).await?;
    Ok((entered, tx))
}

/// Begins the transaction within the stuck bound, its characteristics said explicitly: `READ
/// WRITE` or `READ ONLY` (data sessions default to read-only), and the connection's default
/// isolation level and deferrability, so that a session `SET` an earlier tenant's work left
/// (undone by the reset, which runs after `BEGIN`) never shapes this transaction.
async fn begin<'c>(
    handle: &HeldLease,
    client: &'c mut tokio_postgres::Client,
    state: &mut SessionState,
    read_only: bool,
    characteristics: crate::wire::Characteristics,
) -> Result<Transaction<'c>> {
    let bound = handle.replica.options.stuck_timeout;
    let mut builder = client
        .build_transaction()
        .read_only(read_only)
        .deferrable(characteristics.deferrable);
    if let Some(level) = characteristics.isolation {
        builder = builder.isolation_level(level);
    }
    match tokio::time::timeout(bound, builder.start()).await {
        Ok(begun) => begun.map_err(Error::db("begin tenant transaction")),
        Err(_) => {
            state.stuck = true;
            Err(Error::stuck("begin tenant transaction", bound))
        }
    }
}

/// The entry (the fence, the pin, the session reset ahead of it) failed: a refusal of the
/// epoch ends the tenure; anything else leaves the connection's session in doubt (a reset that
/// an earlier tenant's `statement_timeout` cut short, say), so it is closed instead of pooled.
fn entry_failed(
    handle: &Arc<HeldLease>,
    error: tokio_postgres::Error,
    state: &mut SessionState,
) -> Error {
    let error = handle.refused(error, "fence tenant work");
    if !matches!(error, Error::Fenced { .. } | Error::Forgotten { .. }) {
        state.retire = true;
    }
    error
}

/// Commits, behind the commit check in the same message, within the stuck bound. The session
/// is settled once the reply was read: nothing sent can commit any more, whatever it says.
async fn commit(handle: &HeldLease, tx: Transaction<'_>, state: &mut SessionState) -> Result<()> {
    let bound = handle.replica.options.stuck_timeout;
    let Ok(committed) = tokio::time::timeout(bound, fence::commit_checked(&tx)).await else {
        state.stuck = true;
        return Err(Error::stuck("commit tenant work", bound));
    };
    match committed {
        Ok(()) => {
            // Answered: the driver's transaction must not send its ROLLBACK on drop (it holds
            // only a borrow of the connection, so forgetting it leaks nothing).
            std::mem::forget(tx);
            state.settled();
            Ok(())
        }
        Err(error) if error.as_db_error().is_some() => {
            // The check failed (the server skipped the COMMIT behind it: the transaction is
            // aborted and open, or none is) or COMMIT did (rolled back). The driver's
            // transaction queues its ROLLBACK as it drops, ending whatever is left, ahead of
            // anything later on the connection.
            drop(tx);
            state.settled();
            Err(ended_or_failed(handle, error))
        }
        // The reply never came (the connection broke): the fate is unknown, so the session
        // settles, or its backend is terminated, before the work stops counting.
        Err(error) => Err(Error::db("commit tenant work")(error)),
    }
}

/// What a failed commit check means: the work ended the fenced transaction itself, or left it
/// aborted; either way nothing after that point committed.
fn ended_or_failed(handle: &HeldLease, error: tokio_postgres::Error) -> Error {
    let ended = error
        .as_db_error()
        .is_some_and(|db| db.constraint() == Some(fence::ENDED_CONSTRAINT));
    if ended {
        return Error::TransactionEnded {
            tenant: handle.id.clone(),
            epoch: handle.epoch,
        };
    }
    if sqlstate::of(&error) == Some(sqlstate::IN_FAILED_TRANSACTION) {
        return Error::db(
            "commit tenant work: a statement of the work failed and the work did not return its \
             error, so the transaction was aborted and nothing of it committed; return the error \
             from the work",
        )(error);
    }
    Error::db("commit tenant work")(error)
}

/// [`TenantHandle::run`](crate::TenantHandle::run) and `read`.
pub(crate) async fn run<'a, T, E, F>(
    handle: &Arc<HeldLease>,
    read_only: bool,
    work: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
{
    run_noted(handle, read_only, &TxAlarms::default(), work).await
}

/// [`run`], keeping what the work did to the tenant's alarms in `alarms` (the firing task reads
/// the next due time its transaction noted).
pub(crate) async fn run_noted<'a, T, E, F>(
    handle: &Arc<HeldLease>,
    read_only: bool,
    alarms: &TxAlarms,
    work: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
{
    let in_flight = handle.begin_work()?;
    let object = tenant_connection(&handle.replica, &handle.key)
        .await
        .map_err(pool_error("get a connection for tenant work"))?;
    // From here on, whatever happens to this future, the session settles before the work stops
    // counting in flight and before the connection serves anyone else (settle.rs).
    let mut session = WorkSession::new(handle, object);
    session.state.hold(in_flight);
    let outcome = match session.parts() {
        Some((_, object, state)) => run_on(handle, object, state, read_only, alarms, work).await,
        None => Err(Error::stuck(
            "begin tenant transaction",
            handle.replica.options.stuck_timeout,
        )
        .into()),
    };
    if outcome.is_err() {
        session.settle_now().await;
    }
    outcome
}

async fn run_on<'a, T, E, F>(
    handle: &Arc<HeldLease>,
    object: &mut deadpool_postgres::Object,
    state: &mut SessionState,
    read_only: bool,
    alarms: &TxAlarms,
    work: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
{
    let object_id = deadpool_postgres::Object::id(object);
    let (entered, tx) = admit(handle, object, state, read_only).await?;
    // The entry goes on the wire first (join! polls in order) and its reply is consumed as it
    // arrives, concurrently with the work.
    let (fenced, outcome) = tokio::join!(
        send_entry(handle, &tx, &entered.entry),
        work(Tx {
            transaction: &tx,
            lease: handle,
            alarms,
            _borrows: PhantomData,
        }),
    );
    if let Err(error) = fenced {
        // The work saw an aborted transaction; the fence's refusal is the real story.
        return Err(entry_failed(handle, error, state).into());
    }
    let value = outcome?;
    if alarms.touched() {
        // The tenant's alarm hint, computed under the alarm lock the work took, commits with
        // the work (DESIGN G11: a due alarm of a tenant nobody holds is found by it).
        let next = db::alarms::note_alarms(&tx, &handle.key)
            .await
            .map_err(Error::db("note the tenant's alarms"))?;
        alarms.set_noted(next);
    }
    commit(handle, tx, state).await?;
    retire_if_spent(handle, object_id, state);
    if alarms.touched() {
        handle
            .alarms_table
            .store(true, std::sync::atomic::Ordering::Release);
        if !alarms.firing && handle.replica.options.alarms.handler.is_some() {
            handle
                .replica
                .alarms
                .committed(&handle.id, alarms.noted().flatten());
        }
    }
    Ok(value)
}

/// A transaction for the handle's tenant committed on connection `object`: the data path's
/// bookkeeping, and whether the connection served `max_tenants_per_connection` tenants (then it
/// is closed instead of pooled: its backend's catalog caches go with it).
fn retire_if_spent(
    handle: &HeldLease,
    object: deadpool_postgres::ObjectId,
    state: &mut SessionState,
) {
    let replica = &handle.replica;
    if replica.data_sessions.committed(
        object,
        &handle.key,
        replica.options.max_tenants_per_connection,
    ) {
        state.retire = true;
    }
}

/// A pooled data connection for one tenant's fenced transactions, from
/// [`TenantHandle::connect`](crate::TenantHandle::connect). It goes back to the pool when
/// dropped (or is closed, if it stopped answering).
///
/// Cancel-safe like [`TenantHandle::run`](crate::TenantHandle::run): a
/// [`TenantTransaction::commit`] whose future is dropped leaves its work counted in flight until
/// the connection has answered (at the next [`TenantConnection::begin`], or in the background
/// once the connection is dropped), so hold the connection no longer than you need it.
pub struct TenantConnection {
    session: WorkSession,
}

impl std::fmt::Debug for TenantConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantConnection")
            .field("tenant", &self.session.handle.id)
            .field("epoch", &self.session.handle.epoch)
            .finish_non_exhaustive()
    }
}

impl TenantConnection {
    pub(crate) async fn checkout(handle: &Arc<HeldLease>) -> Result<TenantConnection> {
        handle.admit()?;
        let object = tenant_connection(&handle.replica, &handle.key)
            .await
            .map_err(pool_error("get a connection for tenant work"))?;
        Ok(TenantConnection {
            session: WorkSession::new(handle, object),
        })
    }

    /// Begins a fenced read-write transaction. It returns once PostgreSQL has passed the
    /// fence, so a refused epoch is [`Error::Fenced`] here, before any work.
    ///
    /// ```no_run
    /// # async fn example(tenant: &pgtenant::TenantHandle, name: &str) -> pgtenant::Result<()> {
    /// let mut connection = tenant.connect().await?;
    /// let tx = connection.begin().await?;
    /// tx.execute("INSERT INTO accounts (name) VALUES ($1)", &[&name]).await?;
    /// tx.commit().await?; // dropped without commit: rolled back
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`TenantHandle::run`](crate::TenantHandle::run) before the work.
    pub async fn begin(&mut self) -> Result<TenantTransaction<'_>> {
        self.start(false).await
    }

    /// Like [`TenantConnection::begin`] for a `READ ONLY` transaction.
    pub async fn begin_read(&mut self) -> Result<TenantTransaction<'_>> {
        self.start(true).await
    }

    async fn start(&mut self, read_only: bool) -> Result<TenantTransaction<'_>> {
        let handle = self.session.handle.clone();
        let bound = handle.replica.options.stuck_timeout;
        // What an earlier transaction left unanswered (a commit whose future was dropped, a
        // begin that failed) is settled first.
        if !self.session.settle_now().await {
            return Err(Error::stuck("begin tenant transaction", bound));
        }
        let in_flight = handle.begin_work()?;
        let Some((session_handle, object, state)) = self.session.parts() else {
            return Err(Error::stuck("begin tenant transaction", bound));
        };
        state.hold(in_flight);
        let object_id = deadpool_postgres::Object::id(object);
        let (entered, tx) = match admit(&handle, object, state, read_only).await {
            Ok(admitted) => admitted,
            Err(error) => {
                // Nothing that could commit was sent: the work stops counting, and the next
                // begin settles the connection first.
                state.abandoned_before_commit();
                return Err(error);
            }
        };
        if let Err(error) = send_entry(&handle, &tx, &entered.entry).await {
            // The driver's transaction queues its ROLLBACK as it drops here.
            state.abandoned_before_commit();
            return Err(entry_failed(&handle, error, state));
        }
        Ok(TenantTransaction {
            tx: Some(tx),
            handle: session_handle,
            state,
            object: object_id,
            commit_sent: false,
        })
    }
}

/// A fenced transaction, guard-style: derefs to the driver's [`Transaction`]; commits with
/// [`TenantTransaction::commit`] and rolls back when dropped. Counts as work in flight.
///
/// Its statement methods (`execute`, `query`, …, in `handle/statements.rs`) return pgtenant's
/// [`Error`] ([`Error::Database`], whose Display carries the server's SQLSTATE, message, detail
/// and hint); the driver's own are reachable through the deref. The fence speaks
/// through [`TenantConnection::begin`] and [`TenantTransaction::commit`]: a stale epoch is
/// refused by `begin` ([`Error::Fenced`]), and a lease that moves while the transaction is
/// open makes `commit` fail; an `Ok` from `commit` means committed under the lease.
pub struct TenantTransaction<'c> {
    /// None once committed or rolled back.
    tx: Option<Transaction<'c>>,
    handle: &'c Arc<HeldLease>,
    state: &'c mut SessionState,
    object: deadpool_postgres::ObjectId,
    /// `COMMIT` may be on the wire: if this guard is dropped before its reply, the work keeps
    /// counting in flight until the connection answers.
    commit_sent: bool,
}

impl std::fmt::Debug for TenantTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantTransaction")
            .field("tenant", &self.handle.id)
            .field("epoch", &self.handle.epoch)
            .finish_non_exhaustive()
    }
}

impl<'c> Deref for TenantTransaction<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        match &self.tx {
            Some(tx) => tx,
            // commit and rollback take the guard by value: nothing can deref it after.
            None => unreachable!("a TenantTransaction is used only before commit or rollback"),
        }
    }
}

impl Drop for TenantTransaction<'_> {
    fn drop(&mut self) {
        if self.tx.is_some() && !self.commit_sent {
            // Dropped without commit: the driver's transaction queues its ROLLBACK as it drops
            // (right after this), ahead of anything later on the connection, and no COMMIT was
            // sent: nothing can commit, and the connection needs no settling.
            self.state.settled();
        }
    }
}

impl TenantTransaction<'_> {
    /// Commits. `Ok` means committed under the lease.
    ///
    /// Cancel-safe: if this future is dropped, the transaction may commit (under the lease,
    /// never after it ends) or not; the work counts in flight until the connection says which.
    ///
    /// # Errors
    /// [`Error::TransactionEnded`] when statements run through the guard ended the fenced
    /// transaction themselves; database errors (the transaction rolled back).
    pub async fn commit(mut self) -> Result<()> {
        let Some(tx) = self.tx.take() else {
            return Ok(());
        };
        self.commit_sent = true;
        let handle = self.handle;
        commit(handle, tx, self.state).await?;
        // A guard's connection serves one tenant: closed when the guard drops if it is spent.
        retire_if_spent(handle, self.object, self.state);
        Ok(())
    }

    /// Rolls back (as dropping the guard does), reporting the database's answer.
    ///
    /// # Errors
    /// Database errors.
    pub async fn rollback(mut self) -> Result<()> {
        let Some(tx) = self.tx.take() else {
            return Ok(());
        };
        let rolled_back = tx
            .rollback()
            .await
            .map_err(Error::db("roll back tenant work"));
        if rolled_back.is_ok() {
            self.state.settled();
        } else {
            // Nothing can commit; the next begin settles the connection first.
            self.state.abandoned_before_commit();
        }
        rolled_back
    }
}
