//! What can go wrong in the command, each with what to do about it.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::time::Duration;

use tokio_postgres::error::DbError;

use crate::duration;

/// Every failure of a command. Usage errors are clap's own (exit status 2); these exit with 1.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error(
        "no database: pass --database-url postgres://user@host:port/database or set DATABASE_URL"
    )]
    NoDatabase,

    /// A part of the connection string is wrong; says which and what is accepted.
    #[error("database URL: {0}")]
    BadUrl(String),

    #[error("cannot connect to {target}: {cause}")]
    Connect { target: String, cause: String },

    #[error(
        "no connection to {target} within {} (--connect-timeout): the server did not complete \
         the connection (TCP, TLS, startup or authentication) in time; check the host and port, \
         or raise --connect-timeout", duration::show(*.timeout)
    )]
    ConnectTimeout { target: String, timeout: Duration },

    #[error(
        "the replica did not start within {} (--connect-timeout): its connections to {target} \
         (lease session, pooler probe) did not complete in time; check the server, or raise \
         --connect-timeout", duration::show(*.timeout)
    )]
    StartTimeout { target: String, timeout: Duration },

    /// Setting TLS up (the connector, the root certificate) failed.
    #[error("TLS: {0}")]
    Tls(String),

    #[error("cannot connect to {target} over TLS: {why}")]
    TlsHandshake { target: String, why: String },

    #[error("no pgtenant control plane in this database: run `pgtenant setup`")]
    NoControlPlane,

    #[error(
        "this database's pgtenant control plane is at version {found}, newer than this pgtenant \
         (version {supported}): `pgtenant {command}` changes the database and is refused; use a \
         pgtenant that knows version {found}"
    )]
    ControlPlaneTooNew {
        found: i64,
        supported: i64,
        command: &'static str,
    },

    #[error(
        "this database's pgtenant control plane is at version {found}, this pgtenant needs \
         {needed}: run `pgtenant setup` to upgrade it before `pgtenant {command}`"
    )]
    ControlPlaneBehind {
        found: i64,
        needed: i64,
        command: &'static str,
    },

    #[error("{}", explain(.0))]
    Pgtenant(#[from] pgtenant::Error),

    #[error("{context}: {}", explain(.source))]
    Database {
        context: String,
        source: tokio_postgres::Error,
    },

    #[error("tenant {0} is unknown to this control plane")]
    UnknownTenant(pgtenant::TenantId),

    #[error("migrations in {dir}: {reason}")]
    Migrations { dir: String, reason: String },

    #[error(
        "of {total} tenant(s) behind, {failed} failed and {not_attempted} were not attempted: \
         repair the migration, `pgtenant clear` each quarantined tenant, and run `pgtenant \
         migrate` again (`pgtenant tenants --quarantined` lists them)"
    )]
    MigrationsFailed {
        failed: usize,
        not_attempted: usize,
        total: usize,
    },

    /// Writing to stdout failed. A closed pipe (`pgtenant status | head -1`) ends the command
    /// quietly instead.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),

    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),

    #[cfg(feature = "demo")]
    #[error("throwaway PostgreSQL: {0}")]
    Testkit(#[from] pgtenant_testkit::TestkitError),
}

impl CliError {
    pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> CliError {
        let context = context.into();
        move |source| CliError::Database { context, source }
    }

    /// True when stdout was closed by its reader: the command stops without a word.
    pub(crate) fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// An error and what its cause chain adds: the server's message, detail, hint, SQLSTATE and
/// context wherever a PostgreSQL error sits in the chain (tokio-postgres' own Display says only
/// "db error", and refinery wraps it once more), else each cause's words.
pub(crate) fn explain(error: &(dyn StdError + 'static)) -> String {
    if let Some(db) = error
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error)
    {
        return describe_db(db);
    }
    // refinery's words for a failed migration: "`error applying migration V1__x`, `db error`".
    let mut text = error.to_string().replace(", `db error`", "");
    let mut cause = error.source();
    while let Some(inner) = cause {
        if let Some(db) = inner.downcast_ref::<DbError>() {
            // pgtenant's own errors already carry message, SQLSTATE, detail and hint.
            let head = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if !text.contains(&head) {
                let _ = write!(text, ": {}", describe_db(db));
            } else if let Some(context) = db.where_() {
                let _ = write!(text, "; context: {}", one_line(context));
            }
            return text;
        }
        let words = inner.to_string();
        // tokio-postgres says "db error" before the DbError itself; thiserror wrappers repeat
        // their source.
        if words != "db error" && !text.contains(&words) {
            let _ = write!(text, ": {words}");
        }
        cause = inner.source();
    }
    text
}

/// The server's report, all of it that helps.
pub(crate) fn describe_db(db: &DbError) -> String {
    let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        let _ = write!(text, "; detail: {detail}");
    }
    if let Some(hint) = db.hint() {
        let _ = write!(text, "; hint: {hint}");
    }
    if let Some(context) = db.where_() {
        let _ = write!(text, "; context: {}", one_line(context));
    }
    text
}

fn one_line(text: &str) -> String {
    text.replace('\n', " / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn explain_appends_causes_once() {
        let error = Outer(std::io::Error::other("the cause"));
        assert_eq!(explain(&error), "outer: the cause");
    }
}
