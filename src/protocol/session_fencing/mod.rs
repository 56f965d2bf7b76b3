//! Session fencing (DESIGN §5 "Data sessions and session fencing"): the check moves from every
//! transaction to every connection. One file per step, each used by the protocol DESIGN runs
//! it in:
//!
//! * `mod.rs` (here): whether it can hold, decided at replica start ([`decide`]): the data
//!   sessions must be real sessions (no transaction-mode pooler in front: the same probe as
//!   the lease session's) and the control plane's owner must be allowed to terminate them.
//! * [`bind`]: each pooled connection is bound once to the replica's current incarnation,
//!   before its first tenant transaction (`pgtenant.bind`), by the fenced transaction; the
//!   bookkeeping is `state/bindings.rs`.
//! * the seal, all in SQL (`db/sessions.rs` sends it): an acquisition (or a restore) seals the
//!   dead or expired owner incarnation and terminates its backends in the acquiring
//!   transaction, before the epoch moves (`pgtenant.seal_owner`). The epoch's own UPDATE seals again (trigger `seal_on_takeover`),
//!   from the same read of the owner that lets the takeover happen: an owner whose lease
//!   session ended between the two statements is sealed all the same.
//! * [`terminate`]: a voluntary end that does not wait for its work (abandon) terminates
//!   the backends of this replica's own work still in flight before its release commits;
//!   deregistration seals the replica's own incarnation (`replica_start.rs`).
//! * The hot path itself is `fenced_transaction.rs`: the pin, no pgtenant function.
//!
//! The SQL side of every step is in `sql/schema.sql` (`bind`, `seal_owner`, `seal_incarnation`,
//! `terminate_work`, `seal_on_takeover`).

use std::time::Duration;

use deadpool_postgres::Pool;

use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::options::{Fencing, RouterOptions};
use crate::state::bindings::Mode;

pub(crate) mod bind;
pub(crate) mod terminate;

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
    crate::db::replicas::can_terminate_sessions(&first).await
}
