//! `pgtenant show`: one tenant's record, field by field.

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, cell};

pub(crate) async fn run(connection: &Connection, args: &cli::Show) -> Result<(), CliError> {
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
