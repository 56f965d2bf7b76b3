//! Opening tenants: one acquisition per tenant however many open it, capacity, the open
//! timeout and retries, quarantine of a tenant whose schema vanished, the options a router
//! refuses, events that never slow the router, and connections that keep their tenant.

mod support;

use std::time::Duration;

use pgtenant::{Error, Event, Router};
use support::{append, create_log, database, next_for, options, router, tenant, wait_event};
use tokio::sync::broadcast;

#[tokio::test]
async fn concurrent_opens_of_one_tenant_share_one_acquisition() {
    let (db, client) = database().await;
    let router = router(db.url(), "sharer").await;
    let id = tenant("shared");
    let opens: Vec<_> = (0..20).map(|_| router.open_or_create(&id)).collect();
    let mut epochs = std::collections::BTreeSet::new();
    for result in support::join_all(opens).await {
        epochs.insert(result.expect("open").epoch());
    }
    assert_eq!(epochs.len(), 1, "every caller got the same tenure");
    let acquisitions: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtenant.history WHERE tenant_key = $1 AND event = 'acquired'",
            &[&id.key()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(acquisitions, 1);
    router.close().await;
}

#[tokio::test]
async fn capacity_counts_open_tenants() {
    let (db, _client) = database().await;
    let router = Router::start(options(db.url(), "small").max_open_tenants(2))
        .await
        .unwrap();
    let first = router.open_or_create(&tenant("cap-1")).await.unwrap();
    router.open_or_create(&tenant("cap-2")).await.unwrap();
    match router.open_or_create(&tenant("cap-3")).await {
        Err(Error::AtCapacity { max: 2, .. }) => {}
        other => panic!("expected AtCapacity, got {other:?}"),
    }
    // An open of a tenant already served is not a new slot.
    router.open(&tenant("cap-1")).await.expect("already open");
    first.handoff().await.unwrap();
    router
        .open_or_create(&tenant("cap-3"))
        .await
        .expect("a slot is free again");
    assert_eq!(router.open_count(), 2);
    router.close().await;
}

#[tokio::test]
async fn a_tenant_whose_schema_vanished_is_quarantined_until_cleared() {
    let (db, client) = database().await;
    let router = router(db.url(), "medic").await;
    let mut events = router.subscribe();
    let id = tenant("sick");
    let handle = router.open_or_create(&id).await.unwrap();
    let schema = handle.schema().to_owned();
    handle.release().await.unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA {schema}"))
        .await
        .unwrap();

    for _ in 0..2 {
        match router.open(&id).await {
            Err(error @ Error::Quarantined { .. }) => {
                assert!(!error.is_retryable());
                let text = error.to_string();
                assert!(
                    text.contains("missing") && text.contains("repair"),
                    "{text}"
                );
            }
            other => panic!("expected Quarantined, got {other:?}"),
        }
    }
    wait_event(&mut events, id.key(), "quarantined").await;
    let status = router.status(&id).await.unwrap();
    assert_eq!(status.state, pgtenant::TenantState::Quarantined);
    assert!(status.quarantine_cause.unwrap().contains(&schema));
    assert!(status
        .quarantine_repair
        .unwrap()
        .contains("clear the quarantine"));
    let quarantines: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtenant.history WHERE tenant_key = $1 AND event = 'quarantined'",
            &[&id.key()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(quarantines, 1, "not retried until cleared");

    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap(); // the repair
    assert!(pgtenant::admin::clear_quarantine(&client, &id, "operator")
        .await
        .unwrap());
    assert!(
        !pgtenant::admin::clear_quarantine(&client, &id, "operator")
            .await
            .unwrap(),
        "nothing left to clear"
    );
    router
        .open(&id)
        .await
        .expect("serving again after the repair");
    router.close().await;
}

#[tokio::test]
async fn an_open_that_times_out_releases_the_late_lease() {
    let (db, _client) = database().await;
    let v1 = ("V1__log", "CREATE TABLE log (n bigint)");
    // The second migration outlasts the open: the acquisition succeeds, the migration under its
    // lease finishes after the open gave up.
    let v2 = ("V2__slow", "SELECT pg_sleep(0.6)");
    let first = Router::start(options(db.url(), "first").tenant_migrations([v1]).unwrap())
        .await
        .unwrap();
    let id = tenant("late");
    first
        .open_or_create(&id)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    first.close().await;
    let router = Router::start(
        options(db.url(), "hasty")
            .open_timeout(Duration::from_millis(300))
            .tenant_migrations([v1, v2])
            .unwrap(),
    )
    .await
    .unwrap();
    let mut events = router.subscribe();
    let error = router.open(&id).await.unwrap_err();
    assert!(
        matches!(error, Error::OpenTimeout { .. }) && error.is_retryable(),
        "{error}"
    );
    // The acquisition completes late, and is given back rather than leaked.
    assert!(matches!(
        next_for(&mut events, id.key()).await,
        Event::Acquired { .. }
    ));
    loop {
        if let Event::Released { .. } = next_for(&mut events, id.key()).await {
            break;
        }
    }
    assert!(router.handle_of(&id).is_none());
    let status = router.status(&id).await.unwrap();
    assert_eq!((status.state.as_str(), status.owner), ("free", None));
    router.close().await;
}

/// Issue 25: an open that timed out left its acquisition waiting on the tenant's lock, holding
/// a pool connection, and each retry started another beside it until the pool drained. Now one
/// acquisition per tenant runs at a time whatever the retries, and it gives up within the open
/// timeout; other tenants keep opening meanwhile.
#[tokio::test]
async fn retried_opens_never_stack_acquisitions() {
    let (db, mut client) = database().await;
    let router = Router::start(
        options(db.url(), "retrier")
            .open_timeout(Duration::from_millis(300))
            .pool_size(4),
    )
    .await
    .unwrap();
    let id = tenant("locked");
    router
        .open_or_create(&id)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Hold the tenant row, as a stuck operator session would: the acquisition cannot proceed.
    let blocker = client.transaction().await.unwrap();
    blocker
        .execute(
            "SELECT 1 FROM pgtenant.tenants WHERE key = $1 FOR UPDATE",
            &[&id.key()],
        )
        .await
        .unwrap();
    let mut most = 0;
    for attempt in 0..12 {
        let error = router.open(&id).await.unwrap_err();
        assert!(error.is_retryable(), "{error}");
        let running: i64 = blocker
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND query LIKE '%pgtenant.acquire(%'
                    AND state = 'active' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        most = most.max(running);
        // Another tenant opens meanwhile: the pool is not drained by waiting acquisitions.
        let other = router
            .open_or_create(&tenant(&format!("other{attempt}")))
            .await
            .unwrap();
        other.release().await.unwrap();
    }
    assert!(most <= 1, "{most} acquisitions of one tenant ran at once");
    blocker.commit().await.unwrap();
    let handle = support::take_over(&router, &id, Duration::from_secs(10)).await;
    assert!(handle.is_serving());
    router.close().await;
}

#[tokio::test]
async fn a_slow_subscriber_never_slows_the_router() {
    let (db, _client) = database().await;
    let router = router(db.url(), "chatty").await;
    let mut never_read = router.subscribe();
    let id = tenant("chatty");
    for _ in 0..600 {
        let handle = router.open_or_create(&id).await.unwrap();
        handle.release().await.unwrap();
    }
    assert!(matches!(
        never_read.try_recv(),
        Err(broadcast::error::TryRecvError::Lagged(_))
    ));
    assert!(router.open(&id).await.is_ok());
    let summary = router.summary();
    assert_eq!(
        (summary.open, summary.draining, summary.in_flight),
        (1, 0, 0)
    );
    assert!(summary.serving && summary.incarnation.is_some());
    router.close().await;
}

#[tokio::test]
async fn invalid_router_options_name_the_option() {
    let url = "postgres://postgres@127.0.0.1:1/nowhere";
    let cases = [
        (
            options(url, "x").drain_timeout(Duration::ZERO),
            "drain_timeout",
        ),
        (
            options(url, "x").open_timeout(Duration::from_secs(7200)),
            "open_timeout",
        ),
        (options(url, "x").max_open_tenants(0), "max_open_tenants"),
        (options(url, "x").close_concurrency(0), "close_concurrency"),
        (options(url, "x").reservation(Duration::ZERO), "reservation"),
    ];
    for (options, expected) in cases {
        match Router::start(options).await {
            Err(Error::InvalidOption { option, .. }) => assert_eq!(option, expected),
            Err(other) => panic!("{expected}: expected InvalidOption, got {other}"),
            Ok(_) => panic!("{expected}: accepted"),
        }
    }
}

/// Issue 29: a tenant's work finds the connection that last served it (parked for it), so the
/// session reset runs only when a connection really changes tenant. deadpool alone hands out
/// whichever idle connection comes first: with one tenant per client, most transactions landed
/// on a connection another tenant used last and paid the reset (40–80 µs of server CPU).
#[tokio::test]
async fn connections_keep_their_tenant_so_the_reset_runs_only_on_a_real_change() {
    let (db, client) = database().await;
    // Count calls of plpgsql functions (the reset) in this database's new sessions.
    client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET track_functions = 'pl'",
            client
                .query_one("SELECT quote_ident(current_database())", &[])
                .await
                .unwrap()
                .get::<_, String>(0)
        ))
        .await
        .unwrap();
    let router = Router::start(options(db.url(), "affine").pool_size(16))
        .await
        .unwrap();
    let handles: Vec<_> = {
        let mut handles = Vec::new();
        for n in 0..6 {
            let handle = router
                .open_or_create(&tenant(&format!("affine{n}")))
                .await
                .unwrap();
            create_log(&handle).await;
            handles.push(handle);
        }
        handles
    };
    let writes = handles.iter().enumerate().map(|(n, handle)| async move {
        for seq in 0..40 {
            append(handle, &format!("w{n}"), seq).await.expect("write");
        }
    });
    support::join_all(writes.collect()).await;
    // Backends report their function counts as they exit: close the router and wait for its
    // backends to be gone.
    router.close().await;
    drop(handles);
    drop(router);
    loop {
        let others: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if others == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let resets: i64 = client
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions
              WHERE schemaname = 'pgtenant' AND funcname = 'reset_session'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    println!("6 tenants × 40 concurrent writes: {resets} session resets");
    // Each connection resets once when a tenant first takes it (and after the control-plane
    // calls that opened and created the tenants); never once per transaction.
    assert!(resets <= 30, "{resets} session resets for 240 transactions");
}
