//! [`LocalCluster`]: the public face of a throwaway cluster of the test's own.

use std::fmt;
use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admin::connect_admin;
use crate::cluster::tls::make_certificates;
use crate::cluster::{Cluster, Durability, Populate};
use crate::database::TestDatabase;
use crate::error::TestkitError;
use crate::sweep;

/// A throwaway PostgreSQL cluster of this test's own, made with the machine's
/// `initdb` and `postgres` in a temporary directory.
///
/// Unlike the shared server of [`TestDatabase::create`], it can be stopped and
/// started again (same data directory, same port), e.g. to test reconnects or
/// durability. It runs with default (durable) settings, trust authentication
/// and the superuser `postgres`, listening on `127.0.0.1` only.
///
/// Dropping it stops the server and removes the directory, once every
/// [`TestDatabase`] made by [`create_database`](Self::create_database) is
/// dropped too. If the test process dies instead, a watchdog process cleans
/// up when it sees the process gone.
pub struct LocalCluster {
    inner: Arc<Cluster>,
    /// The CA certificate (PEM) of a cluster started with [`LocalCluster::start_tls`].
    tls_root: Option<PathBuf>,
}

impl LocalCluster {
    /// Makes a cluster with `initdb` and starts it on a free port.
    ///
    /// As root, initdb and postgres run as the `postgres` (else `nobody`)
    /// user, since both refuse to run as root.
    pub async fn start() -> Result<LocalCluster, TestkitError> {
        LocalCluster::start_with_settings(&[]).await
    }

    /// Like [`LocalCluster::start`], with server settings of the test's own (`-c name=value`),
    /// e.g. `&[("max_connections", "100")]` for a test that needs PostgreSQL's default lock
    /// table size (the test kit otherwise raises `max_connections` to 200).
    pub async fn start_with_settings(
        settings: &[(&str, &str)],
    ) -> Result<LocalCluster, TestkitError> {
        settings
            .iter()
            .fold(LocalCluster::builder(), |builder, (name, value)| {
                builder.setting(name, value)
            })
            .start()
            .await
    }

    /// A cluster with more than the defaults: server settings, and addresses to listen on
    /// besides `127.0.0.1` (e.g. the host side of a network namespace's link, so that a process
    /// inside the namespace reaches the server only through that link).
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pgtenant_testkit::TestkitError> {
    /// use std::net::{IpAddr, Ipv4Addr};
    /// let link = IpAddr::V4(Ipv4Addr::new(10, 200, 0, 1)); // must exist on this machine
    /// let cluster = pgtenant_testkit::LocalCluster::builder()
    ///     .setting("log_connections", "on")
    ///     .listen_on(link, 30) // trusts clients in 10.200.0.0/30
    ///     .start()
    ///     .await?;
    /// let db = cluster.create_database().await?;
    /// let url = cluster.url_on(link, db.name()); // postgres://postgres@10.200.0.1:PORT/…
    /// # Ok(()) }
    /// ```
    pub fn builder() -> LocalClusterBuilder {
        LocalClusterBuilder::default()
    }

    /// Like [`LocalCluster::start`], serving TLS with a certificate for `127.0.0.1` signed by a
    /// throwaway CA ([`tls_root_certificate`](Self::tls_root_certificate)), and refusing
    /// unencrypted connections to every database but `postgres` (the test kit's own admin
    /// connection). For testing an application's TLS settings against a server that requires
    /// TLS. Needs the `openssl` command.
    pub async fn start_tls() -> Result<LocalCluster, TestkitError> {
        let mut cluster = LocalCluster::start().await?;
        let dir = cluster.inner.dir.clone();
        let run_as = cluster
            .inner
            .run_as
            .as_ref()
            .map(|user| (user.uid, user.gid));
        make_certificates(&dir, run_as).await?;
        fs::write(
            cluster.inner.data.join("pg_hba.conf"),
            "local all all trust\n\
             hostnossl postgres all 127.0.0.1/32 trust\n\
             hostssl all all 127.0.0.1/32 trust\n",
        )
        .map_err(|e| TestkitError::io("writing pg_hba.conf", e))?;
        let admin = connect_admin(&cluster.inner.admin_config()).await?;
        // ssl and pg_hba.conf take effect on reload: no restart, the port stays.
        // One statement each: ALTER SYSTEM refuses to run inside a transaction block.
        for statement in [
            format!(
                "ALTER SYSTEM SET ssl_cert_file = '{}'",
                dir.join("server.pem").display()
            ),
            format!(
                "ALTER SYSTEM SET ssl_key_file = '{}'",
                dir.join("server.key").display()
            ),
            "ALTER SYSTEM SET ssl = on".to_owned(),
            "SELECT pg_reload_conf()".to_owned(),
        ] {
            admin
                .batch_execute(&statement)
                .await
                .map_err(|e| TestkitError::pg("turning TLS on", e))?;
        }
        // The reload is asynchronous: wait until the server reports it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let on: String = admin
                .query_one("SHOW ssl", &[])
                .await
                .map_err(|e| TestkitError::pg("reading ssl", e))?
                .get(0);
            if on == "on" {
                break;
            }
            if Instant::now() > deadline {
                return Err(TestkitError::Cluster(
                    "the server did not turn TLS on within 10 s; see postgres.log".to_owned(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // no event for a reload
        }
        cluster.tls_root = Some(dir.join("ca.pem"));
        Ok(cluster)
    }

    /// The CA certificate (PEM) that signed the server's certificate, for a cluster started
    /// with [`LocalCluster::start_tls`].
    pub fn tls_root_certificate(&self) -> Option<&Path> {
        self.tls_root.as_deref()
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.inner.port()
    }

    /// `postgres://postgres@127.0.0.1:PORT/database`.
    pub fn url(&self, database: &str) -> String {
        self.inner.url(database)
    }

    /// `postgres://postgres@ADDRESS:PORT/database`: the URL through one of the addresses the
    /// cluster listens on ([`LocalClusterBuilder::listen_on`]; `127.0.0.1` always).
    pub fn url_on(&self, address: IpAddr, database: &str) -> String {
        self.inner.url_on(address, database)
    }

    /// Every address the server listens on: `127.0.0.1` first, then those given to
    /// [`LocalClusterBuilder::listen_on`].
    pub fn listen_addresses(&self) -> Vec<IpAddr> {
        std::iter::once(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .chain(self.inner.listen.iter().map(|(address, _)| *address))
            .collect()
    }

    /// A fresh database on this cluster; its [`source`](TestDatabase::source)
    /// is [`Source::Initdb`](crate::Source::Initdb). It keeps the cluster alive until it is dropped.
    pub async fn create_database(&self) -> Result<TestDatabase, TestkitError> {
        Arc::new(Arc::clone(&self.inner).server())
            .create_database()
            .await
    }

    /// Fast shutdown (`-m fast`: sessions are ended, a checkpoint written);
    /// returns once postgres has exited. Stopping a stopped cluster is a no-op.
    pub async fn stop(&self) -> Result<(), TestkitError> {
        self.inner.stop().await
    }

    /// Immediate shutdown (`-m immediate`): every server process exits at once, without a
    /// checkpoint, as in a crash (clients see their connections reset); the next start runs
    /// crash recovery. Returns once postgres has exited; a no-op when stopped.
    pub async fn stop_immediate(&self) -> Result<(), TestkitError> {
        self.inner.stop_immediate().await
    }

    /// Starts the stopped server again with the same data directory and
    /// port; returns once it accepts connections. A no-op while running.
    pub async fn start_again(&self) -> Result<(), TestkitError> {
        self.inner.start_again().await
    }

    /// [`stop`](Self::stop), then [`start_again`](Self::start_again).
    pub async fn restart(&self) -> Result<(), TestkitError> {
        self.stop().await?;
        self.start_again().await
    }

    /// The cluster's data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.inner.data
    }
}

/// How [`LocalCluster::builder`] starts a cluster: server settings and extra addresses.
#[derive(Debug, Clone, Default)]
pub struct LocalClusterBuilder {
    settings: Vec<(String, String)>,
    listen: Vec<(IpAddr, u8)>,
}

impl LocalClusterBuilder {
    /// A server setting (`-c name=value` on the server's command line, after the test kit's
    /// own, so it wins).
    #[must_use]
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Listen on `address` too (it must be assigned to an interface of this machine when the
    /// cluster starts), and trust the clients of its network `address/prefix_len` (trust
    /// authentication, as on `127.0.0.1`). `127.0.0.1` is always listened on.
    #[must_use]
    pub fn listen_on(mut self, address: IpAddr, prefix_len: u8) -> Self {
        self.listen.push((address, prefix_len));
        self
    }

    /// initdb and start, as [`LocalCluster::start`]; returns once the server accepts
    /// connections on every address.
    ///
    /// # Errors
    /// [`TestkitError::Cluster`] for a prefix length longer than its address, an address the
    /// server could not listen on (with the server's log), or the failures of
    /// [`LocalCluster::start`].
    pub async fn start(self) -> Result<LocalCluster, TestkitError> {
        for (address, prefix) in &self.listen {
            let bits = if address.is_ipv4() { 32 } else { 128 };
            if *prefix > bits {
                return Err(TestkitError::Cluster(format!(
                    "listen_on({address}, {prefix}): an IPv{} prefix is at most {bits} bits",
                    if address.is_ipv4() { 4 } else { 6 }
                )));
            }
            if *address == IpAddr::V4(Ipv4Addr::LOCALHOST) || address.is_unspecified() {
                return Err(TestkitError::Cluster(format!(
                    "listen_on({address}, {prefix}): give an address of an interface of this \
                     machine; 127.0.0.1 is always listened on, and a wildcard would expose the \
                     trust-authenticated server on every interface"
                )));
            }
        }
        sweep::sweep_temp_dirs_once();
        let cluster = Cluster::create(
            Durability::Durable,
            self.settings,
            self.listen,
            Populate::Initdb,
        )
        .await?;
        Ok(LocalCluster {
            inner: Arc::new(cluster),
            tls_root: None,
        })
    }
}

impl fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCluster")
            .field("port", &self.port())
            .field("listen", &self.inner.listen)
            .field("data_dir", &self.inner.data)
            .field("bindir", &self.inner.bindir)
            .field("run_as", &self.inner.run_as.as_ref().map(|u| &u.name))
            .finish()
    }
}
