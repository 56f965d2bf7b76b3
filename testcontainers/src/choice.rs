//! The per-process choice of the server test databases live on: `PGTENANT_TESTKIT`, the
//! sources in order, each tried (and started) at most once per process. The top of the crate
//! but for `lib.rs`: it reaches every source.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio_postgres::Config;

use crate::admin::{check_admin, describe_target};
use crate::cluster::{Cluster, Durability};
use crate::database::TestDatabase;
use crate::error::{describe_pg, TestkitError};
use crate::server::Server;
use crate::source::{Source, SOURCE_ENV};
use crate::sweep;
use crate::url::{encode_component, is_url, url_from_config};

impl TestDatabase {
    /// Creates a database on the first source that works (see the crate
    /// docs), or on the one `PGTENANT_TESTKIT` forces.
    ///
    /// Each source is tried at most once per process; the server found is
    /// reused by every later call.
    pub async fn create() -> Result<TestDatabase, TestkitError> {
        let forced = forced_source()?;
        create_with(forced).await
    }

    /// Creates a database on exactly this source, whatever `PGTENANT_TESTKIT`
    /// says; fails with [`TestkitError::SourceFailed`] if it does not work.
    pub async fn create_from(source: Source) -> Result<TestDatabase, TestkitError> {
        create_with(Some(source)).await
    }
}

/// The source forced by `PGTENANT_TESTKIT`, if it is set to a valid name.
///
/// An unset or empty variable gives `None`; so does an invalid value, which
/// [`TestDatabase::create`] reports as [`TestkitError::InvalidSourceName`].
pub fn source_from_env() -> Option<Source> {
    forced_source().ok().flatten()
}

/// `PGTENANT_TESTKIT`, read on every call so a process can be steered by it.
pub(crate) fn forced_source() -> Result<Option<Source>, TestkitError> {
    match std::env::var(SOURCE_ENV) {
        Ok(value) if !value.trim().is_empty() => value.parse().map(Some),
        _ => Ok(None),
    }
}

async fn create_with(forced: Option<Source>) -> Result<TestDatabase, TestkitError> {
    sweep::sweep_temp_dirs_once();
    let server = match forced {
        Some(source) => {
            shared_server(source)
                .await
                .map_err(|reason| TestkitError::SourceFailed {
                    requested: source,
                    reason,
                })?
        }
        None => {
            let mut tried = Vec::new();
            let mut found = None;
            for source in Source::AUTOMATIC {
                match shared_server(source).await {
                    Ok(server) => {
                        found = Some(server);
                        break;
                    }
                    Err(reason) => tried.push(format!("{source}: {reason}")),
                }
            }
            match found {
                Some(server) => {
                    if !tried.is_empty() {
                        tracing::debug!(source = %server.source, skipped = ?tried, "test database source chosen");
                    }
                    server
                }
                None => return Err(TestkitError::NoSource { tried }),
            }
        }
    };
    server.create_database().await
}

/// One cell per source, so that each is tried (and, for docker and initdb,
/// started) at most once per process, failures included: retrying a failed
/// initdb for every test would only repeat the same error slowly.
static SERVERS: [OnceCell<Result<Arc<Server>, String>>; 5] = [const { OnceCell::const_new() }; 5];

async fn shared_server(source: Source) -> Result<Arc<Server>, String> {
    let index = match source {
        Source::Url => 0,
        Source::Local => 1,
        Source::Docker => 2,
        Source::Initdb => 3,
        Source::Citus => 4,
    };
    SERVERS[index]
        .get_or_init(|| async move {
            let server = match source {
                Source::Url => url_server().await,
                Source::Local => local_server().await,
                Source::Docker => docker_server().await,
                Source::Initdb => initdb_server().await,
                Source::Citus => crate::citus::citus_server().await,
            }?;
            tracing::info!(%source, server = %describe_target(&server.admin), "pgtenant-testkit found its test server");
            if matches!(source, Source::Url | Source::Local) {
                // Servers that outlive this process may hold databases of
                // killed test runs; a fresh container or cluster cannot.
                sweep::sweep_databases(&server.admin).await;
            }
            Ok(Arc::new(server))
        })
        .await
        .clone()
}

async fn url_server() -> Result<Server, String> {
    let (var, url) = ["PGTENANT_TEST_DATABASE_URL", "DATABASE_URL"]
        .into_iter()
        .find_map(|var| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| (var, v))
        })
        .ok_or_else(|| "neither PGTENANT_TEST_DATABASE_URL nor DATABASE_URL is set".to_owned())?;
    let mut admin = url.parse::<Config>().map_err(|e| {
        format!(
            "{var} is not a valid connection string: {}",
            describe_pg(&e)
        )
    })?;
    if admin.get_connect_timeout().is_none() {
        admin.connect_timeout(Duration::from_secs(5));
    }
    let base_url = if is_url(&url) {
        url
    } else {
        url_from_config(&admin)
    };
    if let Err(e) = check_admin(&admin).await {
        let reason = format!("{var} ({}): {e}", describe_target(&admin));
        // The variable was set on purpose; falling through to another source
        // silently would hide a broken CI setup.
        tracing::warn!(%reason, "test database URL does not work; trying the next source");
        return Err(reason);
    }
    Ok(Server {
        source: Source::Url,
        admin,
        base_url,
        container_id: None,
        _keep: None,
        workers: Vec::new(),
        coordinator_port: None,
    })
}

async fn local_server() -> Result<Server, String> {
    let user = std::env::var("PGUSER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres".to_owned());
    let password = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty());
    let mut admin = Config::new();
    admin
        .host("127.0.0.1")
        .port(5432)
        .user(&user)
        .dbname("postgres")
        // Nothing listening usually fails at once; a filtered port must not
        // stall every test run.
        .connect_timeout(Duration::from_secs(2));
    let mut auth = encode_component(user.as_bytes());
    if let Some(password) = &password {
        admin.password(password);
        auth.push(':');
        auth.push_str(&encode_component(password.as_bytes()));
    }
    check_admin(&admin)
        .await
        .map_err(|e| format!("127.0.0.1:5432 as user {user}: {e}"))?;
    Ok(Server {
        source: Source::Local,
        admin,
        base_url: format!("postgres://{auth}@127.0.0.1:5432/postgres"),
        container_id: None,
        _keep: None,
        workers: Vec::new(),
        coordinator_port: None,
    })
}

#[cfg(feature = "docker")]
async fn docker_server() -> Result<Server, String> {
    crate::docker::start().await
}

#[cfg(not(feature = "docker"))]
async fn docker_server() -> Result<Server, String> {
    Err("pgtenant-testkit was built without its `docker` cargo feature".to_owned())
}

async fn initdb_server() -> Result<Server, String> {
    let cluster = Cluster::start(Durability::Fast)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(cluster).server())
}
