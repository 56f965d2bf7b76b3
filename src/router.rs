//! The router: one per replica process. Registers the replica, keeps its heartbeat, acquires
//! tenant leases and hands out [`TenantHandle`]s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tracing::{info, instrument, warn, Instrument};

use crate::acquire::{after_failed_migration, migrate_existing};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::handle::{HandleInner, TenantHandle};
use crate::id::TenantId;
use crate::liveness::{
    heartbeat, millis, LeaseSession, Liveness, Notice, FREE_CHANNEL, HANDOFF_CHANNEL,
};
use crate::options::RouterOptions;
use crate::options::{validate_replica_id, HandoffPolicy};
use crate::release::ReleaseQueue;

/// Events buffered per subscriber before it starts missing them.
const EVENT_BUFFER: usize = 1024;

/// A replica's entry point to its tenants.
///
/// ```no_run
/// # async fn example() -> pgtenant::Result<()> {
/// use pgtenant::{Router, RouterOptions, TenantId};
///
/// let router = Router::start(RouterOptions::from_url("replica-a", "postgres://postgres@127.0.0.1/app")?).await?;
/// let tenant = router.open_or_create(&TenantId::new("acme", "invoices")?).await?;
/// tenant
///     .run(|tx| Box::pin(async move {
///         tx.batch_execute("CREATE TABLE IF NOT EXISTS entries (amount bigint)").await?;
///         tx.execute("INSERT INTO entries VALUES ($1)", &[&42_i64]).await?;
///         Ok::<_, pgtenant::Error>(())
///     }))
///     .await?;
/// router.close().await;
/// # Ok(()) }
/// ```
pub struct Router {
    shared: Arc<Shared>,
    maintenance: Mutex<Option<JoinHandle<()>>>,
    shutdown: watch::Sender<bool>,
}

pub(crate) struct Shared {
    pub(crate) options: RouterOptions,
    pub(crate) pool: Pool,
    pub(crate) liveness: Liveness,
    /// `idle_in_transaction_session_timeout` for fenced transactions: one ttl, as text.
    pub(crate) idle_timeout_ms: String,
    events: broadcast::Sender<Event>,
    notices: broadcast::Sender<Notice>,
    /// Tenants served or draining here.
    pub(crate) handles: Mutex<HashMap<String, Arc<HandleInner>>>,
    /// Releases of this router's leases, batched.
    pub(crate) releases: ReleaseQueue,
    /// Tenants being acquired, one gate per tenant so concurrent opens share one acquisition.
    opening: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Acquisition tasks running (they outlive an open that timed out); close() waits for them
    /// so that no acquisition commits after the replica deregistered.
    acquiring: std::sync::atomic::AtomicUsize,
    acquired: tokio::sync::Notify,
    closed: AtomicBool,
    /// Why the last re-registration failed, while the replica is not registered.
    registration: Mutex<Option<RegistrationFailure>>,
}

struct RegistrationFailure {
    message: String,
    /// Set when only someone's action ends it: returned by opens instead of `ReplicaDown`.
    lasting: Option<Error>,
}

/// What [`Router::migrate_all`] did for one tenant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MigrationOutcome {
    /// Brought from one version to the code's.
    Migrated {
        /// Version before.
        from: i64,
        /// Version after.
        to: i64,
    },
    /// Up to date by the time it was reached.
    UpToDate,
    /// Held by another live replica: not migrated behind its owner's back (it migrates the
    /// tenant itself at its next open once it runs this code).
    HeldElsewhere {
        /// The owner.
        owner: String,
    },
    /// A migration failed: the tenant is quarantined.
    Quarantined {
        /// The failing migration and the database's message.
        cause: String,
    },
    /// Something else went wrong (the database, a lease lost): retry later.
    Failed {
        /// What.
        error: String,
    },
}

/// One tenant's result in [`Router::migrate_all`], also passed to its progress callback.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct TenantMigration {
    /// The tenant key.
    pub tenant: String,
    /// What happened.
    pub outcome: MigrationOutcome,
    /// Tenants finished so far, this one included.
    pub done: usize,
    /// Tenants to do in this run.
    pub total: usize,
}

/// What [`Router::close`] did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CloseReport {
    /// Tenants handed off.
    pub handed_off: Vec<TenantId>,
    /// Tenants whose forget was under way when close began: waited for (up to the drain
    /// timeout) and forgotten.
    pub forgotten: Vec<TenantId>,
    /// Tenants whose handoff failed, with why (a drain timeout, a lost lease, the database).
    /// Their leases ended with the replica's liveness lock all the same.
    pub failed: Vec<(TenantId, Error)>,
}

/// A tenant as the control plane and this replica see it, for status endpoints.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct TenantStatus {
    /// The tenant key.
    pub tenant: String,
    /// `held`, `stalled`, `expired`, `free`, `reserved`, `quarantined`, `forgotten`, or
    /// `absent` when the control plane has never seen it.
    pub state: String,
    /// The owner replica.
    pub owner: Option<String>,
    /// The current epoch.
    pub epoch: i64,
    /// Whether the owner is alive.
    pub owner_alive: Option<bool>,
    /// Milliseconds left on the owner's heartbeat.
    pub expires_in_ms: Option<i64>,
    /// The live schema.
    pub schema: Option<String>,
    /// The tenant's migration version.
    pub version: i32,
    /// Why it is quarantined.
    pub quarantine_cause: Option<String>,
    /// What to do about it.
    pub quarantine_repair: Option<String>,
    /// This replica's view: `serving` or `draining` when it holds the tenant.
    pub here: Option<&'static str>,
    /// Work in flight here.
    pub in_flight: usize,
}

/// This replica at a glance, from memory only (no database call): for health endpoints.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// The replica id.
    pub replica_id: String,
    /// The current incarnation; None while re-registering.
    pub incarnation: Option<i64>,
    /// Whether handles accept work now (registered and within the local deadline).
    pub serving: bool,
    /// Tenants served.
    pub open: usize,
    /// Tenants being handed off.
    pub draining: usize,
    /// Tenants being acquired.
    pub opening: usize,
    /// Work in flight over all tenants.
    pub in_flight: usize,
    /// Whether close() was called.
    pub closed: bool,
    /// While not registered: why the last attempt to register again failed.
    pub registration_error: Option<String>,
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it: the maps it guards
/// are consistent after every single operation.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    /// `ReplicaDown` says "registering again"; when only someone's action will end that (a
    /// newer control plane, say), the cause itself is the truer answer.
    fn explain_down(&self, error: Error) -> Error {
        if !matches!(error, Error::ReplicaDown { .. }) {
            return error;
        }
        lock(&self.registration)
            .as_ref()
            .and_then(|failure| failure.lasting.as_ref())
            .and_then(Error::lasting_copy)
            .unwrap_or(error)
    }

    pub(crate) fn emit(&self, event: Event) {
        // No subscriber is not an error, and a slow one lags instead of blocking us.
        let _ = self.events.send(event);
    }

    /// Forgets a handle that ended; only the exact handle, not a newer one for the same tenant.
    pub(crate) fn detach(&self, handle: &Arc<HandleInner>) {
        let mut handles = lock(&self.handles);
        if handles
            .get(handle.id.key())
            .is_some_and(|current| Arc::ptr_eq(current, handle))
        {
            handles.remove(handle.id.key());
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Refuses a handoff target that is not a registered, live replica, before anything
    /// changes: a reservation for it would keep the tenant from everyone for the window.
    pub(crate) async fn ensure_live_replica(&self, replica: &str) -> Result<()> {
        let client = self
            .pool
            .get()
            .await
            .map_err(pool_error("check a handoff target"))?;
        let alive: Option<bool> = client
            .query_typed_opt(
                "SELECT alive FROM pgtenant.replica_liveness WHERE replica_id = $1",
                &[(&replica, Type::TEXT)],
            )
            .await
            .and_then(|row| row.map(|row| row.try_get(0)).transpose())
            .map_err(Error::db(format!("check handoff target {replica}")))?;
        match alive {
            Some(true) => Ok(()),
            Some(false) => Err(Error::NoSuchReplica {
                replica_id: replica.to_owned(),
                message: format!("replica {replica} is registered but not alive"),
            }),
            None => Err(Error::NoSuchReplica {
                replica_id: replica.to_owned(),
                message: format!("no replica {replica} has ever registered with this database"),
            }),
        }
    }

    /// Waits until no acquisition task runs, or `timeout`.
    async fn acquisitions_done(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, async {
            loop {
                let done = self.acquired.notified();
                if self.acquiring.load(Ordering::Acquire) == 0 {
                    return;
                }
                done.await;
            }
        })
        .await;
    }

    /// Every lease of the current incarnation is gone for good.
    fn lose_incarnation(&self, reason: &str) {
        self.liveness.end();
        let lost: Vec<Arc<HandleInner>> = lock(&self.handles).drain().map(|(_, h)| h).collect();
        for handle in lost {
            handle.mark_lost(self, reason);
        }
    }
}

impl Router {
    /// Validates the options, checks the control plane, registers the replica (taking its
    /// liveness lock on a dedicated lease session) and starts its heartbeat.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] before any connection; [`Error::ControlPlaneOutdated`] or
    /// [`Error::ControlPlaneTooNew`]; [`Error::ReplicaIdInUse`] when a live process already runs
    /// this replica id; [`Error::NotASession`] behind a transaction-mode pooler.
    #[instrument(skip_all, fields(replica = %options.replica_id))]
    pub async fn start(mut options: RouterOptions) -> Result<Router> {
        options.validate()?;
        options.connector.timeout = options.effective_connect_timeout();
        let pool = match &options.pool {
            Some(pool) => {
                if options.read_only_data_sessions {
                    check_read_only(pool).await?;
                }
                pool.clone()
            }
            None => crate::connect::default_pool(&options)?,
        };
        let (notices, _) = broadcast::channel(EVENT_BUFFER);
        let session = LeaseSession::open(&options, notices.clone()).await?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let releases = ReleaseQueue::start(pool.clone());
        let shared = Arc::new(Shared {
            idle_timeout_ms: millis(options.ttl).to_string(),
            options,
            pool,
            liveness: Liveness::new(),
            events,
            notices,
            handles: Mutex::new(HashMap::new()),
            releases,
            opening: Mutex::new(HashMap::new()),
            acquiring: std::sync::atomic::AtomicUsize::new(0),
            acquired: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            registration: Mutex::new(None),
        });
        begin_incarnation(&shared, &session);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let span = tracing::info_span!("pgtenant.heartbeat", replica = %shared.options.replica_id);
        tokio::spawn(serve_handoff_requests(
            Arc::downgrade(&shared),
            shared.notices.subscribe(),
        ));
        let maintenance =
            tokio::spawn(maintain(shared.clone(), session, shutdown_rx).instrument(span));
        Ok(Router {
            shared,
            maintenance: Mutex::new(Some(maintenance)),
            shutdown,
        })
    }

    /// This replica's id.
    pub fn replica_id(&self) -> &str {
        &self.shared.options.replica_id
    }

    /// The current incarnation, or None while the replica is re-registering.
    pub fn incarnation(&self) -> Option<i64> {
        Some(self.shared.liveness.incarnation()).filter(|i| *i > 0)
    }

    /// Events from now on. A subscriber that falls more than 1024 events behind misses the
    /// oldest (it receives `RecvError::Lagged`); it never slows the router.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// The data-path pool (for work outside any tenant; never for session state).
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The open handle of a tenant this replica serves, if any.
    pub fn handle_of(&self, id: &TenantId) -> Option<TenantHandle> {
        lock(&self.shared.handles)
            .get(id.key())
            .filter(|h| h.is_serving())
            .map(|h| TenantHandle::from_inner(h.clone()))
    }

    /// How many tenants this replica serves.
    pub fn open_count(&self) -> usize {
        lock(&self.shared.handles)
            .values()
            .filter(|h| h.is_serving())
            .count()
    }

    /// Opens an existing tenant: acquires its lease (bumping the epoch) unless this replica
    /// already serves it. Concurrent opens of one tenant share one acquisition; the whole open
    /// is bounded by the open timeout, and a lease acquired after it is released.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] when another live replica owns it, [`Error::TenantNotFound`],
    /// [`Error::Quarantined`], [`Error::Draining`], [`Error::AtCapacity`],
    /// [`Error::OpenTimeout`], [`Error::ReplicaDown`], [`Error::RouterClosed`]; database errors
    /// ([`Error::is_retryable`] tells an unavailable database).
    pub async fn open(&self, id: &TenantId) -> Result<TenantHandle> {
        let opened = self.acquire(id, false).await;
        opened.map_err(|error| self.shared.explain_down(error))
    }

    /// Like [`Router::open`], creating the tenant (its row and its schema, atomically) when it
    /// does not exist or was forgotten.
    pub async fn open_or_create(&self, id: &TenantId) -> Result<TenantHandle> {
        let opened = self.acquire(id, true).await;
        opened.map_err(|error| self.shared.explain_down(error))
    }

    /// Serving here already, draining here, or None.
    fn local(&self, id: &TenantId) -> Option<Result<TenantHandle>> {
        let handles = lock(&self.shared.handles);
        let inner = handles.get(id.key())?;
        if inner.is_serving() {
            Some(Ok(TenantHandle::from_inner(inner.clone())))
        } else if inner.is_draining() {
            Some(Err(Error::Draining {
                tenant: id.key().to_owned(),
            }))
        } else {
            None
        }
    }

    #[instrument(skip_all, fields(tenant = %id))]
    async fn acquire(&self, id: &TenantId, create: bool) -> Result<TenantHandle> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Err(Error::RouterClosed);
        }
        if let Some(found) = self.local(id) {
            return found;
        }
        let gate = {
            let mut opening = lock(&shared.opening);
            match opening.get(id.key()) {
                Some(gate) => gate.clone(),
                None => {
                    let max = shared.options.max_open_tenants;
                    if lock(&shared.handles).len() + opening.len() >= max {
                        return Err(Error::AtCapacity { max });
                    }
                    opening.entry(id.key().to_owned()).or_default().clone()
                }
            }
        };
        let turn = gate.lock().await;
        let result = match self.local(id) {
            Some(found) => found,
            None => self.acquire_bounded(id, create).await,
        };
        drop(turn);
        {
            let mut opening = lock(&shared.opening);
            // The last one through removes the gate; a waiter still holds a clone otherwise.
            if Arc::strong_count(&gate) <= 2 {
                opening.remove(id.key());
            }
        }
        result
    }

    /// Runs the acquisition in its own task so that a timeout (or a caller that stops
    /// waiting) cannot strand a lease: a late success finds nobody to take it and releases it.
    async fn acquire_bounded(&self, id: &TenantId, create: bool) -> Result<TenantHandle> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (shared, task_id) = (self.shared.clone(), id.clone());
        let running = Acquisition::begin(&shared);
        tokio::spawn(
            async move {
                let _running = running;
                let result = crate::acquire::acquire_now(&shared, &task_id, create).await;
                if let Err(Ok(late)) = tx.send(result) {
                    info!("open gave up before the lease arrived: releasing it");
                    let _ = late.abandon().await;
                }
            }
            .in_current_span(),
        );
        let timeout = self.shared.options.open_timeout;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            // The task ended without answering: it panicked.
            Ok(Err(_)) => Err(Error::OpenTimeout {
                tenant: id.key().to_owned(),
                timeout,
            }),
            Err(_) => Err(Error::OpenTimeout {
                tenant: id.key().to_owned(),
                timeout,
            }),
        }
    }

    /// Waits until the tenant is free, then opens it (an existing tenant, like
    /// [`Router::open`]). Wakes on the release's NOTIFY or, for an owner that died or stalled
    /// without releasing, at its expiry; retries an unavailable database with backoff (1 s
    /// doubling to 30 s). Gives up with [`Error::OpenTimeout`] after `timeout`; a timeout
    /// beyond any representable instant (`Duration::MAX`) waits without a deadline.
    pub async fn wait_for(&self, id: &TenantId, timeout: Duration) -> Result<TenantHandle> {
        // Pauses between attempts are short (ttl, backoff); the cap keeps `now + pause` finite.
        const LONGEST_PAUSE: Duration = Duration::from_secs(3600);
        let deadline = Instant::now().checked_add(timeout);
        let mut notices = self.shared.notices.subscribe();
        let (first, max) = self.shared.options.reconnect_backoff;
        let mut backoff = first;
        loop {
            let pause = match self.open(id).await {
                Ok(handle) => return Ok(handle),
                Err(Error::LeaseHeld { expires_in, .. }) => {
                    expires_in.unwrap_or(self.shared.options.ttl) + Duration::from_millis(5)
                }
                Err(error) if error.is_retryable() => {
                    let pause = backoff;
                    backoff = backoff.saturating_mul(2).min(max);
                    pause
                }
                Err(error) => return Err(error),
            };
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(Error::OpenTimeout {
                    tenant: id.key().to_owned(),
                    timeout,
                });
            }
            let wake = now + pause.min(LONGEST_PAUSE);
            let wake = deadline.map_or(wake, |deadline| wake.min(deadline));
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(wake.into()) => break,
                    notice = notices.recv() => match notice {
                        Ok(n) if n.channel == FREE_CHANNEL && n.payload == id.key() => break,
                        Ok(_) => continue,
                        // Missed some: the one we wait for may be among them.
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                }
            }
        }
    }

    /// Asks the tenant's owner to hand it over to this replica (the owner decides by its
    /// [`HandoffPolicy`]; the default hands over at once, after draining) and waits for it
    /// like [`Router::wait_for`] (`Duration::MAX`: without a deadline).
    pub async fn request_handoff(&self, id: &TenantId, timeout: Duration) -> Result<TenantHandle> {
        if let Some(found) = self.local(id) {
            return found;
        }
        let client = self
            .shared
            .pool
            .get()
            .await
            .map_err(pool_error("request a handoff"))?;
        let payload = serde_json::json!({
            "tenant": id.key(),
            "requester": self.shared.options.replica_id,
        })
        .to_string();
        client
            .execute("SELECT pg_notify($1, $2)", &[&HANDOFF_CHANNEL, &payload])
            .await
            .map_err(Error::db(format!("request a handoff of tenant {id}")))?;
        drop(client);
        self.wait_for(id, timeout).await
    }

    /// Restores a forgotten tenant from the trash as a new life (its epoch bumps, its schema
    /// gets the new life's name) and opens it here. Behind on migrations, it is upgraded like
    /// any open.
    ///
    /// # Errors
    /// [`Error::RestoreRefused`] when the id already has a new life or nothing is left in the
    /// trash (swept); [`Error::LeaseHeld`]; database errors.
    #[instrument(skip_all, fields(tenant = %id))]
    pub async fn restore(&self, id: &TenantId) -> Result<TenantHandle> {
        if self.shared.is_closed() {
            return Err(Error::RouterClosed);
        }
        let restored = crate::forget::restore(&self.shared, id).await;
        restored.map_err(|error| self.shared.explain_down(error))
    }

    /// One tenant as the control plane sees it, with this replica's own view.
    pub async fn status(&self, id: &TenantId) -> Result<TenantStatus> {
        let client = self
            .shared
            .pool
            .get()
            .await
            .map_err(pool_error("read a tenant's status"))?;
        let row = client
            .query_opt(
                "SELECT state, owner, epoch, owner_alive,
                        (extract(epoch FROM expires_in) * 1000)::bigint, schema, version,
                        quarantine_cause, quarantine_repair
                   FROM pgtenant.lease_status WHERE tenant = $1",
                &[&id.key()],
            )
            .await
            .map_err(Error::db(format!("read the status of tenant {id}")))?;
        let local = lock(&self.shared.handles).get(id.key()).cloned();
        let here = local.as_ref().and_then(|h| {
            if h.is_serving() {
                Some("serving")
            } else if h.is_draining() {
                Some("draining")
            } else {
                None
            }
        });
        let in_flight = local.map(|h| h.in_flight()).unwrap_or(0);
        Ok(match row {
            Some(row) => TenantStatus {
                tenant: id.key().to_owned(),
                state: row.get(0),
                owner: row.get(1),
                epoch: row.get(2),
                owner_alive: row.get(3),
                expires_in_ms: row.get(4),
                schema: row.get(5),
                version: row.get(6),
                quarantine_cause: row.get(7),
                quarantine_repair: row.get(8),
                here,
                in_flight,
            },
            None => TenantStatus {
                tenant: id.key().to_owned(),
                state: "absent".to_owned(),
                owner: None,
                epoch: 0,
                owner_alive: None,
                expires_in_ms: None,
                schema: None,
                version: 0,
                quarantine_cause: None,
                quarantine_repair: None,
                here,
                in_flight,
            },
        })
    }

    /// Brings every tenant behind on migrations up to this code's version, `concurrency` at a
    /// time, calling `progress` after each. The tenants are chosen with one query (live, not
    /// quarantined, version below the code's). A tenant this replica serves is migrated under
    /// its lease; a free one is opened (which migrates it) and released; one held by another
    /// live replica is reported, never migrated behind its owner's back.
    pub async fn migrate_all(
        &self,
        concurrency: usize,
        progress: impl Fn(&TenantMigration),
    ) -> Result<Vec<TenantMigration>> {
        if !(1..=1024).contains(&concurrency) {
            return Err(Error::InvalidOption {
                option: "concurrency",
                reason: format!("{concurrency} is outside 1..=1024"),
            });
        }
        let code = self.shared.options.code_version();
        let code32 = i32::try_from(code).unwrap_or(i32::MAX);
        let behind: Vec<(String, i64)> = {
            let client = self
                .shared
                .pool
                .get()
                .await
                .map_err(pool_error("list tenants behind"))?;
            client
                .query(
                    "SELECT key, schema_version FROM pgtenant.tenants
                      WHERE schema_name IS NOT NULL AND quarantine_cause IS NULL AND schema_version < $1
                      ORDER BY key",
                    &[&code32],
                )
                .await
                .map_err(Error::db("list tenants behind on migrations"))?
                .iter()
                .map(|row| (row.get(0), i64::from(row.get::<_, i32>(1))))
                .collect()
        };
        let total = behind.len();
        let queue = Mutex::new(behind.into_iter());
        let results = Mutex::new(Vec::with_capacity(total));
        let lane = || async {
            loop {
                let next = lock(&queue).next();
                let Some((key, from)) = next else { return };
                let outcome = match TenantId::parse(&key) {
                    Ok(id) => self.migrate_one(&id, from, code).await,
                    Err(error) => MigrationOutcome::Failed {
                        error: error.to_string(),
                    },
                };
                let mut results = lock(&results);
                let entry = TenantMigration {
                    tenant: key,
                    outcome,
                    done: results.len() + 1,
                    total,
                };
                progress(&entry);
                results.push(entry);
            }
        };
        futures_join_all((0..concurrency).map(|_| lane())).await;
        Ok(results
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    async fn migrate_one(&self, id: &TenantId, from: i64, code: i64) -> MigrationOutcome {
        let failed = |error: Error| match error {
            Error::Quarantined { cause, .. } => MigrationOutcome::Quarantined { cause },
            Error::LeaseHeld { owner, .. } => MigrationOutcome::HeldElsewhere { owner },
            other => MigrationOutcome::Failed {
                error: other.to_string(),
            },
        };
        let served = lock(&self.shared.handles)
            .get(id.key())
            .filter(|h| h.is_serving())
            .cloned();
        if let Some(inner) = served {
            let shared = &self.shared;
            let mut client = match shared.pool.get().await {
                Ok(client) => client,
                Err(error) => return failed(pool_error("migrate a tenant")(error)),
            };
            let lease = (inner.epoch, inner.lock_key);
            let credentials = &inner.credentials;
            let migrated =
                migrate_existing(shared, &mut client, id, lease, credentials, inner.schema()).await;
            return match migrated {
                Ok(()) => MigrationOutcome::Migrated { from, to: code },
                Err(error) => failed(
                    after_failed_migration(
                        shared,
                        &client,
                        id,
                        Some(inner.epoch),
                        credentials,
                        error,
                    )
                    .await,
                ),
            };
        }
        match self.open(id).await {
            Ok(handle) => {
                // Another replica may have migrated it since the list was read.
                let outcome = match handle.inner().migrated_from {
                    Some(from) => MigrationOutcome::Migrated { from, to: code },
                    None => MigrationOutcome::UpToDate,
                };
                let _ = handle.release().await;
                outcome
            }
            Err(error) => failed(error),
        }
    }

    /// This replica at a glance, from memory (no database call).
    pub fn summary(&self) -> Summary {
        let shared = &self.shared;
        let handles = lock(&shared.handles);
        let incarnation = self.incarnation();
        Summary {
            replica_id: shared.options.replica_id.clone(),
            incarnation,
            serving: incarnation.is_some() && shared.liveness.within_deadline(),
            open: handles.values().filter(|h| h.is_serving()).count(),
            draining: handles.values().filter(|h| h.is_draining()).count(),
            opening: lock(&shared.opening).len(),
            in_flight: handles.values().map(|h| h.in_flight()).sum(),
            closed: shared.closed.load(Ordering::Acquire),
            registration_error: lock(&shared.registration)
                .as_ref()
                .map(|failure| failure.message.clone()),
        }
    }

    /// Refuses new opens, hands off every tenant `close_concurrency` at a time (a stuck tenant
    /// holds one lane for at most the drain timeout), then deregisters the replica and ends its
    /// lease session, which frees its liveness lock. Idempotent: a second call reports nothing.
    ///
    /// The releases of tenants that finish draining together share a transaction, so closing
    /// a replica that holds thousands of idle tenants takes about a second (BENCHMARKS.md),
    /// not one notifying commit per tenant.
    pub async fn close(&self) -> CloseReport {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return CloseReport::default();
        }
        // An acquisition in flight either fails or installs its handle, sees the router closed
        // and gives the lease back: wait for them all before handing off and deregistering.
        let options = &self.shared.options;
        self.shared
            .acquisitions_done(options.open_timeout.saturating_add(options.drain_timeout))
            .await;
        let queue: Vec<Arc<HandleInner>> = lock(&self.shared.handles).values().cloned().collect();
        let queue = Mutex::new(queue.into_iter());
        let report = Mutex::new(CloseReport::default());
        let lanes = self.shared.options.close_concurrency;
        let lane = || async {
            loop {
                let next = lock(&queue).next();
                let Some(inner) = next else { return };
                let id = inner.id.clone();
                match TenantHandle::from_inner(inner.clone()).handoff().await {
                    Ok(()) => lock(&report).handed_off.push(id),
                    // A forget (or another handoff) is under way: wait for it to finish.
                    Err(Error::Draining { .. })
                        if inner.wait_ended(self.shared.options.drain_timeout).await =>
                    {
                        let mut report = lock(&report);
                        if inner.is_forgotten() {
                            report.forgotten.push(id);
                        } else {
                            report.handed_off.push(id);
                        }
                    }
                    Err(error) => {
                        warn!(tenant = %id, %error, "handoff on close failed");
                        lock(&report).failed.push((id, error));
                    }
                }
            }
        };
        futures_join_all((0..lanes).map(|_| lane())).await;
        let _ = self.shutdown.send(true);
        let task = lock(&self.maintenance).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        report
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One acquisition task running, counted until it ends (even by a panic).
struct Acquisition(Arc<Shared>);

impl Acquisition {
    fn begin(shared: &Arc<Shared>) -> Acquisition {
        shared.acquiring.fetch_add(1, Ordering::AcqRel);
        Acquisition(shared.clone())
    }
}

impl Drop for Acquisition {
    fn drop(&mut self) {
        if self.0.acquiring.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.acquired.notify_waiters();
        }
    }
}

/// Runs futures concurrently on this task and waits for all (no extra dependency for it).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// Answers other replicas' handoff requests for tenants served here, by policy. Holds only a
/// weak reference so it ends with the router.
async fn serve_handoff_requests(
    shared: std::sync::Weak<Shared>,
    mut notices: broadcast::Receiver<Notice>,
) {
    #[derive(serde::Deserialize)]
    struct Request {
        tenant: String,
        requester: String,
    }
    loop {
        let notice = match notices.recv().await {
            Ok(notice) => notice,
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if notice.channel != HANDOFF_CHANNEL {
            continue;
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Ok(request) = serde_json::from_str::<Request>(&notice.payload) else {
            continue;
        };
        if validate_replica_id("requester", &request.requester).is_err() {
            continue;
        }
        let Some(inner) = lock(&shared.handles)
            .get(&request.tenant)
            .filter(|h| h.is_serving())
            .cloned()
        else {
            continue;
        };
        let accepted = shared.options.handoff_policy == HandoffPolicy::Accept;
        shared.emit(Event::HandoffRequested {
            tenant: request.tenant.clone(),
            requester: request.requester.clone(),
            accepted,
        });
        if accepted {
            tokio::spawn(async move {
                let handle = TenantHandle::from_inner(inner);
                if let Err(error) = handle.handoff_to(&request.requester).await {
                    warn!(tenant = %request.tenant, %error, "requested handoff failed");
                }
            });
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        // Without close(): the lease session ends with its task, which frees the liveness lock,
        // so other replicas take the tenants over at once.
        if let Some(task) = lock(&self.maintenance).take() {
            task.abort();
        }
    }
}

/// A pool the application built must give read-only-by-default sessions (G6), from the
/// connection's startup options or the role's or database's defaults, since pgtenant resets
/// session settings between tenants.
async fn check_read_only(pool: &Pool) -> Result<()> {
    let client = pool
        .get()
        .await
        .map_err(pool_error("check the data-path pool"))?;
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

pub(crate) fn pool_error(
    context: &'static str,
) -> impl FnOnce(deadpool_postgres::PoolError) -> Error {
    move |error| match error {
        deadpool_postgres::PoolError::Backend(source) => Error::Database {
            context: context.to_owned(),
            source,
        },
        deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Create) => {
            Error::Pool {
                context: context.to_owned(),
                reason: "the database did not finish a new connection (TCP, TLS, startup, \
                         authentication) within RouterOptions::connect_timeout"
                    .to_owned(),
            }
        }
        other => Error::Pool {
            context: context.to_owned(),
            reason: other.to_string(),
        },
    }
}

fn begin_incarnation(shared: &Shared, session: &LeaseSession) {
    let options = &shared.options;
    let incarnation = session.incarnation();
    shared.liveness.begin(
        session.credentials.clone(),
        session.registered_at + options.ttl - options.effective_margin(),
    );
    info!(incarnation, "registered");
    shared.emit(Event::Registered {
        replica: options.replica_id.clone(),
        incarnation,
    });
}

enum SessionEnd {
    Shutdown,
    Lost(&'static str),
}

/// The replica's background task: heartbeats, and re-registration when an incarnation ends.
async fn maintain(
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
                warn!(
                    reason,
                    incarnation = session.incarnation(),
                    "incarnation lost"
                );
                shared.lose_incarnation(reason);
            }
        }
        drop(session);
        let (first, max) = shared.options.reconnect_backoff;
        let mut delay = first;
        session = loop {
            if *shutdown.borrow() {
                return;
            }
            match LeaseSession::open(&shared.options, shared.notices.clone()).await {
                Ok(session) => break session,
                Err(error) => {
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
        }
        let started = Instant::now();
        next = started + period;
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(period, heartbeat(&session.client, &session.credentials, options)) => outcome,
            _ = &mut session.ended => return SessionEnd::Lost("lease session dropped"),
            _ = shutdown.changed() => return SessionEnd::Shutdown,
        };
        match outcome {
            Ok(Ok(Some(()))) => {
                last_success = started;
                let resumed = shared
                    .liveness
                    .renewed(started + options.ttl - options.effective_margin());
                if resumed {
                    info!(
                        incarnation = session.incarnation(),
                        "heartbeat resumed service"
                    );
                    shared.emit(Event::Resumed {
                        incarnation: session.incarnation(),
                    });
                }
                if options.renewal_events {
                    shared.emit(Event::Renewed {
                        incarnation: session.incarnation(),
                    });
                }
            }
            Ok(Ok(None)) => {
                return SessionEnd::Lost("heartbeat found the incarnation expired or replaced")
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
