//! What one replica's router, handles and background tasks share (DESIGN §5, every protocol):
//! the options, the data-path pool, the liveness, the handles served, the release batcher and
//! the event channels (`Replica`); and each handle's state (`HeldLease`): serving, draining,
//! ended, the in-flight count every voluntary end waits for, the cancel tokens `forget` and
//! `abandon` use, and the admission check every unit of work passes ("Heartbeat": the local
//! deadline). The two live in one file because each holds the other (a handle its router, the
//! router its handles): split, they would be an import circle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{broadcast, Notify};

use tokio_postgres::CancelToken;

use crate::citus::Placement;
use crate::credentials::{millis, Credentials};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::TenantId;
use crate::lease::{Epoch, HandleState};
use crate::options::RouterOptions;
use crate::schema_version::SchemaVersion;
use crate::state::affinity::Parking;
use crate::state::alarms::AlarmClock;
use crate::state::bindings::{Bindings, Mode};
use crate::state::data_sessions::DataSessions;
use crate::state::lifecycle::{self, NotAdmitted, Step};
use crate::state::liveness::{Liveness, Notice};
use crate::state::releases::ReleaseQueue;
use crate::sync::lock;

/// Events buffered per subscriber before it starts missing them.
pub(crate) const EVENT_BUFFER: usize = 1024;

pub(crate) struct Replica {
    pub(crate) options: RouterOptions,
    pub(crate) pool: Pool,
    pub(crate) liveness: Liveness,
    /// `idle_in_transaction_session_timeout` for fenced transactions: one ttl, as text.
    pub(crate) idle_timeout_ms: String,
    pub(crate) events: broadcast::Sender<Event>,
    pub(crate) notices: broadcast::Sender<Notice>,
    /// Tenants served or draining here.
    pub(crate) handles: Mutex<HashMap<TenantId, Arc<HeldLease>>>,
    /// Handles that left `handles` with work still in flight: an acquisition of the same
    /// tenant by the same registration waits for that work (`earlier_work_done`).
    retiring: Mutex<Vec<Weak<HeldLease>>>,
    /// Releases of this router's leases, batched.
    pub(crate) releases: ReleaseQueue,
    /// Tenants being acquired, one gate per tenant so concurrent opens share one acquisition.
    pub(crate) opening: Mutex<HashMap<TenantId, Arc<tokio::sync::Mutex<()>>>>,
    /// Acquisition tasks running (they outlive an open that timed out); close() waits for them
    /// so that no acquisition commits after the replica deregistered.
    pub(crate) acquiring: AtomicUsize,
    pub(crate) acquired: Notify,
    /// A tenant was opened here since rebalancing last looked for tenants away from home (on
    /// demand, anywhere: perhaps not at its home), or a move failed: the next periodic look is
    /// worth its cost (homes of every tenant held here).
    pub(crate) maybe_away: AtomicBool,
    pub(crate) closed: AtomicBool,
    /// Set when the last `Router` clone was dropped: nothing registers again, and the handles
    /// say so ([`Error::RouterClosed`]) rather than "registering again".
    pub(crate) dropped: AtomicBool,
    /// How the last incarnation ended, in the words [`Error::ReplicaDown`] gives the caller,
    /// and how long this process did not run before, when that is why.
    pub(crate) down_reason: Mutex<Option<(String, Option<Duration>)>>,
    /// Why the last re-registration failed, while the replica is not registered.
    pub(crate) registration: Mutex<Option<RegistrationFailure>>,
    /// The fencing in force, and why session fencing could not hold when it fell back.
    pub(crate) fencing: Mode,
    pub(crate) fencing_fallback: Option<String>,
    /// Session fencing: which pooled connections are bound to which incarnation.
    pub(crate) bindings: Bindings,
    /// What the data path knows of each pooled connection (signal, tenant it is clean for).
    pub(crate) data_sessions: DataSessions,
    /// Connections parked for the tenant they last served.
    pub(crate) parking: Parking,
    /// Citus or not, and where new tenant schemas go (see `citus.rs`).
    pub(crate) placement: Placement,
    /// Each tenant's next alarm as this replica knows it (`alarms.rs`).
    pub(crate) alarms: AlarmClock,
}

pub(crate) struct RegistrationFailure {
    pub(crate) message: String,
    /// Set when only someone's action ends it: returned by opens instead of `ReplicaDown`.
    pub(crate) lasting: Option<Error>,
}

impl Replica {
    pub(crate) fn new(
        options: RouterOptions,
        pool: Pool,
        notices: broadcast::Sender<Notice>,
        releases: ReleaseQueue,
        (fencing, fencing_fallback): (Mode, Option<String>),
    ) -> Replica {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let parking = Parking::new(pool.status().max_size);
        Replica {
            idle_timeout_ms: millis(options.ttl).to_string(),
            releases,
            options,
            pool,
            liveness: Liveness::new(),
            events,
            notices,
            handles: Mutex::new(HashMap::new()),
            retiring: Mutex::new(Vec::new()),
            opening: Mutex::new(HashMap::new()),
            acquiring: AtomicUsize::new(0),
            maybe_away: AtomicBool::new(true),
            acquired: Notify::new(),
            closed: AtomicBool::new(false),
            dropped: AtomicBool::new(false),
            down_reason: Mutex::new(None),
            registration: Mutex::new(None),
            fencing,
            fencing_fallback,
            bindings: Bindings::default(),
            data_sessions: DataSessions::default(),
            parking,
            placement: Placement::default(),
            alarms: AlarmClock::default(),
        }
    }

    /// The current incarnation's credentials, or `ReplicaDown` between incarnations: what a
    /// new lease (an acquisition, a restore) is taken with.
    pub(crate) fn current_credentials(&self) -> Result<Arc<Credentials>> {
        if self.dropped.load(Ordering::Acquire) {
            return Err(Error::RouterClosed);
        }
        self.liveness
            .credentials()
            .ok_or_else(|| self.replica_down(None))
    }

    /// [`Error::ReplicaDown`] with how the last incarnation ended as this process knows it, or
    /// `fallback` (what the database said) when it knows nothing.
    pub(crate) fn replica_down(&self, fallback: Option<&str>) -> Error {
        let (reason, stalled) = lock(&self.down_reason).clone().unwrap_or_else(|| {
            let reason =
                fallback.unwrap_or("it is registering a new incarnation with the database");
            match crate::stall::recent() {
                Some(stalled) => (
                    format!("{stalled}, and meanwhile {reason}"),
                    Some(stalled.0),
                ),
                None => (reason.to_owned(), None),
            }
        });
        Error::ReplicaDown {
            replica_id: self.options.replica_id.clone(),
            reason,
            stalled,
        }
    }

    /// `ReplicaDown` says "registering again"; when only someone's action will end that (a
    /// newer control plane, say), the cause itself is the truer answer; when the router was
    /// dropped, nothing registers again.
    pub(crate) fn explain_down(&self, error: Error) -> Error {
        if !matches!(error, Error::ReplicaDown { .. }) {
            return error;
        }
        if self.dropped.load(Ordering::Acquire) {
            return Error::RouterClosed;
        }
        lock(&self.registration)
            .as_ref()
            .and_then(|failure| failure.lasting.as_ref())
            .and_then(Error::lasting_copy)
            .or_else(|| self.bindings.lasting(&self.options.replica_id))
            .unwrap_or(error)
    }

    pub(crate) fn emit(&self, event: Event) {
        // No subscriber is not an error, and a slow one lags instead of blocking us.
        let _ = self.events.send(event);
    }

    /// The handle of a tenant served or draining here.
    pub(crate) fn handle(&self, id: &TenantId) -> Option<Arc<HeldLease>> {
        lock(&self.handles).get(id).cloned()
    }

    /// Forgets a handle that ended; only the exact handle, not a newer one for the same tenant.
    pub(crate) fn detach(&self, handle: &Arc<HeldLease>) {
        let mut handles = lock(&self.handles);
        if handles
            .get(&handle.id)
            .is_some_and(|current| Arc::ptr_eq(current, handle))
        {
            handles.remove(&handle.id);
            crate::metrics::leases_held(self.options.replica_id.as_str(), handles.len());
        }
        drop(handles);
        if handle.in_flight() > 0 {
            let mut retiring = lock(&self.retiring);
            retiring.retain(|old| old.upgrade().is_some_and(|old| old.in_flight() > 0));
            retiring.push(Arc::downgrade(handle));
        }
    }

    /// An earlier handle of `id` that `credentials`' registration held and that is not done:
    /// still in the map and not serving (draining, or released and awaiting the answer), or
    /// retired with work in flight. None: an acquisition may go ahead at once.
    pub(crate) fn earlier_work(
        &self,
        id: &TenantId,
        credentials: &Credentials,
    ) -> Option<Arc<HeldLease>> {
        let earlier = |handle: &Arc<HeldLease>| {
            handle.id == *id
                && handle.credentials.registration == credentials.registration
                && handle.state() != HandleState::Serving
        };
        let pending = lock(&self.handles).get(id).filter(|h| earlier(h)).cloned();
        pending.or_else(|| {
            let mut retiring = lock(&self.retiring);
            retiring.retain(|old| old.upgrade().is_some_and(|old| old.in_flight() > 0));
            retiring
                .iter()
                .filter_map(Weak::upgrade)
                .find(|h| earlier(h) && h.in_flight() > 0)
        })
    }

    /// Waits until no earlier handle of `id` that `credentials`' registration held has work in
    /// flight, within the open timeout: an acquisition of a tenant this same incarnation owned
    /// neither seals it nor waits on its fence (nothing in the database tells that work apart
    /// from the new lease's), so that work must be over before the epoch moves (G3).
    pub(crate) async fn earlier_work_done(
        &self,
        id: &TenantId,
        credentials: &Credentials,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.options.open_timeout;
        loop {
            let busy = self.earlier_work(id, credentials);
            let Some(handle) = busy else {
                return Ok(());
            };
            if handle.in_flight() == 0 {
                // Its work is over but its release is on its way (the handle leaves the map when
                // the control plane has answered, `release.rs`): acquiring now would take the
                // tenant back under this incarnation from under a handoff. Releases take
                // milliseconds; polled, since nothing else waits on a detach.
                if tokio::time::Instant::now() >= deadline {
                    return Err(Error::Draining { tenant: id.clone() });
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            if tokio::time::timeout_at(deadline, handle.wait_idle())
                .await
                .is_err()
            {
                return Err(Error::Draining { tenant: id.clone() });
            }
        }
    }

    pub(crate) fn session_fencing(&self) -> bool {
        self.fencing == Mode::Session
    }

    /// The pool's size, for bookkeeping sized by it.
    pub(crate) fn pool_size(&self) -> usize {
        self.pool.status().max_size
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Waits until no acquisition task runs, or `timeout`.
    pub(crate) async fn acquisitions_done(&self, timeout: Duration) {
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

    /// Every lease of the current incarnation is gone for good. `reason` says why, in words for
    /// the caller of a refused open ([`Error::ReplicaDown`]); when this process did not run just
    /// before, that is said first, as the likely cause.
    pub(crate) fn lose_incarnation(&self, reason: &str) {
        let stalled = crate::stall::recent();
        let reason = match stalled {
            Some(stalled) => format!("{stalled}, and meanwhile {reason}"),
            None => reason.to_owned(),
        };
        *lock(&self.down_reason) = Some((reason.clone(), stalled.map(|stalled| stalled.0)));
        let reason = reason.as_str();
        self.liveness.end();
        let lost: Vec<Arc<HeldLease>> = lock(&self.handles).drain().map(|(_, h)| h).collect();
        crate::metrics::leases_held(self.options.replica_id.as_str(), 0);
        for handle in lost {
            handle.mark_lost(reason);
        }
    }
}

pub(crate) struct HeldLease {
    pub(crate) id: TenantId,
    pub(crate) epoch: Epoch,
    /// What the incarnation that holds this lease presents to the control plane.
    pub(crate) credentials: Arc<Credentials>,
    /// The tenant's fence lock key (`pgtenant.tenants.lock_key`).
    pub(crate) lock_key: i32,
    /// The version this tenure's open migrated from, when it ran migrations.
    pub(crate) migrated_from: Option<SchemaVersion>,
    /// Whether this tenure began by creating the tenant.
    pub(crate) created: bool,
    pub(crate) schema: String,
    /// The tenant's key (`organization/ledger`), shared with the data path's bookkeeping.
    pub(crate) key: Arc<str>,
    /// `search_path` as the pin sets it: the schema, then `pg_temp` explicitly last (G6).
    pub(crate) search_path: String,
    state: AtomicU8,
    /// Held while work is admitted (state checked, in-flight count raised) and while the state
    /// changes: a voluntary end that moved the state and then found nothing in flight cannot
    /// miss work admitted a moment before (session fencing has no fence to stop it later).
    gate: Mutex<()>,
    in_flight: AtomicUsize,
    idle: Notify,
    /// Woken when the tenure ends (released, handed off, lost, forgotten).
    ended: Notify,
    /// Cancel tokens (and, under session fencing, backend pids) of the transactions in
    /// flight: `forget(ActiveWork::Cancel)` cancels them, `abandon` terminates them.
    cancels: Mutex<Vec<(u64, CancelToken, Option<i32>)>>,
    next_work: AtomicU64,
    /// Whether this tenure made sure of the tenant's table of idempotent requests.
    pub(crate) requests_table: AtomicBool,
    /// When this handle last deleted expired idempotent requests (ms on a process clock).
    pub(crate) requests_pruned_at: AtomicU64,
    /// Whether this tenure saw the tenant's alarm table committed (`pgtenant_alarms`).
    pub(crate) alarms_table: AtomicBool,
    /// When work last ended here, or the tenure began (`stall::now_ms`): idle release's clock.
    last_work_ms: AtomicU64,
    pub(crate) replica: Arc<Replica>,
}

/// What [`TenantHandle::forget`](crate::TenantHandle::forget) does with work in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveWork {
    /// Refuse to forget while work is in flight ([`Error::Busy`]).
    Refuse,
    /// Stop taking work and wait for the work in flight, up to the drain timeout.
    Drain,
    /// Cancel the statements in flight (PostgreSQL cancel requests), then wait for the work to
    /// end, up to the drain timeout.
    Cancel,
}

/// A lease just acquired: what a handle is made of.
pub(crate) struct Acquired {
    pub(crate) epoch: Epoch,
    pub(crate) credentials: Arc<Credentials>,
    pub(crate) lock_key: i32,
    pub(crate) migrated_from: Option<SchemaVersion>,
    pub(crate) schema: String,
    pub(crate) created: bool,
}

impl HeldLease {
    pub(crate) fn new(id: TenantId, lease: Acquired, replica: Arc<Replica>) -> Self {
        HeldLease {
            key: Arc::from(id.key()),
            search_path: format!("{}, pg_temp", lease.schema),
            id,
            epoch: lease.epoch,
            credentials: lease.credentials,
            lock_key: lease.lock_key,
            migrated_from: lease.migrated_from,
            created: lease.created,
            schema: lease.schema,
            state: AtomicU8::new(HandleState::Serving.to_u8()),
            gate: Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            ended: Notify::new(),
            cancels: Mutex::new(Vec::new()),
            next_work: AtomicU64::new(0),
            requests_table: AtomicBool::new(false),
            requests_pruned_at: AtomicU64::new(0),
            alarms_table: AtomicBool::new(false),
            last_work_ms: AtomicU64::new(crate::stall::now_ms()),
            replica,
        }
    }

    /// How long no work has run here: zero while some is in flight.
    pub(crate) fn idle_for(&self) -> Duration {
        if self.in_flight() > 0 {
            return Duration::ZERO;
        }
        let since = self.last_work_ms.load(Ordering::Acquire);
        Duration::from_millis(crate::stall::now_ms().saturating_sub(since))
    }

    pub(crate) fn state(&self) -> HandleState {
        HandleState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn is_serving(&self) -> bool {
        self.state() == HandleState::Serving
            && self.replica.liveness.incarnation() == Some(self.credentials.incarnation)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Applies `step` (`lifecycle.rs`); false when it does not apply in the current state.
    pub(crate) fn step(&self, step: Step) -> bool {
        let moved = {
            let _gate = lock(&self.gate);
            let Some(to) = lifecycle::next(self.state(), step) else {
                return false;
            };
            self.state.store(to.to_u8(), Ordering::Release);
            to
        };
        if moved.is_ended() {
            self.ended.notify_waiters();
        }
        true
    }

    /// Waits until the tenure has ended, or `timeout`; true when it ended.
    pub(crate) async fn wait_ended(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, async {
            loop {
                let notified = self.ended.notified();
                if self.state().is_ended() {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }

    /// Waits until no work is in flight.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Ends the tenure for good, once; reports it.
    pub(crate) fn mark_lost(self: &Arc<Self>, reason: &str) {
        if self.step(Step::Lose) {
            tracing::warn!(tenant = %self.id, epoch = %self.epoch, reason, "lease lost");
            crate::metrics::lease_lost();
            self.replica.detach(self);
            self.replica.emit(Event::Lost {
                tenant: self.id.clone(),
                epoch: self.epoch,
                reason: reason.to_owned(),
            });
        }
    }

    pub(crate) fn lease_lost(&self, reason: &'static str) -> Error {
        Error::LeaseLost {
            tenant: self.id.clone(),
            epoch: self.epoch,
            reason,
        }
    }

    /// Whether new work may start: the tenure is on, the incarnation current, and the local
    /// deadline not passed.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<()> {
        let refusal = {
            let _gate = lock(&self.gate);
            self.admission()
        };
        refusal.map_err(|refusal| self.refuse(refusal))
    }

    /// Admits one unit of work and counts it in flight, atomically with respect to the state's
    /// changes (see `gate`).
    pub(crate) fn begin_work(self: &Arc<Self>) -> Result<InFlight> {
        let refusal = {
            let _gate = lock(&self.gate);
            match self.admission() {
                Ok(()) => return Ok(InFlight::enter(self)),
                Err(refusal) => refusal,
            }
        };
        Err(self.refuse(refusal))
    }

    /// After work registered its backend (session fencing), whether an `abandon` ended the
    /// tenure meanwhile: it terminates the backends it finds registered, so work registered
    /// after it must stop here (the cancel registry's lock orders the two).
    pub(crate) fn still_admitted(&self) -> Result<()> {
        lifecycle::still_admitted(self.state()).map_err(|reason| self.lease_lost(reason))
    }

    fn admission(&self) -> std::result::Result<(), NotAdmitted> {
        let liveness = &self.replica.liveness;
        lifecycle::admission(
            self.state(),
            liveness.incarnation() == Some(self.credentials.incarnation),
            liveness.within_deadline(),
        )
    }

    /// Whether this handle's router is gone for good (dropped without `close()`).
    fn router_dropped(&self) -> bool {
        self.replica.dropped.load(Ordering::Acquire)
    }

    fn refuse(self: &Arc<Self>, refusal: NotAdmitted) -> Error {
        if self.router_dropped() && !matches!(refusal, NotAdmitted::Ended("forgotten")) {
            return Error::RouterClosed;
        }
        match refusal {
            NotAdmitted::Draining => Error::Draining {
                tenant: self.id.clone(),
            },
            NotAdmitted::Ended(reason) => self.lease_lost(reason),
            NotAdmitted::IncarnationGone => {
                self.mark_lost("the replica lost its incarnation");
                self.lease_lost("lost")
            }
            NotAdmitted::Expired => Error::ExpiredLocally {
                tenant: self.id.clone(),
                epoch: self.epoch,
                stalled: crate::stall::recent().map(|stalled| stalled.0),
            },
        }
    }

    /// A refusal of this handle's epoch by the database ends the tenure.
    pub(crate) fn refused(
        self: &Arc<Self>,
        error: tokio_postgres::Error,
        doing: &'static str,
    ) -> Error {
        let scope = crate::refusal::Scope {
            doing,
            tenant: Some(&self.id),
            epoch: self.epoch,
            replica: self.credentials.replica.as_str(),
        };
        let error = crate::refusal::map(error, &scope);
        match &error {
            Error::Fenced { .. } => {
                crate::metrics::fence_refused();
                self.mark_lost("fenced");
            }
            Error::Forgotten { .. } => self.mark_lost("forgotten"),
            _ => {}
        }
        error
    }

    /// The backends of the work in flight, where known (session fencing).
    pub(crate) fn backends_in_flight(&self) -> Vec<i32> {
        self.lock_cancels()
            .iter()
            .filter_map(|(_, _, pid)| *pid)
            .collect()
    }

    pub(crate) fn lock_cancels(&self) -> MutexGuard<'_, Vec<(u64, CancelToken, Option<i32>)>> {
        lock(&self.cancels)
    }
}

/// Counts one unit of in-flight work; the count drops even when the work is cancelled.
pub(crate) struct InFlight {
    handle: Arc<HeldLease>,
}

impl InFlight {
    fn enter(handle: &Arc<HeldLease>) -> Self {
        handle.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            handle: handle.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Idle release's clock: off the hot path when nothing reads it.
        if self.handle.replica.options.idle_release.is_some() {
            self.handle
                .last_work_ms
                .store(crate::stall::now_ms(), Ordering::Release);
        }
        if self.handle.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.handle.idle.notify_waiters();
        }
    }
}

/// Keeps a transaction's cancel token reachable by `forget(ActiveWork::Cancel)` while it runs.
pub(crate) struct CancelOnForget {
    handle: Arc<HeldLease>,
    work: u64,
}

impl CancelOnForget {
    pub(crate) fn register(handle: &Arc<HeldLease>, token: CancelToken, pid: Option<i32>) -> Self {
        let work = handle.next_work.fetch_add(1, Ordering::Relaxed);
        handle.lock_cancels().push((work, token, pid));
        CancelOnForget {
            handle: handle.clone(),
            work,
        }
    }
}

impl Drop for CancelOnForget {
    fn drop(&mut self) {
        let work = self.work;
        self.handle.lock_cancels().retain(|(w, _, _)| *w != work);
    }
}
