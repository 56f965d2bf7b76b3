//! What a test process pays for its server: from the first `TestDatabase::create_from` to the
//! first query answered, and the whole process (start to exit, which includes removing the
//! container or cluster), for the `docker` and `initdb` sources.
//!
//! ```sh
//! cargo run --release -p pgtenant-testkit --example source_startup -- 10
//! ```
//!
//! Each run is a fresh process (the server is per process), and the sources alternate so
//! that both see the same machine load. Docker's image and network come from
//! `PGTENANT_TESTKIT_IMAGE` and `PGTENANT_TESTKIT_DOCKER_NETWORK`.

use std::process::Command;
use std::time::{Duration, Instant};

use pgtenant_testkit::{Source, TestDatabase};

const CHILD_ENV: &str = "PGTENANT_TESTKIT_STARTUP_CHILD";

fn main() {
    if let Ok(source) = std::env::var(CHILD_ENV) {
        child(&source);
        return;
    }
    let runs: usize = match std::env::args().nth(1).map(|n| n.parse()) {
        None => 10,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: source_startup [runs, default 10]");
            std::process::exit(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this program's path: {e}");
            std::process::exit(1);
        }
    };
    let sources = ["docker", "initdb"];
    let mut first_query: Vec<Vec<Duration>> = vec![Vec::new(); sources.len()];
    let mut process: Vec<Vec<Duration>> = vec![Vec::new(); sources.len()];
    for run in 0..runs {
        for (i, source) in sources.iter().enumerate() {
            let began = Instant::now();
            let out = Command::new(&exe).env(CHILD_ENV, source).output();
            let wall = began.elapsed();
            let out = match out {
                Ok(out) if out.status.success() => out,
                Ok(out) => {
                    eprintln!(
                        "run {run} ({source}) failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    std::process::exit(1);
                }
                Err(e) => {
                    eprintln!("run {run} ({source}): {e}");
                    std::process::exit(1);
                }
            };
            let micros: Option<u64> = String::from_utf8_lossy(&out.stdout).trim().parse().ok();
            let Some(micros) = micros else {
                eprintln!("run {run} ({source}) printed no time");
                std::process::exit(1);
            };
            first_query[i].push(Duration::from_micros(micros));
            process[i].push(wall);
        }
    }
    println!("{runs} processes per source, alternating; milliseconds, median (min–max)\n");
    println!("| source | create → first query | whole process (start to exit) |");
    println!("|---|---:|---:|");
    for (i, source) in sources.iter().enumerate() {
        println!(
            "| {source} | {} | {} |",
            summary(&mut first_query[i]),
            summary(&mut process[i])
        );
    }
}

fn summary(times: &mut [Duration]) -> String {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{:.0} ({:.0}–{:.0})",
        ms(times[times.len() / 2]),
        ms(times[0]),
        ms(times[times.len() - 1])
    )
}

/// One test process: a database from `source`, one query, the time printed in microseconds.
fn child(source: &str) {
    let source: Source = match source.parse() {
        Ok(source) => source,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("no runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        let began = Instant::now();
        let db = TestDatabase::create_from(source).await?;
        let client = db.connect().await?;
        client
            .query_one("SELECT 1", &[])
            .await
            .map_err(|e| pgtenant_testkit::TestkitError::Cluster(format!("SELECT 1: {e}")))?;
        Ok::<_, pgtenant_testkit::TestkitError>(began.elapsed())
    });
    match result {
        Ok(elapsed) => println!("{}", elapsed.as_micros()),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
