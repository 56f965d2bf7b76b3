//! The bottom layer: what DESIGN §5's protocols share, and nothing that runs a protocol. A
//! protocol file imports from here (and from the vocabulary below it), never from another
//! layer above.
//!
//! * `sync.rs`: the poison-proof mutex lock and `join_all`.
//! * `credentials.rs`: what an incarnation presents to the control plane (G8), `millis`.
//! * `liveness.rs`: the current incarnation and its local deadline, read by every handle.
//! * `shared.rs`: what a replica's router, handles and tasks share (`Shared`), and a handle's
//!   state: serving, draining, ended, the work in flight and its cancel tokens (`HandleInner`).
//! * `bindings.rs`: session fencing's bookkeeping of bound connections.
//! * `data_sessions.rs`: what the data path knows of each pooled connection.
//! * `releases.rs`: the one call of `pgtenant.release`, batched.

pub(crate) mod bindings;
pub(crate) mod credentials;
pub(crate) mod data_sessions;
pub(crate) mod liveness;
pub(crate) mod releases;
pub(crate) mod shared;
pub(crate) mod sync;
