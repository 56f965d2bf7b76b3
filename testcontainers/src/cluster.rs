//! Throwaway clusters made with the machine's own `initdb` and `postgres`.

use std::ffi::CString;
use std::fmt;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio_postgres::Config;

use crate::database::{connect, encode_component, Server, TestDatabase};
use crate::error::{describe_pg, TestkitError};
use crate::{sweep, Source};

/// Temporary directories are named `<TEMP_PREFIX><pid>-<n>`; the sweep of
/// leftovers relies on it.
pub(crate) const TEMP_PREFIX: &str = "pgtenant-testkit-";

/// The file in a temporary directory naming the process that made it, so a
/// sweep never removes the directory of a live test process.
pub(crate) const OWNER_FILE: &str = "owner.pid";

/// How long a starting server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a new port is tried when the chosen one was taken meanwhile.
const PORT_ATTEMPTS: usize = 5;

/// Cleans up a cluster directory when its stdin closes, which happens when
/// the owning process exits in any way (even SIGKILL): a static cluster is
/// never dropped, and a killed test never runs `Drop`.
/// `$1` is the directory. It stops the postmaster named in `postmaster.pid`
/// (only if that process is a postgres) and removes the directory.
const WATCHDOG_SCRIPT: &str = r#"
trap '' HUP INT QUIT TERM PIPE
cat >/dev/null 2>&1
dir=$1
pidfile=$dir/data/postmaster.pid
if [ -f "$pidfile" ]; then
  pid=
  read -r pid < "$pidfile" 2>/dev/null
  case $pid in ''|*[!0-9]*) pid= ;; esac
  if [ -n "$pid" ] && [ "$(cat /proc/$pid/comm 2>/dev/null || ps -o comm= -p "$pid" 2>/dev/null)" = postgres ]; then
    kill -QUIT "$pid" 2>/dev/null
    i=0
    while [ -f "$pidfile" ] && [ $i -lt 100 ] && kill -0 "$pid" 2>/dev/null; do
      sleep 0.1
      i=$((i+1))
    done
  fi
fi
rm -rf "$dir"
"#;

/// Whether a cluster keeps its data safe across crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Default settings: what a [`LocalCluster`] test of restarts needs.
    Durable,
    /// `fsync=off` and friends: the shared cluster only serves throwaway
    /// databases and is never restarted.
    Fast,
}

/// The unprivileged account initdb and postgres run as when we are root
/// (both refuse to run as root).
#[derive(Debug, Clone)]
struct RunAs {
    name: String,
    uid: u32,
    gid: u32,
}

struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
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
enum Populate {
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
        if let Some(mut watchdog) = lock(&self.watchdog).take() {
            // Closing stdin lets it finish; the directory is gone already, so
            // it exits at once. Reap it so no zombie is left behind.
            drop(watchdog.stdin.take());
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(watchdog.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Sends `signal`, waits for the exit and escalates (SIGQUIT, then SIGKILL)
/// if postgres takes too long.
fn stop_child(mut child: Child, signal: libc::c_int) -> std::io::Result<ExitStatus> {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        child.kill()?;
        return child.wait();
    };
    for (signal, patience) in [
        (signal, Duration::from_secs(60)),
        (libc::SIGQUIT, Duration::from_secs(10)),
    ] {
        // SAFETY: kill has no memory-safety preconditions; `pid` is our own
        // unreaped child, so it cannot have been reused by another process.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    child.kill()?;
    child.wait()
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values stay consistent even if a holder panicked.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The last lines of the server log from `offset` on.
fn read_log(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    let read = fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(())
    });
    if let Err(e) = read {
        return format!("(could not read {}: {e})", path.display());
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The network of `address` with a prefix of `prefix` bits (host bits cleared), as pg_hba.conf
/// expects it.
fn network(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// `address` as the host part of a URL (IPv6 in brackets).
fn url_host(address: IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

pub(crate) fn free_port() -> Result<u16, TestkitError> {
    // The kernel picks a free port; postgres binds it a moment later, and a
    // lost race shows up as a bind error, which is retried.
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| TestkitError::io("finding a free port on 127.0.0.1", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| TestkitError::io("finding a free port on 127.0.0.1", e))
}

/// A CA (`ca.pem`) and a server certificate for 127.0.0.1 signed by it
/// (`server.pem`, `server.key`) in `dir`, made with the openssl command; the key is owned by
/// the server's user, as PostgreSQL requires.
async fn make_certificates(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), TestkitError> {
    async fn openssl(dir: &Path, args: Vec<&str>) -> Result<(), TestkitError> {
        let out = tokio::process::Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .output()
            .await
            .map_err(|e| TestkitError::io("running openssl (apt-get install openssl)", e))?;
        if !out.status.success() {
            return Err(TestkitError::Cluster(format!(
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }
    let new_key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=pgtenant-testkit CA",
    ];
    ca.extend(new_key);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, ca).await?;
    let mut request = vec!["req", "-subj", "/CN=127.0.0.1"];
    request.extend(new_key);
    request.extend(["-keyout", "server.key", "-out", "server.csr"]);
    openssl(dir, request).await?;
    fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
        .map_err(|e| TestkitError::io("writing san.ext", e))?;
    openssl(
        dir,
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    )
    .await?;
    let protect = || -> std::io::Result<()> {
        fs::set_permissions(dir.join("server.key"), fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = owner {
            for file in ["server.key", "server.pem", "ca.pem"] {
                std::os::unix::fs::chown(dir.join(file), Some(uid), Some(gid))?;
            }
        }
        Ok(())
    };
    protect().map_err(|e| TestkitError::io("handing the certificates to the server's user", e))
}

fn make_temp_dir(run_as: Option<&RunAs>) -> Result<PathBuf, TestkitError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let parent = std::env::temp_dir();
    let pid = std::process::id();
    // A leftover of a dead process with our pid may exist; take the next name.
    let dir = loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("{TEMP_PREFIX}{pid}-{n}"));
        match fs::create_dir(&dir) {
            Ok(()) => break dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => continue,
            Err(e) => return Err(TestkitError::io(format!("creating {}", dir.display()), e)),
        }
    };
    let setup = || -> std::io::Result<()> {
        fs::write(dir.join(OWNER_FILE), pid.to_string())?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        if let Some(user) = run_as {
            std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid))?;
        }
        Ok(())
    };
    if let Err(e) = setup() {
        let _ = fs::remove_dir_all(&dir);
        return Err(TestkitError::io(format!("preparing {}", dir.display()), e));
    }
    Ok(dir)
}

fn spawn_watchdog(dir: &Path) -> Option<Watchdog> {
    let spawned = Command::new("/bin/sh")
        .arg("-c")
        .arg(WATCHDOG_SCRIPT)
        .arg("pgtenant-testkit-watchdog")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Survives a Ctrl-C of the test run, so it can clean up after it.
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut child) => {
            let stdin = child.stdin.take();
            Some(Watchdog { child, stdin })
        }
        Err(e) => {
            tracing::warn!(error = %e, "no cleanup watchdog: /bin/sh could not be started; a killed test may leave its cluster behind");
            None
        }
    }
}

/// `None` unless we are root; then the `postgres` or else `nobody` account.
fn run_as() -> Result<Option<RunAs>, TestkitError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        if let Some((uid, gid)) = lookup_user(name) {
            if uid != 0 {
                return Ok(Some(RunAs {
                    name: name.to_owned(),
                    uid,
                    gid,
                }));
            }
        }
    }
    Err(TestkitError::Cluster(
        "this process runs as root, which initdb and postgres refuse, and neither user \
         `postgres` nor `nobody` exists to run them as; create one (e.g. `useradd postgres`)"
            .to_owned(),
    ))
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain data; all-zero is a valid value to be overwritten.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call, and `buf.len()` is the
    // length of `buf`; getpwnam_r writes only into `pwd` and `buf`.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    Some((pwd.pw_uid, pwd.pw_gid))
}

/// The directory holding `initdb` and `postgres`, searched once per process.
pub(crate) fn find_bindir() -> Result<PathBuf, String> {
    static BINDIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINDIR.get_or_init(search_bindir).clone()
}

fn search_bindir() -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    if let Some(dir) = std::env::var_os("PGTENANT_TESTKIT_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        if has_server(&dir) {
            return Ok(dir);
        }
        looked.push(format!(
            "PGTENANT_TESTKIT_PG_BINDIR={} has no initdb and postgres",
            dir.display()
        ));
    }
    match Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if has_server(&dir) {
                return Ok(dir);
            }
            looked.push(format!(
                "`pg_config --bindir` is {}, which has no initdb and postgres (only the client is installed?)",
                dir.display()
            ));
        }
        _ => looked.push("no pg_config on PATH".to_owned()),
    }
    let mut on_path = false;
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let initdb = dir.join("initdb");
        if !initdb.is_file() {
            continue;
        }
        on_path = true;
        // Debian links /usr/bin or /usr/local/bin entries to the real bindir;
        // postgres must come from the same installation as initdb.
        if let Some(real) = fs::canonicalize(&initdb)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            if has_server(&real) {
                return Ok(real);
            }
        }
        if has_server(&dir) {
            return Ok(dir);
        }
    }
    looked.push(if on_path {
        "initdb on PATH has no postgres beside it".to_owned()
    } else {
        "no initdb on PATH".to_owned()
    });
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = Vec::new();
    // Debian/Ubuntu: /usr/lib/postgresql/<version>/bin.
    if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            versioned.push((version_key(&name), entry.path().join("bin")));
        }
    }
    // RHEL/Fedora (PGDG): /usr/pgsql-<version>/bin.
    if let Ok(entries) = fs::read_dir("/usr") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(version) = name.strip_prefix("pgsql-") {
                versioned.push((version_key(version), entry.path().join("bin")));
            }
        }
    }
    versioned.sort_by(|a, b| b.0.cmp(&a.0));
    if let Some((_, dir)) = versioned.into_iter().find(|(_, dir)| has_server(dir)) {
        return Ok(dir);
    }
    looked.push(
        "no /usr/lib/postgresql/*/bin or /usr/pgsql-*/bin with initdb and postgres".to_owned(),
    );
    Err(format!(
        "no PostgreSQL server binaries (initdb and postgres) on this machine: {}; install them \
         (e.g. `apt-get install postgresql`) or set PGTENANT_TESTKIT_PG_BINDIR",
        looked.join("; ")
    ))
}

fn version_key(version: &str) -> Vec<u32> {
    version
        .split('.')
        .map(|part| part.parse().unwrap_or(0))
        .collect()
}

fn has_server(dir: &Path) -> bool {
    let executable = |name: &str| {
        fs::metadata(dir.join(name))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    executable("initdb") && executable("postgres")
}

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
        let admin = crate::database::connect_admin(&cluster.inner.admin_config()).await?;
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
    /// is [`Source::Initdb`]. It keeps the cluster alive until it is dropped.
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
