//! Tenant ledgers: the application's migrations, run in a tenant's schema under its lease.

use refinery::{Migration, Runner};
use tokio_postgres::Transaction;

use crate::error::{Error, Result};
use crate::migrate::InTransaction;

/// refinery's history table, unqualified: it resolves to the tenant schema through the
/// transaction's pinned search_path, so each tenant records its own migrations.
const TENANT_HISTORY_TABLE: &str = "refinery_schema_history";

/// Applies the migrations this tenant lacks inside `tx`, whose search_path is already pinned to
/// the tenant's schema and whose lease check (fence or FOR UPDATE) already ran. Returns the
/// names applied. A failure is a [`Error::MigrationFailed`] naming the migration and carrying
/// the server's message; the caller rolls back and quarantines.
pub(crate) async fn apply(tx: &Transaction<'_>, migrations: &[Migration]) -> Result<Vec<String>> {
    if migrations.is_empty() {
        return Ok(Vec::new());
    }
    let mut runner = Runner::new(migrations);
    runner.set_migration_table_name(TENANT_HISTORY_TABLE);
    let report = runner
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .run_async(&mut InTransaction(tx))
        .await
        .map_err(|error| Error::MigrationFailed {
            cause: describe_refinery(&error),
        })?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect())
}

/// refinery's Display names the migration; the server's words sit deeper in the source chain,
/// behind a tokio-postgres error whose own Display leaves them out.
pub(crate) fn describe_refinery(error: &refinery::Error) -> String {
    let mut text = error.to_string();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(inner) = cause {
        if let Some(pg) = inner.downcast_ref::<tokio_postgres::Error>() {
            if let Some(db) = pg.as_db_error() {
                text.push_str(&format!(
                    ": {} (SQLSTATE {})",
                    db.message(),
                    db.code().code()
                ));
                return text;
            }
        }
        cause = inner.source();
    }
    text
}
