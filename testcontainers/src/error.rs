use std::error::Error as _;
use std::str::FromStr;

use crate::source::Source;

/// What to do when no source works; shown by [`TestkitError::NoSource`].
const INSTALL_HINT: &str = "To fix it, do one of: install the PostgreSQL server binaries \
(e.g. `apt-get install postgresql`, `dnf install postgresql-server`, `brew install postgresql`) \
so that initdb and postgres are on this machine; or run a PostgreSQL server on 127.0.0.1:5432; \
or set PGTENANT_TEST_DATABASE_URL to an admin URL of a server where databases may be created; \
or run a Docker engine (e.g. `apt-get install docker.io`; the test kit's `docker` feature, \
on by default, starts a PostgreSQL container on it).";

/// Why a test database or cluster could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// Every source was tried and none worked.
    #[error(
        "no PostgreSQL server for tests could be found or started. Tried:\n{}\n{INSTALL_HINT}",
        list(tried)
    )]
    NoSource {
        /// One line per source: its name and why it failed.
        tried: Vec<String>,
    },

    /// One source was required (by `PGTENANT_TESTKIT` or
    /// [`TestDatabase::create_from`](crate::TestDatabase::create_from)), and it failed.
    #[error("the `{requested}` test database source was required (PGTENANT_TESTKIT={requested} or TestDatabase::create_from), and it failed: {reason}")]
    SourceFailed {
        /// The source that was forced.
        requested: Source,
        /// Why it failed.
        reason: String,
    },

    /// `PGTENANT_TESTKIT` names no source.
    #[error("PGTENANT_TESTKIT={value:?} is not one of url, local, docker, initdb")]
    InvalidSourceName {
        /// The value found.
        value: String,
    },

    /// [`TestDatabase::create_role`](crate::TestDatabase::create_role) was given a suffix that
    /// is not 1 to 20 lowercase letters, digits or `_`.
    #[error("role suffix {suffix:?} must be 1 to 20 lowercase ASCII letters, digits or '_'")]
    InvalidRoleSuffix {
        /// The suffix given.
        suffix: String,
    },

    /// A PostgreSQL statement or connection failed.
    #[error("{context}: {}", describe_pg(source))]
    Postgres {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// A file, directory or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A cluster could not be made, started or stopped.
    #[error("{0}")]
    Cluster(String),

    /// A Docker engine could not be reached, or a container could not be
    /// started or removed.
    #[error("{0}")]
    Docker(String),

    /// An environment variable of the test kit holds a value it does not take.
    #[error("{name}={value:?} is not valid: expected {expected}")]
    InvalidSetting {
        /// The variable.
        name: &'static str,
        /// The value found.
        value: String,
        /// What it may be.
        expected: &'static str,
    },
}

fn list(tried: &[String]) -> String {
    tried
        .iter()
        .map(|line| format!("  - {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl TestkitError {
    pub(crate) fn pg(context: impl Into<String>, source: tokio_postgres::Error) -> Self {
        TestkitError::Postgres {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TestkitError::Io {
            context: context.into(),
            source,
        }
    }
}

/// A tokio-postgres error with its cause: the driver's own `Display` says only
/// "db error" or "error connecting to server".
pub(crate) fn describe_pg(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            s.push_str(&format!("; detail: {detail}"));
        }
        if let Some(hint) = db.hint() {
            s.push_str(&format!("; hint: {hint}"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

// Here rather than in `source.rs`: the error names `Source`, so the parse that returns the
// error sits with it and the two modules do not import each other.
impl FromStr for Source {
    type Err = TestkitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Source::ALL
            .into_iter()
            .find(|source| source.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| TestkitError::InvalidSourceName {
                value: s.to_owned(),
            })
    }
}
