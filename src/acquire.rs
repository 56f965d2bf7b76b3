//! Acquiring a tenant's lease (DESIGN §5 "Acquire tenant", "Open path", "Tenant
//! migrations"): `pgtenant.acquire`, creation of a new life's schema with the application's
//! migrations, upgrading a tenant whose schema is behind, and quarantine when a migration fails.
//!
//! An open of an existing tenant is one control-plane call (one round trip). A creation runs
//! the acquisition, `CREATE SCHEMA`, the tenant migrations and the bookkeeping in ONE
//! transaction: a failure leaves nothing behind, not even the epoch bump.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;
use tracing::{info, warn};

use crate::control;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::handle::{HandleInner, TenantHandle};
use crate::id::{TenantId, SCHEMA_NAME_SALTS};
use crate::liveness::Credentials;
use crate::router::{lock, pool_error, Shared};

/// The repair an operator reads for a tenant whose migration failed.
const MIGRATION_REPAIR: &str = "fix the migration (or the tenant's data it trips on) and deploy it, then clear the quarantine (pgtenant clear, or pgtenant::clear_quarantine)";
/// The repair for a tenant whose schema vanished (`pgtenant.acquire` quarantines it itself).
const MISSING_SCHEMA_REPAIR: &str = "restore the schema from a backup, or forget the tenant and create it again; then clear the quarantine";

/// SQLSTATE of `CREATE SCHEMA` for a name that is taken.
const DUPLICATE_SCHEMA: &str = "42P06";

const ACQUIRE_SQL: &str =
    "SELECT epoch, schema_name, previous_owner, took_over, quarantine, schema_version, lock_key
       FROM pgtenant.acquire($1, $2, $3, $4, $5, $6, $7)";

/// What `pgtenant.acquire` answered.
struct Acquired {
    epoch: i64,
    schema: Option<String>,
    previous_owner: Option<String>,
    took_over: Option<String>,
    quarantine: Option<String>,
    version: i64,
    lock_key: i32,
}

impl Acquired {
    fn from_row(row: &Row) -> std::result::Result<Acquired, tokio_postgres::Error> {
        Ok(Acquired {
            epoch: row.try_get(0)?,
            schema: row.try_get(1)?,
            previous_owner: row.try_get(2)?,
            took_over: row.try_get(3)?,
            quarantine: row.try_get(4)?,
            version: i64::from(row.try_get::<_, i32>(5)?),
            lock_key: row.try_get(6)?,
        })
    }
}

/// One `pgtenant.acquire` call; `run` sends it (in a control call, or in a transaction).
fn acquired_from(rows: Vec<Row>, id: &TenantId) -> Result<Acquired, Error> {
    let row = rows.first().ok_or_else(|| Error::UnexpectedReply {
        context: format!("acquire tenant {id}"),
        detail: "pgtenant.acquire returned no row".to_owned(),
    })?;
    Acquired::from_row(row).map_err(Error::db(format!("acquire tenant {id}")))
}

/// Acquires the lease and registers the handle. Runs in its own task (see
/// `Router::acquire_bounded`), so a caller that stops waiting cannot strand a lease.
pub(crate) async fn acquire_now(
    shared: &Arc<Shared>,
    id: &TenantId,
    create: bool,
) -> Result<TenantHandle> {
    let credentials = shared
        .liveness
        .credentials()
        .ok_or_else(|| Error::ReplicaDown {
            replica_id: shared.options.replica_id.clone(),
        })?;
    let mut client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("acquire a lease"))?;
    // Existing tenants, the common case, in one round trip; a tenant to create comes back as
    // not found (nothing committed) and is created in a transaction of its own.
    let (key, organization, ledger, secret) = (
        id.key(),
        id.organization(),
        id.ledger(),
        credentials.secret(),
    );
    let opened = control::call(
        &client,
        ACQUIRE_SQL,
        &[
            (&key, Type::TEXT),
            (&organization, Type::TEXT),
            (&ledger, Type::TEXT),
            (&credentials.replica, Type::TEXT),
            (&credentials.incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&false, Type::BOOL),
        ],
    )
    .await
    .map_err(|error| acquire_error(id, &credentials.replica, error))
    .and_then(|rows| acquired_from(rows, id));
    let acquired = match opened {
        Ok(acquired) => acquired,
        Err(Error::TenantNotFound { .. }) if create => {
            return create_tenant(shared, &mut client, id, &credentials).await;
        }
        Err(error) => return Err(error),
    };
    if let Some(cause) = acquired.quarantine {
        warn!(%cause, "tenant quarantined");
        shared.emit(Event::Quarantined {
            tenant: id.key().to_owned(),
            cause: cause.clone(),
        });
        return Err(Error::Quarantined {
            tenant: id.key().to_owned(),
            cause,
            repair: MISSING_SCHEMA_REPAIR.to_owned(),
        });
    }
    let epoch = acquired.epoch;
    tracing::Span::current().record("epoch", epoch);
    let Some(schema) = acquired.schema else {
        // Only a creation acquires a tenant without a schema, and this was not one.
        give_back(shared, &client, id, epoch, &credentials).await;
        return Err(Error::TenantNotFound {
            tenant: id.key().to_owned(),
            message: "it has no live schema".to_owned(),
        });
    };
    let code = shared.options.code_version();
    let version = acquired.version;
    if version > code {
        give_back(shared, &client, id, epoch, &credentials).await;
        return Err(Error::SchemaAhead {
            tenant: id.key().to_owned(),
            found: version,
            supported: code,
        });
    }
    let mut migrated_from = None;
    if version < code {
        let lease = (epoch, acquired.lock_key);
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
        shared.emit(Event::Migrated {
            tenant: id.key().to_owned(),
            epoch,
            from: version,
            to: code,
        });
        migrated_from = Some(version);
    }
    drop(client);
    info!(epoch, took_over = ?acquired.took_over, "acquired");
    install_handle(
        shared,
        id,
        (epoch, credentials, acquired.lock_key, migrated_from),
        schema,
        Event::Acquired {
            tenant: id.key().to_owned(),
            epoch,
            took_over_from: acquired.took_over.and(acquired.previous_owner),
        },
    )
    .await
}

/// A new life: acquisition, schema, migrations and bookkeeping in one transaction. The schema
/// name is derived from the id and the epoch; if it is taken (two ids whose shortened names and
/// 40-bit hashes collide, which takes a deliberate search), the next salted name is tried.
async fn create_tenant(
    shared: &Arc<Shared>,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    credentials: &Arc<Credentials>,
) -> Result<TenantHandle> {
    for salt in 0..SCHEMA_NAME_SALTS {
        match create_once(shared, client, id, credentials, salt).await {
            Err(Error::Database { source, .. })
                if source.code().map(|c| c.code()) == Some(DUPLICATE_SCHEMA) =>
            {
                warn!(salt, "schema name taken: trying the next derived name");
            }
            Err(error @ Error::MigrationFailed { .. }) => {
                return Err(
                    after_failed_migration(shared, client, id, None, credentials, error).await,
                );
            }
            outcome => return outcome,
        }
    }
    Err(Error::InvalidOption {
        option: "tenant id",
        reason: format!(
            "every schema name derived for tenant {id} is taken by another schema; \
             rename or drop the schemas named like {}",
            id.schema_name(0)
        ),
    })
}

async fn create_once(
    shared: &Arc<Shared>,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    credentials: &Arc<Credentials>,
    salt: u32,
) -> Result<TenantHandle> {
    let context = || format!("create tenant {id}");
    let tx = client
        .build_transaction()
        .read_only(false)
        .start()
        .await
        .map_err(Error::db(context()))?;
    let (key, organization, ledger, secret) = (
        id.key(),
        id.organization(),
        id.ledger(),
        credentials.secret(),
    );
    let params: [(&(dyn ToSql + Sync), Type); 7] = [
        (&key, Type::TEXT),
        (&organization, Type::TEXT),
        (&ledger, Type::TEXT),
        (&credentials.replica, Type::TEXT),
        (&credentials.incarnation, Type::INT8),
        (&secret, Type::TEXT),
        (&true, Type::BOOL),
    ];
    let (scrubbed, acquired) = tokio::join!(
        tx.batch_execute("SELECT pgtenant.reset_session(NULL)"),
        tx.query_typed(ACQUIRE_SQL, &params),
    );
    scrubbed.map_err(Error::db(context()))?;
    let acquired = acquired
        .map_err(|error| acquire_error(id, &credentials.replica, error))
        .and_then(|rows| acquired_from(rows, id))?;
    if acquired.schema.is_some() || acquired.quarantine.is_some() {
        // Created by another replica between our two calls: open it the ordinary way.
        drop(tx);
        return Box::pin(acquire_now(shared, id, false)).await;
    }
    let epoch = acquired.epoch;
    tracing::Span::current().record("epoch", epoch);
    let schema = id.schema_name_salted(epoch, salt);
    // The name is derived from a validated id: [a-z0-9_] only, so it needs no quoting.
    tx.batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .map_err(Error::db(context()))?;
    tx.execute(
        "SELECT set_config('search_path', $1, true)",
        &[&format!("{schema}, pg_temp")],
    )
    .await
    .map_err(Error::db(context()))?;
    crate::ledger::apply(&tx, &shared.options.migrations).await?;
    let version = i32::try_from(shared.options.code_version()).unwrap_or(i32::MAX);
    tx.query_typed(
        "SELECT pgtenant.schema_created($1, $2, $3, $4, $5, $6, $7)",
        &[
            (&key, Type::TEXT),
            (&epoch, Type::INT8),
            (&credentials.replica, Type::TEXT),
            (&credentials.incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&schema, Type::TEXT),
            (&version, Type::INT4),
        ],
    )
    .await
    .map_err(Error::db(context()))?;
    tx.commit().await.map_err(Error::db(context()))?;
    shared.emit(Event::Created {
        tenant: id.key().to_owned(),
        epoch,
        schema: schema.clone(),
    });
    info!(epoch, %schema, "created");
    install_handle(
        shared,
        id,
        (epoch, credentials.clone(), acquired.lock_key, None),
        schema,
        Event::Acquired {
            tenant: id.key().to_owned(),
            epoch,
            took_over_from: acquired.took_over.and(acquired.previous_owner),
        },
    )
    .await
}

/// Registers a freshly acquired lease as this replica's handle.
pub(crate) async fn install_handle(
    shared: &Arc<Shared>,
    id: &TenantId,
    (epoch, credentials, lock_key, migrated_from): (i64, Arc<Credentials>, i32, Option<i64>),
    schema: String,
    event: Event,
) -> Result<TenantHandle> {
    let inner = Arc::new(HandleInner::new(
        id.clone(),
        (epoch, credentials, lock_key, migrated_from),
        schema,
        shared.clone(),
    ));
    lock(&shared.handles).insert(id.key().to_owned(), inner.clone());
    shared.emit(event);
    let handle = TenantHandle::from_inner(inner);
    // Closed while acquiring: give it straight back rather than leak it.
    if shared.is_closed() {
        let _ = handle.abandon().await;
        return Err(Error::RouterClosed);
    }
    Ok(handle)
}

/// Gives a lease acquired in vain straight back (a schema ahead of the code, say).
async fn give_back(
    shared: &Shared,
    client: &tokio_postgres::Client,
    id: &TenantId,
    epoch: i64,
    credentials: &Credentials,
) {
    let released =
        crate::release::release_now(client, credentials, &[(id, epoch, "released", None)]).await;
    if let Err(error) = released {
        warn!(tenant = %id, %error, replica = %shared.options.replica_id, "could not give the lease back; it ends with its expiry");
    }
}

/// A migration that failed quarantines the tenant (which also ends the lease); any other
/// failure just gives the lease back. `epoch` is None for a creation, which rolled back whole.
pub(crate) async fn after_failed_migration(
    shared: &Shared,
    client: &tokio_postgres::Client,
    id: &TenantId,
    epoch: Option<i64>,
    credentials: &Credentials,
    error: Error,
) -> Error {
    let Error::MigrationFailed { cause } = error else {
        if let Some(epoch) = epoch {
            give_back(shared, client, id, epoch, credentials).await;
        }
        return error;
    };
    let (key, organization, ledger, secret) = (
        id.key(),
        id.organization(),
        id.ledger(),
        credentials.secret(),
    );
    let quarantined = control::call(
        client,
        "SELECT pgtenant.quarantine($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            (&key, Type::TEXT),
            (&organization, Type::TEXT),
            (&ledger, Type::TEXT),
            (&epoch, Type::INT8),
            (&credentials.replica, Type::TEXT),
            (&credentials.incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&cause, Type::TEXT),
            (&MIGRATION_REPAIR, Type::TEXT),
        ],
    )
    .await;
    if let Err(db) = quarantined {
        warn!(error = %Error::db("quarantine")(db), "could not record the quarantine");
    }
    warn!(%cause, "tenant quarantined");
    shared.emit(Event::Quarantined {
        tenant: id.key().to_owned(),
        cause: cause.clone(),
    });
    Error::Quarantined {
        tenant: id.key().to_owned(),
        cause,
        repair: MIGRATION_REPAIR.to_owned(),
    }
}

/// Brings an existing tenant up to the code's version, in one fenced read-write transaction.
pub(crate) async fn migrate_existing(
    shared: &Shared,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    (epoch, lock_key): (i64, i32),
    credentials: &Credentials,
    schema: &str,
) -> Result<()> {
    let context = || format!("migrate tenant {id} at epoch {epoch}");
    let tx = client
        .build_transaction()
        .read_only(false)
        .start()
        .await
        .map_err(Error::db(context()))?;
    let (key, secret) = (id.key(), credentials.secret());
    tx.query_typed(
        "SELECT pgtenant.fence($1, $2, $3, $4)",
        &[
            (&key, Type::TEXT),
            (&epoch, Type::INT8),
            (&lock_key, Type::INT4),
            (&shared.idle_timeout_ms, Type::TEXT),
        ],
    )
    .await
    .map_err(Error::db(context()))?;
    let applied = crate::ledger::apply(&tx, &shared.options.migrations).await?;
    let code = i32::try_from(shared.options.code_version()).unwrap_or(i32::MAX);
    tx.query_typed(
        "SELECT pgtenant.schema_migrated($1, $2, $3, $4, $5, $6, $7)",
        &[
            (&key, Type::TEXT),
            (&epoch, Type::INT8),
            (&credentials.replica, Type::TEXT),
            (&credentials.incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&code, Type::INT4),
            (&format!("{schema}: {}", applied.join(", ")), Type::TEXT),
        ],
    )
    .await
    .map_err(Error::db(context()))?;
    tx.commit().await.map_err(Error::db(context()))
}

#[derive(serde::Deserialize)]
struct HeldDetail {
    owner: String,
    epoch: i64,
    owner_alive: bool,
    expires_in_ms: Option<u64>,
    reserved: bool,
}

/// Maps `pgtenant.acquire`'s (and `restore`'s) refusals to their errors.
pub(crate) fn acquire_error(id: &TenantId, replica: &str, error: tokio_postgres::Error) -> Error {
    let Some(db) = error.as_db_error() else {
        return Error::db(format!("acquire tenant {id}"))(error);
    };
    match db.code().code() {
        "PTL01" => match db
            .detail()
            .and_then(|d| serde_json::from_str::<HeldDetail>(d).ok())
        {
            Some(held) => Error::LeaseHeld {
                tenant: id.key().to_owned(),
                owner: held.owner,
                epoch: held.epoch,
                owner_alive: held.owner_alive,
                expires_in: held.expires_in_ms.map(Duration::from_millis),
                reserved: held.reserved,
            },
            None => Error::db(format!("acquire tenant {id}"))(error),
        },
        "PTL02" => Error::ReplicaDown {
            replica_id: replica.to_owned(),
        },
        "PTN01" => Error::TenantNotFound {
            tenant: id.key().to_owned(),
            message: db.message().to_owned(),
        },
        "PTQ01" => {
            let detail: serde_json::Value = db
                .detail()
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or_default();
            let text = |k: &str| detail[k].as_str().unwrap_or("").to_owned();
            Error::Quarantined {
                tenant: id.key().to_owned(),
                cause: text("cause"),
                repair: text("repair"),
            }
        }
        _ => Error::db(format!("acquire tenant {id}"))(error),
    }
}
