//! [`Server`]: a server test databases are made on, whichever source it came from.

use std::sync::Arc;

use tokio_postgres::Config;

use crate::source::Source;

/// The server test databases are created on, with an admin connection to it.
pub(crate) struct Server {
    pub(crate) source: Source,
    /// Connects to the admin database (`postgres`, or the URL's database).
    pub(crate) admin: Config,
    /// The admin URL; a test database's URL is this with its name swapped in.
    pub(crate) base_url: String,
    /// The container's id, for the `docker` source.
    pub(crate) container_id: Option<String>,
    /// Keeps the server (an initdb cluster or a container) running while any
    /// database on it is alive.
    pub(crate) _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Admin connections to the workers of a Citus cluster ([`Source::Citus`]): each test
    /// database is made and dropped on them too. Empty for every other source.
    pub(crate) workers: Vec<Config>,
    /// The coordinator's port, for `citus_set_coordinator_host` ([`Source::Citus`] only).
    pub(crate) coordinator_port: Option<u16>,
}
