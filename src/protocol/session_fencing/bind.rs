//! Session fencing's bind (DESIGN §5 "Data sessions and session fencing", 1): before its first
//! tenant transaction, a data connection registers its backend as this incarnation's, under a
//! lock on the replica row that checks the incarnation is live and not sealed
//! (`pgtenant.bind`). A sealed incarnation binds nothing, so no backend of it can serve again.
//! Run by the fenced transaction (`fenced_transaction.rs`); the bookkeeping of bound
//! connections is `state/bindings.rs`.

use deadpool_postgres::Object;

use crate::credentials::Credentials;
use crate::db;
use crate::error::{Error, Result};
use crate::sqlstate;
use crate::state::bindings::LASTING_AFTER;
use crate::state::replica::Replica;

/// Binds `object` to the credentials' incarnation unless it is already: one round trip on a
/// connection's first tenant transaction (and after a re-registration), none after. Returns
/// the connection's backend pid.
///
/// A refusal (the incarnation sealed or no longer alive) ends the incarnation: the liveness
/// task registers again at once, which cures a seal, and until then nothing more is sent for
/// it. Refused for [`LASTING_AFTER`] fresh incarnations in a row, it is
/// [`Error::SessionsRefused`], not [`Error::ReplicaDown`]: a retry does not cure it.
pub(crate) async fn bound(
    shared: &Replica,
    object: &Object,
    credentials: &Credentials,
) -> Result<i32> {
    let bindings = &shared.bindings;
    if let Some(pid) = bindings.get(object, credentials.registration) {
        return Ok(pid);
    }
    let down = || {
        let down = shared.replica_down(Some(
            "the database refused to bind a data session to its incarnation (sealed by a \
             takeover, or no longer alive)",
        ));
        bindings.lasting(&credentials.replica).unwrap_or(down)
    };
    if bindings.is_refused(credentials.registration) {
        return Err(down());
    }
    let pid = db::sessions::bind(object, credentials)
        .await
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
