//! The Docker engine: where one answers (`DOCKER_HOST`, else the usual sockets) and its API
//! version, asked with a plain `GET /version`; what a test that needs Docker calls first.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::docker::options::env_value;
use crate::error::TestkitError;

/// How long probing the engine may take before Docker counts as absent.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The environment variable that turns [`skip_without_docker`]'s skip into a failure (`1`).
pub const REQUIRE_DOCKER_ENV: &str = "PGTENANT_REQUIRE_DOCKER";

/// The engine: where it listens, whether it is on this machine, its API version.
#[derive(Debug, Clone)]
pub(crate) struct Engine {
    /// `unix:///…` or `tcp://host:port`.
    pub(crate) url: String,
    pub(crate) local: bool,
}

/// Where a Docker engine answers, described (`unix:///var/run/docker.sock, API 1.41`); an
/// error says why none does. Quick (a 2 s limit per socket), for tests that need Docker.
pub fn docker_engine() -> Result<String, TestkitError> {
    probe_engine()
        .map(|(engine, version)| match version {
            Some((major, minor)) => format!("{}, API {major}.{minor}", engine.url),
            None => engine.url,
        })
        .map_err(TestkitError::Docker)
}

/// For a test that needs Docker: `true` (after printing one line saying how to get Docker)
/// when no engine answers, so the test returns early; panics instead when
/// `PGTENANT_REQUIRE_DOCKER=1`, as CI sets it where Docker was installed on purpose.
///
/// ```no_run
/// #[tokio::test]
/// async fn needs_a_container() {
///     if pgtenant_testkit::skip_without_docker("needs_a_container") {
///         return;
///     }
///     let pg = pgtenant_testkit::DockerPostgres::start().await.unwrap();
/// }
/// ```
pub fn skip_without_docker(test: &str) -> bool {
    let Err(why) = docker_engine() else {
        return false;
    };
    if env_value(REQUIRE_DOCKER_ENV).is_some_and(|v| v != "0") {
        panic!("{test} needs Docker and {REQUIRE_DOCKER_ENV} is set: {why}");
    }
    // Straight to stderr: libtest captures print!/eprint! of a passing test, and a skip must
    // be seen.
    let _ = writeln!(
        std::io::stderr().lock(),
        "skipped {test}: needs a Docker engine — install one (e.g. `apt-get install docker.io`, then start dockerd) ({why})"
    );
    true
}

/// The engine, probed once per process (testcontainers finds the same one by the same
/// rules: `DOCKER_HOST`, then the usual sockets).
///
/// Its API version does not matter: testcontainers 0.27's bollard 0.20 builds each request
/// URL by joining an absolute path onto `/v1.52`, which drops the version, so the engine
/// serves every request at its own (measured with strace against Debian 12's Docker 20.10,
/// API 1.41, which refuses `/v1.52/…` with "client version 1.52 is too new").
pub(crate) fn prepare_engine() -> Result<Engine, String> {
    static PREPARED: OnceLock<Result<Engine, String>> = OnceLock::new();
    PREPARED
        .get_or_init(|| probe_engine().map(|(engine, _)| engine))
        .clone()
}

/// The engine `DOCKER_HOST` names, else the first usual socket that answers, with its API
/// version if it said.
fn probe_engine() -> Result<(Engine, Option<(u32, u32)>), String> {
    if let Some(host) = env_value("DOCKER_HOST") {
        let var = "DOCKER_HOST";
        let answer = if let Some(path) = host.strip_prefix("unix://") {
            version_unix(Path::new(path)).map(|v| (true, v))
        } else if let Some(addr) = host.strip_prefix("tcp://") {
            let addr = addr.split('/').next().unwrap_or(addr);
            let tls = env_value("DOCKER_TLS_VERIFY").is_some_and(|v| v == "1");
            version_tcp(addr, tls).map(|v| (is_loopback(addr), v))
        } else {
            return Err(format!(
                "{var}={host} is neither unix:// nor tcp://, which the test kit understands"
            ));
        };
        return answer
            .map(|(local, version)| {
                (
                    Engine {
                        url: host.clone(),
                        local,
                    },
                    version,
                )
            })
            .map_err(|e| format!("no Docker engine answers at {var}={host}: {e}"));
    }
    let mut candidates = vec![PathBuf::from("/var/run/docker.sock")];
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        candidates.push(Path::new(&dir).join(".docker/run/docker.sock"));
        candidates.push(Path::new(&dir).join("docker.sock"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join(".docker/run/docker.sock"));
        candidates.push(Path::new(&home).join(".docker/desktop/docker.sock"));
    }
    let mut failures = Vec::new();
    for path in candidates.iter().filter(|p| p.exists()) {
        match version_unix(path) {
            Ok(version) => {
                return Ok((
                    Engine {
                        url: format!("unix://{}", path.display()),
                        local: true,
                    },
                    version,
                ))
            }
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    if failures.is_empty() {
        Err("no Docker engine: DOCKER_HOST is unset and no docker.sock exists".to_owned())
    } else {
        Err(format!("no Docker engine answers: {}", failures.join("; ")))
    }
}

fn is_loopback(addr: &str) -> bool {
    addr.to_socket_addrs()
        .is_ok_and(|mut addrs| addrs.all(|a| a.ip().is_loopback()))
}

/// `GET /version` (unversioned: every engine answers it) on the engine's Unix socket.
fn version_unix(path: &Path) -> Result<Option<(u32, u32)>, String> {
    let stream = UnixStream::connect(path).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(PROBE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(PROBE_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    get_version(stream).map(Some)
}

/// `GET /version` over plain TCP; with TLS only a connect is checked (the version then
/// stays unknown).
fn version_tcp(addr: &str, tls: bool) -> Result<Option<(u32, u32)>, String> {
    let addrs = addr
        .to_socket_addrs()
        .map_err(|e| format!("address {addr}: {e}"))?;
    let mut last = format!("address {addr} resolves to nothing");
    for a in addrs {
        match TcpStream::connect_timeout(&a, PROBE_TIMEOUT) {
            Ok(stream) if tls => {
                drop(stream);
                return Ok(None);
            }
            Ok(stream) => {
                stream
                    .set_read_timeout(Some(PROBE_TIMEOUT))
                    .and_then(|()| stream.set_write_timeout(Some(PROBE_TIMEOUT)))
                    .map_err(|e| e.to_string())?;
                return get_version(stream).map(Some);
            }
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(last)
}

fn get_version(mut stream: impl Read + Write) -> Result<(u32, u32), String> {
    stream
        .write_all(b"GET /version HTTP/1.0\r\nHost: docker\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    stream
        .take(256 * 1024)
        .read_to_end(&mut reply)
        .map_err(|e| e.to_string())?;
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.lines().next().unwrap_or("");
    if !(status.starts_with("HTTP/1.") && status.contains(" 200")) {
        return Err(format!("unexpected answer to GET /version: {status:?}"));
    }
    api_version(&reply).ok_or_else(|| "GET /version did not say the API version".to_owned())
}

/// `"ApiVersion":"1.41"` in the engine's `/version` answer.
fn api_version(body: &str) -> Option<(u32, u32)> {
    let start = body.find("\"ApiVersion\"")? + "\"ApiVersion\"".len();
    let rest = body[start..].trim_start().strip_prefix(':')?.trim_start();
    let value = rest.strip_prefix('"')?;
    let value = &value[..value.find('"')?];
    let (major, minor) = value.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_engine_api_version() {
        let body = "HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\n\r\n{\"Platform\":{\"Name\":\"\"},\"Version\":\"20.10.24\",\"ApiVersion\": \"1.41\",\"MinAPIVersion\":\"1.12\"}";
        assert_eq!(api_version(body), Some((1, 41)));
        assert_eq!(api_version("{\"Version\":\"x\"}"), None);
    }
}
