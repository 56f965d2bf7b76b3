//! Alarms' control-plane calls (DESIGN §5 "Alarms", G11; control plane V18): the per-tenant
//! hint `pgtenant.note_alarms` writes inside the fenced transaction that changed a tenant's
//! alarms (computed there from the tenant's own table, so it commits or rolls back with them),
//! the lock that orders those transactions, and `pgtenant.due_alarms`, the one indexed read that
//! finds the tenants a replica should wake.

use std::time::SystemTime;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use crate::id::TenantId;
use crate::replica_id::ReplicaId;

/// The advisory-lock class of a tenant's alarms (next to `pgtenant.lock_namespace()` and
/// `pgtenant.tenant_lock_namespace()`), keyed by the tenant's lock key.
const ALARM_LOCK_NAMESPACE: i32 = 1_885_828_147;

/// Held from a transaction's first alarm statement to its end: transactions that change one
/// tenant's alarms follow each other, so the hint each one writes (computed after taking it,
/// from what is committed) is never overwritten by one computed from an older snapshot, and
/// the first use's `CREATE TABLE IF NOT EXISTS` never races another.
pub(crate) async fn lock(tx: &Transaction<'_>, lock_key: i32) -> Result<(), tokio_postgres::Error> {
    tx.query_typed(
        "SELECT pg_catalog.pg_advisory_xact_lock($1, $2)",
        &[(&ALARM_LOCK_NAMESPACE, Type::INT4), (&lock_key, Type::INT4)],
    )
    .await
    .map(drop)
}

/// `pgtenant.note_alarms(key, next_due, pending, failed)`, computed in the same statement from
/// the tenant's table `pgtenant_alarms` (`search_path` is the tenant's schema): the tenant's
/// next pending due time, which the caller keeps in memory once the transaction commits.
pub(crate) async fn note_alarms(
    tx: &Transaction<'_>,
    key: &str,
) -> Result<Option<SystemTime>, tokio_postgres::Error> {
    let row = tx
        .query_typed(
            "SELECT s.next_due, pgtenant.note_alarms($1, s.next_due, s.pending, s.failed)
               FROM (SELECT min(due_at) FILTER (WHERE failed_at IS NULL) AS next_due,
                            (count(*) FILTER (WHERE failed_at IS NULL))::int AS pending,
                            (count(*) FILTER (WHERE failed_at IS NOT NULL))::int AS failed
                       FROM pgtenant_alarms) s",
            &[(&key, Type::TEXT)],
        )
        .await?;
    match row.first() {
        Some(row) => row.try_get(0),
        None => Ok(None),
    }
}

/// `pgtenant.due_alarms`: up to `limit` tenants with an alarm due within `horizon_ms` that
/// `replica` should fire (held by it, or free, or held by an incarnation that is over; with
/// `placement`, of those only the ones whose home it is), earliest first. A key that is not a
/// valid tenant id (written by hand) is skipped.
pub(crate) async fn due_alarms(
    client: &Client,
    replica: &ReplicaId,
    horizon_ms: i32,
    limit: usize,
    placement: bool,
) -> Result<Vec<(TenantId, SystemTime)>, tokio_postgres::Error> {
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let rows = crate::db::call(
        client,
        "SELECT tenant, next_due FROM pgtenant.due_alarms($1, $2, $3, $4)",
        &[
            (replica, Type::TEXT),
            (&horizon_ms, Type::INT4),
            (&limit, Type::INT4),
            (&placement, Type::BOOL),
        ],
    )
    .await?;
    let mut due = Vec::with_capacity(rows.len());
    for row in &rows {
        let key: String = row.try_get(0)?;
        let next: Option<SystemTime> = row.try_get(1)?;
        if let (Ok(id), Some(next)) = (TenantId::parse(&key), next) {
            due.push((id, next));
        }
    }
    Ok(due)
}

/// `pgtenant.take_alarm_requests(key)` (control plane 19 on), inside the fenced transaction
/// that applies them: the operators' requests for the tenant's parked alarms, as (alarm name,
/// None for all; retry or clear), deleted with that transaction's commit.
pub(crate) async fn take_requests(
    tx: &Transaction<'_>,
    key: &str,
) -> Result<Vec<(Option<String>, String)>, tokio_postgres::Error> {
    let rows = tx
        .query_typed(
            "SELECT name, action FROM pgtenant.take_alarm_requests($1) ORDER BY name NULLS FIRST",
            &[(&key, Type::TEXT)],
        )
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}
