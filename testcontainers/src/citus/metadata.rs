//! A Citus test database's metadata: the database on every node, the extension in each, the
//! coordinator and the workers registered. Below [`TestDatabase`](crate::TestDatabase), which
//! calls it for a database on a Citus server, and so below the cluster that starts the nodes.

use tokio_postgres::Config;

use crate::admin::{connect_admin, quote_ident};
use crate::error::TestkitError;
use crate::server::Server;

/// Makes database `name` on every worker and Citus in it on every node, then adds the
/// coordinator and the workers to its metadata. Runs after the coordinator's CREATE DATABASE.
pub(crate) async fn prepare_database(server: &Server, name: &str) -> Result<(), TestkitError> {
    for worker in &server.workers {
        connect_admin(worker)
            .await?
            .batch_execute(&format!(
                "CREATE DATABASE {} TEMPLATE template0",
                quote_ident(name)
            ))
            .await
            .map_err(|e| TestkitError::pg(format!("creating database {name} on a worker"), e))?;
    }
    let mut nodes: Vec<Config> = server.workers.clone();
    nodes.push(server.admin.clone());
    for node in &mut nodes {
        node.dbname(name);
        connect_admin(node)
            .await?
            .batch_execute("CREATE EXTENSION citus")
            .await
            .map_err(|e| TestkitError::pg(format!("CREATE EXTENSION citus in {name}"), e))?;
    }
    let mut coordinator = server.admin.clone();
    coordinator.dbname(name);
    let client = connect_admin(&coordinator).await?;
    let port = i32::from(server.coordinator_port.unwrap_or(5432));
    client
        .execute(
            "SELECT citus_set_coordinator_host('127.0.0.1', $1)",
            &[&port],
        )
        .await
        .map_err(|e| TestkitError::pg("citus_set_coordinator_host", e))?;
    for worker in &server.workers {
        let port = i32::from(worker.get_ports().first().copied().unwrap_or(5432));
        add_node(&client, port).await?;
    }
    Ok(())
}

/// `citus_add_node`, tried up to five times: on a loaded machine the coordinator's connection
/// to a new worker database fails now and then ("failure on connection marked as essential",
/// XX000; seen once in a dozen CI-like runs), and the call is idempotent.
async fn add_node(client: &tokio_postgres::Client, port: i32) -> Result<(), TestkitError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match client
            .execute("SELECT citus_add_node('127.0.0.1', $1)", &[&port])
            .await
        {
            Ok(_) => return Ok(()),
            Err(e)
                if tries < 5
                    && e.code() == Some(&tokio_postgres::error::SqlState::INTERNAL_ERROR) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100 * tries)).await;
            }
            Err(e) => {
                return Err(TestkitError::pg(
                    format!("citus_add_node 127.0.0.1:{port} (try {tries})"),
                    e,
                ))
            }
        }
    }
}
