//! A tenant's life beyond a lease (DESIGN §5 "Forget (and restore)", "Tenant migrations"):
//! forget, restore, schema_migrated, quarantine, and the tenants a migration walks.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

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
    let rows = crate::db::call(
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
    let rows = crate::db::call_after(
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

/// `pgtenant.schema_migrated`: records the tenant's schema at `version` under this lease, with
/// what was applied.
pub(crate) async fn schema_migrated(
    tx: &Transaction<'_>,
    id: &TenantId,
    epoch: Epoch,
    credentials: &Credentials,
    version: SchemaVersion,
    applied: &str,
) -> Result<(), tokio_postgres::Error> {
    let (epoch, incarnation) = (epoch.get(), credentials.incarnation.get());
    tx.query_typed(
        "SELECT pgtenant.schema_migrated($1, $2, $3, $4, $5, $6, $7)",
        &[
            (&id.key(), Type::TEXT),
            (&epoch, Type::INT8),
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&credentials.secret(), Type::TEXT),
            (&version, Type::INT4),
            (&applied, Type::TEXT),
        ],
    )
    .await
    .map(drop)
}

/// `pgtenant.quarantine`: sets the tenant aside with its cause and repair (which also ends the
/// lease at `epoch`; None for a creation that rolled back whole).
pub(crate) async fn quarantine(
    client: &Client,
    id: &TenantId,
    epoch: Option<Epoch>,
    credentials: &Credentials,
    cause: &str,
    repair: &str,
) -> Result<(), tokio_postgres::Error> {
    let (key, organization, ledger, secret) = (
        id.key(),
        id.organization(),
        id.ledger(),
        credentials.secret(),
    );
    let (epoch, incarnation) = (epoch.map(Epoch::get), credentials.incarnation.get());
    crate::db::call(
        client,
        "SELECT pgtenant.quarantine($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            (&key, Type::TEXT),
            (&organization, Type::TEXT),
            (&ledger, Type::TEXT),
            (&epoch, Type::INT8),
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&cause, Type::TEXT),
            (&repair, Type::TEXT),
        ],
    )
    .await
    .map(drop)
}

/// The tenants whose schema is behind `code` (live, not quarantined), in key order: what
/// `migrate_all` walks.
pub(crate) async fn behind(
    client: &Client,
    code: SchemaVersion,
) -> Result<Vec<(String, SchemaVersion)>, tokio_postgres::Error> {
    client
        .query(
            "SELECT key, schema_version FROM pgtenant.tenants
              WHERE schema_name IS NOT NULL AND quarantine_cause IS NULL AND schema_version < $1
              ORDER BY key",
            &[&code],
        )
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}
