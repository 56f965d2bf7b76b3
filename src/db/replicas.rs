//! A replica's registration and liveness (DESIGN §5 "Replica start", "Heartbeat"): register,
//! deregister, the liveness lock's key, the heartbeat, whether a replica is alive.

/// Whether `replica` is alive (`pgtenant.replica_liveness`): None when it never registered.
pub(crate) async fn replica_liveness(
    client: &tokio_postgres::Client,
    replica: &crate::replica_id::ReplicaId,
) -> crate::error::Result<Option<bool>> {
    client
        .query_typed_opt(
            "SELECT alive FROM pgtenant.replica_liveness WHERE replica_id = $1",
            &[(&replica, tokio_postgres::types::Type::TEXT)],
        )
        .await
        .and_then(|row| row.map(|row| row.try_get(0)).transpose())
        .map_err(crate::error::Error::db("check a handoff target"))
}
