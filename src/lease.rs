//! The lease vocabulary (DESIGN §1 "Vocabulary", §4 "Database layout"): the fencing token
//! ([`Epoch`]), the replica's life it was taken in ([`Incarnation`]), and the states a handle
//! and a tenant go through.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A tenant's epoch: its fencing token (DESIGN §1). It grows with every acquisition and is
/// never reused, also across forget and re-creation (G2); a handle is bound to one, and
/// PostgreSQL refuses its commits once the tenant's epoch has moved on (G3).
///
/// Serialized as the bare number, so events and JSON outputs read `"epoch": 7`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Epoch(i64);

impl Epoch {
    /// The epoch as stored in `pgtenant.tenants.epoch`.
    pub const fn get(self) -> i64 {
        self.0
    }

    pub(crate) const fn new(value: i64) -> Epoch {
        Epoch(value)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Epoch> for i64 {
    fn from(epoch: Epoch) -> i64 {
        epoch.0
    }
}

/// `epoch + n`: the epoch n acquisitions later (what a test or a log line may predict).
impl std::ops::Add<i64> for Epoch {
    type Output = Epoch;

    fn add(self, n: i64) -> Epoch {
        Epoch(self.0.saturating_add(n))
    }
}

impl PartialEq<i64> for Epoch {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<i64> for Epoch {
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

/// One life of a replica: bumped each time its replica id registers (at start, and after its
/// lease session dropped). A lease belongs to the incarnation that took it; when the
/// incarnation ends, so do its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Incarnation(i64);

impl Incarnation {
    /// The incarnation as stored in `pgtenant.replicas.incarnation`.
    pub const fn get(self) -> i64 {
        self.0
    }

    pub(crate) const fn new(value: i64) -> Incarnation {
        Incarnation(value)
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq<i64> for Incarnation {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

/// Where a [`TenantHandle`](crate::TenantHandle) is in its tenure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HandleState {
    /// Admitting work.
    Serving,
    /// Being handed off or forgotten: no new work, the work in flight finishing.
    Draining,
    /// Released (handed off, abandoned, released).
    Released,
    /// Lost without a release: taken over, fenced, or the replica lost its incarnation.
    Lost,
    /// Forgotten: its schema is in the trash.
    Forgotten,
}

impl HandleState {
    pub(crate) const fn to_u8(self) -> u8 {
        match self {
            HandleState::Serving => 0,
            HandleState::Draining => 1,
            HandleState::Released => 2,
            HandleState::Lost => 3,
            HandleState::Forgotten => 4,
        }
    }

    pub(crate) const fn from_u8(value: u8) -> HandleState {
        match value {
            0 => HandleState::Serving,
            1 => HandleState::Draining,
            2 => HandleState::Released,
            3 => HandleState::Lost,
            _ => HandleState::Forgotten,
        }
    }

    /// Whether the tenure is over for good.
    pub const fn is_ended(self) -> bool {
        matches!(
            self,
            HandleState::Released | HandleState::Lost | HandleState::Forgotten
        )
    }
}

/// A tenant as `pgtenant.lease_status` shows it (control plane 13 on).
///
/// The four states of a tenant with an owner are named after what happened to the
/// *incarnation* that holds its lease, and match the owner's row in `pgtenant.replica_status`:
///
/// | tenant | the incarnation holding the lease | `replica_status.state` of the owner |
/// |---|---|---|
/// | `held` | alive | `alive` (same incarnation) |
/// | `stalled` | holds its liveness lock, heartbeat expired | `stalled` (or `sealed`) |
/// | `owner_gone` | its lease session is gone | `gone` (or `sealed`) |
/// | `owner_reregistered` | an earlier one: the replica id registered again since | any, with a newer `incarnation` |
///
/// Every one but `held` is taken over by the next replica that opens the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TenantState {
    /// Held by a live incarnation of its owner replica: [`Router::open`](crate::Router::open)
    /// elsewhere answers [`Error::LeaseHeld`](crate::Error::LeaseHeld).
    Held,
    /// The incarnation holding the lease still holds its liveness lock, but its heartbeat
    /// expired: a paused, starved or cut-off process. Taken over by the next open (the owner
    /// cannot commit once it is: the fence refuses it); when the process runs again it finds
    /// its lease lost and registers a new incarnation.
    Stalled,
    /// The incarnation holding the lease lost its lease session (the process died, or the
    /// database closed the connection) and has not registered again: taken over at once.
    OwnerGone,
    /// Held by an earlier incarnation of its owner: the replica id has registered again since
    /// (after a pause longer than its ttl, a dropped lease session, or a restart under the same
    /// id), and the new incarnation, which may be alive, does not hold this lease. No process
    /// serves the tenant; taken over at once, by its owner too.
    OwnerReregistered,
    /// Free.
    Free,
    /// Free, but reserved for one replica for a short window (a directed handoff).
    Reserved,
    /// Kept out of service until an operator clears it.
    Quarantined,
    /// Forgotten: no live schema.
    Forgotten,
    /// Never seen by the control plane.
    Absent,
}

impl TenantState {
    /// Every state `pgtenant.lease_status` reports (not [`TenantState::Absent`]).
    pub const ALL: [TenantState; 8] = [
        TenantState::Held,
        TenantState::Stalled,
        TenantState::OwnerGone,
        TenantState::OwnerReregistered,
        TenantState::Free,
        TenantState::Reserved,
        TenantState::Quarantined,
        TenantState::Forgotten,
    ];

    /// Whether the tenant has an owner (held, stalled, owner gone, owner re-registered).
    pub const fn has_owner(self) -> bool {
        matches!(
            self,
            TenantState::Held
                | TenantState::Stalled
                | TenantState::OwnerGone
                | TenantState::OwnerReregistered
        )
    }

    /// The name `pgtenant.lease_status.state` uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            TenantState::Held => "held",
            TenantState::Stalled => "stalled",
            TenantState::OwnerGone => "owner_gone",
            TenantState::OwnerReregistered => "owner_reregistered",
            TenantState::Free => "free",
            TenantState::Reserved => "reserved",
            TenantState::Quarantined => "quarantined",
            TenantState::Forgotten => "forgotten",
            TenantState::Absent => "absent",
        }
    }
}

impl PartialEq<&str> for TenantState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for TenantState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One word for a replica's current incarnation (`pgtenant.replica_status.state`, control
/// plane 13 on). Its tenants' states in `lease_status` say the same ([`TenantState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReplicaState {
    /// Registered, its lease session holding the liveness lock, its heartbeat current.
    Alive,
    /// Its lease session holds the liveness lock but the heartbeat expired: a paused or starved
    /// process. (`expired` before control plane 13.)
    #[serde(alias = "expired")]
    Stalled,
    /// Its lease session is gone: the process died or its connection was cut. (`lease session
    /// gone` before control plane 13.)
    #[serde(alias = "lease session gone")]
    Gone,
    /// A takeover sealed it: it registers again when it runs.
    Sealed,
    /// Closed.
    Released,
}

impl ReplicaState {
    /// The name `pgtenant.replica_status.state` uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Alive => "alive",
            ReplicaState::Stalled => "stalled",
            ReplicaState::Gone => "gone",
            ReplicaState::Sealed => "sealed",
            ReplicaState::Released => "released",
        }
    }
}

impl PartialEq<&str> for ReplicaState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for ReplicaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The journal's events (`pgtenant.history.event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Journal {
    Released,
    HandedOff,
}

impl Journal {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Journal::Released => "released",
            Journal::HandedOff => "handed_off",
        }
    }
}

/// Epochs and incarnations travel to and from PostgreSQL as the `bigint` they are stored as.
macro_rules! bigint_sql {
    ($type:ident) => {
        impl tokio_postgres::types::ToSql for $type {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut bytes::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
            {
                self.0.to_sql(ty, out)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <i64 as tokio_postgres::types::ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }

        impl<'a> tokio_postgres::types::FromSql<'a> for $type {
            fn from_sql(
                ty: &tokio_postgres::types::Type,
                raw: &'a [u8],
            ) -> Result<$type, Box<dyn std::error::Error + Sync + Send>> {
                i64::from_sql(ty, raw).map($type)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <i64 as tokio_postgres::types::FromSql>::accepts(ty)
            }
        }
    };
}

bigint_sql!(Epoch);
bigint_sql!(Incarnation);
