//! Throwaway clusters made with the machine's own `initdb` and `postgres`: the lifecycle of
//! one (initdb or base backup, start, stop, start again, removal) here, its parts beside it:
//! finding the binaries, the account they run as, the temporary directory, its watchdog,
//! free ports, stopping the postmaster, TLS certificates. [`LocalCluster`](local::LocalCluster)
//! is the public face.

pub(crate) mod binaries;
pub(crate) mod local;
pub(crate) mod ports;
pub(crate) mod process;
pub(crate) mod run_as;
pub(crate) mod temp_dir;
pub(crate) mod tls;
pub(crate) mod watchdog;

use std::fs;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::Config;

use crate::admin::connect;
use crate::cluster::binaries::find_bindir;
use crate::cluster::ports::{free_port, network, url_host};
use crate::cluster::process::{read_log, stop_child};
use crate::cluster::run_as::{run_as, RunAs};
use crate::cluster::temp_dir::make_temp_dir;
use crate::cluster::watchdog::{spawn_watchdog, Watchdog};
use crate::error::{describe_pg, TestkitError};
use crate::server::Server;
use crate::source::Source;
use crate::sync::lock;
use crate::url::encode_component;

/// How long a starting server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a new port is tried when the chosen one was taken meanwhile.
const PORT_ATTEMPTS: usize = 5;

/// Whether a cluster keeps its data safe across crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Default settings: what a [`LocalCluster`] test of restarts needs.
    Durable,
    /// `fsync=off` and friends: the shared cluster only serves throwaway
    /// databases and is never restarted.
    Fast,
}

/// A running (or stopped) cluster in its own temporary directory.
pub(crate) struct Cluster {
    /// The temporary directory: `data/`, the socket, `postgres.log`.
    dir: PathBuf,
    data: PathBuf,
    port: AtomicU16,
    bindir: PathBuf,
    run_as: Option<RunAs>,
    durability: Durability,
    /// Extra `-c name=value` server settings, after the test kit's own (so they win).
    settings: Vec<(String, String)>,
    /// Addresses listened on besides 127.0.0.1, each with the prefix length of the network
    /// whose clients it trusts (pg_hba.conf).
    listen: Vec<(IpAddr, u8)>,
    postmaster: Mutex<Option<Child>>,
    /// Serializes stop and start, which each take several awaits.
    ops: tokio::sync::Mutex<()>,
    watchdog: Mutex<Option<Watchdog>>,
}

/// Why a start failed; a lost race for the port is retried on another port.
enum StartError {
    PortInUse(String),
    Failed(TestkitError),
}

/// How a new cluster's data directory is made.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Populate {
    /// `initdb`: a new, empty cluster.
    Initdb,
    /// `pg_basebackup -R` from the running server on this port: a streaming standby of it.
    BaseBackup { primary_port: u16 },
}

impl From<TestkitError> for StartError {
    fn from(e: TestkitError) -> Self {
        StartError::Failed(e)
    }
}

impl Cluster {
    /// initdb in a new temporary directory, then start on a free port.
    pub(crate) async fn start(durability: Durability) -> Result<Cluster, TestkitError> {
        Cluster::start_with(durability, Vec::new()).await
    }

    pub(crate) async fn start_with(
        durability: Durability,
        settings: Vec<(String, String)>,
    ) -> Result<Cluster, TestkitError> {
        Cluster::create(durability, settings, Vec::new(), Populate::Initdb).await
    }

    /// A streaming standby of `primary` (which must be running), made with `pg_basebackup -R`
    /// and started on a free port of its own.
    pub(crate) async fn start_standby_of(
        primary: &Cluster,
        settings: Vec<(String, String)>,
    ) -> Result<Cluster, TestkitError> {
        let populate = Populate::BaseBackup {
            primary_port: primary.port(),
        };
        Cluster::create(Durability::Durable, settings, Vec::new(), populate).await
    }

    async fn create(
        durability: Durability,
        settings: Vec<(String, String)>,
        listen: Vec<(IpAddr, u8)>,
        populate: Populate,
    ) -> Result<Cluster, TestkitError> {
        let bindir = find_bindir().map_err(TestkitError::Cluster)?;
        let run_as = run_as()?;
        let dir = make_temp_dir(run_as.as_ref())?;
        let watchdog = spawn_watchdog(&dir);
        // From here on, dropping `cluster` (on any error below) stops the
        // server and removes the directory.
        let cluster = Cluster {
            data: dir.join("data"),
            dir,
            port: AtomicU16::new(0),
            bindir,
            run_as,
            durability,
            settings,
            listen,
            postmaster: Mutex::new(None),
            ops: tokio::sync::Mutex::new(()),
            watchdog: Mutex::new(watchdog),
        };
        match populate {
            Populate::Initdb => cluster.initdb().await?,
            Populate::BaseBackup { primary_port } => cluster.base_backup(primary_port).await?,
        }
        cluster.trust_listened_networks()?;
        let mut attempt = 1;
        loop {
            let port = free_port()?;
            cluster.port.store(port, Ordering::SeqCst);
            match cluster.launch().await {
                Ok(()) => break,
                Err(StartError::PortInUse(log)) if attempt < PORT_ATTEMPTS => {
                    tracing::debug!(port, log = %log, "port taken before postgres could bind it; trying another");
                    attempt += 1;
                }
                Err(StartError::PortInUse(log)) => {
                    return Err(TestkitError::Cluster(format!(
                        "postgres could not bind a free port in {PORT_ATTEMPTS} attempts; last log:\n{log}"
                    )))
                }
                Err(StartError::Failed(e)) => return Err(e),
            }
        }
        tracing::debug!(dir = %cluster.dir.display(), port = cluster.port(), "started throwaway PostgreSQL cluster");
        Ok(cluster)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The temporary directory: `data/`, the socket, `postgres.log`.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn url(&self, database: &str) -> String {
        self.url_on(IpAddr::V4(Ipv4Addr::LOCALHOST), database)
    }

    pub(crate) fn url_on(&self, address: IpAddr, database: &str) -> String {
        format!(
            "postgres://postgres@{}:{}/{}",
            url_host(address),
            self.port(),
            encode_component(database.as_bytes())
        )
    }

    pub(crate) fn admin_config(&self) -> Config {
        let mut config = Config::new();
        config
            .host("127.0.0.1")
            .port(self.port())
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(5));
        config
    }

    /// The admin side of this cluster, which keeps it alive.
    pub(crate) fn server(self: Arc<Self>) -> Server {
        Server {
            source: Source::Initdb,
            admin: self.admin_config(),
            base_url: self.url("postgres"),
            container_id: None,
            _keep: Some(self),
            workers: Vec::new(),
            coordinator_port: None,
        }
    }

    async fn initdb(&self) -> Result<(), TestkitError> {
        let mut cmd = Command::new(self.bindir.join("initdb"));
        cmd.arg("-D")
            .arg(&self.data)
            // --no-sync: a crash of the machine during a test run loses only
            // throwaway data; the server itself still fsyncs when durable.
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            // The C locale exists everywhere; a missing LANG locale would
            // make initdb fail.
            .arg("--no-locale")
            .env_remove("PGDATA")
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        self.drop_privileges(&mut cmd);
        let program = self.bindir.join("initdb");
        let output = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .map_err(|e| TestkitError::Cluster(format!("initdb task failed: {e}")))?
            .map_err(|e| TestkitError::io(format!("running {}", program.display()), e))?;
        if output.status.success() {
            return Ok(());
        }
        Err(TestkitError::Cluster(format!(
            "{} failed ({}){}:\n{}{}",
            program.display(),
            output.status,
            self.run_as
                .as_ref()
                .map(|u| format!(" running as user {}", u.name))
                .unwrap_or_default(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }

    /// `pg_basebackup -R` of the server on `primary_port` into `data/`: the copy starts as a
    /// standby (`standby.signal`) streaming from it (`primary_conninfo`).
    async fn base_backup(&self, primary_port: u16) -> Result<(), TestkitError> {
        let program = self.bindir.join("pg_basebackup");
        let mut cmd = Command::new(&program);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-h", "127.0.0.1", "-p", &primary_port.to_string()])
            // -X stream: the WAL written during the copy comes along; -c fast: no waiting
            // for a scheduled checkpoint; --no-sync: throwaway data, as with initdb.
            .args([
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ])
            .env_remove("PGDATA")
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        self.drop_privileges(&mut cmd);
        let output = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .map_err(|e| TestkitError::Cluster(format!("pg_basebackup task failed: {e}")))?
            .map_err(|e| TestkitError::io(format!("running {}", program.display()), e))?;
        if output.status.success() {
            return Ok(());
        }
        Err(TestkitError::Cluster(format!(
            "{} from port {primary_port} failed ({}):\n{}{}",
            program.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }

    /// `127.0.0.1` and every extra address, as `listen_addresses` takes them.
    fn listen_addresses(&self) -> String {
        std::iter::once("127.0.0.1".to_owned())
            .chain(self.listen.iter().map(|(address, _)| address.to_string()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Trusts the clients of each extra address's network (initdb's pg_hba.conf trusts
    /// loopback only).
    fn trust_listened_networks(&self) -> Result<(), TestkitError> {
        if self.listen.is_empty() {
            return Ok(());
        }
        let path = self.data.join("pg_hba.conf");
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| TestkitError::io(format!("opening {}", path.display()), e))?;
        for (address, prefix) in &self.listen {
            writeln!(
                file,
                "host all all {}/{prefix} trust",
                network(*address, *prefix)
            )
            .map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))?;
        }
        Ok(())
    }

    fn drop_privileges(&self, cmd: &mut Command) {
        if let Some(user) = &self.run_as {
            // std clears the supplementary groups when root sets a uid.
            cmd.uid(user.uid).gid(user.gid);
        }
    }

    /// Starts postgres on `self.port()` and waits until it accepts
    /// connections. The caller holds `ops`.
    async fn launch(&self) -> Result<(), StartError> {
        let log_path = self.dir.join("postgres.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| TestkitError::io(format!("opening {}", log_path.display()), e))?;
        // Only this start's lines matter in an error message.
        let log_offset = log.metadata().map_or(0, |m| m.len());
        let log_err = log
            .try_clone()
            .map_err(|e| TestkitError::io("duplicating the log file handle", e))?;
        let port = self.port();
        let mut cmd = Command::new(self.bindir.join("postgres"));
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(port.to_string())
            .arg("-k")
            .arg(&self.dir)
            .arg("-c")
            .arg(format!("listen_addresses={}", self.listen_addresses()))
            .args(["-c", "max_connections=200"]);
        if self.durability == Durability::Fast {
            cmd.args(["-c", "fsync=off"])
                .args(["-c", "synchronous_commit=off"])
                .args(["-c", "full_page_writes=off"]);
        }
        for (name, value) in &self.settings {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        if self.run_as.is_some() {
            // The server runs as another user than the test: the test's HOME is not its own
            // (libpq in the server, e.g. Citus' connections to its workers, reads
            // ~/.postgresql/ and fails on a directory it may not read).
            cmd.env("HOME", &self.dir);
        }
        cmd.env_remove("PGDATA")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group: a Ctrl-C meant for the test run must not
            // reach the server before the watchdog does its cleanup.
            .process_group(0);
        self.drop_privileges(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            TestkitError::io(
                format!("starting {}", self.bindir.join("postgres").display()),
                e,
            )
        })?;
        *lock(&self.postmaster) = Some(child);
        self.wait_ready(&log_path, log_offset).await?;
        // With several addresses postgres starts when it could bind any one of them and only
        // warns about the others: a cluster missing an address it was asked for is no use.
        let log = read_log(&log_path, log_offset);
        if log.contains("could not bind") || log.contains("could not create listen socket") {
            if let Some(child) = lock(&self.postmaster).take() {
                let _ = stop_child(child, libc::SIGQUIT);
            }
            if log.contains("in use") {
                return Err(StartError::PortInUse(log));
            }
            return Err(StartError::Failed(TestkitError::Cluster(format!(
                "postgres could not listen on every address of {}; its log:\n{log}",
                self.listen_addresses()
            ))));
        }
        Ok(())
    }

    /// Polls until the server accepts connections on its Unix socket, which
    /// lives in our private directory, so no other server can answer there.
    /// postgres binds TCP before the socket, so TCP is then ready too.
    async fn wait_ready(&self, log_path: &Path, log_offset: u64) -> Result<(), StartError> {
        let mut config = Config::new();
        config
            .host_path(&self.dir)
            .port(self.port())
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(2));
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut delay = Duration::from_millis(10);
        loop {
            if let Some(status) = self.postmaster_exited()? {
                let log = read_log(log_path, log_offset);
                if log.contains("could not bind")
                    || log.contains("could not create any TCP/IP sockets")
                {
                    return Err(StartError::PortInUse(log));
                }
                return Err(StartError::Failed(TestkitError::Cluster(format!(
                    "postgres exited while starting ({status}); its log:\n{log}"
                ))));
            }
            let last_error =
                match tokio::time::timeout(Duration::from_secs(3), connect(&config)).await {
                    Ok(Ok(_client)) => return Ok(()),
                    Ok(Err(e)) => describe_pg(&e),
                    Err(_) => "connect timed out".to_owned(),
                };
            if Instant::now() >= deadline {
                let log = read_log(log_path, log_offset);
                // Leave no half-started server behind.
                if let Some(child) = lock(&self.postmaster).take() {
                    let _ = stop_child(child, libc::SIGQUIT);
                }
                return Err(StartError::Failed(TestkitError::Cluster(format!(
                    "postgres did not accept connections within {}s (last error: {last_error}); its log:\n{log}",
                    READY_TIMEOUT.as_secs()
                ))));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    fn postmaster_exited(&self) -> Result<Option<ExitStatus>, TestkitError> {
        let mut guard = lock(&self.postmaster);
        let Some(child) = guard.as_mut() else {
            return Err(TestkitError::Cluster("postgres is not running".to_owned()));
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                *guard = None;
                Ok(Some(status))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(TestkitError::io("checking on postgres", e)),
        }
    }

    pub(crate) async fn stop(&self) -> Result<(), TestkitError> {
        let _op = self.ops.lock().await;
        let Some(child) = lock(&self.postmaster).take() else {
            return Ok(());
        };
        // Fast shutdown (SIGINT): end sessions, write a checkpoint, exit.
        let status = tokio::task::spawn_blocking(move || stop_child(child, libc::SIGINT))
            .await
            .map_err(|e| TestkitError::Cluster(format!("stop task failed: {e}")))?;
        status
            .map(|status| tracing::debug!(%status, port = self.port(), "stopped cluster"))
            .map_err(|e| TestkitError::io("stopping postgres", e))
    }

    /// Immediate shutdown (`pg_ctl stop -m immediate`, SIGQUIT): every process exits at once,
    /// without a checkpoint, as in a crash; the next start runs crash recovery. Returns once
    /// postgres has exited; a no-op when it is not running.
    pub(crate) async fn stop_immediate(&self) -> Result<(), TestkitError> {
        let _op = self.ops.lock().await;
        let Some(child) = lock(&self.postmaster).take() else {
            return Ok(());
        };
        let status = tokio::task::spawn_blocking(move || stop_child(child, libc::SIGQUIT))
            .await
            .map_err(|e| TestkitError::Cluster(format!("stop task failed: {e}")))?;
        status
            .map(|status| tracing::debug!(%status, port = self.port(), "stopped cluster (immediate)"))
            .map_err(|e| TestkitError::io("stopping postgres", e))
    }

    pub(crate) async fn start_again(&self) -> Result<(), TestkitError> {
        let _op = self.ops.lock().await;
        let running = {
            let mut guard = lock(&self.postmaster);
            match guard.as_mut().map(Child::try_wait) {
                Some(Ok(None)) => true,
                Some(_) => {
                    *guard = None;
                    false
                }
                None => false,
            }
        };
        if running {
            return Ok(());
        }
        match self.launch().await {
            Ok(()) => Ok(()),
            Err(StartError::Failed(e)) => Err(e),
            Err(StartError::PortInUse(log)) => Err(TestkitError::Cluster(format!(
                "port {} was taken while the cluster was stopped; its log:\n{log}",
                self.port()
            ))),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(child) = lock(&self.postmaster).take() {
            // Immediate shutdown: the data is about to be deleted.
            if let Err(e) = stop_child(child, libc::SIGQUIT) {
                tracing::warn!(error = %e, dir = %self.dir.display(), "could not stop postgres");
            }
        }
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.dir.display(), "could not remove cluster directory")
            }
        }
        if let Some(watchdog) = lock(&self.watchdog).take() {
            // The directory is gone already, so it exits at once.
            watchdog.finish();
        }
    }
}
