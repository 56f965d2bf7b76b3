//! Operators' view and housekeeping: listing tenants and trash, and the sweep that drops
//! trashed and masked schemas.

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::{Client, GenericClient};

use crate::error::{Error, Result};
use crate::id::{TenantId, TRASH_PREFIX};
use crate::options::validate_replica_id;

/// Tenant states as `pgtenant.lease_status` reports them.
pub const TENANT_STATES: [&str; 7] = [
    "held",
    "stalled",
    "expired",
    "free",
    "reserved",
    "quarantined",
    "forgotten",
];

/// Which tenants [`list_tenants`] returns: filters combine with AND; pages by key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TenantQuery {
    /// Only tenants owned by this replica.
    pub owner: Option<String>,
    /// Only tenants in this state (one of [`TENANT_STATES`]).
    pub state: Option<String>,
    /// Only quarantined (true) or only healthy (false) tenants.
    pub quarantined: Option<bool>,
    /// Only live tenants whose migration version is below this one.
    pub behind: Option<i64>,
    /// The page after this tenant key (keyset paging: pass the last key of a page).
    pub after: Option<String>,
    /// Page size, 1..=10 000 (default 100).
    pub limit: i64,
}

impl Default for TenantQuery {
    fn default() -> Self {
        TenantQuery {
            owner: None,
            state: None,
            quarantined: None,
            behind: None,
            after: None,
            limit: 100,
        }
    }
}

impl TenantQuery {
    fn validate(&self) -> Result<()> {
        let invalid = |option, reason: String| Err(Error::InvalidOption { option, reason });
        if let Some(owner) = &self.owner {
            validate_replica_id("owner", owner)?;
        }
        if let Some(state) = &self.state {
            if !TENANT_STATES.contains(&state.as_str()) {
                return invalid(
                    "state",
                    format!(
                        "{:?} is not a state; use one of {}",
                        state.chars().take(40).collect::<String>(),
                        TENANT_STATES.join(", ")
                    ),
                );
            }
        }
        if let Some(after) = &self.after {
            TenantId::parse(after)?;
        }
        if !(1..=10_000).contains(&self.limit) {
            return invalid("limit", format!("{} is outside 1..=10000", self.limit));
        }
        Ok(())
    }
}

/// One tenant's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TenantRecord {
    /// `organization/ledger`.
    pub tenant: String,
    /// See [`TENANT_STATES`].
    pub state: String,
    /// The owner replica.
    pub owner: Option<String>,
    /// The current epoch.
    pub epoch: i64,
    /// Whether the owner is alive.
    pub owner_alive: Option<bool>,
    /// The live schema (None when forgotten).
    pub schema: Option<String>,
    /// The tenant's migration version.
    pub version: i32,
    /// The highest forgotten epoch (0: never forgotten).
    pub forgotten_at_epoch: i64,
    /// Why it is quarantined.
    pub quarantine_cause: Option<String>,
    /// What to do about it.
    pub quarantine_repair: Option<String>,
    /// When the tenant was first created (UTC, RFC 3339).
    pub created_at: String,
    /// When its lease was last acquired (UTC, RFC 3339).
    pub acquired_at: Option<String>,
}

const RECORD_SQL: &str =
    "SELECT s.tenant, s.state, s.owner, s.epoch, s.owner_alive, s.schema, s.version,
        t.forgotten_at_epoch, s.quarantine_cause, s.quarantine_repair,
        to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
        to_char(s.acquired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
   FROM pgtenant.lease_status s JOIN pgtenant.tenants t ON t.key = s.tenant";

fn record(row: &tokio_postgres::Row) -> TenantRecord {
    TenantRecord {
        tenant: row.get(0),
        state: row.get(1),
        owner: row.get(2),
        epoch: row.get(3),
        owner_alive: row.get(4),
        schema: row.get(5),
        version: row.get(6),
        forgotten_at_epoch: row.get(7),
        quarantine_cause: row.get(8),
        quarantine_repair: row.get(9),
        created_at: row.get(10),
        acquired_at: row.get(11),
    }
}

/// A page of tenants, by key. Invalid filters are refused before any query.
pub async fn list_tenants(
    client: &impl GenericClient,
    query: &TenantQuery,
) -> Result<Vec<TenantRecord>> {
    query.validate()?;
    let behind = query.behind.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
    let rows = client
        .query(
            &format!(
                "{RECORD_SQL}
                  WHERE ($1::text IS NULL OR s.owner = $1)
                    AND ($2::text IS NULL OR s.state = $2)
                    AND ($3::bool IS NULL OR (s.quarantine_cause IS NOT NULL) = $3)
                    AND ($4::int IS NULL OR (s.schema IS NOT NULL AND s.version < $4))
                    AND ($5::text IS NULL OR s.tenant > $5)
                  ORDER BY s.tenant LIMIT $6"
            ),
            &[
                &query.owner,
                &query.state,
                &query.quarantined,
                &behind,
                &query.after,
                &query.limit,
            ],
        )
        .await
        .map_err(Error::db("list tenants"))?;
    Ok(rows.iter().map(record).collect())
}

/// One tenant's record, or None when the control plane has never seen it.
pub async fn show_tenant(
    client: &impl GenericClient,
    id: &TenantId,
) -> Result<Option<TenantRecord>> {
    let row = client
        .query_opt(&format!("{RECORD_SQL} WHERE s.tenant = $1"), &[&id.key()])
        .await
        .map_err(Error::db(format!("show tenant {id}")))?;
    Ok(row.as_ref().map(record))
}

/// A trashed schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TrashRecord {
    /// The schema's name in the trash.
    pub schema: String,
    /// The tenant it belonged to.
    pub tenant: String,
    /// The epoch it was forgotten at.
    pub epoch: i64,
    /// Its name while live.
    pub live_name: String,
    /// Its migration version.
    pub version: i32,
    /// When it was trashed (UTC, RFC 3339).
    pub trashed_at: String,
    /// When the sweep removed it.
    pub swept_at: Option<String>,
}

/// Everything in the trash, newest first.
pub async fn list_trash(client: &impl GenericClient) -> Result<Vec<TrashRecord>> {
    let rows = client
        .query(
            "SELECT schema_name, tenant_key, epoch, live_name, schema_version,
                    to_char(trashed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    to_char(swept_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
               FROM pgtenant.trash ORDER BY trashed_at DESC, schema_name",
            &[],
        )
        .await
        .map_err(Error::db("list the trash"))?;
    Ok(rows
        .iter()
        .map(|row| TrashRecord {
            schema: row.get(0),
            tenant: row.get(1),
            epoch: row.get(2),
            live_name: row.get(3),
            version: row.get(4),
            trashed_at: row.get(5),
            swept_at: row.get(6),
        })
        .collect())
}

/// Clears a tenant's quarantine (recording `by` in the journal) so it can be opened again;
/// false when it was not quarantined. Do it after the repair the quarantine names.
pub async fn clear_quarantine(
    client: &impl GenericClient,
    id: &TenantId,
    by: &str,
) -> Result<bool> {
    client
        .query_one(
            "SELECT pgtenant.clear_quarantine($1, $2)",
            &[&id.key(), &by],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db(format!("clear the quarantine of tenant {id}")))
}

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
    let retention_ms = i64::try_from(options.retention.as_millis()).unwrap_or(i64::MAX);
    let rows = client
        .query(
            "SELECT schema_name, tenant_key, epoch, live_name,
                    trashed_at < now() - $1::bigint * interval '1 millisecond'
               FROM pgtenant.trash WHERE swept_at IS NULL ORDER BY trashed_at",
            &[&retention_ms],
        )
        .await
        .map_err(Error::db("read the trash"))?;
    let mut doomed: Vec<(String, String, bool)> = Vec::new();
    for row in rows {
        let (schema, tenant): (String, String) = (row.get(0), row.get(1));
        if !row.get::<_, bool>(4) {
            report.kept += 1;
            continue;
        }
        match trash_row_is_derived(&schema, &tenant, row.get(2), &row.get::<_, String>(3)) {
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
        match drop_schema(client, options, &schema, &tenant, &mut progress).await {
            Ok(()) => {
                if masked {
                    report.masked.push(schema.clone());
                }
                report.swept.push(schema);
            }
            Err(Error::Database { source, .. })
                if source.code().map(|c| c.code()) == Some("55P03") =>
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
    let pruned = client
        .query_one(
            "SELECT history_pruned, replicas_pruned FROM pgtenant.prune($1, $2)",
            &[&history_ms, &replicas_ms],
        )
        .await
        .map_err(Error::db("prune the journal and ended replicas"))?;
    report.history_pruned = u64::try_from(pruned.get::<_, i64>(0)).unwrap_or(0);
    report.replicas_pruned = u64::try_from(pruned.get::<_, i64>(1)).unwrap_or(0);
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
    let row = client
        .query_opt(
            "SELECT n.nspowner = coalesce((SELECT r.oid FROM pg_roles r, pgtenant.config c
                                            WHERE r.rolname = c.app_role),
                                           (SELECT p.nspowner FROM pg_namespace p WHERE p.nspname = 'pgtenant')),
                    pg_get_userbyid(n.nspowner)
               FROM pg_namespace n WHERE n.nspname = $1",
            &[&schema],
        )
        .await
        .map_err(Error::db(format!("check the owner of schema {schema}")))?;
    Ok(row.and_then(|row| {
        let expected: Option<bool> = row.get(0);
        let owner: String = row.get(1);
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
    let orphans = client
        .query(
            "SELECT n.nspname FROM pg_namespace n
              WHERE n.nspname ~ '^t_[a-z0-9_]+_[0-9]+_[0-9a-f]{10}$'
                AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.schema_name = n.nspname)
              ORDER BY 1",
            &[],
        )
        .await
        .map_err(Error::db("find orphan schemas"))?;
    let mut masked = Vec::new();
    for row in orphans {
        let schema: String = row.get(0);
        let epoch = life_epoch_of(&schema).unwrap_or(i64::MAX);
        // The name is a hash of key and epoch: recompute it for each tenant forgotten at or
        // after that epoch; a match attributes the schema, nothing else does.
        let candidates = client
            .query(
                "SELECT key FROM pgtenant.tenants WHERE forgotten_at_epoch >= $1",
                &[&epoch],
            )
            .await
            .map_err(Error::db("attribute an orphan schema"))?;
        let owner = candidates.iter().find_map(|row| {
            let key: String = row.get(0);
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

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn drop_schema(
    client: &mut Client,
    options: &SweepOptions,
    schema: &str,
    tenant: &str,
    progress: &mut impl FnMut(&str, usize),
) -> Result<()> {
    let context = || format!("sweep schema {schema}");
    let lock_timeout = format!("{}ms", options.lock_timeout.as_millis().max(1));
    let batch = i64::try_from(options.objects_per_transaction).unwrap_or(20);
    let mut dropped = 0;
    loop {
        let tx = client
            .build_transaction()
            .read_only(false)
            .start()
            .await
            .map_err(Error::db(context()))?;
        tx.execute(
            "SELECT set_config('lock_timeout', $1, true)",
            &[&lock_timeout],
        )
        .await
        .map_err(Error::db(context()))?;
        let live = tx
            .query_opt(
                "SELECT 1 FROM pgtenant.tenants WHERE schema_name = $1",
                &[&schema],
            )
            .await
            .map_err(Error::db(context()))?;
        if live.is_some() {
            // Became live (restored) since it was listed: never touch it.
            return Ok(());
        }
        // Partitions before their parents, so no single drop cascades over many relations.
        let objects = tx
            .query(
                "SELECT c.relname, c.relkind::text FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
                  ORDER BY c.relispartition DESC, c.relkind = 'S', c.relname
                  LIMIT $2",
                &[&schema, &batch],
            )
            .await
            .map_err(Error::db(context()))?;
        if objects.is_empty() {
            tx.batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                quote_ident(schema)
            ))
            .await
            .map_err(Error::db(context()))?;
            tx.execute("SELECT pgtenant.record_swept($1, $2)", &[&schema, &tenant])
                .await
                .map_err(Error::db(context()))?;
            tx.commit().await.map_err(Error::db(context()))?;
            // A schema with objects was reported after its last batch already.
            if dropped == 0 {
                progress(schema, dropped);
            }
            return Ok(());
        }
        let mut statements = String::new();
        for row in &objects {
            let (name, kind): (String, String) = (row.get(0), row.get(1));
            let what = match kind.as_str() {
                "v" => "VIEW",
                "m" => "MATERIALIZED VIEW",
                "f" => "FOREIGN TABLE",
                "S" => "SEQUENCE",
                _ => "TABLE",
            };
            statements.push_str(&format!(
                "DROP {what} IF EXISTS {}.{} CASCADE;",
                quote_ident(schema),
                quote_ident(&name)
            ));
        }
        tx.batch_execute(&statements)
            .await
            .map_err(Error::db(context()))?;
        tx.commit().await.map_err(Error::db(context()))?;
        dropped += objects.len();
        progress(schema, dropped);
    }
}

/// Parses durations such as `90s`, `15m`, `12h`, `7d` (for the command line).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let invalid = || Error::InvalidOption {
        option: "duration",
        reason: format!(
            "{:?} is not a duration; use a number with s, m, h or d, e.g. 7d",
            text.chars().take(40).collect::<String>()
        ),
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(invalid()),
    };
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(invalid)
}
