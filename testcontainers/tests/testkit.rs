//! These tests talk to real PostgreSQL: whatever source `TestDatabase::create`
//! finds (or `PGTENANT_TESTKIT` forces), and clusters made with initdb.

use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pgtenant_testkit::{source_from_env, LocalCluster, Source, TestDatabase, TestkitError};
use tokio_postgres::NoTls;

async fn admin_client(db: &TestDatabase) -> tokio_postgres::Client {
    let (client, connection) = db
        .admin_config()
        .connect(NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
}

async fn database_exists(client: &tokio_postgres::Client, name: &str) -> bool {
    client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .expect("query pg_database")
        .is_some()
}

#[tokio::test]
async fn create_gives_a_writable_database_that_is_dropped_with_the_value() {
    let db = TestDatabase::create().await.expect("a test database");
    if let Some(forced) = source_from_env() {
        assert_eq!(db.source(), forced, "PGTENANT_TESTKIT forces the source");
    }
    assert!(db.url().starts_with("postgres://"), "{}", db.url());
    // The admin URL's query parameters, if any, follow the name.
    assert!(
        db.url().contains(&format!("/{}", db.name())),
        "{}",
        db.url()
    );
    assert_eq!(db.config().get_dbname(), Some(db.name()));

    let client = db.connect().await.expect("connect");
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a')")
        .await
        .expect("write");
    let v: String = client
        .query_one("SELECT v FROM t WHERE id = 1", &[])
        .await
        .expect("read")
        .get(0);
    assert_eq!(v, "a");
    let current: String = client
        .query_one("SELECT current_database()::text", &[])
        .await
        .expect("current_database")
        .get(0);
    assert_eq!(current, db.name());

    let admin = admin_client(&db).await;
    let name = db.name().to_owned();
    assert!(database_exists(&admin, &name).await);
    // The open `client` must not keep the database alive: drop uses FORCE.
    drop(db);
    assert!(
        !database_exists(&admin, &name).await,
        "{name} still exists after drop"
    );
    assert!(client.is_closed() || client.simple_query("SELECT 1").await.is_err());
}

#[tokio::test]
async fn concurrent_creates_give_different_databases() {
    let (a, b) = tokio::join!(TestDatabase::create(), TestDatabase::create());
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_ne!(a.name(), b.name());
    assert_ne!(a.url(), b.url());
    let (ca, cb) = (a.connect().await.expect("a"), b.connect().await.expect("b"));
    ca.batch_execute("CREATE TABLE only_in_a ()")
        .await
        .expect("a write");
    let in_b: i64 = cb
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relname = 'only_in_a'",
            &[],
        )
        .await
        .expect("b read")
        .get(0);
    assert_eq!(in_b, 0);
}

#[tokio::test]
async fn forced_initdb_source_shares_one_cluster() {
    let (a, b) = tokio::join!(
        TestDatabase::create_from(Source::Initdb),
        TestDatabase::create_from(Source::Initdb)
    );
    let (a, b) = (
        a.expect("first initdb database"),
        b.expect("second initdb database"),
    );
    assert_eq!(a.source(), Source::Initdb);
    assert_eq!(b.source(), Source::Initdb);
    assert_ne!(a.name(), b.name());
    assert_eq!(
        a.config().get_ports(),
        b.config().get_ports(),
        "one shared cluster"
    );
    let client = a.connect().await.expect("connect");
    client
        .batch_execute("CREATE TABLE t (id int)")
        .await
        .expect("write");

    let c = TestDatabase::create_from(Source::Initdb)
        .await
        .expect("third");
    assert_eq!(
        a.config().get_ports(),
        c.config().get_ports(),
        "still the same cluster"
    );
}

#[tokio::test]
async fn a_forced_source_that_cannot_work_names_itself() {
    match TestDatabase::create_from(Source::Docker).await {
        // Only where the `docker` feature is on and an engine runs.
        Ok(db) => assert_eq!(db.source(), Source::Docker),
        Err(e) => {
            assert!(
                matches!(
                    e,
                    TestkitError::SourceFailed {
                        requested: Source::Docker,
                        ..
                    }
                ),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains("PGTENANT_TESTKIT=docker"), "{msg}");
            assert!(msg.contains("docker"), "{msg}");
        }
    }
}

#[test]
fn no_source_error_lists_every_attempt_and_what_to_install() {
    let e = TestkitError::NoSource {
        tried: vec![
            "url: neither PGTENANT_TEST_DATABASE_URL nor DATABASE_URL is set".into(),
            "local: 127.0.0.1:5432 as user postgres: connection refused".into(),
            "docker: built without the `docker` feature".into(),
            "initdb: no PostgreSQL server binaries".into(),
        ],
    };
    let msg = e.to_string();
    for needle in [
        "url: neither",
        "local: 127.0.0.1",
        "docker: built",
        "initdb: no",
        "apt-get install postgresql",
        "PGTENANT_TEST_DATABASE_URL",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
}

#[test]
fn source_names_round_trip() {
    for source in Source::ALL {
        assert_eq!(source.as_str().parse::<Source>().expect("parses"), source);
        assert_eq!(source.to_string(), source.as_str());
    }
    assert_eq!(
        " InitDB ".parse::<Source>().expect("case and spaces"),
        Source::Initdb
    );
    let e = "podman".parse::<Source>().expect_err("unknown");
    assert!(e.to_string().contains("podman"), "{e}");
}

fn port_refuses(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).is_err()
}

#[tokio::test]
async fn local_cluster_survives_restart_and_cleans_up_on_drop() {
    let cluster = LocalCluster::start().await.expect("start a cluster");
    let port = cluster.port();
    let data_dir = cluster.data_dir().to_path_buf();
    assert!(data_dir.join("PG_VERSION").is_file());
    assert_eq!(
        cluster.url("x"),
        format!("postgres://postgres@127.0.0.1:{port}/x")
    );

    let db = cluster
        .create_database()
        .await
        .expect("database on the cluster");
    assert_eq!(db.source(), Source::Initdb);
    assert_eq!(db.config().get_ports(), &[port]);
    let client = db.connect().await.expect("connect");
    client
        .batch_execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('durable')")
        .await
        .expect("write");

    cluster.restart().await.expect("restart");
    assert!(
        client.simple_query("SELECT 1").await.is_err(),
        "old session ended by the restart"
    );
    let client = db.connect().await.expect("reconnect after restart");
    let v: String = client
        .query_one("SELECT v FROM kept", &[])
        .await
        .expect("row after restart")
        .get(0);
    assert_eq!(v, "durable");

    cluster.stop().await.expect("stop");
    assert!(port_refuses(port), "stopped cluster still listens");
    cluster.stop().await.expect("stopping twice is fine");
    cluster.start_again().await.expect("start again");
    cluster
        .start_again()
        .await
        .expect("starting a running cluster is fine");
    assert_eq!(cluster.port(), port);
    db.connect().await.expect("connect after start_again");

    drop(client);
    drop(db);
    drop(cluster);
    assert!(!data_dir.exists(), "{} left behind", data_dir.display());
    assert!(
        data_dir.parent().is_some_and(|dir| !dir.exists()),
        "temp dir left behind"
    );
    assert!(
        port_refuses(port),
        "dropped cluster still listens on {port}"
    );
}

/// A TLS cluster: its test databases refuse unencrypted connections (the library's
/// tests/tls.rs connects to them with rustls), the admin database still takes them, and the
/// CA that signed the server's certificate is handed out.
#[tokio::test]
async fn a_tls_cluster_refuses_unencrypted_connections_to_its_databases() {
    let cluster = LocalCluster::start_tls().await.expect("a TLS cluster");
    let ca = cluster.tls_root_certificate().expect("its CA").to_owned();
    assert!(
        std::fs::read_to_string(&ca)
            .expect("the CA file")
            .starts_with("-----BEGIN CERTIFICATE-----"),
        "{} is a PEM certificate",
        ca.display()
    );
    let (admin, connection) = tokio_postgres::connect(&cluster.url("postgres"), NoTls)
        .await
        .expect("the admin database takes unencrypted connections");
    tokio::spawn(connection);
    let ssl: String = admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    assert_eq!(ssl, "on");
    let db = cluster.create_database().await.expect("database");
    let refused = tokio_postgres::connect(db.url(), NoTls)
        .await
        .err()
        .expect("an unencrypted connection to a test database is refused");
    let message = refused
        .as_db_error()
        .map(|db| db.message().to_owned())
        .unwrap_or_default();
    assert!(message.contains("no encryption"), "{refused:?}");
    assert!(LocalCluster::start()
        .await
        .unwrap()
        .tls_root_certificate()
        .is_none());
}

/// Extra addresses: the server listens on each and trusts its network, the URL names it, and
/// an address the server cannot listen on or a prefix too long for its address is refused.
#[tokio::test]
async fn a_cluster_listens_on_the_addresses_it_is_given() {
    // The whole of 127.0.0.0/8 is local on Linux: an address no other test listens on.
    let extra = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let cluster = LocalCluster::builder()
        .setting("log_connections", "on")
        .listen_on(extra, 8)
        .start()
        .await
        .expect("a cluster on two addresses");
    assert_eq!(
        cluster.listen_addresses(),
        [IpAddr::V4(Ipv4Addr::LOCALHOST), extra]
    );
    let db = cluster.create_database().await.expect("database");
    let url = cluster.url_on(extra, db.name());
    assert_eq!(
        url,
        format!(
            "postgres://postgres@127.0.0.2:{}/{}",
            cluster.port(),
            db.name()
        )
    );
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("connect through the extra address");
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT host(inet_server_addr()), current_setting('log_connections')",
            &[],
        )
        .await
        .expect("query");
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, String>(1)),
        ("127.0.0.2".to_owned(), "on".to_owned())
    );
    let hba = std::fs::read_to_string(cluster.data_dir().join("pg_hba.conf")).expect("hba");
    assert!(hba.contains("host all all 127.0.0.0/8 trust"), "{hba}");

    let too_long = LocalCluster::builder()
        .listen_on(extra, 33)
        .start()
        .await
        .expect_err("a /33 is refused");
    assert!(
        too_long.to_string().contains("at most 32 bits"),
        "{too_long}"
    );
    // TEST-NET-2: on no interface of this machine.
    let absent = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7));
    let refused = LocalCluster::builder()
        .listen_on(absent, 32)
        .start()
        .await
        .expect_err("an address the server cannot listen on is refused");
    assert!(
        refused
            .to_string()
            .contains("could not listen on every address"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_database_keeps_its_cluster_alive() {
    let cluster = LocalCluster::start().await.expect("start a cluster");
    let data_dir = cluster.data_dir().to_path_buf();
    let db = cluster.create_database().await.expect("database");
    drop(cluster);
    db.connect()
        .await
        .expect("the cluster runs while a database on it lives")
        .batch_execute("SELECT 1")
        .await
        .expect("query");
    drop(db);
    assert!(!data_dir.exists(), "{} left behind", data_dir.display());
}

const CHILD_ENV: &str = "PGTENANT_TESTKIT_CHILD_HANGS";

/// Run by `a_killed_test_process_leaves_no_cluster_behind` in a child process:
/// starts a cluster, prints its directory and waits to be killed. A no-op in
/// a normal run.
#[tokio::test]
async fn child_process_starts_a_cluster_and_hangs() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let cluster = LocalCluster::start().await.expect("start a cluster");
    let shared = TestDatabase::create_from(Source::Initdb)
        .await
        .expect("shared cluster");
    println!(
        "CLUSTER {} {}",
        cluster.data_dir().display(),
        cluster.port()
    );
    println!("SHARED {}", shared.config().get_ports()[0]);
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[test]
fn a_killed_test_process_leaves_no_cluster_behind() {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "child_process_starts_a_cluster_and_hangs",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child test");
    let stdout = child.stdout.take().expect("child stdout");
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut found = (None, None);
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            // libtest prints "test <name> ... " on the same line first.
            let tail = ["CLUSTER ", "SHARED "]
                .iter()
                .find_map(|tag| line.find(tag).map(|at| &line[at..]))
                .unwrap_or("");
            let words: Vec<&str> = tail.split_whitespace().collect();
            match words.as_slice() {
                ["CLUSTER", dir, port] => {
                    found.0 = Some((PathBuf::from(dir), port.parse::<u16>().expect("port")))
                }
                ["SHARED", port] => {
                    found.1 = Some(port.parse::<u16>().expect("port"));
                    break;
                }
                _ => {}
            }
        }
        found
    })
    .join()
    .expect("reader");
    let (Some((data_dir, port)), Some(shared_port)) = lines else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("child did not report its clusters");
    };
    assert!(data_dir.is_dir());
    assert!(!port_refuses(port) && !port_refuses(shared_port));

    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");

    // The watchdogs notice the closed pipe, stop postgres and remove the dirs.
    let deadline = Instant::now() + Duration::from_secs(20);
    while (data_dir.exists() || !port_refuses(port) || !port_refuses(shared_port))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!data_dir.exists(), "{} left behind", data_dir.display());
    assert!(port_refuses(port), "owned cluster still listens on {port}");
    assert!(
        port_refuses(shared_port),
        "shared cluster still listens on {shared_port}"
    );
}
