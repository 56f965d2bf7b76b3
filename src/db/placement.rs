//! Placement's reads (DESIGN §5 "Placement"): the live members and which are stable, the
//! tenants a replica holds away from their home, those reserved for it, and those a dead
//! incarnation held whose home it is. Read-only
//! `SECURITY DEFINER` functions (control plane V16); every move they lead to goes through the
//! authenticated release (`leases.rs`).

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::id::TenantId;
use crate::lease::Epoch;
use crate::replica_id::ReplicaId;

/// One row of `pgtenant.placement_members`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub(crate) replica: ReplicaId,
    pub(crate) weight: f64,
    /// Alive in its current incarnation for the stability window.
    pub(crate) stable: bool,
}

/// One row of `pgtenant.placement_moves`: a tenant held here whose home is `home`.
pub(crate) struct Move {
    pub(crate) tenant: TenantId,
    pub(crate) epoch: Epoch,
    pub(crate) home: ReplicaId,
}

fn millis(window: std::time::Duration) -> i32 {
    i32::try_from(window.as_millis()).unwrap_or(i32::MAX)
}

/// `pgtenant.placement_members(stable_ms)`: the replicas tenants are placed on, in id order.
pub(crate) async fn placement_members(
    client: &Client,
    stable_for: std::time::Duration,
) -> Result<Vec<Member>, tokio_postgres::Error> {
    let rows = crate::db::call(
        client,
        "SELECT replica_id, weight, stable FROM pgtenant.placement_members($1)",
        &[(&millis(stable_for), Type::INT4)],
    )
    .await?;
    rows.iter()
        .map(|row| {
            Ok(Member {
                replica: row.try_get(0)?,
                weight: row.try_get(1)?,
                stable: row.try_get::<_, Option<bool>>(2)?.unwrap_or(false),
            })
        })
        .collect()
}

/// `pgtenant.placement_moves`: up to `limit` tenants `replica` holds whose home (among the
/// stable members, and `replica` unless `leaving`) is another replica. A key the database holds
/// that is not a valid tenant id (written by hand) is skipped.
pub(crate) async fn placement_moves(
    client: &Client,
    replica: &ReplicaId,
    stable_for: std::time::Duration,
    leaving: bool,
    limit: usize,
) -> Result<Vec<Move>, tokio_postgres::Error> {
    let limit = row_limit(limit);
    let rows = crate::db::call(
        client,
        "SELECT tenant, epoch, home FROM pgtenant.placement_moves($1, $2, $3, $4)",
        &[
            (replica, Type::TEXT),
            (&millis(stable_for), Type::INT4),
            (&leaving, Type::BOOL),
            (&limit, Type::INT4),
        ],
    )
    .await?;
    let mut moves = Vec::with_capacity(rows.len());
    for row in &rows {
        let key: String = row.try_get(0)?;
        let Ok(tenant) = TenantId::parse(&key) else {
            continue;
        };
        moves.push(Move {
            tenant,
            epoch: Epoch::new(row.try_get(1)?),
            home: row.try_get(2)?,
        });
    }
    Ok(moves)
}

/// `pgtenant.reserved_for(replica, limit)`: tenants a directed handoff reserved for `replica`
/// and nobody picked up yet.
pub(crate) async fn reserved_for(
    client: &Client,
    replica: &ReplicaId,
    limit: usize,
) -> Result<Vec<TenantId>, tokio_postgres::Error> {
    tenants_for(
        client,
        "SELECT tenant FROM pgtenant.reserved_for($1, $2)",
        replica,
        limit,
    )
    .await
}

/// `pgtenant.orphaned_homes(replica, limit)`: tenants still held by an incarnation that is over
/// whose home among the live replicas is `replica`.
pub(crate) async fn orphaned_homes(
    client: &Client,
    replica: &ReplicaId,
    limit: usize,
) -> Result<Vec<TenantId>, tokio_postgres::Error> {
    tenants_for(
        client,
        "SELECT tenant FROM pgtenant.orphaned_homes($1, $2)",
        replica,
        limit,
    )
    .await
}

/// A `(replica, limit)` function returning tenant keys, as tenant ids.
async fn tenants_for(
    client: &Client,
    sql: &str,
    replica: &ReplicaId,
    limit: usize,
) -> Result<Vec<TenantId>, tokio_postgres::Error> {
    let limit = row_limit(limit);
    let rows = crate::db::call(client, sql, &[(replica, Type::TEXT), (&limit, Type::INT4)]).await?;
    Ok(tenant_ids(&rows))
}

/// A row count for an `integer` parameter (larger ones ask for everything).
fn row_limit(limit: usize) -> i32 {
    i32::try_from(limit).unwrap_or(i32::MAX)
}

/// The valid tenant ids of a one-column result (a key written by hand that is not one is
/// skipped).
fn tenant_ids(rows: &[tokio_postgres::Row]) -> Vec<TenantId> {
    rows.iter()
        .filter_map(|row| row.try_get::<_, String>(0).ok())
        .filter_map(|key| TenantId::parse(&key).ok())
        .collect()
}
