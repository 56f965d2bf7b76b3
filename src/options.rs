//! Router options, validated before anything starts.

use std::time::Duration;

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
}

impl std::fmt::Debug for RouterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterOptions")
            .field("replica_id", &self.replica_id)
            .field("pool_size", &self.pool_size)
            .field("ttl", &self.ttl)
            .field("margin", &self.effective_margin())
            .field("heartbeat_period", &self.effective_heartbeat_period())
            .finish_non_exhaustive()
    }
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
        let id = &self.replica_id;
        let id_ok = !id.is_empty()
            && id.len() <= 63
            && id.as_bytes()[0].is_ascii_alphanumeric()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        if !id_ok {
            return invalid(
                "replica_id",
                format!(
                    "{:?} must be 1 to 63 ASCII letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
                    id.chars().take(70).collect::<String>()
                ),
            );
        }
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
        if self.config.get_hosts().is_empty() {
            return invalid(
                "config",
                "no host: set a host in the URL or config".to_owned(),
            );
        }
        Ok(())
    }
}
