//! [`TestDatabase`] and [`TestRole`]: a database of a test's own on a [`Server`], made and
//! dropped (with its roles, and on a Citus cluster's workers too). Which server is chosen is
//! `choice.rs`'s business, above this one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, Config};

use crate::admin::{connect, connect_admin, describe_target, drop_database, quote_ident};
use crate::citus::metadata::prepare_database;
use crate::error::TestkitError;
use crate::names::{new_name, new_nonce};
use crate::server::Server;
use crate::source::Source;
use crate::sync::lock;
use crate::url::{replace_dbname, replace_user};

// Here rather than in `server.rs`: making a database makes a `TestDatabase`, which holds its
// `Server`; with the method here, `server.rs` needs nothing above it.
impl Server {
    /// A fresh database on this server (on a Citus server: on every node, with Citus in it).
    pub(crate) async fn create_database(self: &Arc<Self>) -> Result<TestDatabase, TestkitError> {
        let name = new_name();
        let client = connect_admin(&self.admin).await?;
        // template0 accepts no connections, so concurrent CREATE DATABASEs never
        // fail with "source database is being accessed by other users".
        client
            .batch_execute(&format!(
                "CREATE DATABASE {} TEMPLATE template0",
                quote_ident(&name)
            ))
            .await
            .map_err(|e| TestkitError::pg(format!("creating database {name}"), e))?;
        let url = replace_dbname(&self.base_url, &name);
        let config = url
            .parse::<Config>()
            .map_err(|e| TestkitError::pg(format!("parsing the URL of database {name}"), e))?;
        tracing::debug!(database = %name, source = %self.source, "created test database");
        let database = TestDatabase {
            name,
            url,
            config,
            server: Arc::clone(self),
            roles: std::sync::Mutex::new(Vec::new()),
        };
        if !self.workers.is_empty() {
            // Dropping `database` on an error drops whatever was made on every node.
            prepare_database(self, &database.name).await?;
        }
        Ok(database)
    }
}

/// A fresh, empty database for one test.
///
/// It is dropped (`DROP DATABASE ... WITH (FORCE)`, which ends open
/// connections) when the value is dropped. A database on a [`LocalCluster`]
/// keeps that cluster running until the database is dropped.
///
/// [`LocalCluster`]: crate::LocalCluster
pub struct TestDatabase {
    name: String,
    url: String,
    config: Config,
    server: Arc<Server>,
    /// Roles made for this database, dropped after it.
    roles: std::sync::Mutex<Vec<String>>,
}

/// A login role made by [`TestDatabase::create_role`]: not a superuser, with no privilege
/// beyond what PUBLIC has until the test grants some. Dropped with its database.
#[derive(Debug, Clone)]
pub struct TestRole {
    name: String,
    url: String,
    config: Config,
}

impl TestRole {
    /// The role's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL, logging in as this role.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's connection settings, logging in as this role.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// Connects as this role, without TLS; the connection runs on a spawned tokio task.
    pub async fn connect(&self) -> Result<Client, TestkitError> {
        connect(&self.config)
            .await
            .map_err(|e| TestkitError::pg(format!("connecting as role {}", self.name), e))
    }
}

impl TestDatabase {
    /// `postgres://user@host:port/name`, for code that takes a URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The connection settings of [`url`](Self::url).
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// The connection settings of the server's admin database, e.g. to check
    /// from outside that a database exists.
    pub fn admin_config(&self) -> Config {
        self.server.admin.clone()
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the server came from.
    pub fn source(&self) -> Source {
        self.server.source
    }

    /// Creates a login role `<database>_<suffix>` (suffix: lowercase letters, digits and
    /// `_`, at most 20 bytes) that is not a superuser and has only PUBLIC's privileges, with a
    /// random password in its URL (so it works whatever the server's authentication). It is
    /// dropped, with everything it owns, after the database. For tests of least privilege:
    /// grant it what an application's or operator's role would get.
    pub async fn create_role(&self, suffix: &str) -> Result<TestRole, TestkitError> {
        let valid = !suffix.is_empty()
            && suffix.len() <= 20
            && suffix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(TestkitError::InvalidRoleSuffix {
                suffix: suffix.chars().take(40).collect(),
            });
        }
        let name = format!("{}_{suffix}", self.name);
        let password = format!("{:x}{:x}", new_nonce(), new_nonce());
        let client = connect_admin(&self.server.admin).await?;
        client
            .batch_execute(&format!(
                "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{password}'",
                quote_ident(&name)
            ))
            .await
            .map_err(|e| TestkitError::pg(format!("creating role {name}"), e))?;
        lock(&self.roles).push(name.clone());
        let mut config = self.config.clone();
        config.user(&name).password(password.as_str());
        let url = replace_user(&self.url, &name, &password);
        Ok(TestRole { name, url, config })
    }

    /// The id of the Docker container the database lives in, for the `docker` source (and
    /// `DockerPostgres`); `None` for the others.
    pub fn container_id(&self) -> Option<&str> {
        self.server.container_id.as_deref()
    }

    /// Connects without TLS; the connection runs on a spawned tokio task.
    pub async fn connect(&self) -> Result<Client, TestkitError> {
        connect(&self.config)
            .await
            .map_err(|e| TestkitError::pg(format!("connecting to test database {}", self.name), e))
    }
}

impl fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDatabase")
            .field("name", &self.name)
            .field("source", &self.server.source)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop cannot await, and blocking on the caller's runtime could
        // deadlock, so a thread with its own runtime does the DROP.
        let admin = self.server.admin.clone();
        let workers = self.server.workers.clone();
        let name = self.name.clone();
        let roles = std::mem::take(&mut *lock(&self.roles));
        let spawned = std::thread::Builder::new()
            .name("pgtenant-testkit-drop".into())
            .spawn(move || drop_database_blocking(&admin, &workers, &name, &roles));
        match spawned {
            Ok(handle) => {
                if handle.join().is_err() {
                    tracing::warn!(database = %self.name, "thread dropping the test database panicked");
                }
            }
            Err(e) => {
                tracing::warn!(database = %self.name, error = %e, "could not spawn a thread to drop the test database")
            }
        }
    }
}

fn drop_database_blocking(admin: &Config, workers: &[Config], name: &str, roles: &[String]) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::warn!(database = %name, error = %e, "no runtime to drop the test database");
            return;
        }
    };
    runtime.block_on(async {
        match tokio::time::timeout(Duration::from_secs(60), drop_database(admin, name)).await {
            Ok(Ok(())) => tracing::debug!(database = %name, "dropped test database"),
            Ok(Err(e)) => {
                tracing::warn!(database = %name, error = %e, "could not drop test database")
            }
            Err(_) => tracing::warn!(database = %name, "timed out dropping test database"),
        }
        for worker in workers {
            let dropped =
                tokio::time::timeout(Duration::from_secs(60), drop_database(worker, name)).await;
            if !matches!(dropped, Ok(Ok(()))) {
                tracing::warn!(database = %name, worker = %describe_target(worker), "could not drop the test database on a Citus worker");
            }
        }
        // After the database, which held everything they own or were granted but for the
        // database's own ACL, which DROP DATABASE removed too.
        for role in roles {
            let dropped = async {
                connect_admin(admin)
                    .await?
                    .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(role)))
                    .await
                    .map_err(|e| TestkitError::pg(format!("dropping role {role}"), e))
            };
            if let Err(e) = dropped.await {
                tracing::warn!(%role, error = %e, "could not drop test role");
            }
        }
    });
}
