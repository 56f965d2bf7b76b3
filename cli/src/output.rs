//! Everything the command prints: lines, aligned tables and JSON, on stdout, returning write
//! errors instead of panicking (`pgtenant status | head -1` closes the pipe early: the command
//! then stops quietly), and warnings on stderr.
//!
//! JSON conventions, the same in every command: snake_case field names, timestamps as RFC 3339
//! in UTC (`2025-01-31T12:00:00Z`), durations as whole milliseconds in fields ending in `_ms`.

use std::io::Write;

use serde::Serialize;

use crate::error::CliError;

/// Prints one line on stdout.
pub(crate) fn line(text: impl std::fmt::Display) -> Result<(), CliError> {
    writeln!(std::io::stdout().lock(), "{text}")?;
    Ok(())
}

/// `println!` that returns the write error: `out!("{x}")?`.
macro_rules! out {
    () => { $crate::output::line("") };
    ($($arg:tt)*) => { $crate::output::line(format_args!($($arg)*)) };
}
pub(crate) use out;

/// A warning on stderr; one that cannot be written is dropped (there is nowhere to say so).
pub(crate) fn warn(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "warning: {text}");
}

/// `value` as pretty JSON on stdout.
pub(crate) fn json(value: &impl Serialize) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value).map_err(|e| {
        if e.is_io() {
            CliError::Output(e.into())
        } else {
            CliError::Json(e)
        }
    })?;
    writeln!(stdout)?;
    Ok(())
}

/// Rows as an aligned text table, indented by two spaces; `(none)` when there are none.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> Result<(), CliError> {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .filter_map(|row| row.get(i))
                .map(|cell| cell.chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let render = |cells: &mut dyn Iterator<Item = &str>| {
        cells
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    out!("  {}", render(&mut header.iter().copied()))?;
    for row in rows {
        out!("  {}", render(&mut row.iter().map(String::as_str)))?;
    }
    if rows.is_empty() {
        out!("  (none)")?;
    }
    Ok(())
}

/// `label: value` lines, labels right-aligned.
pub(crate) fn fields(fields: &[(&str, String)]) -> Result<(), CliError> {
    let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, value) in fields {
        out!("{name:>width$}: {value}")?;
    }
    Ok(())
}

/// An optional value as a table cell: empty when absent.
pub(crate) fn cell(value: &Option<impl ToString>) -> String {
    value.as_ref().map(ToString::to_string).unwrap_or_default()
}

/// Milliseconds as a table cell: `7.1s`, empty when absent.
pub(crate) fn seconds(ms: Option<i64>) -> String {
    ms.map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
        .unwrap_or_default()
}

/// A query's column names and rows, every value as text (simple_query hands them over so).
pub(crate) struct Table {
    pub(crate) header: Vec<String>,
    pub(crate) rows: Vec<Vec<String>>,
}

/// A table, aligned. With `page` set, the query asked for one row more than that: when it came,
/// it is not shown, and the first column of the last row shown is returned (where the next
/// page starts).
pub(crate) fn print_table(
    mut table: Table,
    page: Option<usize>,
) -> Result<Option<String>, CliError> {
    let next = match page {
        Some(shown) if table.rows.len() > shown => {
            table.rows.truncate(shown);
            table.rows.last().and_then(|row| row.first().cloned())
        }
        _ => None,
    };
    let header: Vec<&str> = table.header.iter().map(String::as_str).collect();
    self::table(&header, &table.rows)?;
    Ok(next)
}

/// Tenant records as `pgtenant tenants` shows them.
pub(crate) fn print_tenants(records: &[pgtenant::admin::TenantRecord]) -> Result<(), CliError> {
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
    table(
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

/// `pgtenant status --json`.
#[derive(Debug, Serialize)]
pub(crate) struct Status {
    pub control_plane_version: i64,
    /// The newest control-plane version this pgtenant knows.
    pub supported_version: i64,
    /// `pgtenant.fleet_status`; null on a control plane older than version 10.
    pub fleet: Option<pgtenant::admin::FleetStatus>,
    pub replicas: Vec<Replica>,
    /// The first `--limit` tenants by key, the same records as `pgtenant tenants --json`.
    pub tenants: Vec<pgtenant::admin::TenantRecord>,
    /// Pass as `pgtenant tenants --after` for the rest; null when every tenant is above.
    pub next_after: Option<pgtenant::TenantId>,
}

/// One row of `pgtenant.replica_status`.
#[derive(Debug, Serialize)]
pub(crate) struct Replica {
    pub replica_id: String,
    pub alive: bool,
    pub lock_held: bool,
    pub incarnation: i64,
    pub tenants_held: i64,
    /// Time left on its heartbeat (negative: expired that long ago).
    pub expires_in_ms: Option<i64>,
    pub backend_pid: Option<i32>,
    pub host: Option<String>,
    pub started_at: Option<String>,
    pub released_at: Option<String>,
    /// Data sessions bound to its incarnation; null before control plane 10.
    pub sessions: Option<i64>,
    /// When its incarnation was sealed; null before control plane 10.
    pub sealed_at: Option<String>,
    /// One word for its current incarnation (`alive`, `stalled`, `gone`, `sealed`,
    /// `released`; read as these from an older control plane's `expired` and `lease session
    /// gone`); null before control plane 10.
    pub state: Option<String>,
    /// Where its clients reach it (`RouterOptions::address`); null when it registered none,
    /// and before control plane 15.
    pub address: Option<String>,
}

impl From<&pgtenant::admin::ReplicaStatus> for Replica {
    fn from(r: &pgtenant::admin::ReplicaStatus) -> Self {
        Replica {
            replica_id: r.replica_id.to_string(),
            alive: r.alive,
            lock_held: r.lock_held,
            incarnation: r.incarnation.get(),
            tenants_held: r.tenants_held,
            expires_in_ms: r.expires_in_ms,
            backend_pid: r.backend_pid,
            host: r.host.clone(),
            started_at: r.started_at.clone(),
            released_at: r.released_at.clone(),
            sessions: Some(r.sessions),
            sealed_at: r.sealed_at.clone(),
            state: Some(r.state.to_string()),
            address: r.address.clone(),
        }
    }
}

/// `pgtenant tenants --json`: a page, and where the next one starts.
#[derive(Debug, Serialize)]
pub(crate) struct TenantsPage {
    pub tenants: Vec<pgtenant::admin::TenantRecord>,
    /// Pass as `--after` for the next page; null on the last page.
    pub next_after: Option<pgtenant::TenantId>,
}

/// `pgtenant migrate --json`.
#[derive(Debug, Serialize)]
pub(crate) struct MigrateReport {
    /// The version the migrations bring a tenant to.
    pub target_version: pgtenant::SchemaVersion,
    /// Tenants that were behind when the run began.
    pub behind: usize,
    pub results: Vec<TenantMigrated>,
    /// True when the run stopped at `--max-failures`.
    pub stopped: bool,
    /// Tenants left as they were because the run stopped.
    pub not_attempted: Vec<String>,
}

/// One tenant's result in `pgtenant migrate`.
#[derive(Debug, Serialize)]
pub(crate) struct TenantMigrated {
    pub tenant: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What `pgtenant migrate` did to one tenant.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// Now at the migrations' version.
    Migrated {
        from: pgtenant::SchemaVersion,
        to: pgtenant::SchemaVersion,
    },
    /// Another live replica holds it: it migrates the tenant at its next open.
    HeldElsewhere { owner: String },
    /// A migration failed: the tenant is quarantined until `pgtenant clear`.
    Quarantined { cause: String },
    /// Something else failed (the database, a lease): nothing changed; retry later.
    Failed { error: String },
}

impl Outcome {
    pub(crate) fn is_failure(&self) -> bool {
        matches!(self, Outcome::Quarantined { .. } | Outcome::Failed { .. })
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Migrated { from, to } => write!(f, "migrated from version {from} to {to}"),
            Outcome::HeldElsewhere { owner } => write!(
                f,
                "held by live replica {owner}: not migrated behind its back (it migrates the \
                 tenant at its next open once it runs these migrations)"
            ),
            Outcome::Quarantined { cause } => write!(f, "QUARANTINED: {cause}"),
            Outcome::Failed { error } => write!(f, "FAILED: {error}"),
        }
    }
}
