//! Setup's SQL (DESIGN §4): the setup lock, role checks and grants, the control plane's version.

use tokio_postgres::{Client, GenericClient, Transaction};

use crate::error::{Error, Result};

/// First key of every pgtenant advisory lock (`pgtenant.lock_namespace()`): "pgt1".
pub(crate) const LOCK_NAMESPACE: i32 = 0x7067_7431;

/// Second key of the advisory lock that serialises control-plane setups. Replica liveness locks
/// use keys from 1 up (`pgtenant.replicas.lock_key`), so 0 is free for this.
const SETUP_LOCK_KEY: i32 = 0;

/// Where refinery records the control plane's applied migrations (setup's runner writes it,
/// [`read_version`] reads it).
pub(crate) const HISTORY_TABLE: &str = "pgtenant.refinery_schema_history";

/// Takes the setup lock for the rest of `transaction`: concurrent setups wait for each other
/// instead of racing through the same migrations.
pub(crate) async fn setup_lock(transaction: &Transaction<'_>) -> Result<()> {
    transaction
        .execute(
            "SELECT pg_advisory_xact_lock($1, $2)",
            &[&LOCK_NAMESPACE, &SETUP_LOCK_KEY],
        )
        .await
        .map(drop)
        .map_err(Error::db("take the control-plane setup lock"))
}

/// Whether `role` exists: setup grants only to roles made beforehand, and says so before
/// anything changes.
pub(crate) async fn role_exists(client: &Client, role: &str) -> Result<bool> {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)",
            &[&role],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("look up a role"))
}

/// Whether the role running setup (the control plane's owner) can act as `app`: `forget` and
/// `restore` rename the application's tenant schemas as that owner.
pub(crate) async fn owner_can_act_as(client: &Client, app: &str) -> Result<bool> {
    client
        .query_one(
            "SELECT rolsuper OR pg_has_role(current_user, $1::text::name, 'MEMBER')
               FROM pg_roles WHERE rolname = current_user",
            &[&app],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("check the control plane's owner"))
}

/// Creates the control plane's schema, if missing, before the migrations fill it.
pub(crate) async fn create_schema(transaction: &Transaction<'_>) -> Result<()> {
    transaction
        .batch_execute("CREATE SCHEMA IF NOT EXISTS pgtenant")
        .await
        .map_err(Error::db("create schema pgtenant"))
}

/// `pgtenant.grant_roles`: the one place the roles' privileges are decided (DESIGN G8), in
/// setup's transaction.
pub(crate) async fn grant_roles(
    transaction: &Transaction<'_>,
    app_role: Option<&str>,
    operator_role: Option<&str>,
) -> Result<()> {
    transaction
        .execute(
            "SELECT pgtenant.grant_roles($1::text::name, $2::text::name)",
            &[&app_role, &operator_role],
        )
        .await
        .map(drop)
        .map_err(Error::db("grant the application and operator roles"))
}

/// Whether `app` may create schemas in this database: a GRANT its grantor may not give is
/// only a warning, so setup checks that it took effect.
pub(crate) async fn has_database_privilege(
    transaction: &Transaction<'_>,
    app: &str,
) -> Result<bool> {
    transaction
        .query_one(
            "SELECT has_database_privilege($1::text, current_database(), 'CREATE')",
            &[&app],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("check the application role's grants"))
}

/// The control plane's version on any client (a transaction too): 0 when it has none. The
/// history table is looked up first, so a database without a control plane is no error.
pub(crate) async fn read_version(client: &impl GenericClient) -> Result<i64> {
    let context = "read the control-plane version";
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY_TABLE])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db(context))?;
    if !exists {
        return Ok(0);
    }
    client
        .query_one(
            "SELECT coalesce(max(version), 0)::bigint FROM pgtenant.refinery_schema_history",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db(context))
}
