//! Router options, validated before anything starts.

use std::time::Duration;

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

use crate::connect::Connector;
use crate::error::{Error, Result};

/// How a [`Router`](crate::Router) runs. Build with [`RouterOptions::new`] and the setters;
/// [`Router::start`](crate::Router::start) validates every value before connecting.
///
/// ```
/// use std::time::Duration;
/// let options = pgtenant::RouterOptions::from_url("replica-a", "postgres://postgres@127.0.0.1/app")?
///     .ttl(Duration::from_secs(10))
///     .pool_size(16);
/// # Ok::<(), pgtenant::Error>(())
/// ```
#[derive(Clone)]
pub struct RouterOptions {
    pub(crate) replica_id: String,
    pub(crate) config: tokio_postgres::Config,
    pub(crate) pool: Option<deadpool_postgres::Pool>,
    pub(crate) pool_size: usize,
    pub(crate) ttl: Duration,
    pub(crate) margin: Option<Duration>,
    pub(crate) heartbeat_period: Option<Duration>,
    pub(crate) reconnect_backoff: (Duration, Duration),
    pub(crate) keepalive_idle: Duration,
    pub(crate) host: Option<String>,
    pub(crate) drain_timeout: Duration,
    pub(crate) open_timeout: Duration,
    pub(crate) max_open_tenants: usize,
    pub(crate) close_concurrency: usize,
    pub(crate) reservation: Duration,
    pub(crate) handoff_policy: HandoffPolicy,
    pub(crate) migrations: std::sync::Arc<Vec<refinery::Migration>>,
    pub(crate) statement_cache: bool,
    pub(crate) read_only_data_sessions: bool,
    pub(crate) stuck_timeout: Duration,
    pub(crate) connector: Connector,
}

/// What the owner does when another replica asks for one of its tenants with
/// [`Router::request_handoff`](crate::Router::request_handoff).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HandoffPolicy {
    /// Hand it over at once, after draining the work in flight (the default).
    #[default]
    Accept,
    /// Keep it; the requester's wait times out.
    Refuse,
}

impl std::fmt::Debug for RouterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterOptions")
            .field("replica_id", &self.replica_id)
            .field("pool_size", &self.pool_size)
            .field("ttl", &self.ttl)
            .field("margin", &self.effective_margin())
            .field("heartbeat_period", &self.effective_heartbeat_period())
            .field("tls", &self.connector)
            .finish_non_exhaustive()
    }
}

/// Replica ids: 1 to 63 ASCII letters, digits, `.`, `_`, `:` or `-`, starting with a letter or
/// digit (the same rule as the `pgtenant.replicas` check constraint).
pub(crate) fn validate_replica_id(option: &'static str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option,
        reason: format!(
            "{:?} must be 1 to 63 ASCII letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
            id.chars().take(70).collect::<String>()
        ),
    })
}

/// Shortest lease ttl: below this, scheduling jitter alone would expire leases.
pub const MIN_TTL: Duration = Duration::from_millis(300);
/// Longest lease ttl.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

impl RouterOptions {
    /// Options for replica `replica_id` on the database `config` points at.
    ///
    /// The replica id must be unique among live replicas: 1 to 63 ASCII letters, digits,
    /// `.`, `_`, `:` or `-`, starting with a letter or digit.
    pub fn new(replica_id: impl Into<String>, config: tokio_postgres::Config) -> Self {
        RouterOptions {
            replica_id: replica_id.into(),
            config,
            pool: None,
            pool_size: 16,
            ttl: Duration::from_secs(10),
            margin: None,
            heartbeat_period: None,
            reconnect_backoff: (Duration::from_secs(1), Duration::from_secs(30)),
            keepalive_idle: Duration::from_secs(5),
            host: None,
            drain_timeout: Duration::from_secs(30),
            open_timeout: Duration::from_secs(30),
            max_open_tenants: 100_000,
            close_concurrency: 8,
            reservation: Duration::from_secs(5),
            handoff_policy: HandoffPolicy::Accept,
            migrations: std::sync::Arc::new(Vec::new()),
            statement_cache: true,
            read_only_data_sessions: true,
            stuck_timeout: Duration::from_secs(30),
            connector: Connector::default(),
        }
    }

    /// Options from a connection URL (`postgres://user@host:port/db`).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when the URL does not parse.
    pub fn from_url(replica_id: impl Into<String>, url: &str) -> Result<Self> {
        let config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| Error::InvalidOption {
                option: "database_url",
                reason: format!("{e}; expected postgres://user@host:port/database"),
            })?;
        Ok(RouterOptions::new(replica_id, config))
    }

    /// Lease time to live (default 10 s, range [`MIN_TTL`]..=[`MAX_TTL`]): how long a lease
    /// outlives its last successful heartbeat, by the database clock.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Safety margin (default ttl/5): handles stop taking work at last successful heartbeat
    /// start + ttl − margin on the local monotonic clock, before the database could expire the
    /// lease. Must be below ttl − heartbeat period.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// Heartbeat period (default ttl/3).
    pub fn heartbeat_period(mut self, period: Duration) -> Self {
        self.heartbeat_period = Some(period);
        self
    }

    /// Data-path pool size (default 16) when pgtenant builds the pool.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Use this pool for the data path instead of building one. It must point at the same
    /// database as the config. Never share it with code that takes session locks or session
    /// `SET`s: deadpool's fast recycling keeps session state.
    pub fn pool(mut self, pool: deadpool_postgres::Pool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Backoff while re-registering after the lease session dropped (default 1 s doubling to
    /// 30 s).
    pub fn reconnect_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.reconnect_backoff = (first, max);
        self
    }

    /// How long a handoff waits for work in flight before giving up and serving on
    /// (default 30 s, range 1 ms..=1 h).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Bound on one open (default 30 s, range 1 ms..=1 h); a lease acquired after it is
    /// released, not leaked.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = timeout;
        self
    }

    /// Most tenants served at once, counting those opening and draining (default 100 000).
    pub fn max_open_tenants(mut self, max: usize) -> Self {
        self.max_open_tenants = max;
        self
    }

    /// Tenants handed off at once by [`Router::close`](crate::Router::close) (default 8).
    pub fn close_concurrency(mut self, lanes: usize) -> Self {
        self.close_concurrency = lanes;
        self
    }

    /// How long a directed handoff keeps a tenant reserved for its target (default 5 s, range
    /// 1 ms..=10 min).
    pub fn reservation(mut self, window: Duration) -> Self {
        self.reservation = window;
        self
    }

    /// What to do when another replica requests one of this replica's tenants.
    pub fn handoff_policy(mut self, policy: HandoffPolicy) -> Self {
        self.handoff_policy = policy;
        self
    }

    /// The application's tenant migrations (a refinery runner, e.g. from
    /// `refinery::embed_migrations!`). They run in each tenant's schema, under its lease: at
    /// creation in the same transaction as the schema, and on open when the tenant is behind.
    ///
    /// Usually `embed_migrations!("migrations/tenant")` and its `migrations::runner()`; or built
    /// in code:
    ///
    /// ```
    /// # fn f(options: pgtenant::RouterOptions) -> Result<pgtenant::RouterOptions, refinery::Error> {
    /// let runner = refinery::Runner::new(&[
    ///     refinery::Migration::unapplied("V1__accounts", "CREATE TABLE accounts (id bigint PRIMARY KEY)")?,
    ///     refinery::Migration::unapplied("V2__entries", "CREATE TABLE entries (account bigint, amount bigint)")?,
    /// ]);
    /// Ok(options.migrations(runner))
    /// # }
    /// ```
    pub fn migrations(mut self, runner: refinery::Runner) -> Self {
        let mut migrations = runner.get_migrations().clone();
        migrations.sort();
        self.migrations = std::sync::Arc::new(migrations);
        self
    }

    /// The version the tenant migrations bring a tenant to (0 without migrations).
    pub(crate) fn code_version(&self) -> i64 {
        self.migrations
            .iter()
            .map(|m| i64::from(m.version()))
            .max()
            .unwrap_or(0)
    }

    /// Whether the fence runs as a prepared statement cached per pooled connection (default
    /// true: the server skips parsing and planning it). Set false when the data-path pool goes
    /// through a transaction-mode pooler that does not keep prepared statements (PgBouncer
    /// before 1.21): the fence is then sent unnamed, parsed with each transaction.
    pub fn statement_cache(mut self, enabled: bool) -> Self {
        self.statement_cache = enabled;
        self
    }

    /// Whether data-path sessions must be read-only by default (default true, DESIGN G6): only
    /// the fenced transaction is `READ WRITE`, so work that ends it itself (`COMMIT`,
    /// `ROLLBACK`) cannot write unfenced afterwards. pgtenant's own pool sets
    /// `default_transaction_read_only` as a startup option; a pool given with
    /// [`RouterOptions::pool`] is checked at start. Set false only where no session default
    /// can hold (a transaction-mode pooler that drops startup options, with no role default):
    /// then such work can write unfenced, and [`TenantHandle::run`](crate::TenantHandle::run)
    /// still reports it as an error.
    pub fn read_only_data_sessions(mut self, enabled: bool) -> Self {
        self.read_only_data_sessions = enabled;
        self
    }

    /// How long pgtenant waits for the server to answer one of its own statements in a fenced
    /// transaction (`BEGIN`, `COMMIT`) before it closes the connection as stuck (default 30 s,
    /// range 1 ms..=1 h): a connection that stopped answering never holds a pool slot.
    pub fn stuck_timeout(mut self, timeout: Duration) -> Self {
        self.stuck_timeout = timeout;
        self
    }

    /// Connects with TLS: the lease session, the pooler probe, the default data-path pool and
    /// cancel requests all use `tls` (default: no TLS, as `tokio_postgres::NoTls`). Any
    /// tokio-postgres connector fits, e.g. `tokio_postgres_rustls::MakeRustlsConnect` or
    /// `postgres_native_tls::MakeTlsConnector`; set `sslmode` in the config as usual. A pool
    /// given with [`RouterOptions::pool`] keeps its own TLS setting.
    ///
    /// ```
    /// # fn main() -> pgtenant::Result<()> {
    /// let options = pgtenant::RouterOptions::from_url("replica-1", "postgres://app@db/app?sslmode=require")?
    ///     .tls(tokio_postgres::NoTls); // your connector here
    /// # Ok(()) }
    /// ```
    pub fn tls<T>(mut self, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync + 'static,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.connector = Connector::new(tls);
        self
    }

    /// A free-form host label recorded in `pgtenant.replicas` (default: `$HOSTNAME`).
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    pub(crate) fn effective_margin(&self) -> Duration {
        self.margin.unwrap_or(self.ttl / 5)
    }

    pub(crate) fn effective_heartbeat_period(&self) -> Duration {
        self.heartbeat_period.unwrap_or(self.ttl / 3)
    }

    /// Every value in range, or the first one that is not, with its range.
    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |option, reason: String| Err(Error::InvalidOption { option, reason });
        validate_replica_id("replica_id", &self.replica_id)?;
        if self.ttl < MIN_TTL || self.ttl > MAX_TTL {
            return invalid(
                "ttl",
                format!("{:?} is outside {MIN_TTL:?}..={MAX_TTL:?}", self.ttl),
            );
        }
        let period = self.effective_heartbeat_period();
        if period.is_zero() || period > self.ttl / 2 {
            return invalid(
                "heartbeat_period",
                format!(
                    "{period:?} must be above zero and at most ttl/2 ({:?}) so one lost heartbeat does not expire the lease",
                    self.ttl / 2
                ),
            );
        }
        let margin = self.effective_margin();
        if margin.is_zero() || margin + period >= self.ttl {
            return invalid(
                "margin",
                format!(
                    "{margin:?} must be above zero and below ttl − heartbeat period ({:?})",
                    self.ttl.saturating_sub(period)
                ),
            );
        }
        if self.pool.is_none() && !(1..=1000).contains(&self.pool_size) {
            return invalid(
                "pool_size",
                format!("{} is outside 1..=1000", self.pool_size),
            );
        }
        let (first, max) = self.reconnect_backoff;
        if first.is_zero() || max < first {
            return invalid(
                "reconnect_backoff",
                format!("first {first:?} must be above zero and at most max {max:?}"),
            );
        }
        let ms = Duration::from_millis(1);
        let hour = Duration::from_secs(3600);
        for (option, value, max) in [
            ("drain_timeout", self.drain_timeout, hour),
            ("open_timeout", self.open_timeout, hour),
            ("reservation", self.reservation, Duration::from_secs(600)),
            ("stuck_timeout", self.stuck_timeout, hour),
        ] {
            if value < ms || value > max {
                return invalid(option, format!("{value:?} is outside {ms:?}..={max:?}"));
            }
        }
        if !(1..=10_000_000).contains(&self.max_open_tenants) {
            return invalid(
                "max_open_tenants",
                format!("{} is outside 1..=10000000", self.max_open_tenants),
            );
        }
        if !(1..=1024).contains(&self.close_concurrency) {
            return invalid(
                "close_concurrency",
                format!("{} is outside 1..=1024", self.close_concurrency),
            );
        }
        if self.config.get_hosts().is_empty() {
            return invalid(
                "config",
                "no host: set a host in the URL or config".to_owned(),
            );
        }
        Ok(())
    }
}
