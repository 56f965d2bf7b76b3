//! How pgtenant opens connections of its own, DESIGN §5 "Replica start" and G9 (the lease
//! session, the pooler probe, the default data-path pool, cancel requests): without TLS by
//! default, or with the application's TLS connector
//! ([`RouterOptions::tls`](crate::RouterOptions::tls)), and each bounded in time end to end
//! ([`RouterOptions::connect_timeout`](crate::RouterOptions::connect_timeout)):
//! tokio-postgres' own `connect_timeout` covers only the TCP connect, so a server that accepts
//! and never answers would otherwise hold a connect forever. The connector's type is erased here
//! so that the options and the router stay free of type parameters.
//!
//! **Several hosts, one primary.** Every connection pgtenant opens writes (the lease session
//! registers and heartbeats, the data path runs fenced `READ WRITE` transactions), so each one
//! must reach the primary. A connection string may list several hosts
//! (`postgres://u@db1,db2/app?target_session_attrs=read-write`, as Patroni and managed
//! services hand out): pgtenant tries them in order (shuffled with `load_balance_hosts=random`)
//! and takes the first that is not a standby, read from the `in_hot_standby` status the server
//! reports at startup (PostgreSQL 14+; `pg_is_in_recovery()` before that). It does not leave
//! this to tokio-postgres' `target_session_attrs=read-write`, which tests
//! `transaction_read_only`: pgtenant's data sessions are read-only by default (G6, a startup
//! option), so that test would refuse every server, the primary included. With any
//! `target_session_attrs` pgtenant skips standbys, since it could not work on one. Each host
//! gets the connect bound of its own, as libpq's `connect_timeout` does, and an error names
//! every host with what it answered. When a host that answered is a standby (a failover in
//! progress), the error carries SQLSTATE [`NOT_PRIMARY`] (`PTP01`): retryable.

use std::any::TypeId;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig};
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{
    AsyncMessage, CancelToken, Client, Config, NoTls, SimpleQueryMessage, Socket,
};

use crate::error::{Error, Result};

use crate::sqlstate::NOT_PRIMARY;
use crate::sync::BoxFuture;

/// Default bound on opening one connection: TCP connect, TLS, startup and authentication.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Drives a connection and yields its notices and notifications; `None` once it ended.
pub(crate) type Messages = Box<
    dyn FnMut(&mut Context<'_>) -> Poll<Option<Result<AsyncMessage, tokio_postgres::Error>>> + Send,
>;

/// A connection just made: the client, its messages, what the server reported as
/// `in_hot_standby` at startup (None before PostgreSQL 14, which does not report it), and a
/// reader of what it reports later (see `wire.rs`).
struct Opened {
    client: Client,
    messages: Messages,
    hot_standby: Option<bool>,
    parameters: crate::wire::Parameters,
}

type Connect =
    dyn Fn(Config) -> BoxFuture<'static, Result<Opened, tokio_postgres::Error>> + Send + Sync;
type Cancel =
    dyn Fn(CancelToken) -> BoxFuture<'static, Result<(), tokio_postgres::Error>> + Send + Sync;

/// One TLS setting and one time bound, for every connection pgtenant opens.
#[derive(Clone)]
pub(crate) struct Connector {
    connect: Arc<Connect>,
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
        Connector {
            connect: Arc::new(move |config: Config| {
                let tls = for_connect.clone();
                Box::pin(async move {
                    let (client, connection) = config.connect(tls).await?;
                    let hot_standby = connection.parameter("in_hot_standby").map(|v| v == "on");
                    // Shared with the parameter reader; the driver holds the lock only while
                    // it polls, the reader only while it copies one value. The reader holds
                    // it weakly: when the driver stops (at the connection's first error) the
                    // connection must go with it, which fails the requests in flight instead
                    // of leaving them waiting for the stuck timeout.
                    let connection = Arc::new(std::sync::Mutex::new(connection));
                    let reader = Arc::downgrade(&connection);
                    let parameters: crate::wire::Parameters = Arc::new(move |name: &str| {
                        let connection = reader.upgrade()?;
                        let value = crate::sync::lock(&connection)
                            .parameter(name)
                            .map(str::to_owned);
                        value
                    });
                    let messages: Messages =
                        Box::new(move |cx| crate::sync::lock(&connection).poll_message(cx));
                    Ok(Opened {
                        client,
                        messages,
                        hot_standby,
                        parameters,
                    })
                })
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

    /// Connects to the first of `config`'s hosts that is a primary, each host within the
    /// bound; the caller must drive the returned [`Messages`] until it yields `None`. `purpose`
    /// says what the connection is for, in errors.
    pub(crate) async fn connect(&self, config: Config, purpose: &str) -> Result<Connected> {
        match self.open_primary(&config).await {
            Ok(connected) => Ok(connected),
            Err(failures) => Err(explain(purpose, failures, self.timeout)),
        }
    }

    /// Tries the hosts in order; every failure, with its host, when none is a primary.
    async fn open_primary(&self, config: &Config) -> std::result::Result<Connected, Vec<Failure>> {
        let mut failures = Vec::new();
        for host in hosts_in_order(config) {
            let target = target(&host);
            let opened =
                match tokio::time::timeout(self.timeout, (self.connect)(host.clone())).await {
                    Ok(Ok(opened)) => opened,
                    Ok(Err(error)) => {
                        failures.push(Failure::Failed(target, error));
                        continue;
                    }
                    Err(_) => {
                        failures.push(Failure::TimedOut(target));
                        continue;
                    }
                };
            let Opened {
                client,
                mut messages,
                hot_standby,
                parameters,
            } = opened;
            let checked = tokio::time::timeout(
                self.timeout,
                while_driving(&mut messages, check_primary(&client, hot_standby, &target)),
            )
            .await;
            match checked {
                Ok(Some(Ok(()))) => {
                    return Ok(Connected {
                        client,
                        messages,
                        host,
                        parameters,
                    })
                }
                Ok(Some(Err(error))) if crate::sqlstate::of(&error) == Some(NOT_PRIMARY) => {
                    failures.push(Failure::Standby(target, error));
                }
                Ok(Some(Err(error))) => failures.push(Failure::Failed(target, error)),
                // The connection ended while it was checked: the check's own error says how,
                // once the connection is gone.
                Ok(None) => match client.simple_query("").await {
                    Err(error) => failures.push(Failure::Failed(target, error)),
                    Ok(_) => failures.push(Failure::TimedOut(target)),
                },
                Err(_) => failures.push(Failure::TimedOut(target)),
            }
        }
        Err(failures)
    }

    /// A deadpool manager whose connections use this TLS setting and reach the primary among
    /// the config's hosts (the pool bounds them, see `data_pool::default_pool`).
    pub(crate) fn manager(&self, config: Config, manager_config: ManagerConfig) -> Manager {
        Manager::from_connect(config, PrimaryConnect(self.clone()), manager_config)
    }

    /// Sends a cancel request for the query running on `token`'s connection. A cancel request
    /// is a connection of its own (TLS included), so it gets the same bound.
    pub(crate) async fn cancel(&self, token: CancelToken) -> Result<()> {
        const CONTEXT: &str = "send a cancel request";
        match tokio::time::timeout(self.timeout, (self.cancel)(token)).await {
            Ok(result) => result.map_err(Error::db(CONTEXT)),
            Err(_) => Err(Error::connect_timeout(CONTEXT.to_owned(), self.timeout)),
        }
    }
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

/// A connection to the primary among a config's hosts.
pub(crate) struct Connected {
    pub(crate) client: Client,
    pub(crate) messages: Messages,
    /// The host it reached, as a config of its own: a second connection that must reach the
    /// same server (the pooler probe) uses it, and error texts name it.
    pub(crate) host: Config,
    /// What the server reported last, parameter by parameter (`wire.rs`).
    pub(crate) parameters: crate::wire::Parameters,
}

/// Why one host was not taken.
enum Failure {
    Failed(String, tokio_postgres::Error),
    TimedOut(String),
    /// A standby. The error is the server's own refusal, raised on it (SQLSTATE
    /// [`NOT_PRIMARY`]), so that it travels where only a driver error can (the pool).
    Standby(String, tokio_postgres::Error),
}

impl Failure {
    fn is_standby(&self) -> bool {
        matches!(self, Failure::Standby(..))
    }
}

/// One error for a connect that took no host. With one host it is that host's error, as it
/// was before several hosts were supported; with several, the context names each host and what
/// it answered, and the error is the most telling one: a standby's (a failover in progress,
/// retryable), else the last host's.
fn explain(purpose: &str, mut failures: Vec<Failure>, bound: Duration) -> Error {
    let last = failures.len().saturating_sub(1);
    let summary: Vec<String> = failures
        .iter()
        .enumerate()
        .map(|(i, failure)| match failure {
            Failure::Standby(target, _) => format!("{target}: a standby"),
            Failure::Failed(target, _) | Failure::TimedOut(target) if i == last => target.clone(),
            Failure::Failed(target, error) => {
                format!("{target}: {}", crate::error::DbCause(error))
            }
            Failure::TimedOut(target) => format!("{target}: no answer within {bound:?}"),
        })
        .collect();
    let context = format!("{purpose} ({})", summary.join("; "));
    let chosen = match failures.iter().rposition(Failure::is_standby) {
        Some(at) => Some(failures.swap_remove(at)),
        None => failures.pop(),
    };
    match chosen {
        Some(Failure::Failed(_, source) | Failure::Standby(_, source)) => {
            Error::database(context.into(), source)
        }
        Some(Failure::TimedOut(_)) => Error::connect_timeout(context, bound),
        None => Error::InvalidOption {
            option: "config",
            reason: "no host: set a host in the URL or config".to_owned(),
        },
    }
}

/// The deadpool side of [`Connector::open_primary`]: pooled connections reach the primary too.
struct PrimaryConnect(Connector);

impl deadpool_postgres::Connect for PrimaryConnect {
    fn connect(
        &self,
        config: &Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        // The token by which the data path finds what this connection's server reports
        // (`wire.rs`): a startup option, which RESET ALL keeps.
        let token = crate::wire::new_token();
        let mut config = config.clone();
        let startup = match config.get_options() {
            Some(existing) if !existing.trim().is_empty() => {
                format!("{existing} -c {}={token}", crate::wire::TOKEN_SETTING)
            }
            _ => format!("-c {}={token}", crate::wire::TOKEN_SETTING),
        };
        config.options(startup);
        Box::pin(async move {
            let mut failures = match self.0.open_primary(&config).await {
                Ok(connected) => {
                    let Connected {
                        client,
                        messages,
                        parameters,
                        ..
                    } = connected;
                    crate::wire::register(token, &parameters);
                    let driver = tokio::spawn(async move {
                        drive(messages).await;
                        // The reader lives as long as the connection.
                        drop(parameters);
                    });
                    return Ok((client, driver));
                }
                Err(failures) => failures,
            };
            let chosen = match failures.iter().rposition(Failure::is_standby) {
                Some(at) => Some(failures.swap_remove(at)),
                None => failures.pop(),
            };
            match chosen {
                Some(Failure::Failed(_, error) | Failure::Standby(_, error)) => Err(error),
                // Only timeouts: deadpool's create timeout (the bound times the number of
                // hosts) ends this and reports it as such.
                Some(Failure::TimedOut(_)) | None => std::future::pending().await,
            }
        })
    }
}

/// `config`'s hosts, each as a config of its own (same user, database, TLS mode, options,
/// timeouts and keepalives; `target_session_attrs=any`, since the primary check is ours), in
/// the order to try them: as written, or shuffled with `load_balance_hosts=random`.
pub(crate) fn hosts_in_order(config: &Config) -> Vec<Config> {
    let count = config.get_hosts().len().max(config.get_hostaddrs().len());
    let mut hosts: Vec<Config> = (0..count).map(|i| single_host(config, i)).collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        use std::hash::{BuildHasher, Hasher};
        // Random keys from the standard library, seeded per process: enough to spread load.
        let mut seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            | 1;
        for i in (1..hosts.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let j = usize::try_from(seed % (i as u64 + 1)).unwrap_or(0);
            hosts.swap(i, j);
        }
    }
    hosts
}

/// Host number `index` of `config` as a config of its own. tokio-postgres can add hosts to a
/// config but never remove one, so this builds a new config field by field; the unit test
/// `a_single_host_config_keeps_every_setting` fails if tokio-postgres grows a field that this
/// does not copy.
fn single_host(config: &Config, index: usize) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation());
    match config.get_hosts().get(index) {
        Some(Host::Tcp(name)) => {
            one.host(name);
        }
        #[cfg(unix)]
        Some(Host::Unix(path)) => {
            one.host_path(path);
        }
        None => {}
    }
    if let Some(address) = config.get_hostaddrs().get(index) {
        one.hostaddr(*address);
    }
    let ports = config.get_ports();
    if let Some(port) = ports.get(index).or(ports.first()) {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    one.keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle());
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.target_session_attrs(TargetSessionAttrs::Any)
        .channel_binding(config.get_channel_binding())
        .load_balance_hosts(config.get_load_balance_hosts());
    one
}

/// Refuses a standby: `hot_standby` as the server reported it at startup, else (before
/// PostgreSQL 14) asked. The refusal is raised by the standby itself, so that it is a driver
/// error like any other: SQLSTATE [`NOT_PRIMARY`], naming the host and saying what to do.
async fn check_primary(
    client: &Client,
    hot_standby: Option<bool>,
    target: &str,
) -> Result<(), tokio_postgres::Error> {
    let standby = match hot_standby {
        Some(standby) => standby,
        None => client
            .simple_query("SELECT pg_catalog.pg_is_in_recovery()")
            .await?
            .iter()
            .any(|message| match message {
                SimpleQueryMessage::Row(row) => row.get(0) == Some("t"),
                _ => false,
            }),
    };
    if !standby {
        return Ok(());
    }
    let literal = |text: &str| format!("'{}'", text.replace('\'', "''"));
    let message = literal(&format!(
        "{target} is a standby (in recovery), and pgtenant writes on every connection it opens"
    ));
    let hint = literal(
        "list the primary among the connection's hosts (pgtenant skips standbys); during a \
         failover, retry once a standby has been promoted",
    );
    client
        .batch_execute(&format!(
            "DO $pgtenant$ BEGIN RAISE EXCEPTION USING ERRCODE = '{NOT_PRIMARY}', \
             MESSAGE = {message}, HINT = {hint}; END $pgtenant$"
        ))
        .await
}

/// Runs `work` while driving the connection behind `messages` (dropping what it yields: the
/// connection is fresh and listens to nothing yet); None when the connection ended first.
async fn while_driving<T>(
    messages: &mut Messages,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        loop {
            match messages(cx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
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
/// nothing). It stops at the first error: after one, tokio-postgres refuses new requests but
/// fails the ones in flight only when the connection is dropped, so polling on would leave a
/// request sent just before the server vanished waiting for an answer that never comes
/// (measured: a pooled connection to a primary stopped with `-m immediate` held its `BEGIN`
/// for the whole 30 s `stuck_timeout`).
pub(crate) async fn drive(mut messages: Messages) {
    while let Some(Ok(_)) = std::future::poll_fn(|cx| messages(cx)).await {}
}

/// Whether `session` keeps one backend of its own (a direct connection or session pooling):
/// None when it does, else what showed the pooling. While `other` holds a transaction,
/// `session` must stay on its backend and `other` must never be handed it. One round is not
/// enough: a pooler may add a server connection to its idle list at any moment (PgBouncer
/// launches them asynchronously), which hides the session's backend from the probe once; in the
/// next round the session itself lands on that other server. Each round shows the pooling with
/// every idle-list order (LIFO or round robin) unless other clients race for the same pool.
pub(crate) async fn owns_its_backend(
    session: &Client,
    other: &mut Client,
    context: &'static str,
) -> Result<Option<String>> {
    const ROUNDS: usize = 3;
    // Unnamed statements: a named one could be prepared on one server and executed on another.
    async fn backend_of(
        client: &impl tokio_postgres::GenericClient,
        context: &'static str,
    ) -> Result<i32> {
        client
            .query_typed_one("SELECT pg_backend_pid()", &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(Error::db(context))
    }
    let pid = backend_of(session, context).await?;
    let moved = |now: i32| {
        Some(format!(
            "its statements ran on two backends (pids {pid} and {now})"
        ))
    };
    for _ in 0..ROUNDS {
        let now = backend_of(session, context).await?;
        if now != pid {
            return Ok(moved(now));
        }
        let tx = other.transaction().await.map_err(Error::db(context))?;
        if backend_of(&tx, context).await? == pid {
            return Ok(Some(format!(
                "another client was given its backend (pid {pid})"
            )));
        }
        // The other transaction pins its backend, so a pooler must find the session another
        // one — or its own, which it can only do without pooling.
        let during = backend_of(session, context).await?;
        tx.rollback().await.map_err(Error::db(context))?;
        if during != pid {
            return Ok(moved(during));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::data_pool::default_pool;
    use crate::options::RouterOptions;

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
    /// startup a server without TLS gives (SSLRequest refused, then AuthenticationOk, a
    /// primary's `in_hot_standby`, BackendKeyData, ReadyForQuery), so a client connects and has
    /// a cancel token.
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
                    (b'S', &b"in_hot_standby\0off\0"[..]),
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
        let Connected {
            client, messages, ..
        } = connector.connect(config(port), "test").await.unwrap();
        tokio::spawn(drive(messages));
        let started = Instant::now();
        let error = connector.cancel(client.cancel_token()).await.err().unwrap();
        assert!(started.elapsed() < BOUND + SLACK, "{:?}", started.elapsed());
        assert!(matches!(error, Error::ConnectTimeout { .. }), "{error}");
    }

    /// Every host is tried, each within the bound of its own, and the error names each one
    /// with what it answered (here: nothing, then a refused connection).
    #[tokio::test]
    async fn a_connect_tries_every_host_and_names_each() {
        let silent = server(false).await;
        let refused = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let mut both = config(silent);
        both.host("127.0.0.1").port(refused);
        let started = Instant::now();
        let error = bounded(Connector::default())
            .connect(both, "test")
            .await
            .err()
            .unwrap();
        assert!(
            started.elapsed() < 2 * BOUND + SLACK,
            "{:?}",
            started.elapsed()
        );
        let text = error.to_string();
        assert!(
            text.contains(&format!("127.0.0.1:{silent}: no answer within"))
                && text.contains(&format!("127.0.0.1:{refused}")),
            "{text}"
        );
        assert!(error.is_retryable(), "{text}");
    }

    /// tokio-postgres can only add hosts to a config: each host's own config is rebuilt field
    /// by field, and must keep every setting but the other hosts (and target_session_attrs,
    /// which pgtenant checks itself). A field tokio-postgres adds and `single_host` does not
    /// copy makes the configs differ here.
    #[test]
    fn a_single_host_config_keeps_every_setting() {
        let url = "postgres://someone:secret@db1:5433,db2:5434/app?options=-c%20x%3Dy\
                   &application_name=app&sslmode=require&sslnegotiation=direct\
                   &hostaddr=10.0.0.1,10.0.0.2&connect_timeout=7&tcp_user_timeout=9\
                   &keepalives=0&keepalives_idle=11&keepalives_interval=12\
                   &keepalives_retries=13&target_session_attrs=read-write\
                   &channel_binding=require&load_balance_hosts=disable";
        let config: Config = url.replace(' ', "").parse().unwrap();
        let hosts = hosts_in_order(&config);
        assert_eq!(hosts.len(), 2);
        for (i, (name, port, address)) in [("db1", 5433, "10.0.0.1"), ("db2", 5434, "10.0.0.2")]
            .into_iter()
            .enumerate()
        {
            let single: Config = url
                .replace(' ', "")
                .replace("db1:5433,db2:5434", &format!("{name}:{port}"))
                .replace("10.0.0.1,10.0.0.2", address)
                .replace("read-write", "any")
                .parse()
                .unwrap();
            assert_eq!(hosts[i], single, "host {i}");
        }
    }
}
