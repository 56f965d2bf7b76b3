//! An HTTP service on pgtenant, written the way an application writes one: each replica of the
//! service is one [`pgtenant::Router`], every tenant is a ledger of entries in its own schema,
//! and every write is fenced by the tenant's lease.
//!
//! | route | what |
//! |---|---|
//! | `POST /tenants/{org}/{ledger}` | create the tenant (or open it here) |
//! | `GET /tenants/{org}/{ledger}` | the tenant as the control plane sees it |
//! | `DELETE /tenants/{org}/{ledger}` | forget the tenant (its schema goes to the trash) |
//! | `POST /tenants/{org}/{ledger}/entries` | add one entry (`{"memo": "…", "amount": 42}`) |
//! | `POST /tenants/{org}/{ledger}/entries/batch` | add several entries in one transaction |
//! | `GET /tenants/{org}/{ledger}/entries` | the entries and their balance |
//! | `POST /tenants/{org}/{ledger}/handoff[?to=replica]` | hand the tenant off (to one replica) |
//! | `GET /health` | [`Router::summary`]; 503 while the replica does not serve |
//! | `GET /metrics` | pgtenant's metrics in Prometheus' text format |
//!
//! A request for a tenant that this replica does not serve opens it here when it is free; when
//! another replica holds it, the answer is 409 with the owner, so a load balancer (or the
//! client) can go there. Errors map to statuses by [`pgtenant::Error::kind`]: 503 with
//! `Retry-After` for everything that passes by itself. Bodies speak to the HTTP client (what
//! happened to its request, what to do); the full error, for the operator, goes to the log
//! (standard error).
//!
//! One error type, `ApiError`, with one conversion from pgtenant (`From<pgtenant::Error>`):
//! every pgtenant call returns [`pgtenant::Error`], the statements run through a handle too.
//!
//! [`serve`] runs the service until its shutdown future resolves, then stops accepting
//! connections, lets the requests in flight finish, and only then closes the router, which
//! hands every tenant off so that other replicas take them over at once.
#![deny(missing_docs)]

use std::future::Future;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use pgtenant::{ActiveWork, CloseReport, Error, ErrorKind, Router, RouterOptions, TenantId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// The tenant migrations: every tenant's schema starts from these, in order; a tenant created
/// by older code is brought up to date when it is next opened.
pub const TENANT_MIGRATIONS: [(&str, &str); 1] = [(
    "V1__entries",
    "CREATE TABLE entries (
         id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         memo text NOT NULL CHECK (memo <> ''),
         amount bigint NOT NULL
     )",
)];

/// The service's router options: `replica_id` must be unique among the live replicas (a second
/// process with the same id is refused at start).
///
/// # Errors
/// [`Error::InvalidOption`] when the URL does not parse.
pub fn router_options(replica_id: &str, database_url: &str) -> pgtenant::Result<RouterOptions> {
    RouterOptions::from_url(replica_id, database_url)?.tenant_migrations(TENANT_MIGRATIONS)
}

/// Installs the Prometheus recorder as the process's `metrics` recorder, so that pgtenant's
/// metrics land in it; call it before starting the router (what is recorded earlier is lost).
/// Once per process. The caller runs [`PrometheusHandle::run_upkeep`] now and then.
///
/// # Errors
/// When a recorder is already installed.
pub fn install_metrics() -> Result<PrometheusHandle, BuildError> {
    PrometheusBuilder::new()
        // Histograms rather than the exporter's default summaries: buckets add up across
        // replicas, quantiles do not.
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0, 30.0],
        )?
        .install_recorder()
}

/// The HTTP routes, on `router` (one replica).
pub fn app(router: Router, metrics: PrometheusHandle) -> axum::Router {
    axum::Router::new()
        .route(
            "/tenants/{org}/{ledger}",
            post(create).get(status).delete(forget),
        )
        .route(
            "/tenants/{org}/{ledger}/entries",
            post(add_entry).get(entries),
        )
        .route("/tenants/{org}/{ledger}/entries/batch", post(add_entries))
        .route("/tenants/{org}/{ledger}/handoff", post(handoff))
        .route("/health", get(health))
        .route("/metrics", get(render_metrics))
        // Router is a cheap handle (an Arc inside): every request gets a clone.
        .with_state(App { router, metrics })
}

/// Serves `app(router, metrics)` on `listener` until `shutdown` resolves. Then it stops
/// accepting, waits for the requests in flight, and closes the router: every tenant is handed
/// off (other replicas take it at once, nothing acknowledged is lost) and the replica's
/// liveness lock is freed.
///
/// # Errors
/// The listener's I/O errors; the router is closed all the same.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    metrics: PrometheusHandle,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<CloseReport> {
    let served = axum::serve(listener, app(router.clone(), metrics))
        .with_graceful_shutdown(shutdown)
        .await;
    // Only after the last request: close() refuses new work, so closing first would fail the
    // requests still running instead of letting them finish.
    let report = router.close().await;
    served.map(|()| report)
}

#[derive(Clone)]
struct App {
    router: Router,
    metrics: PrometheusHandle,
}

/// The `{org}/{ledger}` of a route, validated before any handler runs.
struct Tenant(TenantId);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Path((org, ledger)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        TenantId::new(&org, &ledger)
            .map(Tenant)
            .map_err(|invalid| ApiError::from(invalid).into_response())
    }
}

#[derive(Deserialize)]
struct NewEntry {
    memo: String,
    amount: i64,
}

#[derive(Serialize)]
struct Entry {
    id: i64,
    memo: String,
    amount: i64,
}

impl Entry {
    fn from_row(row: &pgtenant::postgres::Row) -> Entry {
        Entry {
            id: row.get("id"),
            memo: row.get("memo"),
            amount: row.get("amount"),
        }
    }
}

async fn create(State(app): State<App>, Tenant(id): Tenant) -> Result<Json<Value>, ApiError> {
    let tenant = app.router.open_or_create(&id).await?;
    Ok(Json(json!({
        "tenant": tenant.id(),
        "epoch": tenant.epoch(),
        "schema": tenant.schema(),
        "replica": app.router.replica_id(),
    })))
}

async fn status(
    State(app): State<App>,
    Tenant(id): Tenant,
) -> Result<Json<pgtenant::TenantStatus>, ApiError> {
    Ok(Json(app.router.status(&id).await?))
}

/// One entry, through `run`: the work is a closure, and it borrows the request body.
async fn add_entry(
    State(app): State<App>,
    Tenant(id): Tenant,
    Json(entry): Json<NewEntry>,
) -> Result<(StatusCode, Json<Entry>), ApiError> {
    // Serving it already is a map lookup; otherwise this acquires the lease (or says who has it).
    let tenant = app.router.open(&id).await?;
    // The work borrows the body (no clone, no 'static): `entry` is still ours afterwards.
    let new = &entry;
    let entry_id: i64 = tenant
        .run(|tx| {
            Box::pin(async move {
                let row = tx
                    .query_one(
                        "INSERT INTO entries (memo, amount) VALUES ($1, $2) RETURNING id",
                        &[&new.memo, &new.amount],
                    )
                    .await?;
                Ok::<_, Error>(row.get(0))
            })
        })
        .await?;
    // Ok from run: committed under the lease. Had the lease moved, PostgreSQL would have
    // refused the commit (Error::Fenced), whatever this process believed.
    let created = Entry {
        id: entry_id,
        memo: entry.memo,
        amount: entry.amount,
    };
    Ok((StatusCode::CREATED, Json(created)))
}

/// Several entries in one transaction, through the guard API: a loop with `?` and no closure.
async fn add_entries(
    State(app): State<App>,
    Tenant(id): Tenant,
    Json(batch): Json<Vec<NewEntry>>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let tenant = app.router.open(&id).await?;
    let mut conn = tenant.connect().await?;
    let tx = conn.begin().await?;
    let mut ids = Vec::with_capacity(batch.len());
    for entry in &batch {
        let row = tx
            .query_one(
                "INSERT INTO entries (memo, amount) VALUES ($1, $2) RETURNING id",
                &[&entry.memo, &entry.amount],
            )
            .await?; // an early return drops `tx`: rolled back, none of the batch is kept
        ids.push(row.get::<_, i64>(0));
    }
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(json!({ "ids": ids }))))
}

async fn entries(State(app): State<App>, Tenant(id): Tenant) -> Result<Json<Value>, ApiError> {
    let tenant = app.router.open(&id).await?;
    // READ ONLY; its fence checks the epoch without taking the tenant's lock.
    let entries: Vec<Entry> = tenant
        .read(|tx| {
            Box::pin(async move {
                let rows = tx
                    .query("SELECT id, memo, amount FROM entries ORDER BY id", &[])
                    .await?;
                Ok::<_, Error>(rows.iter().map(Entry::from_row).collect())
            })
        })
        .await?;
    let balance: i64 = entries.iter().map(|entry| entry.amount).sum();
    Ok(Json(json!({
        "tenant": id,
        "replica": app.router.replica_id(),
        "epoch": tenant.epoch(),
        "balance": balance,
        "entries": entries,
    })))
}

#[derive(Deserialize)]
struct HandoffTarget {
    /// Checked as it is parsed: a bad replica id is a 400 naming the rule.
    to: Option<pgtenant::ReplicaId>,
}

async fn handoff(
    State(app): State<App>,
    Tenant(id): Tenant,
    Query(target): Query<HandoffTarget>,
) -> Result<Json<Value>, ApiError> {
    // Only the owner hands a tenant off: opening it here first would bump its epoch for nothing.
    let tenant = app
        .router
        .handle_of(&id)
        .ok_or_else(|| ApiError::NotServedHere {
            tenant: id.clone(),
            replica: app.router.replica_id().to_string(),
        })?;
    match &target.to {
        // Reserved for that replica for a short window: no other replica takes it first.
        Some(replica) => tenant.handoff_to(replica).await?,
        None => tenant.handoff().await?,
    }
    Ok(Json(json!({
        "tenant": id,
        "from": app.router.replica_id(),
        "to": target.to,
    })))
}

async fn forget(State(app): State<App>, Tenant(id): Tenant) -> Result<Json<Value>, ApiError> {
    let tenant = app.router.open(&id).await?;
    // Drain: requests already running on the tenant finish first; new ones are refused.
    let trash = tenant.forget(ActiveWork::Drain).await?;
    Ok(Json(json!({ "tenant": id, "trash_schema": trash })))
}

async fn health(State(app): State<App>) -> (StatusCode, Json<pgtenant::Summary>) {
    let summary = app.router.summary();
    // Not serving: re-registering after a lost lease session, heartbeats failing past the
    // local deadline, or shutting down. A load balancer should send nothing here meanwhile.
    let status = if summary.serving && !summary.closed {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(summary))
}

async fn render_metrics(State(app): State<App>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
}

/// What a handler can fail with, as an HTTP response: pgtenant's error (one `From`), or the
/// service's own.
enum ApiError {
    /// Anything pgtenant returned.
    Pgtenant(Error),
    /// A handoff asked of a replica that does not hold the tenant.
    NotServedHere {
        /// The tenant.
        tenant: TenantId,
        /// This replica.
        replica: String,
    },
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError::Pgtenant(error)
    }
}

/// What happened to the request, told to the HTTP client (which knows nothing of pgtenant's
/// API), and what to do about it.
fn for_the_client(error: &Error) -> String {
    let retry = "retry in a second";
    match error {
        Error::LeaseHeld {
            tenant,
            owner,
            owner_address,
            ..
        } => format!(
            "tenant {tenant} is served by replica {owner}{}: send the request there (or have it \
             hand the tenant over: POST /tenants/{tenant}/handoff to replica {owner})",
            owner_address
                .as_ref()
                .map(|address| format!(" at {address}"))
                .unwrap_or_default()
        ),
        Error::TenantNotFound { tenant, reason, .. } => format!(
            "tenant {tenant} does not exist ({reason}): create it with POST /tenants/{tenant}"
        ),
        Error::Draining { tenant, .. } => {
            format!("tenant {tenant} is moving to another replica right now: {retry}")
        }
        Error::RouterClosed => format!("this replica is shutting down: {retry}, on another one"),
        error if error.stalled().is_some() => format!(
            "this replica was not running for {:.0} s (paused or starved of CPU) and is catching \
             up: {retry}",
            error.stalled().unwrap_or_default().as_secs_f64()
        ),
        Error::ReplicaDown { .. } | Error::ExpiredLocally { .. } => format!(
            "this replica is renewing its lease with the database and serves again by itself: \
             {retry}"
        ),
        error => match error.kind() {
            ErrorKind::LeaseEnded => format!(
                "this replica's lease on the tenant ended while the request ran (it moved to \
                 another replica, or this one lost it); nothing of the request was kept: {retry}"
            ),
            ErrorKind::Busy => format!("this replica is busy: {retry}"),
            ErrorKind::Unavailable => {
                format!("this replica cannot reach its database right now: {retry}")
            }
            ErrorKind::Closed | ErrorKind::Replica => {
                format!("this replica cannot serve right now: {retry}, on another one")
            }
            // Bad input, the tenant's own state, the ledger's rules: about the request itself.
            _ => error.to_string(),
        },
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = match self {
            ApiError::Pgtenant(error) => error,
            ApiError::NotServedHere { tenant, replica } => {
                let message = format!(
                    "replica {replica} does not serve tenant {tenant}: ask its owner \
                     (GET /tenants/{tenant} names it)"
                );
                let body = json!({ "error": "not_served_here", "message": message });
                return (StatusCode::CONFLICT, Json(body)).into_response();
            }
        };
        let (status, code) = match error.kind() {
            // `?to=` named a replica that is not running: the request was wrong.
            ErrorKind::InvalidInput if matches!(error, Error::NoSuchReplica { .. }) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "no_such_replica")
            }
            ErrorKind::InvalidInput => (StatusCode::BAD_REQUEST, "invalid_input"),
            // Another replica has it: the body names the owner, go there.
            ErrorKind::Held => (StatusCode::CONFLICT, "held"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            // Quarantined, schema ahead of this code, …: the message says what to repair.
            ErrorKind::Tenant => (StatusCode::CONFLICT, "tenant"),
            // Passes by itself: the database comes back, a drain ends, a retry reopens a lease
            // that ended (or is told who holds it now), another replica serves when this one
            // shuts down.
            ErrorKind::Unavailable
            | ErrorKind::Busy
            | ErrorKind::LeaseEnded
            | ErrorKind::Closed
            | ErrorKind::Replica => (StatusCode::SERVICE_UNAVAILABLE, "retry"),
            // The ledger's own rules (the CHECK on memo): the request was wrong.
            ErrorKind::Database if error.sqlstate().is_some_and(|s| s.starts_with("23")) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "rejected")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        if status.is_server_error() {
            // The operator's story (what pgtenant was doing, the database's words); the client
            // gets its own below.
            eprintln!("{status}: {error}");
        }
        let mut body = json!({ "error": code, "message": for_the_client(&error) });
        if let Error::LeaseHeld {
            owner,
            owner_alive,
            owner_address,
            ..
        } = &error
        {
            body["owner"] = json!(owner);
            body["owner_alive"] = json!(owner_alive);
            body["owner_address"] = json!(owner_address);
        }
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
