//! DESIGN §5's protocols, one file each, named after it, its doc at the top. Each imports the
//! shared state (`crate::state`) and the vocabulary below it, and the protocols it is built of
//! (an open acquires; an acquisition runs tenant migrations and seals), never a facade:
//!
//! | DESIGN §5 | file |
//! |---|---|
//! | Replica start | `replica_start.rs` |
//! | Heartbeat | `heartbeat.rs` |
//! | Acquire tenant | `acquire.rs` |
//! | Fenced transaction | `fenced_transaction.rs` |
//! | Data sessions and session fencing (bind, seal, terminate) | `session_fencing.rs` |
//! | Handoff | `handoff.rs` |
//! | Abandon | `abandon.rs` |
//! | Forget | `forget.rs` |
//! | Sweep | `sweep.rs` |
//! | Tenant migrations | `tenant_migrations/` (`mod.rs` under a lease, `all.rs` for `migrate_all`) |
//! | Open path | `open.rs` |
//! | Close | `close.rs` |

pub(crate) mod abandon;
pub(crate) mod acquire;
pub(crate) mod close;
pub(crate) mod fenced_transaction;
pub(crate) mod forget;
pub(crate) mod handoff;
pub(crate) mod heartbeat;
pub(crate) mod open;
pub(crate) mod replica_start;
pub(crate) mod session_fencing;
pub(crate) mod sweep;
pub(crate) mod tenant_migrations;
