//! DESIGN §5's protocols, one file each, named after it, its doc at the top. A protocol imports
//! the shared state (`crate::state`), the data-access layer (`crate::db`) and the vocabulary
//! below them. Where DESIGN builds one protocol of others (an acquisition runs tenant
//! migrations, an open acquires, a close hands off, every voluntary end gives the lease back
//! through `release.rs`), it imports those and only those: the table's last column, which
//! `tests/layers.rs` checks against the code in both directions. The rows are in order, bottom
//! to top: a protocol is built only of protocols above its row, so no path goes back up and
//! none has a circle. A protocol sends SQL only through `db/`, one typed call per control-plane
//! function.
//!
//! | DESIGN §5 | file | built of |
//! |---|---|---|
//! | Session fencing: bind | `session_fencing/bind.rs` | |
//! | Session fencing: terminate | `session_fencing/terminate.rs` | |
//! | Release: how every voluntary end gives a lease back, and the batcher | `release.rs` | |
//! | Tenant migrations | `tenant_migrations.rs` | release |
//! | Handoff | `handoff.rs` | release |
//! | Sweep | `sweep.rs` | |
//! | Session fencing: whether it holds | `session_fencing/mod.rs` | |
//! | Replica start | `replica_start.rs` | session_fencing, release |
//! | Heartbeat | `heartbeat.rs` | replica_start |
//! | Fenced transaction: settling work the caller stopped waiting for | `fenced_transaction/settle.rs` | session_fencing::terminate |
//! | Fenced transaction | `fenced_transaction/mod.rs` | session_fencing::bind, fenced_transaction::settle |
//! | Fenced transaction: idempotent runs | `fenced_transaction/once.rs` | fenced_transaction |
//! | Abandon | `abandon.rs` | session_fencing::terminate, release |
//! | Acquire tenant | `acquire.rs` | tenant_migrations, abandon, release |
//! | Forget (and restore) | `forget.rs` | tenant_migrations, acquire |
//! | Open path | `open.rs` | acquire, abandon |
//! | Alarms: scheduling inside the work, firing under the lease | `alarms.rs` | fenced_transaction, open |
//! | Close | `close.rs` | handoff |
//! | Idle release (placement) | `idle_release.rs` | handoff |
//! | Placement: rebalancing | `rebalance.rs` | open, handoff |
//! | `migrate_all` | `migrate_all.rs` | tenant_migrations, open, release |

pub(crate) mod abandon;
pub(crate) mod acquire;
pub(crate) mod alarms;
pub(crate) mod close;
pub(crate) mod fenced_transaction;
pub(crate) mod forget;
pub(crate) mod handoff;
pub(crate) mod heartbeat;
pub(crate) mod idle_release;
pub(crate) mod migrate_all;
pub(crate) mod open;
pub(crate) mod rebalance;
pub(crate) mod release;
pub(crate) mod replica_start;
pub(crate) mod session_fencing;
pub(crate) mod sweep;
pub(crate) mod tenant_migrations;
