//! The router: one per replica process. Registers the replica, keeps its heartbeat, acquires
//! tenant leases and hands out [`TenantHandle`]s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::NoTls;
use tracing::{info, instrument, warn, Instrument};

use crate::control_plane::ensure_current;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::handle::{HandleInner, TenantHandle};
use crate::id::TenantId;
use crate::liveness::{heartbeat, LeaseSession, Liveness};
use crate::options::RouterOptions;

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
/// router.close().await?;
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
    events: broadcast::Sender<Event>,
    handles: Mutex<HashMap<String, Arc<HandleInner>>>,
    opening: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    closed: AtomicBool,
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it: the maps it guards
/// are consistent after every single operation.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
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
    pub async fn start(options: RouterOptions) -> Result<Router> {
        options.validate()?;
        let pool = match &options.pool {
            Some(pool) => pool.clone(),
            None => build_pool(&options)?,
        };
        {
            let client = pool
                .get()
                .await
                .map_err(pool_error("check the control plane"))?;
            ensure_current(&client).await?;
        }
        let session = LeaseSession::open(&options).await?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let shared = Arc::new(Shared {
            options,
            pool,
            liveness: Liveness::new(),
            events,
            handles: Mutex::new(HashMap::new()),
            opening: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        });
        begin_incarnation(&shared, &session);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let span = tracing::info_span!("pgtenant.heartbeat", replica = %shared.options.replica_id);
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
    /// already serves it. Concurrent opens of one tenant share one acquisition.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] when another live replica owns it, [`Error::TenantNotFound`],
    /// [`Error::Quarantined`], [`Error::ReplicaDown`] (retryable), [`Error::RouterClosed`].
    pub async fn open(&self, id: &TenantId) -> Result<TenantHandle> {
        self.acquire(id, false).await
    }

    /// Like [`Router::open`], creating the tenant (its row and its schema, atomically) when it
    /// does not exist or was forgotten.
    pub async fn open_or_create(&self, id: &TenantId) -> Result<TenantHandle> {
        self.acquire(id, true).await
    }

    #[instrument(skip_all, fields(tenant = %id, epoch = tracing::field::Empty))]
    async fn acquire(&self, id: &TenantId, create: bool) -> Result<TenantHandle> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Err(Error::RouterClosed);
        }
        if let Some(handle) = self.handle_of(id) {
            return Ok(handle);
        }
        let gate = lock(&shared.opening)
            .entry(id.key().to_owned())
            .or_default()
            .clone();
        let _turn = gate.lock().await;
        let result = match self.handle_of(id) {
            Some(handle) => Ok(handle),
            None => self.acquire_now(id, create).await,
        };
        {
            let mut opening = lock(&shared.opening);
            // The last one through removes the gate; a waiter still holds a clone otherwise.
            if Arc::strong_count(&gate) <= 2 {
                opening.remove(id.key());
            }
        }
        result
    }

    async fn acquire_now(&self, id: &TenantId, create: bool) -> Result<TenantHandle> {
        let shared = &self.shared;
        let replica = &shared.options.replica_id;
        let incarnation = shared.liveness.incarnation();
        if incarnation == 0 {
            return Err(Error::ReplicaDown {
                replica_id: replica.clone(),
            });
        }
        let mut client = shared
            .pool
            .get()
            .await
            .map_err(pool_error("acquire a lease"))?;
        let row = client
            .query_typed_one(
                "SELECT epoch, schema_name, previous_owner, took_over FROM pgtenant.acquire($1, $2, $3, $4, $5, $6)",
                &[
                    (&id.key(), Type::TEXT),
                    (&id.organization(), Type::TEXT),
                    (&id.ledger(), Type::TEXT),
                    (replica, Type::TEXT),
                    (&incarnation, Type::INT8),
                    (&create, Type::BOOL),
                ],
            )
            .await
            .map_err(|e| acquire_error(id, replica, e))?;
        let epoch: i64 = row.get(0);
        let schema: Option<String> = row.get(1);
        let previous: Option<String> = row.get(2);
        let took_over: Option<String> = row.get(3);
        tracing::Span::current().record("epoch", epoch);
        let schema = match schema {
            Some(schema) => schema,
            None => {
                let schema = id.schema_name(epoch);
                if let Err(error) =
                    create_schema(&mut client, id, epoch, replica, incarnation, &schema).await
                {
                    let _ =
                        release_lease(&client, id, epoch, replica, incarnation, "released").await;
                    return Err(error);
                }
                shared.emit(Event::Created {
                    tenant: id.key().to_owned(),
                    epoch,
                    schema: schema.clone(),
                });
                schema
            }
        };
        drop(client);
        let inner = Arc::new(HandleInner::new(
            id.clone(),
            epoch,
            incarnation,
            schema,
            shared.clone(),
        ));
        lock(&shared.handles).insert(id.key().to_owned(), inner.clone());
        info!(epoch, took_over = ?took_over, "acquired");
        shared.emit(Event::Acquired {
            tenant: id.key().to_owned(),
            epoch,
            took_over_from: took_over.and(previous),
        });
        // Closed while acquiring: give it straight back rather than leak it.
        if shared.closed.load(Ordering::Acquire) {
            let handle = TenantHandle::from_inner(inner);
            let _ = handle.abandon().await;
            return Err(Error::RouterClosed);
        }
        Ok(TenantHandle::from_inner(inner))
    }

    /// Releases every tenant this replica serves (each after its in-flight work), then
    /// deregisters the replica and ends its lease session. Idempotent.
    pub async fn close(&self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Release);
        let handles: Vec<Arc<HandleInner>> = lock(&self.shared.handles).values().cloned().collect();
        for handle in handles {
            if let Err(error) = TenantHandle::from_inner(handle).release().await {
                warn!(%error, "release on close failed; the lease expires with the replica");
            }
        }
        let _ = self.shutdown.send(true);
        let task = lock(&self.maintenance).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        Ok(())
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

fn build_pool(options: &RouterOptions) -> Result<Pool> {
    let manager = Manager::from_config(
        options.config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(options.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .map_err(|e| Error::InvalidOption {
            option: "pool_size",
            reason: e.to_string(),
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
        other => Error::Pool {
            context: context.to_owned(),
            reason: other.to_string(),
        },
    }
}

#[derive(serde::Deserialize)]
struct HeldDetail {
    owner: String,
    epoch: i64,
    owner_alive: bool,
    expires_in_ms: Option<u64>,
    reserved: bool,
}

fn acquire_error(id: &TenantId, replica: &str, error: tokio_postgres::Error) -> Error {
    let Some(db) = error.as_db_error() else {
        return Error::db(format!("acquire tenant {id}"))(error);
    };
    match db.code().code() {
        "PTL01" => match db
            .detail()
            .and_then(|d| serde_json::from_str::<HeldDetail>(d).ok())
        {
            Some(held) => Error::LeaseHeld {
                tenant: id.key().to_owned(),
                owner: held.owner,
                epoch: held.epoch,
                owner_alive: held.owner_alive,
                expires_in: held.expires_in_ms.map(Duration::from_millis),
                reserved: held.reserved,
            },
            None => Error::db(format!("acquire tenant {id}"))(error),
        },
        "PTL02" => Error::ReplicaDown {
            replica_id: replica.to_owned(),
        },
        "PTN01" => Error::TenantNotFound {
            tenant: id.key().to_owned(),
            message: db.message().to_owned(),
        },
        "PTQ01" => {
            let detail: serde_json::Value = db
                .detail()
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or_default();
            let text = |k: &str| detail[k].as_str().unwrap_or("").to_owned();
            Error::Quarantined {
                tenant: id.key().to_owned(),
                cause: text("cause"),
                repair: text("repair"),
            }
        }
        _ => Error::db(format!("acquire tenant {id}"))(error),
    }
}

/// A new life's schema, created under the lease in one transaction: all or nothing.
async fn create_schema(
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    epoch: i64,
    replica: &str,
    incarnation: i64,
    schema: &str,
) -> Result<()> {
    let context = || format!("create schema {schema} for tenant {id}");
    let tx = client.transaction().await.map_err(Error::db(context()))?;
    let held = tx
        .query_opt(
            "SELECT 1 FROM pgtenant.tenants
              WHERE key = $1 AND epoch = $2 AND owner = $3 AND owner_incarnation = $4 AND schema_name IS NULL
              FOR UPDATE",
            &[&id.key(), &epoch, &replica, &incarnation],
        )
        .await
        .map_err(Error::db(context()))?;
    if held.is_none() {
        return Err(Error::LeaseLost {
            tenant: id.key().to_owned(),
            epoch,
            reason: "lost while creating its schema",
        });
    }
    // The name is derived from a validated id: [a-z0-9_] only, so it needs no quoting.
    tx.batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .map_err(Error::db(context()))?;
    tx.execute(
        "UPDATE pgtenant.tenants SET schema_name = $2, schema_version = 0 WHERE key = $1",
        &[&id.key(), &schema],
    )
    .await
    .map_err(Error::db(context()))?;
    tx.execute(
        "INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
         VALUES ($1, 'created', $2, $3, $4, $5)",
        &[&id.key(), &epoch, &replica, &incarnation, &schema],
    )
    .await
    .map_err(Error::db(context()))?;
    tx.commit().await.map_err(Error::db(context()))
}

/// Clears the owner; false when the lease was no longer held.
pub(crate) async fn release_lease(
    client: &tokio_postgres::Client,
    id: &TenantId,
    epoch: i64,
    replica: &str,
    incarnation: i64,
    event: &str,
) -> Result<bool> {
    client
        .query_typed_one(
            "SELECT pgtenant.release($1, $2, $3, $4, $5, NULL, NULL)",
            &[
                (&id.key(), Type::TEXT),
                (&epoch, Type::INT8),
                (&replica, Type::TEXT),
                (&incarnation, Type::INT8),
                (&event, Type::TEXT),
            ],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db(format!("release tenant {id}")))
}

fn begin_incarnation(shared: &Shared, session: &LeaseSession) {
    let options = &shared.options;
    shared.liveness.begin(
        session.incarnation,
        session.registered_at + options.ttl - options.effective_margin(),
    );
    info!(incarnation = session.incarnation, "registered");
    shared.emit(Event::Registered {
        replica: options.replica_id.clone(),
        incarnation: session.incarnation,
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
                session.deregister(&shared.options.replica_id).await;
                return;
            }
            SessionEnd::Lost(reason) => {
                warn!(
                    reason,
                    incarnation = session.incarnation,
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
            match LeaseSession::open(&shared.options).await {
                Ok(session) => break session,
                Err(error) => {
                    warn!(%error, retry_in = ?delay, "re-registration failed");
                    shared.emit(Event::RenewFailed {
                        reason: error.to_string(),
                    });
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.changed() => return,
                    }
                    delay = (delay * 2).min(max);
                }
            }
        };
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
            outcome = tokio::time::timeout(period, heartbeat(&session.client, session.incarnation, options)) => outcome,
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
                        incarnation = session.incarnation,
                        "heartbeat resumed service"
                    );
                    shared.emit(Event::Resumed {
                        incarnation: session.incarnation,
                    });
                }
                shared.emit(Event::Renewed {
                    incarnation: session.incarnation,
                });
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
