//! [`Source`]: where a test database's server comes from, and the variable that forces one.
//! Its parsing (`FromStr`) lives in `error.rs`, beside the error it returns, so that this
//! module, which the error names, imports nothing of the crate.

use std::fmt;

/// The environment variable that forces one [`Source`].
pub const SOURCE_ENV: &str = "PGTENANT_TESTKIT";

/// Where a test database came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The server of `PGTENANT_TEST_DATABASE_URL` or `DATABASE_URL`.
    Url,
    /// A server already listening on `127.0.0.1:5432`.
    Local,
    /// A container started through testcontainers (cargo feature `docker`).
    Docker,
    /// A throwaway cluster made with the machine's `initdb` and `postgres`.
    Initdb,
    /// A throwaway Citus cluster (a coordinator and [`DEFAULT_WORKERS`](crate::DEFAULT_WORKERS) workers, see
    /// [`CitusCluster`](crate::CitusCluster)) when Citus is installed: used only when `PGTENANT_TESTKIT=citus`
    /// forces it. Each database has the extension and the workers in its metadata.
    Citus,
}

impl Source {
    /// Every source.
    pub const ALL: [Source; 5] = [
        Source::Url,
        Source::Local,
        Source::Docker,
        Source::Initdb,
        Source::Citus,
    ];

    /// The sources [`TestDatabase::create`](crate::TestDatabase::create) tries, in order, when none is forced.
    pub const AUTOMATIC: [Source; 4] = [Source::Url, Source::Local, Source::Docker, Source::Initdb];

    /// The name used by `PGTENANT_TESTKIT`: `url`, `local`, `docker`, `initdb` or `citus`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Url => "url",
            Source::Local => "local",
            Source::Docker => "docker",
            Source::Initdb => "initdb",
            Source::Citus => "citus",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
