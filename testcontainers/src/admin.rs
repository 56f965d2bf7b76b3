//! Admin connections to a test server and what the kit runs on them: connecting (bounded),
//! checking that a server will do, dropping a database, quoting, describing a target.

use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use crate::error::{describe_pg, TestkitError};

/// How long an admin connection (connect, authenticate, one query) may take
/// before a source counts as not working.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks that `admin` connects within [`ADMIN_TIMEOUT`], runs PostgreSQL 13+
/// (for `DROP DATABASE ... WITH (FORCE)`) and may create databases.
pub(crate) async fn check_admin(admin: &Config) -> Result<(), String> {
    let check = async {
        let client = connect(admin).await.map_err(|e| describe_pg(&e))?;
        let row = client
            .query_one(
                "SELECT current_setting('server_version_num')::int, \
                        current_setting('server_version'), \
                        current_user::text, \
                        (SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user)",
                &[],
            )
            .await
            .map_err(|e| describe_pg(&e))?;
        let version_num: i32 = row.get(0);
        let version: String = row.get(1);
        let user: String = row.get(2);
        let may_create: Option<bool> = row.get(3);
        if version_num < 130_000 {
            return Err(format!(
                "the server runs PostgreSQL {version}; 13 or newer is needed for DROP DATABASE ... WITH (FORCE)"
            ));
        }
        if may_create != Some(true) {
            return Err(format!(
                "role {user} may not create databases (it needs CREATEDB)"
            ));
        }
        Ok(())
    };
    tokio::time::timeout(ADMIN_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}s", ADMIN_TIMEOUT.as_secs())))
}

/// Connects without TLS and runs the connection on a spawned task.
pub(crate) async fn connect(config: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %describe_pg(&e), "test database connection ended with an error");
        }
    });
    Ok(client)
}

/// [`connect`] bounded by [`ADMIN_TIMEOUT`], for admin work on a server that
/// may have gone away.
pub(crate) async fn connect_admin(admin: &Config) -> Result<Client, TestkitError> {
    let context = || {
        format!(
            "connecting to the admin database at {}",
            describe_target(admin)
        )
    };
    match tokio::time::timeout(ADMIN_TIMEOUT, connect(admin)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(TestkitError::pg(context(), e)),
        Err(_) => Err(TestkitError::io(
            context(),
            std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"),
        )),
    }
}

pub(crate) async fn drop_database(admin: &Config, name: &str) -> Result<(), TestkitError> {
    let client = connect_admin(admin).await?;
    client
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(name)
        ))
        .await
        .map_err(|e| TestkitError::pg(format!("dropping database {name}"), e))
}

pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `host:port/dbname` of a config, never its password, for messages.
pub(crate) fn describe_target(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "(no host)".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{host}:{port}/{}",
        config.get_dbname().unwrap_or("(default database)")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
