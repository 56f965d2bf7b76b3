//! `pgtenant setup` and `status` on a Citus coordinator (issue #13), from a session whose
//! `citus.enable_schema_based_sharding` is on: setup works (it failed with "cannot insert
//! multiple commands into a prepared statement"), twice, and leaves nothing of the control plane
//! distributed. Skips with one line without Citus (`PGTENANT_REQUIRE_CITUS=1` fails instead).

mod common;

use common::{pgtenant, text};
use pgtenant_testkit::{skip_without_citus, Source, TestDatabase};

#[tokio::test]
async fn setup_and_status_on_citus_with_sharding_on() {
    if skip_without_citus("setup_and_status_on_citus_with_sharding_on") {
        return;
    }
    let db = TestDatabase::create_from(Source::Citus)
        .await
        .expect("a database on the Citus cluster");
    let url = format!(
        "{}?options=-c%20citus.enable_schema_based_sharding%3Don",
        db.url()
    );
    let first = pgtenant(&["setup", "--database-url", &url]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("applied V1__control_plane"),
        "{}",
        text(&first)
    );
    let second = pgtenant(&["setup", "--database-url", &url]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(text(&second).contains("up to date"), "{}", text(&second));
    let status = pgtenant(&["status", "--database-url", &url]);
    assert!(status.status.success(), "{}", text(&status));

    let client = db.connect().await.expect("connect");
    let distributed: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_dist_schema WHERE schemaid = 'pgtenant'::regnamespace)
                  + (SELECT count(*) FROM pg_dist_partition
                      WHERE logicalrelid::regclass::text LIKE 'pgtenant.%')",
            &[],
        )
        .await
        .expect("Citus metadata")
        .get(0);
    assert_eq!(
        distributed, 0,
        "nothing of the control plane is distributed"
    );
}
