//! What the commands print: JSON conventions shared by status and tenants, the next-page
//! cursor, and a reader that stops reading.

mod common;

use std::process::Stdio;

use common::{command, json, pgtenant, setup, text};
use pgtenant_testkit::TestDatabase;

/// `pgtenant status | head -1`: stdout closes before the command has printed everything. The
/// pipe here is closed before the command starts, so its first write already fails.
#[tokio::test]
async fn a_closed_stdout_ends_the_command_quietly() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    setup(url);
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["tenants"],
        &["trash", "--json"],
        &["setup"],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let output = command([args, &["--database-url", url]].concat())
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .expect("run pgtenant");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

fn is_utc_rfc3339(value: &serde_json::Value) -> bool {
    let Some(text) = value.as_str() else {
        return false;
    };
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_digit);
    bytes.len() == 20
        && digits(0..4)
        && bytes[4] == b'-'
        && digits(5..7)
        && bytes[7] == b'-'
        && digits(8..10)
        && bytes[10] == b'T'
        && digits(11..13)
        && bytes[13] == b':'
        && digits(14..16)
        && bytes[16] == b':'
        && digits(17..19)
        && bytes[19] == b'Z'
}

/// `status --json` and `tenants --json` describe a tenant with the same fields, timestamps in
/// RFC 3339 UTC; replicas too.
#[tokio::test]
async fn status_and_tenants_json_agree() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    setup(url);
    let client = db.connect().await.expect("connect");
    // A session time zone far from UTC shows whether timestamps carry their zone.
    client
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET timezone = 'Pacific/Kiritimati';
             INSERT INTO pgtenant.replicas (replica_id, incarnation, expires_at)
             VALUES ('replica-a', 1, now() + interval '1 minute');
             INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, acquired_at)
             VALUES ('acme/books', 'acme', 'books', 't_acme_books_1_0000000000', 1, now());",
            db.name()
        ))
        .await
        .expect("a replica and a tenant");

    let status = json(&["status", "--json", "--database-url", url]);
    let page = json(&["tenants", "--json", "--database-url", url]);
    let from_status = &status["tenants"][0];
    let from_tenants = &page["tenants"][0];
    assert_eq!(from_status, from_tenants, "{status:#}\n{page:#}");
    assert_eq!(from_status["tenant"], "acme/books");
    for field in ["created_at", "acquired_at"] {
        assert!(is_utc_rfc3339(&from_status[field]), "{field}: {status:#}");
    }
    let replica = &status["replicas"][0];
    assert_eq!(replica["replica_id"], "replica-a");
    assert!(is_utc_rfc3339(&replica["started_at"]), "{status:#}");
    assert_eq!(replica["alive"], false, "{status:#}");
    assert!(replica["released_at"].is_null(), "{status:#}");
    assert_eq!(
        status["control_plane_version"],
        pgtenant::admin::supported_version()
    );
}

/// `tenants --json` says where the next page starts, and only when there is one.
#[tokio::test]
async fn tenants_pages_carry_a_cursor() {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    setup(url);
    let client = db.connect().await.expect("connect");
    client
        .batch_execute(
            "INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch)
             SELECT 'acme/l' || i, 'acme', 'l' || i, 't_acme_l' || i || '_1_000000000' || i, 1
               FROM generate_series(1, 3) i",
        )
        .await
        .expect("three tenants");
    let keys = |page: &serde_json::Value| -> Vec<String> {
        page["tenants"]
            .as_array()
            .expect("a list of tenants")
            .iter()
            .map(|t| t["tenant"].as_str().expect("a key").to_owned())
            .collect()
    };
    let first = json(&["tenants", "--limit", "2", "--json", "--database-url", url]);
    assert_eq!(keys(&first), ["acme/l1", "acme/l2"]);
    assert_eq!(first["next_after"], "acme/l2");
    let second = json(&[
        "tenants",
        "--limit",
        "2",
        "--after",
        "acme/l2",
        "--json",
        "--database-url",
        url,
    ]);
    assert_eq!(keys(&second), ["acme/l3"]);
    assert!(second["next_after"].is_null(), "{second:#}");
    // A full last page has no next one.
    let exact = json(&["tenants", "--limit", "3", "--json", "--database-url", url]);
    assert_eq!(keys(&exact).len(), 3);
    assert!(exact["next_after"].is_null(), "{exact:#}");

    let shown = text(&pgtenant(&[
        "tenants",
        "--limit",
        "2",
        "--database-url",
        url,
    ]));
    assert!(shown.contains("… more: --after acme/l2"), "{shown}");
    let shown = text(&pgtenant(&[
        "tenants",
        "--limit",
        "3",
        "--database-url",
        url,
    ]));
    assert!(!shown.contains("more"), "{shown}");
}
