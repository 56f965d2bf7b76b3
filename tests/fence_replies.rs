//! The pipelined fence's reply is consumed as it arrives (issue #15): whatever the server
//! interleaves in it — ParameterStatus for a reported setting, NOTICE, NOTIFY — no fenced
//! transaction stalls its connection, and none holds a pool slot for good.

mod support;

use std::time::Duration;

use pgtenant::{Error, Router};
use support::{database, options, tenant};

/// Rounds per test: the stall showed within a hundred rounds on PostgreSQL 15.
const ROUNDS: usize = 2_000;
/// Far above what the rounds take (about 5 s on 2 cores); a stall never ends by itself.
const BOUND: Duration = Duration::from_secs(120);

/// Two tenants alternate on ONE pooled connection, so every fence scrubs the session the other
/// tenant's work left: its RESET ALL puts back `application_name`, a setting the server
/// reports, so a ParameterStatus lands inside the fence's own reply. The work itself changes
/// the reported setting again and raises a NOTICE. With the fence's reply read only after the
/// work (the code before issue #15), this stalled within seconds.
#[tokio::test]
async fn thousands_of_fenced_transactions_with_reported_settings_and_notices_never_stall() {
    alternate("settings", |round| {
        format!(
            "SET application_name = 'round-{round}';
             DO $$ BEGIN RAISE NOTICE 'round {round}'; END $$"
        )
    })
    .await;
}

/// The same with NOTIFYs arriving on the connection: each tenant's work LISTENs and notifies.
#[tokio::test]
async fn thousands_of_fenced_transactions_with_notifies_never_stall() {
    alternate("notifies", |round| {
        format!(
            "SET application_name = 'notify-{round}'; LISTEN replies; NOTIFY replies, '{round}'"
        )
    })
    .await;
}

/// ROUNDS fenced transactions of two tenants alternating on one pooled connection, the work of
/// each round given by `work`, all within BOUND; then the connection is still usable.
async fn alternate(replica: &str, work: impl Fn(usize) -> String) {
    let (db, _admin) = database().await;
    let router = Router::start(options(db.url(), replica).pool_size(1))
        .await
        .expect("router");
    let handles = [
        router.open_or_create(&tenant("left")).await.expect("left"),
        router
            .open_or_create(&tenant("right"))
            .await
            .expect("right"),
    ];
    let rounds = async {
        for round in 0..ROUNDS {
            let sql = work(round);
            handles[round % 2]
                .run(move |tx| {
                    Box::pin(async move {
                        tx.batch_execute(&sql).await?;
                        Ok::<_, Error>(())
                    })
                })
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    };
    tokio::time::timeout(BOUND, rounds)
        .await
        .expect("a fenced transaction stalled");
    // The one connection is still usable: nothing was left holding it.
    let last = handles[0]
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, Error>(tx.query_one("SELECT 1", &[]).await?.get::<_, i32>(0))
            })
        })
        .await
        .expect("the pool slot is free");
    assert_eq!(last, 1);
    router.close().await;
}

/// The same through `read`, whose fence is the read-only variant.
#[tokio::test]
async fn reads_with_reported_settings_never_stall_either() {
    let (db, _admin) = database().await;
    let router = Router::start(options(db.url(), "read-replies").pool_size(1))
        .await
        .expect("router");
    let handles = [
        router.open_or_create(&tenant("up")).await.expect("up"),
        router.open_or_create(&tenant("down")).await.expect("down"),
    ];
    let rounds = async {
        for round in 0..ROUNDS {
            let sql = format!("SET application_name = 'read-{round}'");
            handles[round % 2]
                .read(move |tx| {
                    Box::pin(async move {
                        tx.batch_execute(&sql).await?;
                        Ok::<_, Error>(())
                    })
                })
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    };
    tokio::time::timeout(BOUND, rounds)
        .await
        .expect("a fenced read stalled");
    router.close().await;
}

/// A connection whose server stops answering mid-transaction (its backend SIGSTOPped before
/// the COMMIT) is detected within the stuck timeout and closed: `run` fails retryably, and the
/// one pool slot serves the next transaction on a new connection.
#[tokio::test]
async fn a_connection_that_stops_answering_is_closed_and_frees_its_pool_slot() {
    let (db, _admin) = database().await;
    let router = Router::start(
        options(db.url(), "stuck")
            .pool_size(1)
            .stuck_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("router");
    let handle = router.open_or_create(&tenant("stuck")).await.expect("open");
    support::create_log(&handle).await;
    let (paused, pid) = tokio::sync::oneshot::channel::<i32>();
    let stuck = handle
        .run(move |tx| {
            Box::pin(async move {
                let pid: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
                // The backend stops before the client sends its COMMIT.
                let stopped = std::process::Command::new("kill")
                    .args(["-STOP", &pid.to_string()])
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
                assert!(
                    stopped,
                    "SIGSTOP the backend (the test needs to signal postgres)"
                );
                let _ = paused.send(pid);
                Ok::<_, Error>(())
            })
        })
        .await;
    let pid = pid.await.expect("the backend's pid");
    let resume = || {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &pid.to_string()])
            .status();
    };
    let error = match stuck {
        Ok(()) => {
            resume();
            panic!("a commit to a stopped backend succeeded")
        }
        Err(error) => error,
    };
    let next = support::append(&handle, "after", 1).await;
    resume();
    assert!(
        matches!(error, Error::ConnectionStuck { .. }) && error.is_retryable(),
        "{error}"
    );
    next.expect("the pool slot serves the next transaction");
    router.close().await;
}
