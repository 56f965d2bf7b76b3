//! The sweep's SQL (DESIGN §5 "Sweep"): the trash, orphan schemas, records of what was swept,
//! pruning of history.

use tokio_postgres::{Client, Transaction};

use crate::error::{Error, Result};
use crate::lease::Epoch;

/// A trash row not swept yet, as the sweep reads it (it trusts none of it: DESIGN G8).
pub(crate) struct UnsweptTrash {
    /// The schema's name in the trash.
    pub(crate) schema: String,
    /// The tenant key it names.
    pub(crate) tenant: String,
    /// The epoch it was forgotten at.
    pub(crate) epoch: i64,
    /// Its name while live.
    pub(crate) live_name: String,
    /// Trashed longer ago than the retention: the sweep may drop it.
    pub(crate) due: bool,
}

/// The trash rows no sweep removed yet, oldest first, each with whether it is past
/// `retention_ms` by the database's clock.
pub(crate) async fn unswept_trash(client: &Client, retention_ms: i64) -> Result<Vec<UnsweptTrash>> {
    let rows = client
        .query(
            "SELECT schema_name, tenant_key, epoch, live_name,
                    trashed_at < now() - $1::bigint * interval '1 millisecond'
               FROM pgtenant.trash WHERE swept_at IS NULL ORDER BY trashed_at",
            &[&retention_ms],
        )
        .await
        .map_err(Error::db("read the trash"))?;
    Ok(rows
        .iter()
        .map(|row| UnsweptTrash {
            schema: row.get(0),
            tenant: row.get(1),
            epoch: row.get(2),
            live_name: row.get(3),
            due: row.get(4),
        })
        .collect())
}

/// `pgtenant.prune`: journal rows older than `history_ms` and ended replicas older than
/// `replicas_ms` that no tenant names; how many of each went.
pub(crate) async fn prune(
    client: &Client,
    history_ms: i64,
    replicas_ms: i64,
) -> Result<(i64, i64)> {
    let pruned = client
        .query_one(
            "SELECT history_pruned, replicas_pruned FROM pgtenant.prune($1, $2)",
            &[&history_ms, &replicas_ms],
        )
        .await
        .map_err(Error::db("prune the journal and ended replicas"))?;
    Ok((pruned.get(0), pruned.get(1)))
}

/// Whether `schema` is owned by the tenant-owner role (`pgtenant.config.app_role`, or the
/// control plane's owner without one; None when neither says), and its owner's name: the sweep
/// drops only what pgtenant could have made. None when the schema is gone.
pub(crate) async fn schema_owner(
    client: &Client,
    schema: &str,
) -> Result<Option<(Option<bool>, String)>> {
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
        .map_err(Error::db_with(|| format!("check the owner of schema {schema}")))?;
    Ok(row.map(|row| (row.get(0), row.get(1))))
}

/// Tenant-shaped schemas outside the trash that no tenant names as its live schema, by name:
/// what a masked epoch leaves behind (or something pgtenant never made).
pub(crate) async fn orphan_schemas(client: &Client) -> Result<Vec<String>> {
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
    Ok(orphans.iter().map(|row| row.get(0)).collect())
}

/// The keys of the tenants forgotten at or after `epoch`: the only ones an orphan schema of
/// that epoch can belong to.
pub(crate) async fn forgotten_keys(client: &Client, epoch: Epoch) -> Result<Vec<String>> {
    let candidates = client
        .query(
            "SELECT key FROM pgtenant.tenants WHERE forgotten_at_epoch >= $1",
            &[&epoch.get()],
        )
        .await
        .map_err(Error::db("attribute an orphan schema"))?;
    Ok(candidates.iter().map(|row| row.get(0)).collect())
}

/// The error context of every statement of one schema's drop.
fn sweeping(schema: &str) -> impl FnOnce(tokio_postgres::Error) -> Error + '_ {
    Error::db_with(move || format!("sweep schema {schema}"))
}

/// Bounds the lock waits of the rest of `tx` (`lock_timeout`, e.g. `"2000ms"`): a schema whose
/// objects are busy is deferred instead of queueing everyone behind it.
pub(crate) async fn set_lock_timeout(
    tx: &Transaction<'_>,
    schema: &str,
    lock_timeout: &str,
) -> Result<()> {
    tx.execute(
        "SELECT set_config('lock_timeout', $1, true)",
        &[&lock_timeout],
    )
    .await
    .map(drop)
    .map_err(sweeping(schema))
}

/// Whether a tenant names `schema` as its live schema: restored since it was listed, and then
/// never to be touched.
pub(crate) async fn schema_is_live(tx: &Transaction<'_>, schema: &str) -> Result<bool> {
    let live = tx
        .query_opt(
            "SELECT 1 FROM pgtenant.tenants WHERE schema_name = $1",
            &[&schema],
        )
        .await
        .map_err(sweeping(schema))?;
    Ok(live.is_some())
}

/// `pgtenant.begin_sweep`: marks (and locks) the trash row before the first drop, so a
/// restore is whole or refused; false when the row is gone or swept (restored, or another
/// sweep).
pub(crate) async fn begin_sweep(tx: &Transaction<'_>, schema: &str) -> Result<bool> {
    tx.query_one("SELECT pgtenant.begin_sweep($1)", &[&schema])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(sweeping(schema))
}

/// A schema's tables, views, foreign tables and sequences, a batch at a time.
///
/// Found through `pg_depend` (each of them depends on its namespace, and pg_depend is indexed
/// by what is depended on), never by `pg_class.relnamespace`, which no index leads with: with
/// 100 000 tenant schemas pg_class holds about 2.7 million rows, and every batch of the sweep
/// read them all (docs/scale.md has the measured times, old and new). TOAST tables and
/// indexes have no such dependency and go with their tables, as before.
const SCHEMA_OBJECTS_SQL: &str = "SELECT c.relname, c.relkind::text
       FROM pg_depend d
       JOIN pg_class c ON c.oid = d.objid
      WHERE d.refclassid = 'pg_namespace'::regclass
        AND d.refobjid = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = $1)
        AND d.refobjsubid = 0
        AND d.classid = 'pg_class'::regclass
        AND d.deptype = 'n'
        AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
      ORDER BY c.relispartition DESC, c.relkind = 'S', c.relname
      LIMIT $2";

/// Up to `batch` of `schema`'s objects as (name, `relkind`), partitions before their parents,
/// so no single drop cascades over many relations.
pub(crate) async fn schema_objects(
    tx: &Transaction<'_>,
    schema: &str,
    batch: i64,
) -> Result<Vec<(String, String)>> {
    let objects = tx
        .query(SCHEMA_OBJECTS_SQL, &[&schema, &batch])
        .await
        .map_err(sweeping(schema))?;
    Ok(objects.iter().map(|row| (row.get(0), row.get(1))).collect())
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Drops these objects (name, `relkind`) of `schema`, in one round trip.
pub(crate) async fn drop_objects(
    tx: &Transaction<'_>,
    schema: &str,
    objects: &[(String, String)],
) -> Result<()> {
    let mut statements = String::new();
    for (name, kind) in objects {
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
            quote_ident(name)
        ));
    }
    tx.batch_execute(&statements)
        .await
        .map_err(sweeping(schema))
}

/// Drops `schema` itself, if it is there, once it is empty (what is left cascades: small).
pub(crate) async fn drop_schema(tx: &Transaction<'_>, schema: &str) -> Result<()> {
    tx.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        quote_ident(schema)
    ))
    .await
    .map_err(sweeping(schema))
}

/// `pgtenant.record_swept`, after the drop in the same transaction (it refuses a schema that
/// still exists): the trash row marked swept and the journal told, or neither.
pub(crate) async fn record_swept(tx: &Transaction<'_>, schema: &str, tenant: &str) -> Result<()> {
    tx.execute("SELECT pgtenant.record_swept($1, $2)", &[&schema, &tenant])
        .await
        .map(drop)
        .map_err(sweeping(schema))
}
