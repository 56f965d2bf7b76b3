//! The SQLSTATEs pgtenant's control-plane functions raise (DESIGN §5, every lease
//! transition's refusals), one list. Public are the three a statement of the application's own
//! work can fail with, for code that matches on the driver's error
//! (`error.code().map(|c| c.code()) == Some(pgtenant::sqlstate::FENCED)`); the rest reach the
//! application as typed [`Error`](crate::Error)s. The one place that turns a database refusal
//! into an `Error` is `refusal.rs`, above this file and `error.rs`.

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
/// `schema_created`, `forget`, `restore`: a schema the control plane cannot vouch for (not a
/// derived name, another owner than the tenant-owner role, or not made by the creation).
pub(crate) const FOREIGN_SCHEMA: &str = "PTV01";
/// `release`: a reservation names a replica that is not registered and alive.
pub(crate) const NO_SUCH_REPLICA: &str = "PTH01";
/// `seal_owner`, `terminate_work`: a backend did not exit within the timeout (retryable:
/// nothing moved).
pub(crate) const SEAL_INCOMPLETE: &str = "PTE01";
/// `bind`: the incarnation is sealed or no longer alive.
pub(crate) const SEALED: &str = "PTE02";
/// A schema name is taken (`CREATE SCHEMA`, `ALTER SCHEMA … RENAME`).
pub(crate) const DUPLICATE_SCHEMA: &str = "42P06";
/// `acquire`: fenced transactions of the tenant's previous lease held it past the bound and
/// could not be ended (retryable; DETAIL says which backends and why).
pub(crate) const STALE_WORK: &str = "PTL05";
/// `acquire`: prepared transactions (PREPARE TRANSACTION inside fenced work) hold the tenant
/// (DETAIL: JSON list of gid, owner, prepared).
pub(crate) const PREPARED: &str = "PTX01";
/// `ROLLBACK PREPARED` of a transaction that no longer exists.
pub(crate) const UNDEFINED_OBJECT: &str = "42704";
/// A statement in a transaction that an earlier error aborted.
pub(crate) const IN_FAILED_TRANSACTION: &str = "25P02";
/// A lock could not be had within `lock_timeout`.
pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";
/// A relation the query names does not exist (an older control plane, or none).
pub(crate) const UNDEFINED_TABLE: &str = "42P01";
/// A column the query names does not exist (an older control plane's view).
pub(crate) const UNDEFINED_COLUMN: &str = "42703";
/// The function the query calls does not exist (an older control plane).
pub(crate) const UNDEFINED_FUNCTION: &str = "42883";
/// The schema named does not exist (no control plane at all).
pub(crate) const INVALID_SCHEMA_NAME: &str = "3F000";

/// The SQLSTATE of a database error, if the server sent one.
pub(crate) fn of(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(|code| code.code())
}
