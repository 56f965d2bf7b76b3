//! Fenced transactions (DESIGN §5 "Fenced transaction"): `BEGIN READ WRITE; SELECT
//! pgtenant.fence(…)`, the work, then `CLOSE pgtenant_fenced; COMMIT`.
//!
//! The fence refuses a stale, released or forgotten epoch inside PostgreSQL, scrubs the session
//! a previous user of the connection left (when it changes tenant or role), pins `search_path`
//! and opens a marker cursor; closing that cursor in the COMMIT's own message proves the work did
//! not end the fenced transaction itself. Two ways in:
//! * [`TenantHandle::run`](crate::TenantHandle::run) / `read` take the work as a closure; the
//!   fence travels with the work's first statement (no extra round trip) and its reply is read
//!   concurrently with the work's, so nothing the server interleaves (ParameterStatus, NOTICE,
//!   NOTIFY) can leave it unread and stall the connection.
//! * [`TenantConnection::begin`] returns a guard that derefs to the driver's transaction, for
//!   work that borrows freely and uses `?`; it waits for the fence's verdict before returning
//!   (one round trip more than `run`).

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Statement, Transaction};

use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::lease::HandleState;
use crate::sqlstate;
use crate::state::shared::{CancelOnForget, HandleInner, InFlight};
use crate::sync::BoxFuture;

/// The fence (the tenant's advisory lock held shared + the epoch check + session hygiene +
/// search_path + the marker cursor). Both forms take (key, epoch, lock key, idle ms) and
/// return one row or raise.
const FENCE_SQL: &str = "SELECT pgtenant.fence($1, $2, $3, $4)";
/// The read-only variant: the same checks without the lock.
const FENCE_READ_SQL: &str = "SELECT pgtenant.fence_read($1, $2, $3, $4)";
/// Both on a connection that reports the transaction signal (V9): no marker cursor and no
/// hygiene check (the client decides the reset); the same arguments.
const FENCE_SIGNALLED_SQL: &str = "SELECT pgtenant.fence_signalled($1, $2, $3, $4)";
const FENCE_READ_SIGNALLED_SQL: &str = "SELECT pgtenant.fence_read_signalled($1, $2, $3, $4)";
/// The fences' parameter types, for the unnamed (uncached) form.
const FENCE_TYPES: [Type; 4] = [Type::TEXT, Type::INT8, Type::INT4, Type::TEXT];
/// Session fencing's one statement per transaction (the connection is bound): hygiene,
/// search_path, the marker cursor; no row read, no lock.
const ENTER_SQL: &str = "SELECT pgtenant.enter($1, $2)";
/// Its parameter types, for the unnamed (uncached) form.
const ENTER_TYPES: [Type; 2] = [Type::TEXT, Type::TEXT];
/// Ends a fenced transaction. If the work ended the fenced transaction itself, the marker
/// cursor is gone, CLOSE fails and nothing the work did after that commits: one message, no
/// extra round trip.
const COMMIT_SQL: &str = "CLOSE pgtenant_fenced; COMMIT";
/// Session fencing on a connection whose server reports the transaction signal (`wire.rs`):
/// the pin, the same statement an unfenced schema-per-tenant transaction sends, plus the
/// signal, set for this transaction only. Its one parameter is the `search_path`.
const PIN_SQL: &str = "SELECT pg_catalog.set_config('search_path', $1, true), \
                       pg_catalog.set_config('default_transaction_read_only', 'off', true)";
/// The session reset, pipelined ahead of the pin when the connection changes tenant.
const RESET_SQL: &str = "SELECT pgtenant.reset_session($1)";

/// The transaction [`TenantHandle::run`](crate::TenantHandle::run) hands its work: its
/// statement methods (`execute`, `query`, …) return pgtenant's [`Error`], and it derefs to the
/// driver's [`Transaction`] for the rest. `'a` is what the work may borrow from its caller.
pub struct Tx<'t, 'a> {
    transaction: &'t Transaction<'t>,
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

impl std::fmt::Debug for Tx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tx")
    }
}

/// How this transaction is fenced: the fence statement; or (session fencing) the bound
/// connection's backend and either the pin alone (a connection that reports the transaction
/// signal) or the enter statement with its marker cursor.
enum Entry {
    Fence {
        statement: Option<Statement>,
        /// On a connection that reports the transaction signal: the signal, and whether the
        /// session is reset first.
        signalled: Option<(crate::wire::Parameters, bool)>,
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
        signal: crate::wire::Parameters,
    },
}

impl Entry {
    fn backend(&self) -> Option<i32> {
        match self {
            Entry::Fence { .. } => None,
            Entry::Session { pid, .. } | Entry::Pinned { pid, .. } => Some(*pid),
        }
    }

    /// The signal that tells whether the work ended the transaction; None for the marker.
    fn signal(&self) -> Option<&crate::wire::Parameters> {
        match self {
            Entry::Pinned { signal, .. }
            | Entry::Fence {
                signalled: Some((signal, _)),
                ..
            } => Some(signal),
            _ => None,
        }
    }
}

/// The work ended the fenced transaction itself (the signal says so): report it, and let the
/// driver's transaction roll back whatever the work began after that.
fn ensure_still_fenced(handle: &HandleInner, entry: &Entry) -> Result<()> {
    match entry.signal() {
        Some(signal) if !crate::state::data_sessions::still_fenced(signal) => {
            Err(Error::TransactionEnded {
                tenant: handle.id.clone(),
                epoch: handle.epoch,
            })
        }
        _ => Ok(()),
    }
}

/// Prepares this connection's entry: the fence, or the binding (once per connection and
/// incarnation) and the enter statement. Statements are prepared once per pooled connection (the
/// server then neither parses nor plans them), or sent unnamed behind a pooler that keeps no
/// prepared statements.
async fn entry(
    handle: &HandleInner,
    client: &deadpool_postgres::Object,
    read_only: bool,
) -> Result<Entry> {
    let router = &handle.router;
    let cached = router.options.statement_cache;
    let pid = if router.session_fencing() {
        Some(
            crate::protocol::session_fencing::bind::bound(router, client, &handle.credentials)
                .await?,
        )
    } else {
        None
    };
    let entered = router.data_sessions.enter(client, &handle.key).await?;
    Ok(match (pid, entered.signal) {
        (Some(pid), Some(signal)) => Entry::Pinned {
            pid,
            pin: prepared(client, cached, PIN_SQL, "prepare the pin").await?,
            reset: entered.reset,
            signal,
        },
        (Some(pid), None) => Entry::Session {
            pid,
            enter: prepared(client, cached, ENTER_SQL, "prepare the entry statement").await?,
        },
        (None, signal) => {
            let signalled = signal.map(|signal| (signal, entered.reset));
            let sql = fence_sql(read_only, signalled.is_some());
            Entry::Fence {
                statement: prepared(client, cached, sql, "prepare the fence").await?,
                signalled,
            }
        }
    })
}

/// `sql` prepared once per pooled connection (the server then neither parses nor plans it), or
/// None to send it unnamed when the statement cache is off.
async fn prepared(
    client: &deadpool_postgres::Object,
    cached: bool,
    sql: &str,
    context: &'static str,
) -> Result<Option<Statement>> {
    if !cached {
        return Ok(None);
    }
    client
        .prepare_cached(sql)
        .await
        .map(Some)
        .map_err(Error::db(context))
}

/// The fence's statement: read-only or not, with the signal or the marker cursor.
fn fence_sql(read_only: bool, signalled: bool) -> &'static str {
    match (read_only, signalled) {
        (false, false) => FENCE_SQL,
        (true, false) => FENCE_READ_SQL,
        (false, true) => FENCE_SIGNALLED_SQL,
        (true, true) => FENCE_READ_SIGNALLED_SQL,
    }
}

/// Runs `statement` after the session reset when `reset` (the connection changes tenant): the
/// reset goes on the wire first, both in the same flight.
async fn after_reset<F>(
    handle: &HandleInner,
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
    let key: &str = &handle.key;
    let params: [(&(dyn ToSql + Sync), Type); 1] = [(&key, Type::TEXT)];
    // join! polls in order, and each request goes on the wire at its first poll.
    let (reset, done) = tokio::join!(tx.query_typed(RESET_SQL, &params), statement);
    reset.map(drop).and(done)
}

/// Sends the fence (or the entry statement) on `tx` and reads its reply.
async fn fence(
    handle: &HandleInner,
    tx: &Transaction<'_>,
    entry: &Entry,
    read_only: bool,
) -> std::result::Result<(), tokio_postgres::Error> {
    if let Entry::Pinned { pin, reset, .. } = entry {
        let pinned = async {
            match pin {
                Some(statement) => tx.query(statement, &[&handle.search_path]).await.map(drop),
                None => tx
                    .query_typed(PIN_SQL, &[(&handle.search_path, Type::TEXT)])
                    .await
                    .map(drop),
            }
        };
        return after_reset(handle, tx, *reset, pinned).await;
    }
    let key = handle.id.key();
    if let Entry::Session { enter, .. } = entry {
        let params: [&(dyn ToSql + Sync); 2] = [&key, &handle.schema];
        return match enter {
            Some(statement) => tx.query(statement, &params).await.map(drop),
            None => {
                let typed: Vec<(&(dyn ToSql + Sync), Type)> =
                    params.iter().copied().zip(ENTER_TYPES).collect();
                tx.query_typed(ENTER_SQL, &typed).await.map(drop)
            }
        };
    }
    let epoch = handle.epoch.get();
    let params: [&(dyn ToSql + Sync); 4] = [
        &key,
        &epoch,
        &handle.lock_key,
        &handle.router.idle_timeout_ms,
    ];
    let (statement, signalled) = match entry {
        Entry::Fence {
            statement,
            signalled,
        } => (statement.as_ref(), signalled.as_ref()),
        _ => (None, None),
    };
    let fenced = async {
        match statement {
            Some(statement) => tx.query(statement, &params).await.map(drop),
            None => {
                let sql = fence_sql(read_only, signalled.is_some());
                let typed: Vec<(&(dyn ToSql + Sync), Type)> =
                    params.iter().copied().zip(FENCE_TYPES).collect();
                tx.query_typed(sql, &typed).await.map(drop)
            }
        }
    };
    let reset = signalled.is_some_and(|(_, reset)| *reset);
    after_reset(handle, tx, reset, fenced).await
}

/// The admission sequence of both ways in (`run` and `TenantConnection::begin`), counted in
/// flight by the caller: the connection's entry (bound under session fencing), its cancel token
/// and backend registered where `forget(ActiveWork::Cancel)` and `abandon` find them, the
/// admission checked again (an `abandon` in between terminated only the backends registered
/// before it), then BEGIN. In this order: a backend registered after `abandon` looked must not
/// start work.
async fn admit<'c>(
    handle: &Arc<HandleInner>,
    object: &'c mut deadpool_postgres::Object,
    read_only: bool,
    stuck: &AtomicBool,
) -> Result<(Entry, CancelOnForget, Transaction<'c>)> {
    let entry = entry(handle, object, read_only).await?;
    let cancel = CancelOnForget::register(handle, object.cancel_token(), entry.backend());
    handle.still_admitted()?;
    let tx = begin(handle, object, read_only, stuck).await?;
    Ok((entry, cancel, tx))
}

/// Begins the transaction (`READ WRITE` or `READ ONLY` explicitly: data sessions default to
/// read-only) within the stuck bound.
async fn begin<'c>(
    handle: &HandleInner,
    client: &'c mut tokio_postgres::Client,
    read_only: bool,
    stuck: &AtomicBool,
) -> Result<Transaction<'c>> {
    let bound = handle.router.options.stuck_timeout;
    match tokio::time::timeout(
        bound,
        client.build_transaction().read_only(read_only).start(),
    )
    .await
    {
        Ok(begun) => begun.map_err(Error::db("begin tenant transaction")),
        Err(_) => {
            stuck.store(true, Ordering::Release);
            Err(Error::stuck("begin tenant transaction", bound))
        }
    }
}

/// Commits, with the marker's proof unless the signal gave it, within the stuck bound.
async fn commit(
    handle: &HandleInner,
    tx: Transaction<'_>,
    entry: &Entry,
    stuck: &AtomicBool,
) -> Result<()> {
    ensure_still_fenced(handle, entry)?;
    let bound = handle.router.options.stuck_timeout;
    let sql = if entry.signal().is_some() {
        "COMMIT"
    } else {
        COMMIT_SQL
    };
    match tokio::time::timeout(bound, tx.batch_execute(sql)).await {
        Ok(Ok(())) => {
            // Committed: the driver's transaction must not send its ROLLBACK on drop (it holds
            // only a borrow of the connection, so forgetting it leaks nothing).
            std::mem::forget(tx);
            Ok(())
        }
        Ok(Err(error)) if sqlstate::of(&error) == Some(sqlstate::INVALID_CURSOR_NAME) => {
            Err(Error::TransactionEnded {
                tenant: handle.id.clone(),
                epoch: handle.epoch,
            })
        }
        Ok(Err(error)) => Err(Error::db("commit tenant work")(error)),
        Err(_) => {
            stuck.store(true, Ordering::Release);
            Err(Error::stuck("commit tenant work", bound))
        }
    }
}

/// Closes a pooled connection instead of returning it: one that stopped answering must never
/// hold a pool slot.
fn discard(handle: &HandleInner, object: deadpool_postgres::Object) {
    tracing::warn!(tenant = %handle.id, "closing a data connection that stopped answering");
    drop(deadpool_postgres::Object::take(object));
}

/// Whether a connection whose work ended while its handle was no longer serving may have had
/// its backend terminated (an abandon terminates the backends of its work in flight; another
/// replica's seal those of a lost handle). Such a connection is closed rather than pooled: the
/// server reports the termination before the backend exits, so the client can read the error
/// and hand the connection back before it sees the socket close, and the next user (the
/// abandon's own release) would get a dead connection: about half of the abandon test's runs
/// once V7 made the wait for terminated backends milliseconds long.
fn maybe_terminated(handle: &HandleInner) -> bool {
    !matches!(handle.state(), HandleState::Serving | HandleState::Draining)
}

/// [`TenantHandle::run`](crate::TenantHandle::run) and `read`.
pub(crate) async fn run<'a, T, E, F>(
    handle: &Arc<HandleInner>,
    read_only: bool,
    work: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
{
    let _in_flight = handle.begin_work()?;
    let mut object = handle
        .router
        .pool
        .get()
        .await
        .map_err(pool_error("get a connection for tenant work"))?;
    let (stuck, retire) = (AtomicBool::new(false), AtomicBool::new(false));
    let outcome = run_on(handle, &mut object, &stuck, &retire, read_only, work).await;
    if stuck.load(Ordering::Acquire) {
        discard(handle, object);
    } else if (outcome.is_err() && maybe_terminated(handle)) || retire.load(Ordering::Acquire) {
        // Retired: it served max_tenants_per_connection tenants; its backend's catalog caches
        // go with it.
        drop(deadpool_postgres::Object::take(object));
    }
    outcome
}

async fn run_on<'a, T, E, F>(
    handle: &Arc<HandleInner>,
    object: &mut deadpool_postgres::Object,
    stuck: &AtomicBool,
    retire: &AtomicBool,
    read_only: bool,
    work: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>>,
{
    let (entry, _cancel, tx) = admit(handle, object, read_only, stuck).await?;
    // The fence goes on the wire first (join! polls in order) and its reply is consumed as it
    // arrives, concurrently with the work.
    let (fenced, outcome) = tokio::join!(
        fence(handle, &tx, &entry, read_only),
        work(Tx {
            transaction: &tx,
            _borrows: PhantomData,
        }),
    );
    if let Err(error) = fenced {
        // The work saw an aborted transaction; the fence's refusal is the real story.
        return Err(handle.refused(error, "fence tenant work").into());
    }
    let value = outcome?;
    commit(handle, tx, &entry, stuck).await?;
    let router = &handle.router;
    if router.data_sessions.committed(
        deadpool_postgres::Object::id(object),
        &handle.key,
        router.options.max_tenants_per_connection,
    ) {
        retire.store(true, Ordering::Release);
    }
    Ok(value)
}

/// A pooled data connection for one tenant's fenced transactions, from
/// [`TenantHandle::connect`](crate::TenantHandle::connect). It goes back to the pool when
/// dropped (or is closed, if it stopped answering).
pub struct TenantConnection {
    handle: Arc<HandleInner>,
    /// None once closed for having stopped answering.
    object: Option<deadpool_postgres::Object>,
    stuck: AtomicBool,
    /// Set when the connection served max_tenants_per_connection tenants: closed on drop.
    retired: AtomicBool,
}

impl std::fmt::Debug for TenantConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantConnection")
            .field("tenant", &self.handle.id)
            .field("epoch", &self.handle.epoch)
            .finish_non_exhaustive()
    }
}

impl TenantConnection {
    pub(crate) async fn checkout(handle: &Arc<HandleInner>) -> Result<TenantConnection> {
        handle.admit()?;
        let object = handle
            .router
            .pool
            .get()
            .await
            .map_err(pool_error("get a connection for tenant work"))?;
        Ok(TenantConnection {
            handle: handle.clone(),
            object: Some(object),
            stuck: AtomicBool::new(false),
            retired: AtomicBool::new(false),
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
        let handle = &self.handle;
        if self.stuck.load(Ordering::Acquire) {
            if let Some(object) = self.object.take() {
                discard(handle, object);
            }
        }
        let Some(object) = self.object.as_mut() else {
            return Err(Error::stuck(
                "begin tenant transaction",
                handle.router.options.stuck_timeout,
            ));
        };
        let in_flight = handle.begin_work()?;
        let object_id = deadpool_postgres::Object::id(object);
        let (entry, cancel, tx) = admit(handle, object, read_only, &self.stuck).await?;
        fence(handle, &tx, &entry, read_only)
            .await
            .map_err(|error| handle.refused(error, "fence tenant work"))?;
        Ok(TenantTransaction {
            tx,
            handle,
            stuck: &self.stuck,
            retired: &self.retired,
            object: object_id,
            entry,
            _in_flight: in_flight,
            _cancel: cancel,
        })
    }
}

impl Drop for TenantConnection {
    fn drop(&mut self) {
        if self.stuck.load(Ordering::Acquire) {
            if let Some(object) = self.object.take() {
                discard(&self.handle, object);
            }
        } else if maybe_terminated(&self.handle) || self.retired.load(Ordering::Acquire) {
            if let Some(object) = self.object.take() {
                drop(deadpool_postgres::Object::take(object));
            }
        }
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
    tx: Transaction<'c>,
    handle: &'c Arc<HandleInner>,
    stuck: &'c AtomicBool,
    retired: &'c AtomicBool,
    object: deadpool_postgres::ObjectId,
    entry: Entry,
    _in_flight: InFlight,
    _cancel: CancelOnForget,
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
        &self.tx
    }
}

impl TenantTransaction<'_> {
    /// Commits. `Ok` means committed under the lease.
    ///
    /// # Errors
    /// [`Error::TransactionEnded`] when statements run through the guard ended the fenced
    /// transaction themselves; database errors (the transaction rolled back).
    pub async fn commit(self) -> Result<()> {
        let TenantTransaction {
            tx,
            handle,
            stuck,
            retired,
            object,
            entry,
            ..
        } = self;
        commit(handle, tx, &entry, stuck).await?;
        let router = &handle.router;
        if router.data_sessions.committed(
            object,
            &handle.key,
            router.options.max_tenants_per_connection,
        ) {
            // A guard's connection serves one tenant: it is closed when the guard drops.
            retired.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Rolls back (as dropping the guard does), reporting the database's answer.
    ///
    /// # Errors
    /// Database errors.
    pub async fn rollback(self) -> Result<()> {
        self.tx
            .rollback()
            .await
            .map_err(Error::db("roll back tenant work"))
    }
}
