//! A replica's registration and liveness (DESIGN §5 "Replica start", "Heartbeat"): register,
//! deregister, the liveness lock and its key, the heartbeat, and whether the data path allows
//! session fencing (`can_terminate_sessions`, asked at replica start).

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::credentials::Credentials;
use crate::db::setup::LOCK_NAMESPACE;
use crate::error::{Error, Result};
use crate::lease::Incarnation;
use crate::replica_id::ReplicaId;

/// `pgtenant.replica_lock_key`: the second key of the replica's liveness lock, fixed per
/// replica id by the control plane so every process of that id contends for the same lock.
pub(crate) async fn replica_lock_key(client: &Client, replica: &ReplicaId) -> Result<i32> {
    client
        .query_one("SELECT pgtenant.replica_lock_key($1)", &[replica])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("look up the replica's lock key"))
}

/// Tries the replica's session-level liveness lock: false when another session holds it (the
/// replica id is in use). Never waits, so a second process of one id is refused at once.
pub(crate) async fn try_liveness_lock(client: &Client, lock_key: i32) -> Result<bool> {
    client
        .query_one(
            "SELECT pg_try_advisory_lock($1, $2)",
            &[&LOCK_NAMESPACE, &lock_key],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("take the replica's liveness lock"))
}

/// Who holds a replica's liveness lock, for the error that refuses a second process of one
/// replica id.
pub(crate) struct LockHolder {
    /// The holder's backend.
    pub(crate) pid: i32,
    /// When its session started (database clock).
    pub(crate) since: Option<String>,
    /// The host it registered from.
    pub(crate) host: Option<String>,
}

/// The session holding the liveness lock `lock_key` of `replica_id`, if one still does (it may
/// have let go since the lock was refused).
pub(crate) async fn liveness_lock_holder(
    client: &Client,
    replica_id: &str,
    lock_key: i32,
) -> Result<Option<LockHolder>> {
    let holder = client
        .query_opt(
            "SELECT l.pid, a.backend_start::text, r.host
               FROM pg_locks l
               LEFT JOIN pg_stat_activity a ON a.pid = l.pid
               LEFT JOIN pgtenant.replica_status r ON r.replica_id = $3
              WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                AND l.classid = $1::integer::oid AND l.objid = $2::integer::oid
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              LIMIT 1",
            &[&LOCK_NAMESPACE, &lock_key, &replica_id],
        )
        .await
        .map_err(Error::db("identify the replica id's holder"))?;
    Ok(holder.map(|row| LockHolder {
        pid: row.get(0),
        since: row.get(1),
        host: row.get(2),
    }))
}

/// `pgtenant.register`: a new incarnation of `replica`, reached at `address`, of placement
/// `weight`, and its secret.
/// `PTS01` (the function's "not a session": a pooler in front) becomes [`Error::NotASession`]
/// with the server's message and hint, what the operator has to act on.
pub(crate) async fn register(
    client: &Client,
    replica: &ReplicaId,
    ttl_ms: i32,
    host: Option<&str>,
    address: Option<&str>,
    weight: f64,
) -> Result<(Incarnation, String)> {
    let (incarnation, secret): (i64, String) = client
        .query_one(
            "SELECT incarnation, secret FROM pgtenant.register($1, $2, $3, $4, $5)",
            &[replica, &ttl_ms, &host, &address, &weight],
        )
        .await
        .and_then(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .map_err(|e| match e.code().map(|c| c.code()) {
            Some("PTS01") => Error::NotASession(
                e.as_db_error()
                    .map(|db| format!("{} ({})", db.message(), db.hint().unwrap_or_default()))
                    .unwrap_or_default(),
            ),
            _ => Error::db("register the replica")(e),
        })?;
    Ok((Incarnation::new(incarnation), secret))
}

/// `pgtenant.declare_session_fencing`: before the incarnation serves anything, so its data
/// sessions may bind and takeovers of its tenants seal it first.
pub(crate) async fn declare_session_fencing(
    client: &Client,
    replica: &ReplicaId,
    incarnation: Incarnation,
    secret: &str,
) -> Result<()> {
    client
        .query_typed(
            "SELECT pgtenant.declare_session_fencing($1, $2, $3)",
            &[
                (replica, Type::TEXT),
                (&incarnation.get(), Type::INT8),
                (&secret, Type::TEXT),
            ],
        )
        .await
        .map(drop)
        .map_err(Error::db("declare session fencing"))
}

/// `pgtenant.deregister`: the incarnation marked released, so no one waits for its expiry,
/// and every lease it still holds released.
pub(crate) async fn deregister(
    client: &Client,
    replica: &ReplicaId,
    incarnation: Incarnation,
    secret: &str,
) -> Result<()> {
    client
        .query_typed(
            "SELECT pgtenant.deregister($1, $2, $3)",
            &[
                (replica, Type::TEXT),
                (&incarnation.get(), Type::INT8),
                (&secret, Type::TEXT),
            ],
        )
        .await
        .map(drop)
        .map_err(Error::db("deregister"))
}

/// `pgtenant.leave` (control plane V17): this incarnation stops being a home (weight 0), so
/// the other replicas stop moving tenants to it while it closes. False when the incarnation is
/// not the current one.
pub(crate) async fn leave(client: &Client, credentials: &Credentials) -> Result<bool> {
    // A pooled data session: read-only by default (G6), hence `call`'s read-write transaction.
    crate::db::call(
        client,
        "SELECT pgtenant.leave($1, $2, $3)",
        &[
            (&credentials.replica, Type::TEXT),
            (&credentials.incarnation.get(), Type::INT8),
            (&credentials.secret(), Type::TEXT),
        ],
    )
    .await
    .and_then(|rows| match rows.first() {
        Some(row) => row.try_get(0),
        None => Ok(false),
    })
    .map_err(Error::db("stop being a home"))
}

/// Frees the liveness lock now: a dropped connection frees it too, but only once the server
/// has processed the disconnect. Best effort (the session ends next anyway).
pub(crate) async fn advisory_unlock_all(client: &Client) {
    let _ = client
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await;
}

/// One heartbeat (`pgtenant.heartbeat`, V3). Typed parameters, so the call is one round trip
/// with no statement to prepare first.
const HEARTBEAT_SQL: &str = "SELECT pgtenant.heartbeat($1, $2, $3, $4)";

/// `pgtenant.heartbeat`: true when renewed for another `ttl_ms`, false when the incarnation
/// expired or was replaced.
pub(crate) async fn heartbeat(
    client: &Client,
    replica: &ReplicaId,
    incarnation: Incarnation,
    secret: &str,
    ttl_ms: i32,
) -> Result<bool> {
    client
        .query_typed_one(
            HEARTBEAT_SQL,
            &[
                (replica, Type::TEXT),
                (&incarnation.get(), Type::INT8),
                (&secret, Type::TEXT),
                (&ttl_ms, Type::INT4),
            ],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("heartbeat"))
}

/// `pgtenant.can_terminate_sessions`: why the control plane's owner may not terminate this
/// role's data sessions (None when it may), which session fencing needs to seal an owner.
pub(crate) async fn can_terminate_sessions(client: &Client) -> Result<Option<String>> {
    const CONTEXT: &str = "check the data path for session fencing";
    let row = client
        .query_typed_one("SELECT pgtenant.can_terminate_sessions()", &[])
        .await
        .map_err(Error::db(CONTEXT))?;
    row.try_get::<_, Option<String>>(0)
        .map_err(Error::db(CONTEXT))
}

/// Whether `replica` is alive (`pgtenant.replica_liveness`): None when it never registered.
pub(crate) async fn replica_liveness(client: &Client, replica: &ReplicaId) -> Result<Option<bool>> {
    client
        .query_typed_opt(
            "SELECT alive FROM pgtenant.replica_liveness WHERE replica_id = $1",
            &[(&replica, Type::TEXT)],
        )
        .await
        .and_then(|row| row.map(|row| row.try_get(0)).transpose())
        .map_err(Error::db("check a handoff target"))
}
