//! `migrate_all` (DESIGN §5 "Tenant migrations", last sentence): every tenant whose recorded
//! version is behind, chosen with one query, brought up to date with bounded concurrency and
//! per-tenant results; a tenant served here is migrated under its handle's lease, any other
//! is opened (the open path) and released.

use std::sync::{Arc, Mutex};

use crate::db;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::protocol::tenant_migrations::{migrate_held, MigrationOutcome, TenantMigration};
use crate::schema_version::SchemaVersion;
use crate::state::replica::{HeldLease, Replica};
use crate::sync::{in_lanes, lock};

/// [`Router::migrate_all`](crate::Router::migrate_all).
pub(crate) async fn migrate_all(
    shared: &Arc<Replica>,
    concurrency: usize,
    progress: impl Fn(&TenantMigration),
) -> Result<Vec<TenantMigration>> {
    if !(1..=1024).contains(&concurrency) {
        return Err(Error::InvalidOption {
            option: "concurrency",
            reason: format!("{concurrency} is outside 1..=1024"),
        });
    }
    let code = shared.options.code_version();
    let behind: Vec<(String, SchemaVersion)> = {
        let client = shared
            .pool
            .get()
            .await
            .map_err(pool_error("list tenants behind"))?;
        db::tenants::behind(&client, code)
            .await
            .map_err(Error::db("list tenants behind on migrations"))?
    };
    let total = behind.len();
    let results = Mutex::new(Vec::with_capacity(total));
    let (results_ref, progress) = (&results, &progress);
    in_lanes(behind, concurrency, |(key, from)| async move {
        // The control plane's check constraint admits valid ids only.
        let Ok(id) = TenantId::parse(&key) else {
            return;
        };
        let outcome = migrate_one(shared, &id, from, code).await;
        let mut results = lock(results_ref);
        let entry = TenantMigration {
            tenant: id,
            outcome,
            done: results.len() + 1,
            total,
        };
        progress(&entry);
        results.push(entry);
    })
    .await;
    Ok(results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner()))
}

async fn migrate_one(
    shared: &Arc<Replica>,
    id: &TenantId,
    from: SchemaVersion,
    code: SchemaVersion,
) -> MigrationOutcome {
    let failed = |error: Error| match error {
        Error::Quarantined { cause, .. } => MigrationOutcome::Quarantined { cause },
        Error::LeaseHeld { owner, .. } => MigrationOutcome::HeldElsewhere { owner },
        other => MigrationOutcome::Failed {
            error: other.to_string(),
        },
    };
    let served: Option<Arc<HeldLease>> = shared.handle(id).filter(|h| h.is_serving());
    if let Some(inner) = served {
        let mut client = match shared.pool.get().await {
            Ok(client) => client,
            Err(error) => return failed(pool_error("migrate a tenant")(error)),
        };
        let lease = (inner.epoch, inner.lock_key);
        let credentials = &inner.credentials;
        let migrated =
            migrate_held(shared, &mut client, id, lease, credentials, &inner.schema).await;
        return match migrated {
            Ok(()) => MigrationOutcome::Migrated { from, to: code },
            Err(error) => failed(error),
        };
    }
    match crate::protocol::open::open(shared, id, false).await {
        Ok(handle) => {
            // Another replica may have migrated it since the list was read.
            let outcome = match handle.migrated_from {
                Some(from) => MigrationOutcome::Migrated { from, to: code },
                None => MigrationOutcome::UpToDate,
            };
            let _ = crate::protocol::release::release(&handle).await;
            outcome
        }
        Err(error) => failed(error),
    }
}
