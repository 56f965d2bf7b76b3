//! The operator API (also the `pgtenant` command): setting up and granting the control
//! plane, listing tenants and the trash, clearing quarantines, and the sweep
//! (`protocol/sweep.rs`, DESIGN §5 "Sweep") that drops trashed and masked schemas.

use std::collections::BTreeMap;

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::db;
use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, Incarnation, TenantState};
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;

pub use crate::control_plane::{control_plane_version, supported_version, CONTROL_SCHEMA};
pub use crate::lease::ReplicaState;
pub use crate::protocol::sweep::{sweep, SweepOptions, SweepReport};

/// Which tenants [`list_tenants`] returns: filters combine with AND; pages by key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TenantQuery {
    /// Only tenants owned by this replica.
    pub owner: Option<ReplicaId>,
    /// Only tenants in this state.
    pub state: Option<TenantState>,
    /// Only quarantined (true) or only healthy (false) tenants.
    pub quarantined: Option<bool>,
    /// Only live tenants whose migration version is below this one.
    pub behind: Option<SchemaVersion>,
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
    pub owner: Option<ReplicaId>,
    /// The current epoch.
    pub epoch: Epoch,
    /// Whether the incarnation holding the lease is alive (None without an owner).
    pub owner_alive: Option<bool>,
    /// The incarnation holding the lease, to set beside
    /// [`ReplicaStatus::incarnation`] (None without an owner).
    pub owner_incarnation: Option<Incarnation>,
    /// Milliseconds left on the owner's heartbeat, for `held` and `stalled` tenants (0 when
    /// stalled); None otherwise.
    pub expires_in_ms: Option<i64>,
    /// The live schema (None when forgotten).
    pub schema: Option<String>,
    /// The tenant's migration version.
    pub version: SchemaVersion,
    /// The highest forgotten epoch (epoch 0: never forgotten).
    pub forgotten_at_epoch: Epoch,
    /// Why it is quarantined.
    pub quarantine_cause: Option<String>,
    /// What to do about it.
    pub quarantine_repair: Option<String>,
    /// When the tenant was first created (UTC, RFC 3339).
    pub created_at: String,
    /// When its lease was last acquired (UTC, RFC 3339).
    pub acquired_at: Option<String>,
}

/// A state as `lease_status` says it, also on a control plane older than 13, whose `expired`
/// covered both [`TenantState::OwnerGone`] and [`TenantState::OwnerReregistered`] and is read
/// as the first.
fn state_of(text: &str) -> Result<TenantState> {
    match text {
        "expired" => Ok(TenantState::OwnerGone),
        text => text.parse(),
    }
}

/// A [`TenantRecord`] from one of `db::admin::lease_rows`'s (or `lease_rows_of`'s) rows.
fn record(row: &tokio_postgres::Row) -> Result<TenantRecord> {
    let row = db::admin::lease_row(row)?;
    Ok(TenantRecord {
        tenant: TenantId::parse(&row.tenant)?,
        state: state_of(&row.state)?,
        owner: row.owner,
        epoch: row.epoch,
        owner_alive: row.owner_alive,
        owner_incarnation: row.owner_incarnation,
        expires_in_ms: row.expires_in_ms,
        schema: row.schema,
        version: row.version,
        forgotten_at_epoch: row.forgotten_at_epoch,
        quarantine_cause: row.quarantine_cause,
        quarantine_repair: row.quarantine_repair,
        created_at: row.created_at,
        acquired_at: row.acquired_at,
    })
}

/// A page of tenants, by key. Invalid filters are refused before any query.
pub async fn list_tenants(
    client: &impl GenericClient,
    query: &TenantQuery,
) -> Result<Vec<TenantRecord>> {
    query.validate()?;
    let filter = db::admin::LeaseFilter {
        owner: query.owner.as_ref(),
        state: query.state,
        quarantined: query.quarantined,
        behind: query.behind,
        after: query.after.as_ref(),
        limit: query.limit,
    };
    let rows = db::admin::lease_rows(client, &filter)
        .await
        .map_err(Error::db("list tenants"))?;
    rows.iter().map(record).collect()
}

/// One tenant's record, or None when the control plane has never seen it.
pub async fn show_tenant(
    client: &impl GenericClient,
    id: &TenantId,
) -> Result<Option<TenantRecord>> {
    let rows = db::admin::lease_rows_of(client, id)
        .await
        .map_err(Error::db_with(|| format!("show tenant {id}")))?;
    rows.first().map(record).transpose()
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
    pub version: SchemaVersion,
    /// When it was trashed (UTC, RFC 3339).
    pub trashed_at: String,
    /// When a sweep began dropping its objects (control plane 12 on): from then on it cannot
    /// be restored, only swept.
    pub sweep_started_at: Option<String>,
    /// When the sweep removed it.
    pub swept_at: Option<String>,
}

/// Everything in the trash, newest first.
pub async fn list_trash(client: &impl GenericClient) -> Result<Vec<TrashRecord>> {
    Ok(db::admin::trash(client)
        .await?
        .into_iter()
        .map(|row| TrashRecord {
            schema: row.schema,
            tenant: row.tenant,
            epoch: row.epoch,
            live_name: row.live_name,
            version: row.version,
            trashed_at: row.trashed_at,
            sweep_started_at: row.sweep_started_at,
            swept_at: row.swept_at,
        })
        .collect())
}

/// A tenant with alarms, as `pgtenant.alarms` shows it (DESIGN §5 "Alarms").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TenantAlarms {
    /// The tenant's key.
    pub tenant: String,
    /// Its owner, if a replica holds it.
    pub owner: Option<String>,
    /// When its next pending alarm is due (UTC, RFC 3339).
    pub next_due: Option<String>,
    /// Alarms waiting to fire.
    pub pending: i32,
    /// Alarms parked after their last failed attempt.
    pub failed: i32,
    /// When its alarms last changed (UTC, RFC 3339).
    pub updated_at: String,
}

/// Every tenant with alarms, the next due first (control plane 18 on): one read of the view
/// `pgtenant.alarms`. The alarms themselves are in each tenant's schema (`pgtenant_alarms`).
pub async fn list_alarms(client: &impl GenericClient) -> Result<Vec<TenantAlarms>> {
    Ok(db::admin::alarms(client)
        .await?
        .into_iter()
        .map(|row| TenantAlarms {
            tenant: row.tenant,
            owner: row.owner,
            next_due: row.next_due,
            pending: row.pending,
            failed: row.failed,
            updated_at: row.updated_at,
        })
        .collect())
}

/// A parked alarm: its last attempt failed and it waits for an operator (DESIGN §5 "Alarms").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedAlarm {
    /// The tenant's key.
    pub tenant: String,
    /// The alarm's name.
    pub name: String,
    /// This scheduling of it ([`Alarm::id`](crate::Alarm::id)).
    pub id: i64,
    /// Attempts made.
    pub attempts: i32,
    /// The last attempt's error, as the handler returned it.
    pub last_error: Option<String>,
    /// When it was parked (UTC, RFC 3339).
    pub failed_at: Option<String>,
    /// When it was due (UTC, RFC 3339).
    pub due_at: Option<String>,
}

/// What an operator asks of a parked alarm ([`request_alarms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmAction {
    /// Pending again, due now, its attempts counted from 0.
    Retry,
    /// Deleted.
    Clear,
}

impl AlarmAction {
    fn as_str(self) -> &'static str {
        match self {
            AlarmAction::Retry => "retry",
            AlarmAction::Clear => "clear",
        }
    }
}

/// A request [`request_alarms`] left for the tenant's owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AlarmRequest {
    /// Its id in `pgtenant.alarm_requests` (gone from there once applied).
    pub id: i64,
    /// The parked alarms it names, as they were when it was made.
    pub alarms: Vec<String>,
}

/// The parked alarms of `tenant`, or of every tenant whose hint in `pgtenant.alarms` counts
/// failed ones (control plane 19 on): one call of `pgtenant.parked_alarms`, which reads each
/// such tenant's table `pgtenant_alarms` for the operator (never the payloads, the tenant's
/// data).
pub async fn parked_alarms(
    client: &impl GenericClient,
    tenant: Option<&TenantId>,
) -> Result<Vec<ParkedAlarm>> {
    Ok(db::admin::parked_alarms(client, tenant.map(TenantId::key))
        .await?
        .into_iter()
        .map(|row| ParkedAlarm {
            tenant: row.tenant,
            name: row.name,
            id: row.id,
            attempts: row.attempts,
            last_error: row.last_error,
            failed_at: row.failed_at,
            due_at: row.due_at,
        })
        .collect())
}

/// Asks `tenant`'s owner to retry or clear its parked alarm `name` (None: all of them) (control
/// plane 19 on). Nobody but the tenant's owner writes its alarms (they are fenced like its
/// ledger), so this leaves a request in `pgtenant.alarm_requests` and makes the tenant due now:
/// the replica that fires its alarms (its owner, or for a tenant nobody holds the one that wakes
/// it) applies the request in a fenced transaction within about a second (its next read of
/// `pgtenant.due_alarms`). [`alarm_request_pending`] says when it was applied.
///
/// # Errors
/// [`Error::InvalidOption`] when the tenant has no parked alarm of that name (or none at all),
/// before anything changes; [`Error::Database`] otherwise (a role without
/// `pgtenant.request_alarm`: `pgtenant setup --operator-role` grants it).
pub async fn request_alarms(
    client: &impl GenericClient,
    tenant: &TenantId,
    name: Option<&str>,
    action: AlarmAction,
) -> Result<AlarmRequest> {
    let parked: Vec<String> = db::admin::parked_alarms(client, Some(tenant.key()))
        .await?
        .into_iter()
        .map(|row| row.name)
        .filter(|parked| name.is_none_or(|name| name == parked))
        .collect();
    if parked.is_empty() {
        return Err(Error::InvalidOption {
            option: "alarm name",
            reason: match name {
                Some(name) => format!(
                    "tenant {tenant} has no parked alarm named {name:?}: `pgtenant alarms failed \
                     --tenant {tenant}` lists its parked alarms"
                ),
                None => format!(
                    "tenant {tenant} has no parked alarm: nothing to {}",
                    action.as_str()
                ),
            },
        });
    }
    let id = db::admin::request_alarm(client, tenant.key(), name, action.as_str()).await?;
    Ok(AlarmRequest { id, alarms: parked })
}

/// Whether alarm request `id` ([`request_alarms`]) still waits for the tenant's owner.
pub async fn alarm_request_pending(client: &impl GenericClient, id: i64) -> Result<bool> {
    db::admin::alarm_request_pending(client, id).await
}

/// Clears a tenant's quarantine (recording `by` in the journal) so it can be opened again;
/// false when it was not quarantined. Do it after the repair the quarantine names.
pub async fn clear_quarantine(
    client: &impl GenericClient,
    id: &TenantId,
    by: &str,
) -> Result<bool> {
    db::admin::clear_quarantine(client, id, by).await
}

/// The fleet at a glance, from `pgtenant.fleet_status_rows` (control plane 10 on): one query,
/// one row. At 100 000 tenants held by 100 replicas it takes about 30 ms (docs/scale.md): one
/// pass over the tenants and one over the unswept trash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FleetStatus {
    /// Every tenant row, forgotten ones included.
    pub tenants: i64,
    /// Tenants with a live schema.
    pub live: i64,
    /// Tenants per state, as `pgtenant.lease_status` says it: `held`, `stalled`, `owner_gone`,
    /// `owner_reregistered`, `free`, `reserved`, `quarantined`, `forgotten` (every state,
    /// zeros included; on a control plane before 13, `owner_gone` counts what it called
    /// `expired`, both kinds).
    pub states: BTreeMap<String, i64>,
    /// The highest migration version of a live tenant (None without live tenants).
    pub newest_version: Option<SchemaVersion>,
    /// Live tenants, not quarantined, below `newest_version`: what a `migrate` would still do
    /// for code at that version.
    pub behind: i64,
    /// Live tenants per migration version.
    pub versions: BTreeMap<SchemaVersion, i64>,
    /// Trashed schemas the sweep has not removed yet.
    pub trashed: i64,
    /// Of those, the ones past the retention asked for: the next sweep drops them.
    pub trash_due: i64,
    /// When the oldest of them was trashed (UTC, RFC 3339).
    pub oldest_trashed_at: Option<String>,
    /// Replica rows in `pgtenant.replicas`.
    pub replicas: i64,
    /// Of those, the live ones.
    pub replicas_alive: i64,
}

impl FleetStatus {
    /// How many tenants are in `state` now.
    pub fn count(&self, state: TenantState) -> i64 {
        self.states.get(state.as_str()).copied().unwrap_or(0)
    }
}

/// The fleet in one query ([`FleetStatus`]); `retention` is the sweep's (what counts as due).
///
/// # Errors
/// [`Error::ControlPlaneOutdated`] on a control plane older than version 10 (run
/// [`setup`](crate::setup)); database errors.
pub async fn fleet_status(
    client: &impl GenericClient,
    retention: std::time::Duration,
) -> Result<FleetStatus> {
    fleet_from(db::admin::fleet_status_rows(client, retention).await?)
}

/// A [`FleetStatus`] from its row, the versions' JSON parsed.
fn fleet_from(row: db::admin::FleetRow) -> Result<FleetStatus> {
    let by_text: BTreeMap<String, i64> =
        serde_json::from_str(&row.versions_json).map_err(|error| Error::UnexpectedReply {
            context: "read pgtenant.fleet_status".to_owned(),
            detail: format!("versions is not a JSON object of counts: {error}"),
        })?;
    let mut versions = BTreeMap::new();
    for (version, count) in by_text {
        let version: SchemaVersion =
            version
                .parse()
                .map(SchemaVersion::new)
                .map_err(|_| Error::UnexpectedReply {
                    context: "read pgtenant.fleet_status".to_owned(),
                    detail: format!("versions has a key {version:?} that is not a version number"),
                })?;
        versions.insert(version, count);
    }
    Ok(FleetStatus {
        tenants: row.tenants,
        live: row.live,
        states: row.states,
        newest_version: row.newest_version,
        behind: row.behind,
        versions,
        trashed: row.trashed,
        trash_due: row.trash_due,
        oldest_trashed_at: row.oldest_trashed_at,
        replicas: row.replicas,
        replicas_alive: row.replicas_alive,
    })
}

/// One replica row as `pgtenant.replica_status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct ReplicaStatus {
    /// The replica id.
    pub replica_id: ReplicaId,
    /// Registered, lease session holding its liveness lock, heartbeat not expired: its
    /// current incarnation serves.
    pub alive: bool,
    /// Its lease session holds its liveness lock.
    pub lock_held: bool,
    /// Its current incarnation.
    pub incarnation: Incarnation,
    /// Tenants its current incarnation holds.
    pub tenants_held: i64,
    /// Milliseconds left on its heartbeat (None when it is not alive).
    pub expires_in_ms: Option<i64>,
    /// Its lease session's backend.
    pub backend_pid: Option<i32>,
    /// The host label it registered with.
    pub host: Option<String>,
    /// When its current incarnation registered (UTC, RFC 3339).
    pub started_at: Option<String>,
    /// When it deregistered (UTC, RFC 3339).
    pub released_at: Option<String>,
    /// Data sessions bound to its current incarnation (session fencing).
    pub sessions: i64,
    /// When its current incarnation was sealed (UTC, RFC 3339).
    pub sealed_at: Option<String>,
    /// One word for its current incarnation (control plane 13 on). Its tenants' states in
    /// `lease_status` say the same ([`TenantState`]).
    pub state: ReplicaState,
    /// Where its clients reach it, as its current incarnation registered
    /// ([`RouterOptions::address`](crate::RouterOptions::address); control plane 15 on).
    #[serde(default)]
    pub address: Option<String>,
}

/// [`fleet_status`] and every replica of `pgtenant.replica_status`, from one pass over the
/// tenants (`pgtenant.status_report`, control plane 10 on): what `pgtenant status` shows. At
/// 100 000 tenants reading the two views one after the other costs that pass twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StatusReport {
    /// The fleet.
    pub fleet: FleetStatus,
    /// The replicas, by id.
    pub replicas: Vec<ReplicaStatus>,
}

/// The fleet and its replicas in one query ([`StatusReport`]).
///
/// # Errors
/// [`Error::ControlPlaneOutdated`] on a control plane older than version 10; database errors.
pub async fn status_report(
    client: &impl GenericClient,
    retention: std::time::Duration,
) -> Result<StatusReport> {
    let (fleet, replicas_text) = db::admin::status_report(client, retention).await?;
    let fleet = fleet_from(fleet)?;
    let replicas =
        serde_json::from_str(&replicas_text).map_err(|error| Error::UnexpectedReply {
            context: "read pgtenant.status_report".to_owned(),
            detail: format!("its replicas are not replica_status rows: {error}"),
        })?;
    Ok(StatusReport { fleet, replicas })
}

/// What the next [`sweep`] would do, from `pgtenant.sweep_backlog_rows` (control plane 10 on):
/// one query, nothing changed. Slower than [`fleet_status`] (it reads every schema name and
/// every tenant's: 70-120 ms at 100 000 tenants, docs/scale.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SweepBacklog {
    /// Trashed schemas past the retention: the next sweep drops them.
    pub trash_due: i64,
    /// Trashed schemas within the retention: kept (restorable).
    pub trash_kept: i64,
    /// When the oldest schema due was trashed (UTC, RFC 3339).
    pub oldest_due_at: Option<String>,
    /// Tenant-shaped schemas outside the trash that no tenant names as its live schema: the
    /// sweep drops those of a forgotten epoch and reports the others as unknown. None in normal
    /// operation (a creation is one transaction).
    pub orphan_schemas: i64,
}

/// The sweep's backlog in one query ([`SweepBacklog`]) for a sweep with this retention.
///
/// # Errors
/// [`Error::ControlPlaneOutdated`] on a control plane older than version 10; database errors.
pub async fn sweep_backlog(
    client: &impl GenericClient,
    retention: std::time::Duration,
) -> Result<SweepBacklog> {
    let row = db::admin::sweep_backlog_rows(client, retention).await?;
    Ok(SweepBacklog {
        trash_due: row.trash_due,
        trash_kept: row.trash_kept,
        oldest_due_at: row.oldest_due_at,
        orphan_schemas: row.orphan_schemas,
    })
}
