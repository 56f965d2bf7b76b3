//! `pgtenant trash`: the trashed schemas and where their sweep is.

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, cell};

pub(crate) async fn run(connection: &Connection, args: &cli::Trash) -> Result<(), CliError> {
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
