//! The commands, one file each (`pgtenant <command>` runs `commands::<command>::run`). Each
//! reads the database through the library (or the control plane's views), and prints through
//! [`crate::output`]. Here: what they share (the connection, the control-plane check).

pub(crate) mod alarms;
pub(crate) mod clear;
pub(crate) mod migrate;
pub(crate) mod setup;
pub(crate) mod show;
pub(crate) mod status;
pub(crate) mod sweep;
pub(crate) mod tenants;
pub(crate) mod trash;

use tokio_postgres::Client;

use crate::cli::Connection;
use crate::conn::{Connected, Target};
use crate::error::CliError;
use crate::output;

/// The connection string from `--database-url` or `$DATABASE_URL`; empty counts as unset.
pub(crate) fn database_url(connection: &Connection) -> Option<String> {
    connection
        .database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .filter(|url| !url.trim().is_empty())
}

pub(crate) fn target(connection: &Connection) -> Result<Target, CliError> {
    let url = database_url(connection).ok_or(CliError::NoDatabase)?;
    Target::parse(&url, connection.connect_timeout)
}

pub(crate) async fn connect(connection: &Connection) -> Result<(Target, Connected), CliError> {
    let target = target(connection)?;
    let connected = target.connect().await?;
    Ok((target, connected))
}

/// Starts a router; Router::start opens the lease session and probes it with more
/// connections, and the whole start is bounded like every other connection of the command
/// (tokio-postgres' own connect_timeout bounds only their TCP connects).
pub(crate) async fn start_router(
    target: &Target,
    options: pgtenant::RouterOptions,
) -> Result<pgtenant::Router, CliError> {
    match tokio::time::timeout(target.timeout(), pgtenant::Router::start(options)).await {
        Ok(started) => Ok(started?),
        Err(_elapsed) => Err(CliError::StartTimeout {
            target: target.describe(),
            timeout: target.timeout(),
        }),
    }
}

/// What a command does to the control plane, for [`check_control_plane`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Access {
    Read,
    /// Changes it; the command's name, for the refusal.
    Write(&'static str),
}

/// The control plane's version, after refusing what this binary cannot do safely: nothing
/// without a control plane, and no writes to one newer than this binary or older than it (the
/// library's SQL is written for its own version; `pgtenant setup` upgrades).
pub(crate) async fn check_control_plane(client: &Client, access: Access) -> Result<i64, CliError> {
    let found = pgtenant::admin::control_plane_version(client).await?;
    let supported = pgtenant::admin::supported_version();
    if found == 0 {
        return Err(CliError::NoControlPlane);
    }
    match access {
        Access::Write(command) if found > supported => Err(CliError::ControlPlaneTooNew {
            found,
            supported,
            command,
        }),
        Access::Write(command) if found < supported => Err(CliError::ControlPlaneBehind {
            found,
            needed: supported,
            command,
        }),
        Access::Read if found > supported => {
            output::warn(&format!(
                "this database's control plane is at version {found}, newer than this pgtenant \
                 (version {supported}): what is shown may be incomplete; use a newer pgtenant"
            ));
            Ok(found)
        }
        _ => Ok(found),
    }
}
