//! `pgtenant clear`: lift a tenant's quarantine after the repair.

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, out};

pub(crate) async fn run(connection: &Connection, args: &cli::Clear) -> Result<(), CliError> {
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
