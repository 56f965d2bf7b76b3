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
//! | `PUT /tenants/{org}/{ledger}/recurring/{name}` | a recurring entry (`{"memo": "…", "amount": -5, "every_ms": 60000}`): an alarm |
//! | `DELETE /tenants/{org}/{ledger}/recurring/{name}` | stop it (cancel its alarm) |
//! | `POST /tenants/{org}/{ledger}/handoff[?to=replica]` | hand the tenant off (to one replica) |
//! | `GET /health` | [`Router::summary`]; 503 while the replica does not serve |
//! | `GET /metrics` | pgtenant's metrics in Prometheus' text format |
//!
//! Every route under `/tenants/{org}/{ledger}` except `GET` (a control-plane read, answered by
//! any replica) and `handoff` (asked of the owner itself) decides where it runs with
//! [`Router::route`]: here when this replica serves the tenant (opening it when it is free),
//! or at the replica that holds it. Such a request is forwarded once to the owner's registered
//! address and the owner's answer is relayed (`src/forward.rs` says why this is safe: one hop,
//! a loop guard, nothing runs twice); every response a replica served carries
//! `x-pgtenant-served-by: <replica id>`. A request that was already forwarded
//! (`x-pgtenant-forwarded`) is not forwarded again: when its tenant moved on meanwhile, the
//! answer is 409 with the owner, as it is when the owner registered no `http://` address. An
//! owner that cannot be reached is a 503 with `Retry-After`, and the request ran nowhere.
//!
//! With placement on (`PLACEMENT=1`, [`RouterOptions::placement`]) each tenant has a home
//! replica: a request for a tenant nobody serves is forwarded to its home, and rebalancing
//! moves tenants there. Errors map to statuses by [`pgtenant::Error::kind`]: 503 with
//! `Retry-After` for everything that passes by itself. Bodies speak to the HTTP client (what
//! happened to its request, what to do); the full error, for the operator, goes to the log
//! (standard error).
//!
//! One error type, `ApiError`, with one conversion from pgtenant (`From<pgtenant::Error>`):
//! every pgtenant call returns [`pgtenant::Error`], the statements run through a handle too.
//!
//! A **recurring entry** (a subscription fee, say) is a tenant alarm ([`pgtenant::Tx::schedule_alarm`],
//! issue #31): `PUT …/recurring/{name}` schedules alarm `recurring:{name}`, and the router's
//! alarm handler ([`router_options`]) adds the entry and schedules the next one, in one fenced
//! transaction of the tenant that also deletes the alarm that fired: each period's entry
//! commits exactly once, by whichever replica holds the tenant then (it moves with the
//! tenant; a tenant nobody holds is woken for it).
//!
//! [`serve`] runs the service until its shutdown future resolves, then stops accepting
//! connections, lets the requests in flight finish, and only then closes the router, which
//! hands every tenant off so that other replicas take them over at once.
#![deny(missing_docs)]

mod forward;

use std::future::Future;
use std::time::{Duration, SystemTime};

use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Json;
use forward::{Forwarder, FORWARDED, SERVED_BY};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use pgtenant::{
    ActiveWork, CloseReport, Error, ErrorKind, ReplicaId, Route, Router, RouterOptions,
    TenantHandle, TenantId,
};
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
    Ok(RouterOptions::from_url(replica_id, database_url)?
        .tenant_migrations(TENANT_MIGRATIONS)?
        .alarm_handler(|tx, alarm| {
            Box::pin(async move {
                if !alarm.name.starts_with(RECURRING) {
                    // Parked after its attempts: `pgtenant alarms failed` shows it.
                    return Err(format!("no handler for alarm {:?}", alarm.name).into());
                }
                let every: Recurring = alarm.payload()?;
                tx.execute(
                    "INSERT INTO entries (memo, amount) VALUES ($1, $2)",
                    &[&every.memo, &every.amount],
                )
                .await?;
                // The next period, in the same transaction: it commits with this entry, or
                // neither does. From the due time, not from now, so periods do not drift; a
                // tenant that was unserved for a while catches up one period at a time.
                let next = alarm.due + Duration::from_millis(every.every_ms);
                tx.schedule_alarm(&alarm.name, next, &every).await?;
                Ok(())
            })
        }))
}

/// The prefix of a recurring entry's alarm name.
const RECURRING: &str = "recurring:";

/// A recurring entry, the payload of its alarm.
#[derive(Debug, Serialize, Deserialize)]
struct Recurring {
    memo: String,
    amount: i64,
    every_ms: u64,
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
    let forwarder = Forwarder::new(router.replica_id());
    // Router is a cheap handle (an Arc inside): every request gets a clone.
    let app = App {
        router,
        metrics,
        forwarder,
    };
    // Each per-tenant handler runs behind `routed`: here with the tenant's handle, or
    // forwarded to its owner. `create` opens a tenant that does not exist yet.
    let existing = |handler: MethodRouter<App>| {
        handler.route_layer(from_fn_with_state(app.clone(), route_existing))
    };
    let creating = |handler: MethodRouter<App>| {
        handler.route_layer(from_fn_with_state(app.clone(), route_or_create))
    };
    axum::Router::new()
        .route(
            "/tenants/{org}/{ledger}",
            creating(post(create))
                .merge(get(status))
                .merge(existing(delete(forget))),
        )
        .route(
            "/tenants/{org}/{ledger}/entries",
            existing(post(add_entry)).merge(existing(get(entries))),
        )
        .route(
            "/tenants/{org}/{ledger}/entries/batch",
            existing(post(add_entries)),
        )
        .route(
            "/tenants/{org}/{ledger}/recurring/{name}",
            existing(put(set_recurring)).merge(existing(delete(stop_recurring))),
        )
        .route("/tenants/{org}/{ledger}/handoff", post(handoff))
        .route("/health", get(health))
        .route("/metrics", get(render_metrics))
        .with_state(app)
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
    forwarder: Forwarder,
}

/// The tenant's handle, for a handler behind [`routed`]: the request runs here, under this
/// replica's lease.
#[derive(Clone)]
struct Served(TenantHandle);

impl<S: Send + Sync> FromRequestParts<S> for Served {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        parts.extensions.remove::<Served>().ok_or_else(|| {
            // A handler mounted without `routed`: the service's own bug, not the client's.
            eprintln!("500: {} {} has no routed tenant", parts.method, parts.uri);
            let body = json!({ "error": "internal", "message": "internal error" });
            (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response()
        })
    }
}

async fn route_existing(
    State(app): State<App>,
    Tenant(id): Tenant,
    request: Request,
    next: Next,
) -> Response {
    routed(app, id, false, request, next).await
}

async fn route_or_create(
    State(app): State<App>,
    Tenant(id): Tenant,
    request: Request,
    next: Next,
) -> Response {
    routed(app, id, true, request, next).await
}

/// Where a per-tenant request runs: here (the handler gets [`Served`] and the response
/// `x-pgtenant-served-by`), or at the replica that holds the tenant, forwarded once
/// (`forward.rs`). A request that was already forwarded is never forwarded again.
async fn routed(app: App, id: TenantId, create: bool, request: Request, next: Next) -> Response {
    let forwarded_by = request
        .headers()
        .get(FORWARDED)
        .map(|by| String::from_utf8_lossy(by.as_bytes()).into_owned());
    let route = if forwarded_by.is_some() {
        app.router.route_forwarded(&id, create).await
    } else {
        app.router.route(&id, create).await
    };
    match route {
        Err(error) => ApiError::from(error).into_response(),
        Ok(Route::Here(tenant)) => {
            let mut request = request;
            request.extensions_mut().insert(Served(tenant));
            let mut response = next.run(request).await;
            response
                .headers_mut()
                .insert(SERVED_BY, app.forwarder.replica());
            response
        }
        Ok(Route::There { owner, address, .. }) => match forwarded_by {
            // The loop guard: one hop only. The tenant moved on after the replica that
            // forwarded this looked; the client goes to the new owner itself.
            Some(forwarded_by) => ApiError::HeldElsewhere {
                tenant: id,
                owner,
                address,
                forwarded_by,
            }
            .into_response(),
            None => match app.forwarder.forward(&address, request).await {
                Ok(answer) => answer,
                Err(failure) => forward::failure_response(failure, &id, &owner, &address),
            },
        },
    }
}

/// The `{org}/{ledger}` of a route, by name (a route may have more parameters).
#[derive(Deserialize)]
struct TenantPath {
    org: String,
    ledger: String,
}

/// The `{name}` of a recurring entry's route.
#[derive(Deserialize)]
struct RecurringPath {
    name: String,
}

/// The `{org}/{ledger}` of a route, validated before any handler runs.
struct Tenant(TenantId);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Path(path) = Path::<TenantPath>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        TenantId::new(&path.org, &path.ledger)
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

async fn create(State(app): State<App>, Served(tenant): Served) -> Json<Value> {
    Json(json!({
        "tenant": tenant.id(),
        "epoch": tenant.epoch(),
        "schema": tenant.schema(),
        "replica": app.router.replica_id(),
    }))
}

async fn status(
    State(app): State<App>,
    Tenant(id): Tenant,
) -> Result<Json<pgtenant::TenantStatus>, ApiError> {
    Ok(Json(app.router.status(&id).await?))
}

/// One entry, through `run`: the work is a closure, and it borrows the request body.
async fn add_entry(
    // Routed here: serving it already was a map lookup; otherwise `routed` acquired the lease.
    Served(tenant): Served,
    Json(entry): Json<NewEntry>,
) -> Result<(StatusCode, Json<Entry>), ApiError> {
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
    Served(tenant): Served,
    Json(batch): Json<Vec<NewEntry>>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
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

async fn entries(State(app): State<App>, Served(tenant): Served) -> Result<Json<Value>, ApiError> {
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
        "tenant": tenant.id(),
        "replica": app.router.replica_id(),
        "epoch": tenant.epoch(),
        "balance": balance,
        "entries": entries,
    })))
}

/// The longest name of a recurring entry, in bytes (its alarm's name is at most 200).
const MAX_RECURRING_NAME: usize = 100;

/// Starts (or replaces) recurring entry `name`: the first one a period from now.
async fn set_recurring(
    Served(tenant): Served,
    Path(RecurringPath { name }): Path<RecurringPath>,
    Json(every): Json<Recurring>,
) -> Result<Json<Value>, ApiError> {
    if name.is_empty() || name.len() > MAX_RECURRING_NAME || every.every_ms < 100 {
        return Err(ApiError::BadRecurring(format!(
            "a recurring entry has a name of 1 to {MAX_RECURRING_NAME} bytes and a period \
             (every_ms) of at least 100 ms; this one: {} bytes, {} ms",
            name.len(),
            every.every_ms
        )));
    }
    let first = SystemTime::now() + Duration::from_millis(every.every_ms);
    let alarm = format!("{RECURRING}{name}");
    let every = &every;
    tenant
        .run(|tx| {
            Box::pin(async move {
                // Inside the work: had this transaction rolled back, no alarm would exist.
                tx.schedule_alarm(&alarm, first, every).await?;
                Ok::<_, Error>(())
            })
        })
        .await?;
    Ok(Json(
        json!({ "tenant": tenant.id(), "recurring": name, "every_ms": every.every_ms }),
    ))
}

/// Stops recurring entry `name`; 404 when there is none.
async fn stop_recurring(
    Served(tenant): Served,
    Path(RecurringPath { name }): Path<RecurringPath>,
) -> Result<Json<Value>, ApiError> {
    let alarm = format!("{RECURRING}{name}");
    let alarm = &alarm;
    let stopped = tenant
        .run(|tx| Box::pin(async move { tx.cancel_alarm(alarm).await }))
        .await?;
    if !stopped {
        return Err(ApiError::NoRecurring(name));
    }
    Ok(Json(json!({ "tenant": tenant.id(), "stopped": name })))
}

#[derive(Deserialize)]
struct HandoffTarget {
    /// Checked as it is parsed: a bad replica id is a 400 naming the rule.
    to: Option<ReplicaId>,
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

async fn forget(Served(tenant): Served) -> Result<Json<Value>, ApiError> {
    // Drain: requests already running on the tenant finish first; new ones are refused.
    let trash = tenant.forget(ActiveWork::Drain).await?;
    Ok(Json(
        json!({ "tenant": tenant.id(), "trash_schema": trash }),
    ))
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
    /// A recurring entry out of range.
    BadRecurring(String),
    /// No recurring entry of that name.
    NoRecurring(String),
    /// A handoff asked of a replica that does not hold the tenant.
    NotServedHere {
        /// The tenant.
        tenant: TenantId,
        /// This replica.
        replica: String,
    },
    /// A request another replica forwarded here, for a tenant a third one holds (or is
    /// reserved for): not forwarded twice.
    HeldElsewhere {
        /// The tenant.
        tenant: TenantId,
        /// The replica that holds it.
        owner: ReplicaId,
        /// Where it is reached.
        address: String,
        /// The replica that forwarded the request here.
        forwarded_by: String,
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
            ApiError::BadRecurring(message) => {
                let body = json!({ "error": "invalid_input", "message": message });
                return (StatusCode::BAD_REQUEST, Json(body)).into_response();
            }
            ApiError::NoRecurring(name) => {
                let message = format!("no recurring entry named {name:?} on this tenant");
                let body = json!({ "error": "not_found", "message": message });
                return (StatusCode::NOT_FOUND, Json(body)).into_response();
            }
            ApiError::NotServedHere { tenant, replica } => {
                let message = format!(
                    "replica {replica} does not serve tenant {tenant}: ask its owner \
                     (GET /tenants/{tenant} names it)"
                );
                let body = json!({ "error": "not_served_here", "message": message });
                return (StatusCode::CONFLICT, Json(body)).into_response();
            }
            ApiError::HeldElsewhere {
                tenant,
                owner,
                address,
                forwarded_by,
            } => {
                let message = format!(
                    "tenant {tenant} is served by replica {owner} at {address}: send the request                      there (replica {forwarded_by} already forwarded it here once, and a request                      is forwarded only once)"
                );
                let body = json!({
                    "error": "held",
                    "message": message,
                    "owner": owner,
                    "owner_address": address,
                });
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
