//! `pgtenant status` at fleet scale (issue 21): the fleet summary from pgtenant.fleet_status,
//! a page of tenants instead of all of them, and `pgtenant sweep --dry-run`.

mod common;

use common::{json, pgtenant, setup, text};
use pgtenant_testkit::TestDatabase;

/// Three tenants at version 1 and 2, one quarantined, one forgotten with its schema in the trash.
async fn a_small_fleet(db: &TestDatabase) -> tokio_postgres::Client {
    setup(db.url());
    let client = db.connect().await.expect("connect");
    client
        .batch_execute(
            "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, schema_version)
             SELECT 'acme/l' || i, 'acme', 'l' || i, 't_acme_l' || i || '_1_000000000' || i, 1,
                    CASE WHEN i = 3 THEN 2 ELSE 1 END
               FROM generate_series(1, 3) i;
             UPDATE pgtenant.tenants SET quarantine_cause = 'broken', quarantine_repair = 'fix it',
                    quarantined_at = now() WHERE key = 'acme/l2';
             INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, forgotten_at_epoch)
             VALUES ('acme/gone', 'acme', 'gone', NULL, 1, 1);
             INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name, trashed_at)
             VALUES ('trash_t_acme_gone_1_0000000000', 'acme/gone', 1, 't_acme_gone_1_0000000000',
                     now() - interval '2 days');",
        )
        .await
        .expect("a small fleet");
    client
}

#[tokio::test]
async fn status_shows_the_fleet_and_a_page_of_tenants() {
    let db = TestDatabase::create().await.expect("test database");
    let _client = a_small_fleet(&db).await;
    let url = db.url();

    let shown = text(&pgtenant(&["status", "--database-url", url]));
    for line in [
        "fleet (pgtenant.fleet_status):",
        "tenants     4 (3 live): 0 held, 0 stalled, 0 owner_gone, 0 owner_reregistered, 2 free, 0 reserved, 1 quarantined, 1 forgotten",
        "migrations  1 live tenant(s) behind the newest version, 2 (not counting quarantined ones): \
         migrated at their next open, or by `pgtenant migrate`; live tenants by version: 2 at 1, 1 at 2",
        "trash       1 schema(s) not swept yet",
        "0 past the 7d retention",
        "acme/l1",
        "acme/gone",
    ] {
        assert!(shown.contains(line), "{line:?} missing from:\n{shown}");
    }
    assert!(!shown.contains("more:"), "{shown}");

    // A retention of a day: the trashed schema is due.
    let shown = text(&pgtenant(&[
        "status",
        "--retention",
        "1d",
        "--database-url",
        url,
    ]));
    assert!(shown.contains("1 past the 1d retention"), "{shown}");

    // A page of two: the header says how many there are, the end where the rest starts.
    let shown = text(&pgtenant(&[
        "status",
        "--limit",
        "2",
        "--database-url",
        url,
    ]));
    assert!(
        shown.contains("the first 2 of 4 by key")
            && shown.contains("… more: pgtenant tenants --after acme/l1"),
        "{shown}"
    );
    assert!(!shown.contains("acme/l2 "), "{shown}");

    let status = json(&["status", "--json", "--limit", "2", "--database-url", url]);
    assert_eq!(status["fleet"]["tenants"], 4, "{status:#}");
    assert_eq!(status["fleet"]["states"]["quarantined"], 1, "{status:#}");
    assert_eq!(status["fleet"]["versions"]["1"], 2, "{status:#}");
    assert_eq!(status["fleet"]["behind"], 1, "{status:#}");
    assert_eq!(
        status["tenants"].as_array().map(Vec::len),
        Some(2),
        "{status:#}"
    );
    assert_eq!(status["next_after"], "acme/l1", "{status:#}");
    let all = json(&["status", "--json", "--database-url", url]);
    assert!(all["next_after"].is_null(), "{all:#}");
    assert_eq!(all["tenants"].as_array().map(Vec::len), Some(4), "{all:#}");
    // Tenants carry what replicas carry (issue 27): time left on the owner's heartbeat, and
    // the incarnation holding the lease.
    for tenant in all["tenants"].as_array().expect("tenants") {
        for key in ["expires_in_ms", "owner_incarnation", "owner_alive"] {
            assert!(tenant.get(key).is_some(), "{key} missing: {tenant:#}");
        }
    }
}

/// Issue 27's fleet line, "newest version 0; 0 live tenant(s) behind it, not quarantined (2 at
/// 0)", now says what it means; a held tenant shows its owner's incarnation and time left.
#[tokio::test]
async fn the_migrations_line_reads_plainly() {
    let db = TestDatabase::create().await.expect("test database");
    setup(db.url());
    let client = db.connect().await.expect("connect");
    let (incarnation, secret): (i64, String) = {
        let lock =
            "SELECT pg_advisory_lock(pgtenant.lock_namespace(), pgtenant.replica_lock_key('r1'))";
        client.execute(lock, &[]).await.expect("the liveness lock");
        let row = client
            .query_one(
                "SELECT incarnation, secret FROM pgtenant.register('r1', 60000, NULL)",
                &[],
            )
            .await
            .expect("register");
        (row.get(0), row.get(1))
    };
    client
        .execute(
            "SELECT pgtenant.acquire('acme/a', 'acme', 'a', 'r1', $1, $2, true)",
            &[&incarnation, &secret],
        )
        .await
        .expect("acquire");
    client
        .batch_execute(
            "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch)
             VALUES ('acme/b', 'acme', 'b', 't_acme_b_1_0000000000', 1)",
        )
        .await
        .expect("a free tenant");
    client
        .batch_execute(
            "CREATE SCHEMA t_acme_a_1_0000000000;
             UPDATE pgtenant.tenants SET schema_name = 't_acme_a_1_0000000000' WHERE key = 'acme/a'",
        )
        .await
        .expect("a live schema");
    let shown = text(&pgtenant(&["status", "--database-url", db.url()]));
    assert!(
        shown.contains(
            "migrations  no tenant migration has run (all 2 live tenant(s) at version 0)"
        ),
        "{shown}"
    );
    let held = shown
        .lines()
        .find(|line| line.trim_start().starts_with("acme/a "))
        .unwrap_or_else(|| panic!("acme/a missing: {shown}"));
    let cells: Vec<&str> = held.split_whitespace().collect();
    assert_eq!(
        &cells[..4],
        ["acme/a", "held", "r1", &incarnation.to_string()],
        "{held}"
    );
    assert!(cells[5].ends_with('s'), "expires_in: {held}");
}

#[tokio::test]
async fn sweep_dry_run_changes_nothing() {
    let db = TestDatabase::create().await.expect("test database");
    let client = a_small_fleet(&db).await;
    let url = db.url();
    let shown = text(&pgtenant(&[
        "sweep",
        "--dry-run",
        "--retention",
        "1d",
        "--database-url",
        url,
    ]));
    assert!(
        shown.contains("would drop 1 trashed schema(s)") && shown.contains("nothing was changed"),
        "{shown}"
    );
    let backlog = json(&["sweep", "--dry-run", "--json", "--database-url", url]);
    assert_eq!(backlog["trash_due"], 0, "{backlog:#}");
    assert_eq!(backlog["trash_kept"], 1, "{backlog:#}");
    assert_eq!(backlog["orphan_schemas"], 0, "{backlog:#}");
    let unswept: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtenant.trash WHERE swept_at IS NULL",
            &[],
        )
        .await
        .expect("trash")
        .get(0);
    assert_eq!(unswept, 1, "the dry run swept nothing");
}
