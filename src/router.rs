//! The router (DESIGN §1 "replica"): one per replica process, a thin facade over the
//! protocols. Each method delegates to its DESIGN §5 protocol's file in `protocol/` (table in
//! `protocol/mod.rs`): `replica_start.rs` and `heartbeat.rs` (start), `open.rs` (open,
//! open_or_create, wait_for), `handoff.rs` (request_handoff), `forget.rs` (restore),
//! `migrate_all.rs`, `close.rs`. Status and summary read the shared
//! state (`state/replica.rs`) and the control plane's views.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tracing::{instrument, Instrument};

use crate::db;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::handle::TenantHandle;
use crate::id::TenantId;
use crate::lease::{Epoch, HandleState, Incarnation, TenantState};
use crate::options::{Fencing, RouterOptions};
use crate::protocol::heartbeat::maintain;
use crate::protocol::tenant_migrations::TenantMigration;
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;
use crate::state::replica::Replica;
use crate::sync::lock;

pub use crate::protocol::close::CloseReport;

/// A replica's entry point to its tenants. Cheap to clone: every clone is the same replica.
///
/// Dropping the last clone without [`Router::close`] ends the lease session, which frees the
/// replica's liveness lock: other replicas take its tenants over at once (a takeover, not a
/// handoff: the journal says "broken"), and work in flight here fails its fence. Call
/// `close()` on shutdown to hand every tenant off cleanly.
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
#[derive(Clone)]
pub struct Router {
    inner: Arc<RouterInner>,
}

struct RouterInner {
    shared: Arc<Replica>,
    maintenance: Mutex<Option<JoinHandle<()>>>,
    shutdown: watch::Sender<bool>,
    /// Notes whether this process runs, so that errors can say when it did not.
    _ticker: crate::stall::Ticker,
}

impl Drop for RouterInner {
    fn drop(&mut self) {
        // Nothing registers again: handles still held say so (RouterClosed), not "retry".
        self.shared.dropped.store(true, Ordering::Release);
        // Without close(): the lease session ends with its task, which frees the liveness lock,
        // so other replicas take the tenants over at once; the handles here are over.
        if let Some(task) = lock(&self.maintenance).take() {
            task.abort();
            self.shared
                .lose_incarnation("its Router was dropped without close()");
        }
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("replica_id", &self.inner.shared.options.replica_id)
            .field("incarnation", &self.incarnation())
            .finish_non_exhaustive()
    }
}

/// A tenant as the control plane and this replica see it, for status endpoints.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct TenantStatus {
    /// The tenant.
    pub tenant: TenantId,
    /// Its state in `pgtenant.lease_status` ([`TenantState::Absent`] when the control plane
    /// has never seen it).
    pub state: TenantState,
    /// The owner replica.
    pub owner: Option<ReplicaId>,
    /// The current epoch.
    pub epoch: Epoch,
    /// Whether the owner is alive.
    pub owner_alive: Option<bool>,
    /// Milliseconds left on the owner's heartbeat.
    pub expires_in_ms: Option<i64>,
    /// The live schema.
    pub schema: Option<String>,
    /// The tenant's migration version.
    pub version: SchemaVersion,
    /// Why it is quarantined.
    pub quarantine_cause: Option<String>,
    /// What to do about it.
    pub quarantine_repair: Option<String>,
    /// This replica's view: serving or draining when it holds the tenant.
    pub here: Option<HandleState>,
    /// Work in flight here.
    pub in_flight: usize,
}

/// Where a request for a tenant goes, from [`Router::route`]: here or there, nothing else, so
/// a `match` needs no third arm.
#[derive(Debug, Clone)]
pub enum Route {
    /// This replica serves the tenant: run the request here.
    Here(TenantHandle),
    /// Another replica holds the tenant (or it is reserved for one): send the request there.
    #[non_exhaustive]
    There {
        /// The replica.
        owner: ReplicaId,
        /// Where its clients reach it.
        address: String,
        /// The tenant's epoch when asked.
        epoch: Epoch,
    },
}

/// Where a tenant is served, from [`Router::locate`].
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Location {
    /// The tenant.
    pub tenant: TenantId,
    /// Whether the control plane has ever seen it.
    pub exists: bool,
    /// The replica holding its lease, or the one a directed handoff reserved it for; None when
    /// nobody does (whoever opens it first serves it).
    pub owner: Option<ReplicaId>,
    /// Its current epoch.
    pub epoch: Epoch,
    /// Where `owner`'s clients reach it, when it registered an address.
    pub address: Option<String>,
    /// Whether `owner`'s heartbeat is current.
    pub owner_alive: bool,
    /// True when the tenant is free but reserved for `owner`.
    pub reserved: bool,
    /// Whether this replica is the owner.
    pub here: bool,
    /// Its home: the live replica placement gives it to (weighted rendezvous hashing over the
    /// live replicas' [`placement_weight`](RouterOptions::placement_weight)s, the
    /// `pgtenant.placement` view's answer); None when no live replica has a weight above 0.
    pub home: Option<ReplicaId>,
    /// Where `home`'s clients reach it.
    pub home_address: Option<String>,
}

/// This replica at a glance, from memory only (no database call): for health endpoints.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// The replica id.
    pub replica_id: ReplicaId,
    /// The current incarnation; None while re-registering.
    pub incarnation: Option<Incarnation>,
    /// Whether handles accept work now: registered, within the local deadline, and (session
    /// fencing) the database binds this incarnation's data sessions.
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
    /// While not registered: why the last attempt to register again failed; or why the
    /// database keeps refusing this replica's data sessions
    /// ([`Error::SessionsRefused`](crate::Error::SessionsRefused)).
    pub registration_error: Option<String>,
    /// The fencing in force: [`Fencing::Session`] or [`Fencing::Transaction`].
    pub fencing: Fencing,
    /// Why session fencing could not hold, when [`Fencing::Auto`] fell back.
    pub fencing_fallback: Option<String>,
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
        let (shared, session) = crate::protocol::replica_start::start(options).await?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let span = tracing::info_span!("pgtenant.heartbeat", replica = %shared.options.replica_id);
        tokio::spawn(crate::protocol::handoff::serve_requests(
            Arc::downgrade(&shared),
            shared.notices.subscribe(),
        ));
        if let Some(idle) = shared.options.idle_release {
            tokio::spawn(crate::protocol::idle_release::release_idle(
                Arc::downgrade(&shared),
                idle,
                shutdown_rx.clone(),
            ));
        }
        if shared.options.placement {
            tokio::spawn(crate::protocol::rebalance::rebalance(
                Arc::downgrade(&shared),
                shutdown_rx.clone(),
                shared.notices.subscribe(),
            ));
        }
        if shared.options.alarms.handler.is_some() {
            tokio::spawn(crate::protocol::alarms::fire_alarms(
                Arc::downgrade(&shared),
                shutdown_rx.clone(),
            ));
        }
        let maintenance =
            tokio::spawn(maintain(shared.clone(), session, shutdown_rx).instrument(span));
        Ok(Router {
            inner: Arc::new(RouterInner {
                shared,
                maintenance: Mutex::new(Some(maintenance)),
                shutdown,
                _ticker: crate::stall::ticker(),
            }),
        })
    }

    fn shared(&self) -> &Arc<Replica> {
        &self.inner.shared
    }

    /// This replica's id.
    pub fn replica_id(&self) -> &ReplicaId {
        &self.shared().options.replica_id
    }

    /// The current incarnation, or None while the replica is re-registering.
    pub fn incarnation(&self) -> Option<Incarnation> {
        self.shared().liveness.incarnation()
    }

    /// Events from now on. A subscriber that falls more than 1024 events behind misses the
    /// oldest (it receives `RecvError::Lagged`); it never slows the router.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared().events.subscribe()
    }

    /// A data connection for work outside any tenant, with no tenant's session state on it:
    /// the session reset that runs between tenants (`pgtenant.reset_session`: settings,
    /// temporary tables, prepared statements, cursors, sequences' `lastval`, advisory locks,
    /// LISTENs) runs on it first, so nothing a tenant's work left reaches this work (G6). Its
    /// session is read-only by default: start a `READ WRITE` transaction to write. Give it back
    /// by dropping it; the next tenant to get it resets it again. Cancel-safe: a call dropped
    /// before it returns gives the connection back to the pool, where the next tenant's
    /// transaction resets it as after any other use outside the data path.
    ///
    /// The pool itself is not handed out: a connection taken from it directly could carry the
    /// last tenant's session state. An application that wants its own pool passes one to
    /// [`RouterOptions::pool`](crate::RouterOptions::pool) and keeps it for untenanted work.
    pub async fn connection(&self) -> Result<deadpool_postgres::Object> {
        let shared = self.shared();
        let client = shared
            .pool
            .get()
            .await
            .map_err(pool_error("get a data connection outside any tenant"))?;
        db::sessions::reset_session(&**client)
            .await
            .map_err(Error::db(
                "reset a data connection for work outside any tenant",
            ))?;
        Ok(client)
    }

    /// The open handle of a tenant this replica serves, if any.
    pub fn handle_of(&self, id: &TenantId) -> Option<TenantHandle> {
        self.shared()
            .handle(id)
            .filter(|h| h.is_serving())
            .map(TenantHandle::from_inner)
    }

    /// How many tenants this replica serves.
    pub fn open_count(&self) -> usize {
        lock(&self.shared().handles)
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
        crate::protocol::open::open(self.shared(), id, false)
            .await
            .map(TenantHandle::from_inner)
    }

    /// Like [`Router::open`], creating the tenant (its schema and its migrations, in the
    /// acquiring transaction) when it does not exist or was forgotten.
    pub async fn open_or_create(&self, id: &TenantId) -> Result<TenantHandle> {
        crate::protocol::open::open(self.shared(), id, true)
            .await
            .map(TenantHandle::from_inner)
    }

    /// Where a request for `id` goes: [`Route::Here`] with a handle when this replica serves
    /// the tenant (opening it, as [`Router::open`], or [`Router::open_or_create`] with
    /// `create`, when it is free), or [`Route::There`] with the address of the replica that
    /// holds it (or that a directed handoff reserved it for), to send the request to: one hop.
    /// With [`placement`](RouterOptions::placement) on, a tenant nobody serves (free, or its
    /// owner dead) goes to its home rather than being opened wherever the request landed, so a
    /// crashed replica's tenants are taken by their next homes, each by one, with no herd; this
    /// costs one read ([`Router::locate`]) when the tenant is not served here.
    ///
    /// The replica a request is sent to answers the same way, so a request that arrives after
    /// the tenant moved on is not run there but sent on (or served, if the tenant became free):
    /// work runs only under the lease of the replica that runs it, once per attempt. Framework
    /// agnostic: the example service maps `There` to a forwarded HTTP request, and a request
    /// that was forwarded once to [`Router::route_forwarded`].
    ///
    /// Cancel-safe as `open`: a cancelled call may have opened the tenant here.
    ///
    /// # Errors
    /// As [`Router::open`]; [`Error::LeaseHeld`] when the holder registered no
    /// [`address`](RouterOptions::address).
    pub async fn route(&self, id: &TenantId, create: bool) -> Result<Route> {
        let shared = self.shared();
        if shared.options.placement && self.handle_of(id).is_none() {
            let location = self.locate(id).await?;
            let me = &shared.options.replica_id;
            let held_elsewhere = location.owner.as_ref().is_some_and(|owner| owner != me)
                && (location.owner_alive || location.reserved);
            let target = if held_elsewhere {
                location.owner.zip(location.address)
            } else {
                location
                    .home
                    .filter(|home| home != me)
                    .zip(location.home_address)
            };
            if let Some((owner, address)) = target {
                return Ok(Route::There {
                    owner,
                    address,
                    epoch: location.epoch,
                });
            }
        }
        self.route_forwarded(id, create).await
    }

    /// [`Router::route`] for a request another replica already sent here: serves it here when
    /// the tenant is free, whatever its home, so a request never travels twice on placement's
    /// say-so (two replicas whose views of the members differ for an instant cannot bounce it);
    /// [`Route::There`] only when another replica holds the tenant or it is reserved for one.
    /// Without placement, the same as `route`.
    ///
    /// Cancel-safe as `open`: a cancelled call may have opened the tenant here.
    ///
    /// # Errors
    /// As [`Router::route`].
    pub async fn route_forwarded(&self, id: &TenantId, create: bool) -> Result<Route> {
        let opened = if create {
            self.open_or_create(id).await
        } else {
            self.open(id).await
        };
        match opened {
            Ok(handle) => Ok(Route::Here(handle)),
            Err(Error::LeaseHeld {
                owner,
                epoch,
                owner_address: Some(address),
                ..
            }) => Ok(Route::There {
                owner,
                address,
                epoch,
            }),
            Err(error) => Err(error),
        }
    }

    /// Waits until the tenant is free, then opens it (an existing tenant, like
    /// [`Router::open`]). Wakes on the release's NOTIFY or, for an owner that died or stalled
    /// without releasing, at its expiry; retries an unavailable database with backoff (1 s
    /// doubling to 30 s). Gives up with [`Error::OpenTimeout`] after `timeout`; a timeout
    /// beyond any representable instant (`Duration::MAX`) waits without a deadline.
    pub async fn wait_for(&self, id: &TenantId, timeout: Duration) -> Result<TenantHandle> {
        crate::protocol::open::wait_for(self.shared(), id, timeout)
            .await
            .map(TenantHandle::from_inner)
    }

    /// Asks the tenant's owner to hand it over to this replica (the owner decides by its
    /// [`HandoffPolicy`](crate::HandoffPolicy); the default hands over at once, after
    /// draining) and waits for it like [`Router::wait_for`] (`Duration::MAX`: without a
    /// deadline). The request is written through the control plane, which checks that it
    /// comes from this replica's live incarnation; an owner acts on no other (a bare
    /// `NOTIFY pgtenant_handoff`, which any role can send, moves nothing).
    pub async fn request_handoff(&self, id: &TenantId, timeout: Duration) -> Result<TenantHandle> {
        if let Some(handle) = self.handle_of(id) {
            return Ok(handle);
        }
        crate::protocol::handoff::request(self.shared(), id).await?;
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
        let shared = self.shared();
        if shared.is_closed() {
            return Err(Error::RouterClosed);
        }
        let restored = crate::protocol::forget::restore(shared, id).await;
        restored
            .map(TenantHandle::from_inner)
            .map_err(|error| shared.explain_down(error))
    }

    /// One tenant as the control plane sees it, with this replica's own view.
    pub async fn status(&self, id: &TenantId) -> Result<TenantStatus> {
        let shared = self.shared();
        let client = shared
            .pool
            .get()
            .await
            .map_err(pool_error("read a tenant's status"))?;
        let row = db::leases::lease_status(&client, id)
            .await
            .map_err(Error::db_with(|| format!("read the status of tenant {id}")))?;
        let local = shared.handle(id);
        let here = local
            .as_ref()
            .map(|h| h.state())
            .filter(|state| !state.is_ended());
        let in_flight = local.map(|h| h.in_flight()).unwrap_or(0);
        let Some(row) = row else {
            return Ok(TenantStatus {
                tenant: id.clone(),
                state: TenantState::Absent,
                owner: None,
                epoch: Epoch::new(0),
                owner_alive: None,
                expires_in_ms: None,
                schema: None,
                version: SchemaVersion::NONE,
                quarantine_cause: None,
                quarantine_repair: None,
                here,
                in_flight,
            });
        };
        Ok(TenantStatus {
            tenant: id.clone(),
            state: row.state.parse()?,
            owner: row.owner,
            epoch: row.epoch,
            owner_alive: row.owner_alive,
            expires_in_ms: row.expires_in_ms,
            schema: row.schema,
            version: row.version,
            quarantine_cause: row.quarantine_cause,
            quarantine_repair: row.quarantine_repair,
            here,
            in_flight,
        })
    }

    /// Who serves a tenant and where: its owner (or the replica a directed handoff reserved it
    /// for), the owner's registered [`address`](RouterOptions::address), whether that is this
    /// replica, and the tenant's home. One statement (`pgtenant.locate`: primary-key reads
    /// and one pass over the replicas); a tenant nobody holds, or that was never created, has
    /// no owner: serve it here, or at its home. It only reads: a cancelled call changed
    /// nothing.
    pub async fn locate(&self, id: &TenantId) -> Result<Location> {
        let shared = self.shared();
        let client = shared
            .pool
            .get()
            .await
            .map_err(pool_error("locate a tenant"))?;
        let row = db::leases::locate(&client, id)
            .await
            .map_err(Error::db_with(|| format!("locate tenant {id}")))?;
        let here = shared.handle(id).is_some_and(|h| !h.state().is_ended());
        Ok(Location {
            tenant: id.clone(),
            exists: row.exists,
            here: here || row.owner.as_ref() == Some(&shared.options.replica_id),
            owner: row.owner,
            epoch: row.epoch,
            address: row.address,
            owner_alive: row.owner_alive,
            reserved: row.reserved,
            home: row.home,
            home_address: row.home_address,
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
        crate::protocol::migrate_all::migrate_all(self.shared(), concurrency, progress).await
    }

    /// This replica at a glance, from memory (no database call).
    pub fn summary(&self) -> Summary {
        let shared = self.shared();
        let handles = lock(&shared.handles);
        let incarnation = self.incarnation();
        Summary {
            replica_id: shared.options.replica_id.clone(),
            incarnation,
            // Not while the database refuses to bind this incarnation's data sessions, or has
            // refused fresh incarnation after incarnation: every write would be refused.
            serving: shared
                .liveness
                .credentials()
                .is_some_and(|current| !shared.bindings.is_refused(current.registration))
                && shared
                    .bindings
                    .lasting(&shared.options.replica_id)
                    .is_none()
                && shared.liveness.within_deadline(),
            open: handles.values().filter(|h| h.is_serving()).count(),
            draining: handles
                .values()
                .filter(|h| h.state() == HandleState::Draining)
                .count(),
            opening: lock(&shared.opening).len(),
            in_flight: handles.values().map(|h| h.in_flight()).sum(),
            closed: shared.is_closed(),
            registration_error: lock(&shared.registration)
                .as_ref()
                .map(|failure| failure.message.clone())
                .or_else(|| {
                    shared
                        .bindings
                        .lasting(&shared.options.replica_id)
                        .map(|lasting| lasting.to_string())
                }),
            fencing: if shared.session_fencing() {
                Fencing::Session
            } else {
                Fencing::Transaction
            },
            fencing_fallback: shared.fencing_fallback.clone(),
        }
    }

    /// Refuses new opens, waits for acquisitions in flight, hands off every tenant
    /// `close_concurrency` at a time (a stuck tenant holds one lane for at most the drain
    /// timeout), then deregisters the replica (which releases whatever it still holds) and ends
    /// its lease session, freeing its liveness lock. Once it returns, no tenant names this
    /// replica as owner. Idempotent: a second call reports nothing.
    ///
    /// The releases of tenants that finish draining together share a transaction, so closing
    /// a replica that holds thousands of idle tenants takes about a second (BENCHMARKS.md),
    /// not one notifying commit per tenant.
    ///
    /// How long it can take: acquisitions in flight are waited for up to `open_timeout +
    /// drain_timeout`; a tenant whose work does not finish holds its lane for `drain_timeout`
    /// (then it is reported in [`CloseReport::failed`] and released by the deregistration),
    /// so handoffs take at most ⌈stuck tenants / `close_concurrency`⌉ × `drain_timeout` plus
    /// the database's time for the releases; then one deregistration statement (under session
    /// fencing it waits up to 5 s for this replica's data sessions to exit). To bound a
    /// shutdown whatever happens, wrap the call in `tokio::time::timeout` and exit: the lease
    /// session ends with the process, and other replicas take its tenants over at once.
    pub async fn close(&self) -> CloseReport {
        let shared = self.shared();
        if shared.closed.swap(true, Ordering::AcqRel) {
            return CloseReport::default();
        }
        let report = crate::protocol::close::hand_off_all(shared).await;
        let _ = self.inner.shutdown.send(true);
        let task = lock(&self.inner.maintenance).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        report
    }
}
