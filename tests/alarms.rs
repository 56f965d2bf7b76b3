//! Tenant alarms (DESIGN G11, §5 "Alarms"; issue #31): scheduled inside a fenced transaction,
//! fired by the tenant's owner in another whose commit also removes the alarm, so the effect
//! commits exactly once, never early, never by a stale owner, and never lost (a due alarm of a
//! tenant nobody holds wakes it). Every test waits for conditions with a deadline; the only
//! waits that are not conditions are the windows in which something must *not* happen.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use pgtenant::{ActiveWork, Alarm, Error, Event, Fencing, Router, RouterOptions, TenantHandle};
use support::{database, options, take_over, tenant, wait_event};
use tokio::sync::broadcast;

/// The table the test handler writes its effects to, one row per committed firing.
const EFFECTS: (&str, &str) = (
    "V1__effects",
    "CREATE TABLE effects (name text NOT NULL, alarm_id bigint NOT NULL, attempt int NOT NULL,
                           replica text NOT NULL, payload jsonb NOT NULL,
                           fired_at timestamptz NOT NULL DEFAULT now())",
);

/// Options whose handler records each firing in `effects`, and fails while the payload's
/// `fail` is at least the attempt. `calls` counts the handler's calls.
fn alarm_options(url: &str, replica: &'static str, calls: Arc<AtomicUsize>) -> RouterOptions {
    options(url, replica)
        .tenant_migrations([EFFECTS])
        .expect("migrations")
        .alarm_max_attempts(3)
        .alarm_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .alarm_handler(move |tx, alarm: Alarm| {
            let calls = calls.clone();
            Box::pin(async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let payload: serde_json::Value = alarm.payload()?;
                if payload["panic"].as_bool() == Some(true) {
                    panic!("planned panic at attempt {}", alarm.attempt);
                }
                // Fails until an operator repaired the ledger (a row named "repair").
                if payload["needs_repair"].as_bool() == Some(true) {
                    let repaired: bool = tx
                        .query_one(
                            "SELECT EXISTS (SELECT 1 FROM effects WHERE name = 'repair')",
                            &[],
                        )
                        .await?
                        .get(0);
                    if !repaired {
                        return Err("planned failure: needs repair".into());
                    }
                }
                // Cancels another alarm of the tenant, in the firing's transaction.
                if let Some(other) = payload["cancel"].as_str() {
                    tx.cancel_alarm(other).await?;
                }
                // A statement fails, and the handler says Ok all the same.
                if payload["swallow"].as_bool() == Some(true) {
                    let _ = tx.execute("SELECT 1/0", &[]).await;
                    return Ok(());
                }
                let fail = payload["fail"].as_u64().unwrap_or(0);
                if u64::from(alarm.attempt) <= fail {
                    return Err(format!("planned failure at attempt {}", alarm.attempt).into());
                }
                let attempt = i32::try_from(alarm.attempt)?;
                tx.execute(
                    "INSERT INTO effects (name, alarm_id, attempt, replica, payload)
                     VALUES ($1, $2, $3, $4, $5::text::jsonb)",
                    &[
                        &alarm.name,
                        &alarm.id,
                        &attempt,
                        &replica,
                        &alarm.payload_json(),
                    ],
                )
                .await?;
                // A recurring alarm: the same name again, in the same transaction.
                if let Some(left) = payload["recur"].as_u64().filter(|left| *left > 0) {
                    let next = SystemTime::now() + Duration::from_millis(100);
                    tx.schedule_alarm(&alarm.name, next, &serde_json::json!({"recur": left - 1}))
                        .await?;
                }
                Ok(())
            })
        })
}

async fn alarm_router(url: &str, replica: &'static str) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let router = Router::start(alarm_options(url, replica, calls.clone()))
        .await
        .expect("router starts");
    (router, calls)
}

/// A replica without an alarm handler: it schedules alarms and never fires them.
async fn scheduling_router(url: &str, replica: &'static str) -> Router {
    Router::start(
        options(url, replica)
            .tenant_migrations([EFFECTS])
            .expect("migrations"),
    )
    .await
    .expect("router starts")
}

/// Schedules `name` due in `due_in` (negative: in the past) with `payload`, in its own
/// transaction.
async fn schedule(handle: &TenantHandle, name: &str, due: SystemTime, payload: serde_json::Value) {
    let name = name.to_owned();
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.schedule_alarm(&name, due, &payload).await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .expect("schedule");
}

/// A work's own error, to roll its transaction back.
#[derive(Debug)]
enum Planned {
    Rollback,
    #[allow(dead_code)] // read by Debug
    Db(Error),
}

impl From<Error> for Planned {
    fn from(error: Error) -> Self {
        Planned::Db(error)
    }
}

fn in_ms(ms: u64) -> SystemTime {
    SystemTime::now() + Duration::from_millis(ms)
}

/// Polls `condition` every 25 ms until it holds, or panics after `limit` saying `what`.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if condition().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Rows of `effects` for `name`, read through the handle: (alarm id, attempt, replica, payload).
async fn effects(handle: &TenantHandle, name: &str) -> Vec<(i64, i32, String, serde_json::Value)> {
    let name = name.to_owned();
    handle
        .read(move |tx| {
            Box::pin(async move {
                let rows = tx
                    .query(
                        "SELECT alarm_id, attempt, replica, payload::text FROM effects
                          WHERE name = $1 ORDER BY fired_at",
                        &[&name],
                    )
                    .await?;
                Ok::<_, Error>(
                    rows.iter()
                        .map(|row| {
                            let payload: String = row.get(3);
                            (
                                row.get(0),
                                row.get(1),
                                row.get(2),
                                serde_json::from_str(&payload).expect("json"),
                            )
                        })
                        .collect(),
                )
            })
        })
        .await
        .expect("read effects")
}

/// Alarms left in the tenant's table.
async fn pending(handle: &TenantHandle) -> i64 {
    support::count_rows(handle, "SELECT count(*) FROM pgtenant_alarms").await
}

/// The tenant's row of the psql view: (pending, failed), or None.
async fn view(client: &tokio_postgres::Client, key: &str) -> Option<(i32, i32)> {
    client
        .query_opt(
            "SELECT pending, failed FROM pgtenant.alarms WHERE tenant = $1",
            &[&key],
        )
        .await
        .expect("the alarms view")
        .map(|row| (row.get(0), row.get(1)))
}

#[tokio::test]
async fn an_alarm_fires_once_not_before_it_is_due_in_the_transaction_that_removes_it() {
    let (db, client) = database().await;
    let (router, calls) = alarm_router(db.url(), "alarm-once").await;
    let mut events = router.subscribe();
    let id = tenant("once");
    let handle = router.open_or_create(&id).await.unwrap();
    let due = in_ms(500);
    schedule(&handle, "a", due, serde_json::json!({"n": 1})).await;
    assert_eq!(view(&client, id.key()).await, Some((1, 0)), "the hint");
    eventually(Duration::from_secs(10), "the alarm fired", || async {
        !effects(&handle, "a").await.is_empty()
    })
    .await;
    let fired_at: SystemTime = handle
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, Error>(
                    tx.query_one("SELECT fired_at FROM effects", &[])
                        .await?
                        .get(0),
                )
            })
        })
        .await
        .unwrap();
    assert!(fired_at >= due, "not before it was due");
    assert_eq!(pending(&handle).await, 0, "removed in the same commit");
    assert_eq!(view(&client, id.key()).await, None, "the hint is gone");
    let fired = loop {
        match events.recv().await.unwrap() {
            Event::AlarmFired {
                tenant,
                name,
                attempt,
                ..
            } if tenant == id => break (name, attempt),
            _ => {}
        }
    };
    assert_eq!(fired, ("a".to_owned(), 1));
    // Past a poll of the due tenants: still once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rows = effects(&handle, "a").await;
    assert_eq!(rows.len(), 1, "exactly once: {rows:?}");
    assert_eq!(rows[0].3, serde_json::json!({"n": 1}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    router.close().await;
}

#[tokio::test]
async fn a_schedule_that_rolls_back_never_fires_and_replace_and_cancel_hold() {
    let (db, _client) = database().await;
    let (router, _calls) = alarm_router(db.url(), "alarm-edit").await;
    let handle = router.open_or_create(&tenant("edit")).await.unwrap();
    // Rolled back with its transaction.
    let outcome: Result<(), Planned> = handle
        .run(|tx| {
            Box::pin(async move {
                tx.schedule_alarm("rolled-back", in_ms(0), &()).await?;
                Err::<(), _>(Planned::Rollback)
            })
        })
        .await;
    assert!(matches!(outcome, Err(Planned::Rollback)), "{outcome:?}");
    // Replaced: the second schedule's time and payload; cancelled: never.
    schedule(&handle, "r", in_ms(3000), serde_json::json!({"v": 1})).await;
    schedule(&handle, "r", in_ms(100), serde_json::json!({"v": 2})).await;
    schedule(&handle, "x", in_ms(300), serde_json::json!({})).await;
    let cancelled = handle
        .run(|tx| {
            Box::pin(async move {
                let first = tx.cancel_alarm("x").await?;
                let again = tx.cancel_alarm("x").await?;
                Ok::<_, Error>((first, again))
            })
        })
        .await
        .unwrap();
    assert_eq!(cancelled, (true, false));
    // Bad input: refused before anything is sent.
    let refused = handle
        .run(|tx| {
            Box::pin(async move {
                let empty = tx.schedule_alarm("", in_ms(0), &()).await;
                let long = tx.schedule_alarm(&"n".repeat(201), in_ms(0), &()).await;
                let big = tx
                    .schedule_alarm("big", in_ms(0), &"x".repeat(70 * 1024))
                    .await;
                Ok::<_, Error>(
                    [empty, long, big].map(|r| matches!(r, Err(Error::InvalidOption { .. }))),
                )
            })
        })
        .await
        .unwrap();
    assert_eq!(refused, [true, true, true]);
    // A marker due after all of them: once it fired, the others had their chance.
    schedule(&handle, "marker", in_ms(1200), serde_json::json!({})).await;
    eventually(Duration::from_secs(10), "the marker fired", || async {
        !effects(&handle, "marker").await.is_empty()
    })
    .await;
    let replaced = effects(&handle, "r").await;
    assert_eq!(replaced.len(), 1, "{replaced:?}");
    assert_eq!(
        replaced[0].3,
        serde_json::json!({"v": 2}),
        "the replacement fired"
    );
    assert!(effects(&handle, "x").await.is_empty(), "cancelled");
    assert!(
        effects(&handle, "rolled-back").await.is_empty(),
        "rolled back"
    );
    assert_eq!(pending(&handle).await, 0);
    router.close().await;
}

#[tokio::test]
async fn an_alarm_in_the_past_fires_at_once() {
    let (db, _client) = database().await;
    let (router, _calls) = alarm_router(db.url(), "alarm-past").await;
    let handle = router.open_or_create(&tenant("past")).await.unwrap();
    let started = Instant::now();
    schedule(
        &handle,
        "late",
        SystemTime::now() - Duration::from_secs(3600),
        serde_json::json!({}),
    )
    .await;
    eventually(Duration::from_secs(5), "the past alarm fired", || async {
        !effects(&handle, "late").await.is_empty()
    })
    .await;
    // Woken by the commit (a poll every second would find it too): no waiting for a due time
    // an hour gone, with room for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    router.close().await;
}

#[tokio::test]
async fn a_failing_handler_is_retried_with_backoff_then_parked() {
    let (db, client) = database().await;
    let (router, calls) = alarm_router(db.url(), "alarm-fail").await;
    let mut events = router.subscribe();
    let id = tenant("fail");
    let handle = router.open_or_create(&id).await.unwrap();
    // Fails once, then fires at its second attempt.
    schedule(&handle, "flaky", in_ms(0), serde_json::json!({"fail": 1})).await;
    eventually(Duration::from_secs(10), "the flaky alarm fired", || async {
        !effects(&handle, "flaky").await.is_empty()
    })
    .await;
    let flaky = effects(&handle, "flaky").await;
    assert_eq!(flaky.len(), 1);
    assert_eq!(flaky[0].1, 2, "at its second attempt");
    // Fails every time: three attempts (alarm_max_attempts), then parked.
    schedule(
        &handle,
        "broken",
        in_ms(0),
        serde_json::json!({"fail": 100}),
    )
    .await;
    let mut failures = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while failures.len() < 4 {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("the failures within 10 s")
            .unwrap();
        if let Event::AlarmFailed {
            tenant,
            name,
            attempt,
            parked,
            error,
            ..
        } = event
        {
            assert_eq!(tenant, id);
            assert!(error.contains("planned failure"), "{error}");
            failures.push((name, attempt, parked));
        }
        if failures.len() == 4 {
            break;
        }
    }
    let broken: Vec<_> = failures.iter().filter(|f| f.0 == "broken").collect();
    assert_eq!(
        broken.iter().map(|f| (f.1, f.2)).collect::<Vec<_>>(),
        [(1, false), (2, false), (3, true)]
    );
    eventually(
        Duration::from_secs(5),
        "the view shows it failed",
        || async { view(&client, id.key()).await == Some((0, 1)) },
    )
    .await;
    let (attempts, failed, last_error): (i32, bool, String) = handle
        .read(|tx| {
            Box::pin(async move {
                let row = tx
                    .query_one(
                        "SELECT attempts, failed_at IS NOT NULL, last_error FROM pgtenant_alarms
                          WHERE name = 'broken'",
                        &[],
                    )
                    .await?;
                Ok::<_, Error>((row.get(0), row.get(1), row.get(2)))
            })
        })
        .await
        .unwrap();
    assert_eq!((attempts, failed), (3, true));
    assert!(
        last_error.contains("planned failure at attempt 3"),
        "{last_error}"
    );
    assert!(
        effects(&handle, "broken").await.is_empty(),
        "nothing committed"
    );
    // A handler that panics fails its attempts the same way, and the firing task lives on.
    schedule(
        &handle,
        "panics",
        in_ms(0),
        serde_json::json!({"panic": true}),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the panicking alarm is parked",
        || async { view(&client, id.key()).await == Some((0, 2)) },
    )
    .await;
    schedule(&handle, "after-panics", in_ms(0), serde_json::json!({})).await;
    eventually(
        Duration::from_secs(10),
        "alarms fire after a panic",
        || async { !effects(&handle, "after-panics").await.is_empty() },
    )
    .await;
    // Parked: not tried again.
    let tried = calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(calls.load(Ordering::SeqCst), tried);
    // Cancelling a parked alarm clears the view.
    let cancelled = handle
        .run(|tx| {
            Box::pin(async move {
                let broken = tx.cancel_alarm("broken").await?;
                let panics = tx.cancel_alarm("panics").await?;
                Ok::<_, Error>(broken && panics)
            })
        })
        .await
        .unwrap();
    assert!(cancelled);
    assert_eq!(view(&client, id.key()).await, None);
    router.close().await;
}

#[tokio::test]
async fn a_due_alarm_of_a_tenant_nobody_holds_wakes_it() {
    let (db, _client) = database().await;
    // The scheduler has no handler: it never fires, and hands the tenant off.
    let scheduler = scheduling_router(db.url(), "alarm-scheduler").await;
    let id = tenant("unheld");
    let handle = scheduler.open_or_create(&id).await.unwrap();
    schedule(&handle, "wake", in_ms(300), serde_json::json!({})).await;
    handle.handoff().await.unwrap();
    let (waker, _calls) = alarm_router(db.url(), "alarm-waker").await;
    eventually(
        Duration::from_secs(10),
        "the waker opened the tenant",
        || async { waker.handle_of(&id).is_some() },
    )
    .await;
    let opened = waker.handle_of(&id).unwrap();
    eventually(Duration::from_secs(10), "the alarm fired", || async {
        !effects(&opened, "wake").await.is_empty()
    })
    .await;
    let rows = effects(&opened, "wake").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].2, "alarm-waker");
    waker.close().await;
    scheduler.close().await;
}

/// A backlog fires in batches (several due alarms of a tenant in one transaction): an alarm an
/// earlier handler of the batch cancelled does not fire, a failing alarm counts its own
/// attempts only and the others fire once, and a handler that swallowed a failed statement is
/// that alarm's failure, not its neighbour's.
#[tokio::test]
async fn a_backlog_fires_in_batches_each_alarm_on_its_own_account() {
    let (db, client) = database().await;
    // Scheduled by a replica without a handler, so that all are due before any fires.
    let scheduler = scheduling_router(db.url(), "alarm-batch-a").await;
    let id = tenant("batch");
    let handle = scheduler.open_or_create(&id).await.unwrap();
    let past = |ms: u64| SystemTime::now() - Duration::from_millis(ms);
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.schedule_alarm(
                    "a-first",
                    past(900),
                    &serde_json::json!({"cancel": "b-cancelled"}),
                )
                .await?;
                tx.schedule_alarm("b-cancelled", past(800), &serde_json::json!({}))
                    .await?;
                tx.schedule_alarm("c-ok", past(700), &serde_json::json!({}))
                    .await?;
                tx.schedule_alarm("d-broken", past(600), &serde_json::json!({"fail": 100}))
                    .await?;
                tx.schedule_alarm("e-ok", past(500), &serde_json::json!({}))
                    .await?;
                tx.schedule_alarm(
                    "f-swallows",
                    past(400),
                    &serde_json::json!({"swallow": true}),
                )
                .await?;
                tx.schedule_alarm("g-ok", past(300), &serde_json::json!({}))
                    .await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .unwrap();
    handle.handoff().await.unwrap();
    let (router, _calls) = alarm_router(db.url(), "alarm-batch-b").await;
    eventually(
        Duration::from_secs(15),
        "the good ones fired, the bad ones parked",
        || async { view(&client, id.key()).await == Some((0, 2)) },
    )
    .await;
    let opened = router.handle_of(&id).expect("woken");
    for name in ["a-first", "c-ok", "e-ok", "g-ok"] {
        let fired = effects(&opened, name).await;
        assert_eq!(fired.len(), 1, "{name} fired once: {fired:?}");
        assert_eq!(
            fired[0].1, 1,
            "{name} at its first attempt: the others' failures are not its"
        );
    }
    assert!(
        effects(&opened, "b-cancelled").await.is_empty(),
        "cancelled by a-first in its batch"
    );
    let parked: Vec<(String, i32, String)> = opened
        .read(|tx| {
            Box::pin(async move {
                let rows = tx
                    .query(
                        "SELECT name, attempts, last_error FROM pgtenant_alarms
                          WHERE failed_at IS NOT NULL ORDER BY name",
                        &[],
                    )
                    .await?;
                Ok::<_, Error>(
                    rows.iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2)))
                        .collect(),
                )
            })
        })
        .await
        .unwrap();
    assert_eq!(parked.len(), 2, "{parked:?}");
    assert_eq!((parked[0].0.as_str(), parked[0].1), ("d-broken", 3));
    assert!(parked[0].2.contains("planned failure"), "{parked:?}");
    assert_eq!((parked[1].0.as_str(), parked[1].1), ("f-swallows", 3));
    assert!(
        parked[1].2.contains("the handler returned Ok"),
        "{parked:?}"
    );
    router.close().await;
    scheduler.close().await;
}

#[tokio::test]
async fn a_due_alarm_of_a_dead_owner_fires_without_waiting_out_its_ttl() {
    let (db, _client) = database().await;
    // The owner fires nothing (no handler) and would keep its lease for a minute by heartbeat.
    let owner = Router::start(
        options(db.url(), "alarm-dead-owner")
            .ttl(Duration::from_secs(60))
            .tenant_migrations([EFFECTS])
            .unwrap(),
    )
    .await
    .unwrap();
    let id = tenant("dead-owner");
    let handle = owner.open_or_create(&id).await.unwrap();
    schedule(&handle, "d", in_ms(0), serde_json::json!({})).await;
    let (waker, _calls) = alarm_router(db.url(), "alarm-dead-waker").await;
    // Dropped without close(): its lease session ends (the liveness lock is free at once) and
    // its heartbeat row says alive for a minute more, as after a SIGKILL.
    drop(handle);
    drop(owner);
    // Within seconds, not the owner's 60 s ttl: as acquire, due_alarms sees the session gone.
    eventually(
        Duration::from_secs(10),
        "the waker took the dead owner's tenant for its alarm",
        || async {
            match waker.handle_of(&id) {
                Some(taken) => !effects(&taken, "d").await.is_empty(),
                None => false,
            }
        },
    )
    .await;
    waker.close().await;
}

#[tokio::test]
async fn forget_takes_the_alarms_and_restore_brings_them_back() {
    let (db, client) = database().await;
    let (router, calls) = alarm_router(db.url(), "alarm-forget").await;
    let mut events = router.subscribe();
    let id = tenant("forgotten");
    let handle = router.open_or_create(&id).await.unwrap();
    schedule(&handle, "later", in_ms(600), serde_json::json!({})).await;
    handle.forget(ActiveWork::Drain).await.unwrap();
    // Past its due time and two polls: nothing fires for a forgotten tenant.
    let quiet = tokio::time::timeout(Duration::from_millis(2600), async {
        loop {
            if let Ok(Event::AlarmFired { tenant, .. }) = events.recv().await {
                if tenant == id {
                    return;
                }
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "a forgotten tenant's alarm fired");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let restored = router.restore(&id).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the restored alarm fired",
        || async { !effects(&restored, "later").await.is_empty() },
    )
    .await;
    assert_eq!(effects(&restored, "later").await.len(), 1);
    assert_eq!(view(&client, id.key()).await, None);
    router.close().await;
}

/// The sweep (trashed schemas, superseded epochs) and a new tenant migration leave a tenant's
/// alarms as they are: the alarm scheduled before both fires once after them.
#[tokio::test]
async fn sweep_and_tenant_migrations_leave_the_alarms_alone() {
    let (db, mut client) = database().await;
    // Scheduled by a replica without a handler: due at once, fired by nobody yet.
    let scheduler = scheduling_router(db.url(), "alarm-keep-a").await;
    let id = tenant("kept");
    let handle = scheduler.open_or_create(&id).await.unwrap();
    schedule(&handle, "kept", in_ms(0), serde_json::json!({})).await;
    let thrown = scheduler
        .open_or_create(&tenant("thrown-away"))
        .await
        .unwrap();
    thrown.forget(ActiveWork::Drain).await.unwrap();
    scheduler.close().await;
    let report = pgtenant::admin::sweep(
        &mut client,
        &pgtenant::admin::SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep");
    assert!(
        !report.swept.is_empty(),
        "the sweep dropped something: {report:?}"
    );
    assert_eq!(view(&client, id.key()).await, Some((1, 0)));
    // The next release adds a tenant migration; opening the tenant for its alarm migrates it.
    let router = Router::start(
        alarm_options(db.url(), "alarm-keep-b", Arc::new(AtomicUsize::new(0)))
            .tenant_migrations([EFFECTS, ("V2__more", "CREATE TABLE more (id int)")])
            .unwrap(),
    )
    .await
    .unwrap();
    eventually(
        Duration::from_secs(10),
        "the alarm fired after the sweep and the migration",
        || async {
            match router.handle_of(&id) {
                Some(opened) => !effects(&opened, "kept").await.is_empty(),
                None => false,
            }
        },
    )
    .await;
    let opened = router.handle_of(&id).expect("opened");
    assert_eq!(effects(&opened, "kept").await.len(), 1);
    assert_eq!(
        support::count_rows(&opened, "SELECT count(*) FROM more").await,
        0
    );
    assert_eq!(pending(&opened).await, 0);
    router.close().await;
}

/// G3 for firings, enforced by PostgreSQL (transaction fencing's fence; session fencing's
/// counterpart terminates the stale owner's sessions, tests/session_fencing.rs): a firing that
/// passed every local check but reaches the database after a takeover is refused there, and
/// the new owner fires the alarm, once.
#[tokio::test]
async fn a_stale_owners_firing_is_refused_by_the_database() {
    let (db, _client) = database().await;
    let old_calls = Arc::new(AtomicUsize::new(0));
    let old = Router::start(
        alarm_options(db.url(), "alarm-stale-old", old_calls.clone())
            .pool_size(1)
            .fencing(Fencing::Transaction),
    )
    .await
    .unwrap();
    let new_calls = Arc::new(AtomicUsize::new(0));
    let new = Router::start(
        alarm_options(db.url(), "alarm-stale-new", new_calls.clone()).fencing(Fencing::Transaction),
    )
    .await
    .unwrap();
    let mut old_events: broadcast::Receiver<Event> = old.subscribe();
    let id = tenant("stale-alarm");
    let handle = old.open_or_create(&id).await.unwrap();
    schedule(&handle, "s", in_ms(700), serde_json::json!({})).await;
    // Hold the old owner's only pooled connection: its firing passes the local checks and
    // waits for it.
    let parked = old.connection().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the old owner's firing is admitted",
        || async { old.summary().in_flight >= 1 },
    )
    .await;
    // Stall its heartbeats until its lease expires, and take the tenant over.
    let mut blocker = db.connect().await.unwrap();
    let stall = blocker.transaction().await.unwrap();
    stall
        .execute(
            "SELECT 1 FROM pgtenant.replicas WHERE replica_id = 'alarm-stale-old' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let taken = take_over(&new, &id, Duration::from_secs(30)).await;
    assert_eq!(taken.epoch(), handle.epoch() + 1);
    drop(parked); // the stale firing now reaches PostgreSQL
    match wait_event(&mut old_events, id.key(), "lost").await {
        Event::Lost { reason, epoch, .. } => {
            assert_eq!(reason, "fenced");
            assert_eq!(epoch, handle.epoch());
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    stall.rollback().await.unwrap();
    assert_eq!(
        old_calls.load(Ordering::SeqCst),
        0,
        "the stale handler never ran"
    );
    eventually(
        Duration::from_secs(10),
        "the new owner fired it",
        || async { !effects(&taken, "s").await.is_empty() },
    )
    .await;
    let rows = effects(&taken, "s").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].2, "alarm-stale-new");
    new.close().await;
    drop(old);
}

/// The application's role, granted by setup and nothing more (DESIGN G8), schedules, fires and
/// wakes through the control plane's functions; the operator's role reads the view; neither
/// writes the hint table.
#[tokio::test]
async fn an_operator_retries_and_clears_parked_alarms_through_their_owner() {
    use pgtenant::admin::{self, AlarmAction};
    let (_db, _admin, app, operator) = support::granted().await;
    let (router, _calls) = alarm_router(app.url(), "alarm-ops").await;
    let id = tenant("ops");
    let handle = router.open_or_create(&id).await.unwrap();
    schedule(
        &handle,
        "needy",
        in_ms(0),
        serde_json::json!({"needs_repair": true}),
    )
    .await;
    schedule(
        &handle,
        "doomed",
        in_ms(0),
        serde_json::json!({"fail": 100}),
    )
    .await;
    let ops = support::connect(operator.url()).await;
    eventually(Duration::from_secs(10), "both parked", || async {
        view(&ops, id.key()).await == Some((0, 2))
    })
    .await;
    // The operator lists them (it cannot read the tenant's schema: the function does).
    let parked = admin::parked_alarms(&ops, None).await.expect("list parked");
    let mut names: Vec<_> = parked
        .iter()
        .map(|p| (p.tenant.as_str(), p.name.as_str(), p.attempts))
        .collect();
    names.sort_unstable();
    assert_eq!(names, [("acme/ops", "doomed", 3), ("acme/ops", "needy", 3)]);
    assert!(parked.iter().all(|p| p
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("planned failure"))));
    assert_eq!(
        admin::parked_alarms(&ops, Some(&id)).await.unwrap().len(),
        2
    );
    // A name that is not parked: refused before anything is recorded.
    let refused = admin::request_alarms(&ops, &id, Some("nosuch"), AlarmAction::Retry)
        .await
        .expect_err("no such parked alarm");
    assert!(matches!(refused, Error::InvalidOption { .. }), "{refused}");
    assert!(
        refused
            .to_string()
            .contains("no parked alarm named \"nosuch\""),
        "{refused}"
    );
    let requests: i64 = ops
        .query_one("SELECT count(*) FROM pgtenant.alarm_requests", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(requests, 0);
    // The application's role does not request; the operator's does not write the alarms.
    let app_client = support::connect(app.url()).await;
    let denied = app_client
        .query(
            "SELECT pgtenant.request_alarm('acme/ops', NULL, 'clear')",
            &[],
        )
        .await
        .expect_err("requests are the operators'");
    assert_eq!(support::sqlstate(&denied), Some("42501"));

    // Repaired, then retried: it fires at its first attempt again, under the lease.
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO effects (name, alarm_id, attempt, replica, payload)
                     VALUES ('repair', 0, 0, 'operator', '{}')",
                    &[],
                )
                .await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .unwrap();
    let retry = admin::request_alarms(&ops, &id, Some("needy"), AlarmAction::Retry)
        .await
        .expect("request a retry");
    assert_eq!(retry.alarms, ["needy"]);
    eventually(Duration::from_secs(10), "the retry was applied", || async {
        !admin::alarm_request_pending(&ops, retry.id).await.unwrap()
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "the retried alarm fired",
        || async { !effects(&handle, "needy").await.is_empty() },
    )
    .await;
    let fired = effects(&handle, "needy").await;
    assert_eq!(
        (fired.len(), fired[0].1, fired[0].2.as_str()),
        (1, 1, "alarm-ops")
    );
    assert_eq!(view(&ops, id.key()).await, Some((0, 1)));

    // Cleared while nobody holds the tenant: the replica that wakes it applies the request.
    handle.handoff().await.unwrap();
    let clear = admin::request_alarms(&ops, &id, None, AlarmAction::Clear)
        .await
        .expect("request a clear");
    assert_eq!(clear.alarms, ["doomed"]);
    eventually(Duration::from_secs(10), "the clear was applied", || async {
        !admin::alarm_request_pending(&ops, clear.id).await.unwrap()
    })
    .await;
    assert_eq!(view(&ops, id.key()).await, None);
    let reopened = router.handle_of(&id).expect("woken by the request");
    assert_eq!(pending(&reopened).await, 0);
    assert!(
        effects(&reopened, "doomed").await.is_empty(),
        "cleared, never fired"
    );
    router.close().await;
}

#[tokio::test]
async fn the_app_role_schedules_and_fires_and_the_operator_reads_the_view() {
    let (_db, _admin, app, operator) = support::granted().await;
    let scheduler = Router::start(
        options(app.url(), "alarm-app-a")
            .tenant_migrations([EFFECTS])
            .unwrap(),
    )
    .await
    .unwrap();
    let id = tenant("granted");
    let handle = scheduler.open_or_create(&id).await.unwrap();
    schedule(&handle, "g", in_ms(200), serde_json::json!({})).await;
    let operator_client = support::connect(operator.url()).await;
    assert_eq!(view(&operator_client, id.key()).await, Some((1, 0)));
    handle.handoff().await.unwrap();
    let (waker, _calls) = alarm_router(app.url(), "alarm-app-b").await;
    eventually(
        Duration::from_secs(10),
        "the app role's replica fired it",
        || async {
            match waker.handle_of(&id) {
                Some(opened) => !effects(&opened, "g").await.is_empty(),
                None => false,
            }
        },
    )
    .await;
    assert_eq!(view(&operator_client, id.key()).await, None);
    let app_client = support::connect(app.url()).await;
    let refused = app_client
        .execute("DELETE FROM pgtenant.alarm_due", &[])
        .await
        .expect_err("the hint table is not the app role's to write");
    assert_eq!(support::sqlstate(&refused), Some("42501"));
    waker.close().await;
    scheduler.close().await;
}

#[tokio::test]
async fn a_handler_that_schedules_its_alarm_again_makes_it_recur() {
    let (db, client) = database().await;
    let (router, _calls) = alarm_router(db.url(), "alarm-recur").await;
    let id = tenant("recur");
    let handle = router.open_or_create(&id).await.unwrap();
    schedule(&handle, "tick", in_ms(0), serde_json::json!({"recur": 3})).await;
    eventually(Duration::from_secs(10), "four ticks", || async {
        effects(&handle, "tick").await.len() == 4
    })
    .await;
    let ticks = effects(&handle, "tick").await;
    // Each firing deleted only the version it fired: the one its handler scheduled stayed.
    let lefts: Vec<_> = ticks.iter().map(|t| t.3["recur"].as_u64()).collect();
    assert_eq!(lefts, [Some(3), Some(2), Some(1), Some(0)]);
    let ids: std::collections::BTreeSet<i64> = ticks.iter().map(|t| t.0).collect();
    assert_eq!(ids.len(), 4, "a new id per scheduling: {ticks:?}");
    eventually(Duration::from_secs(5), "nothing left", || async {
        view(&client, id.key()).await.is_none()
    })
    .await;
    assert_eq!(pending(&handle).await, 0);
    router.close().await;
}

/// Alarms move with the tenant: handed to another replica, they fire there (woken by its read
/// of the due tenants: the tenant is reserved for it), once, and never at the old owner.
#[tokio::test]
async fn alarms_move_with_a_handoff() {
    let (db, _client) = database().await;
    let (from, from_calls) = alarm_router(db.url(), "alarm-from").await;
    let (to, _to_calls) = alarm_router(db.url(), "alarm-to").await;
    let id = tenant("moved");
    let handle = from.open_or_create(&id).await.unwrap();
    schedule(&handle, "m", in_ms(800), serde_json::json!({})).await;
    handle
        .handoff_to(&support::replica("alarm-to"))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the new owner fired it",
        || async {
            match to.handle_of(&id) {
                Some(opened) => !effects(&opened, "m").await.is_empty(),
                None => false,
            }
        },
    )
    .await;
    let opened = to.handle_of(&id).unwrap();
    let rows = effects(&opened, "m").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].2, "alarm-to");
    assert_eq!(from_calls.load(Ordering::SeqCst), 0);
    to.close().await;
    from.close().await;
}

// ---------------------------------------------------------------------------------------------
// Alarms in the history driver (issue #31, "Tests"): real replica processes fire alarms while
// they are killed (some 0–12 ms after a scheduling was sent), paused past the ttl, their sessions
// terminated, the server crash-restarted or failed over (`support::Faults::alarms`,
// tests/support/alarm_workload.rs). Each run then waits for the alarms to drain and checks: every
// acknowledged alarm's effect row committed exactly once, an unknown scheduling's at most once,
// none before it was due by the database's clock, none left in `pgtenant_alarms`; besides the
// history's own liveness and ledger verdicts. The faults and fixtures are tests/takeover.rs's
// and tests/failover.rs's history tests', with the alarm workload on.
// ---------------------------------------------------------------------------------------------

const CHILD: &str = "replica_child";

/// Entry point of the replica child processes (does nothing when run as a plain test).
#[test]
#[ignore = "entry point of the replica child processes"]
fn replica_child() {
    support::child_main();
}

/// Asserts that a history run with alarms exercised them: acknowledged schedulings, and alarms
/// fired by another replica than the one that scheduled them (after a takeover or a wake).
fn assert_alarms_exercised(history: &support::History) {
    let verdict = history.alarm_verdict.as_ref().expect("the alarm verdict");
    assert!(
        verdict.acked >= 5 && verdict.elsewhere >= 1,
        "the run acknowledged {} alarm schedulings of {}, {} fired by another replica",
        verdict.acked,
        verdict.scheduled,
        verdict.elsewhere
    );
}

/// The alarm workload under the faults of tests/takeover.rs's
/// `history_checker_under_random_kills_pauses_and_terminations`: kills that respawn the same
/// replica ids (half of them right after an alarm scheduling was sent), pauses past the ttl,
/// terminated lease sessions and data connections.
#[tokio::test]
async fn alarms_fire_exactly_once_under_kills_pauses_and_terminations() {
    let (db, _client) = database().await;
    let ledgers = ["alarm-hist-a", "alarm-hist-b"];
    let names = ["alarm-hist-0", "alarm-hist-1", "alarm-hist-2"];
    let faults = support::Faults {
        terminate: true,
        alarms: true,
        ..support::Faults::default()
    };
    let seed = 0x9e37_79b9_7f4a_7c15;
    let (history, total) = support::history_test(
        CHILD,
        db.url(),
        &names,
        &ledgers,
        seed,
        &faults,
        "alarm-hist-checker",
    )
    .await;
    assert!(
        total > 0 && history.kills > 0 && history.pauses > 0 && history.terminations > 0,
        "the run exercised writes and faults"
    );
    assert_alarms_exercised(&history);
}

/// The same under two crash restarts of the server (`-m immediate`), as
/// tests/takeover.rs's `history_checker_across_crash_restarts`.
#[tokio::test]
async fn alarms_fire_exactly_once_across_crash_restarts() {
    if std::env::var("PGTENANT_TESTKIT").as_deref() == Ok("citus") {
        println!("skipped on Citus: the crash restarts need a server of the test's own");
        return;
    }
    let (cluster, db) = support::own_server().await;
    let ledgers = ["alarm-crash-a", "alarm-crash-b"];
    let names = ["alarm-crash-0", "alarm-crash-1", "alarm-crash-2"];
    let faults = support::Faults {
        terminate: true,
        restarts: Some(&cluster),
        alarms: true,
        ..support::Faults::default()
    };
    let seed = 0x2545_f491_4f6c_dd1d;
    let (history, total) = support::history_test(
        CHILD,
        db.url(),
        &names,
        &ledgers,
        seed,
        &faults,
        "alarm-crash-checker",
    )
    .await;
    assert!(
        total > 0 && history.restarts == 2,
        "the run exercised writes and restarts"
    );
    assert_alarms_exercised(&history);
}

/// The same across a synchronous failover halfway through the fault phase, as
/// tests/failover.rs's `the_fleet_serves_again_after_a_synchronous_failover_under_faults`:
/// nothing acknowledged is lost with synchronous replication, so neither is an alarm.
#[tokio::test]
async fn alarms_fire_exactly_once_across_a_synchronous_failover() {
    let (pair, db) =
        support::pair_with_control_plane(pgtenant_testkit::Replication::Synchronous).await;
    let url = pair.url(&db);
    let names = ["alarm-fo-0", "alarm-fo-1", "alarm-fo-2"];
    let ledgers = ["alarm-fo-a", "alarm-fo-b"];
    let faults = support::Faults {
        terminate: true,
        failover: Some(&pair),
        alarms: true,
        ..support::Faults::default()
    };
    let seed = 0x9e37_79b9_7f4a_7c15;
    let (history, total) = support::history_test(
        CHILD,
        &url,
        &names,
        &ledgers,
        seed,
        &faults,
        "alarm-fo-checker",
    )
    .await;
    assert!(
        total > 0 && history.failovers == 1,
        "the run exercised writes and the failover"
    );
    assert_alarms_exercised(&history);
}
