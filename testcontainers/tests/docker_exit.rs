//! A program (not a libtest test: `harness = false`) whose main thread runs a tokio runtime,
//! takes a database from the `docker` source and returns from `main`: the process must exit
//! cleanly and its container must be gone by then. At that exit the main thread's
//! thread-locals, tokio's context among them, are already destroyed, so the removal cannot
//! use them; libtest binaries, whose tests run on other threads, do not show this.
//!
//! It runs itself as the child. Without Docker it prints one line and passes, unless
//! `PGTENANT_REQUIRE_DOCKER=1`.

use std::process::Command;

use pgtenant_testkit::{skip_without_docker, Source, TestDatabase};

const CHILD_ENV: &str = "PGTENANT_TESTKIT_EXIT_CHILD";

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    if skip_without_docker("docker_exit") {
        println!("0 passed, 0 failed, 1 skipped");
        return;
    }
    let exe = std::env::current_exe().expect("this program's path");
    let out = Command::new(exe)
        .env(CHILD_ENV, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child did not exit cleanly ({}):\n{stderr}",
        out.status
    );
    let id = stdout
        .lines()
        .find_map(|line| line.strip_prefix("CONTAINER "))
        .unwrap_or_else(|| panic!("the child printed no container id:\n{stdout}\n{stderr}"))
        .trim()
        .to_owned();
    let inspect = Command::new("docker")
        .args(["inspect", "--format", "{{.Id}}", &id])
        .output()
        .expect("docker inspect");
    assert!(
        !inspect.status.success(),
        "container {id} outlived the process that returned from main"
    );
    println!("test a_returning_main_leaves_no_container ... ok");
    println!("1 passed, 0 failed");
}

fn child() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let db = TestDatabase::create_from(Source::Docker)
            .await
            .expect("a database from the docker source");
        let client = db.connect().await.expect("connect");
        client.query_one("SELECT 1", &[]).await.expect("a query");
        println!("CONTAINER {}", db.container_id().expect("a container id"));
    });
}
