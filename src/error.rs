//! The one error type of pgtenant (DESIGN G7, §5 "Open path": unavailable versus
//! tenant-caused).

use std::fmt;

use std::borrow::Cow;

use crate::id::{InvalidTenantId, TenantId};
use crate::lease::Epoch;
use crate::replica_id::{InvalidReplicaId, ReplicaId};
use crate::schema_version::SchemaVersion;

/// Everything that can go wrong in pgtenant.
///
/// Match on the variant to act on it; [`Error::is_retryable`] tells a database that is
/// unavailable for now from a failure that retrying will not fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tenant id broke the rules of [`TenantId::new`]; nothing was sent to the database.
    #[error(transparent)]
    InvalidTenantId(#[from] InvalidTenantId),

    /// An option is out of its range; nothing was started or changed.
    #[error("invalid option `{option}`: {reason}")]
    #[non_exhaustive]
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// What was wrong and what range is accepted.
        reason: String,
    },

    /// A database call failed. Display carries the server's SQLSTATE and message.
    #[error(
        "{context}: {}{}",
        DbCause(source),
        stalled.map(|s| format!(" ({} just before: the database need not be at fault)", crate::stall::Stalled(s))).unwrap_or_default()
    )]
    #[non_exhaustive]
    Database {
        /// What pgtenant was doing.
        context: Cow<'static, str>,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
        /// For a lost or unreachable connection: how long this process itself did not run just
        /// before, when it was not running (meanwhile the database may have closed the
        /// connection, or another replica taken the tenant over and ended its backend).
        stalled: Option<std::time::Duration>,
    },

    /// Opening a connection did not finish within
    /// [`RouterOptions::connect_timeout`](crate::RouterOptions::connect_timeout): the TCP
    /// connect, TLS, startup and authentication (and, for the lease session, the replica's
    /// registration) together. Retryable.
    #[error("{}", connect_timeout_message(context, *timeout, *stalled))]
    #[non_exhaustive]
    ConnectTimeout {
        /// What pgtenant was connecting for, and where.
        context: String,
        /// The bound that was reached.
        timeout: std::time::Duration,
        /// How long this process itself did not run just before (stopped, suspended, starved
        /// of CPU), when it was not running: then the bound passed while nothing waited, and the
        /// server need not be at fault.
        stalled: Option<std::time::Duration>,
    },

    /// No connection could be had from the pool in time, or the pool is closed.
    #[error("{context}: no database connection: {reason}")]
    #[non_exhaustive]
    Pool {
        /// What pgtenant was doing.
        context: String,
        /// What happened, in the pool's words or pgtenant's.
        reason: String,
        /// How long this process itself did not run just before, when it was not running: then
        /// the pool's bound passed while nothing waited, and the database need not be at fault.
        stalled: Option<std::time::Duration>,
    },

    /// The database's control plane was written by a newer pgtenant than this one.
    #[error(
        "the database's pgtenant control plane is at version {found}, but this library knows versions up to {supported}: \
         upgrade pgtenant in this application (never downgrade a database's control plane)"
    )]
    #[non_exhaustive]
    ControlPlaneTooNew {
        /// The version recorded in the database.
        found: i64,
        /// The newest version this library carries.
        supported: i64,
    },

    /// The database has no pgtenant control plane, or an older one than this library needs.
    #[error(
        "the database's pgtenant control plane is at version {found}, this library needs {needed}: \
         run `pgtenant setup` or pgtenant::setup() first"
    )]
    #[non_exhaustive]
    ControlPlaneOutdated {
        /// The version recorded in the database (0: none).
        found: i64,
        /// The version this library needs.
        needed: i64,
    },

    /// Applying control-plane migrations failed; the transaction was rolled back.
    #[error("control-plane migration failed: {0}")]
    Migration(#[source] refinery::Error),

    /// Another live process already runs a replica with this id.
    #[error(
        "replica id {replica_id:?} is in use by a live process (backend pid {holder_pid}{}{}): \
         stop that process or give this one another replica id",
        since.as_ref().map(|s| format!(", since {s}")).unwrap_or_default(),
        host.as_ref().map(|h| format!(", host {h}")).unwrap_or_default()
    )]
    #[non_exhaustive]
    ReplicaIdInUse {
        /// The replica id.
        replica_id: ReplicaId,
        /// The backend pid of the session holding the replica's liveness lock.
        holder_pid: i32,
        /// When that session started (database clock).
        since: Option<String>,
        /// The host the holder registered from.
        host: Option<String>,
    },

    /// The lease session does not behave as one session: a transaction-mode pooler is in front.
    #[error("the lease session is not a stable session: {0}")]
    NotASession(String),

    /// Another replica holds the tenant's lease (or it is reserved for one).
    #[error(
        "tenant {tenant} is {} replica {owner}{} at epoch {epoch}{}: send the request there, ask the owner to hand it over, or wait",
        if *reserved { "reserved for" } else { "held by" },
        owner_address.as_ref().map(|a| format!(" (reached at {a})")).unwrap_or_default(),
        expires_in.map(|d| format!(" (lease expires in {} ms unless renewed)", d.as_millis())).unwrap_or_default()
    )]
    #[non_exhaustive]
    LeaseHeld {
        /// The tenant.
        tenant: TenantId,
        /// The replica holding (or reserved) the tenant.
        owner: ReplicaId,
        /// The tenant's current epoch.
        epoch: Epoch,
        /// Whether the owner was alive when asked.
        owner_alive: bool,
        /// Time left on the owner's heartbeat (database clock).
        expires_in: Option<std::time::Duration>,
        /// True when the tenant is free but reserved for `owner` by a directed handoff.
        reserved: bool,
        /// Where `owner`'s clients reach it ([`RouterOptions::address`](crate::RouterOptions::address)),
        /// when it registered one.
        owner_address: Option<String>,
    },

    /// The tenant does not exist (or has no live schema) and was not asked to be created.
    #[error("tenant {tenant} does not exist ({reason}): create it with Router::open_or_create{}",
        if reason.contains("forgotten") { ", or restore it from the trash (Router::restore)" } else { "" })]
    #[non_exhaustive]
    TenantNotFound {
        /// The tenant.
        tenant: TenantId,
        /// Why: never created, or forgotten (its schema is in the trash or swept).
        reason: String,
    },

    /// The tenant is quarantined: opening it failed for a reason inside the tenant.
    #[error("tenant {tenant} is quarantined: {cause}; repair: {repair}")]
    #[non_exhaustive]
    Quarantined {
        /// The tenant.
        tenant: TenantId,
        /// What failed.
        cause: String,
        /// What to do about it.
        repair: String,
    },

    /// PostgreSQL refused a transaction because this handle's epoch is no longer current: the
    /// lease was taken over or released. Nothing of the transaction was committed.
    #[error("fenced: {message}")]
    #[non_exhaustive]
    Fenced {
        /// The tenant.
        tenant: TenantId,
        /// The handle's epoch.
        epoch: Epoch,
        /// The database's words, naming the current epoch.
        message: String,
    },

    /// The tenant was forgotten; no handle of an epoch up to the forgotten one can commit.
    #[error("tenant {tenant} was forgotten: epoch {epoch} can never commit again")]
    #[non_exhaustive]
    Forgotten {
        /// The tenant.
        tenant: TenantId,
        /// The handle's epoch.
        epoch: Epoch,
    },

    /// This handle's lease is over for good (lost, released, or the replica re-registered):
    /// open the tenant again for a new handle.
    #[error("lease on tenant {tenant} at epoch {epoch} is {reason}: open the tenant again")]
    #[non_exhaustive]
    LeaseLost {
        /// The tenant.
        tenant: TenantId,
        /// The handle's epoch.
        epoch: Epoch,
        /// Why: "lost", "released", "abandoned", ….
        reason: &'static str,
    },

    /// The replica's heartbeat has not succeeded within ttl − margin: the handle refuses work
    /// until a heartbeat succeeds again (or the replica registers again). Retryable.
    #[error("{}", expired_locally_message(tenant, *epoch, *stalled))]
    #[non_exhaustive]
    ExpiredLocally {
        /// The tenant.
        tenant: TenantId,
        /// The handle's epoch.
        epoch: Epoch,
        /// How long this process itself did not run just before, when that is why the deadline
        /// passed (rather than heartbeats failing).
        stalled: Option<std::time::Duration>,
    },

    /// The replica is between incarnations: its last one ended (`reason` says how) and it is
    /// registering a new one by itself. Retryable. [`Router::summary`](crate::Router::summary)
    /// and [`Event::RegistrationFailed`](crate::Event::RegistrationFailed) say why a
    /// registration failed, if one did.
    #[error(
        "replica {replica_id} is not serving for a moment: {reason}; it registers again by \
         itself, so retry shortly"
    )]
    #[non_exhaustive]
    ReplicaDown {
        /// The replica id.
        replica_id: ReplicaId,
        /// How its last incarnation ended, as far as this process knows.
        reason: String,
        /// How long this process itself did not run before the incarnation ended, when that
        /// is why it ended (its lease expired meanwhile).
        stalled: Option<std::time::Duration>,
    },

    /// The router was closed ([`Router::close`](crate::Router::close)), or its last clone was
    /// dropped: it serves nothing more, and never registers again.
    #[error(
        "this replica's router was closed or dropped: it serves nothing more; open the tenant \
         through a router that runs"
    )]
    RouterClosed,

    /// The replica already serves as many tenants as `max_open_tenants` allows (counting those
    /// opening and draining).
    #[error("this replica is at capacity ({max} tenants, counting those opening and draining): hand some off or raise max_open_tenants")]
    #[non_exhaustive]
    AtCapacity {
        /// The configured maximum.
        max: usize,
    },

    /// The tenant is being handed off by this replica: it takes no new work. Retryable (it will
    /// be served by another replica, or again here if the handoff fails).
    #[error("tenant {tenant} is being handed off by this replica; retry shortly")]
    #[non_exhaustive]
    Draining {
        /// The tenant.
        tenant: TenantId,
    },

    /// A handoff gave up waiting for work in flight; the tenant keeps being served here.
    #[error("handoff of tenant {tenant} gave up after {timeout:?} with {in_flight} unit(s) of work still running; it keeps serving here")]
    #[non_exhaustive]
    DrainTimeout {
        /// The tenant.
        tenant: TenantId,
        /// Work still running when the drain gave up.
        in_flight: usize,
        /// The drain timeout.
        timeout: std::time::Duration,
    },

    /// A tenant migration failed; its transaction rolled back. At open this becomes
    /// [`Error::Quarantined`] with this cause.
    #[error("tenant migration failed: {cause}")]
    #[non_exhaustive]
    MigrationFailed {
        /// The failing migration and the database's message.
        cause: String,
    },

    /// The tenant's schema was migrated by newer code than this replica runs. Refused, not
    /// quarantined: during a rolling deploy newer replicas serve it fine.
    #[error(
        "tenant {tenant} is at schema version {found}, ahead of this code's {supported}: \
         serve it from a replica running newer code, or deploy it here"
    )]
    #[non_exhaustive]
    SchemaAhead {
        /// The tenant.
        tenant: TenantId,
        /// The tenant's recorded version.
        found: SchemaVersion,
        /// The newest version this code's migrations reach.
        supported: SchemaVersion,
    },

    /// `forget` with [`ActiveWork::Refuse`](crate::ActiveWork::Refuse) found work in flight.
    #[error("tenant {tenant} has {in_flight} unit(s) of work in flight: forget with ActiveWork::Drain or ActiveWork::Cancel, or retry when idle")]
    #[non_exhaustive]
    Busy {
        /// The tenant.
        tenant: TenantId,
        /// Work in flight.
        in_flight: usize,
    },

    /// The control plane refused to record or rename a schema it cannot vouch for (DESIGN G8):
    /// its name is not one pgtenant derives for the tenant, or it is not owned by the
    /// tenant-owner role (setup's application role), or creation did not make it. Nothing was
    /// changed; the message says what to do.
    #[error("tenant {tenant}: {message}")]
    #[non_exhaustive]
    ForeignSchema {
        /// The tenant.
        tenant: TenantId,
        /// The control plane's refusal, with what to do.
        message: String,
    },

    /// A restore was refused.
    #[error("cannot restore tenant {tenant}: {reason}")]
    #[non_exhaustive]
    RestoreRefused {
        /// The tenant.
        tenant: TenantId,
        /// Why (a new life exists, nothing left in the trash).
        reason: String,
    },

    /// The work passed to [`TenantHandle::run`](crate::TenantHandle::run) (or `read`) ended
    /// pgtenant's fenced transaction itself, with `COMMIT` or `ROLLBACK`. What it did before
    /// that ran under the fence; nothing after it was fenced, and nothing after it committed
    /// (data sessions are read-only outside the fenced transaction).
    #[error(
        "the work for tenant {tenant} (epoch {epoch}) ended pgtenant's fenced transaction itself \
         (COMMIT or ROLLBACK inside it): nothing after that point committed; leave transaction \
         control to pgtenant (return an error to roll back)"
    )]
    #[non_exhaustive]
    TransactionEnded {
        /// The tenant.
        tenant: TenantId,
        /// The handle's epoch.
        epoch: Epoch,
    },

    /// A handoff named a replica that is not registered and alive.
    #[error("cannot hand off to replica {replica_id}: {message}; hand off to a running replica (pgtenant.replica_status lists them)")]
    #[non_exhaustive]
    NoSuchReplica {
        /// The replica named.
        replica_id: ReplicaId,
        /// What the database says of it.
        message: String,
    },

    /// The server did not answer one of pgtenant's statements in time (or this process did not
    /// run long enough to hear it: `stalled`); the connection was closed. Retryable. Whether a
    /// `COMMIT` that timed out took effect is unknown: the transaction may have committed.
    #[error("{}", stuck_message(context, *timeout, *stalled))]
    #[non_exhaustive]
    ConnectionStuck {
        /// What pgtenant was doing.
        context: &'static str,
        /// The bound.
        timeout: std::time::Duration,
        /// How long this process itself did not run just before, when it was not running: then
        /// the bound passed while nothing waited, and the server need not be at fault.
        stalled: Option<std::time::Duration>,
    },

    /// The database answered in a way this pgtenant does not expect: the control plane may
    /// belong to another pgtenant version.
    #[error("{context}: unexpected answer from the database ({detail}); check that `pgtenant status` shows a control plane this pgtenant supports")]
    #[non_exhaustive]
    UnexpectedReply {
        /// What pgtenant was doing.
        context: String,
        /// What was unexpected.
        detail: String,
    },

    /// Taking the tenant over needed its previous owner's data sessions terminated first
    /// (session fencing), and one did not exit in time: nothing moved. Retryable.
    #[error("tenant {tenant} was not taken over: {message}; retry shortly")]
    #[non_exhaustive]
    SealIncomplete {
        /// The tenant.
        tenant: TenantId,
        /// The database's words.
        message: String,
    },

    /// The database refused to bind this replica's data sessions (session fencing) for several
    /// incarnations in a row, each freshly registered: registering again, which cures a seal,
    /// did not cure this, so someone must act. The replica keeps trying at its longest reconnect
    /// backoff and serves again once a bind passes. Not retryable.
    #[error(
        "replica {replica_id}: the database refused to bind its data sessions for {incarnations} incarnations \
         in a row ({reason}); registering again does not cure this: check pgtenant.replica_status and \
         pgtenant.session_status, or run the replica with Fencing::Transaction"
    )]
    #[non_exhaustive]
    SessionsRefused {
        /// The replica id.
        replica_id: ReplicaId,
        /// How many incarnations in a row were refused.
        incarnations: u32,
        /// The database's words (message and detail).
        reason: String,
    },

    /// The tenant's epoch could not move because work of its previous lease still held it and
    /// could not be ended: backends inside fenced transactions that pgtenant may not terminate
    /// (retryable: they may end by themselves), or prepared transactions (`PREPARE
    /// TRANSACTION` inside fenced work) that it could not roll back (not retryable: someone
    /// must roll them back). Nothing moved.
    #[error("tenant {tenant} was not acquired: {message}; {hint}")]
    #[non_exhaustive]
    StaleWork {
        /// The tenant.
        tenant: TenantId,
        /// What holds it (the database's words).
        message: String,
        /// What to do about it.
        hint: String,
        /// Whether retrying may succeed without anyone acting.
        retryable: bool,
    },

    /// Opening (or waiting for) a tenant took longer than allowed; a lease acquired after this
    /// is released, never leaked. Retryable.
    #[error(
        "gave up opening tenant {tenant} after {timeout:?}{}; retry later",
        stalled.map(|s| format!(", of which {}", crate::stall::Stalled(s))).unwrap_or_default()
    )]
    #[non_exhaustive]
    OpenTimeout {
        /// The tenant.
        tenant: TenantId,
        /// The bound that was reached.
        timeout: std::time::Duration,
        /// How long this process itself did not run just before, when it was not running.
        stalled: Option<std::time::Duration>,
    },
}

/// [`Error::ConnectTimeout`]'s words: the server, or this process when it did not run.
fn connect_timeout_message(
    context: &str,
    timeout: std::time::Duration,
    stalled: Option<std::time::Duration>,
) -> String {
    match stalled {
        Some(stalled) => format!(
            "{context}: the connect was cut short after {timeout:?}, but {}: the bound passed \
             while nothing waited, so the server may well be fine; retry",
            crate::stall::Stalled(stalled)
        ),
        None => format!(
            "{context}: no answer within {timeout:?}: the server did not finish connecting (TCP, \
             TLS, startup, authentication) in time; check that host and port point at a \
             PostgreSQL server that is up, or raise RouterOptions::connect_timeout; retry later"
        ),
    }
}

/// [`Error::ExpiredLocally`]'s words.
fn expired_locally_message(
    tenant: &TenantId,
    epoch: Epoch,
    stalled: Option<std::time::Duration>,
) -> String {
    match stalled {
        Some(stalled) => format!(
            "lease on tenant {tenant} at epoch {epoch} is on hold: {}, past the lease's local \
             deadline; the replica renews it or registers again by itself, so retry shortly",
            crate::stall::Stalled(stalled)
        ),
        None => format!(
            "lease on tenant {tenant} at epoch {epoch} is on hold: no heartbeat has reached the \
             database for most of the ttl, so this replica may already have lost it; the \
             replica renews it or registers again by itself, so retry shortly"
        ),
    }
}

/// [`Error::ConnectionStuck`]'s words: the server, or this process when it did not run.
fn stuck_message(
    context: &str,
    timeout: std::time::Duration,
    stalled: Option<std::time::Duration>,
) -> String {
    match stalled {
        Some(stalled) => format!(
            "{context}: the wait for the server was cut short after {timeout:?}, but {}: the \
             bound passed while nothing waited, so the server may well be fine; the connection \
             was closed: retry (a commit cut short this way may have taken effect)",
            crate::stall::Stalled(stalled)
        ),
        None => format!(
            "{context}: the server did not answer within {timeout:?}; the connection was closed \
             (retry; a commit that timed out may have taken effect)"
        ),
    }
}

impl Error {
    /// True when the database is unavailable for now (unreachable, restarting, out of
    /// connections, a pool timeout) or the transaction lost a serialization race: trying again
    /// later may succeed. False for everything a retry cannot fix.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Database { source, .. } => is_unavailable(source),
            Error::Pool { .. }
            | Error::ConnectTimeout { .. }
            | Error::ExpiredLocally { .. }
            | Error::ReplicaDown { .. }
            | Error::Draining { .. }
            | Error::ConnectionStuck { .. }
            | Error::SealIncomplete { .. }
            | Error::OpenTimeout { .. } => true,
            Error::StaleWork { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// How long this process itself did not run just before this error, when that is its
    /// likely cause: a bound (`connect_timeout`, `stuck_timeout`, `open_timeout`, the lease's
    /// local deadline) passed while the process was stopped (`SIGSTOP`, a suspended machine),
    /// starved of CPU or its async runtime blocked, so nothing waited for the database, which
    /// need not be at fault. The error's Display says so too. None for every other error.
    pub fn stalled(&self) -> Option<std::time::Duration> {
        match self {
            Error::ConnectTimeout { stalled, .. }
            | Error::Database { stalled, .. }
            | Error::Pool { stalled, .. }
            | Error::ExpiredLocally { stalled, .. }
            | Error::ReplicaDown { stalled, .. }
            | Error::ConnectionStuck { stalled, .. }
            | Error::OpenTimeout { stalled, .. } => *stalled,
            _ => None,
        }
    }

    /// The SQLSTATE code of the database error behind this one, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Database { source, .. } => source.code().map(|code| code.code()),
            _ => None,
        }
    }

    /// [`Error::ConnectionStuck`], saying so when this process did not run just before.
    pub(crate) fn stuck(context: &'static str, timeout: std::time::Duration) -> Error {
        Error::ConnectionStuck {
            context,
            timeout,
            stalled: crate::stall::recent().map(|stalled| stalled.0),
        }
    }

    /// [`Error::ConnectTimeout`], saying so when this process did not run just before.
    pub(crate) fn connect_timeout(context: String, timeout: std::time::Duration) -> Error {
        Error::ConnectTimeout {
            context,
            timeout,
            stalled: crate::stall::recent().map(|stalled| stalled.0),
        }
    }

    /// [`Error::OpenTimeout`], saying so when this process did not run just before.
    pub(crate) fn open_timeout(tenant: TenantId, timeout: std::time::Duration) -> Error {
        Error::OpenTimeout {
            tenant,
            timeout,
            stalled: crate::stall::recent().map(|stalled| stalled.0),
        }
    }

    /// A copy of an error that keeps a replica from registering until someone acts (a control
    /// plane of another version, the replica id taken, a pooler, an option); None for the
    /// rest, which may pass by themselves.
    pub(crate) fn lasting_copy(&self) -> Option<Error> {
        Some(match self {
            Error::ControlPlaneTooNew { found, supported } => Error::ControlPlaneTooNew {
                found: *found,
                supported: *supported,
            },
            Error::ControlPlaneOutdated { found, needed } => Error::ControlPlaneOutdated {
                found: *found,
                needed: *needed,
            },
            Error::ReplicaIdInUse {
                replica_id,
                holder_pid,
                since,
                host,
            } => Error::ReplicaIdInUse {
                replica_id: replica_id.clone(),
                holder_pid: *holder_pid,
                since: since.clone(),
                host: host.clone(),
            },
            Error::NotASession(why) => Error::NotASession(why.clone()),
            Error::SessionsRefused {
                replica_id,
                incarnations,
                reason,
            } => Error::SessionsRefused {
                replica_id: replica_id.clone(),
                incarnations: *incarnations,
                reason: reason.clone(),
            },
            Error::InvalidOption { option, reason } => Error::InvalidOption {
                option,
                reason: reason.clone(),
            },
            _ => return None,
        })
    }

    /// Wraps a driver error with what pgtenant was doing (a fixed text: nothing is allocated
    /// unless the error happens).
    pub(crate) fn db(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
        move |source| Error::database(Cow::Borrowed(context), source)
    }

    /// [`Error::Database`], saying so when the connection was lost or unreachable just after
    /// this process did not run for a while.
    pub(crate) fn database(context: Cow<'static, str>, source: tokio_postgres::Error) -> Error {
        let stalled = if is_unavailable(&source) {
            crate::stall::recent().map(|stalled| stalled.0)
        } else {
            None
        };
        Error::Database {
            context,
            source,
            stalled,
        }
    }

    /// Like [`Error::db`] with a context built only if the error happens.
    pub(crate) fn db_with(
        context: impl FnOnce() -> String,
    ) -> impl FnOnce(tokio_postgres::Error) -> Error {
        move |source| Error::database(Cow::Owned(context()), source)
    }

    /// What kind of failure this is, for callers that act on categories rather than variants.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidTenantId(_)
            | Error::InvalidOption { .. }
            | Error::NoSuchReplica { .. } => ErrorKind::InvalidInput,
            Error::Database { source, .. } if is_unavailable(source) => ErrorKind::Unavailable,
            Error::Database { .. } | Error::UnexpectedReply { .. } => ErrorKind::Database,
            Error::Pool { .. }
            | Error::ConnectTimeout { .. }
            | Error::ConnectionStuck { .. }
            | Error::ReplicaDown { .. }
            | Error::SealIncomplete { .. }
            | Error::ExpiredLocally { .. } => ErrorKind::Unavailable,
            Error::ControlPlaneTooNew { .. }
            | Error::ControlPlaneOutdated { .. }
            | Error::Migration(_) => ErrorKind::ControlPlane,
            Error::ReplicaIdInUse { .. }
            | Error::NotASession(_)
            | Error::SessionsRefused { .. } => ErrorKind::Replica,
            Error::RouterClosed => ErrorKind::Closed,
            Error::LeaseHeld { .. } => ErrorKind::Held,
            Error::Fenced { .. } | Error::Forgotten { .. } | Error::LeaseLost { .. } => {
                ErrorKind::LeaseEnded
            }
            Error::TenantNotFound { .. } => ErrorKind::NotFound,
            Error::Quarantined { .. }
            | Error::MigrationFailed { .. }
            | Error::SchemaAhead { .. }
            | Error::ForeignSchema { .. }
            | Error::RestoreRefused { .. } => ErrorKind::Tenant,
            Error::StaleWork {
                retryable: true, ..
            } => ErrorKind::Unavailable,
            Error::StaleWork { .. } => ErrorKind::Tenant,
            Error::AtCapacity { .. }
            | Error::Draining { .. }
            | Error::DrainTimeout { .. }
            | Error::Busy { .. }
            | Error::OpenTimeout { .. } => ErrorKind::Busy,
            Error::TransactionEnded { .. } => ErrorKind::Work,
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    /// Lets `?` carry a driver error out of work run through a tenant handle.
    fn from(source: tokio_postgres::Error) -> Self {
        Error::database(Cow::Borrowed("tenant work"), source)
    }
}

impl From<InvalidReplicaId> for Error {
    fn from(error: InvalidReplicaId) -> Self {
        Error::InvalidOption {
            option: error.option,
            reason: error.reason,
        }
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    /// Lets `?` carry a pool error out of code that uses its own pool (the one it gave
    /// [`RouterOptions::pool`](crate::RouterOptions::pool)).
    fn from(error: deadpool_postgres::PoolError) -> Self {
        pool_error("get a pooled connection")(error)
    }
}

/// Maps a pool failure to [`Error`]: a connection that could not be made carries the driver's
/// error, a full or closed pool says so.
pub(crate) fn pool_error(
    context: &'static str,
) -> impl FnOnce(deadpool_postgres::PoolError) -> Error {
    move |error| match error {
        deadpool_postgres::PoolError::Backend(source) => Error::db(context)(source),
        deadpool_postgres::PoolError::Timeout(kind) => {
            let stalled = crate::stall::recent();
            let reason = match (stalled, kind) {
                (Some(stalled), _) => format!(
                    "the pool's wait was cut short, but {stalled}: RouterOptions::connect_timeout \
                     passed while nothing waited, so the database may well be fine; retry"
                ),
                (None, deadpool_postgres::TimeoutType::Create) => {
                    "the database did not finish a new connection (TCP, TLS, startup, \
                     authentication) within RouterOptions::connect_timeout; retry later"
                        .to_owned()
                }
                (None, deadpool_postgres::TimeoutType::Wait) => {
                    "no pooled connection came free within the pool's wait timeout \
                     (RouterOptions::connect_timeout for pgtenant's own pool): every one stayed \
                     busy; retry later, or raise RouterOptions::pool_size"
                        .to_owned()
                }
                (None, kind) => deadpool_postgres::PoolError::Timeout(kind).to_string(),
            };
            Error::Pool {
                context: context.to_owned(),
                reason,
                stalled: stalled.map(|stalled| stalled.0),
            }
        }
        other => Error::Pool {
            context: context.to_owned(),
            reason: other.to_string(),
            stalled: None,
        },
    }
}

/// The categories of [`Error`], from [`Error::kind`]: what a caller does about a failure.
///
/// [`ErrorKind::as_str`] (also its `Display` and serde form) is a stable snake_case code for
/// logs, metrics labels and API replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input (an id, an option, a handoff to a replica that is not running): nothing was
    /// changed. Fix the call.
    InvalidInput,
    /// The database is unreachable, restarting, out of connections or too slow for now, or
    /// this replica is between incarnations: retry later.
    Unavailable,
    /// The control plane is missing, outdated, or newer than this library.
    ControlPlane,
    /// The replica cannot run: its id is in use, or a pooler is in front of its lease session.
    Replica,
    /// The router was closed: this process is shutting down.
    Closed,
    /// Another replica holds the tenant, or it is reserved for one.
    Held,
    /// This handle's lease is over (fenced, forgotten, released, lost): open the tenant again.
    LeaseEnded,
    /// The tenant does not exist (never created, or forgotten).
    NotFound,
    /// The tenant cannot be served as it is: quarantined, a migration failed, its schema is
    /// ahead of the code, a restore was refused.
    Tenant,
    /// Busy for now: draining, a drain timed out, work in flight, at capacity, an open timed
    /// out.
    Busy,
    /// Work run through a handle misused the fenced transaction (it ended it itself).
    Work,
    /// Any other database error: see the SQLSTATE ([`Error::sqlstate`]).
    Database,
}

impl ErrorKind {
    /// The kind as a stable snake_case code (`"invalid_input"`, `"unavailable"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ControlPlane => "control_plane",
            ErrorKind::Replica => "replica",
            ErrorKind::Closed => "closed",
            ErrorKind::Held => "held",
            ErrorKind::LeaseEnded => "lease_ended",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Tenant => "tenant",
            ErrorKind::Busy => "busy",
            ErrorKind::Work => "work",
            ErrorKind::Database => "database",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a driver error means "the database is not there right now".
pub(crate) fn is_unavailable(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        // No server answer at all: connect refused, reset, timed out, TLS or protocol I/O;
        // but not what this side got wrong, which no retry fixes.
        None => error.as_db_error().is_none() && !is_local_mistake(error),
        Some(code) => {
            let code = code.code();
            // 08: connection exception; 53: insufficient resources (too many connections,
            // out of memory); 57P01-03: admin/crash shutdown, cannot connect now; 40001/40P01:
            // serialization failure and deadlock, where the transaction can simply run again;
            // PTP01: only a standby answered (a failover in progress: retry once one is
            // promoted).
            code.starts_with("08")
                || code.starts_with("53")
                || matches!(
                    code,
                    "57P01" | "57P02" | "57P03" | "40001" | "40P01" | crate::sqlstate::NOT_PRIMARY
                )
        }
    }
}

/// A failure of this side's own making, found in the error's causes: TLS demanded
/// (`sslmode=require`) without a TLS connector, or a value the protocol cannot carry (a NUL
/// byte in a name), which tokio-postgres reports as `InvalidInput`.
fn is_local_mistake(error: &tokio_postgres::Error) -> bool {
    causes(error).any(|cause| {
        cause.is::<tokio_postgres::tls::NoTlsError>()
            || cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidInput)
    })
}

fn causes<'a>(
    error: &'a tokio_postgres::Error,
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(std::error::Error::source(error), |cause| cause.source())
}

/// Renders what tokio-postgres' own Display leaves out: the server's SQLSTATE, message,
/// detail and hint, or the I/O cause.
pub(crate) struct DbCause<'a>(pub(crate) &'a tokio_postgres::Error);

impl fmt::Display for DbCause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(db) = self.0.as_db_error() {
            write!(f, "{} (SQLSTATE {})", db.message(), db.code().code())?;
            if let Some(detail) = db.detail() {
                write!(f, "; detail: {detail}")?;
            }
            if let Some(hint) = db.hint() {
                write!(f, "; hint: {hint}")?;
            }
            return Ok(());
        }
        write!(f, "{}", self.0)?;
        for cause in causes(self.0) {
            write!(f, ": {cause}")?;
        }
        if causes(self.0).any(|cause| cause.is::<tokio_postgres::tls::NoTlsError>()) {
            write!(
                f,
                "; the connection requires TLS (sslmode=require) but has no TLS connector: give \
                 pgtenant one with RouterOptions::tls, or connect with sslmode=prefer or disable"
            )?;
        }
        Ok(())
    }
}

/// Convenience alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A tenant id's constructors return [`Error`], so that an application's error type needs one
/// conversion (`From<pgtenant::Error>`) for everything pgtenant returns. They are here, not in
/// `id.rs`, which the errors build on.
impl TenantId {
    /// Validates both parts and builds the id. Nothing is sent anywhere: the rules are checked
    /// here, before any database call.
    ///
    /// The rules, for each part (organization and ledger):
    /// * 1 to [`MAX_ID_PART_LEN`](crate::limits::MAX_ID_PART_LEN) (128) bytes;
    /// * ASCII letters, digits, `.`, `_` and `-` only (`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`),
    ///   so no `/` (the key is `organization/ledger`), no space, quote or non-ASCII letter;
    /// * starting with a letter or digit (never `-`, which a command line reads as a flag).
    ///
    /// UUIDs (`3f2c1a9e-8b7d-4c6e-9f1a-2b3c4d5e6f70`), ULIDs (`01HZX3K8Q2M4N6P8R0T2V4W6Y8`),
    /// KSUIDs, prefixed ids (`org_2NxX…`), slugs and domain names fit as they are.
    ///
    /// Ids are **case-sensitive**: `Acme/x` and `acme/x` are two tenants (their schemas get
    /// different names). Ids that are case-insensitive by their own rules, as UUIDs and ULIDs
    /// are, should reach pgtenant in one case (say, lowercase) from every path of the
    /// application.
    ///
    /// The tenant's schema name is derived from the id ([`TenantId::schema_name`]): a
    /// lowercase prefix of each part plus a hash, always within PostgreSQL's 63 bytes.
    ///
    /// ```
    /// use pgtenant::TenantId;
    ///
    /// let id = TenantId::new("acme", "invoices")?;
    /// assert_eq!(id.key(), "acme/invoices");
    /// assert!(TenantId::new("acme", "in voices").is_err());
    /// # Ok::<(), pgtenant::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTenantId`], whose [`InvalidTenantId`] names the part and the rule it
    /// broke ([`ErrorKind::InvalidInput`]).
    pub fn new(organization: &str, ledger: &str) -> Result<TenantId> {
        Ok(TenantId::validated(organization, ledger)?)
    }

    /// Parses a key of the form `organization/ledger` (exactly one `/`), each part by the
    /// rules of [`TenantId::new`].
    ///
    /// # Errors
    /// [`Error::InvalidTenantId`] naming the part and the rule it broke.
    pub fn parse(key: &str) -> Result<TenantId> {
        Ok(TenantId::parsed(key)?)
    }
}

impl std::str::FromStr for TenantId {
    type Err = Error;
    fn from_str(key: &str) -> Result<TenantId> {
        TenantId::parse(key)
    }
}

/// What serde deserializes a tenant id from: its key.
impl TryFrom<String> for TenantId {
    type Error = Error;
    fn try_from(key: String) -> Result<TenantId> {
        TenantId::parse(&key)
    }
}

/// Parsing a state name (`held`, `free`, …), as the operator filters take it: the error is
/// here, not in `lease.rs`, which the errors build on.
impl std::str::FromStr for crate::lease::TenantState {
    type Err = Error;

    fn from_str(text: &str) -> Result<crate::lease::TenantState, Error> {
        use crate::lease::TenantState;
        TenantState::ALL
            .into_iter()
            .chain([TenantState::Absent])
            .find(|state| state.as_str() == text)
            .ok_or_else(|| Error::InvalidOption {
                option: "state",
                reason: format!(
                    "{:?} is not a state; use one of {}",
                    text.chars().take(40).collect::<String>(),
                    TenantState::ALL.map(TenantState::as_str).join(", ")
                ),
            })
    }
}
