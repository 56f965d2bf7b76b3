//! Idempotent runs (DESIGN G3 "Cancel-safe", G4): work keyed by the caller's request id, whose
//! outcome is recorded in the same fenced transaction as its effect, so a retry after a timeout,
//! a cancellation, a stuck COMMIT or a lost connection returns the first outcome instead of
//! doing the work twice.
//!
//! The record lives in the tenant's own schema (`pgtenant_requests`, created on first use under
//! the lease): it commits or rolls back with the work, moves with the tenant (handoff is a lock
//! transfer), is readable in psql, and goes with the tenant on forget (and comes back on
//! restore). Records older than the retention are deleted by later idempotent runs of the
//! tenant, at most once a minute per handle.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::protocol::fenced_transaction::{run, Tx};
use crate::state::replica::HeldLease;
use crate::sync::BoxFuture;

/// The table, in the tenant's schema (`search_path` is the schema, then `pg_temp`).
const CREATE_SQL: &str = "CREATE TABLE IF NOT EXISTS pgtenant_requests (
    id text PRIMARY KEY,
    outcome jsonb NOT NULL,
    epoch bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now())";
const LOOKUP_SQL: &str = "SELECT outcome::text FROM pgtenant_requests WHERE id = $1";
const RECORD_SQL: &str =
    "INSERT INTO pgtenant_requests (id, outcome, epoch) VALUES ($1, $2::text::jsonb, $3)
    ON CONFLICT (id) DO NOTHING RETURNING 1";
const PRUNE_SQL: &str = "DELETE FROM pgtenant_requests
    WHERE recorded_at < now() - $1::float8 * interval '1 millisecond'";

/// How often a handle deletes expired records (in the transaction of an idempotent run).
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The longest request id: a UUID, a ULID or a client's own key fit; a body's hash too.
pub(crate) const MAX_REQUEST_ID_LEN: usize = 200;

/// Inside the idempotent run: the user's error, or the recorded outcome of an earlier run (which
/// rolls this one back).
enum Once<T, E> {
    Failed(E),
    Replay(T),
}

impl<T, E: From<Error>> From<Error> for Once<T, E> {
    fn from(error: Error) -> Self {
        Once::Failed(E::from(error))
    }
}

/// [`TenantHandle::run_once`](crate::TenantHandle::run_once).
pub(crate) async fn run_once<'a, T, E, F>(
    handle: &Arc<HeldLease>,
    request: &str,
    work: F,
) -> Result<T, E>
where
    T: Serialize + DeserializeOwned + Send,
    E: From<Error> + Send,
    F: for<'t> FnOnce(Tx<'t, 'a>) -> BoxFuture<'t, Result<T, E>> + Send + 'a,
{
    if request.is_empty() || request.len() > MAX_REQUEST_ID_LEN {
        return Err(Error::InvalidOption {
            option: "request id",
            reason: format!(
                "a request id has 1 to {MAX_REQUEST_ID_LEN} bytes, this one {}: use a UUID or \
                 the client's own idempotency key",
                request.len()
            ),
        }
        .into());
    }
    ensure_table(handle).await?;
    let prune = due_for_pruning(handle);
    let retention = handle.replica.options.request_retention;
    let epoch = handle.epoch.get();
    let request = request.to_owned();
    let outcome = run(handle, false, move |tx| {
        Box::pin(async move {
            if let Some(row) = tx
                .query_opt(LOOKUP_SQL, &[&request])
                .await?
            {
                return Err(Once::Replay(recorded(&row)?));
            }
            let value = work(tx).await.map_err(Once::Failed)?;
            let encoded = serde_json::to_string(&value).map_err(|error| Error::InvalidOption {
                option: "run_once outcome",
                reason: format!("it could not be recorded as JSON ({error}): check its Serialize implementation"),
            })?;
            let recorded_now = tx
                .query_opt(RECORD_SQL, &[&request, &encoded, &epoch])
                .await?;
            if recorded_now.is_none() {
                // A concurrent run of the same request committed first (the insert waited for
                // it): this one rolls back and answers what that one did.
                let row = tx
                    .query_one(LOOKUP_SQL, &[&request])
                    .await?;
                return Err(Once::Replay(recorded(&row)?));
            }
            if prune {
                let millis = retention.as_secs_f64() * 1000.0;
                tx.execute(PRUNE_SQL, &[&millis])
                    .await?;
            }
            Ok(value)
        })
    })
    .await;
    match outcome {
        Ok(value) | Err(Once::Replay(value)) => Ok(value),
        Err(Once::Failed(error)) => Err(error),
    }
}

/// The outcome recorded in `row`.
fn recorded<T: DeserializeOwned>(row: &tokio_postgres::Row) -> Result<T> {
    let text: &str = row
        .try_get(0)
        .map_err(Error::db("read an idempotent request"))?;
    serde_json::from_str(text).map_err(|error| Error::UnexpectedReply {
        context: "read the recorded outcome of an idempotent request".to_owned(),
        detail: format!(
            "it does not decode as the type this run returns ({error}): the same request id \
             was used for work returning another type"
        ),
    })
}

/// Creates the table in the tenant's schema once per handle (under the lease).
async fn ensure_table(handle: &Arc<HeldLease>) -> Result<()> {
    if handle.requests_table.load(Ordering::Acquire) {
        return Ok(());
    }
    run(handle, false, |tx| {
        Box::pin(async move { tx.batch_execute(CREATE_SQL).await })
    })
    .await?;
    handle.requests_table.store(true, Ordering::Release);
    Ok(())
}

/// Whether this run also deletes expired records (once per [`PRUNE_EVERY`] per handle).
fn due_for_pruning(handle: &HeldLease) -> bool {
    let now = crate::stall::now_ms();
    let last = handle.requests_pruned_at.load(Ordering::Acquire);
    let every = u64::try_from(PRUNE_EVERY.as_millis()).unwrap_or(u64::MAX);
    (last == 0 || now.saturating_sub(last) >= every)
        && handle
            .requests_pruned_at
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}
