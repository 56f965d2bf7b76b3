//! Replica start (DESIGN §5 "Replica start"): the data-path pool and the fencing it allows,
//! the lease session (TCP keepalives, the pooler probe), the control plane's version check,
//! the replica's liveness lock, the registration of a new incarnation, and deregistration at
//! the end (`pgtenant.register`, `pgtenant.deregister`).
//!
//! One dedicated, never-pooled connection per replica holds one session-level advisory lock
//! (DESIGN §3: one lock per tenant would exhaust the shared lock table). The database clock
//! decides expiry; the local monotonic deadline (`state/liveness.rs`) only makes handles stop
//! early. Re-registration after the session drops is the heartbeat's (`heartbeat.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot};
use tokio_postgres::{AsyncMessage, Client};
use tracing::info;

use crate::citus::Placement;
use crate::connect::Connector;
use crate::credentials::{millis, Credentials};
use crate::db;
use crate::error::{pool_error, Error, Result};
use crate::event::Event;
use crate::lease::Incarnation;
use crate::options::RouterOptions;
use crate::replica_id::ReplicaId;
use crate::state::bindings::Mode;
use crate::state::liveness::{Notice, FREE_CHANNEL, HANDOFF_CHANNEL, RESERVED_CHANNEL};
use crate::state::releases::ReleaseQueue;
use crate::state::replica::{Replica, EVENT_BUFFER};

/// Starts a replica: the data-path pool, the lease session and its registration, the fencing
/// and the placement the database allows, and the incarnation's service. The router starts
/// the heartbeat and the handoff-request tasks on what this returns.
pub(crate) async fn start(mut options: RouterOptions) -> Result<(Arc<Replica>, LeaseSession)> {
    options.validate()?;
    crate::metrics::describe();
    options.connector.timeout = options.effective_connect_timeout();
    let pool = match &options.pool {
        Some(pool) => {
            crate::data_pool::check_given_pool(pool, options.read_only_data_sessions).await?;
            pool.clone()
        }
        None => crate::data_pool::default_pool(&options)?,
    };
    let (notices, _) = broadcast::channel(EVENT_BUFFER);
    let session = LeaseSession::open(&options, notices.clone()).await?;
    // After the lease session: it checked that the control plane is this library's.
    let fencing = crate::protocol::session_fencing::decide(&options, &pool).await?;
    if fencing.0 == Mode::Session {
        session.declare_session_fencing().await?;
    }
    let citus = {
        let client = pool
            .get()
            .await
            .map_err(pool_error("look for the citus extension"))?;
        db::citus::present(&**client).await?
    };
    let placement = Placement::decide(&options, citus)?;
    let (releases, requests) = ReleaseQueue::new();
    crate::protocol::release::start_batcher(pool.clone(), requests);
    let mut shared = Replica::new(options, pool, notices, releases, fencing);
    shared.placement = placement;
    let shared = Arc::new(shared);
    begin_incarnation(&shared, &session);
    Ok((shared, session))
}

/// A registered lease session.
pub(crate) struct LeaseSession {
    pub(crate) client: Client,
    /// Fires when the connection ends (terminated, network gone, server restart).
    pub(crate) ended: oneshot::Receiver<()>,
    pub(crate) credentials: Credentials,
    /// When the registration statement was sent: the local deadline counts from here.
    pub(crate) registered_at: Instant,
}

impl LeaseSession {
    /// Connects, takes the replica's liveness lock and registers a new incarnation.
    /// NOTIFYs on `pgtenant_free`, `pgtenant_handoff` and `pgtenant_reserved` are forwarded to `notices`: the lease
    /// session is never pooled, so it can LISTEN without leaking session state.
    pub(crate) async fn open(
        options: &RouterOptions,
        notices: broadcast::Sender<Notice>,
    ) -> Result<LeaseSession> {
        let mut config = options.config.clone();
        options.tcp_bounds().client(&mut config);
        config.application_name(format!("pgtenant lease {}", options.replica_id));
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
                return Err(Error::connect_timeout(
                    format!(
                        "register replica {} on its lease session ({})",
                        options.replica_id,
                        crate::connect::target(&host)
                    ),
                    bound,
                ))
            }
        };
        Ok(LeaseSession {
            client,
            ended,
            credentials: Credentials::new(
                options.replica_id.clone(),
                incarnation,
                {
                    static NEXT: AtomicU64 = AtomicU64::new(1);
                    NEXT.fetch_add(1, Ordering::Relaxed)
                },
                secret,
            ),
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
        db::replicas::declare_session_fencing(
            &self.client,
            &credentials.replica,
            credentials.incarnation,
            credentials.secret(),
        )
        .await
    }

    /// Ends the incarnation (`pgtenant.deregister`: marked released so no one waits for its
    /// expiry, every lease it still holds released) and frees the liveness lock before
    /// returning (a dropped connection frees it too, but only once the server has processed
    /// the disconnect), then ends the session.
    pub(crate) async fn deregister(self) {
        let credentials = &self.credentials;
        let result = db::replicas::deregister(
            &self.client,
            &credentials.replica,
            credentials.incarnation,
            credentials.secret(),
        )
        .await;
        if let Err(error) = result {
            tracing::warn!(%error, "deregistration failed; the lock goes with the session anyway");
        }
        db::replicas::advisory_unlock_all(&self.client).await;
    }
}

/// Configures a fresh lease session, probes it for a pooler, checks the control plane, takes
/// the liveness lock and registers a new incarnation: (incarnation, when registration began).
/// `host` is the one host the session reached.
async fn register(
    client: &Client,
    host: &tokio_postgres::Config,
    options: &RouterOptions,
) -> Result<(Incarnation, String, Instant)> {
    // The server's end of the TCP bounds too (DESIGN G9), so the server drops a vanished or
    // partitioned client's session, and its liveness lock, within the bound whatever is in
    // flight to it. Keepalives alone are not enough: they are suspended while data waits for
    // an acknowledgement, and with a NOTIFY pending (this session LISTENs) the session lived
    // until `tcp_retries2` gave up, ~950 s, refusing a respawn of the replica id all along.
    // Session SETs are fine here: this connection is never pooled.
    let bounds: String = options
        .tcp_bounds()
        .server_settings()
        .iter()
        .map(|(setting, value)| format!("SET {setting} = {value}; "))
        .collect();
    client
        .batch_execute(&format!(
            "{bounds}SET idle_session_timeout = 0; SET idle_in_transaction_session_timeout = 0;
             SET statement_timeout = 0; SET default_transaction_read_only = off;
             LISTEN {FREE_CHANNEL}; LISTEN {HANDOFF_CHANNEL}; LISTEN {RESERVED_CHANNEL}"
        ))
        .await
        .map_err(Error::db("configure the lease session"))?;

    // Before the control plane is read: behind a transaction pooler the check below could
    // fail on a prepared statement the pooler lost, hiding the real cause.
    probe_for_pooler(client, host, &options.connector).await?;
    crate::control_plane::ensure_current(client).await?;
    let lock_key = db::replicas::replica_lock_key(client, &options.replica_id).await?;
    if !db::replicas::try_liveness_lock(client, lock_key).await? {
        return Err(in_use(client, options.replica_id.as_str(), lock_key).await);
    }
    let registered_at = Instant::now();
    let host = options
        .host
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok());
    let (incarnation, secret) = db::replicas::register(
        client,
        &options.replica_id,
        millis(options.ttl),
        host.as_deref(),
        options.address.as_deref(),
        options.placement_weight,
    )
    .await?;
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
    let verdict = crate::connect::owns_its_backend(lease, &mut probe, CONTEXT).await;
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

async fn in_use(client: &Client, replica_id: &str, lock_key: i32) -> Error {
    match db::replicas::liveness_lock_holder(client, replica_id, lock_key).await {
        Ok(Some(holder)) => Error::ReplicaIdInUse {
            replica_id: ReplicaId::unchecked(replica_id),
            holder_pid: holder.pid,
            since: holder.since,
            host: holder.host,
        },
        Ok(None) => Error::ReplicaIdInUse {
            replica_id: ReplicaId::unchecked(replica_id),
            holder_pid: 0,
            since: None,
            host: None,
        },
        Err(error) => error,
    }
}

/// Starts serving an incarnation just registered.
pub(crate) fn begin_incarnation(shared: &Replica, session: &LeaseSession) {
    let options = &shared.options;
    let incarnation = session.incarnation();
    // How the previous incarnation ended no longer explains anything.
    *crate::sync::lock(&shared.down_reason) = None;
    shared.liveness.begin(
        session.credentials.clone(),
        session.registered_at + options.ttl - options.effective_margin(),
    );
    info!(%incarnation, "registered");
    shared.emit(Event::Registered {
        replica: options.replica_id.clone(),
        incarnation,
        address: options.address.clone(),
    });
}
