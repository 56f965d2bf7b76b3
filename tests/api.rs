//! The public API's promises to callers: what an open says it did, how errors sort and name
//! themselves, what close reports, and the metrics a recorder sees.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use pgtenant::{ActiveWork, Error, ErrorKind, Router};
use support::{database, hold_work, options, router, tenant};

/// One recorder per test binary: the `metrics` facade takes the first and keeps it.
fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// `created()` tells the open that made the tenant from one that found it.
#[tokio::test]
async fn open_or_create_says_whether_it_created_the_tenant() {
    let (db, _client) = database().await;
    let router = router(db.url(), "creator").await;
    let id = tenant("fresh");
    let made = router.open_or_create(&id).await.unwrap();
    assert!(made.created(), "the tenant did not exist");
    assert!(router.handle_of(&id).unwrap().created(), "same tenure");
    made.release().await.unwrap();
    let found = router.open_or_create(&id).await.unwrap();
    assert!(!found.created(), "the tenant existed");
    found.release().await.unwrap();
    assert!(!router.open(&id).await.unwrap().created());
    router.close().await;
}

/// A missing tenant is named once, with why and what to do: never created, or forgotten (then
/// the trash is the way back).
#[tokio::test]
async fn a_missing_tenant_says_why_once_and_what_to_do() {
    let (db, _client) = database().await;
    let router = router(db.url(), "finder").await;
    let never = tenant("never");
    let error = router.open(&never).await.unwrap_err();
    assert!(
        matches!(&error, Error::TenantNotFound { reason, .. } if reason == "never created"),
        "{error:?}"
    );
    assert_eq!(error.kind(), ErrorKind::NotFound);
    let text = error.to_string();
    assert_eq!(text.matches("does not exist").count(), 1, "{text}");
    assert!(text.contains("Router::open_or_create"), "{text}");
    assert!(!text.contains("restore"), "{text}");

    let id = tenant("gone");
    let handle = router.open_or_create(&id).await.unwrap();
    let epoch = handle.epoch();
    handle.forget(ActiveWork::Refuse).await.unwrap();
    let error = router.open(&id).await.unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(&error, Error::TenantNotFound { reason, .. } if reason.starts_with("forgotten at epoch")),
        "{error:?}"
    );
    assert!(
        text.contains(&format!("(forgotten at epoch {epoch})")),
        "{text}"
    );
    assert_eq!(text.matches("does not exist").count(), 1, "{text}");
    assert!(text.contains("Router::restore"), "{text}");
    assert!(router.restore(&id).await.is_ok());
    router.close().await;
}

/// Kinds sort errors by what the caller does, and name themselves with stable codes.
#[tokio::test]
async fn error_kinds_sort_by_what_to_do_and_have_stable_codes() {
    let (db, _client) = database().await;
    let router = router(db.url(), "kinds").await;
    let handle = router.open_or_create(&tenant("kinds")).await.unwrap();
    let error = handle
        .handoff_to(&support::replica("nobody"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NoSuchReplica { .. }), "{error:?}");
    assert_eq!(
        error.kind(),
        ErrorKind::InvalidInput,
        "the call named no replica"
    );
    router.close().await;
    let error = router.open(&tenant("late")).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Closed);
    assert!(!error.is_retryable(), "this router will not open again");
    for kind in [
        ErrorKind::InvalidInput,
        ErrorKind::Unavailable,
        ErrorKind::ControlPlane,
        ErrorKind::Replica,
        ErrorKind::Closed,
        ErrorKind::Held,
        ErrorKind::LeaseEnded,
        ErrorKind::NotFound,
        ErrorKind::Tenant,
        ErrorKind::Busy,
        ErrorKind::Work,
        ErrorKind::Database,
    ] {
        let code = kind.as_str();
        assert!(code.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        assert_eq!(kind.to_string(), code);
        assert_eq!(serde_json::to_value(kind).unwrap(), code);
    }
}

/// What close did serializes for a shutdown log: tenants handed off, and each failure with its
/// kind and message.
#[tokio::test]
async fn close_report_serializes_with_each_failure_kind_and_message() {
    let (db, _client) = database().await;
    let router =
        Router::start(options(db.url(), "reporting").drain_timeout(Duration::from_millis(200)))
            .await
            .unwrap();
    let idle = tenant("idle");
    router.open_or_create(&idle).await.unwrap();
    let busy = router.open_or_create(&tenant("busy")).await.unwrap();
    let (release, work) = hold_work(&busy).await;
    let report = router.close().await;
    let _ = release.send(());
    let _ = work.await;
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["handed_off"],
        serde_json::json!([idle.to_string()]),
        "{json}"
    );
    let failed = &json["failed"][0];
    assert_eq!(failed["tenant"], busy.id().to_string(), "{json}");
    assert_eq!(failed["kind"], "busy", "{json}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("gave up after"),
        "{json}"
    );
}

/// Every metric is described for the recorder, and the gauge names its replica, so two
/// routers in one process do not overwrite each other's count.
#[tokio::test]
async fn metrics_are_described_and_the_gauge_names_its_replica() {
    let snapshotter = recorder();
    let (db, _client) = database().await;
    let first = router(db.url(), "gauge-a").await;
    let second = router(db.url(), "gauge-b").await;
    first.open_or_create(&tenant("one")).await.unwrap();
    first.open_or_create(&tenant("two")).await.unwrap();
    second.open_or_create(&tenant("three")).await.unwrap();
    let snapshot = snapshotter.snapshot().into_vec();
    let gauge = |replica: &str| {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            let named = key.name() == pgtenant::metrics::LEASES_HELD
                && key
                    .labels()
                    .any(|label| label.key() == "replica" && label.value() == replica);
            match value {
                DebugValue::Gauge(held) if named => Some(held.into_inner()),
                _ => None,
            }
        })
    };
    assert_eq!(gauge("gauge-a"), Some(2.0), "{snapshot:?}");
    assert_eq!(gauge("gauge-b"), Some(1.0), "{snapshot:?}");
    let described = |name: &str| {
        snapshot
            .iter()
            .any(|(key, _, help, _)| key.key().name() == name && help.is_some())
    };
    assert!(described(pgtenant::metrics::LEASES_HELD));
    assert!(described(pgtenant::metrics::ACQUISITIONS));
    first.close().await;
    second.close().await;
}

/// An application's error type with exactly one conversion from pgtenant (issue 27): ids,
/// opens, the statements of `run`'s work and of the guard API all return `pgtenant::Error`, and a
/// constraint violation keeps its SQLSTATE through it.
#[derive(Debug)]
enum AppError {
    Pgtenant(Error),
    Overdrawn,
}

impl From<Error> for AppError {
    fn from(error: Error) -> Self {
        AppError::Pgtenant(error)
    }
}

async fn book(router: &Router, organization: &str, amount: i64) -> Result<i64, AppError> {
    let id = pgtenant::TenantId::new(organization, "ledger")?;
    let tenant = router.open_or_create(&id).await?;
    let balance = tenant
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(
                    "CREATE TABLE IF NOT EXISTS entries (id int PRIMARY KEY, amount bigint)",
                )
                .await?;
                let balance: i64 = tx
                    .query_one("SELECT coalesce(sum(amount), 0)::bigint FROM entries", &[])
                    .await?
                    .get(0);
                if balance + amount < 0 {
                    return Err(AppError::Overdrawn);
                }
                tx.execute("INSERT INTO entries VALUES (1, $1)", &[&amount])
                    .await?;
                Ok(balance + amount)
            })
        })
        .await?;
    let mut connection = tenant.connect().await?;
    let tx = connection.begin().await?;
    let rows = tx.query("SELECT amount FROM entries", &[]).await?;
    tx.commit().await?;
    assert_eq!(rows.len(), 1);
    Ok(balance)
}

#[tokio::test]
async fn one_conversion_is_enough_for_an_application_error() {
    let (db, _client) = database().await;
    let router = router(db.url(), "one-from").await;
    assert_eq!(book(&router, "acme", 5).await.expect("booked"), 5);
    assert!(matches!(
        book(&router, "globex", -1).await,
        Err(AppError::Overdrawn)
    ));
    // The second entry with id 1: the unique violation, with its SQLSTATE and the server's words.
    match book(&router, "acme", 5).await {
        Err(AppError::Pgtenant(error)) => {
            assert_eq!(error.sqlstate(), Some("23505"), "{error}");
            assert!(error.to_string().contains("entries_pkey"), "{error}");
        }
        other => panic!("expected the unique violation, got {other:?}"),
    }
    match book(&router, "not an id", 1).await {
        Err(AppError::Pgtenant(error @ Error::InvalidTenantId(_))) => {
            assert_eq!(error.kind(), ErrorKind::InvalidInput);
        }
        other => panic!("expected InvalidTenantId, got {other:?}"),
    }
    router.close().await;
}

/// A router dropped without `close()` never registers again: its handles say so, instead of
/// "registering again, retry shortly" (issue 27, the demo's crashed replica).
#[tokio::test]
async fn the_handles_of_a_dropped_router_say_it_is_gone_for_good() {
    let (db, _client) = database().await;
    let survivor = router(db.url(), "survivor").await;
    let doomed = Router::start(options(db.url(), "doomed"))
        .await
        .expect("router");
    let handle = doomed
        .open_or_create(&tenant("dropped"))
        .await
        .expect("create");
    support::create_log(&handle).await;
    drop(doomed);
    let error = support::append(&handle, "doomed", 1)
        .await
        .expect_err("the router is gone");
    assert!(matches!(error, Error::RouterClosed), "{error:?}");
    assert!(!error.is_retryable());
    let message = error.to_string();
    assert!(
        !message.contains("retry") && message.contains("dropped"),
        "{message}"
    );
    // Its tenant is taken over at once elsewhere.
    let taken = support::take_over(&survivor, &tenant("dropped"), Duration::from_secs(10)).await;
    support::append(&taken, "survivor", 1).await.expect("write");
    survivor.close().await;
}
