//! Test databases and the per-process choice of the server they live on.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::OnceCell;
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use crate::cluster::{Cluster, Durability};
use crate::error::{describe_pg, TestkitError};
use crate::{forced_source, sweep, Source};

/// Every test database's name starts with this; the sweep relies on it.
pub(crate) const NAME_PREFIX: &str = "pgtenant_test_";

/// How long an admin connection (connect, authenticate, one query) may take
/// before a source counts as not working.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The server test databases are created on, with an admin connection to it.
pub(crate) struct Server {
    pub(crate) source: Source,
    /// Connects to the admin database (`postgres`, or the URL's database).
    pub(crate) admin: Config,
    /// The admin URL; a test database's URL is this with its name swapped in.
    pub(crate) base_url: String,
    /// The container's id, for the `docker` source.
    pub(crate) container_id: Option<String>,
    /// Keeps the server (an initdb cluster or a container) running while any
    /// database on it is alive.
    pub(crate) _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Admin connections to the workers of a Citus cluster ([`Source::Citus`]): each test
    /// database is made and dropped on them too. Empty for every other source.
    pub(crate) workers: Vec<Config>,
    /// The coordinator's port, for `citus_set_coordinator_host` ([`Source::Citus`] only).
    pub(crate) coordinator_port: Option<u16>,
}

impl Server {
    pub(crate) async fn create_database(self: &Arc<Self>) -> Result<TestDatabase, TestkitError> {
        let name = new_name();
        let client = connect_admin(&self.admin).await?;
        // template0 accepts no connections, so concurrent CREATE DATABASEs never
        // fail with "source database is being accessed by other users".
        client
            .batch_execute(&format!(
                "CREATE DATABASE {} TEMPLATE template0",
                quote_ident(&name)
            ))
            .await
            .map_err(|e| TestkitError::pg(format!("creating database {name}"), e))?;
        let url = replace_dbname(&self.base_url, &name);
        let config = url
            .parse::<Config>()
            .map_err(|e| TestkitError::pg(format!("parsing the URL of database {name}"), e))?;
        tracing::debug!(database = %name, source = %self.source, "created test database");
        let database = TestDatabase {
            name,
            url,
            config,
            server: Arc::clone(self),
            roles: std::sync::Mutex::new(Vec::new()),
        };
        if !self.workers.is_empty() {
            // Dropping `database` on an error drops whatever was made on every node.
            crate::citus::prepare_database(self, &database.name).await?;
        }
        Ok(database)
    }
}

/// A fresh, empty database for one test.
///
/// It is dropped (`DROP DATABASE ... WITH (FORCE)`, which ends open
/// connections) when the value is dropped. A database on a [`LocalCluster`]
/// keeps that cluster running until the database is dropped.
///
/// [`LocalCluster`]: crate::LocalCluster
pub struct TestDatabase {
    name: String,
    url: String,
    config: Config,
    server: Arc<Server>,
    /// Roles made for this database, dropped after it.
    roles: std::sync::Mutex<Vec<String>>,
}

/// A login role made by [`TestDatabase::create_role`]: not a superuser, with no privilege
/// beyond what PUBLIC has until the test grants some. Dropped with its database.
#[derive(Debug, Clone)]
pub struct TestRole {
    name: String,
    url: String,
    config: Config,
}

impl TestRole {
    /// The role's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL, logging in as this role.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's connection settings, logging in as this role.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// Connects as this role, without TLS; the connection runs on a spawned tokio task.
    pub async fn connect(&self) -> Result<Client, TestkitError> {
        connect(&self.config)
            .await
            .map_err(|e| TestkitError::pg(format!("connecting as role {}", self.name), e))
    }
}

impl TestDatabase {
    /// Creates a database on the first source that works (see the crate
    /// docs), or on the one `PGTENANT_TESTKIT` forces.
    ///
    /// Each source is tried at most once per process; the server found is
    /// reused by every later call.
    pub async fn create() -> Result<TestDatabase, TestkitError> {
        let forced = forced_source()?;
        create_with(forced).await
    }

    /// Creates a database on exactly this source, whatever `PGTENANT_TESTKIT`
    /// says; fails with [`TestkitError::SourceFailed`] if it does not work.
    pub async fn create_from(source: Source) -> Result<TestDatabase, TestkitError> {
        create_with(Some(source)).await
    }

    /// `postgres://user@host:port/name`, for code that takes a URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The connection settings of [`url`](Self::url).
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// The connection settings of the server's admin database, e.g. to check
    /// from outside that a database exists.
    pub fn admin_config(&self) -> Config {
        self.server.admin.clone()
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the server came from.
    pub fn source(&self) -> Source {
        self.server.source
    }

    /// Creates a login role `<database>_<suffix>` (suffix: lowercase letters, digits and
    /// `_`, at most 20 bytes) that is not a superuser and has only PUBLIC's privileges, with a
    /// random password in its URL (so it works whatever the server's authentication). It is
    /// dropped, with everything it owns, after the database. For tests of least privilege:
    /// grant it what an application's or operator's role would get.
    pub async fn create_role(&self, suffix: &str) -> Result<TestRole, TestkitError> {
        let valid = !suffix.is_empty()
            && suffix.len() <= 20
            && suffix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(TestkitError::InvalidRoleSuffix {
                suffix: suffix.chars().take(40).collect(),
            });
        }
        let name = format!("{}_{suffix}", self.name);
        let password = format!("{:x}{:x}", new_nonce(), new_nonce());
        let client = connect_admin(&self.server.admin).await?;
        client
            .batch_execute(&format!(
                "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{password}'",
                quote_ident(&name)
            ))
            .await
            .map_err(|e| TestkitError::pg(format!("creating role {name}"), e))?;
        self.roles
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(name.clone());
        let mut config = self.config.clone();
        config.user(&name).password(password.as_str());
        let url = replace_user(&self.url, &name, &password);
        Ok(TestRole { name, url, config })
    }

    /// The id of the Docker container the database lives in, for the `docker` source (and
    /// `DockerPostgres`); `None` for the others.
    pub fn container_id(&self) -> Option<&str> {
        self.server.container_id.as_deref()
    }

    /// Connects without TLS; the connection runs on a spawned tokio task.
    pub async fn connect(&self) -> Result<Client, TestkitError> {
        connect(&self.config)
            .await
            .map_err(|e| TestkitError::pg(format!("connecting to test database {}", self.name), e))
    }
}

impl fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDatabase")
            .field("name", &self.name)
            .field("source", &self.server.source)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop cannot await, and blocking on the caller's runtime could
        // deadlock, so a thread with its own runtime does the DROP.
        let admin = self.server.admin.clone();
        let workers = self.server.workers.clone();
        let name = self.name.clone();
        let roles = std::mem::take(
            &mut *self
                .roles
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        let spawned = std::thread::Builder::new()
            .name("pgtenant-testkit-drop".into())
            .spawn(move || drop_database_blocking(&admin, &workers, &name, &roles));
        match spawned {
            Ok(handle) => {
                if handle.join().is_err() {
                    tracing::warn!(database = %self.name, "thread dropping the test database panicked");
                }
            }
            Err(e) => {
                tracing::warn!(database = %self.name, error = %e, "could not spawn a thread to drop the test database")
            }
        }
    }
}

fn drop_database_blocking(admin: &Config, workers: &[Config], name: &str, roles: &[String]) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::warn!(database = %name, error = %e, "no runtime to drop the test database");
            return;
        }
    };
    runtime.block_on(async {
        match tokio::time::timeout(Duration::from_secs(60), drop_database(admin, name)).await {
            Ok(Ok(())) => tracing::debug!(database = %name, "dropped test database"),
            Ok(Err(e)) => {
                tracing::warn!(database = %name, error = %e, "could not drop test database")
            }
            Err(_) => tracing::warn!(database = %name, "timed out dropping test database"),
        }
        for worker in workers {
            let dropped =
                tokio::time::timeout(Duration::from_secs(60), drop_database(worker, name)).await;
            if !matches!(dropped, Ok(Ok(()))) {
                tracing::warn!(database = %name, worker = %describe_target(worker), "could not drop the test database on a Citus worker");
            }
        }
        // After the database, which held everything they own or were granted but for the
        // database's own ACL, which DROP DATABASE removed too.
        for role in roles {
            let dropped = async {
                connect_admin(admin)
                    .await?
                    .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(role)))
                    .await
                    .map_err(|e| TestkitError::pg(format!("dropping role {role}"), e))
            };
            if let Err(e) = dropped.await {
                tracing::warn!(%role, error = %e, "could not drop test role");
            }
        }
    });
}

pub(crate) async fn drop_database(admin: &Config, name: &str) -> Result<(), TestkitError> {
    let client = connect_admin(admin).await?;
    client
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(name)
        ))
        .await
        .map_err(|e| TestkitError::pg(format!("dropping database {name}"), e))
}

async fn create_with(forced: Option<Source>) -> Result<TestDatabase, TestkitError> {
    sweep::sweep_temp_dirs_once();
    let server = match forced {
        Some(source) => {
            shared_server(source)
                .await
                .map_err(|reason| TestkitError::SourceFailed {
                    requested: source,
                    reason,
                })?
        }
        None => {
            let mut tried = Vec::new();
            let mut found = None;
            for source in Source::AUTOMATIC {
                match shared_server(source).await {
                    Ok(server) => {
                        found = Some(server);
                        break;
                    }
                    Err(reason) => tried.push(format!("{source}: {reason}")),
                }
            }
            match found {
                Some(server) => {
                    if !tried.is_empty() {
                        tracing::debug!(source = %server.source, skipped = ?tried, "test database source chosen");
                    }
                    server
                }
                None => return Err(TestkitError::NoSource { tried }),
            }
        }
    };
    server.create_database().await
}

/// One cell per source, so that each is tried (and, for docker and initdb,
/// started) at most once per process, failures included: retrying a failed
/// initdb for every test would only repeat the same error slowly.
static SERVERS: [OnceCell<Result<Arc<Server>, String>>; 5] = [const { OnceCell::const_new() }; 5];

async fn shared_server(source: Source) -> Result<Arc<Server>, String> {
    let index = match source {
        Source::Url => 0,
        Source::Local => 1,
        Source::Docker => 2,
        Source::Initdb => 3,
        Source::Citus => 4,
    };
    SERVERS[index]
        .get_or_init(|| async move {
            let server = match source {
                Source::Url => url_server().await,
                Source::Local => local_server().await,
                Source::Docker => docker_server().await,
                Source::Initdb => initdb_server().await,
                Source::Citus => crate::citus::citus_server().await,
            }?;
            tracing::info!(%source, server = %describe_target(&server.admin), "pgtenant-testkit found its test server");
            if matches!(source, Source::Url | Source::Local) {
                // Servers that outlive this process may hold databases of
                // killed test runs; a fresh container or cluster cannot.
                sweep::sweep_databases(&server.admin).await;
            }
            Ok(Arc::new(server))
        })
        .await
        .clone()
}

async fn url_server() -> Result<Server, String> {
    let (var, url) = ["PGTENANT_TEST_DATABASE_URL", "DATABASE_URL"]
        .into_iter()
        .find_map(|var| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| (var, v))
        })
        .ok_or_else(|| "neither PGTENANT_TEST_DATABASE_URL nor DATABASE_URL is set".to_owned())?;
    let mut admin = url.parse::<Config>().map_err(|e| {
        format!(
            "{var} is not a valid connection string: {}",
            describe_pg(&e)
        )
    })?;
    if admin.get_connect_timeout().is_none() {
        admin.connect_timeout(Duration::from_secs(5));
    }
    let base_url = if is_url(&url) {
        url
    } else {
        url_from_config(&admin)
    };
    if let Err(e) = check_admin(&admin).await {
        let reason = format!("{var} ({}): {e}", describe_target(&admin));
        // The variable was set on purpose; falling through to another source
        // silently would hide a broken CI setup.
        tracing::warn!(%reason, "test database URL does not work; trying the next source");
        return Err(reason);
    }
    Ok(Server {
        source: Source::Url,
        admin,
        base_url,
        container_id: None,
        _keep: None,
        workers: Vec::new(),
        coordinator_port: None,
    })
}

async fn local_server() -> Result<Server, String> {
    let user = std::env::var("PGUSER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres".to_owned());
    let password = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty());
    let mut admin = Config::new();
    admin
        .host("127.0.0.1")
        .port(5432)
        .user(&user)
        .dbname("postgres")
        // Nothing listening usually fails at once; a filtered port must not
        // stall every test run.
        .connect_timeout(Duration::from_secs(2));
    let mut auth = encode_component(user.as_bytes());
    if let Some(password) = &password {
        admin.password(password);
        auth.push(':');
        auth.push_str(&encode_component(password.as_bytes()));
    }
    check_admin(&admin)
        .await
        .map_err(|e| format!("127.0.0.1:5432 as user {user}: {e}"))?;
    Ok(Server {
        source: Source::Local,
        admin,
        base_url: format!("postgres://{auth}@127.0.0.1:5432/postgres"),
        container_id: None,
        _keep: None,
        workers: Vec::new(),
        coordinator_port: None,
    })
}

#[cfg(feature = "docker")]
async fn docker_server() -> Result<Server, String> {
    crate::docker::start().await
}

#[cfg(not(feature = "docker"))]
async fn docker_server() -> Result<Server, String> {
    Err("pgtenant-testkit was built without its `docker` cargo feature".to_owned())
}

async fn initdb_server() -> Result<Server, String> {
    let cluster = Cluster::start(Durability::Fast)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(cluster).server())
}

/// Checks that `admin` connects within [`ADMIN_TIMEOUT`], runs PostgreSQL 13+
/// (for `DROP DATABASE ... WITH (FORCE)`) and may create databases.
pub(crate) async fn check_admin(admin: &Config) -> Result<(), String> {
    let check = async {
        let client = connect(admin).await.map_err(|e| describe_pg(&e))?;
        let row = client
            .query_one(
                "SELECT current_setting('server_version_num')::int, \
                        current_setting('server_version'), \
                        current_user::text, \
                        (SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user)",
                &[],
            )
            .await
            .map_err(|e| describe_pg(&e))?;
        let version_num: i32 = row.get(0);
        let version: String = row.get(1);
        let user: String = row.get(2);
        let may_create: Option<bool> = row.get(3);
        if version_num < 130_000 {
            return Err(format!(
                "the server runs PostgreSQL {version}; 13 or newer is needed for DROP DATABASE ... WITH (FORCE)"
            ));
        }
        if may_create != Some(true) {
            return Err(format!(
                "role {user} may not create databases (it needs CREATEDB)"
            ));
        }
        Ok(())
    };
    tokio::time::timeout(ADMIN_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}s", ADMIN_TIMEOUT.as_secs())))
}

/// Connects without TLS and runs the connection on a spawned task.
pub(crate) async fn connect(config: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %describe_pg(&e), "test database connection ended with an error");
        }
    });
    Ok(client)
}

/// [`connect`] bounded by [`ADMIN_TIMEOUT`], for admin work on a server that
/// may have gone away.
pub(crate) async fn connect_admin(admin: &Config) -> Result<Client, TestkitError> {
    let context = || {
        format!(
            "connecting to the admin database at {}",
            describe_target(admin)
        )
    };
    match tokio::time::timeout(ADMIN_TIMEOUT, connect(admin)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(TestkitError::pg(context(), e)),
        Err(_) => Err(TestkitError::io(
            context(),
            std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"),
        )),
    }
}

pub(crate) fn new_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{NAME_PREFIX}{}_{}_{}",
        unix_secs(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// When a test database was created, from its name.
pub(crate) fn created_at(name: &str) -> Option<u64> {
    name.strip_prefix(NAME_PREFIX)?
        .split('_')
        .next()?
        .parse()
        .ok()
}

pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `host:port/dbname` of a config, never its password, for messages.
pub(crate) fn describe_target(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "(no host)".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{host}:{port}/{}",
        config.get_dbname().unwrap_or("(default database)")
    )
}

fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub(crate) fn encode_component(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `url` with its database replaced, keeping credentials, hosts and query
/// parameters. Splits the way tokio-postgres parses: the credentials end at
/// the first `@`, the hosts at the next `/` or `?`.
/// `url` logging in as `user` with `password` instead of whoever it named.
fn replace_user(url: &str, user: &str, password: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let hosts = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!(
        "{scheme}{}:{}@{hosts}",
        encode_component(user.as_bytes()),
        encode_component(password.as_bytes())
    )
}

/// 64 random bits, from the standard library's randomly keyed hasher (no extra dependency
/// for a test role's password).
fn new_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(unix_secs());
    hasher.finish()
}

pub(crate) fn replace_dbname(url: &str, dbname: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let hosts_start = rest.find('@').map_or(0, |at| at + 1);
    let hosts_end = rest[hosts_start..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| hosts_start + i);
    let tail = &rest[hosts_end..];
    let query = match tail.strip_prefix('/') {
        Some(path) => path.find('?').map_or("", |q| &path[q..]),
        None => tail,
    };
    format!(
        "{scheme}{}/{}{query}",
        &rest[..hosts_end],
        encode_component(dbname.as_bytes())
    )
}

/// A URL for a key=value connection string: its first host, port, user,
/// password and database (other settings are not carried over).
fn url_from_config(config: &Config) -> String {
    use std::os::unix::ffi::OsStrExt;

    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) if host.contains(':') => format!("[{host}]"),
        Some(Host::Tcp(host)) => encode_component(host.as_bytes()),
        Some(Host::Unix(path)) => encode_component(path.as_os_str().as_bytes()),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let mut auth = String::new();
    if let Some(user) = config.get_user() {
        auth.push_str(&encode_component(user.as_bytes()));
        if let Some(password) = config.get_password() {
            auth.push(':');
            auth.push_str(&encode_component(password));
        }
        auth.push('@');
    }
    let dbname = encode_component(config.get_dbname().unwrap_or("postgres").as_bytes());
    format!("postgres://{auth}{host}:{port}/{dbname}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_of_urls() {
        let cases = [
            ("postgres://u:p@h:1/db", "postgres://u:p@h:1/new"),
            (
                "postgres://u@h/db?sslmode=disable",
                "postgres://u@h/new?sslmode=disable",
            ),
            ("postgresql://h:5432", "postgresql://h:5432/new"),
            (
                "postgres://h?application_name=x",
                "postgres://h/new?application_name=x",
            ),
            (
                "postgres://u:p%2Fq@a:1,b:2/",
                "postgres://u:p%2Fq@a:1,b:2/new",
            ),
            (
                "postgres://%2Ftmp%2Fsock/db",
                "postgres://%2Ftmp%2Fsock/new",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(replace_dbname(url, "new"), want, "{url}");
            let config: Config = want.parse().expect("replaced URL parses");
            assert_eq!(config.get_dbname(), Some("new"));
        }
    }

    #[test]
    fn builds_urls_from_key_value_strings() {
        let config: Config = "host=/run/pg port=5433 user='a b' password=x@y dbname=adm"
            .parse()
            .expect("valid");
        let url = url_from_config(&config);
        assert_eq!(url, "postgres://a%20b:x%40y@%2Frun%2Fpg:5433/adm");
        let back: Config = url.parse().expect("URL parses");
        assert_eq!(back.get_user(), Some("a b"));
        assert_eq!(back.get_password(), Some(&b"x@y"[..]));
        assert_eq!(back.get_hosts(), config.get_hosts());
        assert_eq!(back.get_ports(), &[5433]);
    }

    #[test]
    fn names_carry_their_creation_time() {
        let before = unix_secs();
        let a = new_name();
        let b = new_name();
        assert_ne!(a, b);
        let secs = created_at(&a).expect("parses");
        assert!(secs >= before && secs <= unix_secs());
        assert_eq!(created_at("pgtenant_test_x_1_2"), None);
        assert_eq!(created_at("other_1_2_3"), None);
    }

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
