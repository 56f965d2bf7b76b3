//! A transaction-mode pooler (a real PgBouncer): the lease session must be refused behind it
//! (DESIGN §9), while the data path works through it.
//!
//! Without PgBouncer these tests skip, with one line on stderr that says how to install it.
//! With `PGTENANT_REQUIRE_PGBOUNCER=1` (`.ci/run` sets it) a missing PgBouncer fails them.
//! `PGTENANT_PGBOUNCER=<path>` names the binary; a path that does not exist runs the tests as
//! on a machine without PgBouncer.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use pgtenant::pool::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pgtenant::{Error, Router};
use support::{database, options, tenant};

const INSTALL: &str = "apt-get install pgbouncer";

/// The PgBouncer binary: `$PGTENANT_PGBOUNCER` when set, else `pgbouncer` on PATH, else the
/// Debian location (`/usr/sbin` is not on every user's PATH).
fn find_pgbouncer() -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os("PGTENANT_PGBOUNCER") {
        let path = PathBuf::from(explicit);
        return path.is_file().then_some(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|path| path.is_file())
}

/// PgBouncer, or None when the test should skip. The skip is said once per test binary, on
/// stderr directly: the test harness captures `eprintln!` of passing tests.
fn pgbouncer_or_skip() -> Option<PathBuf> {
    static SAID: Once = Once::new();
    let found = find_pgbouncer();
    if found.is_none() {
        let required = std::env::var("PGTENANT_REQUIRE_PGBOUNCER").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "PgBouncer not found and PGTENANT_REQUIRE_PGBOUNCER=1: {INSTALL}, or set \
             PGTENANT_PGBOUNCER to its path"
        );
        SAID.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "tests/pooler.rs: skipped, PgBouncer is not installed ({INSTALL})"
            );
        });
    }
    found
}

/// A PgBouncer in transaction mode in front of the server at `upstream`, run as the
/// unprivileged `postgres` user (it refuses to run as root), removed on drop.
struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Bouncer {
    /// `settings` are extra `[pgbouncer]` lines, e.g. `server_round_robin = 1`.
    fn start(program: &Path, upstream: &tokio_postgres::Config, settings: &str) -> Bouncer {
        let (uid, gid) = support::postgres_user();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("pgtenant-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let upstream_port = upstream.get_ports().first().copied().unwrap_or(5432);
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={upstream_port} user=postgres\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = any\npool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 50\n\
             server_reset_query =\nignore_startup_parameters = extra_float_digits,options\n\
             logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n{settings}\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("ini");
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
        std::os::unix::fs::chown(dir.join("pgbouncer.ini"), Some(uid), Some(gid)).expect("chown");
        let child = std::os::unix::process::CommandExt::gid(
            std::os::unix::process::CommandExt::uid(&mut Command::new(program), uid),
            gid,
        )
        .arg(dir.join("pgbouncer.ini"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start pgbouncer");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20)); // readiness wait for a process we started
        }
        Bouncer { child, dir, port }
    }

    /// Makes the pooler open `count` server connections, all left idle in its pool: that many
    /// clients hold a transaction at once, then end.
    async fn open_spare_servers(&self, database: &str, count: usize) {
        let mut clients = Vec::new();
        for _ in 0..count {
            let (client, connection) = self
                .config(database)
                .connect(tokio_postgres::NoTls)
                .await
                .expect("connect through pgbouncer");
            tokio::spawn(connection);
            client
                .batch_execute("BEGIN; SELECT 1")
                .await
                .expect("begin");
            clients.push(client);
        }
        for client in &clients {
            client.batch_execute("COMMIT").await.expect("commit");
        }
    }

    /// The same database, through the pooler.
    fn config(&self, database: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(database);
        config
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Refused whatever the pooler's idle list holds and whatever order it hands servers out in:
/// LIFO (PgBouncer's default) with one server or with spare ones, and round robin (where the
/// lease session's own statements move between servers, and a single probe is handed another
/// server than the lease session's).
#[tokio::test]
async fn a_lease_session_behind_transaction_pooling_is_refused() {
    let Some(pgbouncer) = pgbouncer_or_skip() else {
        return;
    };
    for (settings, warm) in [("", false), ("", true), ("server_round_robin = 1", true)] {
        let (db, client) = database().await;
        let bouncer = Bouncer::start(&pgbouncer, &db.config(), settings);
        if warm {
            bouncer.open_spare_servers(db.name(), 3).await;
        }
        let behind = pgtenant::RouterOptions::new("pooled", bouncer.config(db.name()));
        match Router::start(behind).await {
            Err(error @ Error::NotASession(_)) => {
                assert!(
                    error.to_string().contains("pooler"),
                    "{settings:?}: {error}"
                );
            }
            Err(other) => panic!("{settings:?}: expected NotASession, got {other}"),
            Ok(_) => {
                panic!("{settings:?}: a lease session behind transaction pooling was accepted")
            }
        }
        let registered: i64 = client
            .query_one(
                "SELECT count(*) FROM pgtenant.replicas WHERE incarnation > 0",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(registered, 0, "{settings:?}: nothing was registered");
    }
}

#[tokio::test]
async fn the_data_path_works_behind_transaction_pooling() {
    let Some(pgbouncer) = pgbouncer_or_skip() else {
        return;
    };
    let (db, client) = database().await;
    // Behind a transaction-mode pooler no startup option reaches the server: data sessions
    // are read-only by default through the database's (or the role's) default instead.
    client
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            db.name()
        ))
        .await
        .expect("database default");
    let bouncer = Bouncer::start(&pgbouncer, &db.config(), "");
    let manager = Manager::from_config(
        bouncer.config(db.name()),
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager).max_size(4).build().expect("pool");
    // Lease session direct, data path through the pooler.
    let router = Router::start(
        options(db.url(), "data-pooled")
            .pool(pool)
            .statement_cache(false),
    )
    .await
    .expect("router");
    let handle = router.open_or_create(&tenant("pooled")).await.unwrap();
    support::create_log(&handle).await;
    for seq in 0..20 {
        support::append(&handle, "pooled", seq)
            .await
            .expect("fenced work through the pooler");
    }
    assert_eq!(
        support::count_rows(&handle, "SELECT count(*) FROM log").await,
        20
    );
    let path: String = handle
        .read(|tx| {
            Box::pin(
                async move { Ok::<_, Error>(tx.query_one("SHOW search_path", &[]).await?.get(0)) },
            )
        })
        .await
        .unwrap();
    assert_eq!(path, format!("{}, pg_temp", handle.schema()));
    // Outside a fenced transaction the pooled backends keep no tenant search_path.
    let plain = router.connection().await.unwrap();
    let outside: String = plain
        .query_one("SHOW search_path", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(outside, "\"$user\", public");
    drop(plain);
    router.close().await;
}
