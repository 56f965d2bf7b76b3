//! Session fencing's bookkeeping (DESIGN §5 "Data sessions and session fencing", *Bind*): the
//! fencing in force, and which pooled connections are bound to which registration, with the
//! refusals that end an incarnation.

use std::collections::HashMap;
use std::sync::Mutex;

use deadpool_postgres::{Object, ObjectId};

use crate::error::Error;
use crate::replica_id::ReplicaId;
use crate::sync::{lock, PooledConnection};

/// The fencing in force for this router, after the start-up checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Session,
    Transaction,
}

/// One pooled connection's binding: its statement cache identifies the live connection (the
/// cache dies with it), the incarnation it is bound to, its backend.
struct Binding {
    connection: PooledConnection,
    /// The registration it is bound to ([`Credentials::registration`](crate::credentials::Credentials::registration)).
    registration: u64,
    pid: i32,
}

/// The bindings of this router's pooled connections, by pool object, and the database's
/// refusals to bind (DESIGN G9: a refusal that no retry cures is reported, not retried).
#[derive(Default)]
pub(crate) struct Bindings {
    bound: Mutex<HashMap<ObjectId, Binding>>,
    refusal: Mutex<Refusal>,
    /// Wakes the liveness task when the current incarnation was refused.
    pub(crate) refused: tokio::sync::Notify,
}

/// The database's last refusal to bind, and how many incarnations in a row it refused.
#[derive(Default)]
struct Refusal {
    /// The registration refused ([`Credentials::registration`](crate::credentials::Credentials::registration): an incarnation number can be
    /// issued again after a lossy failover, a registration cannot).
    registration: Option<u64>,
    reason: String,
    in_a_row: u32,
}

/// Incarnations refused in a row, each freshly registered, after which registering again is no
/// cure: a seal refuses one incarnation (the next binds), so even a second seal right after
/// the first stays below this.
pub(crate) const LASTING_AFTER: u32 = 3;

impl Bindings {
    /// Records that the database refused to bind `incarnation`; returns (in a row, first time
    /// for this incarnation).
    pub(crate) fn refuse(&self, registration: u64, reason: &str) -> (u32, bool) {
        let mut refusal = lock(&self.refusal);
        let first = refusal.registration != Some(registration);
        if first {
            refusal.registration = Some(registration);
            refusal.reason = reason.to_owned();
            refusal.in_a_row += 1;
        }
        (refusal.in_a_row, first)
    }

    /// A bind passed: whatever was refused before is cured.
    pub(crate) fn accepted(&self) {
        let mut refusal = lock(&self.refusal);
        if refusal.in_a_row > 0 {
            *refusal = Refusal::default();
        }
    }

    /// Whether `registration` was refused: it can bind nothing, so there is no point asking.
    pub(crate) fn is_refused(&self, registration: u64) -> bool {
        lock(&self.refusal).registration == Some(registration)
    }

    /// The refusal's error once registering again did not cure it.
    pub(crate) fn lasting(&self, replica_id: &ReplicaId) -> Option<Error> {
        let refusal = lock(&self.refusal);
        (refusal.in_a_row >= LASTING_AFTER).then(|| Error::SessionsRefused {
            replica_id: replica_id.clone(),
            incarnations: refusal.in_a_row,
            reason: refusal.reason.clone(),
        })
    }

    /// Incarnations refused in a row (0 once a bind passed).
    pub(crate) fn refused_in_a_row(&self) -> u32 {
        lock(&self.refusal).in_a_row
    }

    /// Waits until a bind is refused.
    pub(crate) async fn refusal(&self) {
        self.refused.notified().await;
    }
    /// The backend pid of `object` if it is bound to `registration`.
    pub(crate) fn get(&self, object: &Object, registration: u64) -> Option<i32> {
        let bound = lock(&self.bound);
        let binding = bound.get(&Object::id(object))?;
        (binding.connection.is(object) && binding.registration == registration)
            .then_some(binding.pid)
    }

    pub(crate) fn insert(&self, object: &Object, registration: u64, pid: i32, pool_size: usize) {
        let mut bound = lock(&self.bound);
        // Connections come and go with the pool; forget those that went, now and then.
        if bound.len() > 2 * pool_size.max(8) {
            bound.retain(|_, binding| !binding.connection.is_gone());
        }
        bound.insert(
            Object::id(object),
            Binding {
                connection: PooledConnection::of(object),
                registration,
                pid,
            },
        );
    }
}
