//! How pgtenant opens connections of its own (the lease session, the pooler probe, the default
//! data-path pool, cancel requests): without TLS by default, or with the application's TLS
//! connector ([`RouterOptions::tls`](crate::RouterOptions::tls)), and each bounded in time end
//! to end ([`RouterOptions::connect_timeout`](crate::RouterOptions::connect_timeout)):
//! tokio-postgres' own `connect_timeout` covers only the TCP connect, so a server that accepts
//! and never answers would otherwise hold a connect forever. The connector's type is erased here
//! so that the options and the router stay free of type parameters.

use std::any::TypeId;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::Host;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config, NoTls, Socket};

use crate::error::{Error, Result};
use crate::handle::BoxFuture;
use crate::options::RouterOptions;

/// Default bound on opening one connection: TCP connect, TLS, startup and authentication.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Drives a connection and yields its notices and notifications; `None` once it ended.
pub(crate) type Messages = Box<
    dyn FnMut(&mut Context<'_>) -> Poll<Option<Result<AsyncMessage, tokio_postgres::Error>>> + Send,
>;

type Connect = dyn Fn(Config) -> BoxFuture<'static, Result<(Client, Messages), tokio_postgres::Error>>
    + Send
    + Sync;
type MakeManager = dyn Fn(Config, ManagerConfig) -> Manager + Send + Sync;
type Cancel =
    dyn Fn(CancelToken) -> BoxFuture<'static, Result<(), tokio_postgres::Error>> + Send + Sync;

/// One TLS setting and one time bound, for every connection pgtenant opens.
#[derive(Clone)]
pub(crate) struct Connector {
    connect: Arc<Connect>,
    manager: Arc<MakeManager>,
    cancel: Arc<Cancel>,
    /// For `Debug`: the connector's type name.
    name: &'static str,
    /// False for `NoTls`, which cannot honour `sslmode=require`.
    pub(crate) encrypts: bool,
    /// Bound on each connection, end to end; set by `Router::start` from the options.
    pub(crate) timeout: Duration,
}

impl Connector {
    pub(crate) fn new<T>(tls: T) -> Connector
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync + 'static,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let for_connect = tls.clone();
        let for_manager = tls.clone();
        Connector {
            connect: Arc::new(move |config: Config| {
                let tls = for_connect.clone();
                Box::pin(async move {
                    let (client, mut connection) = config.connect(tls).await?;
                    let messages: Messages = Box::new(move |cx| connection.poll_message(cx));
                    Ok((client, messages))
                })
            }),
            manager: Arc::new(move |config, manager_config| {
                Manager::from_config(config, for_manager.clone(), manager_config)
            }),
            cancel: Arc::new(move |token: CancelToken| {
                let tls = tls.clone();
                Box::pin(async move { token.cancel_query(tls).await })
            }),
            name: std::any::type_name::<T>(),
            encrypts: TypeId::of::<T>() != TypeId::of::<NoTls>(),
            timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Connects within the bound; the caller must drive the returned [`Messages`] until it
    /// yields `None`. `purpose` says what the connection is for, in errors.
    pub(crate) async fn connect(
        &self,
        config: Config,
        purpose: &str,
    ) -> Result<(Client, Messages)> {
        let context = || format!("{purpose} ({})", target(&config));
        match tokio::time::timeout(self.timeout, (self.connect)(config.clone())).await {
            Ok(Ok(connected)) => Ok(connected),
            Ok(Err(error)) => Err(Error::db_with(context)(error)),
            Err(_) => Err(Error::ConnectTimeout {
                context: context(),
                timeout: self.timeout,
            }),
        }
    }

    /// A deadpool manager whose connections use this TLS setting (the pool bounds them, see
    /// [`default_pool`]).
    pub(crate) fn manager(&self, config: Config, manager_config: ManagerConfig) -> Manager {
        (self.manager)(config, manager_config)
    }

    /// Sends a cancel request for the query running on `token`'s connection. A cancel request
    /// is a connection of its own (TLS included), so it gets the same bound.
    pub(crate) async fn cancel(&self, token: CancelToken) -> Result<()> {
        const CONTEXT: &str = "send a cancel request";
        match tokio::time::timeout(self.timeout, (self.cancel)(token)).await {
            Ok(result) => result.map_err(Error::db(CONTEXT)),
            Err(_) => Err(Error::ConnectTimeout {
                context: CONTEXT.to_owned(),
                timeout: self.timeout,
            }),
        }
    }
}

/// The data-path pool pgtenant builds when the application gives none: creating a connection
/// and waiting for a free one are both bounded by the connect timeout.
pub(crate) fn default_pool(options: &RouterOptions) -> Result<Pool> {
    let manager = options.connector.manager(
        data_session_config(options),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let bound = Some(options.connector.timeout);
    Pool::builder(manager)
        .max_size(options.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(bound)
        .create_timeout(bound)
        .build()
        .map_err(|e| Error::InvalidOption {
            option: "pool_size",
            reason: e.to_string(),
        })
}

/// Where a config points, for error messages: `host:port`, comma-separated.
pub(crate) fn target(config: &Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
            }
        })
        .collect();
    if hosts.is_empty() {
        "no host".to_owned()
    } else {
        hosts.join(", ")
    }
}

impl Default for Connector {
    fn default() -> Connector {
        Connector::new(NoTls)
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Drives `messages` to the end, dropping what it yields (for connections that LISTEN to
/// nothing).
pub(crate) async fn drive(mut messages: Messages) {
    while std::future::poll_fn(|cx| messages(cx)).await.is_some() {}
}

/// The data-path connections' settings: read-only by default (G6: work that ends its fenced
/// transaction cannot write afterwards; only the fenced transaction is READ WRITE), as a
/// startup option, which RESET ALL keeps; and TCP keepalives, so a vanished server ends them.
fn data_session_config(options: &RouterOptions) -> Config {
    let mut config = options.config.clone();
    if options.read_only_data_sessions {
        let startup = match config.get_options() {
            Some(existing) if !existing.trim().is_empty() => {
                format!("{existing} -c default_transaction_read_only=on")
            }
            _ => "-c default_transaction_read_only=on".to_owned(),
        };
        config.options(startup);
    }
    config
        .keepalives(true)
        .keepalives_idle(options.keepalive_idle)
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3);
    config
}

/// A pool the application built must give read-only-by-default sessions (G6), from the
/// connection's startup options or the role's or database's defaults, since pgtenant resets
/// session settings between tenants.
pub(crate) async fn check_read_only(pool: &Pool) -> Result<()> {
    let client = pool
        .get()
        .await
        .map_err(crate::replica::pool_error("check the data-path pool"))?;
    let reset_value: String = client
        .query_typed_one(
            "SELECT reset_val FROM pg_settings WHERE name = 'default_transaction_read_only'",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("check the data-path pool"))?;
    if reset_value == "on" {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option: "pool",
        reason: "its sessions are not read-only by default, so work that ends its fenced \
                 transaction itself could write unfenced: add `options=-c default_transaction_read_only=on` \
                 to the pool's connection config (or `ALTER ROLE <app> SET default_transaction_read_only = on` \
                 behind a transaction-mode pooler, which drops startup options), or accept the risk \
                 with RouterOptions::read_only_data_sessions(false)"
            .to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const BOUND: Duration = Duration::from_millis(300);
    /// The bound plus scheduling on a loaded machine; far below a hang.
    const SLACK: Duration = Duration::from_secs(3);

    fn config(port: u16) -> Config {
        let mut config = Config::new();
        config
            .host("127.0.0.1")
            .port(port)
            .user("postgres")
            .dbname("x");
        config
    }

    /// Accepts TCP and never says a word. With `answer_first`, the first connection gets the
    /// startup a server without TLS gives (SSLRequest refused, then AuthenticationOk,
    /// BackendKeyData, ReadyForQuery), so a client connects and has a cancel token.
    async fn server(answer_first: bool) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            if answer_first {
                let (mut first, _) = listener.accept().await.unwrap();
                let mut ssl_request = [0; 8];
                first.read_exact(&mut ssl_request).await.unwrap();
                first.write_all(b"N").await.unwrap();
                let mut length = [0; 4];
                first.read_exact(&mut length).await.unwrap();
                let mut startup = vec![0; u32::from_be_bytes(length) as usize - 4];
                first.read_exact(&mut startup).await.unwrap();
                let mut reply = Vec::new();
                for (tag, body) in [
                    (b'R', &0_u32.to_be_bytes()[..]),
                    (b'K', &[0, 0, 0, 1, 0, 0, 0, 2][..]),
                    (b'Z', &b"I"[..]),
                ] {
                    reply.push(tag);
                    reply.extend((body.len() as u32 + 4).to_be_bytes());
                    reply.extend(body);
                }
                first.write_all(&reply).await.unwrap();
                held.push(first);
            }
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        port
    }

    fn bounded(connector: Connector) -> Connector {
        Connector {
            timeout: BOUND,
            ..connector
        }
    }

    #[tokio::test]
    async fn a_connect_to_a_silent_server_gives_up_at_the_bound() {
        let port = server(false).await;
        let started = Instant::now();
        let error = bounded(Connector::default())
            .connect(config(port), "test")
            .await
            .err()
            .unwrap();
        assert!(started.elapsed() < BOUND + SLACK, "{:?}", started.elapsed());
        assert!(matches!(error, Error::ConnectTimeout { .. }), "{error}");
        assert!(error.is_retryable());
        assert!(
            error.to_string().contains(&format!("127.0.0.1:{port}")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn the_default_pool_gives_up_on_a_silent_server_at_the_bound() {
        let port = server(false).await;
        let mut options = RouterOptions::new("pool", config(port)).connect_timeout(BOUND);
        options.connector.timeout = options.effective_connect_timeout();
        let pool = default_pool(&options).unwrap();
        let started = Instant::now();
        let error = pool.get().await.err().unwrap();
        assert!(started.elapsed() < BOUND + SLACK, "{:?}", started.elapsed());
        assert!(
            matches!(
                error,
                deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Create)
            ),
            "{error}"
        );
    }

    /// A cancel request is a connection of its own, with TLS negotiation when the connector
    /// can encrypt: a server that never answers it must not hold `forget(Cancel)` forever.
    #[tokio::test]
    async fn a_cancel_request_to_a_silent_server_gives_up_at_the_bound() {
        let port = server(true).await;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let connector = bounded(Connector::new(
            tokio_postgres_rustls::MakeRustlsConnect::new(tls),
        ));
        let (client, messages) = connector.connect(config(port), "test").await.unwrap();
        tokio::spawn(drive(messages));
        let started = Instant::now();
        let error = connector.cancel(client.cancel_token()).await.err().unwrap();
        assert!(started.elapsed() < BOUND + SLACK, "{:?}", started.elapsed());
        assert!(matches!(error, Error::ConnectTimeout { .. }), "{error}");
    }
}
