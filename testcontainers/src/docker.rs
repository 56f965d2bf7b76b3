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

use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio_postgres::Config;

use crate::cluster::{free_port, lock};
use crate::database::{check_admin, encode_component, Server, TestDatabase};
use crate::error::TestkitError;
use crate::{sweep, Source};

/// The environment variable naming the image: `name[:tag]` or `name@sha256:…`.
pub const IMAGE_ENV: &str = "PGTENANT_TESTKIT_IMAGE";

/// The environment variable choosing the network mode: `published` or `host`.
pub const NETWORK_ENV: &str = "PGTENANT_TESTKIT_DOCKER_NETWORK";

/// The environment variable that turns [`skip_without_docker`]'s skip into a failure (`1`).
pub const REQUIRE_DOCKER_ENV: &str = "PGTENANT_REQUIRE_DOCKER";

/// The image used unless [`IMAGE_ENV`] or [`DockerOptions::with_image`] says otherwise: the
/// official image's newest released major (18; 19 had only beta tags on Docker Hub in
/// September 2026), on Alpine, the smaller variant. A major tag rather than a minor one, so
/// CI gets the minor (security) releases.
pub const DEFAULT_IMAGE: &str = "postgres:18-alpine";

/// Every container the test kit starts carries this label; its value is the test binary's
/// name without cargo's hash (`testkit`, `control_plane`), so CI can count containers per
/// test file from `docker events`.
pub const CONTAINER_LABEL: &str = "pgtenant.testkit";

/// This label's value is unique to the test process; the remover removes by it.
const OWNER_LABEL: &str = "pgtenant.testkit.owner";

/// What the server prints once it accepts connections. The official image first runs a
/// temporary server for its init scripts; that one's log goes to stdout (pg_ctl redirects it),
/// so on stderr this line means the real server.
const READY_LINE: &str = "database system is ready to accept connections";

/// Pulling the image and starting the container may take this long in all.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// testcontainers' own limit for start + wait, once the image is there.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long probing the engine may take before Docker counts as absent.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Host networking: how many free ports are tried when another process takes one first.
const PORT_ATTEMPTS: usize = 3;

/// How the test process reaches the container's PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DockerNetwork {
    /// The container's port 5432 is published on an ephemeral host port (on `127.0.0.1` when the
    /// engine is local). What CI runners and laptops with Docker do.
    #[default]
    Published,
    /// The container shares the host's network (`--network host`); PostgreSQL listens on
    /// `127.0.0.1` at a free port (`-c port=NNNN`). For machines where containers may not use
    /// a bridge network. Needs a local engine.
    Host,
}

impl DockerNetwork {
    /// `published` or `host`, as [`NETWORK_ENV`] takes them.
    pub fn as_str(self) -> &'static str {
        match self {
            DockerNetwork::Published => "published",
            DockerNetwork::Host => "host",
        }
    }
}

impl fmt::Display for DockerNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DockerNetwork {
    type Err = TestkitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "published" => Ok(DockerNetwork::Published),
            "host" => Ok(DockerNetwork::Host),
            _ => Err(TestkitError::InvalidSetting {
                name: NETWORK_ENV,
                value: s.to_owned(),
                expected: "`published` or `host`",
            }),
        }
    }
}

/// Which image a container runs and how it is reached.
///
/// [`DockerOptions::from_env`] is what the `docker` source uses:
/// `PGTENANT_TESTKIT_IMAGE` (default [`DEFAULT_IMAGE`]) and
/// `PGTENANT_TESTKIT_DOCKER_NETWORK` (default [`DockerNetwork::Published`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerOptions {
    image: String,
    network: DockerNetwork,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            image: DEFAULT_IMAGE.to_owned(),
            network: DockerNetwork::Published,
        }
    }
}

impl DockerOptions {
    /// The defaults, overridden by `PGTENANT_TESTKIT_IMAGE` and
    /// `PGTENANT_TESTKIT_DOCKER_NETWORK` where set (and not empty).
    pub fn from_env() -> Result<DockerOptions, TestkitError> {
        let mut options = DockerOptions::default();
        if let Some(image) = env_value(IMAGE_ENV) {
            options.image = image;
        }
        if let Some(network) = env_value(NETWORK_ENV) {
            options.network = network.parse()?;
        }
        Ok(options)
    }

    /// Runs this image (`name[:tag]`, `registry:port/name:tag` or `name@sha256:…`); it must
    /// behave like the official `postgres` image (`POSTGRES_HOST_AUTH_METHOD`, arguments
    /// passed on to `postgres`, the ready line on stderr).
    #[must_use]
    pub fn with_image(mut self, image: impl Into<String>) -> DockerOptions {
        self.image = image.into().trim().to_owned();
        self
    }

    /// Reaches the server this way.
    #[must_use]
    pub fn with_network(mut self, network: DockerNetwork) -> DockerOptions {
        self.network = network;
        self
    }

    /// The image reference.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The network mode.
    pub fn network(&self) -> DockerNetwork {
        self.network
    }
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// `name:tag` → (`name`, `tag`); no tag → `latest`. A digest splits the same way
/// (`name@sha256`, hex), which testcontainers joins back with `:` into a valid reference.
fn split_image(reference: &str) -> (String, String) {
    let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[last_slash..].rfind(':') {
        Some(i) => (
            reference[..last_slash + i].to_owned(),
            reference[last_slash + i + 1..].to_owned(),
        ),
        None => (reference.to_owned(), "latest".to_owned()),
    }
}

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
    /// [`Source::Docker`]. It keeps the container alive until it is dropped.
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

/// The container, where it listens and how long it took to start.
struct Container {
    id: String,
    image: String,
    network: DockerNetwork,
    host: String,
    port: u16,
    startup: Duration,
    /// Dropping it is testcontainers' removal; taken out by [`Container::remove`].
    handle: Mutex<Option<ContainerAsync<GenericImage>>>,
}

impl Container {
    async fn start(options: &DockerOptions) -> Result<Container, String> {
        let began = Instant::now();
        let engine = tokio::task::spawn_blocking(prepare_engine)
            .await
            .map_err(|e| format!("probing Docker failed: {e}"))??;
        // Before the container exists: a kill during the start must not leave it behind.
        ensure_remover(&engine);
        let image = &options.image;
        let mut attempt = 1;
        let (handle, port) = loop {
            let port = match options.network {
                DockerNetwork::Host => free_port().map_err(|e| e.to_string())?,
                DockerNetwork::Published => 5432,
            };
            let request = container_request(options, port, &engine);
            let started = tokio::time::timeout(START_TIMEOUT, request.start()).await;
            match started {
                Ok(Ok(handle)) => break (handle, port),
                Err(_) => {
                    return Err(format!(
                        "{image} did not start within {}s on the Docker engine at {}",
                        START_TIMEOUT.as_secs(),
                        engine.url
                    ))
                }
                Ok(Err(e)) => {
                    let e = e.to_string();
                    // Host networking: another process took the free port before postgres
                    // bound it; the container exited and testcontainers removed it.
                    if options.network == DockerNetwork::Host
                        && e.contains("Address already in use")
                        && attempt < PORT_ATTEMPTS
                    {
                        tracing::debug!(
                            port,
                            "port taken before the container's postgres bound it; trying another"
                        );
                        attempt += 1;
                        continue;
                    }
                    return Err(start_error(image, &engine, &e));
                }
            }
        };
        let id = handle.id().to_owned();
        let (host, port) = match options.network {
            DockerNetwork::Host => ("127.0.0.1".to_owned(), port),
            DockerNetwork::Published => {
                let host = handle
                    .get_host()
                    .await
                    .map_err(|e| format!("asking Docker for container {id}'s host: {e}"))?
                    .to_string();
                let port = handle
                    .get_host_port_ipv4(5432)
                    .await
                    .map_err(|e| format!("asking Docker for container {id}'s port: {e}"))?;
                // Tests talk to 127.0.0.1, never to whatever "localhost" resolves to first.
                let host = match host.as_str() {
                    "localhost" => "127.0.0.1".to_owned(),
                    other => other
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_owned(),
                };
                (host, port)
            }
        };
        let mut container = Container {
            id,
            image: image.clone(),
            network: options.network,
            host,
            port,
            startup: Duration::ZERO,
            handle: Mutex::new(Some(handle)),
        };
        // The wait strategy saw the ready line, so one query must succeed at once; it also
        // checks the version and the right to create databases.
        check_admin(&container.admin_config()).await.map_err(|e| {
            format!(
                "container {} ({image}) at {}:{}: {e}",
                container.id, container.host, container.port
            )
        })?;
        container.startup = began.elapsed();
        tracing::info!(container = %container.id, %image, network = %options.network, port = container.port, startup_ms = container.startup.as_millis() as u64, "started PostgreSQL container");
        Ok(container)
    }

    fn admin_config(&self) -> Config {
        let mut admin = Config::new();
        admin
            .host(&self.host)
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(5));
        admin
    }

    fn url(&self, database: &str) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!(
            "postgres://postgres@{host}:{}/{}",
            self.port,
            encode_component(database.as_bytes())
        )
    }

    fn server(self: Arc<Self>) -> Server {
        Server {
            source: Source::Docker,
            admin: self.admin_config(),
            base_url: self.url("postgres"),
            container_id: Some(self.id.clone()),
            _keep: Some(self),
            workers: Vec::new(),
            coordinator_port: None,
        }
    }

    /// Removes the container now, through testcontainers' drop (which blocks until Docker
    /// has removed it). That drop needs a tokio runtime context. Outside one (at exit, or
    /// dropped after its runtime ended) it runs on a thread of its own with a small runtime:
    /// at exit this thread's thread-locals, tokio's context among them, may already be gone
    /// (measured: "The Tokio context thread-local variable has been destroyed", then an
    /// abort, when the main thread had used a runtime).
    fn remove(&self) {
        let Some(handle) = lock(&self.handle).take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(handle);
            return;
        }
        let id = self.id.clone();
        let removed = std::thread::Builder::new()
            .name("pgtenant-testkit-remove".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => {
                        let _entered = runtime.enter();
                        drop(handle);
                    }
                    Err(e) => {
                        tracing::warn!(container = %id, error = %e, "no runtime to remove the test container; the remover process removes it after exit");
                        std::mem::forget(handle);
                    }
                }
            })
            .map(|thread| thread.join().is_ok());
        if !matches!(removed, Ok(true)) {
            tracing::warn!(container = %self.id, "removing the test container failed; the remover process removes it after exit");
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The request: image, wait strategy, server settings, labels and network.
fn container_request(
    options: &DockerOptions,
    port: u16,
    engine: &Engine,
) -> testcontainers::ContainerRequest<GenericImage> {
    let (name, tag) = split_image(&options.image);
    let mut image =
        GenericImage::new(name, tag).with_wait_for(WaitFor::message_on_stderr(READY_LINE));
    if options.network == DockerNetwork::Published {
        image = image.with_exposed_port(5432.tcp());
    }
    // The same speed settings as the shared initdb cluster: the databases are throwaway.
    let mut cmd: Vec<String> = [
        "postgres",
        "-c",
        "fsync=off",
        "-c",
        "synchronous_commit=off",
        "-c",
        "full_page_writes=off",
        "-c",
        "max_connections=200",
    ]
    .map(str::to_owned)
    .to_vec();
    if options.network == DockerNetwork::Host {
        // Later -c settings win over the entrypoint's listen_addresses='*': with the host's
        // network, '*' would offer a trust-auth server on every interface.
        cmd.extend([
            "-c".to_owned(),
            format!("port={port}"),
            "-c".to_owned(),
            "listen_addresses=127.0.0.1".to_owned(),
        ]);
    }
    let request = image
        .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
        .with_cmd(cmd)
        .with_label(CONTAINER_LABEL, binary_name())
        .with_label(OWNER_LABEL, owner_token())
        .with_startup_timeout(STARTUP_TIMEOUT);
    match options.network {
        DockerNetwork::Host => {
            request
                .with_network("host")
                .with_host_config_modifier(|config: &mut HostConfig| {
                    // testcontainers publishes all ports by default; with host networking
                    // there is nothing to publish.
                    config.publish_all_ports = Some(false);
                    config.port_bindings = None;
                })
        }
        // A local engine publishes on 127.0.0.1 only, not on every interface.
        DockerNetwork::Published if engine.local => {
            request.with_host_config_modifier(|config: &mut HostConfig| {
                config.publish_all_ports = Some(false);
                config.port_bindings = Some(HashMap::from([(
                    "5432/tcp".to_owned(),
                    Some(vec![PortBinding {
                        host_ip: Some("127.0.0.1".to_owned()),
                        host_port: Some(String::new()),
                    }]),
                )]));
            })
        }
        DockerNetwork::Published => request,
    }
}

/// A start failure, with what to do about the usual causes.
fn start_error(image: &str, engine: &Engine, error: &str) -> String {
    let mut message = format!(
        "starting {image} on the Docker engine at {}: {error}",
        engine.url
    );
    if error.contains("pull") || error.contains("No such image") || error.contains("not found") {
        message.push_str(&format!(
            ". The engine does not have {image} and could not pull it: run `docker pull {image}`, \
             or set {IMAGE_ENV} to an image it has (`docker images`). Without a registry, build \
             one from Debian's PostgreSQL packages (`docker build`) and name it in {IMAGE_ENV}"
        ));
    } else if error.contains("network") && error.contains("bridge") {
        message.push_str(&format!(
            ". If containers may not use a bridge network here, set {NETWORK_ENV}=host"
        ));
    }
    message
}

/// The per-process container of the `docker` source.
static SHARED: OnceLock<Arc<Container>> = OnceLock::new();

/// The `docker` source: one container for the whole test process, removed at its exit.
pub(crate) async fn start() -> Result<Server, String> {
    let options = DockerOptions::from_env().map_err(|e| e.to_string())?;
    let container = Arc::new(Container::start(&options).await?);
    // database::shared_server runs this at most once per process.
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

/// The engine: where it listens, whether it is on this machine, its API version.
#[derive(Debug, Clone)]
struct Engine {
    /// `unix:///…` or `tcp://host:port`.
    url: String,
    local: bool,
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
fn prepare_engine() -> Result<Engine, String> {
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

/// The test binary's name without cargo's `-<hash>`, for [`CONTAINER_LABEL`].
fn binary_name() -> String {
    let name = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".to_owned());
    match name.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            stem.to_owned()
        }
        _ => name,
    }
}

/// Unique to this process (pids are reused; the start time makes the token unique).
fn owner_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos}", std::process::id())
    })
}

/// Removes every container labelled with our token once its stdin closes, which happens
/// when this process exits in any way, SIGKILL included. `$1` is the token; `DOCKER_HOST` is
/// the engine the containers were started on. Its own process group: a Ctrl-C of the test
/// run does not stop it.
const REMOVER_SCRIPT: &str = r#"
trap '' HUP INT QUIT TERM PIPE
cat >/dev/null 2>&1
ids=$(docker ps -aq --filter "label=pgtenant.testkit.owner=$1" 2>/dev/null)
[ -n "$ids" ] && docker rm -f -v $ids >/dev/null 2>&1
exit 0
"#;

struct Remover {
    _child: Child,
    _stdin: ChildStdin,
}

/// Spawns this process's remover, once.
fn ensure_remover(engine: &Engine) {
    static REMOVER: OnceLock<Option<Remover>> = OnceLock::new();
    REMOVER.get_or_init(|| {
        let spawned = Command::new("/bin/sh")
            .arg("-c")
            .arg(REMOVER_SCRIPT)
            .arg("pgtenant-testkit-container-remover")
            .arg(owner_token())
            .env("DOCKER_HOST", &engine.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        let has_cli = Command::new("docker")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_cli {
            tracing::warn!("no docker command: if this test process is killed, its containers stay (remove them with the label {OWNER_LABEL}={})", owner_token());
        }
        match spawned {
            Ok(mut child) => child.stdin.take().map(|stdin| Remover {
                _child: child,
                _stdin: stdin,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "no remover process (/bin/sh): if this test process is killed, its containers stay");
                None
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_image_references() {
        for (reference, name, tag) in [
            ("postgres:18-alpine", "postgres", "18-alpine"),
            ("local/postgres:15", "local/postgres", "15"),
            ("postgres", "postgres", "latest"),
            ("registry:5000/pg", "registry:5000/pg", "latest"),
            ("registry:5000/pg:17", "registry:5000/pg", "17"),
            ("postgres@sha256:abcd", "postgres@sha256", "abcd"),
        ] {
            assert_eq!(
                split_image(reference),
                (name.to_owned(), tag.to_owned()),
                "{reference}"
            );
            // testcontainers joins them with ':' into the same reference (or adds :latest).
            let joined = format!("{name}:{tag}");
            assert!(
                joined == reference || joined == format!("{reference}:latest"),
                "{joined}"
            );
        }
    }

    #[test]
    fn parses_network_modes() {
        assert_eq!(
            " Host ".parse::<DockerNetwork>().expect("host"),
            DockerNetwork::Host
        );
        assert_eq!(
            "published".parse::<DockerNetwork>().expect("published"),
            DockerNetwork::Published
        );
        let e = "bridge".parse::<DockerNetwork>().expect_err("unknown");
        let message = e.to_string();
        assert!(
            message.contains(NETWORK_ENV) && message.contains("\"bridge\""),
            "{message}"
        );
    }

    #[test]
    fn reads_the_engine_api_version() {
        let body = "HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\n\r\n{\"Platform\":{\"Name\":\"\"},\"Version\":\"20.10.24\",\"ApiVersion\": \"1.41\",\"MinAPIVersion\":\"1.12\"}";
        assert_eq!(api_version(body), Some((1, 41)));
        assert_eq!(api_version("{\"Version\":\"x\"}"), None);
    }

    #[test]
    fn binary_names_lose_cargos_hash() {
        // The unit-test binary itself: pgtenant_testkit-<16 hex>.
        assert_eq!(binary_name(), "pgtenant_testkit");
    }
}
