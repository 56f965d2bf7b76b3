//! Citus's SQL (DESIGN §9): whether the database has Citus, keeping the control plane local to
//! the coordinator, and whether a new tenant schema is distributed. What each is for is in
//! `src/citus.rs`.

use tokio_postgres::{GenericClient, Transaction};

use crate::error::{Error, Result};

/// Whether the database has the Citus extension (the coordinator of a cluster, or a single-node
/// Citus).
pub(crate) async fn present(client: &impl GenericClient) -> Result<bool> {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("look for the citus extension"))
}

/// For the rest of the current transaction: nothing created is distributed or propagated to the
/// workers. Run only where Citus is present (the settings exist only then).
const KEEP_LOCAL_SQL: &str = "SELECT set_config('citus.enable_schema_based_sharding', 'off', true),
            set_config('citus.enable_ddl_propagation', 'off', true)";

/// `$1` ('on' or 'off'): whether the schema the current transaction creates next is a
/// distributed schema. Run only where Citus is present.
const SHARDING_SQL: &str = "SELECT set_config('citus.enable_schema_based_sharding', $1, true)";

/// Undoes a control plane that an earlier setup (or an operator) left distributed: a
/// distributed schema is undistributed, and any Citus table left in it turned back into a
/// local one. Runs in setup's transaction, before [`KEEP_LOCAL_SQL`], on Citus only.
pub(crate) async fn localize_control_plane(client: &impl GenericClient) -> Result<()> {
    let distributed: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_schema WHERE schemaid::regnamespace::text = 'pgtenant')",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("check whether the control plane is a distributed schema"))?;
    if distributed {
        tracing::warn!(
            "the control plane was a distributed schema: making it local to the coordinator"
        );
        client
            .execute("SELECT citus_schema_undistribute('pgtenant')", &[])
            .await
            .map_err(Error::db("undistribute the control plane's schema"))?;
    }
    let context = "look for Citus tables in the control plane";
    let tables = client
        .query(
            "SELECT logicalrelid::regclass::text FROM pg_dist_partition
              WHERE logicalrelid::regclass::text LIKE 'pgtenant.%'",
            &[],
        )
        .await
        .map_err(Error::db(context))?
        .iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::db(context))?;
    for table in tables {
        tracing::warn!(%table, "a control-plane table was a Citus table: making it local");
        client
            .execute(
                "SELECT undistribute_table($1::regclass, cascade_via_foreign_keys => true)",
                &[&table],
            )
            .await
            .map_err(Error::db("undistribute a control-plane table"))?;
    }
    Ok(())
}

/// For the rest of `tx`: nothing created is distributed or propagated to the workers
/// ([`KEEP_LOCAL_SQL`]). Citus only.
pub(crate) async fn keep_local(tx: &Transaction<'_>) -> Result<()> {
    tx.batch_execute(KEEP_LOCAL_SQL).await.map_err(Error::db(
        "keep the control plane local to the Citus coordinator",
    ))
}

/// Whether the schema `tx` creates next is a distributed schema (`sharding`: 'on' or 'off',
/// [`SHARDING_SQL`]). Citus only.
pub(crate) async fn set_sharding(
    tx: &Transaction<'_>,
    sharding: &str,
) -> std::result::Result<(), tokio_postgres::Error> {
    tx.execute(SHARDING_SQL, &[&sharding]).await.map(drop)
}
