//! Acquiring a tenant's lease (DESIGN §5 "Acquire tenant"): `pgtenant.acquire` (which takes a
//! dead or expired owner over, sealing it first under session fencing), creation of a new
//! life's schema with the application's migrations, upgrading a tenant whose schema is behind,
//! and installing the handle. Gates, bounds and waiting are the open path's (`open.rs`).
//!
//! An open of an existing tenant is one control-plane call (one round trip). A creation runs
//! the acquisition, `CREATE SCHEMA`, the tenant migrations and the bookkeeping in ONE
//! transaction: a failure leaves nothing behind, not even the epoch bump.

use std::sync::Arc;

use tracing::{debug, info, warn};

use crate::credentials::{millis, Credentials};
use crate::db;
use crate::db::leases::{AcquireBounds, Acquisition};
use crate::db::sessions::TERMINATE_TIMEOUT;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::{TenantId, SCHEMA_NAME_SALTS};
use crate::lease::Epoch;
use crate::protocol::release::give_back_unused;
use crate::protocol::tenant_migrations::{after_failed_migration, migrate_held};
use crate::refusal::{self, Scope};
use crate::sqlstate;
use crate::state::replica::{Acquired, HeldLease, Replica};
use crate::sync::lock;

/// The repair for a tenant whose schema vanished (`pgtenant.acquire` quarantines it itself).
const MISSING_SCHEMA_REPAIR: &str = "restore the schema from a backup, or forget the tenant and create it again; then clear the quarantine";

/// How many times an acquisition rolls back prepared transactions that hold the tenant and
/// tries again before it reports them.
const PREPARED_ROUNDS: usize = 2;

/// The bounds of `pgtenant.acquire`'s waits, from the router's options.
fn bounds(shared: &Replica) -> AcquireBounds {
    AcquireBounds {
        grace_ms: millis(shared.options.ttl),
        wait_ms: millis(shared.options.open_timeout),
        terminate_ms: i64::from(millis(TERMINATE_TIMEOUT)),
    }
}

/// The acquisition's reply, or what it means that there was none.
fn answered(
    reply: std::result::Result<Option<Acquisition>, tokio_postgres::Error>,
    id: &TenantId,
    credentials: &Credentials,
) -> Result<Acquisition> {
    reply
        .map_err(|error| refusal::map(error, &scope(id, credentials)))?
        .ok_or_else(|| Error::UnexpectedReply {
            context: format!("acquire tenant {id}"),
            detail: "pgtenant.acquire returned no row".to_owned(),
        })
}

/// Rolls back the prepared transactions a PTX01 names (DETAIL: a JSON list of `gid`s), as
/// the application role, which prepared them: `ROLLBACK PREPARED` runs outside any
/// transaction, so the acquisition cannot do it itself. Err when one could not be.
async fn roll_back_prepared(
    client: &tokio_postgres::Client,
    error: &tokio_postgres::Error,
) -> std::result::Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Prepared {
        gid: String,
    }
    let detail = error
        .as_db_error()
        .and_then(|db| db.detail())
        .unwrap_or_default();
    let prepared: Vec<Prepared> = serde_json::from_str(detail)
        .map_err(|parse| format!("unreadable list of prepared transactions ({parse})"))?;
    for Prepared { gid } in prepared {
        // A string literal (ROLLBACK PREPARED takes no parameter): quotes doubled, and
        // standard_conforming_strings keeps backslashes literal.
        let sql = format!("ROLLBACK PREPARED '{}'", gid.replace('\'', "''"));
        if let Err(failed) = client.batch_execute(&sql).await {
            // Gone meanwhile (committed or rolled back by someone else) is what we wanted.
            if sqlstate::of(&failed) != Some(sqlstate::UNDEFINED_OBJECT) {
                return Err(format!(
                    "ROLLBACK PREPARED '{gid}' failed: {}",
                    crate::error::DbCause(&failed)
                ));
            }
        }
        warn!(
            gid,
            "rolled back a prepared transaction that held the tenant"
        );
    }
    Ok(())
}

fn scope<'a>(id: &'a TenantId, credentials: &'a Credentials) -> Scope<'a> {
    Scope {
        doing: "acquire a lease",
        tenant: Some(id),
        epoch: Epoch::new(0),
        replica: credentials.replica.as_str(),
    }
}

/// Acquires the lease and registers the handle. Runs in its own task (see [`bounded`]).
pub(crate) async fn acquire(
    shared: &Arc<Replica>,
    id: &TenantId,
    create: bool,
) -> Result<Arc<HeldLease>> {
    let credentials = shared.current_credentials()?;
    let mut client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("acquire a lease"))?;
    // Existing tenants, the common case, in one round trip; a tenant to create comes back as
    // not found (nothing committed) and is created in a transaction of its own.
    let bounds = bounds(shared);
    // Work of an earlier lease of this tenant held by this incarnation must be over first: the
    // acquisition of a tenant this incarnation owned neither seals nor waits for anything.
    shared.earlier_work_done(id, &credentials).await?;
    let mut round = 0;
    let opened = loop {
        match db::leases::acquire(&client, id, &credentials, false, &bounds).await {
            Err(error)
                if sqlstate::of(&error) == Some(sqlstate::PREPARED) && round < PREPARED_ROUNDS =>
            {
                round += 1;
                if let Err(why) = roll_back_prepared(&client, &error).await {
                    let mapped = refusal::map(error, &scope(id, &credentials));
                    return Err(match mapped {
                        Error::StaleWork {
                            tenant,
                            message,
                            hint,
                            ..
                        } => Error::StaleWork {
                            tenant,
                            message: format!("{message}; {why}"),
                            hint,
                            retryable: false,
                        },
                        other => other,
                    });
                }
            }
            other => break answered(other, id, &credentials),
        }
    };
    let answer = match opened {
        Ok(answer) => answer,
        Err(Error::TenantNotFound { .. }) if create => {
            return create_tenant(shared, &mut client, id, &credentials).await;
        }
        Err(error) => return Err(error),
    };
    let (lease, event) = settle(shared, &mut client, id, answer, credentials).await?;
    drop(client);
    install_handle(shared, id, lease, event).await
}

/// What follows an acquisition of an existing tenant, one or batched: a quarantine reported, a
/// lease the code cannot serve given back, the schema brought up to this code's version, and
/// the lease and its event, for [`install_handle`].
async fn settle(
    shared: &Arc<Replica>,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    answer: Acquisition,
    credentials: Arc<Credentials>,
) -> Result<(Acquired, Event)> {
    if let Some(cause) = answer.quarantine {
        warn!(%cause, "tenant quarantined");
        shared.emit(Event::Quarantined {
            tenant: id.clone(),
            cause: cause.clone(),
        });
        return Err(Error::Quarantined {
            tenant: id.clone(),
            cause,
            repair: MISSING_SCHEMA_REPAIR.to_owned(),
        });
    }
    let epoch = answer.epoch;
    tracing::Span::current().record("epoch", epoch.get());
    let Some(schema) = answer.schema else {
        // Only a creation acquires a tenant without a schema, and this was not one.
        give_back_unused(shared, client, id, epoch, &credentials).await;
        return Err(Error::TenantNotFound {
            tenant: id.clone(),
            reason: "it was forgotten".to_owned(),
        });
    };
    let code = shared.options.code_version();
    let version = answer.version;
    if version > code {
        give_back_unused(shared, client, id, epoch, &credentials).await;
        return Err(Error::SchemaAhead {
            tenant: id.clone(),
            found: version,
            supported: code,
        });
    }
    let mut migrated_from = None;
    if version < code {
        let lease = (epoch, answer.lock_key);
        migrate_held(shared, client, id, lease, &credentials, &schema).await?;
        shared.emit(Event::Migrated {
            tenant: id.clone(),
            epoch,
            from: version,
            to: code,
        });
        migrated_from = Some(version);
    }
    info!(%epoch, took_over = ?answer.took_over, "acquired");
    if answer.took_over.is_some() {
        crate::metrics::takeover();
    }
    let event = Event::Acquired {
        tenant: id.clone(),
        epoch,
        took_over_from: answer.took_over.and(answer.previous_owner),
    };
    let lease = Acquired {
        epoch,
        credentials,
        lock_key: answer.lock_key,
        migrated_from,
        created: false,
        schema,
    };
    Ok((lease, event))
}

/// A new life: acquisition, schema, migrations and bookkeeping in one transaction. The schema
/// name is derived from the id and the epoch; if it is taken (two ids whose shortened names and
/// 40-bit hashes collide, which takes a deliberate search), the next salted name is tried.
async fn create_tenant(
    shared: &Arc<Replica>,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    credentials: &Arc<Credentials>,
) -> Result<Arc<HeldLease>> {
    for salt in 0..SCHEMA_NAME_SALTS {
        match create_once(shared, client, id, credentials, salt).await {
            Err(Error::Database { source, .. })
                if sqlstate::of(&source) == Some(sqlstate::DUPLICATE_SCHEMA) =>
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
    shared: &Arc<Replica>,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    credentials: &Arc<Credentials>,
    salt: u32,
) -> Result<Arc<HeldLease>> {
    let context = || format!("create tenant {id}");
    let tx = db::begin_read_write(client)
        .await
        .map_err(Error::db_with(context))?;
    let bounds = bounds(shared);
    let (scrubbed, acquired) = db::leases::acquire_to_create(&tx, id, credentials, &bounds).await;
    scrubbed.map_err(Error::db_with(context))?;
    let answer = answered(acquired, id, credentials)?;
    if answer.schema.is_some() || answer.quarantine.is_some() {
        // Created by another replica between our two calls: open it the ordinary way.
        drop(tx);
        return Box::pin(acquire(shared, id, false)).await;
    }
    let epoch = answer.epoch;
    tracing::Span::current().record("epoch", epoch.get());
    let schema = id.schema_name_salted(epoch.get(), salt);
    // On Citus this transaction decides whether the schema is distributed (see citus.rs).
    if let Some(sharding) = shared.placement.sharding() {
        db::citus::set_sharding(&tx, sharding)
            .await
            .map_err(Error::db_with(context))?;
    }
    // The name is derived from a validated id: [a-z0-9_] only, so it needs no quoting.
    tx.batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .map_err(Error::db_with(context))?;
    tx.execute(
        "SELECT set_config('search_path', $1, true)",
        &[&format!("{schema}, pg_temp")],
    )
    .await
    .map_err(Error::db_with(context))?;
    crate::protocol::tenant_migrations::apply(&tx, &shared.options.migrations, shared.placement)
        .await?;
    let version = shared.options.code_version();
    db::leases::schema_created(&tx, id, epoch, credentials, &schema, version)
        .await
        .map_err(|error| match sqlstate::of(&error) {
            // The control plane would not vouch for the schema (G8): typed, with what to do.
            Some(sqlstate::FOREIGN_SCHEMA) => refusal::map(error, &scope(id, credentials)),
            _ => Error::db_with(context)(error),
        })?;
    tx.commit().await.map_err(Error::db_with(context))?;
    shared.emit(Event::Created {
        tenant: id.clone(),
        epoch,
        schema: schema.clone(),
    });
    info!(%epoch, %schema, "created");
    let event = Event::Acquired {
        tenant: id.clone(),
        epoch,
        took_over_from: answer.took_over.and(answer.previous_owner),
    };
    let lease = Acquired {
        epoch,
        credentials: credentials.clone(),
        lock_key: answer.lock_key,
        migrated_from: None,
        created: true,
        schema,
    };
    install_handle(shared, id, lease, event).await
}

/// Registers a freshly acquired lease as this replica's handle.
pub(crate) async fn install_handle(
    shared: &Arc<Replica>,
    id: &TenantId,
    lease: Acquired,
    event: Event,
) -> Result<Arc<HeldLease>> {
    let inner = Arc::new(HeldLease::new(id.clone(), lease, shared.clone()));
    {
        let mut handles = lock(&shared.handles);
        handles.insert(id.clone(), inner.clone());
        crate::metrics::leases_held(shared.options.replica_id.as_str(), handles.len());
    }
    crate::metrics::lease_acquired();
    shared
        .maybe_away
        .store(true, std::sync::atomic::Ordering::Release);
    shared.emit(event);
    // Closed while acquiring: give it straight back rather than leak it.
    if shared.is_closed() {
        let _ = crate::protocol::abandon::abandon(&inner).await;
        return Err(Error::RouterClosed);
    }
    Ok(inner)
}

/// The bound of each batched acquisition's waits: a tenant whose row or fence lock stays busy
/// longer leaves the batch and is opened the ordinary way, within the open's own bound, so one
/// busy tenant does not hold up the rest.
const BATCH_WAIT_MS: i32 = 100;

/// What a batched acquisition did with its tenants.
#[derive(Default)]
pub(crate) struct Batch {
    /// Acquired and served here now.
    pub(crate) opened: usize,
    /// Not acquired by the batch, with the SQLSTATE it failed with: to open the ordinary way
    /// (or not at all, when another replica holds it).
    pub(crate) refused: Vec<(TenantId, String)>,
}

/// Acquires the existing tenants `ids` in one statement and one commit
/// (`pgtenant.acquire_many`, each tenant in its own subtransaction), then settles and installs
/// each like [`acquire`]. The caller holds each tenant's open gate, and has checked that no
/// earlier lease of it held by `credentials`' registration is still at work.
pub(crate) async fn acquire_batch(
    shared: &Arc<Replica>,
    ids: &[TenantId],
    credentials: Arc<Credentials>,
) -> Result<Batch> {
    let mut client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("acquire leases"))?;
    let bounds = AcquireBounds {
        wait_ms: BATCH_WAIT_MS.min(millis(shared.options.open_timeout)),
        ..bounds(shared)
    };
    let answers = db::leases::acquire_many(&client, ids, &credentials, &bounds)
        .await
        .map_err(Error::db("acquire leases"))?;
    let by_key: std::collections::HashMap<&str, &TenantId> =
        ids.iter().map(|id| (id.key(), id)).collect();
    let mut batch = Batch::default();
    let mut settled = Vec::with_capacity(answers.len());
    for (key, answer) in answers {
        let Some(&id) = by_key.get(key.as_str()) else {
            continue;
        };
        match answer {
            Ok(answer) => {
                match settle(shared, &mut client, id, answer, credentials.clone()).await {
                    Ok(lease) => settled.push((id, lease)),
                    // Reported by settle (quarantine, a schema ahead of this code, a failed
                    // upgrade), as an open reports it.
                    Err(error) => {
                        debug!(tenant = %id, %error, "a batched acquisition is not served")
                    }
                }
            }
            Err((code, message)) => {
                debug!(tenant = %id, code, message, "not acquired in a batch");
                batch.refused.push((id.clone(), code));
            }
        }
    }
    drop(client);
    for (id, (lease, event)) in settled {
        if install_handle(shared, id, lease, event).await.is_ok() {
            batch.opened += 1;
        }
    }
    Ok(batch)
}
