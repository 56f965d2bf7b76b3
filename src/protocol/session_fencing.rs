//! Session fencing (DESIGN §5 "Data sessions and session fencing"): the check moves from every
//! transaction to every connection.
//!
//! * Whether it can hold is decided at start ([`decide`]): the data sessions must be real
//!   sessions (no transaction-mode pooler in front: the same probe as the lease session's) and
//!   the control plane's owner must be allowed to terminate them.
//! * Each pooled connection is bound once to the replica's current incarnation ([`bound`]),
//!   before its first tenant transaction (`pgtenant.bind`); the bookkeeping is
//!   `state/bindings.rs`.
//! * An acquisition seals the dead or expired owner incarnation and terminates its backends in
//!   the acquiring transaction, before the epoch moves ([`SEAL_SQL`], `pgtenant.seal_owner`).
//!   The epoch's own UPDATE seals again (trigger `seal_on_takeover`, V7), from the same read
//!   of the owner that lets the takeover happen: an owner whose lease session ended between
//!   the two statements is sealed all the same.
//! * A voluntary end terminates the backends of this replica's own work still in flight before
//!   its release commits ([`terminate_work`]); deregistration seals the replica's own
//!   incarnation.

use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio_postgres::types::{ToSql, Type};

use crate::control;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::options::{Fencing, RouterOptions};
use crate::sqlstate;
use crate::state::bindings::{Mode, LASTING_AFTER};
use crate::state::credentials::{millis, Credentials};
use crate::state::shared::Shared;

/// Seals the tenant's dead or expired owner incarnation and terminates its data sessions, in the
/// acquiring transaction, right before `pgtenant.acquire` moves the epoch: (key, replica,
/// incarnation, secret, timeout ms).
const SEAL_SQL: &str = "SELECT pgtenant.seal_owner($1, $2, $3, $4, $5)";

/// How long a seal waits for each terminated backend to exit: a backend that does not exit in
/// time fails the acquisition (retryably) rather than let the epoch move under it.
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(5);

/// The seal an acquisition (`acquire.rs`) or a restore (`forget.rs`) of `key` as
/// `credentials`' incarnation runs first in its transaction: [`SEAL_SQL`] and its parameters
/// (key, replica, incarnation, secret, terminate timeout ms), for `control::call_after`.
pub(crate) struct Seal<'a> {
    key: &'a str,
    replica: &'a str,
    incarnation: i64,
    secret: &'a str,
    terminate_ms: i64,
}

impl<'a> Seal<'a> {
    pub(crate) const SQL: &'static str = SEAL_SQL;

    pub(crate) fn new(key: &'a str, credentials: &'a Credentials) -> Self {
        Seal {
            key,
            replica: &credentials.replica,
            incarnation: credentials.incarnation.get(),
            secret: credentials.secret(),
            terminate_ms: i64::from(millis(TERMINATE_TIMEOUT)),
        }
    }

    pub(crate) fn params(&self) -> [(&(dyn ToSql + Sync), Type); 5] {
        [
            (&self.key, Type::TEXT),
            (&self.replica, Type::TEXT),
            (&self.incarnation, Type::INT8),
            (&self.secret, Type::TEXT),
            (&self.terminate_ms, Type::INT8),
        ]
    }
}

/// Decides the fencing: `options.fencing` if it can hold, or why not (refused for an explicit
/// `Session`, a logged fallback for `Auto`). The fallback's reason is returned for
/// [`Summary`](crate::Summary).
pub(crate) async fn decide(options: &RouterOptions, pool: &Pool) -> Result<(Mode, Option<String>)> {
    if options.fencing == Fencing::Transaction {
        return Ok((Mode::Transaction, None));
    }
    // pgtenant's own pool connects like the lease session, whose probe found no pooler; a pool
    // the application built may go elsewhere.
    let blocker = blocker(pool, options.pool.is_some()).await?;
    match (options.fencing, blocker) {
        (_, None) => Ok((Mode::Session, None)),
        (Fencing::Session, Some(reason)) => Err(Error::InvalidOption {
            option: "fencing",
            reason: format!(
                "session fencing cannot hold: {reason}; use Fencing::Auto or Fencing::Transaction"
            ),
        }),
        (_, Some(reason)) => {
            tracing::warn!(%reason, "session fencing cannot hold: transaction fencing instead");
            Ok((Mode::Transaction, Some(reason)))
        }
    }
}

/// Why session fencing cannot hold on this pool's connections, if it cannot.
async fn blocker(pool: &Pool, probe: bool) -> Result<Option<String>> {
    const CONTEXT: &str = "check the data path for session fencing";
    let first = pool.get().await.map_err(pool_error(CONTEXT))?;
    if probe {
        // The probe needs a second connection while the first is held.
        let timeouts = deadpool_postgres::Timeouts {
            wait: Some(Duration::from_secs(1)),
            ..pool.timeouts()
        };
        let Ok(mut second) = pool.timeout_get(&timeouts).await else {
            return Ok(Some(
                "the application's pool gave no second connection to check that its sessions are \
                 real sessions (no transaction-mode pooler): give it at least two"
                    .to_owned(),
            ));
        };
        let pooled = crate::connect::owns_its_backend(&first, &mut second, CONTEXT).await?;
        if let Some(pooled) = pooled {
            return Ok(Some(format!(
                "the data-path connections do not keep their backend ({pooled}): a \
                 transaction-mode pooler is in front"
            )));
        }
    }
    let row = first
        .query_typed_one("SELECT pgtenant.can_terminate_sessions()", &[])
        .await
        .map_err(Error::db(CONTEXT))?;
    row.try_get::<_, Option<String>>(0)
        .map_err(Error::db(CONTEXT))
}

/// Binds `object` to the credentials' incarnation unless it is already: one round trip on a
/// connection's first tenant transaction (and after a re-registration), none after. Returns
/// the connection's backend pid.
///
/// A refusal (the incarnation sealed or no longer alive) ends the incarnation: the liveness
/// task registers again at once, which cures a seal, and until then nothing more is sent for
/// it. Refused for [`LASTING_AFTER`] fresh incarnations in a row, it is
/// [`Error::SessionsRefused`], not [`Error::ReplicaDown`]: a retry does not cure it.
pub(crate) async fn bound(
    shared: &Shared,
    object: &Object,
    credentials: &Credentials,
) -> Result<i32> {
    let bindings = &shared.bindings;
    if let Some(pid) = bindings.get(object, credentials.registration) {
        return Ok(pid);
    }
    let down = || {
        let down = Error::ReplicaDown {
            replica_id: credentials.replica.clone(),
        };
        bindings.lasting(&credentials.replica).unwrap_or(down)
    };
    if bindings.is_refused(credentials.registration) {
        return Err(down());
    }
    let (secret, incarnation) = (credentials.secret(), credentials.incarnation.get());
    let pid: i32 = control::call(
        object,
        "SELECT pgtenant.bind($1, $2, $3)",
        &[
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
        ],
    )
    .await
    .and_then(|rows| match rows.first() {
        Some(row) => row.try_get(0),
        None => Ok(0),
    })
    .map_err(|error| match sqlstate::of(&error) {
        Some(sqlstate::NOT_REGISTERED) | Some(sqlstate::SEALED) => {
            let reason = crate::error::DbCause(&error).to_string();
            let (in_a_row, first) = bindings.refuse(credentials.registration, &reason);
            if first {
                let retryable = in_a_row < LASTING_AFTER;
                tracing::warn!(incarnation = %credentials.incarnation, %reason, in_a_row, retryable,
                    "the database refused to bind a data session: registering again");
                shared.emit(crate::event::Event::SessionsRefused {
                    incarnation: credentials.incarnation,
                    reason,
                    in_a_row,
                    retryable,
                });
                bindings.refused.notify_one();
            }
            down()
        }
        _ => Error::db("bind a data session")(error),
    })?;
    bindings.accepted();
    bindings.insert(object, credentials.registration, pid, shared.pool_size());
    Ok(pid)
}

/// Terminates the backends of this replica's own work still in flight (their transactions roll
/// back), waiting for each to exit: before a voluntary end's release commits under session
/// fencing, since no fence stops that work afterwards.
pub(crate) async fn terminate_work(
    pool: &Pool,
    credentials: &Credentials,
    pids: &[i32],
) -> Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    let client = pool
        .get()
        .await
        .map_err(pool_error("terminate work in flight"))?;
    let (secret, incarnation) = (credentials.secret(), credentials.incarnation.get());
    let timeout = i64::from(millis(TERMINATE_TIMEOUT));
    control::call(
        &client,
        "SELECT pgtenant.terminate_work($1, $2, $3, $4, $5)",
        &[
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&pids, Type::INT4_ARRAY),
            (&timeout, Type::INT8),
        ],
    )
    .await
    .map(drop)
    .map_err(Error::db("terminate work in flight"))
}
