//! Typed events a router publishes to its subscribers (DESIGN §6 Observability).

use serde::Serialize;

use crate::id::TenantId;
use crate::lease::{Epoch, Incarnation};
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;

/// Something that happened to a replica or one of its leases.
///
/// Delivered through [`Router::subscribe`](crate::Router::subscribe) on a bounded broadcast
/// channel: a subscriber that falls behind misses events (it sees a lag count), it never slows
/// the router.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// The replica registered a new incarnation (at start and after its lease session dropped).
    Registered {
        /// The replica id.
        replica: ReplicaId,
        /// The new incarnation.
        incarnation: Incarnation,
        /// Where its clients reach it ([`RouterOptions::address`](crate::RouterOptions::address)).
        address: Option<String>,
    },
    /// A tenant's lease was acquired.
    Acquired {
        /// The tenant.
        tenant: TenantId,
        /// The new epoch.
        epoch: Epoch,
        /// The previous owner, when it was dead or stalled and its lease was broken.
        took_over_from: Option<ReplicaId>,
    },
    /// A tenant's schema was created (a new life).
    Created {
        /// The tenant.
        tenant: TenantId,
        /// The epoch the life began at.
        epoch: Epoch,
        /// The schema.
        schema: String,
    },
    /// A heartbeat succeeded. Published only with
    /// [`RouterOptions::renewal_events`](crate::RouterOptions::renewal_events), since it comes
    /// every heartbeat period.
    Renewed {
        /// The incarnation renewed.
        incarnation: Incarnation,
    },
    /// A heartbeat failed; leases stay valid until the local deadline.
    RenewFailed {
        /// Why.
        reason: String,
    },
    /// Registering a new incarnation failed after the lease session dropped; the replica
    /// serves nothing meanwhile and tries again after `retry_in_ms`.
    RegistrationFailed {
        /// Why, e.g. the database is unreachable, or its control plane is newer than this
        /// library ([`Error::ControlPlaneTooNew`](crate::Error::ControlPlaneTooNew)).
        reason: String,
        /// Whether it may pass by itself ([`Error::is_retryable`](crate::Error::is_retryable));
        /// false means someone must act, e.g. deploy a newer pgtenant.
        retryable: bool,
        /// When the next attempt comes, in milliseconds.
        retry_in_ms: u64,
    },
    /// The database refused to bind a data session to this incarnation (session fencing): it
    /// was sealed, or is no longer alive. The replica ends the incarnation and registers again,
    /// which cures a seal. Published once per refused incarnation.
    SessionsRefused {
        /// The incarnation refused.
        incarnation: Incarnation,
        /// The database's words.
        reason: String,
        /// How many incarnations in a row were refused, this one included.
        in_a_row: u32,
        /// False once registering again has not cured it
        /// ([`Error::SessionsRefused`](crate::Error::SessionsRefused)): someone must act.
        retryable: bool,
    },
    /// A heartbeat succeeded after the local deadline had passed: handles serve again.
    Resumed {
        /// The incarnation.
        incarnation: Incarnation,
    },
    /// A lease ended for good without a release: taken over, fenced, or the replica lost its
    /// incarnation.
    Lost {
        /// The tenant.
        tenant: TenantId,
        /// The epoch lost.
        epoch: Epoch,
        /// Why.
        reason: String,
    },
    /// A lease was released.
    Released {
        /// The tenant.
        tenant: TenantId,
        /// The epoch released.
        epoch: Epoch,
    },
    /// A handoff began: the tenant refuses new work while the work in flight finishes.
    Draining {
        /// The tenant.
        tenant: TenantId,
        /// The epoch.
        epoch: Epoch,
        /// Work in flight when the drain began.
        in_flight: usize,
    },
    /// A tenant was handed off after draining, free for the next owner (or reserved for one).
    HandedOff {
        /// The tenant.
        tenant: TenantId,
        /// The epoch handed off.
        epoch: Epoch,
        /// The replica it is reserved for, for a directed handoff.
        to: Option<ReplicaId>,
    },
    /// A handoff gave up waiting for work in flight; the tenant keeps serving here.
    DrainTimeout {
        /// The tenant.
        tenant: TenantId,
        /// The epoch.
        epoch: Epoch,
        /// Work still running.
        in_flight: usize,
    },
    /// Another replica asked for one of this replica's tenants (a request the control plane
    /// confirmed came from that replica's live incarnation).
    HandoffRequested {
        /// The tenant.
        tenant: TenantId,
        /// The replica asking.
        requester: ReplicaId,
        /// Whether the policy accepted it.
        accepted: bool,
    },
    /// A tenant's migrations ran.
    Migrated {
        /// The tenant.
        tenant: TenantId,
        /// The epoch they ran under.
        epoch: Epoch,
        /// Version before.
        from: SchemaVersion,
        /// Version after.
        to: SchemaVersion,
    },
    /// A tenant was forgotten: its schema moved to the trash, every epoch up to this one masked.
    Forgotten {
        /// The tenant.
        tenant: TenantId,
        /// The forgotten epoch.
        epoch: Epoch,
        /// The trash schema.
        trash: String,
    },
    /// A forgotten tenant was restored from the trash as a new life.
    Restored {
        /// The tenant.
        tenant: TenantId,
        /// The new epoch.
        epoch: Epoch,
        /// The schema.
        schema: String,
    },
    /// A tenant was quarantined: a failure caused by the tenant, kept until cleared.
    Quarantined {
        /// The tenant.
        tenant: TenantId,
        /// What failed.
        cause: String,
    },
    /// A tenant's alarm fired: its handler's transaction committed, and removed the alarm
    /// (the handler may have scheduled it again).
    AlarmFired {
        /// The tenant.
        tenant: TenantId,
        /// The epoch it fired under.
        epoch: Epoch,
        /// The alarm's name.
        name: String,
        /// The alarm's id ([`Alarm::id`](crate::Alarm::id)).
        id: i64,
        /// Which attempt committed, from 1.
        attempt: u32,
        /// Milliseconds from its due time to the commit, by this replica's clock.
        late_ms: u64,
    },
    /// A tenant's alarm handler returned an error: the firing rolled back; the alarm is retried
    /// after a backoff, or parked as failed after the last attempt.
    AlarmFailed {
        /// The tenant.
        tenant: TenantId,
        /// The epoch it was tried under.
        epoch: Epoch,
        /// The alarm's name.
        name: String,
        /// The alarm's id.
        id: i64,
        /// Which attempt failed, from 1.
        attempt: u32,
        /// The handler's error.
        error: String,
        /// Whether that was the last attempt: the alarm is parked (`failed_at` set).
        parked: bool,
    },
}
