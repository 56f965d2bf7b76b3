//! `pgtenant status`: the control plane's version, the fleet summary, the replicas and the first
//! tenants; on a control plane older than version 10, the views as they were.

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, cell, out, print_table, print_tenants, seconds, Table};

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

pub(crate) async fn run(connection: &Connection, args: &cli::Status) -> Result<(), CliError> {
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
                r.state.to_string(),
                r.incarnation.to_string(),
                r.tenants_held.to_string(),
                seconds(r.expires_in_ms),
                r.sessions.to_string(),
                cell(&r.backend_pid),
                cell(&r.started_at),
                cell(&r.address),
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
            "address",
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
                    address: None,
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
        return match newest.get() {
            0 => format!(
                "no tenant migration has run (all {} live tenant(s) at version 0)",
                fleet.live
            ),
            _ => format!("all {} live tenant(s) at version {newest}", fleet.live),
        };
    }
    // The most common versions first; a fleet mid-rollout has two or three.
    let mut versions: Vec<(&pgtenant::SchemaVersion, &i64)> = fleet.versions.iter().collect();
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
