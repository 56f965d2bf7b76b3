//! Placement (#30), second part: rebalancing. With `RouterOptions::placement` on, each replica
//! hands the tenants it holds whose home is another stable replica straight to that home, the
//! home picks them up at once, `close()` hands each tenant to its next home, and a tenant nobody
//! serves is routed to its home. Real routers (and a real process, killed) against a real
//! PostgreSQL; homes are computed by the database (`pgtenant.home_among`) for the expectations.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use pgtenant::{Event, Route, Router, TenantId};
use support::{database, options, placed, tenant, ReplicaProcess};

/// Entry point of the replica child processes (does nothing when run as a plain test).
#[test]
#[ignore = "entry point of the replica child processes"]
fn replica_child() {
    support::child_main();
}

const STABLE: Duration = Duration::from_millis(300);

async fn start(url: &str, name: &str, stable_for: Duration) -> Router {
    Router::start(placed(options(url, name), name, stable_for))
        .await
        .expect("router starts")
}

/// Each key's home among `replicas` (weight 1 each), as the database computes it.
async fn homes(
    client: &tokio_postgres::Client,
    keys: &[String],
    replicas: &[&str],
) -> HashMap<String, String> {
    let weights = vec![1.0_f64; replicas.len()];
    client
        .query(
            "SELECT k, pgtenant.home_among(k, $2, $3) FROM unnest($1::text[]) k",
            &[&keys, &replicas, &weights],
        )
        .await
        .expect("homes")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Each live tenant's owner (None when free).
async fn owners(client: &tokio_postgres::Client) -> BTreeMap<String, Option<String>> {
    client
        .query(
            "SELECT key, owner FROM pgtenant.tenants WHERE schema_name IS NOT NULL",
            &[],
        )
        .await
        .expect("owners")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Waits (up to `limit`) until every live tenant is held by its home per `pgtenant.placement`.
async fn all_at_home(client: &tokio_postgres::Client, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let away: i64 = client
            .query_one(
                "SELECT count(*) FROM pgtenant.placement WHERE owner IS NULL OR NOT at_home",
                &[],
            )
            .await
            .expect("placement")
            .get(0);
        if away == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{away} tenants still away from home after {limit:?}: {:?}",
            owners(client).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `HandedOff` events received so far: (tenant key, target).
fn handed_off(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
) -> Vec<(String, Option<String>)> {
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let Event::HandedOff { tenant, to, .. } = event {
            seen.push((tenant.key().to_owned(), to.map(|to| to.as_str().to_owned())));
        }
    }
    seen
}

async fn create_at(router: &Router, ids: &[TenantId]) {
    for id in ids {
        router.open_or_create(id).await.expect("create");
    }
}

#[tokio::test]
async fn a_joiner_receives_exactly_the_tenants_whose_home_it_became_and_nothing_moves_between_the_others(
) {
    let (db, client) = database().await;
    let a = start(db.url(), "rb-a", STABLE).await;
    let b = start(db.url(), "rb-b", STABLE).await;
    let c = start(db.url(), "rb-c", STABLE).await;
    let ids: Vec<TenantId> = (0..80).map(|i| tenant(&format!("join-{i}"))).collect();
    let keys: Vec<String> = ids.iter().map(|id| id.key().to_owned()).collect();
    // All opened at one replica: rebalancing hands two thirds of them to b and c.
    create_at(&a, &ids).await;
    all_at_home(&client, Duration::from_secs(20)).await;

    let mut events: Vec<_> = [&a, &b, &c].iter().map(|r| r.subscribe()).collect();
    let before = homes(&client, &keys, &["rb-a", "rb-b", "rb-c"]).await;
    let after = homes(&client, &keys, &["rb-a", "rb-b", "rb-c", "rb-d"]).await;
    let share: Vec<&String> = keys.iter().filter(|k| before[*k] != after[*k]).collect();
    assert!(
        share.iter().all(|k| after[*k] == "rb-d"),
        "a joiner only takes homes"
    );
    let d = start(db.url(), "rb-d", STABLE).await;
    all_at_home(&client, Duration::from_secs(20)).await;

    let moves: Vec<(String, Option<String>)> = events.iter_mut().flat_map(handed_off).collect();
    assert!(
        moves.iter().all(|(_, to)| to.as_deref() == Some("rb-d")),
        "every move went to the joiner, none between the others: {moves:?}"
    );
    let mut moved: Vec<&String> = moves.iter().map(|(k, _)| k).collect();
    moved.sort();
    let mut expected = share.clone();
    expected.sort();
    assert_eq!(
        moved, expected,
        "exactly the joiner's share moved, each once"
    );
    let held = owners(&client).await;
    assert!(share.iter().all(|k| held[*k].as_deref() == Some("rb-d")));
    for router in [a, b, c, d] {
        router.close().await;
    }
}

#[tokio::test]
async fn a_member_that_flaps_within_the_stability_window_receives_nothing() {
    let (db, client) = database().await;
    let window = Duration::from_secs(3);
    let a = start(db.url(), "flap-a", window).await;
    let ids: Vec<TenantId> = (0..30).map(|i| tenant(&format!("flap-{i}"))).collect();
    create_at(&a, &ids).await;
    let mut events = a.subscribe();

    // A member that comes and goes three times, each life shorter than the window.
    for _ in 0..3 {
        let flapping = start(db.url(), "flap-b", window).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        flapping.close().await;
    }
    assert_eq!(
        handed_off(&mut events),
        vec![],
        "nothing moves to a member alive for less than the window"
    );

    // Once it stays, its share moves to it, and not before it was alive for the window (by
    // the database's clock: its registration against the first handoff to it).
    let b = start(db.url(), "flap-b", window).await;
    all_at_home(&client, Duration::from_secs(20)).await;
    let waited: f64 = client
        .query_one(
            "SELECT extract(epoch FROM
                    (SELECT min(at) FROM pgtenant.history
                      WHERE replica_id = 'flap-a' AND event = 'handed_off'
                        AND detail = 'reserved for flap-b')
                  - (SELECT max(at) FROM pgtenant.history
                      WHERE replica_id = 'flap-b' AND event = 'registered'))::float8",
            &[],
        )
        .await
        .expect("history")
        .get(0);
    assert!(
        waited >= window.as_secs_f64(),
        "the first move came {waited} s after the member registered, within the {window:?} window"
    );
    assert!(!handed_off(&mut events).is_empty(), "its share moved to it");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn close_hands_each_tenant_to_its_next_home_which_serves_it_at_once() {
    let (db, client) = database().await;
    let a = start(db.url(), "next-a", STABLE).await;
    let b = start(db.url(), "next-b", STABLE).await;
    let c = start(db.url(), "next-c", STABLE).await;
    let ids: Vec<TenantId> = (0..60).map(|i| tenant(&format!("next-{i}"))).collect();
    create_at(&b, &ids).await;
    all_at_home(&client, Duration::from_secs(20)).await;
    let held = owners(&client).await;
    let at_a: Vec<String> = held
        .iter()
        .filter(|(_, owner)| owner.as_deref() == Some("next-a"))
        .map(|(key, _)| key.clone())
        .collect();
    assert!(!at_a.is_empty());
    let next = homes(&client, &at_a, &["next-b", "next-c"]).await;

    let mut events = a.subscribe();
    let report = a.close().await;
    assert_eq!(report.handed_off.len(), at_a.len(), "{report:?}");
    // It stopped being a home before handing off (control plane V17), so nothing was moved
    // back to it meanwhile.
    let weight: f64 = client
        .query_one(
            "SELECT weight FROM pgtenant.replicas WHERE replica_id = 'next-a'",
            &[],
        )
        .await
        .expect("weight")
        .get(0);
    assert_eq!(weight, 0.0, "close left the placement first");
    let moves: HashMap<String, Option<String>> = handed_off(&mut events).into_iter().collect();
    for key in &at_a {
        assert_eq!(
            moves.get(key).cloned().flatten().as_ref(),
            Some(&next[key]),
            "{key} was handed to its next home"
        );
    }
    // Picked up by the next homes without any request for them.
    all_at_home(&client, Duration::from_secs(10)).await;
    let held = owners(&client).await;
    assert!(at_a
        .iter()
        .all(|key| held[key].as_deref() == Some(next[key].as_str())));
    b.close().await;
    c.close().await;
}

/// Waits (up to 20 s) until every tenant whose home is `replica` was handed to it and is free,
/// reserved for it: a replica registered by hand, which opens nothing.
async fn handed_its_share(client: &tokio_postgres::Client, replica: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (reserved, homed) = reserved_and_homed(client, replica).await;
        if reserved > 0 && reserved == homed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{reserved} of {homed} tenants whose home is {replica} were handed to it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The number of live tenants reserved for `replica` and free, and of those whose home it is.
async fn reserved_and_homed(client: &tokio_postgres::Client, replica: &str) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pgtenant.tenants
                      WHERE owner IS NULL AND reserved_for = $1 AND schema_name IS NOT NULL),
                    (SELECT count(*) FROM pgtenant.placement WHERE home = $1)",
            &[&replica],
        )
        .await
        .expect("reserved and homed");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn tenants_handed_to_a_replica_that_leaves_without_picking_them_up_are_taken_by_their_homes()
{
    let (db, client) = database().await;
    let a = start(db.url(), "gone-a", STABLE).await;
    let b = start(db.url(), "gone-b", STABLE).await;
    let ids: Vec<TenantId> = (0..30).map(|i| tenant(&format!("gone-{i}"))).collect();
    create_at(&a, &ids).await;
    all_at_home(&client, Duration::from_secs(20)).await;

    // A third replica registered by hand, alive (its liveness lock held) but opening nothing:
    // once stable it is the home of about a third, which A and B hand to it, and which stay
    // free, reserved for it.
    let c = support::by_hand::connect(db.url()).await;
    let (incarnation, secret) = support::by_hand::register_by_hand(&c, "gone-c").await;
    handed_its_share(&client, "gone-c").await;

    // It leaves, as a closing replica does first, and never picks them up: their homes among
    // A and B take them, without a request (before control plane V17 they stayed free).
    let left: bool = c
        .query_one(
            "SELECT pgtenant.leave($1, $2, $3)",
            &[&"gone-c", &incarnation, &secret],
        )
        .await
        .expect("leave")
        .get(0);
    assert!(left);
    assert_eq!(
        reserved_and_homed(&client, "gone-c").await.1,
        0,
        "no longer a home"
    );
    all_at_home(&client, Duration::from_secs(20)).await;
    let held = owners(&client).await;
    assert!(
        held.values()
            .all(|owner| matches!(owner.as_deref(), Some("gone-a" | "gone-b"))),
        "{held:?}"
    );
    // A leave without the incarnation's secret is refused, and changes nothing.
    let forged = c
        .query_one(
            "SELECT pgtenant.leave($1, $2, $3)",
            &[&"gone-a", &1_i64, &"not the secret"],
        )
        .await
        .expect_err("a forged leave is refused");
    assert_eq!(support::by_hand::sqlstate(&forged), Some("PTA01"));
    assert!(
        reserved_and_homed(&client, "gone-a").await.1 > 0,
        "gone-a is a home still"
    );
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn tenants_handed_to_a_replica_that_dies_are_taken_by_their_homes_before_the_reservation_runs_out(
) {
    let (db, client) = database().await;
    // Reservations of a minute: without control plane V21, `acquire` refused the homes for
    // as long, so the test below would wait it out.
    let window = Duration::from_secs(60);
    let start_reserving = |name: &'static str| {
        let options = placed(options(db.url(), name), name, STABLE).reservation(window);
        async move { Router::start(options).await.expect("router starts") }
    };
    let a = start_reserving("dies-a").await;
    let b = start_reserving("dies-b").await;
    let ids: Vec<TenantId> = (0..30).map(|i| tenant(&format!("dies-{i}"))).collect();
    create_at(&a, &ids).await;
    all_at_home(&client, Duration::from_secs(20)).await;

    // A third replica registered by hand, alive while its session holds the liveness lock,
    // opening nothing: once stable, A and B hand it its share, which stays free, reserved for
    // it.
    let c = support::by_hand::connect(db.url()).await;
    let _ = support::by_hand::register_by_hand(&c, "dies-c").await;
    handed_its_share(&client, "dies-c").await;

    // It dies (its connection closes, and with it the liveness lock) without leaving: the
    // tenants' homes among A and B take them while the reservations still run.
    drop(c);
    let reserved_until: f64 = client
        .query_one(
            "SELECT extract(epoch FROM min(reserved_until))::float8 FROM pgtenant.tenants
              WHERE owner IS NULL AND reserved_for = 'dies-c'",
            &[],
        )
        .await
        .expect("reservations")
        .get(0);
    loop {
        let (free, now): (i64, f64) = client
            .query_one(
                "SELECT count(*) FILTER (WHERE owner IS NULL),
                        extract(epoch FROM clock_timestamp())::float8
                   FROM pgtenant.tenants WHERE schema_name IS NOT NULL",
                &[],
            )
            .await
            .map(|row| (row.get(0), row.get(1)))
            .expect("free tenants");
        if free == 0 {
            break;
        }
        assert!(
            now < reserved_until,
            "{free} tenants handed to dies-c are still free when their reservation runs out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = owners(&client).await;
    assert!(
        held.values()
            .all(|owner| matches!(owner.as_deref(), Some("dies-a" | "dies-b"))),
        "{held:?}"
    );
    // Each by its home among the two: no herd.
    let keys: Vec<String> = held.keys().cloned().collect();
    let expected = homes(&client, &keys, &["dies-a", "dies-b"]).await;
    for (key, owner) in &held {
        assert_eq!(owner.as_ref(), expected.get(key), "{key} taken by its home");
    }
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn a_tenant_whose_handoff_target_dies_during_the_drain_comes_back_to_its_sender() {
    let (db, client) = database().await;
    let a = start(db.url(), "back-a", STABLE).await;
    let id = tenant("back-0");
    let handle = a.open_or_create(&id).await.expect("create");
    // The target: registered by hand, alive while its session holds the liveness lock.
    let c = support::by_hand::connect(db.url()).await;
    let (incarnation, secret) = support::by_hand::register_by_hand(&c, "back-c").await;

    // Work in flight keeps the handoff draining while the target goes away.
    let mut connection = handle.connect().await.expect("a connection");
    let busy = connection
        .begin()
        .await
        .expect("a transaction counts as work");
    let mut events = a.subscribe();
    let to = pgtenant::ReplicaId::new("back-c").expect("replica id");
    let handoff = tokio::spawn({
        let handle = handle.clone();
        async move { handle.handoff_to(&to).await }
    });
    loop {
        match events.recv().await.expect("events") {
            Event::Draining { tenant, .. } if tenant == id => break,
            _ => {}
        }
    }
    c.execute(
        "SELECT pgtenant.deregister($1, $2, $3)",
        &[&"back-c", &incarnation, &secret],
    )
    .await
    .expect("the target deregisters");
    drop(busy);
    drop(connection);
    handoff.await.expect("task").expect("the handoff ends");

    // Reserved for its sender (placement on), which picks it up unasked; before, it was
    // released for anyone and stayed free until a request came.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let owner: Option<String> = client
            .query_one(
                "SELECT owner FROM pgtenant.tenants WHERE key = $1",
                &[&id.key()],
            )
            .await
            .expect("owner")
            .get(0);
        if owner.as_deref() == Some("back-a") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tenant did not come back: owner {owner:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.close().await;
}

#[tokio::test]
async fn a_replica_of_weight_zero_hands_everything_to_the_others() {
    let (db, client) = database().await;
    let a = Router::start(placed(options(db.url(), "w0-a"), "w0-a", STABLE).placement_weight(0.0))
        .await
        .expect("a starts");
    let b = start(db.url(), "w0-b", STABLE).await;
    let ids: Vec<TenantId> = (0..20).map(|i| tenant(&format!("w0-{i}"))).collect();
    create_at(&a, &ids).await;
    all_at_home(&client, Duration::from_secs(20)).await;
    let held = owners(&client).await;
    assert!(
        held.values().all(|owner| owner.as_deref() == Some("w0-b")),
        "{held:?}"
    );
    assert_eq!(a.open_count(), 0);
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn a_crashed_replicas_tenants_are_taken_by_their_next_homes_one_each_with_no_herd() {
    let (db, client) = database().await;
    // The child never moves anything (its window outlasts the test): it holds every tenant
    // when it is killed.
    let mut child = ReplicaProcess::spawn_with(
        "replica_child",
        db.url(),
        "herd-dead",
        &[("PGTENANT_TEST_PLACEMENT", "3600000")],
    );
    child.ready().await;
    let ledgers: Vec<String> = (0..24).map(|i| format!("herd-{i}")).collect();
    for ledger in &ledgers {
        let reply = child.request(&format!("open {ledger}")).await;
        assert!(
            reply.as_deref().is_some_and(|r| r.starts_with("opened")),
            "{reply:?}"
        );
    }
    let b = start(db.url(), "herd-b", STABLE).await;
    let c = start(db.url(), "herd-c", STABLE).await;
    let keys: Vec<String> = ledgers.iter().map(|l| tenant(l).key().to_owned()).collect();
    let expected = homes(&client, &keys, &["herd-b", "herd-c"]).await;
    let mut events: Vec<_> = [&b, &c].iter().map(|r| r.subscribe()).collect();
    child.kill();

    // Every tenant is asked for at both survivors at once, as a load balancer spreads a
    // client's retries: each request goes where route says, at most one hop.
    let fleet = [("herd-b", &b), ("herd-c", &c)];
    let requests = ledgers.iter().flat_map(|ledger| {
        let fleet = &fleet;
        (0..2).map(move |from| serve(fleet, from, tenant(ledger)))
    });
    let served: Vec<(String, &str)> = support::join_all(requests.collect()).await;
    for (key, by) in &served {
        assert_eq!(
            by,
            &expected[key].as_str(),
            "{key} was served by its next home"
        );
    }
    // One acquisition per tenant, by its home: nobody raced for it.
    let mut acquired: HashMap<String, Vec<&str>> = HashMap::new();
    for (events, (name, _)) in events.iter_mut().zip(&fleet) {
        while let Ok(event) = events.try_recv() {
            if let Event::Acquired { tenant, .. } = event {
                acquired
                    .entry(tenant.key().to_owned())
                    .or_default()
                    .push(name);
            }
        }
    }
    for key in &keys {
        assert_eq!(
            acquired.get(key).map(Vec::as_slice),
            Some(&[expected[key].as_str()][..]),
            "{key} acquired once, by its home"
        );
    }
    b.close().await;
    c.close().await;
}

/// A client's request for `id` sent to `fleet[from]`: where it was served, after at most one
/// forward (retrying while the dead owner's lease runs out, as a client would).
async fn serve<'a>(fleet: &[(&'a str, &Router)], from: usize, id: TenantId) -> (String, &'a str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "{id} not served within 20 s");
        match fleet[from].1.route(&id, false).await {
            Ok(Route::Here(_)) => return (id.key().to_owned(), fleet[from].0),
            Ok(Route::There { owner, .. }) => {
                let Some((name, router)) = fleet.iter().find(|(name, _)| *name == owner.as_str())
                else {
                    // The dead owner, whose lease has not run out yet: the client retries.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                match router.route_forwarded(&id, false).await {
                    Ok(Route::Here(_)) => return (id.key().to_owned(), name),
                    other => panic!("{id}: the forwarded request was not served: {other:?}"),
                }
            }
            Err(error) if error.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{id}: {error}"),
        }
    }
}

#[tokio::test]
async fn with_placement_a_free_tenant_is_routed_to_its_home_and_without_it_nothing_moves() {
    let (db, client) = database().await;
    // Placement off at a: it opens what it is asked for and never hands anything on.
    let a = Router::start(options(db.url(), "off-a").address("test://off-a"))
        .await
        .expect("a starts");
    let b = start(db.url(), "off-b", Duration::ZERO).await;
    let ids: Vec<TenantId> = (0..20).map(|i| tenant(&format!("off-{i}"))).collect();
    let keys: Vec<String> = ids.iter().map(|id| id.key().to_owned()).collect();
    let expected = homes(&client, &keys, &["off-a", "off-b"]).await;
    let mut events = a.subscribe();
    for id in &ids {
        assert!(matches!(a.route(id, true).await, Ok(Route::Here(_))));
    }
    // b's rebalancer would have moved them within a few of its 250 ms periods; a has none.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(handed_off(&mut events), vec![]);
    assert_eq!(a.open_count(), ids.len());
    a.close().await;

    // Placement on at c: a free tenant whose home is b is routed there; one whose home is c
    // opens at c.
    let c = start(db.url(), "off-c", Duration::ZERO).await;
    let expected_now = homes(&client, &keys, &["off-b", "off-c"]).await;
    for id in &ids {
        let key = id.key().to_owned();
        match c.route(id, false).await.expect("route") {
            Route::Here(_) => assert_eq!(expected_now[&key], "off-c", "{key}"),
            Route::There { owner, address, .. } => {
                assert_eq!(owner.as_str(), expected_now[&key], "{key}");
                assert_eq!(address, format!("test://{owner}"));
            }
        }
    }
    let _ = expected;
    b.close().await;
    c.close().await;
}

#[tokio::test]
async fn a_crashed_replicas_tenants_are_served_again_by_their_homes_without_a_request() {
    let (db, client) = database().await;
    let mut child = ReplicaProcess::spawn_with(
        "replica_child",
        db.url(),
        "orphan-dead",
        &[("PGTENANT_TEST_PLACEMENT", "3600000")],
    );
    child.ready().await;
    for i in 0..16 {
        let reply = child.request(&format!("open orphan-{i}")).await;
        assert!(
            reply.as_deref().is_some_and(|r| r.starts_with("opened")),
            "{reply:?}"
        );
    }
    let b = start(db.url(), "orphan-b", STABLE).await;
    let c = start(db.url(), "orphan-c", STABLE).await;
    let mut events: Vec<_> = [&b, &c].iter().map(|r| r.subscribe()).collect();
    child.kill();
    // Nobody asks for them: their homes take them over once the dead lease runs out.
    all_at_home(&client, Duration::from_secs(20)).await;
    let mut acquisitions = 0;
    for events in &mut events {
        while let Ok(event) = events.try_recv() {
            if let Event::Acquired { took_over_from, .. } = event {
                assert_eq!(
                    took_over_from.as_ref().map(|r| r.as_str()),
                    Some("orphan-dead")
                );
                acquisitions += 1;
            }
        }
    }
    assert_eq!(acquisitions, 16, "one takeover per tenant, by its home");
    b.close().await;
    c.close().await;
}

#[tokio::test]
async fn placement_works_under_the_application_role_alone() {
    let (_db, admin, app, _operator) = support::granted().await;
    let a = start(app.url(), "role-a", STABLE).await;
    let ids: Vec<TenantId> = (0..16).map(|i| tenant(&format!("role-{i}"))).collect();
    create_at(&a, &ids).await;
    let b = start(app.url(), "role-b", STABLE).await;
    all_at_home(&admin, Duration::from_secs(20)).await;
    assert!(b.open_count() > 0, "b received its share");
    a.close().await;
    all_at_home(&admin, Duration::from_secs(10)).await;
    assert_eq!(b.open_count(), ids.len(), "a's tenants went to b on close");
    b.close().await;
}

/// The history driver (tests/support/history.rs) with placement on in every replica: tenants
/// move to their homes, a killed replica's tenants are taken over by their next homes and moved
/// back once it is stable again, under kills, pauses past the ttl, terminated sessions and
/// dropped futures. Both halves: nothing stale or lost, and every replica serving again.
#[tokio::test]
async fn a_history_with_rebalancing_under_kills_pauses_terminations_and_cancellation() {
    let (db, _client) = database().await;
    let ledgers = ["placed-a", "placed-b"];
    let names = ["placed-0", "placed-1", "placed-2"];
    let faults = support::Faults {
        terminate: true,
        cancel: true,
        placement: true,
        ..support::Faults::default()
    };
    let (history, total) = support::history_test(
        "replica_child",
        db.url(),
        &names,
        &ledgers,
        0x2545_f491_4f6c_dd1d,
        &faults,
        "placed-checker",
    )
    .await;
    assert!(
        total > 0 && history.kills + history.pauses + history.terminations > 0,
        "the run exercised writes and faults"
    );
}

/// A SIGKILLed replica's tenants are taken over by their next homes as soon as its lease session
/// is gone, not when its heartbeat row expires (control plane V20): with a 60 s ttl the
/// survivors hold them within seconds, each by its home among them, unasked.
#[tokio::test]
async fn a_killed_replicas_tenants_are_taken_over_before_its_heartbeat_expires() {
    let (db, client) = database().await;
    let mut child = ReplicaProcess::spawn_with(
        "replica_child",
        db.url(),
        "early-dead",
        &[
            ("PGTENANT_TEST_PLACEMENT", "3600000"),
            ("PGTENANT_TEST_TTL", "60000"),
        ],
    );
    child.ready().await;
    let ledgers: Vec<String> = (0..12).map(|i| format!("early-{i}")).collect();
    for ledger in &ledgers {
        let reply = child.request(&format!("open {ledger}")).await;
        assert!(
            reply.as_deref().is_some_and(|r| r.starts_with("opened")),
            "{reply:?}"
        );
    }
    let b = start(db.url(), "early-b", STABLE).await;
    let c = start(db.url(), "early-c", STABLE).await;
    let keys: Vec<String> = ledgers.iter().map(|l| tenant(l).key().to_owned()).collect();
    let expected = homes(&client, &keys, &["early-b", "early-c"]).await;
    child.kill();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(15);
    loop {
        let held = owners(&client).await;
        if keys
            .iter()
            .all(|k| held[k].as_deref() == Some(expected[k].as_str()))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all taken over by their homes {:?} after the kill (ttl 60 s): {held:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // polling a condition
    }
    let expires_in: f64 = client
        .query_one(
            "SELECT extract(epoch FROM expires_at - now())::float8 FROM pgtenant.replicas
              WHERE replica_id = 'early-dead'",
            &[],
        )
        .await
        .expect("replica row")
        .get(0);
    assert!(
        expires_in > 30.0,
        "taken over long before the heartbeat row expires ({expires_in:.1} s left)"
    );
    b.close().await;
    c.close().await;
}

/// A pickup's batch (`pgtenant.acquire_many`, control plane V20): each tenant is answered on
/// its own (acquired, held by another, gone), the acquired ones in one transaction, and a
/// caller that is not the incarnation is refused as a whole before anything changes.
#[tokio::test]
async fn a_batched_acquisition_answers_each_tenant_on_its_own_and_refuses_a_forged_caller() {
    use support::by_hand::{connect, register_by_hand, sqlstate};
    let (db, client) = database().await;
    let free: Vec<TenantId> = (0..3).map(|i| tenant(&format!("batch-free-{i}"))).collect();
    let held = tenant("batch-held");
    let creator = Router::start(options(db.url(), "rb-creator"))
        .await
        .expect("router");
    create_at(&creator, &free).await;
    creator.close().await;
    let holder = Router::start(options(db.url(), "rb-holder"))
        .await
        .expect("router");
    holder.open_or_create(&held).await.expect("held");

    let session = connect(db.url()).await;
    let (incarnation, secret) = register_by_hand(&session, "rb-hand").await;
    let mut keys: Vec<String> = free.iter().map(|id| id.key().to_owned()).collect();
    keys.push(held.key().to_owned());
    keys.push(tenant("batch-missing").key().to_owned());
    let batch = "SELECT key, epoch, error_code FROM pgtenant.acquire_many($1, 'rb-hand', $2, $3, 2000, 100, 1000)";

    let forged = session
        .query(batch, &[&keys, &incarnation, &"not the secret"])
        .await
        .expect_err("a forged secret is refused");
    assert_eq!(sqlstate(&forged), Some("PTA01"), "{forged:?}");
    assert!(
        owners(&client).await[free[0].key()].is_none(),
        "nothing was acquired by the forged call"
    );

    let answers: HashMap<String, (Option<i64>, Option<String>)> = session
        .query(batch, &[&keys, &incarnation, &secret])
        .await
        .expect("acquire_many")
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect();
    assert_eq!(answers.len(), keys.len(), "one answer per key: {answers:?}");
    for id in &free {
        assert!(
            matches!(answers[id.key()], (Some(_), None)),
            "{id} acquired: {answers:?}"
        );
    }
    assert_eq!(answers[held.key()], (None, Some("PTL01".to_owned())));
    assert_eq!(
        answers[tenant("batch-missing").key()],
        (None, Some("PTN01".to_owned()))
    );
    let held_now = owners(&client).await;
    assert!(free
        .iter()
        .all(|id| held_now[id.key()].as_deref() == Some("rb-hand")));
    assert_eq!(held_now[held.key()].as_deref(), Some("rb-holder"));
    let transactions: i64 = client
        .query_one(
            // now(): the transaction's start.
            "SELECT count(DISTINCT acquired_at) FROM pgtenant.tenants WHERE owner = 'rb-hand'",
            &[],
        )
        .await
        .expect("history")
        .get(0);
    assert_eq!(transactions, 1, "the batch's acquisitions commit together");
    holder.close().await;
}

/// One key's answer: key, took_over, error_code, error_message.
type Answer = (String, Option<String>, Option<String>, Option<String>);

/// A batch takes over the tenants of a replica whose process died (its lease session gone, its
/// heartbeat row not yet expired), each in the batch's one transaction, as `acquire` does one.
#[tokio::test]
async fn a_batched_acquisition_takes_over_a_dead_replicas_tenants() {
    use support::by_hand::{connect, register_by_hand};
    let (db, client) = database().await;
    let ids: Vec<TenantId> = (0..4).map(|i| tenant(&format!("batch-dead-{i}"))).collect();
    let dead = Router::start(options(db.url(), "rb-dead").ttl(Duration::from_secs(60)))
        .await
        .expect("router");
    create_at(&dead, &ids).await;
    // Dropped without close(): as after a SIGKILL, its sessions end and its row says alive.
    drop(dead);
    let session = connect(db.url()).await;
    let (incarnation, secret) = register_by_hand(&session, "rb-heir").await;
    let keys: Vec<String> = ids.iter().map(|id| id.key().to_owned()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let answers = loop {
        let answers: Vec<Answer> = session
            .query(
                "SELECT key, took_over, error_code, error_message
                   FROM pgtenant.acquire_many($1, 'rb-heir', $2, $3, 2000, 100, 1000)",
                &[&keys, &incarnation, &secret],
            )
            .await
            .expect("acquire_many")
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
            .collect();
        // Its pooled sessions may take a moment to end after the drop.
        if answers.iter().all(|a| a.2.is_none()) || Instant::now() >= deadline {
            break answers;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        answers
            .iter()
            .all(|a| a.1.as_deref() == Some("dead") && a.2.is_none()),
        "every tenant taken over from the dead replica: {answers:?}"
    );
    let transactions: i64 = client
        .query_one(
            "SELECT count(DISTINCT acquired_at) FROM pgtenant.tenants WHERE owner = 'rb-heir'",
            &[],
        )
        .await
        .expect("tenants")
        .get(0);
    assert_eq!(transactions, 1, "the takeovers commit together");
}
