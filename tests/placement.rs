//! Placement (#30), first part: where a replica is reached. A replica registers the address its
//! clients reach it at; `Router::locate` answers who serves a tenant and where; a `LeaseHeld`
//! refusal and `replica_status` carry the address; without one everything is as before.

mod support;

use std::time::Duration;

use pgtenant::{Error, ErrorKind, Event, Route, Router, TenantState};
use support::{database, options, tenant, wait_event};

#[tokio::test]
async fn a_replica_registers_its_address_and_every_replica_locates_the_owner_there() {
    let (db, client) = database().await;
    let a = Router::start(options(db.url(), "addr-a").address("http://10.0.0.1:8080"))
        .await
        .expect("a starts");
    let b = Router::start(options(db.url(), "addr-b").address("10.0.0.2:8080"))
        .await
        .expect("b starts");
    let id = tenant("located");

    // Never created: nobody serves it, so whoever is asked serves it.
    let nowhere = b.locate(&id).await.expect("locate");
    assert!(!nowhere.exists && nowhere.owner.is_none() && nowhere.address.is_none());

    let handle = a.open_or_create(&id).await.expect("a opens");
    let from_b = b.locate(&id).await.expect("locate from b");
    assert!(from_b.exists);
    assert_eq!(from_b.owner.as_ref().map(|o| o.as_str()), Some("addr-a"));
    assert_eq!(from_b.address.as_deref(), Some("http://10.0.0.1:8080"));
    assert_eq!(from_b.epoch, handle.epoch());
    assert!(from_b.owner_alive && !from_b.reserved && !from_b.here);
    let from_a = a.locate(&id).await.expect("locate from a");
    assert!(from_a.here, "{from_a:?}");

    // The refusal a request gets on the wrong replica says where to send it.
    match b.open(&id).await {
        Err(Error::LeaseHeld {
            owner,
            owner_address,
            ..
        }) => {
            assert_eq!(owner.as_str(), "addr-a");
            assert_eq!(owner_address.as_deref(), Some("http://10.0.0.1:8080"));
        }
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    let message = b.open(&id).await.expect_err("held").to_string();
    assert!(
        message.contains("reached at http://10.0.0.1:8080"),
        "{message}"
    );

    // psql and the admin API show it.
    let address: Option<String> = client
        .query_one(
            "SELECT address FROM pgtenant.replica_status WHERE replica_id = 'addr-b'",
            &[],
        )
        .await
        .expect("replica_status")
        .get(0);
    assert_eq!(address.as_deref(), Some("10.0.0.2:8080"));
    let report = pgtenant::admin::status_report(&client, Duration::ZERO)
        .await
        .expect("status report");
    let replica_a = report
        .replicas
        .iter()
        .find(|r| r.replica_id.as_str() == "addr-a")
        .expect("a listed");
    assert_eq!(replica_a.address.as_deref(), Some("http://10.0.0.1:8080"));

    // A directed handoff reserves the tenant for b: located there, at b's address.
    handle
        .handoff_to(b.replica_id())
        .await
        .expect("handoff to b");
    let reserved = a.locate(&id).await.expect("locate reserved");
    assert_eq!(reserved.owner.as_ref().map(|o| o.as_str()), Some("addr-b"));
    assert_eq!(reserved.address.as_deref(), Some("10.0.0.2:8080"));
    assert!(reserved.reserved && !reserved.here);
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn without_an_address_locate_names_the_owner_and_nothing_else_changes() {
    let (db, _client) = database().await;
    let a = support::router(db.url(), "plain-a").await;
    let b = support::router(db.url(), "plain-b").await;
    let id = tenant("unaddressed");
    let _handle = a.open_or_create(&id).await.expect("open");
    let located = b.locate(&id).await.expect("locate");
    assert_eq!(located.owner.as_ref().map(|o| o.as_str()), Some("plain-a"));
    assert!(located.address.is_none());
    match b.open(&id).await {
        Err(Error::LeaseHeld { owner_address, .. }) => assert!(owner_address.is_none()),
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    let message = b.open(&id).await.expect_err("held").to_string();
    assert!(!message.contains("reached at"), "{message}");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn an_address_that_is_not_one_is_refused_before_anything_changes() {
    let (db, client) = database().await;
    for address in ["", "http://a\n:80", &"x".repeat(1025)] {
        match Router::start(options(db.url(), "bad-address").address(address)).await {
            Err(Error::InvalidOption { option, reason, .. }) => {
                assert_eq!(option, "address");
                assert!(reason.contains("1 to 1024 bytes"), "{reason}");
            }
            Err(other) => panic!("expected InvalidOption, got {other}"),
            Ok(_) => panic!("{address:?} was accepted"),
        }
    }
    let registered: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtenant.replicas WHERE replica_id = 'bad-address'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(registered, 0, "nothing was registered");
}

/// The placement function alone (`pgtenant.home_among`, what `pgtenant.home` and the
/// `pgtenant.placement` view apply to the live replicas), over 4 000 tenant keys: a joiner takes
/// its share and nothing moves between the others; a leaver's tenants, and only those, spread
/// over the rest; weights set the shares; weight 0 is the home of none; the order the replicas
/// are listed in does not matter.
#[tokio::test]
async fn homes_move_only_to_a_joiner_and_only_from_a_leaver_in_proportion_to_weights() {
    let (_db, client) = database().await;
    let homes = |replicas: &'static str, weights: &'static str| {
        format!("pgtenant.home_among(k.key, ARRAY[{replicas}], ARRAY[{weights}]::float8[])")
    };
    let count = |sql: String| {
        let client = &client;
        async move {
            let n: i64 = client
                .query_one(
                    &format!(
                        "SELECT count(*) FROM (SELECT 'acme/t' || g AS key
                                                  FROM generate_series(1, 4000) g) k
                          WHERE {sql}"
                    ),
                    &[],
                )
                .await
                .expect(&sql)
                .get(0);
            n
        }
    };
    let four = homes("'a','b','c','d'", "1,1,1,1");
    let five = homes("'a','b','c','d','e'", "1,1,1,1,1");
    // A joiner: what moves, moves to it, and about its share (800 of 4 000) moves.
    let moved = count(format!("{four} <> {five}")).await;
    let to_e = count(format!("{five} = 'e'")).await;
    assert_eq!(
        count(format!("{four} <> {five} AND {five} <> 'e'")).await,
        0,
        "nothing moves between the replicas that were there"
    );
    assert_eq!(moved, to_e, "everything that moved went to the joiner");
    assert!(
        (680..=920).contains(&to_e),
        "the joiner's share: {to_e} of 4000"
    );
    // A leaver: only its tenants move, spread over the others.
    let three = homes("'a','c','d'", "1,1,1");
    assert_eq!(
        count(format!("{four} <> {three} AND {four} <> 'b'")).await,
        0,
        "only the leaver's tenants move"
    );
    let from_b = count(format!("{four} = 'b'")).await;
    for other in ["a", "c", "d"] {
        let got = count(format!("{four} = 'b' AND {three} = '{other}'")).await;
        assert!(
            got * 5 > from_b && got * 2 < from_b,
            "{other} took {got} of b's {from_b}"
        );
    }
    // Weights: 2 among three 1s is 2/5 of the tenants; 0 is none.
    let weighted = homes("'a','b','c','d'", "2,1,1,1");
    let to_a = count(format!("{weighted} = 'a'")).await;
    assert!(
        (1440..=1760).contains(&to_a),
        "weight 2 of 5: {to_a} of 4000"
    );
    let none = homes("'a','b','c','d'", "0,1,1,1");
    assert_eq!(count(format!("{none} = 'a'")).await, 0);
    // The listing order does not matter.
    let shuffled = homes("'d','b','a','c'", "1,1,1,1");
    assert_eq!(count(format!("{four} <> {shuffled}")).await, 0);
}

/// Real routers: the `pgtenant.placement` view and `Router::locate` on every replica give each
/// tenant the same home, among the live replicas with a weight above 0, more often the heavier.
#[tokio::test]
async fn every_replica_and_psql_agree_on_each_tenants_home() {
    let (db, client) = database().await;
    let a = Router::start(options(db.url(), "home-a").address("a:1"))
        .await
        .expect("a");
    let b = Router::start(
        options(db.url(), "home-b")
            .address("b:1")
            .placement_weight(3.0),
    )
    .await
    .expect("b");
    let c = Router::start(options(db.url(), "home-c").placement_weight(0.0))
        .await
        .expect("c");
    let mut ids = Vec::new();
    for n in 0..40 {
        let id = tenant(&format!("homed{n}"));
        a.open_or_create(&id).await.expect("open");
        ids.push(id);
    }
    let rows = client
        .query(
            "SELECT tenant, owner, home, home_address, at_home FROM pgtenant.placement
              WHERE tenant LIKE 'acme/homed%'",
            &[],
        )
        .await
        .expect("the placement view");
    assert_eq!(rows.len(), 40);
    let mut homes = std::collections::BTreeMap::<String, usize>::new();
    for row in &rows {
        let (key, owner, home, address, at_home): (String, String, String, String, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        assert_eq!(owner, "home-a");
        assert_eq!(at_home, home == "home-a", "{key}");
        assert_eq!(address, if home == "home-a" { "a:1" } else { "b:1" });
        *homes.entry(home.clone()).or_default() += 1;
        let id = tenant(key.trim_start_matches("acme/"));
        for router in [&a, &b, &c] {
            let located = router.locate(&id).await.expect("locate");
            assert_eq!(
                located.home.as_ref().map(|h| h.as_str()),
                Some(home.as_str())
            );
        }
    }
    assert!(
        !homes.contains_key("home-c"),
        "weight 0 is the home of none"
    );
    assert!(
        homes.get("home-b") > homes.get("home-a"),
        "weight 3 against 1: {homes:?}"
    );
    match Router::start(options(db.url(), "home-x").placement_weight(-1.0)).await {
        Err(Error::InvalidOption { option, .. }) => assert_eq!(option, "placement_weight"),
        Err(other) => panic!("expected InvalidOption, got {other}"),
        Ok(_) => panic!("a negative weight was accepted"),
    }
    for router in [a, b, c] {
        router.close().await;
    }
}

/// Idle release: a tenant in use is never handed off, however long its work; once no work has
/// used it for the idle time it is handed off (free in the control plane, the old handle
/// refuses, another replica opens it at once).
#[tokio::test]
async fn an_idle_tenant_is_handed_off_and_one_in_use_is_not() {
    let (db, _client) = database().await;
    let idle = Duration::from_secs(1);
    let a = Router::start(options(db.url(), "idle-a").idle_release(idle))
        .await
        .expect("a");
    let b = support::router(db.url(), "idle-b").await;
    let mut events = a.subscribe();
    let id = tenant("idle");
    let handle = a.open_or_create(&id).await.expect("open");
    // Work that lasts well past the idle time: the tenant is in use all along.
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute("SELECT pg_sleep(2.5)").await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .expect("long work");
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(event, Event::Draining { .. } | Event::HandedOff { .. }),
            "handed off while in use: {event:?}"
        );
    }
    // Then nothing uses it: handed off.
    let handed = tokio::time::timeout(
        Duration::from_secs(10),
        wait_event(&mut events, id.key(), "handed_off"),
    )
    .await
    .expect("handed off within 10 s of its last work");
    assert!(
        matches!(handed, Event::HandedOff { to: None, .. }),
        "{handed:?}"
    );
    assert_eq!(
        a.status(&id).await.expect("status").state,
        TenantState::Free
    );
    let refused = handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute("SELECT 1").await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .expect_err("the released handle refuses work");
    assert_eq!(refused.kind(), ErrorKind::LeaseEnded, "{refused}");
    b.open(&id).await.expect("another replica opens it at once");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn an_idle_release_out_of_range_is_refused() {
    let (db, _client) = database().await;
    match Router::start(options(db.url(), "idle-x").idle_release(Duration::from_millis(10))).await {
        Err(Error::InvalidOption { option, .. }) => assert_eq!(option, "idle_release"),
        Err(other) => panic!("expected InvalidOption, got {other}"),
        Ok(_) => panic!("10 ms was accepted"),
    }
}

/// Routing: a request for a tenant another replica holds is sent to that replica's address;
/// after the tenant moves, the replica that held it sends the request on instead of running it,
/// and the new owner runs it, once.
#[tokio::test]
async fn a_request_reaches_the_owner_in_one_hop_and_runs_once() {
    let (db, _client) = database().await;
    let a = Router::start(options(db.url(), "route-a").address("a:1"))
        .await
        .expect("a");
    let b = Router::start(options(db.url(), "route-b").address("b:1"))
        .await
        .expect("b");
    let id = tenant("routed");
    let Route::Here(held) = a.route(&id, true).await.expect("route at a") else {
        panic!("a free tenant is served where the request lands");
    };
    support::create_log(&held).await;
    match b.route(&id, false).await.expect("route at b") {
        Route::There { owner, address, .. } => {
            assert_eq!(owner.as_str(), "route-a");
            assert_eq!(address, "a:1");
        }
        Route::Here(_) => panic!("b must not serve a tenant a holds"),
    }
    // The tenant moves to b; a request that still reaches a is sent on to b, and runs there.
    held.handoff_to(b.replica_id()).await.expect("handoff to b");
    let Route::There { owner, address, .. } = a.route(&id, false).await.expect("route at a") else {
        panic!("a no longer serves the tenant");
    };
    assert_eq!((owner.as_str(), address.as_str()), ("route-b", "b:1"));
    let Route::Here(at_b) = b.route(&id, false).await.expect("route at b") else {
        panic!("the request is served where it was sent");
    };
    support::append(&at_b, "route-b", 1)
        .await
        .expect("the request runs once, at b");
    assert_eq!(
        support::count_rows(&at_b, "SELECT count(*) FROM log").await,
        1,
        "run once"
    );
    a.close().await;
    b.close().await;
}
