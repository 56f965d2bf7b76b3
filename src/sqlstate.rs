//! The SQLSTATEs pgtenant's control-plane functions raise, and the one place that turns a
//! database refusal into an [`Error`].

use std::time::Duration;

use crate::error::Error;
use crate::id::TenantId;
use crate::lease::Epoch;

/// Raised by the fence when a handle's epoch is no longer the tenant's epoch (taken over or
/// released): nothing of the transaction commits.
pub const FENCED: &str = "PTF01";
/// Raised by the fence when the tenant was forgotten at or after the handle's epoch.
pub const FORGOTTEN: &str = "PTF02";
/// A connection pgtenant opened reached only standbys (in recovery): every host that answered
/// is a standby, as during a failover before a standby is promoted. Retryable
/// ([`Error::is_retryable`](crate::Error::is_retryable)); the message names the host.
pub const NOT_PRIMARY: &str = "PTP01";
/// `acquire`, `restore`: another live replica holds the tenant, or it is reserved for one
/// (DETAIL: JSON with owner, epoch, expires_in_ms, reserved).
pub(crate) const HELD: &str = "PTL01";
/// The caller's incarnation is not registered and alive.
pub(crate) const NOT_REGISTERED: &str = "PTL02";
/// No such tenant, or no live schema.
pub(crate) const NO_TENANT: &str = "PTN01";
/// The tenant is quarantined (DETAIL: JSON with cause and repair).
pub(crate) const QUARANTINED: &str = "PTQ01";
/// `register`: the lease session does not hold its liveness lock (a pooler moved it).
pub(crate) const NOT_A_SESSION: &str = "PTS01";
/// `restore`: a new life exists, or nothing is left in the trash.
pub(crate) const RESTORE_REFUSED: &str = "PTR01";
/// `release`: a reservation names a replica that is not registered and alive.
pub(crate) const NO_SUCH_REPLICA: &str = "PTH01";
/// `seal_owner`, `terminate_work`: a backend did not exit within the timeout (retryable:
/// nothing moved).
pub(crate) const SEAL_INCOMPLETE: &str = "PTE01";
/// `bind`: the incarnation is sealed or no longer alive.
pub(crate) const SEALED: &str = "PTE02";
/// A schema name is taken (`CREATE SCHEMA`, `ALTER SCHEMA … RENAME`).
pub(crate) const DUPLICATE_SCHEMA: &str = "42P06";
/// `CLOSE` of a cursor that does not exist: the fenced transaction's marker is gone.
pub(crate) const INVALID_CURSOR_NAME: &str = "34000";
/// A lock could not be had within `lock_timeout`.
pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The SQLSTATE of a database error, if the server sent one.
pub(crate) fn of(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(|code| code.code())
}

/// What pgtenant was doing when the database refused, for the error it becomes.
pub(crate) struct Scope<'a> {
    /// What, in a few words ("acquire a lease").
    pub(crate) doing: &'static str,
    /// The tenant concerned, if one is.
    pub(crate) tenant: Option<&'a TenantId>,
    /// The handle's epoch, for fence refusals.
    pub(crate) epoch: Epoch,
    /// This replica's id.
    pub(crate) replica: &'a str,
}

#[derive(serde::Deserialize)]
struct HeldDetail {
    owner: String,
    epoch: i64,
    owner_alive: bool,
    expires_in_ms: Option<u64>,
    reserved: bool,
}

#[derive(serde::Deserialize, Default)]
struct QuarantineDetail {
    #[serde(default)]
    cause: String,
    #[serde(default)]
    repair: String,
}

/// Turns a database error into pgtenant's [`Error`]: the refusals of pgtenant's own functions
/// become their typed errors, everything else a [`Error::Database`] saying what was being done.
pub(crate) fn map(error: tokio_postgres::Error, scope: &Scope<'_>) -> Error {
    let Some(db) = error.as_db_error() else {
        return Error::db(scope.doing)(error);
    };
    let tenant = scope.tenant.cloned();
    let mapped = match (db.code().code(), tenant) {
        (HELD, Some(tenant)) => db
            .detail()
            .and_then(|detail| serde_json::from_str::<HeldDetail>(detail).ok())
            .map(|held| Error::LeaseHeld {
                tenant,
                owner: held.owner,
                epoch: Epoch::new(held.epoch),
                owner_alive: held.owner_alive,
                expires_in: held.expires_in_ms.map(Duration::from_millis),
                reserved: held.reserved,
            }),
        (NOT_REGISTERED, _) => Some(Error::ReplicaDown {
            replica_id: scope.replica.to_owned(),
        }),
        (NO_TENANT, Some(tenant)) => Some(Error::TenantNotFound {
            tenant,
            reason: not_found_reason(db.message()),
        }),
        (QUARANTINED, Some(tenant)) => {
            let detail: QuarantineDetail = db
                .detail()
                .and_then(|detail| serde_json::from_str(detail).ok())
                .unwrap_or_default();
            Some(Error::Quarantined {
                tenant,
                cause: detail.cause,
                repair: detail.repair,
            })
        }
        (FENCED, Some(tenant)) => Some(Error::Fenced {
            tenant,
            epoch: scope.epoch,
            message: db.message().to_owned(),
        }),
        (FORGOTTEN, Some(tenant)) => Some(Error::Forgotten {
            tenant,
            epoch: scope.epoch,
        }),
        (NOT_A_SESSION, _) => Some(Error::NotASession(format!(
            "{} ({})",
            db.message(),
            db.hint().unwrap_or_default()
        ))),
        (SEAL_INCOMPLETE, Some(tenant)) => Some(Error::SealIncomplete {
            tenant,
            message: db.message().to_owned(),
        }),
        (RESTORE_REFUSED, Some(tenant)) => Some(Error::RestoreRefused {
            tenant,
            reason: db.message().to_owned(),
        }),
        _ => None,
    };
    mapped.unwrap_or_else(|| Error::db(scope.doing)(error))
}

/// The why of a PTN01 without the repeated "tenant … does not exist": "never created", or
/// "forgotten at epoch N" from the function's "has no live schema (forgotten at epoch N)".
fn not_found_reason(message: &str) -> String {
    match message.split_once("(forgotten") {
        Some((_, rest)) => format!("forgotten{}", rest.trim_end_matches(')')),
        None => "never created".to_owned(),
    }
}
