//! The operator API (also the `pgtenant` command): setting up and granting the control
//! plane, listing tenants and the trash, clearing quarantines, and the sweep
//! (`protocol/sweep.rs`, DESIGN §5 "Sweep") that drops trashed and masked schemas.

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, TenantState};
use crate::options::validate_replica_id;

pub use crate::control_plane::{
    control_plane_version, setup_with, supported_version, SetupOptions, SetupReport, CONTROL_SCHEMA,
};
pub use crate::protocol::sweep::{sweep, SweepOptions, SweepReport};

/// Which tenants [`list_tenants`] returns: filters combine with AND; pages by key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TenantQuery {
    /// Only tenants owned by this replica.
    pub owner: Option<String>,
    /// Only tenants in this state.
    pub state: Option<TenantState>,
    /// Only quarantined (true) or only healthy (false) tenants.
    pub quarantined: Option<bool>,
    /// Only live tenants whose migration version is below this one.
    pub behind: Option<i64>,
    /// The page after this tenant (keyset paging: pass the last tenant of a page).
    pub after: Option<TenantId>,
    /// Page size, 1..=10 000 (default 100).
    pub limit: i64,
}

impl Default for TenantQuery {
    fn default() -> Self {
        TenantQuery {
            owner: None,
            state: None,
            quarantined: None,
            behind: None,
            after: None,
            limit: 100,
        }
    }
}

impl TenantQuery {
    fn validate(&self) -> Result<()> {
        let invalid = |option, reason: String| Err(Error::InvalidOption { option, reason });
        if let Some(owner) = &self.owner {
            validate_replica_id("owner", owner)?;
        }
        if !(1..=10_000).contains(&self.limit) {
            return invalid("limit", format!("{} is outside 1..=10000", self.limit));
        }
        Ok(())
    }
}

/// One tenant's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TenantRecord {
    /// The tenant.
    pub tenant: TenantId,
    /// Its state in `pgtenant.lease_status`.
    pub state: TenantState,
    /// The owner replica.
    pub owner: Option<String>,
    /// The current epoch.
    pub epoch: Epoch,
    /// Whether the owner is alive.
    pub owner_alive: Option<bool>,
    /// The live schema (None when forgotten).
    pub schema: Option<String>,
    /// The tenant's migration version.
    pub version: i32,
    /// The highest forgotten epoch (0: never forgotten).
    pub forgotten_at_epoch: i64,
    /// Why it is quarantined.
    pub quarantine_cause: Option<String>,
    /// What to do about it.
    pub quarantine_repair: Option<String>,
    /// When the tenant was first created (UTC, RFC 3339).
    pub created_at: String,
    /// When its lease was last acquired (UTC, RFC 3339).
    pub acquired_at: Option<String>,
}

const RECORD_SQL: &str =
    "SELECT s.tenant, s.state, s.owner, s.epoch, s.owner_alive, s.schema, s.version,
        t.forgotten_at_epoch, s.quarantine_cause, s.quarantine_repair,
        to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
        to_char(s.acquired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
   FROM pgtenant.lease_status s JOIN pgtenant.tenants t ON t.key = s.tenant";

fn record(row: &tokio_postgres::Row) -> Result<TenantRecord> {
    let read = Error::db("read a tenant record");
    let key: String = row.try_get(0).map_err(Error::db("read a tenant record"))?;
    let state: String = row.try_get(1).map_err(Error::db("read a tenant record"))?;
    let fields = (|| {
        Ok::<_, tokio_postgres::Error>((
            row.try_get(2)?,
            row.try_get::<_, i64>(3)?,
            row.try_get(4)?,
            row.try_get(5)?,
            row.try_get(6)?,
            row.try_get(7)?,
            row.try_get(8)?,
            row.try_get(9)?,
            row.try_get(10)?,
            row.try_get(11)?,
        ))
    })()
    .map_err(read)?;
    Ok(TenantRecord {
        tenant: TenantId::parse(&key)?,
        state: state.parse()?,
        owner: fields.0,
        epoch: Epoch::new(fields.1),
        owner_alive: fields.2,
        schema: fields.3,
        version: fields.4,
        forgotten_at_epoch: fields.5,
        quarantine_cause: fields.6,
        quarantine_repair: fields.7,
        created_at: fields.8,
        acquired_at: fields.9,
    })
}

/// A page of tenants, by key. Invalid filters are refused before any query.
pub async fn list_tenants(
    client: &impl GenericClient,
    query: &TenantQuery,
) -> Result<Vec<TenantRecord>> {
    query.validate()?;
    let behind = query.behind.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
    let rows = client
        .query(
            &format!(
                "{RECORD_SQL}
                  WHERE ($1::text IS NULL OR s.owner = $1)
                    AND ($2::text IS NULL OR s.state = $2)
                    AND ($3::bool IS NULL OR (s.quarantine_cause IS NOT NULL) = $3)
                    AND ($4::int IS NULL OR (s.schema IS NOT NULL AND s.version < $4))
                    AND ($5::text IS NULL OR s.tenant > $5)
                  ORDER BY s.tenant LIMIT $6"
            ),
            &[
                &query.owner,
                &query.state.map(TenantState::as_str),
                &query.quarantined,
                &behind,
                &query.after.as_ref().map(TenantId::key),
                &query.limit,
            ],
        )
        .await
        .map_err(Error::db("list tenants"))?;
    rows.iter().map(record).collect()
}

/// One tenant's record, or None when the control plane has never seen it.
pub async fn show_tenant(
    client: &impl GenericClient,
    id: &TenantId,
) -> Result<Option<TenantRecord>> {
    let row = client
        .query_opt(&format!("{RECORD_SQL} WHERE s.tenant = $1"), &[&id.key()])
        .await
        .map_err(Error::db_with(|| format!("show tenant {id}")))?;
    row.as_ref().map(record).transpose()
}

/// A trashed schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TrashRecord {
    /// The schema's name in the trash.
    pub schema: String,
    /// The tenant it belonged to.
    pub tenant: String,
    /// The epoch it was forgotten at.
    pub epoch: Epoch,
    /// Its name while live.
    pub live_name: String,
    /// Its migration version.
    pub version: i32,
    /// When it was trashed (UTC, RFC 3339).
    pub trashed_at: String,
    /// When the sweep removed it.
    pub swept_at: Option<String>,
}

/// Everything in the trash, newest first.
pub async fn list_trash(client: &impl GenericClient) -> Result<Vec<TrashRecord>> {
    let rows = client
        .query(
            "SELECT schema_name, tenant_key, epoch, live_name, schema_version,
                    to_char(trashed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    to_char(swept_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
               FROM pgtenant.trash ORDER BY trashed_at DESC, schema_name",
            &[],
        )
        .await
        .map_err(Error::db("list the trash"))?;
    Ok(rows
        .iter()
        .map(|row| TrashRecord {
            schema: row.get(0),
            tenant: row.get(1),
            epoch: Epoch::new(row.get(2)),
            live_name: row.get(3),
            version: row.get(4),
            trashed_at: row.get(5),
            swept_at: row.get(6),
        })
        .collect())
}

/// Clears a tenant's quarantine (recording `by` in the journal) so it can be opened again;
/// false when it was not quarantined. Do it after the repair the quarantine names.
pub async fn clear_quarantine(
    client: &impl GenericClient,
    id: &TenantId,
    by: &str,
) -> Result<bool> {
    client
        .query_one(
            "SELECT pgtenant.clear_quarantine($1, $2)",
            &[&id.key(), &by],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db_with(|| {
            format!("clear the quarantine of tenant {id}")
        }))
}
