//! `pgtenant alarms`: the tenants with alarms (DESIGN §5 "Alarms"), from `pgtenant.alarms`.

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, cell};

/// The first control-plane version with alarms.
const ALARMS_SINCE: i64 = 17;

pub(crate) async fn run(connection: &Connection, args: &cli::Alarms) -> Result<(), CliError> {
    let (_, connected) = connect(connection).await?;
    let version = check_control_plane(&connected.client, Access::Read).await?;
    let alarms = if version < ALARMS_SINCE {
        output::warn(&format!(
            "this database's control plane is at version {version}, before alarms \
             ({ALARMS_SINCE}): no tenant has any; `pgtenant setup` upgrades it"
        ));
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
