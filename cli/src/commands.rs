//! The commands. Each reads the database through the library (or the control plane's views),
//! and prints through [`crate::output`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::cli::{self, Connection};
use crate::conn::{Connected, Target};
use crate::error::{explain, CliError};
use crate::output::{self, cell, out, Outcome, TenantMigrated};

/// The connection string from `--database-url` or `$DATABASE_URL`; empty counts as unset.
pub(crate) fn database_url(connection: &Connection) -> Option<String> {
    connection
        .database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .filter(|url| !url.trim().is_empty())
}

pub(crate) fn target(connection: &Connection) -> Result<Target, CliError> {
    let url = database_url(connection).ok_or(CliError::NoDatabase)?;
    Target::parse(&url, connection.connect_timeout)
}

async fn connect(connection: &Connection) -> Result<(Target, Connected), CliError> {
    let target = target(connection)?;
    let connected = target.connect().await?;
    Ok((target, connected))
}

/// Starts a router; Router::start opens the lease session and probes it with more
/// connections, and the whole start is bounded like every other connection of the command
/// (tokio-postgres' own connect_timeout bounds only their TCP connects).
pub(crate) async fn start_router(
    target: &Target,
    options: pgtenant::RouterOptions,
) -> Result<pgtenant::Router, CliError> {
    match tokio::time::timeout(target.timeout(), pgtenant::Router::start(options)).await {
        Ok(started) => Ok(started?),
        Err(_elapsed) => Err(CliError::StartTimeout {
            target: target.describe(),
            timeout: target.timeout(),
        }),
    }
}

/// What a command does to the control plane, for [`check_control_plane`].
#[derive(Debug, Clone, Copy)]
enum Access {
    Read,
    /// Changes it; the command's name, for the refusal.
    Write(&'static str),
}

/// The control plane's version, after refusing what this binary cannot do safely: nothing
/// without a control plane, and no writes to one newer than this binary or older than it (the
/// library's SQL is written for its own version; `pgtenant setup` upgrades).
async fn check_control_plane(client: &Client, access: Access) -> Result<i64, CliError> {
    let found = pgtenant::admin::control_plane_version(client).await?;
    let supported = pgtenant::admin::supported_version();
    if found == 0 {
        return Err(CliError::NoControlPlane);
    }
    match access {
        Access::Write(command) if found > supported => Err(CliError::ControlPlaneTooNew {
            found,
            supported,
            command,
        }),
        Access::Write(command) if found < supported => Err(CliError::ControlPlaneBehind {
            found,
            needed: supported,
            command,
        }),
        Access::Read if found > supported => {
            output::warn(&format!(
                "this database's control plane is at version {found}, newer than this pgtenant \
                 (version {supported}): what is shown may be incomplete; use a newer pgtenant"
            ));
            Ok(found)
        }
        _ => Ok(found),
    }
}

pub(crate) async fn setup(connection: &Connection, args: &cli::Setup) -> Result<(), CliError> {
    let (_, mut connected) = connect(connection).await?;
    let mut roles = pgtenant::admin::SetupOptions::default();
    if let Some(role) = &args.app_role {
        roles = roles.app_role(role);
    }
    if let Some(role) = &args.operator_role {
        roles = roles.operator_role(role);
    }
    let report = pgtenant::admin::setup_with(&mut connected.client, &roles).await?;
    if args.output.json {
        return output::json(&report);
    }
    if report.applied.is_empty() {
        out!("control plane is up to date (version {})", report.version)
    } else {
        out!(
            "control plane at version {}; applied {}",
            report.version,
            report.applied.join(", ")
        )
    }
}

const REPLICAS_TABLE: &str = "SELECT replica_id, alive, lock_held, incarnation, tenants_held, \
    expires_in, backend_pid, started_at::timestamp(0) AS started_at FROM pgtenant.replica_status";
/// The control-plane version that brought pgtenant.fleet_status and pgtenant.lease_rows.
const FLEET_VERSION: i64 = 10;

/// RFC 3339 in UTC, as the library's records have it.
macro_rules! utc {
    ($column:literal) => {
        concat!(
            "to_char(",
            $column,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
        )
    };
}

pub(crate) async fn status(connection: &Connection, args: &cli::Status) -> Result<(), CliError> {
    let (_, connected) = connect(connection).await?;
    status_of(&connected.client, args).await
}

/// What `pgtenant status` shows: how many tenants, how much of the trash counts as due.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusView {
    pub limit: i64,
    pub retention: std::time::Duration,
    pub json: bool,
}

impl From<&cli::Status> for StatusView {
    fn from(args: &cli::Status) -> Self {
        StatusView {
            limit: args.limit,
            retention: args.retention,
            json: args.output.json,
        }
    }
}

impl StatusView {
    /// `pgtenant status` with its defaults, as text (the demo's).
    #[cfg(feature = "demo")]
    pub(crate) fn text() -> Self {
        StatusView {
            limit: 100,
            retention: std::time::Duration::from_secs(7 * 86_400),
            json: false,
        }
    }
}

pub(crate) async fn status_of(
    client: &Client,
    view: impl Into<StatusView>,
) -> Result<(), CliError> {
    let view: StatusView = view.into();
    let version = check_control_plane(client, Access::Read).await?;
    if version < FLEET_VERSION {
        return legacy_status(client, version, view).await;
    }
    let supported = pgtenant::admin::supported_version();
    // The fleet and the replicas from one pass over the tenants (two views read one after the
    // other make it twice: 80-100 ms at 100 000 tenants on 2 cores, docs/scale.md).
    let report = pgtenant::admin::status_report(client, view.retention).await?;
    let (tenants, next_after) = first_tenants(client, view.limit).await?;
    if view.json {
        return output::json(&output::Status {
            control_plane_version: version,
            supported_version: supported,
            fleet: Some(report.fleet),
            replicas: report.replicas.iter().map(output::Replica::from).collect(),
            tenants,
            next_after,
        });
    }
    // A newer control plane was warned about by check_control_plane.
    out!("control plane version {version}\n")?;
    print_fleet(&report.fleet, view.retention)?;
    out!("replicas (pgtenant.replica_status):")?;
    let rows: Vec<Vec<String>> = report
        .replicas
        .iter()
        .map(|r| {
            vec![
                r.replica_id.to_string(),
                r.state.clone(),
                r.incarnation.to_string(),
                r.tenants_held.to_string(),
                seconds(r.expires_in_ms),
                r.sessions.to_string(),
                cell(&r.backend_pid),
                cell(&r.started_at),
            ]
        })
        .collect();
    output::table(
        &[
            "replica_id",
            "state",
            "incarnation",
            "tenants_held",
            "expires_in",
            "sessions",
            "backend_pid",
            "started_at",
        ],
        &rows,
    )?;
    if report.fleet.tenants > view.limit {
        out!(
            "\ntenants (pgtenant.lease_status), the first {} of {} by key:",
            view.limit,
            report.fleet.tenants
        )?;
    } else {
        out!("\ntenants (pgtenant.lease_status):")?;
    }
    print_tenants(&tenants)?;
    if let Some(after) = next_after {
        out!("  … more: pgtenant tenants --after {after}")?;
    }
    Ok(())
}

/// Milliseconds as a table cell: `7.1s`, empty when absent.
fn seconds(ms: Option<i64>) -> String {
    ms.map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
        .unwrap_or_default()
}

/// The first `limit` tenants by key, and the key to pass as `--after` for the rest (None when
/// there is no rest).
async fn first_tenants(
    client: &Client,
    limit: i64,
) -> Result<
    (
        Vec<pgtenant::admin::TenantRecord>,
        Option<pgtenant::TenantId>,
    ),
    CliError,
> {
    let mut query = pgtenant::admin::TenantQuery::default();
    // One more than shown says whether there is a next page.
    query.limit = limit + 1;
    let mut tenants = pgtenant::admin::list_tenants(client, &query).await?;
    let next_after = if tenants.len() as i64 > limit {
        tenants.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        tenants.last().map(|record| record.tenant.clone())
    } else {
        None
    };
    Ok((tenants, next_after))
}

/// `pgtenant status` on a control plane older than version 10: no fleet summary, the views
/// as they were.
async fn legacy_status(client: &Client, version: i64, view: StatusView) -> Result<(), CliError> {
    let supported = pgtenant::admin::supported_version();
    let (tenants, next_after) = first_tenants(client, view.limit).await?;
    if view.json {
        let replicas = client
            .query(
                concat!(
                    "SELECT replica_id, coalesce(alive, false), coalesce(lock_held, false), \
                     incarnation, tenants_held, \
                     (extract(epoch FROM expires_in) * 1000)::bigint, backend_pid, host, ",
                    utc!("started_at"),
                    ", ",
                    utc!("released_at"),
                    " FROM pgtenant.replica_status ORDER BY replica_id"
                ),
                &[],
            )
            .await
            .map_err(CliError::db("read pgtenant.replica_status"))?
            .iter()
            .map(|row| {
                Ok(output::Replica {
                    replica_id: row.try_get(0)?,
                    alive: row.try_get(1)?,
                    lock_held: row.try_get(2)?,
                    incarnation: row.try_get(3)?,
                    tenants_held: row.try_get(4)?,
                    expires_in_ms: row.try_get(5)?,
                    backend_pid: row.try_get(6)?,
                    host: row.try_get(7)?,
                    started_at: row.try_get(8)?,
                    released_at: row.try_get(9)?,
                    sessions: None,
                    sealed_at: None,
                    state: None,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(CliError::db("read pgtenant.replica_status"))?;
        return output::json(&output::Status {
            control_plane_version: version,
            supported_version: supported,
            fleet: None,
            replicas,
            tenants,
            next_after,
        });
    }
    if version < supported {
        out!(
            "control plane version {version}: this pgtenant needs {supported}, and routers refuse \
             to start until `pgtenant setup` upgrades it\n"
        )?;
    } else {
        out!("control plane version {version}\n")?;
    }
    out!(
        "fleet: pgtenant.fleet_status needs control plane version {FLEET_VERSION}: run \
         `pgtenant setup`\n"
    )?;
    out!("replicas (pgtenant.replica_status):")?;
    print_table(query_table(client, REPLICAS_TABLE).await?, None)?;
    out!("\ntenants (pgtenant.lease_status):")?;
    print_tenants(&tenants)?;
    if let Some(after) = next_after {
        out!("  … more: pgtenant tenants --after {after}")?;
    }
    Ok(())
}

/// Tenant records as `pgtenant tenants` shows them.
fn print_tenants(records: &[pgtenant::admin::TenantRecord]) -> Result<(), CliError> {
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.tenant.to_string(),
                r.state.to_string(),
                cell(&r.owner),
                cell(&r.owner_incarnation),
                r.epoch.to_string(),
                seconds(r.expires_in_ms),
                r.version.to_string(),
                cell(&r.schema),
                cell(&r.quarantine_cause),
            ]
        })
        .collect();
    output::table(
        &[
            "tenant",
            "state",
            "owner",
            "incarnation",
            "epoch",
            "expires_in",
            "version",
            "schema",
            "quarantine",
        ],
        &rows,
    )
}

/// The fleet summary: one line per question an operator asks first.
fn print_fleet(
    fleet: &pgtenant::admin::FleetStatus,
    retention: std::time::Duration,
) -> Result<(), CliError> {
    use pgtenant::TenantState;
    out!("fleet (pgtenant.fleet_status):")?;
    let states = TenantState::ALL
        .iter()
        .map(|state| format!("{} {state}", fleet.count(*state)))
        .collect::<Vec<_>>()
        .join(", ");
    out!(
        "  tenants     {} ({} live): {states}",
        fleet.tenants,
        fleet.live
    )?;
    out!("  migrations  {}", migrations_line(fleet))?;
    out!(
        "  quarantined {} (pgtenant tenants --quarantined; pgtenant clear after the repair)",
        fleet.count(TenantState::Quarantined)
    )?;
    let oldest = fleet
        .oldest_trashed_at
        .as_deref()
        .map(|at| format!(", the oldest trashed {at}"))
        .unwrap_or_default();
    out!(
        "  trash       {} schema(s) not swept yet{oldest}; {} past the {} retention, which the \
         next sweep drops (pgtenant sweep --dry-run)",
        fleet.trashed,
        fleet.trash_due,
        crate::duration::show(retention)
    )?;
    out!(
        "  replicas    {} row(s), {} alive\n",
        fleet.replicas,
        fleet.replicas_alive
    )
}

/// Where the live tenants are on their tenant migrations, in words: `pgtenant status`'s
/// "migrations" line.
fn migrations_line(fleet: &pgtenant::admin::FleetStatus) -> String {
    let Some(newest) = fleet.newest_version else {
        return "no live tenant".to_owned();
    };
    if fleet.versions.len() == 1 {
        return match newest {
            0 => format!(
                "no tenant migration has run (all {} live tenant(s) at version 0)",
                fleet.live
            ),
            newest => format!("all {} live tenant(s) at version {newest}", fleet.live),
        };
    }
    // The most common versions first; a fleet mid-rollout has two or three.
    let mut versions: Vec<(&i32, &i64)> = fleet.versions.iter().collect();
    versions.sort_by(|a, b| b.1.cmp(a.1).then(b.0.cmp(a.0)));
    let mut shown: Vec<String> = versions
        .iter()
        .take(5)
        .map(|(version, count)| format!("{count} at {version}"))
        .collect();
    if versions.len() > 5 {
        shown.push(format!("{} more versions", versions.len() - 5));
    }
    let shown = shown.join(", ");
    if fleet.behind == 0 {
        return format!(
            "every live tenant that is not quarantined is at the newest version, {newest}; live \
             tenants by version: {shown}"
        );
    }
    format!(
        "{} live tenant(s) behind the newest version, {newest} (not counting quarantined ones): \
         migrated at their next open, or by `pgtenant migrate`; live tenants by version: {shown}",
        fleet.behind
    )
}

/// A query's column names and rows, every value as text (simple_query hands them over so).
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

async fn query_table(client: &Client, sql: &str) -> Result<Table, CliError> {
    let mut table = Table {
        header: Vec::new(),
        rows: Vec::new(),
    };
    let messages = client
        .simple_query(sql)
        .await
        .map_err(CliError::db("read the control plane's views"))?;
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(columns) => {
                table.header = columns.iter().map(|c| c.name().to_owned()).collect();
            }
            SimpleQueryMessage::Row(row) => table.rows.push(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or("").to_owned())
                    .collect(),
            ),
            _ => {}
        }
    }
    Ok(table)
}

/// A table, aligned. With `page` set, the query asked for one row more than that: when it came,
/// it is not shown, and the first column of the last row shown is returned (where the next
/// page starts).
fn print_table(mut table: Table, page: Option<usize>) -> Result<Option<String>, CliError> {
    let next = match page {
        Some(shown) if table.rows.len() > shown => {
            table.rows.truncate(shown);
            table.rows.last().and_then(|row| row.first().cloned())
        }
        _ => None,
    };
    let header: Vec<&str> = table.header.iter().map(String::as_str).collect();
    output::table(&header, &table.rows)?;
    Ok(next)
}

pub(crate) async fn tenants(connection: &Connection, args: &cli::Tenants) -> Result<(), CliError> {
    let mut query = pgtenant::admin::TenantQuery::default();
    query.owner = args
        .owner
        .as_deref()
        .map(pgtenant::ReplicaId::new)
        .transpose()?;
    query.state = args.state.as_deref().map(str::parse).transpose()?;
    query.after = args.after.clone();
    query.limit = args.limit;
    query.behind = args.behind;
    query.quarantined = match (args.quarantined, args.healthy) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    let (_, connected) = connect(connection).await?;
    let client = &connected.client;
    check_control_plane(client, Access::Read).await?;
    let records = pgtenant::admin::list_tenants(client, &query).await?;
    // A full page has a next one only if a tenant follows its last: ask for one.
    let next_after = match records.last() {
        Some(last) if records.len() as i64 == query.limit => {
            let mut probe = query.clone();
            probe.after = Some(last.tenant.clone());
            probe.limit = 1;
            let more = !pgtenant::admin::list_tenants(client, &probe)
                .await?
                .is_empty();
            more.then(|| last.tenant.clone())
        }
        _ => None,
    };
    if args.output.json {
        return output::json(&output::TenantsPage {
            tenants: records,
            next_after,
        });
    }
    print_tenants(&records)?;
    if let Some(after) = next_after {
        out!("  … more: --after {after}")?;
    }
    Ok(())
}

pub(crate) async fn show(connection: &Connection, args: &cli::Show) -> Result<(), CliError> {
    let (_, connected) = connect(connection).await?;
    check_control_plane(&connected.client, Access::Read).await?;
    let record = pgtenant::admin::show_tenant(&connected.client, &args.tenant)
        .await?
        .ok_or_else(|| CliError::UnknownTenant(args.tenant.clone()))?;
    if args.output.json {
        return output::json(&record);
    }
    output::fields(&[
        ("tenant", record.tenant.to_string()),
        ("state", record.state.to_string()),
        ("created", record.created_at.clone()),
        ("schema", cell(&record.schema)),
        ("version", record.version.to_string()),
        ("owner", cell(&record.owner)),
        ("owner alive", cell(&record.owner_alive)),
        ("epoch", record.epoch.to_string()),
        ("acquired", cell(&record.acquired_at)),
        ("forgotten at epoch", record.forgotten_at_epoch.to_string()),
        ("quarantine", cell(&record.quarantine_cause)),
        ("repair", cell(&record.quarantine_repair)),
    ])
}

pub(crate) async fn trash(connection: &Connection, args: &cli::Trash) -> Result<(), CliError> {
    let (_, connected) = connect(connection).await?;
    check_control_plane(&connected.client, Access::Read).await?;
    let trash = pgtenant::admin::list_trash(&connected.client).await?;
    if args.output.json {
        return output::json(&trash);
    }
    let rows: Vec<Vec<String>> = trash
        .iter()
        .map(|t| {
            vec![
                t.schema.clone(),
                t.tenant.clone(),
                t.epoch.to_string(),
                t.trashed_at.clone(),
                cell(&t.sweep_started_at),
                cell(&t.swept_at),
            ]
        })
        .collect();
    output::table(
        &[
            "schema",
            "tenant",
            "epoch",
            "trashed",
            "sweep began",
            "swept",
        ],
        &rows,
    )
}

pub(crate) async fn sweep(connection: &Connection, args: &cli::Sweep) -> Result<(), CliError> {
    let (_, mut connected) = connect(connection).await?;
    if args.dry_run {
        check_control_plane(&connected.client, Access::Read).await?;
        let backlog = pgtenant::admin::sweep_backlog(&connected.client, args.retention).await?;
        if args.output.json {
            return output::json(&backlog);
        }
        let oldest = backlog
            .oldest_due_at
            .as_deref()
            .map(|at| format!(" (the oldest trashed {at})"))
            .unwrap_or_default();
        return out!(
            "a sweep with retention {} would drop {} trashed schema(s){oldest} and keep {} within \
             retention; {} orphan schema(s) (dropped when they belong to a forgotten epoch, else \
             reported); nothing was changed",
            crate::duration::show(args.retention),
            backlog.trash_due,
            backlog.trash_kept,
            backlog.orphan_schemas
        );
    }
    check_control_plane(&connected.client, Access::Write("sweep")).await?;
    let json = args.output.json;
    // The callback cannot return an error: keep the first and stop printing (the sweep goes on,
    // it is resumable anyway).
    let mut failed_output: Option<CliError> = None;
    let report = pgtenant::admin::sweep(
        &mut connected.client,
        &pgtenant::admin::SweepOptions::with_retention(args.retention),
        |schema, dropped| {
            if !json && failed_output.is_none() {
                if let Err(error) = out!("  {schema}: {dropped} objects dropped") {
                    failed_output = Some(error);
                }
            }
        },
    )
    .await?;
    if let Some(error) = failed_output {
        return Err(error);
    }
    if json {
        return output::json(&report);
    }
    out!(
        "swept {} schema(s) ({} masked); kept {} within retention; deferred {}; unknown {}; \
         pruned {} journal row(s)",
        report.swept.len(),
        report.masked.len(),
        report.kept,
        report.deferred.len(),
        report.unknown.len(),
        report.history_pruned
    )?;
    for (schema, why) in &report.deferred {
        out!("  deferred {schema}: {why}")?;
    }
    for schema in &report.unknown {
        out!("  unknown {schema}: no tenant accounts for it; left alone")?;
    }
    Ok(())
}

pub(crate) async fn clear(connection: &Connection, args: &cli::Clear) -> Result<(), CliError> {
    let (_, connected) = connect(connection).await?;
    check_control_plane(&connected.client, Access::Write("clear")).await?;
    let id = &args.tenant;
    let by = format!("pgtenant-cli-{}", std::process::id());
    let cleared = pgtenant::admin::clear_quarantine(&connected.client, id, &by).await?;
    if args.output.json {
        return output::json(&serde_json::json!({ "tenant": id.key(), "cleared": cleared }));
    }
    if cleared {
        out!("quarantine of {id} cleared")
    } else {
        out!("{id} was not quarantined")
    }
}

pub(crate) async fn migrate(connection: &Connection, args: &cli::Migrate) -> Result<(), CliError> {
    let dir = args.dir.display().to_string();
    let migrations =
        refinery::load_sql_migrations(&args.dir).map_err(|e| CliError::Migrations {
            dir: dir.clone(),
            reason: explain(&e),
        })?;
    let Some(target_version) = migrations.iter().map(|m| i64::from(m.version())).max() else {
        return Err(CliError::Migrations {
            dir,
            reason: "no V<n>__name.sql files".into(),
        });
    };
    let (target, connected) = connect(connection).await?;
    check_control_plane(&connected.client, Access::Write("migrate")).await?;

    let mut behind = Vec::new();
    let mut query = pgtenant::admin::TenantQuery::default();
    query.behind = Some(target_version);
    query.quarantined = Some(false);
    query.limit = 10_000;
    loop {
        let page = pgtenant::admin::list_tenants(&connected.client, &query).await?;
        let full = page.len() as i64 == query.limit;
        query.after = page.last().map(|record| record.tenant.clone());
        behind.extend(
            page.into_iter()
                .map(|r| (r.tenant.key().to_owned(), i64::from(r.version))),
        );
        if !full {
            break;
        }
    }
    let total = behind.len();
    if total == 0 {
        if args.output.json {
            return output::json(&output::MigrateReport {
                target_version,
                behind: 0,
                results: Vec::new(),
                stopped: false,
                not_attempted: Vec::new(),
            });
        }
        return out!("every tenant is at version {target_version} or past it: nothing to migrate");
    }

    let replica = args
        .replica
        .clone()
        .unwrap_or_else(|| format!("pgtenant-cli-{}", std::process::id()));
    let options = target
        .router_options(replica, &connected)?
        .migrations(refinery::Runner::new(&migrations));
    let router = Arc::new(start_router(&target, options).await?);

    let run = MigrateRun {
        router: Arc::clone(&router),
        queue: Mutex::new(behind.into()),
        failures: AtomicUsize::new(0),
        max_failures: args.max_failures as usize,
        target_version,
        total,
        done: AtomicUsize::new(0),
        results: Mutex::new(Vec::with_capacity(total)),
        json: args.output.json,
        output_error: Mutex::new(None),
    };
    let run = Arc::new(run);
    // The first tenant alone: a migration that fails everywhere stops the run at one tenant.
    run.lane_once().await;
    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let run = Arc::clone(&run);
        lanes.spawn(async move { while run.lane_once().await {} });
    }
    while lanes.join_next().await.is_some() {}
    router.close().await;

    if let Some(error) = lock(&run.output_error).take() {
        return Err(error);
    }
    let results = std::mem::take(&mut *lock(&run.results));
    let not_attempted: Vec<String> = lock(&run.queue)
        .drain(..)
        .map(|(tenant, _)| tenant)
        .collect();
    let failed = results.iter().filter(|r| r.outcome.is_failure()).count();
    let skipped = not_attempted.len();
    let stopped = skipped > 0;
    if args.output.json {
        output::json(&output::MigrateReport {
            target_version,
            behind: total,
            results,
            stopped,
            not_attempted,
        })?;
    } else {
        let count = |f: fn(&Outcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
        out!(
            "{total} tenant(s) behind: {} migrated, {} held elsewhere, {} quarantined, {} failed",
            count(|o| matches!(o, Outcome::Migrated { .. })),
            count(|o| matches!(o, Outcome::HeldElsewhere { .. })),
            count(|o| matches!(o, Outcome::Quarantined { .. })),
            count(|o| matches!(o, Outcome::Failed { .. })),
        )?;
        if stopped {
            out!(
                "stopped after {failed} failure(s) (--max-failures {}): {} tenant(s) not attempted",
                args.max_failures,
                skipped
            )?;
        }
    }
    if failed > 0 || stopped {
        return Err(CliError::MigrationsFailed {
            failed,
            not_attempted: skipped,
            total,
        });
    }
    Ok(())
}

/// One `pgtenant migrate` run, shared by its lanes.
struct MigrateRun {
    router: Arc<pgtenant::Router>,
    queue: Mutex<VecDeque<(String, i64)>>,
    failures: AtomicUsize,
    max_failures: usize,
    target_version: i64,
    total: usize,
    done: AtomicUsize,
    results: Mutex<Vec<TenantMigrated>>,
    json: bool,
    output_error: Mutex<Option<CliError>>,
}

impl MigrateRun {
    /// Migrates the next tenant; false when there is none or the run has stopped.
    async fn lane_once(&self) -> bool {
        if self.failures.load(Ordering::Acquire) >= self.max_failures {
            return false;
        }
        let Some((tenant, from)) = lock(&self.queue).pop_front() else {
            return false;
        };
        let outcome = self.migrate_one(&tenant, from).await;
        if outcome.is_failure() {
            self.failures.fetch_add(1, Ordering::AcqRel);
        }
        let done = self.done.fetch_add(1, Ordering::AcqRel) + 1;
        if !self.json {
            let printed = out!("  [{done}/{}] {tenant}: {outcome}", self.total);
            if let Err(error) = printed {
                lock(&self.output_error).get_or_insert(error);
            }
        }
        lock(&self.results).push(TenantMigrated { tenant, outcome });
        true
    }

    /// Opening a tenant that is behind migrates it under its lease (and quarantines it when a
    /// migration fails).
    async fn migrate_one(&self, tenant: &str, from: i64) -> Outcome {
        let id = match pgtenant::TenantId::parse(tenant) {
            Ok(id) => id,
            Err(error) => {
                return Outcome::Failed {
                    error: error.to_string(),
                }
            }
        };
        match self.router.open(&id).await {
            Ok(handle) => {
                // close() hands off whatever a failed release leaves.
                let _ = handle.release().await;
                Outcome::Migrated {
                    from,
                    to: self.target_version,
                }
            }
            Err(pgtenant::Error::Quarantined { cause, .. }) => Outcome::Quarantined { cause },
            Err(pgtenant::Error::LeaseHeld { owner, .. }) => Outcome::HeldElsewhere {
                owner: owner.to_string(),
            },
            Err(error) => Outcome::Failed {
                error: explain(&error),
            },
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
