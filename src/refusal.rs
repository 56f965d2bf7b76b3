//! The one place that turns a database refusal into an [`Error`] (DESIGN §5: every lease
//! transition's function raises a SQLSTATE of `sqlstate.rs`): the refusals of pgtenant's own
//! functions become their typed errors, everything else a database error saying what was being
//! done.

use std::time::Duration;

use crate::error::Error;
use crate::id::TenantId;
use crate::lease::Epoch;
use crate::replica_id::ReplicaId;
use crate::sqlstate::*;

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
    owner: ReplicaId,
    epoch: i64,
    owner_alive: bool,
    expires_in_ms: Option<u64>,
    reserved: bool,
    /// V15 and later.
    #[serde(default)]
    address: Option<String>,
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
                owner_address: held.address,
            }),
        (NOT_REGISTERED, _) => {
            let reason = "the database no longer counts its incarnation as registered and alive";
            let stalled = crate::stall::recent();
            Some(Error::ReplicaDown {
                replica_id: ReplicaId::unchecked(scope.replica),
                reason: match stalled {
                    Some(stalled) => format!("{stalled}, and meanwhile {reason}"),
                    None => reason.to_owned(),
                },
                stalled: stalled.map(|stalled| stalled.0),
            })
        }
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
        (STALE_WORK, Some(tenant)) => Some(Error::StaleWork {
            tenant,
            message: match db.detail() {
                Some(detail) => format!("{} ({detail})", db.message()),
                None => db.message().to_owned(),
            },
            hint: db.hint().unwrap_or("retry").to_owned(),
            retryable: true,
        }),
        (PREPARED, Some(tenant)) => Some(Error::StaleWork {
            tenant,
            message: format!("{} ({})", db.message(), db.detail().unwrap_or_default()),
            hint: db.hint().unwrap_or_default().to_owned(),
            retryable: false,
        }),
        (FOREIGN_SCHEMA, Some(tenant)) => Some(Error::ForeignSchema {
            tenant,
            message: match db.hint() {
                Some(hint) => format!("{} ({hint})", db.message()),
                None => db.message().to_owned(),
            },
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
