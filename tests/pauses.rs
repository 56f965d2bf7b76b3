//! Issue 27: when this process itself does not run (a `kill -STOP`, a suspended machine, a
//! starved or blocked runtime), the bounds it waits with pass while nothing waits, and the
//! errors must say that, not blame a healthy database. One test, alone in its binary: the
//! stall is the whole process's, and another test's runtime would keep the process ticking.

mod support;

use std::time::Duration;

use pgtenant::{Error, Router};
use support::{options, tenant};

/// What `kill -STOP` does to a runtime: nothing of it runs. The test's runtime has one thread,
/// so blocking it stops every task of the router, its heartbeat and its ticker included.
fn stop_the_process(duration: Duration) {
    std::thread::sleep(duration);
}

#[test]
fn bounds_that_pass_while_the_process_does_not_run_say_so() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (db, _admin) = support::database().await;
        let url = db.url().to_owned();
        let router = Router::start(options(&url, "paused-a"))
            .await
            .expect("router");
        let id = tenant("paused");
        let handle = router.open_or_create(&id).await.expect("create");
        support::create_log(&handle).await;

        // A server that never answers, while this process runs: the server is blamed.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = silent.local_addr().expect("addr").port();
        let silent_url = format!("postgres://postgres@127.0.0.1:{port}/app");
        let refused = Router::start(
            pgtenant::RouterOptions::from_url("silent", &silent_url)
                .expect("url")
                .connect_timeout(Duration::from_millis(300)),
        )
        .await
        .expect_err("nothing answers");
        assert!(matches!(refused, Error::ConnectTimeout { .. }), "{refused}");
        assert_eq!(refused.stalled(), None, "{refused}");
        assert!(
            refused.to_string().contains("did not finish connecting"),
            "{refused}"
        );
        drop(silent);

        // The lease's local deadline passes while the process is stopped: the handle refuses
        // work (nothing could vouch for the lease), and says why.
        stop_the_process(Duration::from_millis(2500));
        let error = support::append(&handle, "paused", 1)
            .await
            .expect_err("past the local deadline");
        assert!(matches!(error, Error::ExpiredLocally { .. }), "{error}");
        let stalled = error.stalled().expect("the stall is the cause");
        assert!(stalled >= Duration::from_secs(2), "{stalled:?}");
        let message = error.to_string();
        assert!(
            message.contains("this process did not run for 2.") && !message.contains("heartbeat"),
            "{message}"
        );
        assert!(error.is_retryable());

        // A connect under way when the process stops: its bound passes meanwhile.
        let blocker = tokio::spawn(async { stop_the_process(Duration::from_millis(2500)) });
        let error =
            Router::start(options(&url, "paused-b").connect_timeout(Duration::from_secs(1)))
                .await
                .expect_err("the connect bound passed while stopped");
        blocker.await.expect("blocker");
        assert!(matches!(error, Error::ConnectTimeout { .. }), "{error}");
        assert!(error.stalled().is_some(), "{error}");
        let message = error.to_string();
        assert!(
            message.contains("did not run") && !message.contains("did not finish connecting"),
            "{message}"
        );

        // And the replica serves again by itself (G9): a new incarnation, the tenant reopened.
        let deadline = std::time::Instant::now() + support::SERVE_AGAIN_BOUND;
        loop {
            let written = match router.open(&id).await {
                Ok(again) => support::append(&again, "paused", 2).await,
                Err(error) => Err(error),
            };
            match written {
                Ok(()) => break,
                Err(error) if std::time::Instant::now() < deadline => {
                    assert!(
                        error.is_retryable() || matches!(error, Error::LeaseHeld { .. }),
                        "{error}"
                    );
                    // A client's retry pace, not a wait for something the test could observe.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("did not serve again within the bound (G9): {error}"),
            }
        }

        // A connection the database ends while the process is stopped (here a terminated
        // backend; in life, an idle timeout, or another replica's takeover sealing this one):
        // the error, read when the process runs again, says that it did not run.
        let handle = router.open(&id).await.expect("serving again");
        let mut connection = handle.connect().await.expect("connect");
        let tx = connection.begin().await.expect("begin");
        let pid: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        let terminator = std::thread::spawn({
            let url = url.clone();
            move || {
                let runtime = tokio::runtime::Runtime::new().expect("runtime");
                runtime.block_on(async move {
                    let config: tokio_postgres::Config = url.parse().expect("url");
                    let (client, driver) = config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                    tokio::spawn(driver);
                    client
                        .execute("SELECT pg_terminate_backend($1, 10000)", &[&pid])
                        .await
                        .expect("terminate");
                })
            }
        });
        stop_the_process(Duration::from_millis(2500));
        terminator.join().expect("terminated meanwhile");
        let error = tx
            .execute("SELECT 1", &[])
            .await
            .expect_err("its backend is gone");
        assert!(matches!(error, Error::Database { .. }), "{error}");
        assert!(error.stalled().is_some(), "{error}");
        assert!(error.to_string().contains("did not run"), "{error}");
        drop(tx);
        drop(connection);
        router.close().await;
    });
}
