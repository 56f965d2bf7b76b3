//! Tenant migrations (DESIGN §5 "Tenant migrations"): the application's migrations, run in a
//! tenant's schema only under its lease — at creation inside the creating transaction (see
//! `acquire.rs`), at open when the recorded version is behind, and for every tenant behind by
//! [`Router::migrate_all`](crate::Router::migrate_all) (`migrate_all.rs`, which opens tenants:
//! it sits above the open path, this file below the acquisition). A failure quarantines the tenant.

use refinery::Runner;
use tokio_postgres::Transaction;
use tracing::warn;

use crate::credentials::Credentials;
use crate::db;
use crate::db::fence;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::TenantId;
use crate::lease::Epoch;
use crate::migrate::InTransaction;
use crate::protocol::release::give_back_unused;
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;
use crate::state::replica::Replica;

/// refinery's history table, unqualified: it resolves to the tenant schema through the
/// transaction's pinned search_path, so each tenant records its own migrations.
const TENANT_HISTORY_TABLE: &str = "refinery_schema_history";

/// The repair an operator reads for a tenant whose migration failed.
const MIGRATION_REPAIR: &str = "fix the migration (or the tenant's data it trips on) and deploy it, then clear the quarantine (pgtenant clear, or pgtenant::admin::clear_quarantine)";

/// Applies the migrations this tenant lacks inside `tx`, whose search_path is already pinned to
/// the tenant's schema and whose lease check (fence or acquisition) already ran. Returns the
/// names applied. A failure is a [`Error::MigrationFailed`] naming the migration and carrying
/// the server's message; the caller rolls back and quarantines.
pub(crate) async fn apply(
    tx: &Transaction<'_>,
    migrations: &[refinery::Migration],
    placement: crate::citus::Placement,
) -> Result<Vec<String>> {
    if migrations.is_empty() {
        return Ok(Vec::new());
    }
    let mut runner = Runner::new(migrations);
    runner.set_migration_table_name(TENANT_HISTORY_TABLE);
    let report = runner
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .run_async(&mut InTransaction(tx, placement.split_migrations()))
        .await
        .map_err(|error| Error::MigrationFailed {
            cause: crate::migrate::describe_refinery(&error),
        })?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect())
}

/// Brings an existing tenant up to the code's version, in one fenced read-write transaction.
pub(crate) async fn migrate_existing(
    shared: &Replica,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    (epoch, lock_key): (Epoch, i32),
    credentials: &Credentials,
    schema: &str,
) -> Result<()> {
    let context = || format!("migrate tenant {id} at epoch {epoch}");
    let tx = db::begin_read_write(client)
        .await
        .map_err(Error::db_with(context))?;
    // The fence's write form, unnamed: a migration is rare, and its connection's statement
    // cache is the data path's business.
    let (read_only, signalled) = (false, false);
    fence::fence(
        &tx,
        None,
        read_only,
        signalled,
        id.key(),
        epoch,
        lock_key,
        &shared.idle_timeout_ms,
    )
    .await
    .map_err(Error::db_with(context))?;
    let applied = apply(&tx, &shared.options.migrations, shared.placement).await?;
    let code = shared.options.code_version();
    let applied = format!("{schema}: {}", applied.join(", "));
    db::tenants::schema_migrated(&tx, id, epoch, credentials, code, &applied)
        .await
        .map_err(Error::db_with(context))?;
    tx.commit().await.map_err(Error::db_with(context))
}

/// [`migrate_existing`] under a lease this replica holds; when it fails, the tenant is
/// quarantined (a migration failed) or the lease given back (anything else), as
/// [`after_failed_migration`] does.
pub(crate) async fn migrate_held(
    shared: &Replica,
    client: &mut deadpool_postgres::Object,
    id: &TenantId,
    lease: (Epoch, i32),
    credentials: &Credentials,
    schema: &str,
) -> Result<()> {
    match migrate_existing(shared, client, id, lease, credentials, schema).await {
        Ok(()) => Ok(()),
        Err(error) => {
            Err(after_failed_migration(shared, client, id, Some(lease.0), credentials, error).await)
        }
    }
}

/// A migration that failed quarantines the tenant (which also ends the lease); any other
/// failure just gives the lease back. `epoch` is None for a creation, which rolled back whole.
pub(crate) async fn after_failed_migration(
    shared: &Replica,
    client: &tokio_postgres::Client,
    id: &TenantId,
    epoch: Option<Epoch>,
    credentials: &Credentials,
    error: Error,
) -> Error {
    let Error::MigrationFailed { cause } = error else {
        if let Some(epoch) = epoch {
            give_back_unused(shared, client, id, epoch, credentials).await;
        }
        return error;
    };
    let quarantined =
        db::tenants::quarantine(client, id, epoch, credentials, &cause, MIGRATION_REPAIR).await;
    if let Err(db) = quarantined {
        warn!(error = %Error::db("quarantine")(db), "could not record the quarantine");
    }
    warn!(%cause, "tenant quarantined");
    shared.emit(Event::Quarantined {
        tenant: id.clone(),
        cause: cause.clone(),
    });
    Error::Quarantined {
        tenant: id.clone(),
        cause,
        repair: MIGRATION_REPAIR.to_owned(),
    }
}

/// What [`Router::migrate_all`](crate::Router::migrate_all) did for one tenant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MigrationOutcome {
    /// Brought from one version to the code's.
    Migrated {
        /// Version before.
        from: SchemaVersion,
        /// Version after.
        to: SchemaVersion,
    },
    /// Up to date by the time it was reached.
    UpToDate,
    /// Held by another live replica: not migrated behind its owner's back (it migrates the
    /// tenant itself at its next open once it runs this code).
    HeldElsewhere {
        /// The owner.
        owner: ReplicaId,
    },
    /// A migration failed: the tenant is quarantined.
    Quarantined {
        /// The failing migration and the database's message.
        cause: String,
    },
    /// Something else went wrong (the database, a lease lost): retry later.
    Failed {
        /// What.
        error: String,
    },
}

/// One tenant's result in [`Router::migrate_all`](crate::Router::migrate_all), also passed to
/// its progress callback.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct TenantMigration {
    /// The tenant.
    pub tenant: TenantId,
    /// What happened.
    pub outcome: MigrationOutcome,
    /// Tenants finished so far, this one included.
    pub done: usize,
    /// Tenants to do in this run.
    pub total: usize,
}
