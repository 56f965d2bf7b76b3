//! A tenant's life beyond a lease (DESIGN §5 "Forget (and restore)", "Tenant migrations"):
//! forget, restore, schema_migrated, quarantine, and the tenants a migration walks.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::credentials::Credentials;
use crate::db::sessions::Seal;
use crate::id::TenantId;
use crate::lease::Epoch;
use crate::schema_version::SchemaVersion;

/// `pgtenant.forget`: moves the tenant's schema to the trash under this lease; the trash name.
pub(crate) async fn forget(
    client: &Client,
    id: &TenantId,
    epoch: Epoch,
    credentials: &Credentials,
) -> Result<String, tokio_postgres::Error> {
    let (key, secret, epoch) = (id.key(), credentials.secret(), epoch.get());
    let incarnation = credentials.incarnation.get();
    let rows = super::call(
        client,
        "SELECT pgtenant.forget($1, $2, $3, $4, $5)",
        &[
            (&key, Type::TEXT),
            (&epoch, Type::INT8),
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
        ],
    )
    .await?;
    match rows.first() {
        Some(row) => row.try_get::<_, String>(0),
        None => Ok(String::new()),
    }
}

/// The epoch a restore of `id` will bump to (`pgtenant.next_epoch`, V4: above every epoch of
/// an older timeline); None for a tenant never created.
pub(crate) async fn next_epoch(
    client: &Client,
    id: &TenantId,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT pgtenant.next_epoch(epoch) FROM pgtenant.tenants WHERE key = $1",
            &[&id.key()],
        )
        .await?;
    row.map(|row| row.try_get(0)).transpose()
}

/// `pgtenant.restore`, behind the seal of the tenant's dead owner in the same transaction:
/// the new life (epoch, schema, schema version, lock key) under the name `schema`.
pub(crate) async fn restore(
    client: &Client,
    id: &TenantId,
    credentials: &Credentials,
    schema: &str,
) -> Result<Option<(Epoch, String, SchemaVersion, i32)>, tokio_postgres::Error> {
    let (key, secret) = (id.key(), credentials.secret());
    let incarnation = credentials.incarnation.get();
    let seal = Seal::new(key, credentials);
    let rows = super::call_after(
        client,
        (Seal::SQL, &seal.params()),
        "SELECT epoch, schema_name, schema_version, lock_key \
           FROM pgtenant.restore($1, $2, $3, $4, $5)",
        &[
            (&key, Type::TEXT),
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&schema, Type::TEXT),
        ],
    )
    .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    Ok(Some((
        Epoch::new(row.try_get(0)?),
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    )))
}
