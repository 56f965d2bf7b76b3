//! `pgtenant sweep`: drop the trash past its retention (or, with `--dry-run`, say what it would).

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, out};

pub(crate) async fn run(connection: &Connection, args: &cli::Sweep) -> Result<(), CliError> {
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
