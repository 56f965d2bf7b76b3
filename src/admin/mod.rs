//! The operator API (also the `pgtenant` command): setting up and granting the control
//! plane, listing tenants and the trash, clearing quarantines, and the sweep
//! (`protocol/sweep.rs`, DESIGN §5 "Sweep") that drops trashed and masked schemas.

use std::collections::BTreeMap;

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, TenantState};
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;

pub use crate::control_plane::{
    control_plane_version, setup_with, supported_version, SetupOptions, SetupReport, CONTROL_SCHEMA,
};
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
    pub owner_incarnation: Option<i64>,
    /// Milliseconds left on the owner's heartbeat, for `held` and `stalled` tenants (0 when
    /// stalled); None otherwise.
    pub expires_in_ms: Option<i64>,
    /// The live schema (None when forgotten).
    pub schema: Option<String>,
    /// The tenant's migration version.
    pub version: SchemaVersion,
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

/// The columns of a [`TenantRecord`], from `s`: `pgtenant.lease_rows` (control plane 13 on),
/// or [`V10_SOURCE`] or [`LEGACY_SOURCE`] on an older control plane.
const RECORD_COLUMNS: &str =
    "SELECT s.tenant, s.state, s.owner, s.epoch, s.owner_alive, s.schema, s.version,
        s.forgotten_at_epoch, s.quarantine_cause, s.quarantine_repair,
        to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
        to_char(s.acquired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
        s.owner_incarnation, (extract(epoch FROM s.expires_in) * 1000)::bigint";

/// `lease_rows` is `lease_status` unordered. Reading the ordered view instead costs a sort of
/// every tenant before the first row: a page of 100 took 124 ms at 100 000 tenants through
/// lease_status joined to tenants, 1.4 ms through lease_rows (V10, docs/scale.md).
const SOURCE: &str = "pgtenant.lease_rows s";

/// What [`SOURCE`] is on control planes 10 to 12, whose lease_rows has no owner_incarnation.
const V10_SOURCE: &str = "(SELECT l.*, t.owner_incarnation FROM pgtenant.lease_rows l
                           JOIN pgtenant.tenants t ON t.key = l.tenant) s";

/// What [`SOURCE`] is on a control plane older than version 10, which has no lease_rows: the
/// same columns, as slow as they were.
const LEGACY_SOURCE: &str =
    "(SELECT l.*, t.forgotten_at_epoch, t.owner_incarnation FROM pgtenant.lease_status l
       JOIN pgtenant.tenants t ON t.key = l.tenant) s";

/// The control-plane version that brought `lease_rows` and `fleet_status`.
const LEASE_ROWS_VERSION: i64 = 10;

/// Runs `sql(source)` on lease_rows, and once more on [`V10_SOURCE`] or [`LEGACY_SOURCE`]
/// when the database's control plane predates it (an operator tool newer than the database it
/// reads, during an upgrade).
async fn query_records(
    client: &impl GenericClient,
    sql: impl Fn(&str) -> String,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    match client.query(&sql(SOURCE), params).await {
        Err(error) if crate::sqlstate::of(&error) == Some(crate::sqlstate::UNDEFINED_COLUMN) => {
            client.query(&sql(V10_SOURCE), params).await
        }
        Err(error) if crate::sqlstate::of(&error) == Some(crate::sqlstate::UNDEFINED_TABLE) => {
            client.query(&sql(LEGACY_SOURCE), params).await
        }
        other => other,
    }
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
            row.try_get(12)?,
            row.try_get(13)?,
        ))
    })()
    .map_err(read)?;
    Ok(TenantRecord {
        tenant: TenantId::parse(&key)?,
        state: state_of(&state)?,
        owner: fields.0,
        epoch: Epoch::new(fields.1),
        owner_alive: fields.2,
        owner_incarnation: fields.10,
        expires_in_ms: fields.11,
        schema: fields.3,
        version: fields.4,
        forgotten_at_epoch: fields.5,
        quarantine_cause: fields.6,
        quarantine_repair: fields.7,
        created_at: fields.8,
        acquired_at: fields.9,
    })
}

/// The WHERE clause of [`list_tenants`]: only the filters given, each written so that an index
/// can serve it (a filter written `($1 IS NULL OR …)` hides it from the planner), and each
/// state also by the columns that decide it, so a rare state is found through its partial
/// index instead of a walk over every tenant. Returns the clause and the parameters' values.
fn filters(
    query: &TenantQuery,
) -> (
    String,
    Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>>,
) {
    let mut clauses: Vec<String> = Vec::new();
    let mut params: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = Vec::new();
    let mut param = |value: Box<dyn tokio_postgres::types::ToSql + Sync + Send>| {
        params.push(value);
        format!("${}", params.len())
    };
    if let Some(owner) = &query.owner {
        let p = param(Box::new(owner.clone()));
        clauses.push(format!("s.owner = {p}"));
    }
    if let Some(state) = query.state {
        let p = param(Box::new(state.as_str().to_owned()));
        clauses.push(format!("s.state = {p}"));
        // The columns each state implies (pgtenant.lease_rows' CASE), for the indexes.
        clauses.push(
            match state {
                TenantState::Forgotten => "s.schema IS NULL",
                TenantState::Quarantined => "s.quarantine_cause IS NOT NULL",
                TenantState::Free | TenantState::Reserved => "s.owner IS NULL",
                TenantState::Held
                | TenantState::Stalled
                | TenantState::OwnerGone
                | TenantState::OwnerReregistered => "s.owner IS NOT NULL",
                TenantState::Absent => "false",
            }
            .to_owned(),
        );
    }
    match query.quarantined {
        Some(true) => clauses.push("s.quarantine_cause IS NOT NULL".to_owned()),
        Some(false) => clauses.push("s.quarantine_cause IS NULL".to_owned()),
        None => {}
    }
    if let Some(behind) = query.behind {
        let p = param(Box::new(behind));
        clauses.push(format!("s.schema IS NOT NULL AND s.version < {p}"));
    }
    if let Some(after) = &query.after {
        let p = param(Box::new(after.key().to_owned()));
        clauses.push(format!("s.tenant > {p}"));
    }
    let limit = param(Box::new(query.limit));
    let clause = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (format!("{clause} ORDER BY s.tenant LIMIT {limit}"), params)
}

/// A page of tenants, by key. Invalid filters are refused before any query.
pub async fn list_tenants(
    client: &impl GenericClient,
    query: &TenantQuery,
) -> Result<Vec<TenantRecord>> {
    query.validate()?;
    let (clause, params) = filters(query);
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let rows = query_records(
        client,
        |source| format!("{RECORD_COLUMNS} FROM {source}{clause}"),
        &params,
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
    let rows = query_records(
        client,
        |source| format!("{RECORD_COLUMNS} FROM {source} WHERE s.tenant = $1"),
        &[&id.key()],
    )
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
    let rows = client
        .query(
            // sweep_started_at through the row's JSON: NULL on a control plane before 12,
            // which has no such column.
            "SELECT t.schema_name, t.tenant_key, t.epoch, t.live_name, t.schema_version,
                    to_char(t.trashed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    to_char(t.swept_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    to_char((to_jsonb(t) ->> 'sweep_started_at')::timestamptz AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
               FROM pgtenant.trash t ORDER BY t.trashed_at DESC, t.schema_name",
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
            sweep_started_at: row.get(7),
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

/// The columns of a [`FleetStatus`], in its order, of the relation `alias`: the owner states
/// as `owners` says (the states' columns of control plane 13, or its older `expired`).
fn fleet_columns(alias: &str, owners: &str) -> String {
    let a = alias;
    format!(
        "{a}.tenants, {a}.live, {a}.held, {a}.stalled, {owners}, {a}.free, {a}.reserved,
         {a}.quarantined, {a}.forgotten, {a}.newest_version, {a}.behind, {a}.versions::text,
         {a}.trashed, {a}.trash_due, {}, {a}.replicas, {a}.replicas_alive",
        utc(&format!("{a}.oldest_trashed_at"))
    )
}

/// The owner states' columns of `fleet_status_rows` (control plane 13 on).
const OWNER_STATES: &str = "f.owner_gone, f.owner_reregistered";
/// The same before control plane 13: one `expired` for both.
const OWNER_STATES_BEFORE_13: &str = "f.expired, 0::bigint";
/// The same from `status_report`'s JSON, whichever version wrote it.
const OWNER_STATES_JSON: &str =
    "coalesce(f.owner_gone, f.expired), coalesce(f.owner_reregistered, 0)";

/// The fleet in one query ([`FleetStatus`]); `retention` is the sweep's (what counts as due).
///
/// # Errors
/// [`Error::ControlPlaneOutdated`] on a control plane older than version 10 (run
/// [`setup`](crate::setup)); database errors.
pub async fn fleet_status(
    client: &impl GenericClient,
    retention: std::time::Duration,
) -> Result<FleetStatus> {
    let sql = |owners| {
        format!(
            "SELECT {} FROM pgtenant.fleet_status_rows($1) f",
            fleet_columns("f", owners)
        )
    };
    let row = match query_v10(
        client,
        &sql(OWNER_STATES),
        retention,
        "read pgtenant.fleet_status",
    )
    .await
    {
        Err(Error::Database { source, .. })
            if crate::sqlstate::of(&source) == Some(crate::sqlstate::UNDEFINED_COLUMN) =>
        {
            query_v10(
                client,
                &sql(OWNER_STATES_BEFORE_13),
                retention,
                "read pgtenant.fleet_status",
            )
            .await?
        }
        other => other?,
    };
    fleet_from(&row)
}

/// A [`FleetStatus`] from the first [`fleet_columns`] of `row`.
fn fleet_from(row: &tokio_postgres::Row) -> Result<FleetStatus> {
    let read = || Error::db("read pgtenant.fleet_status");
    let get_i64 = |i: usize| row.try_get::<_, i64>(i).map_err(read());
    let mut states = BTreeMap::new();
    for (i, state) in TenantState::ALL.iter().enumerate() {
        states.insert(state.as_str().to_owned(), get_i64(2 + i)?);
    }
    let versions_text: String = row.try_get(12).map_err(read())?;
    let by_text: BTreeMap<String, i64> =
        serde_json::from_str(&versions_text).map_err(|error| Error::UnexpectedReply {
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
        tenants: get_i64(0)?,
        live: get_i64(1)?,
        states,
        newest_version: row.try_get(10).map_err(read())?,
        behind: get_i64(11)?,
        versions,
        trashed: get_i64(13)?,
        trash_due: get_i64(14)?,
        oldest_trashed_at: row.try_get(15).map_err(read())?,
        replicas: get_i64(16)?,
        replicas_alive: get_i64(17)?,
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
    pub incarnation: i64,
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
    /// One word for its current incarnation (control plane 13 on): `alive`; `stalled` (its
    /// lease session holds the liveness lock but the heartbeat expired: a paused or starved
    /// process); `gone` (its lease session is gone: the process died or its connection was
    /// cut); `sealed` (a takeover sealed it: it registers again when it runs); `released`
    /// (closed). Its tenants' states in `lease_status` say the same ([`TenantState`]).
    pub state: String,
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
    let row = query_v10(
        client,
        &format!(
            "SELECT {fleet},
                    (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'replica_id', x.replica_id, 'alive', coalesce(x.alive, false),
                        'lock_held', coalesce(x.lock_held, false), 'incarnation', x.incarnation,
                        'tenants_held', x.tenants_held,
                        'expires_in_ms', (extract(epoch FROM x.expires_in) * 1000)::bigint,
                        'backend_pid', x.backend_pid, 'host', x.host,
                        'started_at', {started}, 'released_at', {released},
                        'sessions', x.sessions, 'sealed_at', {sealed}, 'state', x.state)
                        ORDER BY x.replica_id), '[]'::jsonb)
                       FROM jsonb_to_recordset(s.replicas) AS x(
                            replica_id text, alive boolean, lock_held boolean, incarnation bigint,
                            tenants_held bigint, expires_in interval, backend_pid integer,
                            host text, started_at timestamptz, released_at timestamptz,
                            sessions bigint, sealed_at timestamptz, state text))::text
               FROM pgtenant.status_report($1) s,
                    jsonb_to_record(s.fleet) AS f(
                        tenants bigint, live bigint, held bigint, stalled bigint,
                        owner_gone bigint, owner_reregistered bigint, expired bigint,
                        free bigint, reserved bigint, quarantined bigint, forgotten bigint,
                        newest_version integer, behind bigint, versions jsonb, trashed bigint,
                        trash_due bigint, oldest_trashed_at timestamptz, replicas bigint,
                        replicas_alive bigint)",
            fleet = fleet_columns("f", OWNER_STATES_JSON),
            started = utc("x.started_at"),
            released = utc("x.released_at"),
            sealed = utc("x.sealed_at"),
        ),
        retention,
        "read pgtenant.status_report",
    )
    .await?;
    let fleet = fleet_from(&row)?;
    let replicas_text: String = row
        .try_get(18)
        .map_err(Error::db("read pgtenant.status_report"))?;
    let replicas =
        serde_json::from_str(&replicas_text).map_err(|error| Error::UnexpectedReply {
            context: "read pgtenant.status_report".to_owned(),
            detail: format!("its replicas are not replica_status rows: {error}"),
        })?;
    Ok(StatusReport { fleet, replicas })
}

/// `column` (a timestamptz) as RFC 3339 in UTC, as every record here has it.
fn utc(column: &str) -> String {
    format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
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
    let row = query_v10(
        client,
        "SELECT trash_due, trash_kept,
                to_char(oldest_due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                orphan_schemas
           FROM pgtenant.sweep_backlog_rows($1)",
        retention,
        "read pgtenant.sweep_backlog",
    )
    .await?;
    let read = || Error::db("read pgtenant.sweep_backlog");
    Ok(SweepBacklog {
        trash_due: row.try_get(0).map_err(read())?,
        trash_kept: row.try_get(1).map_err(read())?,
        oldest_due_at: row.try_get(2).map_err(read())?,
        orphan_schemas: row.try_get(3).map_err(read())?,
    })
}

/// One row of a function control plane 10 brought, called with a retention in milliseconds;
/// on an older control plane, [`Error::ControlPlaneOutdated`].
async fn query_v10(
    client: &impl GenericClient,
    sql: &str,
    retention: std::time::Duration,
    context: &'static str,
) -> Result<tokio_postgres::Row> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    match client.query_one(sql, &[&retention_ms]).await {
        Ok(row) => Ok(row),
        Err(error)
            if matches!(
                crate::sqlstate::of(&error),
                Some(
                    crate::sqlstate::UNDEFINED_FUNCTION
                        | crate::sqlstate::UNDEFINED_TABLE
                        | crate::sqlstate::INVALID_SCHEMA_NAME
                )
            ) =>
        {
            Err(Error::ControlPlaneOutdated {
                found: crate::control_plane::read_version(client).await?,
                needed: LEASE_ROWS_VERSION,
            })
        }
        Err(error) => Err(Error::db(context)(error)),
    }
}
