//! The fence (DESIGN §5 "Fenced transaction", "Data sessions and session fencing"): the
//! statements that enter a tenant's transaction under its lease's epoch, the session-fencing
//! entry, the session reset, and the checked commit. The hot path: each call sends at its first
//! poll, so a caller pipelines the entry with the work's first statement by polling both in
//! one `join!`.

use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Statement, Transaction};

use crate::lease::Epoch;

/// The fence (V14, one function for every form): the tenant's advisory lock held shared (not
/// for a read) + the epoch check + session hygiene and the marker cursor (not on a connection
/// that reports the transaction signal, where the client decides the reset) + search_path.
/// Takes (key, epoch, lock key, idle ms, read-only, signalled) and returns one row or raises.
const FENCE_SQL: &str = "SELECT pgtenant.fence($1, $2, $3, $4, $5, $6)";
const FENCE_TYPES: [Type; 6] = [
    Type::TEXT,
    Type::INT8,
    Type::INT4,
    Type::TEXT,
    Type::BOOL,
    Type::BOOL,
];
/// Session fencing's one statement per transaction (the connection is bound): hygiene,
/// search_path, the marker cursor; no row read, no lock.
const ENTER_SQL: &str = "SELECT pgtenant.enter($1, $2)";
const ENTER_TYPES: [Type; 2] = [Type::TEXT, Type::TEXT];
/// Session fencing on a connection whose server reports the transaction signal (`wire.rs`):
/// the pin, the same statement an unfenced schema-per-tenant transaction sends, plus
/// read-write for this transaction (data sessions default to read-only) and the commit
/// check's setting. Its one parameter is the `search_path`.
const PIN_SQL: &str = "SELECT pg_catalog.set_config('search_path', $1, true), \
                       pg_catalog.set_config('default_transaction_read_only', 'off', true), \
                       pg_catalog.set_config('pgtenant.fenced', 'on', true)";
const PIN_TYPES: [Type; 1] = [Type::TEXT];
/// The commit check and `COMMIT`, one simple-query message: every entry sets
/// `pgtenant.fenced` for its own transaction only, so once anything ended that transaction the
/// setting is gone and the cast fails (check violation, [`ENDED_CONSTRAINT`]); in a transaction
/// the work left aborted it fails too (25P02). Either way the server skips the rest of the
/// message: the `COMMIT` behind it never runs. One message, not a prepared check pipelined
/// ahead of `COMMIT`: the server flushes its replies once instead of twice, so the client
/// wakes once per commit (measured with examples/client_cost.rs, #29).
const COMMIT_CHECKED_SQL: &str =
    "SELECT pg_catalog.current_setting('pgtenant.fenced', true)::pgtenant.fenced_transaction; \
     COMMIT";
/// The session reset, pipelined ahead of the entry when the connection changes tenant.
const RESET_SQL: &str = "SELECT pgtenant.reset_session($1)";

/// The constraint the commit check violates once the fenced transaction was ended (V11).
pub(crate) const ENDED_CONSTRAINT: &str = "the_work_ended_the_fenced_transaction";

/// The statements a fenced transaction is entered and checked with, each prepared once per
/// pooled connection (the server then neither parses nor plans it) or sent unnamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// `pgtenant.fence`, every form.
    Fence,
    /// `pgtenant.enter`, session fencing's entry on a bound connection.
    Enter,
    /// The pin: session fencing on a connection that reports the transaction signal.
    Pin,
}

impl Form {
    fn sql(self) -> &'static str {
        match self {
            Form::Fence => FENCE_SQL,
            Form::Enter => ENTER_SQL,
            Form::Pin => PIN_SQL,
        }
    }

    fn types(self) -> &'static [Type] {
        match self {
            Form::Fence => &FENCE_TYPES,
            Form::Enter => &ENTER_TYPES,
            Form::Pin => &PIN_TYPES,
        }
    }
}

/// `form` prepared on this pooled connection, once: later calls find it in the connection's
/// statement cache.
pub(crate) async fn prepare(client: &ClientWrapper, form: Form) -> Result<Statement, Error> {
    client.prepare_cached(form.sql()).await
}

/// Sends `form` with `params`: the prepared statement, or the text unnamed (behind a pooler
/// that keeps no prepared statements).
async fn send(
    tx: &Transaction<'_>,
    form: Form,
    prepared: Option<&Statement>,
    params: &[&(dyn ToSql + Sync)],
) -> Result<(), Error> {
    match prepared {
        Some(statement) => tx.query(statement, params).await.map(drop),
        None => {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                .iter()
                .copied()
                .zip(form.types().iter().cloned())
                .collect();
            tx.query_typed(form.sql(), &typed).await.map(drop)
        }
    }
}

/// `pgtenant.fence`: passes only while `epoch` is the tenant's current lease, and sets the
/// transaction up for the tenant's schema. A read-only one takes no lock; a signalled one (on a
/// connection that reports the transaction signal) leaves the session reset to the client.
#[allow(clippy::too_many_arguments)] // the function's own arguments, each typed
pub(crate) async fn fence(
    tx: &Transaction<'_>,
    prepared: Option<&Statement>,
    read_only: bool,
    signalled: bool,
    key: &str,
    epoch: Epoch,
    lock_key: i32,
    idle_ms: &str,
) -> Result<(), Error> {
    let epoch = epoch.get();
    let params: [&(dyn ToSql + Sync); 6] =
        [&key, &epoch, &lock_key, &idle_ms, &read_only, &signalled];
    send(tx, Form::Fence, prepared, &params).await
}

/// `pgtenant.enter`: session fencing's entry on a connection bound to this incarnation.
pub(crate) async fn enter(
    tx: &Transaction<'_>,
    prepared: Option<&Statement>,
    key: &str,
    schema: &str,
) -> Result<(), Error> {
    send(tx, Form::Enter, prepared, &[&key, &schema]).await
}

/// The pin: the search_path and the commit check's setting, nothing else.
pub(crate) async fn pin(
    tx: &Transaction<'_>,
    prepared: Option<&Statement>,
    search_path: &str,
) -> Result<(), Error> {
    send(tx, Form::Pin, prepared, &[&search_path]).await
}

/// `pgtenant.reset_session(key)` inside the transaction: the session as a fresh one, now
/// serving `key`.
pub(crate) async fn reset_session(tx: &Transaction<'_>, key: &str) -> Result<(), Error> {
    tx.query_typed(RESET_SQL, &[(&key, Type::TEXT)])
        .await
        .map(drop)
}

/// The commit check and `COMMIT`: fails, committing nothing, once anything ended the fenced
/// transaction or left it aborted; then the transaction is aborted and still open, or none is
/// open, and a `ROLLBACK` ends what is left. Fails too when `COMMIT` does (rolled back).
pub(crate) async fn commit_checked(tx: &Transaction<'_>) -> Result<(), Error> {
    tx.batch_execute(COMMIT_CHECKED_SQL).await
}
