//! Router options, validated before anything starts (DESIGN §5 "Replica start", G7).

use std::ops::RangeInclusive;
use std::time::Duration;

use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

use crate::connect::Connector;
use crate::error::{Error, Result};
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;

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
    pub(crate) replica_id: ReplicaId,
    pub(crate) config: tokio_postgres::Config,
    pub(crate) pool: Option<deadpool_postgres::Pool>,
    pub(crate) pool_size: usize,
    pub(crate) ttl: Duration,
    pub(crate) margin: Option<Duration>,
    pub(crate) heartbeat_period: Option<Duration>,
    pub(crate) reconnect_backoff: (Duration, Duration),
    pub(crate) keepalive_idle: Duration,
    pub(crate) tcp_user_timeout: Option<Duration>,
    pub(crate) host: Option<String>,
    pub(crate) address: Option<String>,
    pub(crate) placement_weight: f64,
    pub(crate) idle_release: Option<Duration>,
    pub(crate) placement: bool,
    pub(crate) placement_stable_for: Duration,
    pub(crate) placement_moves_per_second: usize,
    pub(crate) drain_timeout: Duration,
    pub(crate) open_timeout: Duration,
    pub(crate) max_open_tenants: usize,
    pub(crate) close_concurrency: usize,
    pub(crate) reservation: Duration,
    pub(crate) handoff_policy: HandoffPolicy,
    pub(crate) migrations: std::sync::Arc<Vec<refinery::Migration>>,
    pub(crate) statement_cache: bool,
    pub(crate) max_tenants_per_connection: usize,
    pub(crate) read_only_data_sessions: bool,
    pub(crate) fencing: Fencing,
    pub(crate) stuck_timeout: Duration,
    pub(crate) request_retention: Duration,
    pub(crate) connector: Connector,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) renewal_events: bool,
    pub(crate) distributed_schemas: Option<bool>,
    pub(crate) alarms: AlarmSettings,
}

/// Alarm settings (DESIGN §5 "Alarms"). The handler is set by
/// [`RouterOptions::alarm_handler`] (in `protocol/alarms.rs`) and kept type-erased here: its
/// type names the fenced transaction's `Tx`, a protocol's type, which the options, below the
/// protocols, cannot name.
#[derive(Clone)]
pub(crate) struct AlarmSettings {
    pub(crate) handler: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
    pub(crate) max_attempts: u32,
    /// The first retry's delay, and the longest (each retry doubles it).
    pub(crate) backoff: (Duration, Duration),
}

impl Default for AlarmSettings {
    fn default() -> Self {
        AlarmSettings {
            handler: None,
            max_attempts: 5,
            backoff: (Duration::from_secs(1), Duration::from_secs(300)),
        }
    }
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

/// How fenced transactions are fenced (DESIGN §5 "Data sessions and session fencing").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Fencing {
    /// Session fencing where it can hold, transaction fencing otherwise (the default): at
    /// start the router checks that its data sessions are real sessions (no transaction-mode
    /// pooler) and that the control plane's owner may terminate them; when either fails it falls
    /// back to transaction fencing, logs why and shows it in [`Summary`](crate::Summary).
    #[default]
    Auto,
    /// Session fencing, or refuse to start ([`Error::InvalidOption`]) saying which condition
    /// fails. Each data connection is bound to the replica's incarnation once; a takeover
    /// seals a dead or expired incarnation and terminates its connections before the epoch
    /// moves; a transaction is `BEGIN; SELECT pgtenant.enter(…); work; COMMIT`, what a
    /// schema-per-tenant application sends anyway.
    Session,
    /// The epoch checked inside every transaction (`pgtenant.fence`): works everywhere,
    /// including behind transaction-mode poolers, at one statement per transaction.
    Transaction,
}

impl std::fmt::Debug for RouterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterOptions")
            .field("replica_id", &self.replica_id)
            .field("pool_size", &self.pool_size)
            .field(
                "max_tenants_per_connection",
                &self.max_tenants_per_connection,
            )
            .field("ttl", &self.ttl)
            .field("margin", &self.effective_margin())
            .field("heartbeat_period", &self.effective_heartbeat_period())
            .field("connect_timeout", &self.effective_connect_timeout())
            .field("tcp_user_timeout", &self.effective_tcp_user_timeout())
            .field("tls", &self.connector)
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
            replica_id: ReplicaId::unchecked(replica_id.into()),
            config,
            pool: None,
            pool_size: 16,
            ttl: Duration::from_secs(10),
            margin: None,
            heartbeat_period: None,
            reconnect_backoff: (Duration::from_secs(1), Duration::from_secs(30)),
            keepalive_idle: Duration::from_secs(5),
            tcp_user_timeout: None,
            host: None,
            address: None,
            placement_weight: 1.0,
            idle_release: None,
            placement: false,
            placement_stable_for: Duration::from_secs(2),
            placement_moves_per_second: 2000,
            drain_timeout: Duration::from_secs(30),
            open_timeout: Duration::from_secs(30),
            max_open_tenants: 100_000,
            close_concurrency: 8,
            reservation: Duration::from_secs(5),
            handoff_policy: HandoffPolicy::Accept,
            migrations: std::sync::Arc::new(Vec::new()),
            statement_cache: true,
            max_tenants_per_connection: DEFAULT_MAX_TENANTS_PER_CONNECTION,
            read_only_data_sessions: true,
            fencing: Fencing::Auto,
            stuck_timeout: Duration::from_secs(30),
            request_retention: Duration::from_secs(24 * 3600),
            connector: Connector::default(),
            connect_timeout: None,
            renewal_events: false,
            distributed_schemas: None,
            alarms: AlarmSettings::default(),
        }
    }

    /// Options from a connection URL (`postgres://user@host:port/db`).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when the URL does not parse; it names the part that is wrong
    /// and what that part accepts.
    pub fn from_url(replica_id: impl Into<String>, url: &str) -> Result<Self> {
        let config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| Error::InvalidOption {
                option: "database_url",
                reason: explain_url_error(url, &e),
            })?;
        Ok(RouterOptions::new(replica_id, config))
    }

    /// Lease time to live (default 10 s, range [`MIN_TTL`]..=[`MAX_TTL`]): how long a lease
    /// outlives its last successful heartbeat, by the database clock.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Safety margin (default ttl/5): handles stop taking work at last successful heartbeat
    /// start + ttl − margin on the local monotonic clock, before the database could expire the
    /// lease. Must be below ttl − heartbeat period.
    #[must_use]
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// Heartbeat period (default ttl/3).
    #[must_use]
    pub fn heartbeat_period(mut self, period: Duration) -> Self {
        self.heartbeat_period = Some(period);
        self
    }

    /// Data-path pool size (default 16) when pgtenant builds the pool.
    #[must_use]
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Use this pool for the data path instead of building one. It must point at the same
    /// database as the config. Never share it with code that takes session locks or session
    /// `SET`s: deadpool's fast recycling keeps session state.
    #[must_use]
    pub fn pool(mut self, pool: deadpool_postgres::Pool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Backoff while re-registering after the lease session dropped (default 1 s doubling to
    /// 30 s).
    #[must_use]
    pub fn reconnect_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.reconnect_backoff = (first, max);
        self
    }

    /// How long a handoff waits for work in flight before giving up and serving on
    /// (default 30 s, range 1 ms..=1 h).
    #[must_use]
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Bound on one open (default 30 s, range 1 ms..=1 h); a lease acquired after it is
    /// released, not leaked.
    #[must_use]
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = timeout;
        self
    }

    /// Most tenants served at once, counting those opening and draining (default 100 000).
    #[must_use]
    pub fn max_open_tenants(mut self, max: usize) -> Self {
        self.max_open_tenants = max;
        self
    }

    /// Tenants handed off at once by [`Router::close`](crate::Router::close) (default 8).
    #[must_use]
    pub fn close_concurrency(mut self, lanes: usize) -> Self {
        self.close_concurrency = lanes;
        self
    }

    /// How long a directed handoff keeps a tenant reserved for its target (default 5 s, range
    /// 1 ms..=10 min), while the target is alive: a reservation for a replica whose lease
    /// session is gone, or that expired or deregistered, keeps the tenant from nobody.
    #[must_use]
    pub fn reservation(mut self, window: Duration) -> Self {
        self.reservation = window;
        self
    }

    /// What to do when another replica requests one of this replica's tenants.
    #[must_use]
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
    ///
    /// The runner is refinery's as pgtenant re-exports it ([`crate::refinery`]), so an
    /// application need not depend on the same refinery version; or pass SQL directly with
    /// [`RouterOptions::tenant_migrations`].
    #[must_use]
    pub fn migrations(mut self, runner: refinery::Runner) -> Self {
        let mut migrations = runner.get_migrations().clone();
        migrations.sort();
        self.migrations = std::sync::Arc::new(migrations);
        self
    }

    /// The tenant migrations as `(name, sql)` pairs, names as refinery wants them
    /// (`V1__accounts`, `V2__entries`, …): no refinery type in the application's code.
    ///
    /// ```
    /// # fn f(options: pgtenant::RouterOptions) -> pgtenant::Result<pgtenant::RouterOptions> {
    /// let options = options.tenant_migrations([
    ///     ("V1__accounts", "CREATE TABLE accounts (id bigint PRIMARY KEY, name text)"),
    ///     ("V2__entries", "CREATE TABLE entries (account bigint, amount bigint)"),
    /// ])?;
    /// # Ok(options) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the first migration whose name is not `V<n>__<name>`.
    pub fn tenant_migrations<N, S>(
        self,
        migrations: impl IntoIterator<Item = (N, S)>,
    ) -> Result<Self>
    where
        N: AsRef<str>,
        S: AsRef<str>,
    {
        let parsed = migrations
            .into_iter()
            .map(|(name, sql)| {
                refinery::Migration::unapplied(name.as_ref(), sql.as_ref()).map_err(|error| {
                    Error::InvalidOption {
                        option: "tenant_migrations",
                        reason: format!(
                            "{:?}: {error}; name migrations V<version>__<name>, e.g. V1__accounts",
                            name.as_ref().chars().take(60).collect::<String>()
                        ),
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.migrations(refinery::Runner::new(&parsed)))
    }

    /// The version the tenant migrations bring a tenant to (0 without migrations).
    pub(crate) fn code_version(&self) -> SchemaVersion {
        self.migrations
            .iter()
            .map(|m| SchemaVersion::new(m.version()))
            .max()
            .unwrap_or(SchemaVersion::NONE)
    }

    /// Whether the fence runs as a prepared statement cached per pooled connection (default
    /// true: the server skips parsing and planning it). Set false when the data-path pool goes
    /// through a transaction-mode pooler that does not keep prepared statements (PgBouncer
    /// before 1.21): the fence is then sent unnamed, parsed with each transaction.
    #[must_use]
    pub fn statement_cache(mut self, enabled: bool) -> Self {
        self.statement_cache = enabled;
        self
    }

    /// How many distinct tenants one pooled data connection serves before it is closed (and
    /// the pool opens a fresh one): default
    /// [`DEFAULT_MAX_TENANTS_PER_CONNECTION`](crate::limits::DEFAULT_MAX_TENANTS_PER_CONNECTION).
    /// PostgreSQL never gives back the catalog caches a backend filled: measured here about
    /// 40 KB per tenant schema it touched (three tables, an index, two sequences), so a
    /// connection that served 10 000 tenants holds about 400 MB. The bound keeps each data
    /// backend's memory flat whatever the number of tenants; connections that keep serving the
    /// same tenants are never recycled. 1 to 1 000 000.
    #[must_use]
    pub fn max_tenants_per_connection(mut self, tenants: usize) -> Self {
        self.max_tenants_per_connection = tenants;
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
    #[must_use]
    pub fn read_only_data_sessions(mut self, enabled: bool) -> Self {
        self.read_only_data_sessions = enabled;
        self
    }

    /// How fenced transactions are fenced (default [`Fencing::Auto`]: session fencing where it
    /// can hold).
    #[must_use]
    pub fn fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// How long pgtenant waits for the server to answer one of its own statements in a fenced
    /// transaction (`BEGIN`, `COMMIT`) before it closes the connection as stuck (default 30 s,
    /// range 1 ms..=1 h): a connection that stopped answering never holds a pool slot.
    #[must_use]
    pub fn stuck_timeout(mut self, timeout: Duration) -> Self {
        self.stuck_timeout = timeout;
        self
    }

    /// How long [`TenantHandle::run_once`](crate::TenantHandle::run_once) keeps a request's
    /// recorded outcome, so that a retry within it returns that outcome instead of running the
    /// work again (default 24 h, range 1 s..=366 days). Make it longer than your clients retry.
    #[must_use]
    pub fn request_retention(mut self, retention: Duration) -> Self {
        self.request_retention = retention;
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
    #[must_use]
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

    /// Bound on opening each connection pgtenant opens itself (the lease session, the pooler
    /// probe, the default data-path pool, cancel requests), end to end: TCP connect, TLS,
    /// startup and authentication; the lease session's registration that follows (pooler
    /// probe, control-plane check, liveness lock) gets the same bound again. The default pool
    /// also waits at most this long for a free connection. Default: the connection string's
    /// `connect_timeout` when it has one (as libpq reads it), else 10 s; range 1 ms..=1 h.
    /// Past it, the attempt fails with the retryable [`Error::ConnectTimeout`]. A pool given
    /// with [`RouterOptions::pool`] keeps its own timeouts.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long a session pgtenant opens (the lease session, the default data-path pool's
    /// connections) may leave data unacknowledged by the other end, or wait on a closed
    /// window, before the kernel ends it: `TCP_USER_TIMEOUT` on pgtenant's sockets and the
    /// server's `tcp_user_timeout` for the same sessions, with keepalives on both ends that
    /// start probing within it (DESIGN G9). It bounds how long a partitioned or vanished
    /// replica's sessions, their locks and its liveness lock outlive it, whatever was in
    /// flight: PostgreSQL ends such a session within 2 × this + 2 s of the last packet from
    /// the replica (usually within this of the first unanswered one), so a lost node's replica
    /// id can register again on a new address within that. Without it, a session with data in
    /// flight to a silent peer lives until the server's retransmissions give up
    /// (`tcp_retries2`: about 15 minutes).
    ///
    /// Default: the connection string's `tcp_user_timeout` (seconds, as tokio-postgres reads
    /// it) when it has one, else the ttl, at least 1 s: a replica silent for a ttl has lost its
    /// leases anyway, so a shorter silence never ends a session whose lease still holds.
    /// Range 1 s..=1 h (below a second, one lost packet, retransmitted after 200 ms, 400 ms and
    /// 800 ms, would end the connection). It also ends a data session whose client stops
    /// reading a result for this long while the server has more to send (Linux applies it to
    /// zero-window probes). A pool given with [`RouterOptions::pool`] keeps its own settings:
    /// give its connections the same (see the guide's "Detection bounds").
    #[must_use]
    pub fn tcp_user_timeout(mut self, timeout: Duration) -> Self {
        self.tcp_user_timeout = Some(timeout);
        self
    }

    /// Whether every successful heartbeat (one per heartbeat period, ttl/3 by default) is
    /// published as [`Event::Renewed`](crate::Event::Renewed). Default false: a steady
    /// stream of them would crowd out the events subscribers act on. Failures
    /// ([`Event::RenewFailed`](crate::Event::RenewFailed)) and resumptions
    /// ([`Event::Resumed`](crate::Event::Resumed)) are always published.
    #[must_use]
    pub fn renewal_events(mut self, enabled: bool) -> Self {
        self.renewal_events = enabled;
        self
    }

    /// Whether new tenant schemas are Citus distributed schemas (schema-based sharding: each
    /// lives on one worker, `citus_schema_move` rebalances). Default: on when the database has
    /// the `citus` extension, off otherwise; the session's `citus.enable_schema_based_sharding`
    /// never decides. `true` on a database without Citus is refused at
    /// [`Router::start`](crate::Router::start) with [`Error::InvalidOption`]. Schemas created
    /// before keep their placement. See the README's "Citus" section.
    #[must_use]
    pub fn distributed_schemas(mut self, enabled: bool) -> Self {
        self.distributed_schemas = Some(enabled);
        self
    }

    /// A free-form host label recorded in `pgtenant.replicas` (default: `$HOSTNAME`).
    #[must_use]
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Where this replica's clients reach it (a URL such as `http://10.0.0.5:8080`, a
    /// `host:port`, whatever your routing layer understands): registered with each
    /// incarnation, shown in `pgtenant.replica_status` and `pgtenant status`, carried by
    /// [`Error::LeaseHeld`](crate::Error::LeaseHeld) and answered by
    /// [`Router::locate`](crate::Router::locate), so that a request that reached the wrong
    /// replica can be sent to the owner. 1 to 1024 bytes, no control characters. Default: none.
    #[must_use]
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// This replica's share of the tenants by placement, relative to the other live replicas'
    /// (weighted rendezvous hashing, `pgtenant.home`): a replica of weight 2 among replicas of
    /// weight 1 is the home of twice as many tenants. 0: the home of none (it still serves
    /// what it opens). Registered with each incarnation, shown in `pgtenant.replica_status`.
    /// Range 0..=1000; default 1.
    #[must_use]
    pub fn placement_weight(mut self, weight: f64) -> Self {
        self.placement_weight = weight;
        self
    }

    /// Hands off a tenant no work has used for this long (checked every quarter of it, at
    /// most every 10 s): placement is then not pinned by tenants nobody uses, the next request
    /// opens the tenant wherever it lands, and this replica's backends drop what they cached
    /// of its schema when their connections retire. A handle the application still holds
    /// answers [`Error::LeaseLost`](crate::Error::LeaseLost)-kind errors after it
    /// ([`ErrorKind::LeaseEnded`](crate::ErrorKind::LeaseEnded)): open the tenant again.
    /// Range 100 ms..=30 days; default: never.
    #[must_use]
    pub fn idle_release(mut self, after: Duration) -> Self {
        self.idle_release = Some(after);
        self
    }

    /// Turns placement on (DESIGN §5 "Placement", `docs/placement.md`): this replica hands
    /// each tenant it holds whose home is another live replica, stable for
    /// [`placement_stable_for`](Self::placement_stable_for), straight to that home (a directed
    /// handoff, at most [`placement_moves_per_second`](Self::placement_moves_per_second)); it
    /// picks up at once what another replica reserved for it; [`Router::close`](crate::Router::close)
    /// hands each tenant to its next home; and [`Router::route`](crate::Router::route) sends a
    /// request for a free tenant, or one whose owner died, to its home rather than opening it
    /// wherever it landed (so a crashed replica's tenants are taken by their next homes, with no
    /// herd). Every replica of a fleet should say the same. Default: off (a tenant stays where it
    /// was first opened until it is handed off, released or its owner goes away).
    #[must_use]
    pub fn placement(mut self, on: bool) -> Self {
        self.placement = on;
        self
    }

    /// How long a replica must have been alive, in its current incarnation, before tenants are
    /// moved to it: a member that restarts or flaps within it receives nothing. Its own
    /// tenants never move away from it for this. Range 0..=1 hour; default 2 s.
    #[must_use]
    pub fn placement_stable_for(mut self, window: Duration) -> Self {
        self.placement_stable_for = window;
        self
    }

    /// At most this many tenants handed to their homes per second by this replica (each one
    /// drained first, like any handoff). Range 1..=100 000; default 2 000.
    #[must_use]
    pub fn placement_moves_per_second(mut self, moves: usize) -> Self {
        self.placement_moves_per_second = moves;
        self
    }

    /// How many times an alarm's handler is tried before the alarm is parked as failed
    /// (visible in `pgtenant.alarms` and in the tenant's `pgtenant_alarms`). Range 1..=1000;
    /// default 5.
    #[must_use]
    pub fn alarm_max_attempts(mut self, attempts: u32) -> Self {
        self.alarms.max_attempts = attempts;
        self
    }

    /// How long a failed alarm waits before its next attempt: `first`, doubling at each
    /// attempt, at most `max`. Ranges 1 ms..=1 h and `first`..=1 day; default 1 s doubling to
    /// 5 min.
    #[must_use]
    pub fn alarm_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.alarms.backoff = (first, max);
        self
    }

    pub(crate) fn effective_margin(&self) -> Duration {
        self.margin.unwrap_or(self.ttl / 5)
    }

    pub(crate) fn effective_heartbeat_period(&self) -> Duration {
        self.heartbeat_period.unwrap_or(self.ttl / 3)
    }

    pub(crate) fn effective_tcp_user_timeout(&self) -> Duration {
        self.tcp_user_timeout
            .or(self.config.get_tcp_user_timeout().copied())
            .unwrap_or(self.ttl.max(Duration::from_secs(1)))
    }

    /// The TCP bounds of every session pgtenant opens, for both ends (DESIGN G9).
    pub(crate) fn tcp_bounds(&self) -> TcpBounds {
        let user_timeout = self.effective_tcp_user_timeout();
        // With TCP_USER_TIMEOUT set, Linux ends a connection whose keepalive probes went
        // unanswered for the user timeout (the probe count no longer counts), so probes must
        // start within it: a peer with nothing in flight is then dropped within the timeout
        // plus one interval too. Whole seconds: the server's setting has no finer unit.
        let idle = self.keepalive_idle.min(user_timeout).as_secs().max(1);
        TcpBounds {
            user_timeout,
            keepalive_idle: Duration::from_secs(idle),
            keepalive_interval: Duration::from_secs(2),
            keepalive_retries: 3,
        }
    }

    pub(crate) fn effective_connect_timeout(&self) -> Duration {
        self.connect_timeout
            .or(self.config.get_connect_timeout().copied())
            .unwrap_or(crate::connect::DEFAULT_CONNECT_TIMEOUT)
    }

    /// Every value in range, or the first one that is not, with its value and its range.
    /// Nothing here may overflow, whatever the values.
    pub(crate) fn validate(&self) -> Result<()> {
        crate::replica_id::check("replica_id", self.replica_id.as_str())?;
        if let Some(after) = self.idle_release {
            in_range(
                "idle_release",
                after,
                Duration::from_millis(100)..=Duration::from_secs(30 * 24 * 3600),
                "",
            )?;
        }
        in_range(
            "placement_stable_for",
            self.placement_stable_for,
            Duration::ZERO..=Duration::from_secs(3600),
            "",
        )?;
        count_in_range(
            "placement_moves_per_second",
            self.placement_moves_per_second,
            1..=100_000,
        )?;
        if !(0.0..=1000.0).contains(&self.placement_weight) {
            return Err(Error::InvalidOption {
                option: "placement_weight",
                reason: format!(
                    "{} is outside 0..=1000 (a share relative to the other replicas'; 0 makes \
                     this replica the home of no tenant)",
                    self.placement_weight
                ),
            });
        }
        if let Some(address) = &self.address {
            if address.is_empty() || address.len() > 1024 || address.chars().any(char::is_control) {
                return Err(Error::InvalidOption {
                    option: "address",
                    reason: format!(
                        "{address:?} is not an address: give 1 to 1024 bytes without control \
                         characters, e.g. http://10.0.0.5:8080"
                    ),
                });
            }
        }
        in_range("ttl", self.ttl, MIN_TTL..=MAX_TTL, "")?;
        let period = self.effective_heartbeat_period();
        in_range(
            "heartbeat_period",
            period,
            MS..=self.ttl / 2,
            " (at most ttl/2, so one lost heartbeat does not expire the lease)",
        )?;
        let margin = self.effective_margin();
        // Below ttl − period, so a handle stops before the database can expire its lease.
        let below = self.ttl.saturating_sub(period);
        if margin.is_zero() || margin >= below {
            return Err(Error::InvalidOption {
                option: "margin",
                reason: format!(
                    "{margin:?} is outside 1ns..{below:?} (above zero and below ttl − heartbeat \
                     period, so handles stop before the database can expire their leases)"
                ),
            });
        }
        if self.pool.is_none() {
            count_in_range("pool_size", self.pool_size, 1..=1000)?;
        }
        count_in_range(
            "max_tenants_per_connection",
            self.max_tenants_per_connection,
            1..=1_000_000,
        )?;
        let (first, max) = self.reconnect_backoff;
        in_range("reconnect_backoff", first, MS..=HOUR, " (first delay)")?;
        in_range(
            "reconnect_backoff",
            max,
            first..=HOUR,
            " (longest delay: at least the first)",
        )?;
        in_range("drain_timeout", self.drain_timeout, MS..=HOUR, "")?;
        in_range("open_timeout", self.open_timeout, MS..=HOUR, "")?;
        in_range("stuck_timeout", self.stuck_timeout, MS..=HOUR, "")?;
        in_range(
            "request_retention",
            self.request_retention,
            Duration::from_secs(1)..=Duration::from_secs(366 * 24 * 3600),
            "",
        )?;
        in_range(
            "reservation",
            self.reservation,
            MS..=Duration::from_secs(600),
            "",
        )?;
        let from_url = if self.connect_timeout.is_none() {
            " (from the connection string's connect_timeout)"
        } else {
            ""
        };
        in_range(
            "connect_timeout",
            self.effective_connect_timeout(),
            MS..=HOUR,
            from_url,
        )?;
        count_in_range("max_open_tenants", self.max_open_tenants, 1..=10_000_000)?;
        count_in_range(
            "alarm_max_attempts",
            usize::try_from(self.alarms.max_attempts).unwrap_or(usize::MAX),
            1..=1000,
        )?;
        let (first, max) = self.alarms.backoff;
        in_range("alarm_backoff", first, MS..=HOUR, " (first delay)")?;
        in_range(
            "alarm_backoff",
            max,
            first..=Duration::from_secs(24 * 3600),
            " (longest delay: at least the first, at most a day)",
        )?;
        count_in_range("close_concurrency", self.close_concurrency, 1..=1024)?;
        // After the connection string's own checks, which name a socket value no socket takes.
        self.validate_config()?;
        let from_url =
            if self.tcp_user_timeout.is_none() && self.config.get_tcp_user_timeout().is_some() {
                " (from the connection string's tcp_user_timeout, in seconds)"
            } else {
                " (at least a second: below, one lost packet would end a connection)"
            };
        in_range(
            "tcp_user_timeout",
            self.effective_tcp_user_timeout(),
            Duration::from_secs(1)..=HOUR,
            from_url,
        )
    }

    /// What the connection string asks for that no connection could give.
    fn validate_config(&self) -> Result<()> {
        let invalid = |reason: String| {
            Err(Error::InvalidOption {
                option: "config",
                reason,
            })
        };
        let config = &self.config;
        if config.get_hosts().is_empty() {
            return invalid("no host: set a host in the URL or config".to_owned());
        }
        let hosts = config.get_hosts().iter().filter_map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => Some(name.as_bytes()),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(_) => None,
        });
        let parts = [
            ("user name", config.get_user().map(str::as_bytes)),
            ("password", config.get_password()),
            ("database name", config.get_dbname().map(str::as_bytes)),
            ("options", config.get_options().map(str::as_bytes)),
            (
                "application name",
                config.get_application_name().map(str::as_bytes),
            ),
        ]
        .into_iter()
        .chain(hosts.map(|host| ("host name", Some(host))));
        for (part, value) in parts {
            if value.is_some_and(|bytes| bytes.contains(&0)) {
                return invalid(format!(
                    "the {part} contains a NUL byte, which PostgreSQL's protocol cannot carry \
                     (%00 in a URL decodes to one): remove it"
                ));
            }
        }
        // The socket options the driver sets on every connection: Linux refuses values past
        // these with EINVAL ("Invalid argument"), which would say nothing about the cause.
        let second = Duration::from_secs(1);
        let keepalive_max = Duration::from_secs(32_767);
        let socket = [
            (
                "keepalives_idle",
                config
                    .get_keepalives()
                    .then(|| config.get_keepalives_idle()),
                second..=keepalive_max,
            ),
            (
                "keepalives_interval",
                config
                    .get_keepalives()
                    .then(|| config.get_keepalives_interval())
                    .flatten(),
                second..=keepalive_max,
            ),
            (
                "tcp_user_timeout",
                config.get_tcp_user_timeout().copied(),
                Duration::ZERO..=Duration::from_millis(i32::MAX as u64),
            ),
        ];
        for (name, value, range) in socket {
            if let Some(value) = value.filter(|value| !range.contains(value)) {
                return invalid(format!(
                    "{name} {value:?} is outside {:?}..={:?} (what the operating system takes)",
                    range.start(),
                    range.end()
                ));
            }
        }
        if let Some(retries) = config
            .get_keepalives_retries()
            .filter(|retries| config.get_keepalives() && !(1..=127).contains(retries))
        {
            return invalid(format!(
                "keepalives_retries {retries} is outside 1..=127 (what the operating system takes)"
            ));
        }
        if config.get_target_session_attrs() == tokio_postgres::config::TargetSessionAttrs::ReadOnly
        {
            return invalid(
                "target_session_attrs=read-only: pgtenant writes on every connection it opens \
                 (lease session, fenced transactions), so it always connects to the primary among \
                 the hosts; use target_session_attrs=read-write (or leave it out)"
                    .to_owned(),
            );
        }
        if config.get_ssl_mode() == SslMode::Require && !self.connector.encrypts {
            return Err(Error::InvalidOption {
                option: "tls",
                reason: "the connection string requires TLS (sslmode=require) but no TLS connector \
                         is set: pass one with RouterOptions::tls (e.g. \
                         tokio_postgres_rustls::MakeRustlsConnect), or use sslmode=prefer or disable"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// The TCP bounds of a session pgtenant opens, set on both ends: the client socket's options
/// and the server session's settings (DESIGN G9: a partitioned or vanished peer's session,
/// with its locks, ends within a bound whatever is in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpBounds {
    pub(crate) user_timeout: Duration,
    pub(crate) keepalive_idle: Duration,
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_retries: u32,
}

impl TcpBounds {
    /// Sets the bounds on pgtenant's end of a connection made from `config`.
    pub(crate) fn client(&self, config: &mut tokio_postgres::Config) {
        config
            .keepalives(true)
            .keepalives_idle(self.keepalive_idle)
            .keepalives_interval(self.keepalive_interval)
            .keepalives_retries(self.keepalive_retries)
            .tcp_user_timeout(self.user_timeout);
    }

    /// The server's end: `(setting, value)` for `SET` or a startup option `-c setting=value`
    /// (`tcp_user_timeout` in milliseconds, keepalives in seconds, the server's units). The
    /// server applies them to TCP sessions only.
    pub(crate) fn server_settings(&self) -> [(&'static str, String); 4] {
        [
            (
                "tcp_user_timeout",
                self.user_timeout.as_millis().to_string(),
            ),
            (
                "tcp_keepalives_idle",
                self.keepalive_idle.as_secs().to_string(),
            ),
            (
                "tcp_keepalives_interval",
                self.keepalive_interval.as_secs().to_string(),
            ),
            ("tcp_keepalives_count", self.keepalive_retries.to_string()),
        ]
    }
}

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);

fn in_range(
    option: &'static str,
    value: Duration,
    range: RangeInclusive<Duration>,
    why: &str,
) -> Result<()> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option,
        reason: format!(
            "{value:?} is outside {:?}..={:?}{why}",
            range.start(),
            range.end()
        ),
    })
}

fn count_in_range(option: &'static str, value: usize, range: RangeInclusive<usize>) -> Result<()> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option,
        reason: format!("{value} is outside {}..={}", range.start(), range.end()),
    })
}

/// What tokio-postgres leaves out of "invalid connection string": which part is wrong, its
/// value when it can be found, and what that part accepts.
fn explain_url_error(url: &str, error: &tokio_postgres::Error) -> String {
    const SHAPE: &str =
        "expected postgres://user:password@host:port/database?option=value (or key=value pairs)";
    let cause = std::error::Error::source(error)
        .map(ToString::to_string)
        .unwrap_or_else(|| error.to_string());
    // tokio-postgres names the part between backticks: "invalid value for option `port`".
    let Some(name) = cause.split('`').nth(1) else {
        return format!("{error}: {cause}; {SHAPE}");
    };
    if cause.starts_with("unknown option") {
        return format!(
            "unknown option `{name}`; accepted: {}",
            accepted_option_names()
        );
    }
    let accepted = match name {
        "port" => "a port number 0..=65535 (one per host, or one for all)",
        "sslmode" => {
            "disable, prefer or require; libpq's verify-ca and verify-full are not accepted: \
             certificates are checked by the TLS connector given to RouterOptions::tls"
        }
        "sslnegotiation" => "postgres or direct",
        "host" => "a host name, an IP address or an absolute Unix-socket directory",
        "hostaddr" => "an IP address",
        "connect_timeout" | "tcp_user_timeout" | "keepalives_idle" | "keepalives_interval" => {
            "whole seconds, e.g. 10"
        }
        "keepalives" => "0 or 1",
        "keepalives_retries" => "a count 0..=4294967295",
        "target_session_attrs" => "any, read-write or read-only",
        "channel_binding" => "disable, prefer or require",
        "load_balance_hosts" => "disable or random",
        _ => SHAPE,
    };
    match url_value(url, name) {
        Some(value) => format!(
            "`{name}` is {:?}, which is not accepted: {name} takes {accepted}",
            value.chars().take(80).collect::<String>()
        ),
        None => format!("invalid value for `{name}`: it takes {accepted}"),
    }
}

fn accepted_option_names() -> &'static str {
    "user, password, dbname, options, application_name, sslmode, sslnegotiation, host, hostaddr, \
     port, connect_timeout, tcp_user_timeout, keepalives, keepalives_idle, keepalives_interval, \
     keepalives_retries, target_session_attrs, channel_binding, load_balance_hosts"
}

/// Best effort: the value `name` has in `url`, as written (a query or key=value parameter, or
/// the port part of a URL's host list).
fn url_value<'a>(url: &'a str, name: &str) -> Option<&'a str> {
    let parameter = url
        .split(['?', '&', ' '])
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.trim() == name)
        .map(|(_, value)| value);
    if parameter.is_some() || name != "port" {
        return parameter;
    }
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    hosts
        .split(',')
        .filter_map(|host| host.rsplit_once(':').map(|(_, port)| port))
        .find(|port| !port.is_empty() && port.parse::<u16>().is_err())
}

/// The default of [`RouterOptions::max_tenants_per_connection`]: 500 tenants, about 20 MB of
/// catalog caches per data backend at 40 KB per tenant (a pool of 16 such connections: about
/// 320 MB at most, however many tenants the replica serves).
pub const DEFAULT_MAX_TENANTS_PER_CONNECTION: usize = 500;
