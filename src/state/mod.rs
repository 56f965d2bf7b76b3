//! The bottom layer: what DESIGN §5's protocols share, and nothing that runs a protocol. A
//! protocol file imports from here and from the vocabulary below it (`tests/layers.rs`
//! checks); nothing here imports a protocol or a facade.
//!
//! * `liveness.rs`: the current incarnation and its local deadline, read by every handle.
//! * `replica.rs`: what a replica's router, handles and tasks share (`Replica`), and a handle's
//!   state: serving, draining, ended, the work in flight and its cancel tokens (`HeldLease`).
//! * `lifecycle.rs`: a held lease's states and steps, a plain state machine with its unit tests.
//! * `bindings.rs`: session fencing's bookkeeping of bound connections.
//! * `data_sessions.rs`: what the data path knows of each pooled connection.
//! * `affinity.rs`: connections parked for the tenant they last served.
//! * `releases.rs`: the release queue (its batcher is `protocol/release.rs`).
//! * `alarms.rs`: each tenant's next alarm, the firing task's clock (`protocol/alarms.rs`).

pub(crate) mod affinity;
pub(crate) mod alarms;
pub(crate) mod bindings;
pub(crate) mod data_sessions;
pub(crate) mod lifecycle;
pub(crate) mod liveness;
pub(crate) mod releases;
pub(crate) mod replica;
