//! The data-access layer (DESIGN §4): the one place pgtenant writes control-plane SQL and
//! sends it. Every state change of the control plane is a `SECURITY DEFINER` function (G8); each
//! has one typed Rust call here, named after it, so a protocol reads as a sequence of calls
//! and `tests/layers.rs` fails on a statement naming schema `pgtenant` anywhere else.
//!
//! * `mod.rs`: how a call travels (below).
//! * `fence.rs`: the fence, the session-fencing entry, the commit check (the hot path).
//! * `leases.rs`: acquire, schema_created, release, handoff requests, lease status.
//! * `sessions.rs`: session fencing's bind, seal and terminate, and the session reset.
//! * `tenants.rs`: forget, restore, schema_migrated, quarantine, the tenants a migration walks.
//! * `replicas.rs`: register, deregister, heartbeat, liveness, lock keys.
//! * `placement.rs`: placement's members, moves and reservations (rebalancing, close).
//! * `sweep.rs`: the trash, the sweep's records, pruning.
//! * `alarms.rs`: the alarm hint, its lock, and the tenants due (alarms).
//! * `admin.rs`: the operators' reads and calls.
//! * `citus.rs`: whether the database has Citus, and what stays local to its coordinator.
//! * `setup.rs`: the setup lock, grants, the control plane's version.
//!
//! Data sessions start read-only (`default_transaction_read_only`, G6), and a previous user of
//! a pooled connection may have left session state behind (a `SET ROLE` under which the
//! control-plane functions are not executable, a `statement_timeout` of 1 ms). So every call
//! of a control-plane function on a pooled connection runs in its own `READ WRITE`
//! transaction, after `pgtenant.reset_session`, and all four statements travel in one flight:
//! one round trip, as the bare call took before.

pub(crate) mod admin;
pub(crate) mod alarms;
pub(crate) mod citus;
pub(crate) mod fence;
pub(crate) mod leases;
pub(crate) mod placement;
pub(crate) mod replicas;
pub(crate) mod sessions;
pub(crate) mod setup;
pub(crate) mod sweep;
pub(crate) mod tenants;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

/// Begins a read-write transaction on a clean session. `reset_session(NULL)` also marks the
/// session as serving no tenant, so the next fence on this connection scrubs it again.
/// Begins a `READ WRITE` transaction for a control-plane write or a tenant's DDL. Said
/// explicitly because data sessions default to read-only (G6, `default_transaction_read_only`
/// as a startup option), which would refuse the first write; setup's own connection may too.
/// The one home of that start: creation, migration under a lease, the sweep and setup.
pub(crate) async fn begin_read_write(
    client: &mut Client,
) -> Result<tokio_postgres::Transaction<'_>, tokio_postgres::Error> {
    client.build_transaction().read_only(false).start().await
}

pub(crate) const BEGIN_CLEAN: &str = "BEGIN READ WRITE; SELECT pgtenant.reset_session(NULL)";

/// Runs `sql` (one statement, typed parameters) in its own read-write transaction on a clean
/// session, in one round trip. The error is the first statement's that failed: after it the
/// transaction is aborted and COMMIT turns into ROLLBACK, so nothing of the call stays behind.
pub(crate) async fn call(
    client: &Client,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    // join! polls in order, and each request goes on the wire at its first poll: the
    // statements leave together and PostgreSQL runs them in order.
    let (begun, rows, committed) = tokio::join!(
        client.batch_execute(BEGIN_CLEAN),
        client.query_typed(sql, params),
        client.batch_execute("COMMIT"),
    );
    begun?;
    let rows = rows?;
    committed?;
    Ok(rows)
}

/// Like [`call`], with `before` (one statement whose rows are not needed) run first in the same
/// transaction: the seal of a dead owner's incarnation before the acquisition that moves the
/// epoch. Still one round trip.
pub(crate) async fn call_after(
    client: &Client,
    before: (&str, &[(&(dyn ToSql + Sync), Type)]),
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let (begun, first, rows, committed) = tokio::join!(
        client.batch_execute(BEGIN_CLEAN),
        client.query_typed(before.0, before.1),
        client.query_typed(sql, params),
        client.batch_execute("COMMIT"),
    );
    begun?;
    first?;
    let rows = rows?;
    committed?;
    Ok(rows)
}
