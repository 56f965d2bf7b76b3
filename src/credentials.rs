//! What an incarnation presents to the control plane (DESIGN §5 "Replica start", G8), and the
//! millisecond conversion every control-plane call with a duration uses.

use std::time::Duration;

use crate::lease::Incarnation;
use crate::replica_id::ReplicaId;

/// What an incarnation presents to the control-plane functions to act for its replica (G8):
/// the secret `pgtenant.register` issued to it, which the database stores only hashed.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) replica: ReplicaId,
    pub(crate) incarnation: Incarnation,
    /// This process's number for the registration, unique across its registrations: after a
    /// lossy failover the database can issue an incarnation number again, so state kept per
    /// incarnation on this side (a refusal, a binding) is kept per registration (DESIGN G9).
    pub(crate) registration: u64,
    secret: String,
}

impl Credentials {
    pub(crate) fn new(
        replica: ReplicaId,
        incarnation: Incarnation,
        registration: u64,
        secret: String,
    ) -> Self {
        Credentials {
            replica,
            incarnation,
            registration,
            secret,
        }
    }

    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("replica", &self.replica)
            .field("incarnation", &self.incarnation)
            .field("secret", &"<redacted>")
            .finish()
    }
}

pub(crate) fn millis(duration: Duration) -> i32 {
    i32::try_from(duration.as_millis()).unwrap_or(i32::MAX)
}
