//! Every connection is bounded end to end: a server that accepts TCP and never answers (the
//! kernel completes the handshake for a listener that never accepts) fails within
//! --connect-timeout, whichever stage it stalls in.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{command, text, within};

#[tokio::test]
async fn a_silent_server_fails_within_the_connect_timeout() {
    let silent = TcpListener::bind("127.0.0.1:0").expect("a local listener");
    let port = silent.local_addr().expect("its port").port();
    let url = |params: &str| format!("postgres://postgres@127.0.0.1:{port}/app{params}");
    let dir = std::env::temp_dir().join(format!("pgtenant-cli-silent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a migrations directory");
    std::fs::write(dir.join("V1__t.sql"), "CREATE TABLE t (id int);").expect("a migration");
    let dir = dir.to_string_lossy().into_owned();

    let args = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    // (arguments, the bound the message must name); the cases without the option come first.
    let cases: Vec<(Vec<String>, &str)> = vec![
        // The default bound.
        (args(&["sweep", "--database-url", &url("")]), "within 10s"),
        // libpq's connect_timeout in the URL, in seconds.
        (
            args(&["setup", "--database-url", &url("?connect_timeout=1")]),
            "within 1s",
        ),
        // TLS is tried first (sslmode=prefer): stalls waiting for the answer to SSLRequest.
        (
            args(&[
                "status",
                "--database-url",
                &url(""),
                "--connect-timeout",
                "1s",
            ]),
            "within 1s",
        ),
        // No TLS: stalls in the startup message exchange.
        (
            args(&[
                "tenants",
                "--database-url",
                &url("?sslmode=disable"),
                "--connect-timeout=1500ms",
            ]),
            "within 1500ms",
        ),
        // A command that starts a router connects first, bounded the same way.
        (
            args(&[
                "migrate",
                "--dir",
                &dir,
                "--database-url",
                &url(""),
                "--connect-timeout",
                "1s",
            ]),
            "within 1s",
        ),
    ];
    let runs = cases.iter().map(|(args, _)| {
        let started = Instant::now();
        let run = within(command(args), Duration::from_secs(30));
        async move { (run.await, started.elapsed()) }
    });
    let results = futures_join(runs).await;
    for ((args, bound), (output, took)) in cases.iter().zip(results) {
        let output = output.unwrap_or_else(|| panic!("{args:?} still waiting after 30 s"));
        let shown = text(&output);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {shown}");
        assert!(
            shown.contains(&format!(
                "no connection to 127.0.0.1:{port}/app {bound} (--connect-timeout)"
            )),
            "{args:?}: {shown}"
        );
        let limit = if *bound == "within 10s" { 13 } else { 4 };
        assert!(took < Duration::from_secs(limit), "{args:?} took {took:?}");
    }
    drop(silent);
    std::fs::remove_dir_all(dir).ok();
}

/// Awaits every future, concurrently (the test's only use of a join over a list).
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        outputs.push(handle.await.expect("a run"));
    }
    outputs
}
