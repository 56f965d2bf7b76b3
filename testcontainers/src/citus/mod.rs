//! A Citus cluster on this machine: a coordinator and N workers, each a throwaway initdb
//! cluster of [`Cluster`] started with `shared_preload_libraries = 'citus'` (the logic of
//! a hand-made local Citus cluster, on free ports and cleaned up like every cluster here).
//!
//! Citus metadata lives per database, so each test database is made on every node under the
//! same name, gets `CREATE EXTENSION citus` on each, and on the coordinator
//! `citus_set_coordinator_host` and one `citus_add_node` per worker (`metadata.rs`).

pub(crate) mod metadata;

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use crate::cluster::binaries::find_bindir;
use crate::cluster::{Cluster, Durability};
use crate::database::TestDatabase;
use crate::error::TestkitError;
use crate::server::Server;
use crate::source::Source;
use crate::sweep;

/// Set to anything but `0`, a test that would skip for want of Citus fails instead (CI).
pub const REQUIRE_CITUS_ENV: &str = "PGTENANT_REQUIRE_CITUS";

/// How to get Citus on this machine, for skip lines and errors.
pub const INSTALL_CITUS_HINT: &str =
    "install Citus for this machine's PostgreSQL (Citus' own packages, e.g. `postgresql-15-citus-13.2` from its apt repository, or a build from its source: https://docs.citusdata.com/en/stable/installation/)";

/// Workers of the shared cluster behind [`Source::Citus`].
pub const DEFAULT_WORKERS: usize = 2;

/// Server settings every Citus node starts with (after the test kit's own).
const NODE_SETTINGS: [(&str, &str); 5] = [
    ("shared_preload_libraries", "citus"),
    ("max_prepared_transactions", "100"),
    // citus_schema_move / citus_move_shard_placement copy shards online by logical replication.
    ("wal_level", "logical"),
    // The cluster-wide default of citus-cluster.sh: whoever creates a schema decides.
    ("citus.enable_schema_based_sharding", "off"),
    // A node reaches itself (the shard cleaner after citus_schema_move, among others) at
    // citus.local_hostname, `localhost` by default. The nodes listen on 127.0.0.1 only; where
    // `localhost` resolves to ::1 first, that reached whatever else had the port there (a CI
    // run failed a move on "server does not support SSL" from such a server).
    ("citus.local_hostname", "127.0.0.1"),
];

/// Whether the machine's PostgreSQL has the Citus extension: `Ok(())`, or why not.
pub fn citus_installed() -> Result<(), String> {
    let bindir = find_bindir()?;
    let libdir = bindir
        .parent()
        .map(|dir| dir.join("lib"))
        .unwrap_or_else(|| PathBuf::from("lib"));
    let library = libdir.join("citus.so");
    if library.is_file() {
        Ok(())
    } else {
        Err(format!("{} does not exist", library.display()))
    }
}

/// True (after one line on stderr saying how to install Citus) when Citus is not installed,
/// so the calling test returns early; panics instead when [`REQUIRE_CITUS_ENV`] is set.
pub fn skip_without_citus(test: &str) -> bool {
    let Err(why) = citus_installed() else {
        return false;
    };
    if std::env::var(REQUIRE_CITUS_ENV).is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("{test} needs Citus and {REQUIRE_CITUS_ENV} is set: {why}; {INSTALL_CITUS_HINT}");
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "skipped {test}: needs Citus — {INSTALL_CITUS_HINT} ({why})"
    );
    true
}

/// A coordinator and its workers, each its own throwaway cluster on 127.0.0.1.
///
/// Dropping it stops every node and removes their directories (once every database made by
/// [`create_database`](Self::create_database) is dropped too).
pub struct CitusCluster {
    coordinator: Arc<Cluster>,
    workers: Vec<Arc<Cluster>>,
}

impl CitusCluster {
    /// Starts a coordinator and `workers` workers (in parallel). Fails with
    /// [`TestkitError::Cluster`] naming the install script when Citus is not installed.
    pub async fn start(workers: usize) -> Result<CitusCluster, TestkitError> {
        citus_installed().map_err(|why| {
            TestkitError::Cluster(format!(
                "Citus is not installed ({why}): {INSTALL_CITUS_HINT}"
            ))
        })?;
        sweep::sweep_temp_dirs_once();
        let settings: Vec<(String, String)> = NODE_SETTINGS
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        let starts =
            (0..=workers).map(|_| Cluster::start_with(Durability::Durable, settings.clone()));
        let mut nodes = Vec::with_capacity(workers + 1);
        for started in futures_util::future::join_all(starts).await {
            nodes.push(Arc::new(started?));
        }
        let coordinator = nodes.remove(0);
        Ok(CitusCluster {
            coordinator,
            workers: nodes,
        })
    }

    /// The coordinator's port on 127.0.0.1 (applications connect there).
    pub fn coordinator_port(&self) -> u16 {
        self.coordinator.port()
    }

    /// The workers' ports on 127.0.0.1.
    pub fn worker_ports(&self) -> Vec<u16> {
        self.workers.iter().map(|worker| worker.port()).collect()
    }

    /// `postgres://postgres@127.0.0.1:PORT/database` on the coordinator.
    pub fn url(&self, database: &str) -> String {
        self.coordinator.url(database)
    }

    /// A fresh database on every node with Citus in it and the workers added; its URL is the
    /// coordinator's and its [`source`](TestDatabase::source) is [`Source::Citus`]. Dropping it
    /// drops it on every node. It keeps the cluster alive until it is dropped.
    pub async fn create_database(self: &Arc<Self>) -> Result<TestDatabase, TestkitError> {
        Arc::new(self.server()).create_database().await
    }

    /// The admin side of the cluster, which keeps it alive.
    pub(crate) fn server(self: &Arc<Self>) -> Server {
        let mut server = Arc::clone(&self.coordinator).server();
        server.source = Source::Citus;
        server.workers = self.workers.iter().map(|w| w.admin_config()).collect();
        server.coordinator_port = Some(self.coordinator.port());
        server._keep = Some(Arc::clone(self) as Arc<dyn std::any::Any + Send + Sync>);
        server
    }
}

impl fmt::Debug for CitusCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CitusCluster")
            .field("coordinator_port", &self.coordinator_port())
            .field("worker_ports", &self.worker_ports())
            .finish()
    }
}

/// The shared cluster behind [`Source::Citus`], started once per process.
pub(crate) async fn citus_server() -> Result<Server, String> {
    citus_installed()
        .map_err(|why| format!("Citus is not installed ({why}): {INSTALL_CITUS_HINT}"))?;
    let cluster = CitusCluster::start(DEFAULT_WORKERS)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(cluster).server())
}
