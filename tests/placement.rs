//! Placement (#30), first part: where a replica is reached. A replica registers the address its
//! clients reach it at; `Router::locate` answers who serves a tenant and where; a `LeaseHeld`
//! refusal and `replica_status` carry the address; without one everything is as before.

mod support;

use pgtenant::{Error, Router};
use support::{database, options, tenant};

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
    let report = pgtenant::admin::status_report(&client, std::time::Duration::ZERO)
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
