//! The command with several hosts (issue 14): `target_session_attrs=read-write` reaches the
//! primary wherever it is listed, before and after a failover, for plain commands (which
//! connect as tokio-postgres does) and for `migrate` (which runs a pgtenant router); with only
//! a standby, the error names every host and says what to do.

mod common;

use common::{assert_fails_saying, json, pgtenant, text};
use pgtenant_testkit::{Replication, StandbyPair};

#[tokio::test]
async fn several_hosts_reach_the_primary_before_and_after_a_failover() {
    let pair = StandbyPair::start(Replication::Asynchronous)
        .await
        .expect("primary and standby");
    let db = pair.create_database().await.expect("database");
    let (primary, standby) = (pair.primary_port(), pair.standby_port());
    // The standby first: a host list in any order must work.
    let url = format!(
        "postgres://postgres@127.0.0.1:{standby},127.0.0.1:{primary}/{db}?target_session_attrs=read-write"
    );
    // Only the standby: refused, saying why and naming it.
    let standby_only =
        format!("postgres://postgres@127.0.0.1:{standby}/{db}?target_session_attrs=read-write");
    let refused = pgtenant(&["setup", "--database-url", &standby_only]);
    assert_fails_saying(&refused, "no host takes writes");
    assert_fails_saying(&refused, &format!("127.0.0.1:{standby}"));

    let setup = pgtenant(&["setup", "--database-url", &url]);
    assert!(setup.status.success(), "{}", text(&setup));

    // migrate runs a router: its lease session and pool go through pgtenant's own host list.
    let dir = std::env::temp_dir().join(format!("pgtenant-cli-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a migrations directory");
    std::fs::write(dir.join("V1__log.sql"), "CREATE TABLE log (n int);").expect("a migration");
    let dir = dir.to_str().expect("UTF-8").to_owned();
    let router =
        pgtenant::Router::start(pgtenant::RouterOptions::from_url("maker", &url).expect("options"))
            .await
            .expect("a router through the host list");
    let id = pgtenant::TenantId::new("acme", "hosts").expect("an id");
    router
        .open_or_create(&id)
        .await
        .expect("a tenant")
        .release()
        .await
        .expect("release");
    router.close().await;
    let migrate = pgtenant(&["migrate", "--dir", &dir, "--database-url", &url]);
    assert!(migrate.status.success(), "{}", text(&migrate));
    pair.wait_for_standby()
        .await
        .expect("the standby caught up");

    pair.stop_primary_immediate()
        .await
        .expect("crash the primary");
    pair.promote_standby().await.expect("promote the standby");
    let status = json(&["tenants", "--json", "--database-url", &url]);
    assert_eq!(
        status["tenants"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );

    let _ = std::fs::remove_dir_all(&dir);
}
