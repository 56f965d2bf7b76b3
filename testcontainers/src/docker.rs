//! The `docker` source: a PostgreSQL container for the whole test process.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ImageExt};
use testcontainers_modules::postgres::Postgres;
use tokio_postgres::Config;

use crate::database::{check_admin, Server};
use crate::Source;

/// Pinned: the module's default tag (11-alpine) is long out of support.
pub(crate) const POSTGRES_TAG: &str = "17.6-alpine";

/// How long pulling the image and starting the container may take.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// How long probing the engine may take before Docker counts as absent.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The container and its remover live as long as the process: a static is
/// never dropped, so the remover (a `docker rm -f` waiting for our exit)
/// does the cleanup.
struct Kept {
    _container: ContainerAsync<Postgres>,
    _remover: Option<(Child, ChildStdin)>,
}

static KEPT: OnceLock<Kept> = OnceLock::new();

pub(crate) async fn start() -> Result<Server, String> {
    let engine = tokio::task::spawn_blocking(probe_engine)
        .await
        .map_err(|e| format!("probing Docker failed: {e}"))??;
    let request = Postgres::default().with_host_auth().with_tag(POSTGRES_TAG);
    let container = tokio::time::timeout(START_TIMEOUT, request.start())
        .await
        .map_err(|_| {
            format!(
                "postgres:{POSTGRES_TAG} did not start within {}s on the engine at {engine}",
                START_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("starting postgres:{POSTGRES_TAG} on the engine at {engine}: {e}"))?;
    let host = container
        .get_host()
        .await
        .map_err(|e| format!("asking Docker for the container's host: {e}"))?
        .to_string();
    let port = container
        .get_host_port_ipv4(5432)
        .await
        .map_err(|e| format!("asking Docker for the container's port: {e}"))?;
    let remover = spawn_remover(container.id());
    // The cell is filled once: shared_server runs this at most once.
    let _ = KEPT.set(Kept {
        _container: container,
        _remover: remover,
    });

    let bare_host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut admin = Config::new();
    admin
        .host(&bare_host)
        .port(port)
        .user("postgres")
        .password("postgres")
        .dbname("postgres")
        .connect_timeout(Duration::from_secs(5));
    // The image runs a temporary server for its init scripts first; its
    // "ready" line can end the module's wait before the real server is up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match check_admin(&admin).await {
            Ok(()) => break,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "container postgres:{POSTGRES_TAG} at {host}:{port}: {e}"
                ))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    Ok(Server {
        source: Source::Docker,
        admin,
        base_url: format!("postgres://postgres:postgres@{host}:{port}/postgres"),
        _cluster: None,
    })
}

/// Whether a Docker engine answers, without waiting on one that does not:
/// `DOCKER_HOST` if set, else the usual socket paths.
fn probe_engine() -> Result<String, String> {
    if let Some(host) = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.trim().is_empty())
    {
        let answered = if let Some(path) = host.strip_prefix("unix://") {
            ping_unix(Path::new(path))
        } else if let Some(addr) = host.strip_prefix("tcp://") {
            connect_tcp(addr.split('/').next().unwrap_or(addr))
        } else {
            return Err(format!(
                "DOCKER_HOST={host} is neither unix:// nor tcp://, which this probe understands"
            ));
        };
        return answered
            .map(|()| host.clone())
            .map_err(|e| format!("no Docker engine answers at DOCKER_HOST={host}: {e}"));
    }
    let mut candidates = vec![PathBuf::from("/var/run/docker.sock")];
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        candidates.push(Path::new(&dir).join("docker.sock"));
        candidates.push(Path::new(&dir).join(".docker/run/docker.sock"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join(".docker/run/docker.sock"));
        candidates.push(Path::new(&home).join(".docker/desktop/docker.sock"));
    }
    let mut failures = Vec::new();
    for path in candidates.iter().filter(|p| p.exists()) {
        match ping_unix(path) {
            Ok(()) => return Ok(format!("unix://{}", path.display())),
            Err(e) => failures.push(e),
        }
    }
    if failures.is_empty() {
        Err("no Docker engine: DOCKER_HOST is unset and no docker.sock exists".to_owned())
    } else {
        Err(format!("no Docker engine answers: {}", failures.join("; ")))
    }
}

/// `GET /_ping` on the engine's Unix socket.
fn ping_unix(path: &Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut stream = UnixStream::connect(path).map_err(fail)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT)).map_err(fail)?;
    stream
        .set_write_timeout(Some(PROBE_TIMEOUT))
        .map_err(fail)?;
    stream
        .write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        .map_err(fail)?;
    let mut reply = [0u8; 32];
    let n = stream.read(&mut reply).map_err(fail)?;
    let status = String::from_utf8_lossy(&reply[..n]);
    if status.starts_with("HTTP/1.") && status.contains(" 200") {
        Ok(())
    } else {
        Err(format!("{}: unexpected answer {status:?}", path.display()))
    }
}

/// A TCP engine may speak TLS, so only a connect is checked.
fn connect_tcp(addr: &str) -> Result<(), String> {
    let addrs = addr
        .to_socket_addrs()
        .map_err(|e| format!("DOCKER_HOST address {addr}: {e}"))?;
    let mut last = format!("DOCKER_HOST address {addr} resolves to nothing");
    for a in addrs {
        match TcpStream::connect_timeout(&a, PROBE_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(last)
}

/// `docker rm -f` of the container once this process exits (its stdin pipe
/// closes then), if the docker CLI exists.
fn spawn_remover(id: &str) -> Option<(Child, ChildStdin)> {
    let spawned = Command::new("/bin/sh")
        .arg("-c")
        .arg("trap '' HUP INT QUIT TERM PIPE; cat >/dev/null 2>&1; command -v docker >/dev/null && docker rm -f -v \"$1\" >/dev/null 2>&1")
        .arg("pgtenant-testkit-container-remover")
        .arg(id)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut child) => child.stdin.take().map(|stdin| (child, stdin)),
        Err(e) => {
            tracing::warn!(error = %e, container = %id, "no remover for the test container; remove it by hand after the run");
            None
        }
    }
}
