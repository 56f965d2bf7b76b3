//! The `docker` source and `DockerPostgres` against a real Docker engine: containers really
//! run the configured image, and none is left behind after a drop, a panic or a SIGKILL.
//!
//! Each test needs a Docker engine. Without one it prints one line and passes, unless
//! `PGTENANT_REQUIRE_DOCKER=1` (as `.ci/run` sets it after installing Docker).
#![cfg(feature = "docker")]

use std::io::BufRead;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgtenant_testkit::{
    skip_without_docker, DockerNetwork, DockerOptions, DockerPostgres, Source, TestDatabase,
    CONTAINER_LABEL, IMAGE_ENV,
};

/// The docker command, on the engine the test kit uses (both follow DOCKER_HOST).
fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running docker {args:?}: {e}"))
}

fn exists(id: &str) -> bool {
    docker(&["inspect", "--format", "{{.Id}}", id])
        .status
        .success()
}

fn inspect(id: &str, format: &str) -> String {
    let out = docker(&["inspect", "--format", format, id]);
    assert!(
        out.status.success(),
        "docker inspect {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn query_one_text(db: &TestDatabase, sql: &str) -> String {
    db.connect()
        .await
        .expect("connect")
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

#[tokio::test]
async fn the_docker_source_serves_fresh_databases_from_one_real_container() {
    if skip_without_docker("the_docker_source_serves_fresh_databases_from_one_real_container") {
        return;
    }
    let options = DockerOptions::from_env().expect("options");
    let (a, b) = tokio::join!(
        TestDatabase::create_from(Source::Docker),
        TestDatabase::create_from(Source::Docker)
    );
    let (a, b) = (a.expect("first database"), b.expect("second database"));
    assert_eq!(a.source(), Source::Docker);
    assert_ne!(a.name(), b.name());
    let id = a.container_id().expect("a container id").to_owned();
    assert_eq!(
        b.container_id(),
        Some(id.as_str()),
        "one container per process"
    );

    // It is that container, running the configured image, labelled with this test binary.
    assert_eq!(inspect(&id, "{{.State.Running}}"), "true");
    assert_eq!(inspect(&id, "{{.Config.Image}}"), options.image());
    assert_eq!(
        inspect(
            &id,
            &format!("{{{{index .Config.Labels \"{CONTAINER_LABEL}\"}}}}")
        ),
        "docker"
    );
    // The image's PGDATA (…/data, or …/18/docker in the official 18+ images), not a
    // throwaway cluster's temporary directory.
    let data_directory = query_one_text(&a, "SELECT current_setting('data_directory')").await;
    assert!(
        data_directory.starts_with("/var/lib/postgresql/"),
        "{data_directory}"
    );

    // Tests talk to 127.0.0.1 only.
    let host = match a.config().get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("not a TCP host: {other:?}"),
    };
    assert_eq!(host, "127.0.0.1");
    assert_eq!(
        query_one_text(&a, "SELECT host(inet_server_addr())").await,
        "127.0.0.1"
    );
    if options.network() == DockerNetwork::Host {
        assert_eq!(inspect(&id, "{{.HostConfig.NetworkMode}}"), "host");
        let port = a.config().get_ports()[0].to_string();
        assert_eq!(
            query_one_text(&a, "SELECT current_setting('port')").await,
            port
        );
        assert_eq!(
            query_one_text(&a, "SELECT current_setting('listen_addresses')").await,
            "127.0.0.1",
            "with the host's network, never every interface"
        );
    }

    let client = a.connect().await.expect("connect");
    client
        .batch_execute("CREATE TABLE t (v text); INSERT INTO t VALUES ('in a container')")
        .await
        .expect("write");
    let in_b: i64 = b
        .connect()
        .await
        .expect("connect b")
        .query_one("SELECT count(*) FROM pg_class WHERE relname = 't'", &[])
        .await
        .expect("read b")
        .get(0);
    assert_eq!(in_b, 0, "databases are separate");
}

#[tokio::test]
async fn an_owned_container_is_removed_when_its_last_user_is_dropped() {
    if skip_without_docker("an_owned_container_is_removed_when_its_last_user_is_dropped") {
        return;
    }
    let pg = DockerPostgres::start().await.expect("a container");
    let id = pg.container_id().to_owned();
    assert!(exists(&id));
    assert!(
        pg.startup_time() > Duration::ZERO && pg.startup_time() < Duration::from_secs(120),
        "{:?}",
        pg.startup_time()
    );
    assert_eq!(pg.host(), "127.0.0.1");
    let db = pg.create_database().await.expect("a database");
    assert_eq!(db.container_id(), Some(id.as_str()));
    assert_ne!(
        TestDatabase::create_from(Source::Docker)
            .await
            .expect("the shared container")
            .container_id(),
        Some(id.as_str()),
        "the source's container is another one"
    );

    drop(pg);
    assert!(exists(&id), "a database keeps its container");
    assert_eq!(query_one_text(&db, "SELECT 'alive'").await, "alive");
    drop(db);
    // testcontainers' drop waits for Docker to remove it.
    assert!(
        !exists(&id),
        "container {id} left after its last user was dropped"
    );
}

#[tokio::test]
async fn an_image_the_engine_lacks_is_named_with_what_to_do() {
    if skip_without_docker("an_image_the_engine_lacks_is_named_with_what_to_do") {
        return;
    }
    let options = DockerOptions::from_env()
        .expect("options")
        .with_image("pgtenant-testkit-test/no-such-image:1");
    let e = DockerPostgres::start_with(options)
        .await
        .expect_err("no such image");
    let message = e.to_string();
    assert!(
        message.contains("pgtenant-testkit-test/no-such-image:1") && message.contains(IMAGE_ENV),
        "{message}"
    );
}

const CHILD_ENV: &str = "PGTENANT_TESTKIT_DOCKER_CHILD";

/// Run by the two tests below in a child process: starts the source's container and one of
/// its own, prints their ids, then panics or waits to be killed. A no-op in a normal run.
#[tokio::test]
async fn child_starts_two_containers_then_panics_or_hangs() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let shared = TestDatabase::create_from(Source::Docker)
        .await
        .expect("the source's container");
    let owned = DockerPostgres::start()
        .await
        .expect("a container of its own");
    println!(
        "CONTAINERS {} {}",
        shared.container_id().expect("an id"),
        owned.container_id()
    );
    if mode == "panic" {
        panic!("the child test panics on purpose, holding both containers");
    }
    std::future::pending::<()>().await;
}

/// Starts the child test in `mode` and returns it with the ids it printed.
fn start_child(mode: &str) -> (std::process::Child, Vec<String>) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "child_starts_two_containers_then_panics_or_hangs",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child test");
    let stdout = child.stdout.take().expect("child stdout");
    let ids = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        // libtest prints "test <name> ... " on the same line first.
        .find_map(|line| {
            line.find("CONTAINERS ")
                .map(|at| line[at + "CONTAINERS ".len()..].to_owned())
        })
        .map(|ids| {
            ids.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        });
    match ids {
        Some(ids) if ids.len() == 2 => (child, ids),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not report its containers");
        }
    }
}

/// Waits for Docker's `destroy` event of every container in `ids` since `since` (unix
/// seconds), up to `limit`; returns those not destroyed.
fn await_destroyed(ids: &[String], since: u64, limit: Duration) -> Vec<String> {
    let mut args = vec![
        "events".to_owned(),
        "--since".to_owned(),
        since.to_string(),
        "--filter".to_owned(),
        "type=container".to_owned(),
        "--filter".to_owned(),
        "event=destroy".to_owned(),
        "--format".to_owned(),
        "{{.Actor.ID}}".to_owned(),
    ];
    for id in ids {
        args.extend(["--filter".to_owned(), format!("container={id}")]);
    }
    let mut command = Command::new("docker");
    command
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut events = command.spawn().expect("docker events");
    let stdout = events.stdout.take().expect("events stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut left: Vec<String> = ids.to_vec();
    let deadline = std::time::Instant::now() + limit;
    while !left.is_empty() {
        let Some(wait) = deadline.checked_duration_since(std::time::Instant::now()) else {
            break;
        };
        match rx.recv_timeout(wait) {
            Ok(destroyed) => left.retain(|id| !destroyed.starts_with(id.as_str())),
            Err(_) => break,
        }
    }
    let _ = events.kill();
    let _ = events.wait();
    left
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[test]
fn a_panicking_test_process_leaves_no_container() {
    if skip_without_docker("a_panicking_test_process_leaves_no_container") {
        return;
    }
    let (mut child, ids) = start_child("panic");
    for id in &ids {
        assert!(exists(id), "container {id} runs while the child lives");
    }
    let status = child.wait().expect("the child exits");
    assert!(!status.success(), "the child's test panicked");
    // The owned container went with the panic's unwinding (testcontainers' drop), the
    // source's at exit: both before the process was gone, so no waiting here.
    for id in &ids {
        assert!(
            !exists(id),
            "container {id} outlived the panicking test process"
        );
    }
}

#[test]
fn a_killed_test_process_leaves_no_container() {
    if skip_without_docker("a_killed_test_process_leaves_no_container") {
        return;
    }
    let (mut child, ids) = start_child("hang");
    for id in &ids {
        assert!(exists(id), "container {id} runs while the child lives");
    }
    let since = unix_now().saturating_sub(1);
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
    // Nothing in the child ran after SIGKILL: its remover process sees the pipe close and
    // removes both. Docker reports each removal as a destroy event.
    let left = await_destroyed(&ids, since, Duration::from_secs(60));
    assert!(left.is_empty(), "containers left after SIGKILL: {left:?}");
    for id in &ids {
        assert!(!exists(id), "container {id} still exists");
    }
}
