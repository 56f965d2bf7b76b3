//! `pgtenant migrate` with a migration that fails everywhere: it stops after the first
//! failures instead of quarantining every tenant, and prints results as text.

mod common;

use common::{json, pgtenant, setup, text};
use pgtenant_testkit::TestDatabase;

#[tokio::test]
async fn a_failing_migration_stops_the_run() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    setup(url);
    let router =
        pgtenant::Router::start(pgtenant::RouterOptions::from_url("maker", url).expect("options"))
            .await
            .expect("a router");
    for i in 0..6 {
        let id = pgtenant::TenantId::new("acme", &format!("l{i}")).expect("an id");
        let handle = router.open_or_create(&id).await.expect("a tenant");
        handle.release().await.expect("release");
    }
    router.close().await;
    let dir = std::env::temp_dir().join(format!("pgtenant-cli-failing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a migrations directory");
    std::fs::write(dir.join("V1__broken.sql"), "SELECT 1 / 0;").expect("a migration");
    let dir = dir.to_str().expect("UTF-8").to_owned();
    let quarantined = || {
        json(&["tenants", "--quarantined", "--json", "--database-url", url])["tenants"]
            .as_array()
            .expect("tenants")
            .len()
    };

    let first = pgtenant(&["migrate", "--dir", &dir, "--database-url", url]);
    let shown = text(&first);
    assert_eq!(first.status.code(), Some(1), "{shown}");
    for expected in [
        "[1/6] acme/l0: QUARANTINED: ",
        "division by zero",
        "6 tenant(s) behind: 0 migrated, 0 held elsewhere, 1 quarantined, 0 failed",
        "stopped after 1 failure(s) (--max-failures 1): 5 tenant(s) not attempted",
        "`pgtenant clear` each quarantined tenant",
    ] {
        assert!(
            shown.contains(expected),
            "{expected:?} missing from:\n{shown}"
        );
    }
    assert!(
        !shown.contains("Quarantined {"),
        "Rust Debug output: {shown}"
    );
    assert_eq!(quarantined(), 1);

    // Told otherwise, it goes on until that many failed.
    let second = pgtenant(&[
        "migrate",
        "--dir",
        &dir,
        "--max-failures",
        "2",
        "--concurrency",
        "1",
        "--json",
        "--database-url",
        url,
    ]);
    assert_eq!(second.status.code(), Some(1), "{}", text(&second));
    let report: serde_json::Value = serde_json::from_slice(&second.stdout).expect("JSON");
    assert_eq!(report["behind"], 5, "{report:#}");
    assert_eq!(
        report["results"].as_array().expect("results").len(),
        2,
        "{report:#}"
    );
    assert_eq!(report["results"][0]["outcome"], "quarantined", "{report:#}");
    assert_eq!(report["stopped"], true, "{report:#}");
    assert_eq!(report["not_attempted"].as_array().expect("a list").len(), 3);
    assert_eq!(quarantined(), 3);
    std::fs::remove_dir_all(&dir).ok();
}
