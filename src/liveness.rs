//! The replica's liveness (DESIGN §5 "Replica start", "Heartbeat"): its lease session, the
//! pooler probe, registration, the heartbeat loop, the local deadline, re-registration after
//! the session drops, and deregistration.
//!
//! One dedicated, never-pooled connection per replica holds one session-level advisory lock
//! (DESIGN §3: one lock per tenant would exhaust the shared lock table). The database clock
//! decides expiry; the local monotonic deadline only makes handles stop early.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot, watch};
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client, GenericClient};
use tracing::{info, warn};

use crate::connect::Connector;
use crate::control_plane::LOCK_NAMESPACE;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::lease::Incarnation;
use crate::options::RouterOptions;
use crate::replica::{lock, RegistrationFailure, Shared};

/// What an incarnation presents to the control-plane functions to act for its replica (G8):
/// the secret `pgtenant.register` issued to it, which the database stores only hashed.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) replica: String,
    pub(crate) incarnation: Incarnation,
    /// This process's number for the registration, unique across its registrations: after a
    /// lossy failover the database can issue an incarnation number again, so state kept per
    /// incarnation on this side (a refusal, a binding) is kept per registration (DESIGN G9).
    pub(crate) registration: u64,
    secret: String,
}

impl Credentials {
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("replica", &self.replica)
            .field("incarnation", &self.incarnation)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// What handles read on every call: atomics only, no lock (the credentials, read on control
/// paths only, sit behind a mutex).
pub(crate) struct Liveness {
    base: Instant,
    credentials: std::sync::Mutex<Option<Arc<Credentials>>>,
    /// Current incarnation; 0 while not registered.
    incarnation: AtomicI64,
    /// Local deadline of the current incarnation, in nanoseconds since `base`.
    deadline: AtomicU64,
    /// Whether the deadline was found passed, so the next renewal reports a resume.
    lapsed: AtomicBool,
}

impl Liveness {
    pub(crate) fn new() -> Self {
        Liveness {
            base: Instant::now(),
            credentials: std::sync::Mutex::new(None),
            incarnation: AtomicI64::new(0),
            deadline: AtomicU64::new(0),
            lapsed: AtomicBool::new(false),
        }
    }

    /// The current incarnation; None while not registered.
    pub(crate) fn incarnation(&self) -> Option<Incarnation> {
        Some(self.incarnation.load(Ordering::Acquire))
            .filter(|i| *i > 0)
            .map(Incarnation::new)
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// True while the local deadline has not passed.
    pub(crate) fn within_deadline(&self) -> bool {
        let fresh = self.nanos(Instant::now()) < self.deadline.load(Ordering::Acquire);
        if !fresh {
            self.lapsed.store(true, Ordering::Release);
        }
        fresh
    }

    /// The current incarnation's credentials; None while not registered.
    pub(crate) fn credentials(&self) -> Option<Arc<Credentials>> {
        self.lock_credentials().clone()
    }

    fn lock_credentials(&self) -> std::sync::MutexGuard<'_, Option<Arc<Credentials>>> {
        self.credentials
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn begin(&self, credentials: Credentials, deadline: Instant) {
        let incarnation = credentials.incarnation.get();
        *self.lock_credentials() = Some(Arc::new(credentials));
        self.deadline.store(self.nanos(deadline), Ordering::Release);
        self.lapsed.store(false, Ordering::Release);
        self.incarnation.store(incarnation, Ordering::Release);
    }

    /// Records a successful heartbeat; true when it resumes service after a lapse.
    pub(crate) fn renewed(&self, deadline: Instant) -> bool {
        let was_lapsed = self.lapsed.swap(false, Ordering::AcqRel)
            || self.nanos(Instant::now()) >= self.deadline.load(Ordering::Acquire);
        self.deadline.store(self.nanos(deadline), Ordering::Release);
        was_lapsed
    }

    pub(crate) fn end(&self) {
        self.incarnation.store(0, Ordering::Release);
        self.deadline.store(0, Ordering::Release);
        *self.lock_credentials() = None;
    }
}

/// A NOTIFY received on the lease session.
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    pub(crate) channel: String,
    pub(crate) payload: String,
}

/// Channel on which releases announce a free tenant (payload: tenant key).
pub(crate) const FREE_CHANNEL: &str = "pgtenant_free";
/// Channel on which replicas ask an owner for a tenant (payload: JSON).
pub(crate) const HANDOFF_CHANNEL: &str = "pgtenant_handoff";

/// A registered lease session.
pub(crate) struct LeaseSession {
    pub(crate) client: Client,
    /// Fires when the connection ends (terminated, network gone, server restart).
    pub(crate) ended: oneshot::Receiver<()>,
    pub(crate) credentials: Credentials,
    /// When the registration statement was sent: the local deadline counts from here.
    pub(crate) registered_at: Instant,
}

/// One heartbeat (`pgtenant.heartbeat`, V3): true when renewed, false when the incarnation
/// expired or was replaced.
const HEARTBEAT_SQL: &str = "SELECT pgtenant.heartbeat($1, $2, $3, $4)";

pub(crate) fn millis(duration: Duration) -> i32 {
    i32::try_from(duration.as_millis()).unwrap_or(i32::MAX)
}

impl LeaseSession {
    /// Connects, takes the replica's liveness lock and registers a new incarnation.
    /// NOTIFYs on `pgtenant_free` and `pgtenant_handoff` are forwarded to `notices`: the lease
    /// session is never pooled, so it can LISTEN without leaking session state.
    pub(crate) async fn open(
        options: &RouterOptions,
        notices: broadcast::Sender<Notice>,
    ) -> Result<LeaseSession> {
        let mut config = options.config.clone();
        config
            .keepalives(true)
            .keepalives_idle(options.keepalive_idle)
            .keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(3)
            .application_name(format!("pgtenant lease {}", options.replica_id));
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        // The first of the hosts that is a primary; `host` is that one alone, with the
        // settings above, for the pooler probe (which must reach the same server) and errors.
        let crate::connect::Connected {
            client,
            mut messages,
            host,
            ..
        } = options
            .connector
            .connect(config, "open the lease session")
            .await?;
        let (tx, ended) = oneshot::channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| messages(cx)).await {
                    Some(Ok(AsyncMessage::Notification(note))) => {
                        let _ = notices.send(Notice {
                            channel: note.channel().to_owned(),
                            payload: note.payload().to_owned(),
                        });
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::debug!(%error, "lease session ended");
                        break;
                    }
                    None => break,
                }
            }
            let _ = tx.send(());
        });
        // A server that finished the handshake can still stall here (a lock held by another
        // session, a server that stopped answering), and re-registration must not wait forever.
        let bound = options.connector.timeout;
        let registered = tokio::time::timeout(bound, register(&client, &host, options)).await;
        let (incarnation, secret, registered_at) = match registered {
            Ok(registered) => registered?,
            Err(_) => {
                return Err(Error::ConnectTimeout {
                    context: format!(
                        "register replica {} on its lease session ({})",
                        options.replica_id,
                        crate::connect::target(&host)
                    ),
                    timeout: bound,
                })
            }
        };
        Ok(LeaseSession {
            client,
            ended,
            credentials: Credentials {
                replica: options.replica_id.clone(),
                incarnation: Incarnation::new(incarnation),
                registration: {
                    static NEXT: AtomicU64 = AtomicU64::new(1);
                    NEXT.fetch_add(1, Ordering::Relaxed)
                },
                secret,
            },
            registered_at,
        })
    }

    pub(crate) fn incarnation(&self) -> Incarnation {
        self.credentials.incarnation
    }

    /// Declares that this incarnation uses session fencing, before it serves anything: only
    /// then may its data sessions bind, and takeovers of its tenants seal it first.
    pub(crate) async fn declare_session_fencing(&self) -> Result<()> {
        let credentials = &self.credentials;
        self.client
            .query_typed(
                "SELECT pgtenant.declare_session_fencing($1, $2, $3)",
                &[
                    (&credentials.replica, Type::TEXT),
                    (&credentials.incarnation.get(), Type::INT8),
                    (&credentials.secret(), Type::TEXT),
                ],
            )
            .await
            .map(drop)
            .map_err(Error::db("declare session fencing"))
    }

    /// Ends the incarnation (`pgtenant.deregister`: marked released so no one waits for its
    /// expiry, every lease it still holds released) and frees the liveness lock before
    /// returning (a dropped connection frees it too, but only once the server has processed
    /// the disconnect), then ends the session.
    pub(crate) async fn deregister(self) {
        let credentials = &self.credentials;
        let result = self
            .client
            .query_typed(
                "SELECT pgtenant.deregister($1, $2, $3)",
                &[
                    (&credentials.replica, Type::TEXT),
                    (&credentials.incarnation.get(), Type::INT8),
                    (&credentials.secret(), Type::TEXT),
                ],
            )
            .await;
        if let Err(error) = result {
            tracing::warn!(error = %Error::db("deregister")(error), "deregistration failed; the lock goes with the session anyway");
        }
        let _ = self
            .client
            .batch_execute("SELECT pg_advisory_unlock_all()")
            .await;
    }
}

/// Configures a fresh lease session, probes it for a pooler, checks the control plane, takes
/// the liveness lock and registers a new incarnation: (incarnation, when registration began).
/// `host` is the one host the session reached.
async fn register(
    client: &Client,
    host: &tokio_postgres::Config,
    options: &RouterOptions,
) -> Result<(i64, String, Instant)> {
    let idle = options.keepalive_idle;
    // Server side keepalives too, so the server drops a vanished client's session (and its
    // liveness lock) within idle + 2 s × 3, not the kernel's two hours. Session SETs are fine
    // here: this connection is never pooled.
    client
            .batch_execute(&format!(
                "SET tcp_keepalives_idle = {}; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3;
                 SET idle_session_timeout = 0; SET idle_in_transaction_session_timeout = 0; SET statement_timeout = 0;
                 SET default_transaction_read_only = off;
                 LISTEN {FREE_CHANNEL}; LISTEN {HANDOFF_CHANNEL}",
                idle.as_secs().max(1)
            ))
            .await
            .map_err(Error::db("configure the lease session"))?;

    // Before the control plane is read: behind a transaction pooler the check below could
    // fail on a prepared statement the pooler lost, hiding the real cause.
    probe_for_pooler(client, host, &options.connector).await?;
    crate::control_plane::ensure_current(client).await?;
    let lock_key: i32 = client
        .query_one(
            "SELECT pgtenant.replica_lock_key($1)",
            &[&options.replica_id],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("look up the replica's lock key"))?;
    let locked: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock($1, $2)",
            &[&LOCK_NAMESPACE, &lock_key],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("take the replica's liveness lock"))?;
    if !locked {
        return Err(in_use(client, &options.replica_id, lock_key).await);
    }
    let registered_at = Instant::now();
    let host = options
        .host
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok());
    let (incarnation, secret): (i64, String) = client
        .query_one(
            "SELECT incarnation, secret FROM pgtenant.register($1, $2, $3)",
            &[&options.replica_id, &millis(options.ttl), &host],
        )
        .await
        .and_then(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .map_err(|e| match e.code().map(|c| c.code()) {
            Some("PTS01") => Error::NotASession(
                e.as_db_error()
                    .map(|db| format!("{} ({})", db.message(), db.hint().unwrap_or_default()))
                    .unwrap_or_default(),
            ),
            _ => Error::db("register the replica")(e),
        })?;
    Ok((incarnation, secret, registered_at))
}

/// Refuses a lease session that does not own its backend. Behind a transaction- or
/// statement-mode pooler, a session's backend goes back to the pool after every statement; a
/// direct connection (or session-mode pooling) has a backend of its own.
/// `host` is the lease session's one host: with several in the connection string, the probe
/// must reach the same server, or comparing backend pids would mean nothing.
async fn probe_for_pooler(
    lease: &Client,
    host: &tokio_postgres::Config,
    connector: &Connector,
) -> Result<()> {
    const CONTEXT: &str = "probe the lease session for a pooler";
    let crate::connect::Connected {
        client: mut probe,
        messages,
        ..
    } = connector.connect(host.clone(), CONTEXT).await?;
    let driver = tokio::spawn(crate::connect::drive(messages));
    let verdict = owns_its_backend(lease, &mut probe, CONTEXT).await;
    drop(probe);
    let _ = driver.await;
    match verdict? {
        None => Ok(()),
        Some(detail) => Err(Error::NotASession(format!(
            "{detail}: a transaction-mode pooler is in front; connect the lease session directly \
             or through session pooling"
        ))),
    }
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
    async fn backend_of(client: &impl GenericClient, context: &'static str) -> Result<i32> {
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

/// One heartbeat: Some(()) renewed, None when the incarnation expired or was replaced.
async fn heartbeat(
    client: &Client,
    credentials: &Credentials,
    options: &RouterOptions,
) -> Result<Option<()>> {
    let renewed: bool = client
        .query_typed_one(
            HEARTBEAT_SQL,
            &[
                (&credentials.replica, Type::TEXT),
                (&credentials.incarnation.get(), Type::INT8),
                (&credentials.secret(), Type::TEXT),
                (&millis(options.ttl), Type::INT4),
            ],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("heartbeat"))?;
    Ok(renewed.then_some(()))
}

async fn in_use(client: &Client, replica_id: &str, lock_key: i32) -> Error {
    let holder = client
        .query_opt(
            "SELECT l.pid, a.backend_start::text, r.host
               FROM pg_locks l
               LEFT JOIN pg_stat_activity a ON a.pid = l.pid
               LEFT JOIN pgtenant.replica_status r ON r.replica_id = $3
              WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                AND l.classid = $1::integer::oid AND l.objid = $2::integer::oid
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              LIMIT 1",
            &[&LOCK_NAMESPACE, &lock_key, &replica_id],
        )
        .await;
    match holder {
        Ok(Some(row)) => Error::ReplicaIdInUse {
            replica_id: replica_id.to_owned(),
            holder_pid: row.get(0),
            since: row.get(1),
            host: row.get(2),
        },
        Ok(None) => Error::ReplicaIdInUse {
            replica_id: replica_id.to_owned(),
            holder_pid: 0,
            since: None,
            host: None,
        },
        Err(e) => Error::db("identify the replica id's holder")(e),
    }
}

/// Starts serving an incarnation just registered.
pub(crate) fn begin_incarnation(shared: &Shared, session: &LeaseSession) {
    let options = &shared.options;
    let incarnation = session.incarnation();
    shared.liveness.begin(
        session.credentials.clone(),
        session.registered_at + options.ttl - options.effective_margin(),
    );
    info!(%incarnation, "registered");
    shared.emit(Event::Registered {
        replica: options.replica_id.clone(),
        incarnation,
    });
}

enum SessionEnd {
    Shutdown,
    Lost(&'static str),
}

/// The replica's background task: heartbeats, and re-registration when an incarnation ends;
/// deregisters on shutdown.
pub(crate) async fn maintain(
    shared: Arc<Shared>,
    mut session: LeaseSession,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        match heartbeat_until_end(&shared, &mut session, &mut shutdown).await {
            SessionEnd::Shutdown => {
                shared.liveness.end();
                session.deregister().await;
                return;
            }
            SessionEnd::Lost(reason) => {
                warn!(reason, incarnation = %session.incarnation(), "incarnation lost");
                shared.lose_incarnation(reason);
            }
        }
        drop(session);
        let (first, max) = shared.options.reconnect_backoff;
        let mut delay = first;
        // A fresh incarnation refused too: registering again did not cure it at once, so the
        // next tries back off (a refusal no retry cures must not be retried many times a
        // second, DESIGN G9), and a lasting one is reported as such.
        let refused = shared.bindings.refused_in_a_row();
        if refused >= 2 {
            let pause = first.saturating_mul(1 << (refused - 2).min(16)).min(max);
            if let Some(lasting) = shared.bindings.lasting(&shared.options.replica_id) {
                warn!(error = %lasting, retry_in = ?pause, "data sessions refused for incarnation after incarnation");
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => return,
            }
        }
        session = loop {
            if *shutdown.borrow() {
                return;
            }
            let opened = match LeaseSession::open(&shared.options, shared.notices.clone()).await {
                Ok(session) if shared.session_fencing() => {
                    session.declare_session_fencing().await.map(|()| session)
                }
                opened => opened,
            };
            match opened {
                Ok(session) => break session,
                Err(error) => {
                    // Only standbys answered: a failover is under way and a promotion is what
                    // ends it, so keep trying at the first delay instead of doubling it, which
                    // would add up to the longest delay (30 s by default) to the failover's
                    // downtime. It costs one connection to a standby per replica per try.
                    let failing_over = error.sqlstate() == Some(crate::sqlstate::NOT_PRIMARY);
                    if failing_over {
                        delay = first;
                    }
                    warn!(%error, retry_in = ?delay, "re-registration failed");
                    let reason = error.to_string();
                    *lock(&shared.registration) = Some(RegistrationFailure {
                        message: reason.clone(),
                        lasting: error.lasting_copy(),
                    });
                    shared.emit(Event::RegistrationFailed {
                        reason,
                        retryable: error.is_retryable(),
                        retry_in_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    });
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.changed() => return,
                    }
                    delay = delay.saturating_mul(2).min(max);
                }
            }
        };
        *lock(&shared.registration) = None;
        begin_incarnation(&shared, &session);
    }
}

async fn heartbeat_until_end(
    shared: &Shared,
    session: &mut LeaseSession,
    shutdown: &mut watch::Receiver<bool>,
) -> SessionEnd {
    let options = &shared.options;
    let period = options.effective_heartbeat_period();
    let mut last_success = session.registered_at;
    let mut next = session.registered_at + period;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = &mut session.ended => return SessionEnd::Lost("lease session dropped"),
            _ = shutdown.changed() => return SessionEnd::Shutdown,
            _ = shared.bindings.refusal() => {
                // The database will bind nothing to this incarnation (sealed, or no longer
                // alive by its account): a new incarnation is the cure, and waiting for the
                // heartbeat to find out would leave every write refused meanwhile.
                if shared.bindings.is_refused(session.credentials.registration) {
                    return SessionEnd::Lost("the database refused to bind a data session to this incarnation");
                }
                continue;
            }
        }
        let started = Instant::now();
        next = started + period;
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(period, heartbeat(&session.client, &session.credentials, options)) => outcome,
            _ = &mut session.ended => return SessionEnd::Lost("lease session dropped"),
            _ = shutdown.changed() => return SessionEnd::Shutdown,
        };
        crate::metrics::heartbeat(started.elapsed(), matches!(outcome, Ok(Ok(Some(())))));
        match outcome {
            Ok(Ok(Some(()))) => {
                last_success = started;
                let resumed = shared
                    .liveness
                    .renewed(started + options.ttl - options.effective_margin());
                let incarnation = session.incarnation();
                if resumed {
                    info!(%incarnation, "heartbeat resumed service");
                    shared.emit(Event::Resumed { incarnation });
                }
                if options.renewal_events {
                    shared.emit(Event::Renewed { incarnation });
                }
            }
            Ok(Ok(None)) => {
                return SessionEnd::Lost("heartbeat found the incarnation expired or replaced")
            }
            Ok(Err(error)) if read_only(&error) => {
                // The server is (or became) a standby: no heartbeat can succeed there, and
                // waiting a ttl for it would only delay re-registering on the primary.
                warn!(%error, "heartbeat found the server read-only");
                return SessionEnd::Lost("the lease session's server is read-only (a standby)");
            }
            Ok(Err(error)) => {
                warn!(%error, "heartbeat failed");
                shared.emit(Event::RenewFailed {
                    reason: error.to_string(),
                });
            }
            Err(_) => {
                warn!("heartbeat timed out");
                shared.emit(Event::RenewFailed {
                    reason: format!("heartbeat timed out after {period:?}"),
                });
            }
        }
        // The database has expired this incarnation by now unless a renewal got through that
        // we never heard of; a session that cannot answer for a whole ttl is replaced.
        if started.duration_since(last_success) > options.ttl {
            return SessionEnd::Lost("lease session unresponsive for a whole ttl");
        }
    }
}

/// Whether a heartbeat failed because its server takes no writes: SQLSTATE 25006, what a hot
/// standby answers to any write. Defence in depth: a lease session is opened on a primary only
/// (`connect.rs`), PostgreSQL turns a primary into a standby only through a restart, which ends
/// the session, and the session itself sets `default_transaction_read_only = off`; but a
/// proxy that reconnects behind the session's back could land it on a standby.
fn read_only(error: &Error) -> bool {
    error.sqlstate() == Some("25006")
}
