//! The `docker` source and [`DockerPostgres`]: PostgreSQL in a container started through
//! testcontainers, which also waits for it (a log wait strategy) and removes it (its drop).
//!
//! Two things testcontainers does not do are added here:
//! * **Removal when the test process dies.** Rust never drops statics, so the per-process
//!   container is removed at exit by an `atexit` handler (through testcontainers' drop), and a
//!   remover process (`docker rm -f` of every container labelled with this process's token,
//!   once our pipe to it closes) covers panics that abort, SIGKILL and everything else.
//! * **Host networking**, for machines whose containers may not use a bridge network: the
//!   server then listens on `127.0.0.1` at a free port given as `-c port=NNNN`.
//!
//! Here: [`DockerPostgres`] and the per-process container of the `docker` source. Beside it:
//! `options.rs` (image and network), `api.rs` (finding the engine), `container.rs` (starting
//! and removing one container), `remover.rs` (the process that removes them after a kill).

pub(crate) mod api;
pub(crate) mod container;
pub(crate) mod options;
pub(crate) mod remover;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::database::TestDatabase;
use crate::docker::container::Container;
use crate::docker::options::{DockerNetwork, DockerOptions};
use crate::error::TestkitError;
use crate::server::Server;
use crate::sweep;

/// A PostgreSQL container of the caller's own, started through testcontainers.
///
/// The `docker` source shares one container per test process; this is for a test that wants
/// its own, e.g. a specific image. Superuser `postgres`, trust authentication, `fsync=off`.
/// Dropping it removes the container (testcontainers' drop), once every [`TestDatabase`]
/// made by [`create_database`](Self::create_database) is dropped too. If the test process
/// dies instead, the remover process removes it.
pub struct DockerPostgres {
    inner: Arc<Container>,
}

impl DockerPostgres {
    /// Starts a container with [`DockerOptions::from_env`].
    pub async fn start() -> Result<DockerPostgres, TestkitError> {
        DockerPostgres::start_with(DockerOptions::from_env()?).await
    }

    /// Starts a container with these options; returns once it answered a first query.
    pub async fn start_with(options: DockerOptions) -> Result<DockerPostgres, TestkitError> {
        sweep::sweep_temp_dirs_once();
        Ok(DockerPostgres {
            inner: Arc::new(
                Container::start(&options)
                    .await
                    .map_err(TestkitError::Docker)?,
            ),
        })
    }

    /// The container's id.
    pub fn container_id(&self) -> &str {
        &self.inner.id
    }

    /// The image it runs.
    pub fn image(&self) -> &str {
        &self.inner.image
    }

    /// How it is reached.
    pub fn network(&self) -> DockerNetwork {
        self.inner.network
    }

    /// The host to connect to (`127.0.0.1` for a local engine).
    pub fn host(&self) -> &str {
        &self.inner.host
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.inner.port
    }

    /// `postgres://postgres@HOST:PORT/database`.
    pub fn url(&self, database: &str) -> String {
        self.inner.url(database)
    }

    /// From asking Docker for the container to the first query answered.
    pub fn startup_time(&self) -> Duration {
        self.inner.startup
    }

    /// A fresh database in this container; its [`source`](TestDatabase::source) is
    /// [`Source::Docker`](crate::Source::Docker). It keeps the container alive until it is dropped.
    pub async fn create_database(&self) -> Result<TestDatabase, TestkitError> {
        Arc::new(Arc::clone(&self.inner).server())
            .create_database()
            .await
    }
}

impl fmt::Debug for DockerPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerPostgres")
            .field("container_id", &self.inner.id)
            .field("image", &self.inner.image)
            .field("network", &self.inner.network)
            .field("host", &self.inner.host)
            .field("port", &self.inner.port)
            .finish()
    }
}

/// The per-process container of the `docker` source.
static SHARED: OnceLock<Arc<Container>> = OnceLock::new();

/// The `docker` source: one container for the whole test process, removed at its exit.
pub(crate) async fn start() -> Result<Server, String> {
    let options = DockerOptions::from_env().map_err(|e| e.to_string())?;
    let container = Arc::new(Container::start(&options).await?);
    // choice::shared_server runs this at most once per process.
    if SHARED.set(Arc::clone(&container)).is_ok() {
        extern "C" fn remove_shared_container() {
            // Unwinding out of an atexit handler would abort.
            let _ = std::panic::catch_unwind(|| {
                if let Some(container) = SHARED.get() {
                    container.remove();
                }
            });
        }
        // SAFETY: atexit only records the pointer to a function that has no preconditions;
        // it runs once, at exit(), while the process's threads (testcontainers' drop worker,
        // the Docker client's threads) still run.
        if unsafe { libc::atexit(remove_shared_container) } != 0 {
            tracing::warn!(container = %container.id, "atexit refused the handler; the remover process removes the container after exit");
        }
    }
    Ok(container.server())
}
