//! Fresh, empty PostgreSQL databases for tests.
//!
//! Each [`TestDatabase`] is a new database (`pgtenant_test_<secs>_<pid>_<n>`)
//! on a server found or started once per test process, and is dropped
//! (`DROP DATABASE ... WITH (FORCE)`) when the value is dropped. The server
//! comes from the first source that works, in this order:
//!
//! 1. [`Source::Url`]: `PGTENANT_TEST_DATABASE_URL`, else `DATABASE_URL`, an
//!    admin URL on whose server databases are created.
//! 2. [`Source::Local`]: a server on `127.0.0.1:5432` (user `PGUSER` or
//!    `postgres`, password `PGPASSWORD` if set).
//! 3. [`Source::Docker`]: with the `docker` cargo feature (on by default) and
//!    a Docker engine that answers, a PostgreSQL container started through
//!    testcontainers that lives as long as the process ([`DockerOptions`]:
//!    `PGTENANT_TESTKIT_IMAGE`, `PGTENANT_TESTKIT_DOCKER_NETWORK`).
//! 4. [`Source::Initdb`]: a throwaway cluster in a temporary directory, made
//!    with the machine's own `initdb`/`postgres` binaries.
//!
//! `PGTENANT_TESTKIT=url|local|docker|initdb` forces exactly one of them, and
//! `PGTENANT_TESTKIT=citus` puts every database on a Citus cluster ([`Source::Citus`], never
//! chosen unless forced). [`CitusCluster`] gives a test a coordinator and workers of its own.
//! [`LocalCluster`] gives a test its own cluster, which it can stop and start;
//! [`StandbyPair`] a primary with a streaming standby, to crash and fail over.
//!
//! ```no_run
//! use pgtenant_testkit::TestDatabase;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let db = TestDatabase::create().await?;
//! let client = db.connect().await?;
//! client.batch_execute("CREATE TABLE t (id int)").await?;
//! println!("{} from {:?}: {}", db.name(), db.source(), db.url());
//! // Dropping `db` drops the database.
//! # Ok(())
//! # }
//! ```
//!
//! A test that needs to restart its server:
//!
//! ```no_run
//! use pgtenant_testkit::LocalCluster;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = LocalCluster::start().await?;
//! let db = cluster.create_database().await?;
//! db.connect().await?.batch_execute("CREATE TABLE t (id int)").await?;
//! cluster.restart().await?;
//! db.connect().await?.batch_execute("INSERT INTO t VALUES (1)").await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![allow(
    unsafe_code,
    reason = "libc calls only (kill, geteuid, getpwnam_r, atexit), each with its SAFETY comment"
)]

mod citus;
mod cluster;
mod database;
#[cfg(feature = "docker")]
mod docker;
mod error;
mod replication;
mod sweep;

use std::fmt;
use std::str::FromStr;

pub use citus::{
    citus_installed, skip_without_citus, CitusCluster, DEFAULT_WORKERS, INSTALL_CITUS_HINT,
    REQUIRE_CITUS_ENV,
};
pub use cluster::{LocalCluster, LocalClusterBuilder};
pub use database::{TestDatabase, TestRole};
#[cfg(feature = "docker")]
pub use docker::{
    docker_engine, skip_without_docker, DockerNetwork, DockerOptions, DockerPostgres,
    CONTAINER_LABEL, DEFAULT_IMAGE, IMAGE_ENV, NETWORK_ENV, REQUIRE_DOCKER_ENV,
};
pub use error::TestkitError;
pub use replication::{Replication, StandbyPair};

/// The environment variable that forces one [`Source`].
pub const SOURCE_ENV: &str = "PGTENANT_TESTKIT";

/// Where a test database came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The server of `PGTENANT_TEST_DATABASE_URL` or `DATABASE_URL`.
    Url,
    /// A server already listening on `127.0.0.1:5432`.
    Local,
    /// A container started through testcontainers (cargo feature `docker`).
    Docker,
    /// A throwaway cluster made with the machine's `initdb` and `postgres`.
    Initdb,
    /// A throwaway Citus cluster (a coordinator and [`DEFAULT_WORKERS`] workers, see
    /// [`CitusCluster`]) when Citus is installed: used only when `PGTENANT_TESTKIT=citus`
    /// forces it. Each database has the extension and the workers in its metadata.
    Citus,
}

impl Source {
    /// Every source.
    pub const ALL: [Source; 5] = [
        Source::Url,
        Source::Local,
        Source::Docker,
        Source::Initdb,
        Source::Citus,
    ];

    /// The sources [`TestDatabase::create`] tries, in order, when none is forced.
    pub const AUTOMATIC: [Source; 4] = [Source::Url, Source::Local, Source::Docker, Source::Initdb];

    /// The name used by `PGTENANT_TESTKIT`: `url`, `local`, `docker`, `initdb` or `citus`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Url => "url",
            Source::Local => "local",
            Source::Docker => "docker",
            Source::Initdb => "initdb",
            Source::Citus => "citus",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Source {
    type Err = TestkitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Source::ALL
            .into_iter()
            .find(|source| source.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| TestkitError::InvalidSourceName {
                value: s.to_owned(),
            })
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
