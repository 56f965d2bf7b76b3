//! Forwarding: a request that reached a replica which does not serve its tenant is sent to the
//! replica that does ([`pgtenant::Route::There`]), once, and its answer is relayed.
//!
//! Why it is safe, and why it is this shape:
//!
//! - **One hop.** The replica that receives a request decides with [`pgtenant::Router::route`]
//!   and sends it to the owner's registered address, adding [`FORWARDED`] (this replica's id).
//!   The owner decides with [`pgtenant::Router::route_forwarded`]: it serves the request when it
//!   holds the tenant or the tenant is free (whatever placement says its home is), so two
//!   replicas whose views differ for an instant cannot send a request back and forth.
//! - **Loop guard.** A request that already carries [`FORWARDED`] is never forwarded again:
//!   when its tenant moved on meanwhile, the answer is 409 naming the new owner (the client, or
//!   its load balancer, sends it there).
//! - **Never executed twice, never executed by a replica without the lease.** The replica that
//!   forwards a request runs nothing of it, whatever happens to the forwarded copy: the replica
//!   it reaches serves it only under its own lease (a commit after that lease moved is refused
//!   by PostgreSQL), or refuses it. If the owner cannot be reached (refused connection, or
//!   no connection within [`CONNECT_TIMEOUT`]), nothing was sent, so the answer is 503 with
//!   `Retry-After: 1` and the request ran nowhere. If the connection breaks, or no answer
//!   comes within [`ANSWER_TIMEOUT`], after the request was sent, the owner may have run it:
//!   the answer (502 or 504) says so rather than suggesting a blind retry.
//!
//! The response carries [`SERVED_BY`], set by the replica that ran the request and relayed as
//! it is, so a client (and the tests) can see where it ran. Plain HTTP/1.1 through hyper's
//! client: the replicas of this example talk to each other over `http://` addresses only.

use std::error::Error as StdError;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{self, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use pgtenant::{ReplicaId, TenantId};
use serde_json::json;

/// Set on a request one replica forwards to another, to the forwarding replica's id: the
/// receiving replica decides with `route_forwarded` and never forwards it again.
pub(crate) const FORWARDED: HeaderName = HeaderName::from_static("x-pgtenant-forwarded");

/// Set on every response of a per-tenant route that a replica served (ran under its lease),
/// to that replica's id; relayed unchanged when the request was forwarded.
pub(crate) const SERVED_BY: HeaderName = HeaderName::from_static("x-pgtenant-served-by");

/// A client's idempotency key travels with the request it belongs to.
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The request headers that are sent on: what the owner needs to read the request the same
/// way. Hop-by-hop headers (`Connection`, `Host`, …) are the HTTP client's own.
const REQUEST_HEADERS: [HeaderName; 3] = [header::CONTENT_TYPE, header::ACCEPT, IDEMPOTENCY_KEY];

/// The response headers that are relayed back.
const RESPONSE_HEADERS: [HeaderName; 3] = [header::CONTENT_TYPE, header::RETRY_AFTER, SERVED_BY];

/// How long to wait for a connection to the owner: past it the owner is unreachable (503, the
/// request ran nowhere).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long to wait for the owner's whole answer once connected. Generous: the owner may be
/// opening the tenant (migrations included) or running long work; past it the outcome is
/// unknown (504).
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest request body that is forwarded (axum's default limit for the extractors that
/// would read it here).
const MAX_BODY: usize = 2 * 1024 * 1024;

/// Sends requests on to the replica that serves their tenant. Cheap to clone (the connection
/// pool is shared).
#[derive(Clone)]
pub(crate) struct Forwarder {
    client: Client<HttpConnector, Full<Bytes>>,
    /// This replica's id, as [`FORWARDED`] and [`SERVED_BY`] carry it.
    replica: HeaderValue,
}

/// Why a request was not relayed.
pub(crate) enum ForwardError {
    /// The owner's address is not an `http://` URL this client can send to: the caller answers
    /// 409 naming the owner, as without an address.
    NotForwardable,
    /// The request body could not be read (or is larger than [`MAX_BODY`]): nothing was sent.
    Body {
        /// 413 or 400.
        status: StatusCode,
        /// What happened.
        reason: String,
    },
    /// No connection to the owner: nothing was sent, the request ran nowhere.
    Unreachable(String),
    /// The request was sent but no (whole) answer came back: it may have run at the owner.
    NoAnswer {
        /// 502 (the connection broke) or 504 (no answer in time).
        status: StatusCode,
        /// What happened.
        reason: String,
    },
}

impl Forwarder {
    pub(crate) fn new(replica: &ReplicaId) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Forwarder {
            client,
            // A replica id is ASCII letters, digits and `.`, `_`, `:`, `-`: always a valid
            // header value; the fallback only keeps this free of a panic path.
            replica: HeaderValue::from_str(replica.as_str())
                .unwrap_or_else(|_| HeaderValue::from_static("invalid-replica-id")),
        }
    }

    /// This replica's id as a header value, for [`SERVED_BY`].
    pub(crate) fn replica(&self) -> HeaderValue {
        self.replica.clone()
    }

    /// Sends `request` to `address` (a base URL such as `http://10.0.0.3:8080`) once, with the
    /// same method, path, query, body and the [`REQUEST_HEADERS`], marked [`FORWARDED`]; returns
    /// the owner's answer (status, body and [`RESPONSE_HEADERS`]), whatever its status.
    pub(crate) async fn forward(
        &self,
        address: &str,
        request: Request,
    ) -> Result<Response, ForwardError> {
        let target = target_uri(address, &request).ok_or(ForwardError::NotForwardable)?;
        let (parts, body) = request.into_parts();
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|length| length.to_str().ok()?.parse::<usize>().ok());
        if declared.is_some_and(|length| length > MAX_BODY) {
            return Err(too_large());
        }
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(body) => body.to_bytes(),
            Err(error) if error.is::<LengthLimitError>() => return Err(too_large()),
            Err(error) => {
                return Err(ForwardError::Body {
                    status: StatusCode::BAD_REQUEST,
                    reason: format!("the request body could not be read: {error}"),
                })
            }
        };
        let outgoing = self.outgoing(parts.method, target, &parts.headers, body);
        let forwarded = self.client.request(outgoing);
        let exchange = async {
            let answer = forwarded.await.map_err(|error| {
                if error.is_connect() {
                    ForwardError::Unreachable(cause(&error))
                } else {
                    ForwardError::NoAnswer {
                        status: StatusCode::BAD_GATEWAY,
                        reason: cause(&error),
                    }
                }
            })?;
            let (head, body) = answer.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|error| ForwardError::NoAnswer {
                    status: StatusCode::BAD_GATEWAY,
                    reason: format!("the answer broke off: {}", cause(&error)),
                })?
                .to_bytes();
            let mut relayed = Response::new(Body::from(body));
            *relayed.status_mut() = head.status;
            for name in RESPONSE_HEADERS {
                if let Some(value) = head.headers.get(&name) {
                    relayed.headers_mut().insert(name, value.clone());
                }
            }
            Ok(relayed)
        };
        tokio::time::timeout(ANSWER_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(ForwardError::NoAnswer {
                    status: StatusCode::GATEWAY_TIMEOUT,
                    reason: format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()),
                })
            })
    }

    /// The request as the owner receives it.
    fn outgoing(
        &self,
        method: Method,
        target: Uri,
        headers: &axum::http::HeaderMap,
        body: Bytes,
    ) -> axum::http::Request<Full<Bytes>> {
        let mut request = axum::http::Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = target;
        for name in REQUEST_HEADERS {
            if let Some(value) = headers.get(&name) {
                request.headers_mut().insert(name, value.clone());
            }
        }
        request
            .headers_mut()
            .insert(FORWARDED, self.replica.clone());
        request
    }
}

/// `address` + the request's path and query, when `address` is an `http://` URL.
fn target_uri(address: &str, request: &Request) -> Option<Uri> {
    let base = address.trim_end_matches('/');
    if !base
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
    {
        return None;
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    let uri: Uri = format!("{base}{path}").parse().ok()?;
    uri.authority()?;
    Some(uri)
}

fn too_large() -> ForwardError {
    ForwardError::Body {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        reason: format!(
            "the request body is larger than {} MiB",
            MAX_BODY / 1024 / 1024
        ),
    }
}

/// The innermost cause, which says what actually happened ("Connection refused (os error
/// 111)"); the outer layers only say which layer it went through.
fn cause(error: &(dyn StdError + 'static)) -> String {
    let mut innermost = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    innermost.to_string()
}

/// A forwarding failure as the HTTP client sees it: the tenant, its owner, and what happened
/// to the request.
pub(crate) fn failure_response(
    failure: ForwardError,
    tenant: &TenantId,
    owner: &ReplicaId,
    address: &str,
) -> Response {
    let (status, code, message) = match failure {
        ForwardError::NotForwardable => (
            StatusCode::CONFLICT,
            "held",
            format!(
                "tenant {tenant} is served by replica {owner} at {address}: send the request \
                 there"
            ),
        ),
        ForwardError::Body { status, reason } => (status, "invalid_input", reason),
        ForwardError::Unreachable(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_unreachable",
            format!(
                "tenant {tenant} is served by replica {owner} at {address}, which this replica \
                 could not reach ({reason}); the request was not run anywhere: retry in a second"
            ),
        ),
        ForwardError::NoAnswer { status, reason } => (
            status,
            "owner_no_answer",
            format!(
                "tenant {tenant} is served by replica {owner} at {address}; the request was sent \
                 there but no answer came back ({reason}): it may have run, check before sending \
                 it again"
            ),
        ),
    };
    if status.is_server_error() {
        eprintln!(
            "{status}: forwarding a request for tenant {tenant} to {owner} at {address}: {message}"
        );
    }
    let body = json!({
        "error": code,
        "message": message,
        "owner": owner,
        "owner_address": address,
    });
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
