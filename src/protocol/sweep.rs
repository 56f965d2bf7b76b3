//! The sweep (DESIGN §5 "Sweep (masked epochs)"): drops trashed schemas past retention and
//! every masked schema, object by object in small transactions, off the hot path, resumable.
//! It trusts nothing it reads (G8): a schema goes only if its name is one pgtenant derives from
//! its tenant and epoch and its owner is the tenant-owner role.

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::Client;

use crate::db;
use crate::error::{Error, Result};
use crate::id::{TenantId, TRASH_PREFIX};
use crate::lease::Epoch;
use crate::sqlstate;

/// How [`sweep`] works.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SweepOptions {
    /// Trashed schemas younger than this are kept (they can be restored). Default 7 days.
    pub retention: Duration,
    /// Objects dropped per transaction (default 20): each takes a few locks, and the lock table
    /// is shared by the whole cluster.
    pub objects_per_transaction: usize,
    /// `lock_timeout` of each drop transaction (default 2 s): a schema whose objects are busy is
    /// deferred to the next sweep instead of queueing everyone behind it.
    pub lock_timeout: Duration,
    /// Journal rows (`pgtenant.history`) older than this are pruned. Default 30 days.
    pub history_retention: Duration,
    /// Replicas that ended (deregistered or expired) longer ago than this, and that no tenant
    /// names, are pruned from `pgtenant.replicas`. Default 7 days.
    pub replica_retention: Duration,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            retention: Duration::from_secs(7 * 24 * 3600),
            objects_per_transaction: 20,
            lock_timeout: Duration::from_secs(2),
            history_retention: Duration::from_secs(30 * 24 * 3600),
            replica_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl SweepOptions {
    /// Default options with this retention.
    pub fn with_retention(retention: Duration) -> Self {
        SweepOptions {
            retention,
            ..SweepOptions::default()
        }
    }
}

/// What [`sweep`] did.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct SweepReport {
    /// Schemas removed (trashed past retention, or masked).
    pub swept: Vec<String>,
    /// Of those, the masked ones: schemas of a forgotten epoch found outside the trash.
    pub masked: Vec<String>,
    /// Trashed schemas kept because they are within retention.
    pub kept: usize,
    /// Schemas left for the next sweep, with why (a lock timeout, say).
    pub deferred: Vec<(String, String)>,
    /// Tenant-like schemas no tenant accounts for: left alone, for a person to look at.
    pub unknown: Vec<String>,
    /// Schemas a trash row names that pgtenant would not have made for that row (a name not
    /// derived from the tenant and epoch, or another owner than the tenant-owner role): left
    /// alone, with why. The sweep trusts nothing it reads (DESIGN G8).
    pub refused: Vec<(String, String)>,
    /// Journal rows pruned for age.
    pub history_pruned: u64,
    /// Ended replicas pruned from `pgtenant.replicas`.
    pub replicas_pruned: u64,
}

/// Drops trashed schemas past retention and every masked schema (one that belongs to a
/// tenant's epoch at or below its `forgotten_at_epoch` but is not in the trash), object by
/// object in small transactions with a `lock_timeout`. Never touches a live schema. Resumable:
/// a sweep stopped anywhere leaves work the next one finishes. `progress` is called after each
/// transaction with the schema and how many objects were dropped from it so far. Also prunes
/// journal rows older than the history retention.
pub async fn sweep(
    client: &mut Client,
    options: &SweepOptions,
    mut progress: impl FnMut(&str, usize),
) -> Result<SweepReport> {
    if options.objects_per_transaction == 0 || options.objects_per_transaction > 10_000 {
        return Err(Error::InvalidOption {
            option: "objects_per_transaction",
            reason: format!("{} is outside 1..=10000", options.objects_per_transaction),
        });
    }
    let mut report = SweepReport::default();
    // Control plane 12 on, the sweep marks a trash row before its first drop, so a restore
    // is whole or refused; an older one has no mark (and its restore does not look for one).
    let marks = db::setup::read_version(&*client).await? >= MARKED_SWEEP_VERSION;
    let retention_ms = i64::try_from(options.retention.as_millis()).unwrap_or(i64::MAX);
    let rows = db::sweep::unswept_trash(client, retention_ms).await?;
    let mut doomed: Vec<(String, String, bool)> = Vec::new();
    for row in rows {
        let (schema, tenant) = (row.schema, row.tenant);
        if !row.due {
            report.kept += 1;
            continue;
        }
        match trash_row_is_derived(&schema, &tenant, row.epoch, &row.live_name) {
            Ok(()) => doomed.push((schema, tenant, false)),
            Err(reason) => report.refused.push((schema, reason)),
        }
    }
    for (schema, tenant) in masked_schemas(client, &mut report).await? {
        doomed.push((schema, tenant, true));
    }
    for (schema, tenant, masked) in doomed {
        if let Some(reason) = foreign_owner(client, &schema).await? {
            report.refused.push((schema, reason));
            continue;
        }
        let mark = marks && !masked;
        match drop_schema(client, options, &schema, &tenant, mark, &mut progress).await {
            Ok(false) => {}
            Ok(true) => {
                if masked {
                    report.masked.push(schema.clone());
                }
                report.swept.push(schema);
            }
            Err(Error::Database { source, .. })
                if sqlstate::of(&source) == Some(sqlstate::LOCK_NOT_AVAILABLE) =>
            {
                report
                    .deferred
                    .push((schema, "lock timeout: in use".to_owned()));
            }
            Err(error) => return Err(error),
        }
    }
    let history_ms = i64::try_from(options.history_retention.as_millis()).unwrap_or(i64::MAX);
    let replicas_ms = i64::try_from(options.replica_retention.as_millis()).unwrap_or(i64::MAX);
    let (history_pruned, replicas_pruned) =
        db::sweep::prune(client, history_ms, replicas_ms).await?;
    report.history_pruned = u64::try_from(history_pruned).unwrap_or(0);
    report.replicas_pruned = u64::try_from(replicas_pruned).unwrap_or(0);
    Ok(report)
}

/// Whether a trash row names a schema pgtenant made: `trash_` + a live name derived from the
/// row's tenant and an epoch up to the row's (the life began at or before it was forgotten).
fn trash_row_is_derived(
    schema: &str,
    tenant: &str,
    forgotten_epoch: i64,
    live_name: &str,
) -> std::result::Result<(), String> {
    let refuse = |why: &str| {
        Err(format!(
            "not a schema pgtenant made for tenant {tenant:?}: {why}"
        ))
    };
    if schema.strip_prefix(TRASH_PREFIX) != Some(live_name) {
        return refuse("its name is not the trash prefix and the live name");
    }
    let Ok(id) = TenantId::parse(tenant) else {
        return refuse("the tenant key is not a valid tenant id");
    };
    let Some(life_epoch) = life_epoch_of(live_name).filter(|e| *e <= forgotten_epoch) else {
        return refuse("its name carries no epoch up to the one forgotten");
    };
    if id
        .derived_schema_names(life_epoch)
        .any(|name| name == live_name)
    {
        Ok(())
    } else {
        refuse("its name is not derived from the tenant and epoch")
    }
}

/// The epoch a tenant schema's life began at, from its name (`…_<epoch>_<hash>`).
fn life_epoch_of(name: &str) -> Option<i64> {
    name.rsplit('_').nth(1).and_then(|e| e.parse().ok())
}

/// Why a schema must not be dropped by the sweep though its name is derived: its owner is not
/// the tenant-owner role (`pgtenant.config.app_role`, or the control plane's owner without
/// one). None when it may go (or is already gone).
async fn foreign_owner(client: &Client, schema: &str) -> Result<Option<String>> {
    let row = db::sweep::schema_owner(client, schema).await?;
    Ok(row.and_then(|(expected, owner)| {
        (expected != Some(true)).then(|| {
            format!("owned by {owner}, not by the tenant-owner role: pgtenant never made it")
        })
    }))
}

/// Tenant-shaped schemas outside the trash that no live tenant owns; the ones that belong to a
/// forgotten epoch are masked, the rest are reported as unknown.
async fn masked_schemas(
    client: &Client,
    report: &mut SweepReport,
) -> Result<Vec<(String, String)>> {
    let orphans = db::sweep::orphan_schemas(client).await?;
    let mut masked = Vec::new();
    for schema in orphans {
        let epoch = life_epoch_of(&schema).unwrap_or(i64::MAX);
        // The name is a hash of key and epoch: recompute it for each tenant forgotten at or
        // after that epoch; a match attributes the schema, nothing else does.
        let candidates = db::sweep::forgotten_keys(client, Epoch::new(epoch)).await?;
        let owner = candidates.into_iter().find_map(|key| {
            let id = TenantId::parse(&key).ok()?;
            let derived = id.derived_schema_names(epoch).any(|name| name == schema);
            derived.then_some(key)
        });
        match owner {
            Some(key) => masked.push((schema, key)),
            None => report.unknown.push(schema),
        }
    }
    Ok(masked)
}

/// The control-plane version whose restore refuses a trash row the sweep has begun on
/// (`pgtenant.begin_sweep`, `trash.sweep_started_at`).
const MARKED_SWEEP_VERSION: i64 = 12;

/// Drops `schema` batch by batch; false when it was left alone because it became live again or
/// its trash row went (restored) before the first drop. With `mark`, each batch's transaction
/// first marks the trash row as being swept (`pgtenant.begin_sweep`, which locks the row): from
/// the first committed drop on, restore refuses the row instead of bringing back a schema with
/// objects missing, and a restore that got there first holds the row until it commits.
async fn drop_schema(
    client: &mut Client,
    options: &SweepOptions,
    schema: &str,
    tenant: &str,
    mark: bool,
    progress: &mut impl FnMut(&str, usize),
) -> Result<bool> {
    let context = || format!("sweep schema {schema}");
    let lock_timeout = format!("{}ms", options.lock_timeout.as_millis().max(1));
    let batch = i64::try_from(options.objects_per_transaction).unwrap_or(20);
    let mut dropped = 0;
    loop {
        let tx = db::begin_read_write(client)
            .await
            .map_err(Error::db_with(context))?;
        db::sweep::set_lock_timeout(&tx, schema, &lock_timeout).await?;
        if db::sweep::schema_is_live(&tx, schema).await? {
            // Became live (restored) since it was listed: never touch it.
            return Ok(false);
        }
        // Restored (or swept by another sweep) since it was listed.
        if mark && !db::sweep::begin_sweep(&tx, schema).await? {
            return Ok(false);
        }
        // Partitions before their parents, so no single drop cascades over many relations.
        let objects = db::sweep::schema_objects(&tx, schema, batch).await?;
        if objects.is_empty() {
            db::sweep::drop_schema(&tx, schema).await?;
            db::sweep::record_swept(&tx, schema, tenant).await?;
            tx.commit().await.map_err(Error::db_with(context))?;
            // A schema with objects was reported after its last batch already.
            if dropped == 0 {
                progress(schema, dropped);
            }
            return Ok(true);
        }
        db::sweep::drop_objects(&tx, schema, &objects).await?;
        tx.commit().await.map_err(Error::db_with(context))?;
        dropped += objects.len();
        progress(schema, dropped);
    }
}
