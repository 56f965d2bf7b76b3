//! SQL by hand: a plain session (no router) and the SQLSTATE of its errors, and the control
//! plane's calls as a lease session of this release would send them (taking a replica's
//! liveness lock, registering an incarnation).

/// A plain session on `url`, its connection driven on a task of its own.
pub(crate) async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// The SQLSTATE of a statement's error, when the server sent one.
pub(crate) fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(|code| code.code())
}

/// Takes replica `replica`'s liveness lock on this session, as a lease session does.
pub(crate) async fn take_liveness_lock(client: &tokio_postgres::Client, replica: &str) {
    let locked: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock(pgtenant.lock_namespace(), pgtenant.replica_lock_key($1))",
            &[&replica],
        )
        .await
        .expect("take the liveness lock")
        .get(0);
    assert!(locked, "the liveness lock of {replica} is free");
}

/// Registers `replica` by hand on this session (its liveness lock first), as a lease session
/// of this release does: (incarnation, secret), with a 60 s ttl.
pub(crate) async fn register_by_hand(
    client: &tokio_postgres::Client,
    replica: &str,
) -> (i64, String) {
    take_liveness_lock(client, replica).await;
    let row = client
        .query_one(
            "SELECT incarnation, secret FROM pgtenant.register($1, 60000, NULL)",
            &[&replica],
        )
        .await
        .expect("register");
    (row.get(0), row.get(1))
}
