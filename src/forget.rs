//! Forget and restore (DESIGN §5 "Forget"): a tenant's schema goes to the trash with a catalog
//! rename under its lease, and comes back from it as a new life. Both are one control-plane
//! call whose time does not depend on the ledger's size.

use std::sync::Arc;

use tokio_postgres::types::Type;
use tracing::info;

use crate::acquire::{acquire_error, after_failed_migration, install_handle, migrate_existing};
use crate::control;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::handle::TenantHandle;
use crate::id::{TenantId, SCHEMA_NAME_SALTS};
use crate::router::{pool_error, Shared};

/// SQLSTATE of `pgtenant.restore` when there is nothing to restore, or a new life exists.
const SQLSTATE_RESTORE_REFUSED: &str = "PTR01";
/// SQLSTATE of a rename onto a schema name that is taken.
const DUPLICATE_SCHEMA: &str = "42P06";

/// Restores a forgotten tenant's newest trashed schema as a new life held by this replica.
pub(crate) async fn restore(shared: &Arc<Shared>, id: &TenantId) -> Result<TenantHandle> {
    let credentials = shared
        .liveness
        .credentials()
        .ok_or_else(|| Error::ReplicaDown {
            replica_id: shared.options.replica_id.clone(),
        })?;
    let context = || format!("restore tenant {id}");
    let mut client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("restore a tenant"))?;
    let current: i64 = client
        .query_opt(
            "SELECT epoch FROM pgtenant.tenants WHERE key = $1",
            &[&id.key()],
        )
        .await
        .map_err(Error::db(context()))?
        .map(|row| row.get(0))
        .ok_or_else(|| Error::TenantNotFound {
            tenant: id.key().to_owned(),
            message: "never created".to_owned(),
        })?;
    let (key, secret) = (id.key(), credentials.secret());
    let mut salt = 0;
    let rows = loop {
        // The new life's name is derived for the epoch restore will bump to, which the
        // function checks; a taken name (a deliberate hash collision) moves to the next salt.
        let name = id.schema_name_salted(current + 1, salt);
        let restored = control::call(
            &client,
            "SELECT epoch, schema_name, schema_version, lock_key FROM pgtenant.restore($1, $2, $3, $4, $5)",
            &[
                (&key, Type::TEXT),
                (&credentials.replica, Type::TEXT),
                (&credentials.incarnation, Type::INT8),
                (&secret, Type::TEXT),
                (&name, Type::TEXT),
            ],
        )
        .await;
        match restored {
            Err(error)
                if error.code().map(|c| c.code()) == Some(DUPLICATE_SCHEMA)
                    && salt + 1 < SCHEMA_NAME_SALTS =>
            {
                salt += 1;
            }
            Err(error) => {
                return Err(match error.as_db_error() {
                    Some(db) if db.code().code() == SQLSTATE_RESTORE_REFUSED => {
                        Error::RestoreRefused {
                            tenant: id.key().to_owned(),
                            reason: db.message().to_owned(),
                        }
                    }
                    _ => acquire_error(id, &credentials.replica, error),
                })
            }
            Ok(rows) => break rows,
        }
    };
    let row = rows.first().ok_or_else(|| Error::UnexpectedReply {
        context: context(),
        detail: "pgtenant.restore returned no row".to_owned(),
    })?;
    let (epoch, schema, version): (i64, String, i32) = (
        row.try_get(0).map_err(Error::db(context()))?,
        row.try_get(1).map_err(Error::db(context()))?,
        row.try_get(2).map_err(Error::db(context()))?,
    );
    let lock_key: i32 = row.try_get(3).map_err(Error::db(context()))?;
    let migrated_from =
        (i64::from(version) < shared.options.code_version()).then_some(i64::from(version));
    if migrated_from.is_some() {
        let lease = (epoch, lock_key);
        let migrated =
            migrate_existing(shared, &mut client, id, lease, &credentials, &schema).await;
        if let Err(error) = migrated {
            return Err(after_failed_migration(
                shared,
                &client,
                id,
                Some(epoch),
                &credentials,
                error,
            )
            .await);
        }
    }
    drop(client);
    info!(epoch, %schema, "restored");
    install_handle(
        shared,
        id,
        (epoch, credentials, lock_key, migrated_from),
        schema.clone(),
        Event::Restored {
            tenant: id.key().to_owned(),
            epoch,
            schema,
        },
    )
    .await
}
