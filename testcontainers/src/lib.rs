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

// Bottom to top (`tests/layers.rs` checks that no module imports one above it): the
// vocabulary (`sync`, `source`, `error`, `names`, `url`, `admin`, `server`); `sweep`,
// `database` and the parts of a cluster or container; the sources (`cluster`, `citus`,
// `replication`, `docker`); `choice`, which reaches them all.
mod admin;
mod choice;
mod citus;
mod cluster;
mod database;
#[cfg(feature = "docker")]
mod docker;
mod error;
mod names;
mod replication;
mod server;
mod source;
mod sweep;
mod sync;
mod url;

pub use choice::source_from_env;
pub use citus::{
    citus_installed, skip_without_citus, CitusCluster, DEFAULT_WORKERS, INSTALL_CITUS_HINT,
    REQUIRE_CITUS_ENV,
};
pub use cluster::local::{LocalCluster, LocalClusterBuilder};
pub use database::{TestDatabase, TestRole};
#[cfg(feature = "docker")]
pub use docker::api::{docker_engine, skip_without_docker, REQUIRE_DOCKER_ENV};
#[cfg(feature = "docker")]
pub use docker::container::CONTAINER_LABEL;
#[cfg(feature = "docker")]
pub use docker::options::{DockerNetwork, DockerOptions, DEFAULT_IMAGE, IMAGE_ENV, NETWORK_ENV};
#[cfg(feature = "docker")]
pub use docker::DockerPostgres;
pub use error::TestkitError;
pub use replication::{Replication, StandbyPair};
pub use source::{Source, SOURCE_ENV};
