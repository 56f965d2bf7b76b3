//! The command line: every command with its own options and help.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::{Args, Parser, Subcommand};

use crate::duration;

#[derive(Debug, Parser)]
#[command(
    name = "pgtenant",
    version,
    about = "Many replicas share many tenants through one PostgreSQL: inspect and run pgtenant",
    long_about = "Many replicas share many tenants through one PostgreSQL: inspect and run pgtenant.\n\n\
        Every command but `demo` works on the database of --database-url (or $DATABASE_URL), \
        a postgres:// URL or a libpq key=value string. TLS follows sslmode as psql does: \
        prefer (the default) encrypts when the server offers it without checking its \
        certificate; verify-ca and verify-full, or a root certificate (sslrootcert=FILE, \
        $PGSSLROOTCERT), check it.",
    after_help = "Examples:\n  \
        pgtenant setup --database-url postgres://postgres@127.0.0.1/app\n  \
        pgtenant status --json\n  \
        pgtenant tenants --quarantined\n  \
        pgtenant sweep --retention 3d\n  \
        pgtenant migrate --dir migrations/tenant",
    propagate_version = true
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: Command,
}

/// How to reach the database; accepted before or after the command.
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// The database: postgres://user:password@host:port/database?sslmode=… or
    /// "host=… dbname=…" [default: $DATABASE_URL; an empty one counts as unset]
    #[arg(long, global = true, value_name = "URL", help_heading = "Connection")]
    pub database_url: Option<String>,

    /// Bound on opening each connection, end to end: TCP connect, TLS, startup and
    /// authentication [default: the URL's connect_timeout, else 10s]
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration::connect_timeout, help_heading = "Connection")]
    pub connect_timeout: Option<Duration>,
}

#[derive(Debug, Args)]
pub(crate) struct Json {
    /// Machine-readable output (snake_case fields, RFC 3339 UTC timestamps)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create or upgrade the control plane (schema pgtenant); idempotent, safe to run from many
    /// processes at once
    Setup(Setup),
    /// The fleet, its replicas and the first tenants at a glance, from the views
    /// pgtenant.fleet_status, pgtenant.replica_status and pgtenant.lease_status
    Status(Status),
    /// List tenants, a page at a time, with filters
    Tenants(Tenants),
    /// One tenant's record
    Show(Show),
    /// Trashed schemas (forgotten tenants' data, restorable until swept)
    Trash(Trash),
    /// Tenants with alarms: owner, next due, pending and failed, from the view pgtenant.alarms
    Alarms(Alarms),
    /// Drop trashed schemas past retention, and schemas of forgotten epochs
    Sweep(Sweep),
    /// Bring every tenant up to a directory of SQL migrations (V<n>__name.sql)
    Migrate(Migrate),
    /// Clear a tenant's quarantine, after repairing what it names
    Clear(Clear),
    /// Show pgtenant working: three replicas, fenced writes, a handoff, a crash, takeovers.
    /// Without --database-url it starts a throwaway PostgreSQL from this machine's initdb
    #[cfg(feature = "demo")]
    Demo,
    /// Not in this build (see its message)
    #[cfg(not(feature = "demo"))]
    #[command(hide = true)]
    Demo,
}

#[derive(Debug, Args)]
pub(crate) struct Setup {
    /// The application's role: gets only the protocol functions, SELECT on what the fence and
    /// the status views read, and CREATE on the database for tenant schemas, never write
    /// access to a control-plane table (the role must exist)
    #[arg(long, value_name = "ROLE")]
    pub app_role: Option<String>,
    /// The operators' role: SELECT on the control plane and the operator functions (clear,
    /// sweep bookkeeping, pruning); to drop tenant schemas it must also be a member of the
    /// application's role
    #[arg(long, value_name = "ROLE")]
    pub operator_role: Option<String>,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "The fleet summary is pgtenant.fleet_status (control plane 10 on): tenants per \
    state, migration versions, the trash and the sweep's backlog, in one query. Tenants are \
    listed a page at a time, by key: `pgtenant tenants --after` shows the rest."
)]
pub(crate) struct Status {
    /// Tenants listed (the first ones by key)
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub limit: i64,
    /// The sweep's retention, for how much of the trash is due (as `pgtenant sweep
    /// --retention`), e.g. 7d, 12h, 0s
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = duration::retention)]
    pub retention: Duration,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Filters combine with AND. Pages go by tenant key: when there is more, \
    the output ends with the --after to pass for the next page (in JSON: next_after)."
)]
pub(crate) struct Tenants {
    /// Only tenants held by this replica
    #[arg(long, value_name = "REPLICA")]
    pub owner: Option<String>,
    /// Only tenants in this state
    #[arg(long, value_parser = PossibleValuesParser::new(pgtenant::TenantState::ALL.map(pgtenant::TenantState::as_str)))]
    pub state: Option<String>,
    /// Only quarantined tenants
    #[arg(long, conflicts_with = "healthy")]
    pub quarantined: bool,
    /// Only tenants that are not quarantined
    #[arg(long)]
    pub healthy: bool,
    /// Only live tenants whose schema is below this migration version
    #[arg(long, value_name = "VERSION", value_parser = clap::value_parser!(i32).range(0..))]
    pub behind: Option<i32>,
    /// The page after this tenant
    #[arg(long, value_name = "ORG/LEDGER", value_parser = tenant_id)]
    pub after: Option<pgtenant::TenantId>,
    /// Page size
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub limit: i64,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
pub(crate) struct Show {
    /// The tenant
    #[arg(value_name = "ORG/LEDGER", value_parser = tenant_id)]
    pub tenant: pgtenant::TenantId,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
pub(crate) struct Trash {
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "The alarms themselves are in each tenant's schema, table pgtenant_alarms \
    (name, due_at, payload, attempts, last_error, failed_at): SELECT * FROM \
    <schema>.pgtenant_alarms, the schema from `pgtenant show ORG/LEDGER`."
)]
pub(crate) struct Alarms {
    #[command(subcommand)]
    pub action: Option<AlarmsAction>,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AlarmsAction {
    /// Parked alarms (their last attempt failed), with their last error, from each tenant's
    /// table
    Failed(AlarmsFailed),
    /// Make a tenant's parked alarms pending again, due now, attempts from 0 (applied by the
    /// tenant's owner in a fenced transaction)
    Retry(AlarmsChange),
    /// Delete a tenant's parked alarms (applied by the tenant's owner in a fenced transaction)
    Clear(AlarmsChange),
}

#[derive(Debug, Args)]
pub(crate) struct AlarmsFailed {
    /// Only this tenant's
    #[arg(long, value_name = "ORG/LEDGER", value_parser = tenant_id)]
    pub tenant: Option<pgtenant::TenantId>,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Only the tenant's owner writes its alarms (they are fenced like its ledger): \
    this leaves a request in pgtenant.alarm_requests, which the replica firing the tenant's \
    alarms (its owner, or the one that wakes a tenant nobody holds) applies within about a \
    second. A request not applied within --wait stays and is applied when such a replica runs."
)]
pub(crate) struct AlarmsChange {
    /// The tenant
    #[arg(value_name = "ORG/LEDGER", value_parser = tenant_id)]
    pub tenant: pgtenant::TenantId,
    /// The parked alarm's name
    #[arg(
        value_name = "NAME",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub name: Option<String>,
    /// Every parked alarm of the tenant
    #[arg(long)]
    pub all: bool,
    /// How long to wait for the request to be applied (0s: do not wait)
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::wait)]
    pub wait: Duration,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Never touches a live schema. Drops object by object in small \
    transactions, so a schema of thousands of tables fits PostgreSQL's lock table; a schema \
    in use is deferred to the next sweep. Also prunes journal rows older than 30 days."
)]
pub(crate) struct Sweep {
    /// Keep trashed schemas younger than this (they can still be restored), e.g. 7d, 12h, 0s
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = duration::retention)]
    pub retention: Duration,
    /// Drop nothing: show what a sweep with this retention would do now (trashed schemas due
    /// and kept, orphan schemas), from the view pgtenant.sweep_backlog
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Tenants are migrated under their lease, as a replica would at open: a \
    tenant held by another live replica is left to it. A failing migration quarantines its \
    tenant. The first tenant runs alone, and the run stops once --max-failures tenants failed, \
    so a broken migration quarantines one tenant, not all of them."
)]
pub(crate) struct Migrate {
    /// The tenant migrations: SQL files named V<n>__name.sql
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Tenants migrated at once
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub concurrency: u16,
    /// Stop starting tenants after this many failed or were quarantined
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_failures: u32,
    /// The replica id this run registers as [default: pgtenant-cli-<pid>]
    #[arg(long, value_name = "ID")]
    pub replica: Option<String>,
    #[command(flatten)]
    pub output: Json,
}

#[derive(Debug, Args)]
pub(crate) struct Clear {
    /// The tenant
    #[arg(value_name = "ORG/LEDGER", value_parser = tenant_id)]
    pub tenant: pgtenant::TenantId,
    #[command(flatten)]
    pub output: Json,
}

fn tenant_id(text: &str) -> Result<pgtenant::TenantId, pgtenant::Error> {
    pgtenant::TenantId::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
