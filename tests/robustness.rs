//! A newcomer's first hour (issue #9): a server that never answers does not hang the router, no
//! value of any option panics, and errors say what is wrong and whether a retry can help.

mod support;

use std::time::{Duration, Instant};

use pgtenant::pool::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pgtenant::{Error, Event, Router, RouterOptions};
use support::{database, options, tenant};

/// Generous room for scheduling on a loaded machine, far below a hang.
const SLACK: Duration = Duration::from_secs(3);

/// Accepts TCP connections and never says a word: a hung server, or something that is not
/// PostgreSQL.
async fn silent_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    port
}

/// `Router::start`, or a panic if it is still waiting after `limit`.
async fn start_within(options: RouterOptions, limit: Duration) -> pgtenant::Result<Router> {
    let started = Instant::now();
    let result = tokio::time::timeout(limit, Router::start(options))
        .await
        .unwrap_or_else(|_| panic!("Router::start still waiting after {limit:?}"));
    assert!(started.elapsed() < limit);
    result
}

#[tokio::test]
async fn starting_against_a_server_that_never_answers_fails_within_the_connect_timeout() {
    let port = silent_server().await;
    let url = format!("postgres://postgres@127.0.0.1:{port}/app");
    let bound = Duration::from_millis(500);
    let explicit = RouterOptions::from_url("silent", &url)
        .unwrap()
        .connect_timeout(bound);
    // The connection string's connect_timeout bounds the whole connect, as in libpq.
    let from_url = RouterOptions::from_url("silent", &format!("{url}?connect_timeout=1")).unwrap();
    for (options, bound) in [(explicit, bound), (from_url, Duration::from_secs(1))] {
        let error = match start_within(options, bound + SLACK).await {
            Err(error) => error,
            Ok(_) => panic!("a router started against a silent server"),
        };
        assert!(
            matches!(error, Error::ConnectTimeout { timeout, .. } if timeout == bound),
            "{error:?}"
        );
        assert!(error.is_retryable(), "{error}");
        let message = error.to_string();
        for part in [
            "open the lease session",
            &format!("127.0.0.1:{port}"),
            "RouterOptions::connect_timeout",
        ] {
            assert!(message.contains(part), "{part:?} missing: {message}");
        }
    }
}

const DURATIONS: [(&str, Duration); 6] = [
    ("zero", Duration::ZERO),
    ("1ns", Duration::from_nanos(1)),
    ("1ms", Duration::from_millis(1)),
    ("typical", Duration::from_secs(1)),
    ("u64::MAX s", Duration::from_secs(u64::MAX)),
    ("Duration::MAX", Duration::MAX),
];

/// Either accepted (and then nothing downstream panics either), or refused with an
/// `InvalidOption` that names the option, the value and the accepted range.
async fn check(url: &str, options: RouterOptions, option: &str, value: &str) -> bool {
    match start_within(options, Duration::from_secs(30)).await {
        Ok(router) => {
            let _ = router.open_or_create(&tenant("any")).await;
            router.close().await;
            true
        }
        Err(Error::InvalidOption {
            option: named,
            reason,
            ..
        }) => {
            assert_eq!(named, option, "{reason}");
            assert!(
                reason.contains(value),
                "{option}: the value {value} is not named: {reason}"
            );
            assert!(reason.contains(".."), "{option}: no range in: {reason}");
            false
        }
        // Accepted, then failing for a reason of the database's (a 1 ms connect timeout).
        Err(other) => {
            assert!(other.is_retryable(), "{option} = {value}: {other} ({url})");
            true
        }
    }
}

#[tokio::test]
async fn no_duration_or_count_panics_and_every_refusal_names_option_value_and_range() {
    let (db, _client) = database().await;
    let url = db.url();
    type Set = fn(&str, Duration) -> RouterOptions;
    let setters: [(&str, Set); 10] = [
        ("ttl", |url, d| options(url, "table").ttl(d)),
        ("margin", |url, d| options(url, "table").margin(d)),
        ("heartbeat_period", |url, d| {
            options(url, "table").heartbeat_period(d)
        }),
        ("drain_timeout", |url, d| {
            options(url, "table").drain_timeout(d)
        }),
        ("open_timeout", |url, d| {
            options(url, "table").open_timeout(d)
        }),
        ("reservation", |url, d| options(url, "table").reservation(d)),
        ("reconnect_backoff", |url, d| {
            options(url, "table").reconnect_backoff(d, d)
        }),
        ("connect_timeout", |url, d| {
            options(url, "table").connect_timeout(d)
        }),
        ("tcp_user_timeout", |url, d| {
            options(url, "table").tcp_user_timeout(d)
        }),
        // Socket timeouts far beyond what a socket takes must not panic in the driver either.
        ("config", |url, d| {
            let mut config: pgtenant::postgres::Config = url.parse().unwrap();
            config.keepalives_idle(d).tcp_user_timeout(d);
            RouterOptions::new("table", config)
                .ttl(support::TTL)
                .margin(Duration::from_millis(400))
                .heartbeat_period(Duration::from_millis(300))
        }),
    ];
    for (option, set) in setters {
        for (label, duration) in DURATIONS {
            let options = set(url, duration);
            let accepted = check(url, options, option, &format!("{duration:?}")).await;
            if option != "config" {
                // The ends are always refused: no option means zero or forever.
                let at_an_end = duration.is_zero() || duration == Duration::MAX;
                assert!(!(at_an_end && accepted), "{option} = {label} was accepted");
            }
            // One second is a sane value for all but the heartbeat (above ttl/2 here).
            if label == "typical" && option != "heartbeat_period" {
                assert!(accepted, "{option} = {label} was refused");
            }
        }
    }
    type Count = fn(RouterOptions, usize) -> RouterOptions;
    let counts: [(&str, Count, usize); 3] = [
        ("pool_size", |o, n| o.pool_size(n), 1000),
        ("max_open_tenants", |o, n| o.max_open_tenants(n), 10_000_000),
        ("close_concurrency", |o, n| o.close_concurrency(n), 1024),
    ];
    for (option, set, max) in counts {
        for (n, valid) in [(0, false), (1, true), (max, true), (usize::MAX, false)] {
            let accepted = check(url, set(options(url, "table"), n), option, &n.to_string()).await;
            assert_eq!(accepted, valid, "{option} = {n}");
        }
    }
    let router = support::router(url, "counts").await;
    for (n, valid) in [(0, false), (1, true), (1024, true), (usize::MAX, false)] {
        match router.migrate_all(n, |_| {}).await {
            Ok(_) => assert!(valid, "concurrency {n} accepted"),
            Err(Error::InvalidOption { option, reason, .. }) => {
                assert!(!valid, "concurrency {n} refused: {reason}");
                assert_eq!(option, "concurrency");
                assert!(
                    reason.contains(&n.to_string()) && reason.contains(".."),
                    "{reason}"
                );
            }
            Err(other) => panic!("concurrency {n}: {other}"),
        }
    }
    router.close().await;
}

/// "Wait forever" is a natural thing to ask: a timeout past any representable instant is no
/// deadline, and short ones time out as usual.
#[tokio::test]
async fn wait_for_and_request_handoff_take_any_timeout() {
    let (db, _client) = database().await;
    let owner = support::router(db.url(), "owner").await;
    let waiter = support::router(db.url(), "waiter").await;
    let id = tenant("forever");
    let mut handle = owner.open_or_create(&id).await.unwrap();
    for (label, timeout) in &DURATIONS[..4] {
        match waiter.wait_for(&id, *timeout).await {
            Err(Error::OpenTimeout { .. }) => {}
            other => panic!("wait_for {label}: {:?}", other.map(|_| ())),
        }
    }
    for timeout in [Duration::from_secs(u64::MAX), Duration::MAX] {
        let forever = support::router(db.url(), "forever").await;
        let waiting = tokio::spawn({
            let id = id.clone();
            async move {
                let result = forever.wait_for(&id, timeout).await.map(|h| h.epoch());
                forever.close().await; // hands the tenant back
                result
            }
        });
        handle.release().await.unwrap();
        let epoch = waiting.await.expect("wait_for did not panic");
        assert!(epoch.unwrap() > handle.epoch());
        handle = owner.open(&id).await.unwrap();
    }
    // The owner hands over when asked; the requester waits without a deadline.
    let moved = waiter.request_handoff(&id, Duration::MAX).await.unwrap();
    assert!(moved.epoch() > handle.epoch());
    owner.close().await;
    waiter.close().await;
}

#[tokio::test]
async fn tls_demanded_without_a_connector_and_nul_bytes_are_not_retryable() {
    let (db, _client) = database().await;
    let mut required = db.config();
    required.ssl_mode(pgtenant::postgres::config::SslMode::Require);
    let error = Router::start(RouterOptions::new("tls", required.clone()))
        .await
        .expect_err("refused");
    assert!(
        matches!(error, Error::InvalidOption { option: "tls", .. }),
        "{error}"
    );
    assert!(!error.is_retryable());
    assert!(error.to_string().contains("RouterOptions::tls"), "{error}");

    let nul = format!("{}%00x", db.url());
    let error = Router::start(RouterOptions::from_url("nul", &nul).unwrap())
        .await
        .expect_err("refused");
    assert!(
        matches!(
            error,
            Error::InvalidOption {
                option: "config",
                ..
            }
        ),
        "{error}"
    );
    assert!(!error.is_retryable());
    assert!(error.to_string().contains("NUL"), "{error}");

    // The same mistakes in a pool the application hands over surface at the first use; they
    // are not "the database is unavailable" either.
    let mut nul_name = db.config();
    nul_name.dbname("bad\0name");
    for (config, says) in [(required, "RouterOptions::tls"), (nul_name, "null")] {
        let manager = Manager::from_config(
            config,
            pgtenant::postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).max_size(1).build().unwrap();
        // Start checks the pool's sessions (read-only by default), which is its first use.
        let error = Router::start(options(db.url(), "own-pool").pool(pool))
            .await
            .expect_err("the pool cannot connect");
        assert!(!error.is_retryable(), "{error}");
        assert!(
            error.to_string().contains(says),
            "{says:?} missing: {error}"
        );
    }
}

#[tokio::test]
async fn a_bad_connection_string_names_the_part_and_what_it_accepts() {
    for (url, parts) in [
        (
            "postgres://postgres@127.0.0.1:99999/app",
            &["`port`", "99999", "65535"][..],
        ),
        (
            "postgres://postgres@127.0.0.1/app?sslmode=bogus",
            &["`sslmode`", "bogus", "disable, prefer or require"][..],
        ),
        (
            "postgres://postgres@127.0.0.1/app?sslmode=verify-full",
            &["`sslmode`", "verify-full", "RouterOptions::tls"][..],
        ),
        (
            "postgres://postgres@127.0.0.1/app?colour=blue",
            &["unknown option `colour`", "sslmode", "connect_timeout"][..],
        ),
        (
            "host=127.0.0.1 port=70000",
            &["`port`", "70000", "65535"][..],
        ),
    ] {
        match RouterOptions::from_url("url", url) {
            Err(Error::InvalidOption {
                option: "database_url",
                reason,
                ..
            }) => {
                for part in parts {
                    assert!(reason.contains(part), "{url}: {part:?} missing: {reason}");
                }
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// A control plane upgraded beneath a running replica: its re-registrations fail for that
/// reason, and says so (events, summary, opens), not that the database is unreachable.
#[tokio::test]
async fn a_control_plane_upgraded_beneath_a_running_replica_is_reported_as_such() {
    let (db, client) = database().await;
    let router = support::router(db.url(), "outdated").await;
    let mut events = router.subscribe();
    client
        .execute(
            "INSERT INTO pgtenant.refinery_schema_history (version, name, applied_on, checksum)
             VALUES (999, 'from_the_future', '2030-01-01T00:00:00Z', '1')",
            &[],
        )
        .await
        .unwrap();
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE application_name = 'pgtenant lease outdated'",
            &[],
        )
        .await
        .unwrap();
    let reason = loop {
        if let Event::RegistrationFailed {
            reason, retryable, ..
        } = events.recv().await.unwrap()
        {
            assert!(!retryable, "{reason}");
            break reason;
        }
    };
    assert!(
        reason.contains("control plane is at version 999"),
        "{reason}"
    );
    let summary = router.summary();
    assert_eq!(summary.incarnation, None);
    assert_eq!(summary.registration_error.as_deref(), Some(reason.as_str()));
    for error in [
        router.open(&tenant("any")).await.err().unwrap(),
        router
            .wait_for(&tenant("any"), Duration::MAX)
            .await
            .err()
            .unwrap(),
    ] {
        assert!(
            matches!(error, Error::ControlPlaneTooNew { found: 999, .. }),
            "{error}"
        );
        assert!(!error.to_string().contains("unreachable"), "{error}");
    }
    router.close().await;
}
