//! The replica's liveness as handles read it (DESIGN §5 "Heartbeat": the local deadline): the
//! current incarnation, its credentials and its monotonic deadline, in atomics; and what the
//! lease session hears (NOTIFYs on the free and handoff channels).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::credentials::Credentials;
use crate::lease::Incarnation;
use crate::sync::lock;

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
        lock(&self.credentials).clone()
    }

    pub(crate) fn begin(&self, credentials: Credentials, deadline: Instant) {
        let incarnation = credentials.incarnation.get();
        *lock(&self.credentials) = Some(Arc::new(credentials));
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
        *lock(&self.credentials) = None;
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
/// Channel on which a release reserved for a replica tells it (payload: its id), control plane
/// V16: with placement on, it picks the tenant up at once.
pub(crate) const RESERVED_CHANNEL: &str = "pgtenant_reserved";
