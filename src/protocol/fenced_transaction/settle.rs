//! Work the caller stopped waiting for (DESIGN G3 "Cancel-safe", §5 "Data sessions and session
//! fencing" 3): a data connection checked out for tenant work stays counted in flight, with its
//! cancel token and backend where `abandon` and `forget` find them, until nothing it sent can
//! still commit and no transaction of it is open.
//!
//! An HTTP framework drops a handler's future when its client disconnects; `timeout` and
//! `select!` drop futures too. Dropping a future does not stop what it sent: a `COMMIT` on the
//! wire commits (closing the socket does not stop a COMMIT in progress either: checked, two
//! clients killed mid-COMMIT, both rows committed), and a `BEGIN` whose reply was not read
//! leaves a transaction open on the connection for its next user. So a [`WorkSession`] whose
//! work did not finish cleanly *settles*: it sends `ROLLBACK` and waits for the reply, which
//! comes after the replies to everything sent before it (the backend answers in order), so once
//! it arrives the earlier COMMIT has committed or not, for good, and the connection is idle.
//! Only then does the work stop counting in flight and the connection go back to the pool.
//! When the connection does not answer within `stuck_timeout`, the backend's fate is unknown:
//! under session fencing it is terminated through the control plane (`terminate_work`, which
//! waits for it to exit: a backend gone from `pg_stat_activity` commits nothing more) before
//! the work stops counting, retried while the incarnation lasts; under transaction fencing the
//! connection is closed, since a COMMIT of that backend holds the tenant's fence lock and the
//! next acquisition waits for it or ends it (`pgtenant.acquire`): it cannot land after the
//! epoch moves.
//!
//! A dropped future settles in a task of its own (Drop cannot wait); an error inside `run`
//! settles before `run` returns.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Object;
use tracing::warn;

use crate::protocol::session_fencing::terminate::terminate_work;
use crate::state::replica::{CancelOnForget, HeldLease, InFlight};

/// Retries of a termination that failed (the database unreachable), while the incarnation
/// lasts: from this pause, doubling, up to the stuck timeout.
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// A pooled data connection checked out for one tenant's work, with what counts it in flight.
pub(crate) struct WorkSession {
    pub(crate) handle: Arc<HeldLease>,
    /// None once handed to a settle task or closed.
    object: Option<Object>,
    pub(crate) state: SessionState,
}

/// What a session knows of its connection, apart from the connection itself (so a transaction
/// can borrow both at once).
#[derive(Default)]
pub(crate) struct SessionState {
    /// Counts the work in flight while a transaction may be open or a COMMIT unanswered.
    in_flight: Option<InFlight>,
    cancel: Option<CancelOnForget>,
    /// The backend, where known (session fencing binds it): what a termination ends.
    pub(crate) backend: Option<i32>,
    /// Something was sent whose effect is not known to be over: settle before any reuse.
    pub(crate) unsettled: bool,
    /// The connection stopped answering within `stuck_timeout`: never reused.
    pub(crate) stuck: bool,
    /// It served `max_tenants_per_connection` tenants: closed instead of pooled.
    pub(crate) retire: bool,
}

impl SessionState {
    /// Counts one unit of work in flight (admitted by the caller) with its cancel token.
    pub(crate) fn hold(&mut self, in_flight: InFlight) {
        self.in_flight = Some(in_flight);
        self.unsettled = true;
    }

    pub(crate) fn register_cancel(&mut self, cancel: CancelOnForget, backend: Option<i32>) {
        self.cancel = Some(cancel);
        self.backend = backend;
    }

    /// The transaction ended and its end was read: nothing left to wait for.
    pub(crate) fn settled(&mut self) {
        self.unsettled = false;
        self.in_flight = None;
        self.cancel = None;
    }

    /// The work stopped before anything that could commit was sent: it stops counting in flight
    /// now, and the connection is settled (ROLLBACK, answered) before its next use.
    pub(crate) fn abandoned_before_commit(&mut self) {
        self.in_flight = None;
        self.cancel = None;
        self.unsettled = true;
    }
}

impl WorkSession {
    pub(crate) fn new(handle: &Arc<HeldLease>, object: Object) -> WorkSession {
        WorkSession {
            handle: handle.clone(),
            object: Some(object),
            state: SessionState::default(),
        }
    }

    /// The handle, the connection and the state, borrowed apart.
    pub(crate) fn parts(&mut self) -> Option<(&Arc<HeldLease>, &mut Object, &mut SessionState)> {
        let WorkSession {
            handle,
            object,
            state,
        } = self;
        object.as_mut().map(|object| (&*handle, object, state))
    }

    /// Settles here and now, as a unit of work ends with an error or a guard begins again:
    /// ROLLBACK and its reply within the stuck bound. False when the connection did not
    /// answer: it is then settled in the background (terminated) and gone from this session.
    pub(crate) async fn settle_now(&mut self) -> bool {
        if !self.state.unsettled || self.state.stuck {
            return !self.state.stuck;
        }
        let Some(object) = self.object.as_ref() else {
            return false;
        };
        let bound = self.handle.replica.options.stuck_timeout;
        match tokio::time::timeout(bound, object.batch_execute("ROLLBACK")).await {
            Ok(Ok(())) => {
                self.state.settled();
                true
            }
            _ => {
                self.state.stuck = true;
                self.settle_in_background();
                false
            }
        }
    }

    /// Hands the connection, unsettled, to a task that settles it (see the module doc).
    fn settle_in_background(&mut self) {
        let Some(object) = self.object.take() else {
            return;
        };
        let state = std::mem::take(&mut self.state);
        let handle = self.handle.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(settle(handle, object, state));
            }
            // No runtime (the process is shutting down): the connection closes with this
            // drop, and the lease session with the runtime, so the tenant is taken over by
            // sealing (session fencing) or waits on the fence lock (transaction fencing).
            Err(_) => drop(Object::take(object)),
        }
    }
}

impl Drop for WorkSession {
    fn drop(&mut self) {
        if self.state.unsettled || self.state.stuck {
            self.settle_in_background();
            return;
        }
        if let Some(object) = self.object.take() {
            if self.state.retire || maybe_terminated(&self.handle) {
                // Retired: its backend's catalog caches go with it. Or its backend may have been
                // terminated (see maybe_terminated): closed rather than pooled.
                drop(Object::take(object));
            } else {
                // Idle and clean for this tenant: parked for its next work (affinity.rs).
                self.handle
                    .replica
                    .parking
                    .park(self.handle.key.clone(), object);
            }
        }
    }
}

/// Whether a connection whose work ended while its handle was no longer serving may have had
/// its backend terminated (an abandon terminates the backends of its work in flight; another
/// replica's seal those of a lost handle). Such a connection is closed rather than pooled: the
/// server reports the termination before the backend exits, so the client can read the error
/// and hand the connection back before it sees the socket close, and the next user (the
/// abandon's own release) would get a dead connection: about half of the abandon test's runs
/// once V7 made the wait for terminated backends milliseconds long.
fn maybe_terminated(handle: &HeldLease) -> bool {
    !matches!(
        handle.state(),
        crate::lease::HandleState::Serving | crate::lease::HandleState::Draining
    )
}

/// Settles a connection whose work stopped without its end being read (see the module doc).
/// The work stays counted in flight (its `InFlight` lives in `state`) until this returns.
async fn settle(handle: Arc<HeldLease>, object: Object, mut state: SessionState) {
    let bound = handle.replica.options.stuck_timeout;
    if !state.stuck {
        if let Ok(Ok(())) = tokio::time::timeout(bound, object.batch_execute("ROLLBACK")).await {
            state.settled();
            if state.retire || maybe_terminated(&handle) {
                drop(Object::take(object));
            }
            // Otherwise it goes back to the pool, idle, as `object` drops here.
            return;
        }
    }
    warn!(tenant = %handle.id, epoch = %handle.epoch, backend = ?state.backend,
        "a data connection of work the caller stopped waiting for did not answer: ending its backend");
    // Never pooled again.
    drop(Object::take(object));
    let replica = &handle.replica;
    let (true, Some(pid)) = (replica.session_fencing(), state.backend) else {
        // Transaction fencing: a COMMIT still running on that backend holds the tenant's fence
        // lock, so no acquisition moves the epoch past it (it waits for it, or ends it).
        return;
    };
    let mut pause = FIRST_RETRY;
    loop {
        match terminate_work(&replica.pool, &handle.credentials, &[pid]).await {
            Ok(()) => return,
            Err(error) => {
                let current = replica.liveness.credentials().map(|c| c.registration);
                if current != Some(handle.credentials.registration) {
                    // The incarnation is over: whoever takes its tenants seals it, which
                    // terminates this backend first.
                    return;
                }
                warn!(tenant = %handle.id, %error, pid, "terminating a stuck data session failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(bound);
            }
        }
    }
}
