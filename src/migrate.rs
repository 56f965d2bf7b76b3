//! Runs refinery migrations inside a transaction the caller holds (DESIGN §4, §5 "Tenant
//! migrations").
//!
//! refinery's own tokio-postgres driver opens and commits a transaction per step and takes no
//! lock, so two runners on one schema collide. Driving it through an open transaction instead
//! lets pgtenant take its advisory lock (or a tenant's lease fence) first and makes the whole
//! run atomic: a failing migration leaves nothing behind.

use refinery::Migration;
use refinery_core::traits::r#async::{AsyncMigrate, AsyncQuery, AsyncTransaction};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio_postgres::Transaction;

/// A refinery connection whose every statement runs in one outer transaction. With `.1` set
/// (tenant migrations on Citus, see `citus.rs`), each migration's text is sent one statement
/// at a time.
pub(crate) struct InTransaction<'t, 'c>(pub(crate) &'t Transaction<'c>, pub(crate) bool);

impl AsyncTransaction for InTransaction<'_, '_> {
    type Error = tokio_postgres::Error;

    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &'a mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        let mut count = 0;
        for query in queries {
            if self.1 {
                for statement in crate::citus::split_statements(query) {
                    self.0.batch_execute(statement).await?;
                }
            } else {
                self.0.batch_execute(query).await?;
            }
            count += 1;
        }
        Ok(count)
    }
}

impl AsyncQuery<Vec<Migration>> for InTransaction<'_, '_> {
    async fn query<'a>(&'a mut self, query: &'a str) -> Result<Vec<Migration>, Self::Error> {
        let rows = self.0.query(query, &[]).await?;
        let mut applied = Vec::with_capacity(rows.len());
        for row in rows {
            let applied_on: String = row.try_get(2)?;
            let checksum: String = row.try_get(3)?;
            // refinery writes both columns itself; a row it could not have written is reported
            // by refinery as a divergent migration rather than crashing here.
            let applied_on =
                OffsetDateTime::parse(&applied_on, &Rfc3339).unwrap_or(OffsetDateTime::UNIX_EPOCH);
            applied.push(Migration::applied(
                row.try_get(0)?,
                row.try_get(1)?,
                applied_on,
                checksum.parse().unwrap_or(0),
            ));
        }
        Ok(applied)
    }
}

impl AsyncMigrate for InTransaction<'_, '_> {}

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
