//! A PostgreSQL container: the request (image, wait strategy, settings, labels, network),
//! its start (with retries on a lost port under host networking), where it listens, and its
//! removal through testcontainers' drop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio_postgres::Config;

use crate::admin::check_admin;
use crate::cluster::ports::free_port;
use crate::docker::api::{prepare_engine, Engine};
use crate::docker::options::{split_image, DockerNetwork, DockerOptions, IMAGE_ENV, NETWORK_ENV};
use crate::docker::remover::{ensure_remover, owner_token, OWNER_LABEL};
use crate::server::Server;
use crate::source::Source;
use crate::sync::lock;
use crate::url::encode_component;

/// Every container the test kit starts carries this label; its value is the test binary's
/// name without cargo's hash (`testkit`, `control_plane`), so CI can count containers per
/// test file from `docker events`.
pub const CONTAINER_LABEL: &str = "pgtenant.testkit";

/// What the server prints once it accepts connections. The official image first runs a
/// temporary server for its init scripts; that one's log goes to stdout (pg_ctl redirects it),
/// so on stderr this line means the real server.
const READY_LINE: &str = "database system is ready to accept connections";

/// Pulling the image and starting the container may take this long in all.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// testcontainers' own limit for start + wait, once the image is there.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Host networking: how many free ports are tried when another process takes one first.
const PORT_ATTEMPTS: usize = 3;

/// The container, where it listens and how long it took to start.
pub(crate) struct Container {
    pub(crate) id: String,
    pub(crate) image: String,
    pub(crate) network: DockerNetwork,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) startup: Duration,
    /// Dropping it is testcontainers' removal; taken out by [`Container::remove`].
    handle: Mutex<Option<ContainerAsync<GenericImage>>>,
}

impl Container {
    pub(crate) async fn start(options: &DockerOptions) -> Result<Container, String> {
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

    pub(crate) fn url(&self, database: &str) -> String {
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

    pub(crate) fn server(self: Arc<Self>) -> Server {
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
    pub(crate) fn remove(&self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_names_lose_cargos_hash() {
        // The unit-test binary itself: pgtenant_testkit-<16 hex>.
        assert_eq!(binary_name(), "pgtenant_testkit");
    }
}
