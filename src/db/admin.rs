//! The operators' reads and calls (DESIGN §6): lease and replica status, the trash, the fleet
//! and status reports, the sweep backlog, clearing quarantines.
//!
//! The operator tool may be newer than the database it reads (during an upgrade): the reads
//! fall back to what an older control plane has, or say it is too old
//! ([`Error::ControlPlaneOutdated`]).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row};

use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, Incarnation, TenantState};
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;

/// The columns of a [`LeaseRow`], from `s`: `pgtenant.lease_rows` (control plane 13 on),
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

/// Which lease rows [`lease_rows`] reads: filters combine with AND; a page by key.
pub(crate) struct LeaseFilter<'a> {
    pub(crate) owner: Option<&'a ReplicaId>,
    pub(crate) state: Option<TenantState>,
    pub(crate) quarantined: Option<bool>,
    /// Live tenants whose migration version is below this one.
    pub(crate) behind: Option<SchemaVersion>,
    /// The page after this tenant.
    pub(crate) after: Option<&'a TenantId>,
    pub(crate) limit: i64,
}

/// The WHERE clause of [`lease_rows`]: only the filters given, each written so that an index
/// can serve it (a filter written `($1 IS NULL OR …)` hides it from the planner), and each
/// state also by the columns that decide it, so a rare state is found through its partial
/// index instead of a walk over every tenant. Returns the clause and the parameters' values.
fn filters(query: &LeaseFilter<'_>) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let mut clauses: Vec<String> = Vec::new();
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    let mut param = |value: Box<dyn ToSql + Sync + Send>| {
        params.push(value);
        format!("${}", params.len())
    };
    if let Some(owner) = query.owner {
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
    if let Some(after) = query.after {
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

/// A page of lease rows, by tenant key, read with [`lease_row`]. The driver's error is
/// returned as is: the caller says what it was doing.
pub(crate) async fn lease_rows(
    client: &impl GenericClient,
    filter: &LeaseFilter<'_>,
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    let (clause, params) = filters(filter);
    let params: Vec<&(dyn ToSql + Sync)> = params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect();
    query_lease_rows(client, &clause, &params).await
}

/// One tenant's lease row (none when the control plane has never seen it), read with
/// [`lease_row`]. The driver's error is returned as is, as by [`lease_rows`].
pub(crate) async fn lease_rows_of(
    client: &impl GenericClient,
    id: &TenantId,
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    query_lease_rows(client, " WHERE s.tenant = $1", &[&id.key()]).await
}

/// The lease rows that `clause` (a WHERE, ORDER BY and LIMIT over `s`, whose parameters are
/// `params`) selects. On lease_rows, and once more on [`V10_SOURCE`] or [`LEGACY_SOURCE`] when
/// the database's control plane predates it (an operator tool newer than the database it
/// reads, during an upgrade).
async fn query_lease_rows(
    client: &impl GenericClient,
    clause: &str,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    let sql = |source: &str| format!("{RECORD_COLUMNS} FROM {source}{clause}");
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

/// One row of [`lease_rows`], its columns typed; the tenant key and state still as text, for
/// the caller to parse.
pub(crate) struct LeaseRow {
    pub(crate) tenant: String,
    pub(crate) state: String,
    pub(crate) owner: Option<ReplicaId>,
    pub(crate) epoch: Epoch,
    pub(crate) owner_alive: Option<bool>,
    pub(crate) schema: Option<String>,
    pub(crate) version: SchemaVersion,
    pub(crate) forgotten_at_epoch: Epoch,
    pub(crate) quarantine_cause: Option<String>,
    pub(crate) quarantine_repair: Option<String>,
    pub(crate) created_at: String,
    pub(crate) acquired_at: Option<String>,
    pub(crate) owner_incarnation: Option<Incarnation>,
    pub(crate) expires_in_ms: Option<i64>,
}

/// Reads one row of [`lease_rows`] (its column order is [`RECORD_COLUMNS`]'s, known here only).
pub(crate) fn lease_row(row: &Row) -> Result<LeaseRow> {
    let read = Error::db("read a tenant record");
    let tenant: String = row.try_get(0).map_err(Error::db("read a tenant record"))?;
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
    Ok(LeaseRow {
        tenant,
        state,
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
        owner_incarnation: fields.10,
        expires_in_ms: fields.11,
    })
}

/// One row of `pgtenant.trash`, timestamps as RFC 3339 in UTC.
pub(crate) struct TrashRow {
    pub(crate) schema: String,
    pub(crate) tenant: String,
    pub(crate) epoch: Epoch,
    pub(crate) live_name: String,
    pub(crate) version: SchemaVersion,
    pub(crate) trashed_at: String,
    pub(crate) sweep_started_at: Option<String>,
    pub(crate) swept_at: Option<String>,
}

/// Everything in the trash, newest first, on any control-plane version.
pub(crate) async fn trash(client: &impl GenericClient) -> Result<Vec<TrashRow>> {
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
        .map(|row| TrashRow {
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

/// One row of `pgtenant.alarms` (control plane 18 on), timestamps as RFC 3339 in UTC.
pub(crate) struct AlarmRow {
    pub(crate) tenant: String,
    pub(crate) owner: Option<String>,
    pub(crate) next_due: Option<String>,
    pub(crate) pending: i32,
    pub(crate) failed: i32,
    pub(crate) updated_at: String,
}

/// Every tenant with alarms (`pgtenant.alarms`), the next due first, then those with only
/// failed ones.
pub(crate) async fn alarms(client: &impl GenericClient) -> Result<Vec<AlarmRow>> {
    let rows = client
        .query(
            "SELECT a.tenant, a.owner,
                    to_char(a.next_due AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    a.pending, a.failed,
                    to_char(a.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
               FROM pgtenant.alarms a ORDER BY a.next_due NULLS LAST, a.tenant",
            &[],
        )
        .await
        .map_err(Error::db("list the tenants' alarms"))?;
    Ok(rows
        .iter()
        .map(|row| AlarmRow {
            tenant: row.get(0),
            owner: row.get(1),
            next_due: row.get(2),
            pending: row.get(3),
            failed: row.get(4),
            updated_at: row.get(5),
        })
        .collect())
}

/// `pgtenant.clear_quarantine`, recording `by` in the journal: false when the tenant was not
/// quarantined.
pub(crate) async fn clear_quarantine(
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

/// The fleet's counts as `fleet_status_rows` (or `status_report`'s fleet) gives them; the
/// versions still as their JSON text, for the caller to parse.
pub(crate) struct FleetRow {
    pub(crate) tenants: i64,
    pub(crate) live: i64,
    /// Per [`TenantState`], by its name, every state.
    pub(crate) states: BTreeMap<String, i64>,
    pub(crate) versions_json: String,
    pub(crate) newest_version: Option<SchemaVersion>,
    pub(crate) behind: i64,
    pub(crate) trashed: i64,
    pub(crate) trash_due: i64,
    pub(crate) oldest_trashed_at: Option<String>,
    pub(crate) replicas: i64,
    pub(crate) replicas_alive: i64,
}

/// The columns of a [`FleetRow`], in [`fleet_row`]'s order, of the relation `alias`: the owner
/// states as `owners` says (the states' columns of control plane 13, or its older `expired`).
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

/// `pgtenant.fleet_status_rows` with this retention (what counts as due): one row, one pass
/// over the tenants. Before control plane 13 its one `expired` is read as `owner_gone`.
pub(crate) async fn fleet_status_rows(
    client: &impl GenericClient,
    retention: Duration,
) -> Result<FleetRow> {
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
    fleet_row(&row)
}

/// A [`FleetRow`] from the first [`fleet_columns`] of `row`.
fn fleet_row(row: &Row) -> Result<FleetRow> {
    let read = || Error::db("read pgtenant.fleet_status");
    let get_i64 = |i: usize| row.try_get::<_, i64>(i).map_err(read());
    let mut states = BTreeMap::new();
    for (i, state) in TenantState::ALL.iter().enumerate() {
        states.insert(state.as_str().to_owned(), get_i64(2 + i)?);
    }
    let versions_json = row.try_get(12).map_err(read())?;
    Ok(FleetRow {
        tenants: get_i64(0)?,
        live: get_i64(1)?,
        states,
        versions_json,
        newest_version: row.try_get(10).map_err(read())?,
        behind: get_i64(11)?,
        trashed: get_i64(13)?,
        trash_due: get_i64(14)?,
        oldest_trashed_at: row.try_get(15).map_err(read())?,
        replicas: get_i64(16)?,
        replicas_alive: get_i64(17)?,
    })
}

/// `pgtenant.status_report` with this retention: the fleet and every replica of
/// `replica_status` from one pass over the tenants. The replicas come as a JSON array of
/// objects named like `replica_status`'s columns (timestamps as RFC 3339 in UTC, `expires_in`
/// as `expires_in_ms`), by replica id, for the caller to parse.
pub(crate) async fn status_report(
    client: &impl GenericClient,
    retention: Duration,
) -> Result<(FleetRow, String)> {
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
                        'sessions', x.sessions, 'sealed_at', {sealed}, 'state', x.state,
                        'address', x.address)
                        ORDER BY x.replica_id), '[]'::jsonb)
                       FROM jsonb_to_recordset(s.replicas) AS x(
                            replica_id text, alive boolean, lock_held boolean, incarnation bigint,
                            tenants_held bigint, expires_in interval, backend_pid integer,
                            host text, started_at timestamptz, released_at timestamptz,
                            sessions bigint, sealed_at timestamptz, state text,
                            address text))::text
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
    let fleet = fleet_row(&row)?;
    let replicas_json: String = row
        .try_get(18)
        .map_err(Error::db("read pgtenant.status_report"))?;
    Ok((fleet, replicas_json))
}

/// `column` (a timestamptz) as RFC 3339 in UTC, as every record here has it.
fn utc(column: &str) -> String {
    format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
}

/// The sweep's backlog as `pgtenant.sweep_backlog_rows` counts it for this retention.
pub(crate) struct SweepBacklogRow {
    pub(crate) trash_due: i64,
    pub(crate) trash_kept: i64,
    pub(crate) oldest_due_at: Option<String>,
    pub(crate) orphan_schemas: i64,
}

/// `pgtenant.sweep_backlog_rows`: what the next sweep with this retention would do, one
/// query, nothing changed.
pub(crate) async fn sweep_backlog_rows(
    client: &impl GenericClient,
    retention: Duration,
) -> Result<SweepBacklogRow> {
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
    Ok(SweepBacklogRow {
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
    retention: Duration,
    context: &'static str,
) -> Result<Row> {
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
                found: crate::db::setup::read_version(client).await?,
                needed: LEASE_ROWS_VERSION,
            })
        }
        Err(error) => Err(Error::db(context)(error)),
    }
}

/// One parked alarm, from `pgtenant.parked_alarms` (control plane 19 on), timestamps as
/// RFC 3339 in UTC.
pub(crate) struct ParkedAlarmRow {
    pub(crate) tenant: String,
    pub(crate) name: String,
    pub(crate) id: i64,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) failed_at: Option<String>,
    pub(crate) due_at: Option<String>,
}

/// The parked alarms of tenant `key`, or of every tenant whose hint counts failed ones
/// (`pgtenant.parked_alarms`, which reads the tenants' tables for a role that cannot).
pub(crate) async fn parked_alarms(
    client: &impl GenericClient,
    key: Option<&str>,
) -> Result<Vec<ParkedAlarmRow>> {
    let rows = client
        .query(
            "SELECT p.tenant, p.name, p.id, p.attempts, p.last_error,
                    to_char(p.failed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    to_char(p.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
               FROM pgtenant.parked_alarms($1) p",
            &[&key],
        )
        .await
        .map_err(Error::db("list the parked alarms"))?;
    Ok(rows
        .iter()
        .map(|row| ParkedAlarmRow {
            tenant: row.get(0),
            name: row.get(1),
            id: row.get(2),
            attempts: row.get(3),
            last_error: row.get(4),
            failed_at: row.get(5),
            due_at: row.get(6),
        })
        .collect())
}

/// `pgtenant.request_alarm` (control plane 19 on): the request's id.
pub(crate) async fn request_alarm(
    client: &impl GenericClient,
    key: &str,
    name: Option<&str>,
    action: &str,
) -> Result<i64> {
    let row = client
        .query_one(
            "SELECT pgtenant.request_alarm($1, $2, $3)",
            &[&key, &name, &action],
        )
        .await
        .map_err(Error::db("request an alarm action"))?;
    Ok(row.get(0))
}

/// Whether alarm request `id` is still waiting for the tenant's owner.
pub(crate) async fn alarm_request_pending(client: &impl GenericClient, id: i64) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pgtenant.alarm_requests WHERE id = $1)",
            &[&id],
        )
        .await
        .map_err(Error::db("read an alarm request"))?;
    Ok(row.get(0))
}
