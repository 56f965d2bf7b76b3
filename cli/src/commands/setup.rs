//! `pgtenant setup`: install or upgrade the control plane (and grant its roles).

use crate::cli::{self, Connection};
use crate::commands::connect;
use crate::error::CliError;
use crate::output::{self, out};

pub(crate) async fn run(connection: &Connection, args: &cli::Setup) -> Result<(), CliError> {
    let (_, mut connected) = connect(connection).await?;
    let mut roles = pgtenant::SetupOptions::default();
    if let Some(role) = &args.app_role {
        roles = roles.app_role(role);
    }
    if let Some(role) = &args.operator_role {
        roles = roles.operator_role(role);
    }
    let report = pgtenant::setup_with(&mut connected.client, &roles).await?;
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
