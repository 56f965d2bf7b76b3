//! Tenant alarms (DESIGN §5 "Alarms", G11): durable per-tenant timers scheduled inside a fenced
//! transaction and fired by the tenant's owner in another, whose commit also removes (or
//! reschedules) the alarm, so an alarm's effect in the ledger commits exactly once, and only
//! under the lease.
//!
//! * **Where they live.** In the tenant's own schema, table `pgtenant_alarms` (created on first
//!   use under the lease, like `pgtenant_requests` in `fenced_transaction/once.rs`): every
//!   write to it is fenced like any ledger write, it moves with the tenant on handoff, goes to
//!   the trash on forget and comes back on restore. Each change to it also writes the tenant's
//!   hint in the control plane (`pgtenant.note_alarms`, `db/alarms.rs`) in the same transaction
//!   (`fenced_transaction/mod.rs` notes it before the commit), so a due alarm of a tenant no
//!   replica holds is found by one indexed read (`pgtenant.due_alarms`). Transactions that
//!   change one tenant's alarms take its alarm lock (a transaction-level advisory lock) and
//!   follow each other from their first alarm statement to their commit.
//! * **Scheduling**: [`Tx::schedule_alarm`] (insert or replace by name) and
//!   [`Tx::cancel_alarm`], inside the work.
//! * **Firing** (a task per router with [`RouterOptions::alarm_handler`]): it keeps each
//!   tenant's next due time in memory (`state/alarms.rs`: updated when a transaction of a
//!   tenant held here commits, and by reading `pgtenant.due_alarms` every [`POLL_EVERY`] with a
//!   [`HORIZON`]), sleeps until the earliest, then fires each due alarm in its own fenced
//!   transaction through the same path as `TenantHandle::run`: the oldest due alarm `FOR
//!   UPDATE SKIP LOCKED`, the handler with that transaction, the delete of exactly that version
//!   (a handler that replaced the alarm keeps the new one), the hint, the commit. Tenants fire
//!   [`LANES`] at a time, one tenant's alarms in due order. A handler error rolls back; a new
//!   fenced transaction then counts the attempt and sets the next one after a backoff, or parks
//!   the alarm (`failed_at`) after the last attempt. A due alarm of a tenant that is free, or
//!   held by an incarnation that is over, is fired after opening the tenant here (with
//!   placement on, only by its home): the acquisition decides who wins.
//! * **Operators** retry or clear parked alarms by request (`pgtenant.request_alarm`, control
//!   plane 19, `pgtenant alarms retry|clear`): the request makes the tenant's hint due now, and
//!   the firing transaction that finds nothing due applies and deletes it under the lease.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{watch, Semaphore};
use tokio_postgres::types::Type;
use tracing::debug;

use crate::db;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::TenantId;
use crate::options::{AlarmSettings, RouterOptions};
use crate::protocol::fenced_transaction::{run_noted, Tx};
use crate::state::alarms::{DueTenant, TxAlarms};
use crate::state::replica::{HeldLease, Replica};
use crate::sync::BoxFuture;

/// The longest alarm name, in bytes.
pub const MAX_ALARM_NAME_LEN: usize = 200;
/// The largest alarm payload, as JSON, in bytes.
pub const MAX_ALARM_PAYLOAD_LEN: usize = 64 * 1024;

/// How often the firing task reads the tenants due (`pgtenant.due_alarms`).
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(1);
/// How far ahead that read looks.
pub(crate) const HORIZON: Duration = Duration::from_secs(2);
/// Tenants read at a time.
const POLL_LIMIT: usize = 1000;
/// Tenants fired at once.
pub(crate) const LANES: usize = 16;
/// Alarms one tenant fires before the others get their turn.
const PER_ROUND: usize = 64;
/// Due alarms of one tenant fired in one transaction. A backlog (a burst, a replica that was
/// down) fires in batches: the fence, the alarm lock, the due read, the hint and the commit
/// are paid once per batch instead of once per alarm (measured in the guide, "Alarms").
const BATCH: i64 = 16;
/// When a firing that could not run is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// The longest `last_error` kept.
const MAX_ERROR_LEN: usize = 2000;

/// The table, in the tenant's schema (`search_path` is the schema, then `pg_temp`). `seq`
/// tells one scheduling of a name from the next: a firing deletes only the version it fired.
/// The statements below go out typed and unnamed (`execute_typed`): one round trip each,
/// where a plain `execute` of a string first prepares it (two).
const CREATE_SQL: &str = "CREATE TABLE IF NOT EXISTS pgtenant_alarms (
    name text PRIMARY KEY,
    due_at timestamptz NOT NULL,
    payload jsonb NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    failed_at timestamptz,
    scheduled_at timestamptz NOT NULL DEFAULT now(),
    seq bigserial NOT NULL);
CREATE INDEX IF NOT EXISTS pgtenant_alarms_due ON pgtenant_alarms (due_at) WHERE failed_at IS NULL";
const SCHEDULE_SQL: &str = "INSERT INTO pgtenant_alarms (name, due_at, payload)
    VALUES ($1, $2, $3::text::jsonb)
    ON CONFLICT (name) DO UPDATE
       SET due_at = EXCLUDED.due_at, payload = EXCLUDED.payload, attempts = 0, last_error = NULL,
           failed_at = NULL, scheduled_at = now(), seq = DEFAULT";
const CANCEL_SQL: &str = "DELETE FROM pgtenant_alarms WHERE name = $1";
const DUE_SQL: &str = "SELECT name, seq, due_at, payload::text, attempts FROM pgtenant_alarms
    WHERE due_at <= now() AND failed_at IS NULL
    ORDER BY due_at, seq LIMIT $1 FOR UPDATE SKIP LOCKED";
/// Before its handler runs: an alarm an earlier handler of the same batch cancelled or
/// replaced is not there (no row), and is not fired.
const FIRED_SQL: &str = "DELETE FROM pgtenant_alarms WHERE name = $1 AND seq = $2 RETURNING 1";
const RETRY_SQL: &str = "UPDATE pgtenant_alarms
    SET attempts = attempts + 1, last_error = $3,
        failed_at = CASE WHEN $4::boolean THEN now() END,
        due_at = CASE WHEN $4::boolean THEN due_at
                      ELSE now() + $5::float8 * interval '1 millisecond' END
    WHERE name = $1 AND seq = $2";

/// What an alarm handler returns on failure: any error (its Display is recorded as the alarm's
/// `last_error`). `?` converts [`Error`] and most error types into it.
pub type AlarmError = Box<dyn std::error::Error + Send + Sync>;

/// An operator's retry of a parked alarm (`$1` NULL: all of the tenant's).
const RETRY_PARKED_SQL: &str = "UPDATE pgtenant_alarms
    SET failed_at = NULL, attempts = 0, last_error = NULL, due_at = now()
    WHERE failed_at IS NOT NULL AND ($1::text IS NULL OR name = $1)";
/// An operator's clear of a parked alarm (`$1` NULL: all of the tenant's).
const CLEAR_PARKED_SQL: &str =
    "DELETE FROM pgtenant_alarms WHERE failed_at IS NOT NULL AND ($1::text IS NULL OR name = $1)";

/// The handler as the router keeps it.
type Handler = Arc<
    dyn for<'t> Fn(Tx<'t, 'static>, Alarm) -> BoxFuture<'t, std::result::Result<(), AlarmError>>
        + Send
        + Sync,
>;

/// The handler, type-erased in the options (`options.rs` cannot name `Tx`).
struct HandlerBox(Handler);

fn handler_of(settings: &AlarmSettings) -> Option<Handler> {
    let erased = settings.handler.clone()?;
    erased
        .downcast::<HandlerBox>()
        .ok()
        .map(|boxed| boxed.0.clone())
}

/// A due alarm, as its handler receives it.
///
/// The handler's effect in the tenant's ledger commits exactly once: in the transaction that
/// removes the alarm, under the lease. Effects outside the database (an HTTP call, an e-mail)
/// happen at least once: a handler whose transaction fails after the call, or a replica that
/// dies before its commit, is run again. Make them idempotent with [`Alarm::id`] and
/// [`Alarm::attempt`]: `(tenant, id)` names one scheduling of the alarm, the same on every
/// attempt, e.g. as the idempotency key of an HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Alarm {
    /// The tenant.
    pub tenant: TenantId,
    /// Its name, unique within the tenant.
    pub name: String,
    /// This scheduling of it: a new number each time the name is scheduled, the same on every
    /// attempt.
    pub id: i64,
    /// When it was due.
    pub due: SystemTime,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    payload: String,
}

impl Alarm {
    /// The payload given to [`Tx::schedule_alarm`], decoded.
    ///
    /// # Errors
    /// [`Error::UnexpectedReply`] when it does not decode as `T`.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.payload).map_err(|error| Error::UnexpectedReply {
            context: format!("decode the payload of alarm {:?}", self.name),
            detail: format!(
                "it does not decode as the type asked for ({error}): it was scheduled with \
                 another type"
            ),
        })
    }

    /// The payload as JSON text.
    pub fn payload_json(&self) -> &str {
        &self.payload
    }
}

impl RouterOptions {
    /// Fires this tenant's alarms (scheduled with [`Tx::schedule_alarm`]) with `handler`: each
    /// due alarm of a tenant this replica holds (or one no live replica holds, which this
    /// replica then opens; with placement on, only its home does) runs in a fenced transaction
    /// of its tenant, which also deletes the alarm; the handler gets that transaction and the
    /// alarm. `Ok` commits both; an error rolls both back, and the alarm is tried again after
    /// [`alarm_backoff`](Self::alarm_backoff), up to
    /// [`alarm_max_attempts`](Self::alarm_max_attempts) times, then parked as failed. A
    /// recurring alarm is a handler that schedules the next one in the same transaction.
    ///
    /// ```no_run
    /// # fn example(options: pgtenant::RouterOptions) -> pgtenant::RouterOptions {
    /// use std::time::{Duration, SystemTime};
    /// options.alarm_handler(|tx, alarm| {
    ///     Box::pin(async move {
    ///         tx.execute("INSERT INTO reminders (name) VALUES ($1)", &[&alarm.name]).await?;
    ///         // Every hour, again.
    ///         tx.schedule_alarm(&alarm.name, SystemTime::now() + Duration::from_secs(3600), &()).await?;
    ///         Ok(())
    ///     })
    /// })
    /// # }
    /// ```
    #[must_use]
    pub fn alarm_handler<F>(mut self, handler: F) -> Self
    where
        F: for<'t> Fn(Tx<'t, 'static>, Alarm) -> BoxFuture<'t, std::result::Result<(), AlarmError>>
            + Send
            + Sync
            + 'static,
    {
        self.alarms.handler = Some(Arc::new(HandlerBox(Arc::new(handler))));
        self
    }
}

fn invalid(option: &'static str, reason: String) -> Error {
    Error::InvalidOption { option, reason }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_ALARM_NAME_LEN || name.contains('\0') {
        return Err(invalid(
            "alarm name",
            format!(
                "an alarm name has 1 to {MAX_ALARM_NAME_LEN} bytes and no NUL, this one {} \
                 bytes: name the timer's purpose, e.g. \"expire-hold:42\"",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// The latest due time PostgreSQL and this code agree on: the end of year 9999.
const LATEST_DUE_SECS: u64 = 253_402_300_799;

impl Tx<'_, '_> {
    /// Schedules alarm `name` of this transaction's tenant, due at `due`, with `payload`
    /// (serialized as JSON), or replaces the alarm of that name (its due time, payload and
    /// attempts; a parked one is pending again). It commits or rolls back with the
    /// transaction. A due time in the past fires at once. Transactions that change one
    /// tenant's alarms follow each other from their first alarm call to their commit.
    ///
    /// Cancel-safe as the transaction: a dropped future leaves it to `run`, which commits all
    /// of the work or none of it.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a name that is empty, longer than
    /// [`MAX_ALARM_NAME_LEN`] bytes or holds a NUL, a payload that does not serialize or is
    /// larger than [`MAX_ALARM_PAYLOAD_LEN`] as JSON, or a due time before 1970 or after 9999,
    /// before anything is sent; database errors (a read-only transaction refuses it).
    pub async fn schedule_alarm<P: Serialize + ?Sized>(
        &self,
        name: &str,
        due: SystemTime,
        payload: &P,
    ) -> Result<()> {
        check_name(name)?;
        let in_range = due
            .duration_since(UNIX_EPOCH)
            .is_ok_and(|since| since.as_secs() <= LATEST_DUE_SECS);
        if !in_range {
            return Err(invalid(
                "alarm due time",
                format!("{due:?} is outside 1970..=9999: give a time in that range"),
            ));
        }
        let payload = serde_json::to_string(payload).map_err(|error| {
            invalid(
                "alarm payload",
                format!(
                    "it does not serialize as JSON ({error}): check its Serialize implementation"
                ),
            )
        })?;
        if payload.len() > MAX_ALARM_PAYLOAD_LEN {
            return Err(invalid(
                "alarm payload",
                format!(
                    "{} bytes as JSON, more than {MAX_ALARM_PAYLOAD_LEN}: keep the data in the \
                     ledger and put its key in the payload",
                    payload.len()
                ),
            ));
        }
        prepare(self).await?;
        self.execute_typed(
            SCHEDULE_SQL,
            &[
                (&name, Type::TEXT),
                (&due, Type::TIMESTAMPTZ),
                (&payload, Type::TEXT),
            ],
        )
        .await?;
        Ok(())
    }

    /// Cancels alarm `name` of this transaction's tenant (pending or parked): true when there
    /// was one. It commits or rolls back with the transaction.
    ///
    /// Cancel-safe as [`Tx::schedule_alarm`].
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for an invalid name, before anything is sent; database errors.
    pub async fn cancel_alarm(&self, name: &str) -> Result<bool> {
        check_name(name)?;
        prepare(self).await?;
        Ok(self
            .execute_typed(CANCEL_SQL, &[(&name, Type::TEXT)])
            .await?
            > 0)
    }
}

/// A transaction's first alarm statement: the tenant's alarm lock, the table made sure of
/// (once per tenure, or in this transaction), and the note that the commit writes the hint.
async fn prepare(tx: &Tx<'_, '_>) -> Result<()> {
    let notes = tx.alarm_notes();
    let lease = tx.lease();
    let mut prepared = notes.prepared.lock().await;
    if !prepared.locked {
        db::alarms::lock(tx, lease.lock_key)
            .await
            .map_err(Error::from)?;
        prepared.locked = true;
    }
    if !prepared.table
        && !lease
            .alarms_table
            .load(std::sync::atomic::Ordering::Acquire)
    {
        tx.batch_execute(CREATE_SQL).await?;
        prepared.table = true;
    }
    notes.touch();
    Ok(())
}

/// How a firing failed: the handler (counts as an attempt) or anything else (the lease, the
/// database: tried again later, not counted).
enum Firing {
    Failed(Error),
    Handler { alarm: Alarm, error: String },
}

impl From<Error> for Firing {
    fn from(error: Error) -> Self {
        Firing::Failed(error)
    }
}

/// Fires the due alarms of the tenants `replica` holds or should wake, until the router closes
/// or is dropped.
pub(crate) async fn fire_alarms(replica: Weak<Replica>, mut shutdown: watch::Receiver<bool>) {
    let lanes = Arc::new(Semaphore::new(LANES));
    let mut next_poll = Instant::now();
    loop {
        let Some(shared) = replica.upgrade() else {
            return;
        };
        if shared.is_closed() || *shutdown.borrow() {
            return;
        }
        if Instant::now() >= next_poll {
            next_poll = Instant::now() + POLL_EVERY;
            if let Err(error) = poll(&shared).await {
                debug!(%error, "could not read the tenants whose alarms are due");
            }
        }
        for due in shared.alarms.take_due(SystemTime::now(), POLL_LIMIT) {
            tokio::spawn(fire_tenant(shared.clone(), due, lanes.clone()));
        }
        let until_poll = next_poll.saturating_duration_since(Instant::now());
        let sleep = shared
            .alarms
            .earliest()
            .map(|at| {
                at.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
            })
            .map_or(until_poll, |until| until.min(until_poll));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = shared.alarms.changed() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Reads the tenants due within the horizon that this replica should fire into its clock.
async fn poll(replica: &Arc<Replica>) -> Result<()> {
    let doing = "read the tenants whose alarms are due";
    // Bounded, so that a busy pool delays this read, not the firings the loop starts.
    let bounded = deadpool_postgres::Timeouts {
        wait: Some(POLL_EVERY / 2),
        ..replica.pool.timeouts()
    };
    let client = replica
        .pool
        .timeout_get(&bounded)
        .await
        .map_err(pool_error(doing))?;
    let horizon = i32::try_from(HORIZON.as_millis()).unwrap_or(i32::MAX);
    let due = db::alarms::due_alarms(
        &client,
        &replica.options.replica_id,
        horizon,
        POLL_LIMIT,
        replica.options.placement,
    )
    .await
    .map_err(Error::db(doing))?;
    drop(client);
    for (id, at) in due {
        replica.alarms.hinted(&id, at);
    }
    Ok(())
}

/// Gives a tenant's slot back to the clock when its firing task ends, however it ends.
struct Done {
    replica: Arc<Replica>,
    id: TenantId,
    next: Option<SystemTime>,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.replica.alarms.fired(&self.id, self.next);
    }
}

/// Fires `due`'s alarms that are due, in order, at most [`PER_ROUND`].
async fn fire_tenant(replica: Arc<Replica>, due: DueTenant, lanes: Arc<Semaphore>) {
    let mut done = Done {
        replica: replica.clone(),
        id: due.id.clone(),
        // A task that ends early (a panicking handler) tries again later.
        next: Some(SystemTime::now() + RETRY),
    };
    let Ok(_lane) = lanes.acquire().await else {
        return;
    };
    let Some(handler) = handler_of(&replica.options.alarms) else {
        done.next = None;
        return;
    };
    let held = replica.handle(&due.id).filter(|handle| handle.is_serving());
    let handle = match held {
        Some(handle) => handle,
        None if due.open && !replica.is_closed() => {
            match crate::protocol::open::open(&replica, &due.id, false).await {
                Ok(handle) => handle,
                Err(error) => {
                    debug!(tenant = %due.id, %error, "could not open a tenant whose alarm is due");
                    let retry = error.is_retryable() && !matches!(error, Error::LeaseHeld { .. });
                    done.next = retry.then(|| SystemTime::now() + RETRY);
                    return;
                }
            }
        }
        // Not held here any more, and nobody asked this replica to wake it: its owner fires.
        None => {
            done.next = None;
            return;
        }
    };
    // One at a time after a handler failed: the alarms fired beside it were rolled back with
    // it, and should not be run again and again while it is retried.
    let mut batch = BATCH;
    let mut fired = 0;
    while fired < PER_ROUND {
        let next = match fire_batch(&handle, &handler, batch).await {
            Ok((count, next)) if count > 0 => {
                fired += count;
                next
            }
            Ok((_, next)) => {
                // Nothing due by the database's clock: not before a moment from now.
                let soon = SystemTime::now() + Duration::from_millis(50);
                done.next = next.map(|next| next.max(soon));
                return;
            }
            Err(Firing::Handler { alarm, error }) => {
                batch = 1;
                fired += 1;
                match retry_or_park(&handle, &alarm, &error).await {
                    Ok(next) => next,
                    Err(error) => {
                        debug!(tenant = %handle.id, alarm = %alarm.name, %error, "could not record an alarm's failed attempt");
                        done.next = Some(SystemTime::now() + RETRY);
                        return;
                    }
                }
            }
            Err(Firing::Failed(error)) => {
                debug!(tenant = %handle.id, %error, "could not fire an alarm");
                // A lease lost meanwhile: its next owner fires (or this replica, told so).
                done.next = handle.is_serving().then(|| SystemTime::now() + RETRY);
                return;
            }
        };
        done.next = next;
        if next.is_none_or(|next| next > SystemTime::now()) {
            return;
        }
    }
}

/// Fires up to `batch` of the tenant's due alarms, oldest first, in one fenced transaction:
/// for each, the delete of exactly that version (none when an earlier handler of the batch
/// cancelled or replaced it: then it is not fired), then its handler. How many fired, and the
/// tenant's next due time after them. A handler's error rolls the whole batch back and is
/// that alarm's failure; so is a handler that returned `Ok` after one of its statements
/// failed (the next statement finds the transaction aborted).
async fn fire_batch(
    handle: &Arc<HeldLease>,
    handler: &Handler,
    batch: i64,
) -> std::result::Result<(usize, Option<SystemTime>), Firing> {
    let notes = TxAlarms::firing();
    let tenant = handle.id.clone();
    let handler = handler.clone();
    // The last alarm whose handler returned Ok: a statement after it that finds the
    // transaction aborted (the next delete, or the hint before the commit) is its failure.
    let last_ok: Arc<std::sync::Mutex<Option<Alarm>>> = Arc::default();
    let last = last_ok.clone();
    let outcome = run_noted(handle, false, &notes, move |tx| {
        Box::pin(async move {
            prepare(&tx).await?;
            let rows = tx.query_typed(DUE_SQL, &[(&batch, Type::INT8)]).await?;
            if rows.is_empty() {
                // Nothing due: a wake for the operators' requests, or an early one.
                apply_requests(&tx).await?;
                return Ok(Vec::new());
            }
            let mut fired: Vec<Alarm> = Vec::with_capacity(rows.len());
            for row in &rows {
                let alarm = alarm_of(tenant.clone(), row)?;
                let version = [(&alarm.name as _, Type::TEXT), (&alarm.id as _, Type::INT8)];
                match tx.query_typed(FIRED_SQL, &version).await {
                    Ok(deleted) if deleted.is_empty() => continue,
                    Ok(_) => {}
                    Err(error) => return Err(Firing::Failed(error)),
                }
                if let Err(error) = (Caught(handler(tx, alarm.clone()))).await {
                    return Err(Firing::Handler {
                        alarm,
                        error: error.to_string(),
                    });
                }
                *crate::sync::lock(&last) = Some(alarm.clone());
                fired.push(alarm);
            }
            Ok(fired)
        })
    })
    .await;
    let fired = match outcome {
        Ok(fired) => fired,
        Err(Firing::Failed(error)) => {
            let previous = crate::sync::lock(&last_ok).take();
            return Err(aborted_by(previous, error));
        }
        Err(handler_failed) => return Err(handler_failed),
    };
    let next = notes.noted().flatten();
    for alarm in &fired {
        let late = SystemTime::now()
            .duration_since(alarm.due)
            .unwrap_or(Duration::ZERO);
        crate::metrics::alarm_fired(late);
        handle.replica.emit(Event::AlarmFired {
            tenant: handle.id.clone(),
            epoch: handle.epoch,
            name: alarm.name.clone(),
            id: alarm.id,
            attempt: alarm.attempt,
            late_ms: u64::try_from(late.as_millis()).unwrap_or(u64::MAX),
        });
    }
    Ok((fired.len(), next))
}

/// A statement after handler `previous` returned `Ok` failed: when the transaction was aborted,
/// a statement of that handler failed and it swallowed the error, its alarm's failure;
/// otherwise the statement's own.
fn aborted_by(previous: Option<Alarm>, error: Error) -> Firing {
    match previous {
        Some(alarm) if error.sqlstate() == Some(crate::sqlstate::IN_FAILED_TRANSACTION) => {
            Firing::Handler {
                alarm,
                error: format!(
                    "a statement of the handler failed and the handler returned Ok: return the \
                     error from the handler ({error})"
                ),
            }
        }
        _ => Firing::Failed(error),
    }
}

/// Applies the operators' requests for this tenant's parked alarms (`pgtenant alarms retry` and
/// `clear`, control plane 19 on) in the firing transaction, which also deletes them: retry makes
/// a parked alarm pending again, due now, its attempts from 0; clear deletes it. An alarm that is
/// not parked (fired, rescheduled, cancelled meanwhile) is left as it is.
async fn apply_requests(tx: &Tx<'_, '_>) -> Result<()> {
    let key = tx.lease().key.clone();
    let requests = db::alarms::take_requests(tx, &key)
        .await
        .map_err(Error::db("take the operators' alarm requests"))?;
    for (name, action) in requests {
        let sql = if action == "clear" {
            CLEAR_PARKED_SQL
        } else {
            RETRY_PARKED_SQL
        };
        let changed = tx.execute_typed(sql, &[(&name, Type::TEXT)]).await?;
        tracing::info!(tenant = %key, alarm = name.as_deref().unwrap_or("(all parked)"), %action, changed, "applied an operator's alarm request");
    }
    Ok(())
}

/// A handler's future whose panic is its error: the firing rolls back and counts the attempt
/// (a handler that always panics is parked, not retried forever), and the firing task lives on.
struct Caught<'t>(BoxFuture<'t, std::result::Result<(), AlarmError>>);

impl std::future::Future for Caught<'_> {
    type Output = std::result::Result<(), AlarmError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let future = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(polled) => polled,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|text| (*text).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                std::task::Poll::Ready(Err(format!("the handler panicked: {message}").into()))
            }
        }
    }
}

/// The alarm in a row of [`DUE_SQL`].
fn alarm_of(tenant: TenantId, row: &tokio_postgres::Row) -> Result<Alarm> {
    let read = |error| Error::db("read a due alarm")(error);
    let attempts: i32 = row.try_get(4).map_err(&read)?;
    Ok(Alarm {
        tenant,
        name: row.try_get(0).map_err(&read)?,
        id: row.try_get(1).map_err(&read)?,
        due: row.try_get(2).map_err(&read)?,
        attempt: u32::try_from(attempts).unwrap_or(0).saturating_add(1),
        payload: row.try_get(3).map_err(&read)?,
    })
}

/// The delay before the attempt after `attempt` (from 1): the first backoff, doubling, capped.
fn backoff(settings: &AlarmSettings, attempt: u32) -> Duration {
    let (first, max) = settings.backoff;
    let factor = 2_u32.saturating_pow(attempt.saturating_sub(1));
    first.saturating_mul(factor).min(max)
}

/// In a new fenced transaction (the handler's rolled back): counts the failed attempt and sets
/// the next one after the backoff, or parks the alarm after the last. The tenant's next due
/// time after it.
async fn retry_or_park(
    handle: &Arc<HeldLease>,
    alarm: &Alarm,
    error: &str,
) -> Result<Option<SystemTime>> {
    let settings = &handle.replica.options.alarms;
    let parked = alarm.attempt >= settings.max_attempts;
    let delay_ms = backoff(settings, alarm.attempt).as_secs_f64() * 1000.0;
    let recorded: String = error
        .chars()
        .filter(|c| *c != '\0')
        .take(MAX_ERROR_LEN)
        .collect();
    let notes = TxAlarms::firing();
    let (name, id) = (alarm.name.clone(), alarm.id);
    let text = recorded.clone();
    run_noted(handle, false, &notes, move |tx| {
        Box::pin(async move {
            prepare(&tx).await?;
            tx.execute_typed(
                RETRY_SQL,
                &[
                    (&name, Type::TEXT),
                    (&id, Type::INT8),
                    (&text, Type::TEXT),
                    (&parked, Type::BOOL),
                    (&delay_ms, Type::FLOAT8),
                ],
            )
            .await?;
            Ok::<_, Error>(())
        })
    })
    .await?;
    crate::metrics::alarm_failed(parked);
    handle.replica.emit(Event::AlarmFailed {
        tenant: handle.id.clone(),
        epoch: handle.epoch,
        name: alarm.name.clone(),
        id: alarm.id,
        attempt: alarm.attempt,
        error: recorded,
        parked,
    });
    Ok(notes.noted().flatten())
}
