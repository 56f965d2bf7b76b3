//! `pgtenant alarms`: the tenants with alarms (DESIGN §5 "Alarms"), from `pgtenant.alarms`;
//! `alarms failed`, the parked ones from each tenant's table; `alarms retry|clear`, an
//! operator's request that the tenant's owner applies under its lease.

use std::time::{Duration, Instant};

use pgtenant::admin::AlarmAction;

use crate::cli::{self, AlarmsAction, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, cell, out};

/// The first control-plane version with alarms.
const ALARMS_SINCE: i64 = 18;
/// The first that lists parked alarms (`pgtenant.parked_alarms`).
const PARKED_SINCE: i64 = 19;
/// How often a waiting retry or clear looks whether its request was applied.
const WAIT_STEP: Duration = Duration::from_millis(100);

pub(crate) async fn run(connection: &Connection, args: &cli::Alarms) -> Result<(), CliError> {
    match &args.action {
        None => list(connection, args).await,
        Some(AlarmsAction::Failed(failed)) => list_failed(connection, failed).await,
        Some(AlarmsAction::Retry(change)) => request(connection, change, AlarmAction::Retry).await,
        Some(AlarmsAction::Clear(change)) => request(connection, change, AlarmAction::Clear).await,
    }
}

fn before_alarms(version: i64) {
    output::warn(&format!(
        "this database's control plane is at version {version}, before alarms \
         ({ALARMS_SINCE}): no tenant has any; `pgtenant setup` upgrades it"
    ));
}

async fn list(connection: &Connection, args: &cli::Alarms) -> Result<(), CliError> {
    let (_, connected) = connect(connection).await?;
    let version = check_control_plane(&connected.client, Access::Read).await?;
    let alarms = if version < ALARMS_SINCE {
        before_alarms(version);
        Vec::new()
    } else {
        pgtenant::admin::list_alarms(&connected.client).await?
    };
    if args.output.json {
        return output::json(&alarms);
    }
    let rows: Vec<Vec<String>> = alarms
        .iter()
        .map(|a| {
            vec![
                a.tenant.clone(),
                cell(&a.owner),
                cell(&a.next_due),
                a.pending.to_string(),
                a.failed.to_string(),
            ]
        })
        .collect();
    output::table(&["tenant", "owner", "next due", "pending", "failed"], &rows)
}

async fn list_failed(connection: &Connection, args: &cli::AlarmsFailed) -> Result<(), CliError> {
    let (_, connected) = connect(connection).await?;
    let version = check_control_plane(&connected.client, Access::Read).await?;
    let parked = if version < ALARMS_SINCE {
        before_alarms(version);
        Vec::new()
    } else if version < PARKED_SINCE {
        return Err(CliError::ControlPlaneBehind {
            found: version,
            needed: PARKED_SINCE,
            command: "alarms failed",
        });
    } else {
        pgtenant::admin::parked_alarms(&connected.client, args.tenant.as_ref()).await?
    };
    if args.output.json {
        return output::json(&parked);
    }
    let rows: Vec<Vec<String>> = parked
        .iter()
        .map(|a| {
            vec![
                a.tenant.clone(),
                a.name.clone(),
                a.attempts.to_string(),
                cell(&a.failed_at),
                cell(&a.last_error),
            ]
        })
        .collect();
    output::table(
        &["tenant", "alarm", "attempts", "parked at", "last error"],
        &rows,
    )
}

async fn request(
    connection: &Connection,
    args: &cli::AlarmsChange,
    action: AlarmAction,
) -> Result<(), CliError> {
    let command = match action {
        AlarmAction::Retry => "alarms retry",
        AlarmAction::Clear => "alarms clear",
    };
    let (_, connected) = connect(connection).await?;
    // A write: refused on a control plane older than this pgtenant (so before requests, 19).
    check_control_plane(&connected.client, Access::Write(command)).await?;
    let client = &connected.client;
    let requested =
        pgtenant::admin::request_alarms(client, &args.tenant, args.name.as_deref(), action).await?;
    let deadline = Instant::now() + args.wait;
    let mut applied = false;
    while !args.wait.is_zero() {
        if !pgtenant::admin::alarm_request_pending(client, requested.id).await? {
            applied = true;
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(WAIT_STEP).await;
    }
    if args.output.json {
        return output::json(&serde_json::json!({
            "tenant": args.tenant.key(),
            "action": action,
            "request": requested.id,
            "alarms": requested.alarms,
            "applied": applied,
        }));
    }
    let what = match action {
        AlarmAction::Retry => "retried (pending again, due now)",
        AlarmAction::Clear => "cleared",
    };
    let names = requested.alarms.join(", ");
    if applied {
        out!(
            "{} of {}: {names} {what} by its owner",
            args.tenant,
            requested.alarms.len()
        )
    } else if args.wait.is_zero() {
        out!(
            "requested (request {}): {names} of {} to be {what}",
            requested.id,
            args.tenant
        )
    } else {
        output::warn(&format!(
            "request {} was not applied within {}: it stays in pgtenant.alarm_requests and is \
             applied when a replica with an alarm handler fires {}'s alarms (is one running?)",
            requested.id,
            crate::duration::show(args.wait),
            args.tenant
        ));
        out!(
            "requested (request {}): {names} of {} to be {what}",
            requested.id,
            args.tenant
        )
    }
}
