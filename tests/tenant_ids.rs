//! G7 for tenant ids: hostile input is refused with the rule it broke, before any SQL; the ids
//! applications use (UUIDs, ULIDs, prefixed ids, mixed case, up to 128 bytes a part) are
//! accepted, get bounded, collision-free, recognisable schema names, and work end to end; and
//! tenants created under the first rules (lowercase, 30 bytes) keep their schema names, open,
//! are forgotten and swept as before (issue 27).

mod support;

use std::time::Duration;

use pgtenant::admin::SweepOptions;
use pgtenant::limits::MAX_ID_PART_LEN;
use pgtenant::{ActiveWork, Error, IdPart, IdRule, InvalidTenantId, TenantId};
use pgtenant_testkit::TestDatabase;

const UUID: &str = "3f2c1a9e-8b7d-4c6e-9f1a-2b3c4d5e6f70";
const UUID_UPPER: &str = "3F2C1A9E-8B7D-4C6E-9F1A-2B3C4D5E6F70";
const ULID: &str = "01HZX3K8Q2M4N6P8R0T2V4W6Y8";

fn invalid(error: Error) -> InvalidTenantId {
    match error {
        Error::InvalidTenantId(invalid) => invalid,
        other => panic!("expected InvalidTenantId, got {other}"),
    }
}

fn rule_of(organization: &str, ledger: &str) -> (IdPart, IdRule) {
    let error = TenantId::new(organization, ledger).expect_err("must be refused");
    assert_eq!(error.kind(), pgtenant::ErrorKind::InvalidInput);
    let message = error.to_string();
    let error = invalid(error);
    assert!(
        message.contains("ASCII letters") && message.contains(&error.part.to_string()),
        "the message says what to do: {message}"
    );
    assert!(
        message.len() < 600,
        "bounded message for {} bytes of input: {message}",
        organization.len() + ledger.len()
    );
    (error.part, error.rule)
}

#[test]
fn hostile_ids_are_refused_with_their_rule() {
    use IdPart::*;
    let long = "a".repeat(10_000);
    let cases: Vec<(&str, &str, IdPart, IdRule)> = vec![
        ("", "l", Organization, IdRule::Empty),
        ("o", "", Ledger, IdRule::Empty),
        (
            "acme'; DROP TABLE x; --",
            "l",
            Organization,
            IdRule::BadChar { found: '\'', at: 4 },
        ),
        ("acme", "a;b", Ledger, IdRule::BadChar { found: ';', at: 1 }),
        (
            "acme",
            "x\"y",
            Ledger,
            IdRule::BadChar { found: '"', at: 1 },
        ),
        (
            "acmé",
            "l",
            Organization,
            IdRule::BadChar { found: 'é', at: 3 },
        ),
        (
            "acme",
            "l\0",
            Ledger,
            IdRule::BadChar { found: '\0', at: 1 },
        ),
        (
            "-acme",
            "l",
            Organization,
            IdRule::BadFirstChar { found: '-' },
        ),
        (
            "_acme",
            "l",
            Organization,
            IdRule::BadFirstChar { found: '_' },
        ),
        ("acme", ".", Ledger, IdRule::BadFirstChar { found: '.' }),
        ("acme", "a/b", Ledger, IdRule::BadChar { found: '/', at: 1 }),
        ("acme", " l", Ledger, IdRule::BadFirstChar { found: ' ' }),
        ("acme", "l x", Ledger, IdRule::BadChar { found: ' ', at: 1 }),
        (
            "a:b",
            "l",
            Organization,
            IdRule::BadChar { found: ':', at: 1 },
        ),
        (&long, "l", Organization, IdRule::TooLong { len: 10_000 }),
        ("acme", &long[..129], Ledger, IdRule::TooLong { len: 129 }),
    ];
    for (organization, ledger, part, rule) in cases {
        assert_eq!(
            rule_of(organization, ledger),
            (part, rule),
            "{organization:?}/{ledger:?}"
        );
    }
    assert_eq!(MAX_ID_PART_LEN, 128);
    assert!(
        TenantId::new(&long[..128], &long[..128]).is_ok(),
        "128 bytes is the limit, inclusive"
    );
    assert!(TenantId::new("0", "9-x").is_ok());
}

/// The ids applications use, as they are.
#[test]
fn uuids_ulids_and_prefixed_ids_are_accepted() {
    for (organization, ledger) in [
        (UUID, "main"),
        (UUID, UUID),
        (UUID_UPPER, ULID),
        (ULID, "invoices"),
        ("org_2NxXkQm4b7P9", "ledger_01"),
        ("acme.example.com", "eu-west.2026"),
        ("pg_catalog", "public"),
        ("Acme", "LedGer"),
    ] {
        let id = TenantId::new(organization, ledger)
            .unwrap_or_else(|error| panic!("{organization}/{ledger}: {error}"));
        assert_eq!(id.organization(), organization);
        assert_eq!(id.ledger(), ledger);
        assert_eq!(TenantId::parse(id.key()).expect("parse"), id);
    }
}

#[test]
fn keys_parse_back_to_the_same_id() {
    let id = TenantId::new("acme-eu", "invoices-2026").unwrap();
    assert_eq!(TenantId::parse(id.key()).unwrap(), id);
    assert_eq!(id.organization(), "acme-eu");
    assert_eq!(id.ledger(), "invoices-2026");
    for bad in ["acme", "acme/", "/l", "a/b/c", "a//b"] {
        assert!(TenantId::parse(bad).is_err(), "{bad}");
    }
    let json = serde_json::to_string(&id).unwrap();
    assert_eq!(json, "\"acme-eu/invoices-2026\"");
    assert!(serde_json::from_str::<TenantId>("\"Acme x/y\"").is_err());
    let parsed: TenantId = format!("{UUID}/{ULID}").parse().expect("FromStr");
    assert_eq!(parsed.ledger(), ULID);
}

/// The first release's derivation, word for word (`src/id.rs` at 0.1.0): what every schema of a
/// tenant created before issue 27 is named. The oracle of the tests below.
fn first_rule_name(organization: &str, ledger: &str, epoch: i64, separator: &str) -> String {
    let fnv = |bytes: &[u8]| {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let epoch_text = epoch.to_string();
    let hash = format!(
        "{:016x}",
        fnv(format!("{organization}/{ledger}\0{epoch_text}").as_bytes())
    );
    let readable = (63 - 6_usize).saturating_sub(2 + separator.len() + 2 + epoch_text.len() + 10);
    let org_len = organization
        .len()
        .min(readable.saturating_sub(ledger.len()).max(readable / 2));
    let ledger_len = ledger.len().min(readable - org_len);
    format!(
        "t_{}{separator}{}_{epoch_text}_{}",
        organization[..org_len].replace('-', "_"),
        ledger[..ledger_len].replace('-', "_"),
        &hash[..10]
    )
}

#[test]
fn ids_of_the_first_rules_keep_their_schema_names() {
    // Seen in a database the first release made, and its own test's expectations.
    assert_eq!(
        first_rule_name("acme", "invoices", 1, "__"),
        "t_acme__invoices_1_4d0b27909c"
    );
    assert_eq!(
        TenantId::new("acme", "invoices").unwrap().schema_name(1),
        "t_acme__invoices_1_4d0b27909c"
    );
    let long = "z".repeat(30);
    let digits = "9".repeat(30);
    for (organization, ledger) in [
        ("a", "b"),
        ("acme-eu", "in-voices"),
        (long.as_str(), digits.as_str()),
        ("0", "9-x"),
    ] {
        let id = TenantId::new(organization, ledger).unwrap();
        for epoch in [1_i64, 2, 7, 1_099_511_627_776, i64::MAX] {
            assert_eq!(
                id.schema_name(epoch),
                first_rule_name(organization, ledger, epoch, "__"),
                "{id} at {epoch}"
            );
        }
    }
}

#[test]
fn schema_names_follow_the_rules() {
    let longest = "Z".repeat(MAX_ID_PART_LEN);
    let ids = [
        TenantId::new("a", "b").unwrap(),
        TenantId::new("pg", "x").unwrap(),
        TenantId::new(&"z".repeat(30), &"9".repeat(30)).unwrap(),
        TenantId::new("acme-eu", "in-voices").unwrap(),
        TenantId::new(UUID, "main").unwrap(),
        TenantId::new(UUID, UUID).unwrap(),
        TenantId::new(UUID_UPPER, ULID).unwrap(),
        TenantId::new(&longest, &longest).unwrap(),
        TenantId::new("org_2NxX.k", "a.b_c-d").unwrap(),
    ];
    let mut seen = std::collections::HashSet::new();
    for id in &ids {
        for epoch in [1_i64, 7, 1_000_000, i64::MAX] {
            let name = id.schema_name(epoch);
            assert!(name.starts_with("t_") && !name.starts_with("pg_"), "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
            assert!(
                name.len() + "trash_".len() <= 63,
                "{name} leaves room for the trash prefix"
            );
            assert!(seen.insert(name), "unique");
        }
    }
    assert!(
        ids[3].schema_name(1).starts_with("t_acme_eu__in_voices_1_"),
        "recognisable: {}",
        ids[3].schema_name(1)
    );
    // A UUID keeps its whole readable self beside a short ledger, a prefix beside another UUID.
    let uuid_snake = UUID.replace('-', "_");
    assert!(
        ids[4]
            .schema_name(1)
            .starts_with(&format!("t_{uuid_snake}__main_1_")),
        "{}",
        ids[4].schema_name(1)
    );
    assert!(
        ids[5].schema_name(1).starts_with(&format!(
            "t_{}__{}",
            &uuid_snake[..20],
            &uuid_snake[..20]
        )),
        "{}",
        ids[5].schema_name(1)
    );
    assert!(
        ids[8]
            .schema_name(1)
            .starts_with("t_org_2nxx_k__a_b_c_d_1_"),
        "{}",
        ids[8].schema_name(1)
    );
    // The double underscore parts organization from ledger, so these read apart in psql.
    let (left, right) = (
        TenantId::new("a-b", "c").unwrap().schema_name(1),
        TenantId::new("a", "b-c").unwrap().schema_name(1),
    );
    assert!(left.starts_with("t_a_b__c_1_"), "{left}");
    assert!(right.starts_with("t_a__b_c_1_"), "{right}");
}

/// Ids that read the same in a schema name (case, `-` `.` `_`, a long shared prefix) are
/// different tenants with different names: the hash is of the whole key, as given.
#[test]
fn ids_that_read_the_same_get_different_names() {
    let prefix = "x".repeat(100);
    let owned = |keys: &[&str]| keys.iter().map(|key| (*key).to_owned()).collect::<Vec<_>>();
    let groups = [
        owned(&["Acme/x", "acme/x", "ACME/x", "aCme/x"]),
        owned(&["a-b/c", "a.b/c", "a_b/c", "A-B/c"]),
        vec![
            format!("{prefix}a/{prefix}"),
            format!("{prefix}b/{prefix}"),
            format!("{prefix}/{prefix}a"),
        ],
        vec![format!("{UUID}/main"), format!("{UUID_UPPER}/main")],
    ];
    for group in groups {
        let ids: Vec<TenantId> = group
            .iter()
            .map(|key| TenantId::parse(key).expect("valid"))
            .collect();
        let readable: std::collections::HashSet<String> = ids
            .iter()
            .map(|id| {
                let name = id.schema_name(1);
                name[..name.len() - 10].to_owned()
            })
            .collect();
        assert_eq!(readable.len(), 1, "the same readable name: {ids:?}");
        let names: std::collections::HashSet<String> =
            ids.iter().map(|id| id.schema_name(1)).collect();
        assert_eq!(names.len(), ids.len(), "distinct names: {names:?}");
    }
}

/// Defence in depth: even SQL that bypasses the Rust type cannot store a hostile id.
#[tokio::test]
async fn the_control_plane_refuses_hostile_ids_too() {
    let db = TestDatabase::create().await.expect("test database");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup");
    let long = "a".repeat(129);
    for (organization, ledger) in [
        ("a b", "l"),
        ("a'b", "l"),
        ("-x", "l"),
        ("_x", "l"),
        ("acme", ""),
        ("acme", "a/b"),
        (long.as_str(), "l"),
    ] {
        let key = format!("{organization}/{ledger}");
        let error = client
            .execute(
                "INSERT INTO pgtenant.tenants (key, organization, ledger) VALUES ($1, $2, $3)",
                &[&key, &organization, &ledger],
            )
            .await
            .expect_err("check constraint");
        assert_eq!(error.code().map(|c| c.code()), Some("23514"), "{key}");
        assert!(TenantId::new(organization, ledger).is_err(), "{key}");
    }
    let tenants: i64 = client
        .query_one("SELECT count(*) FROM pgtenant.tenants", &[])
        .await
        .unwrap()
        .get(0);
    let schemas: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 't\\_%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!((tenants, schemas), (0, 0), "nothing was created");
}

/// UUIDs, ULIDs, the longest ids and ids that differ in case only, end to end: created with
/// their migrations, written, read, handed off, forgotten and created again, swept.
#[tokio::test]
async fn long_and_mixed_case_ids_work_end_to_end() {
    let (db, mut admin) = support::database().await;
    let url = db.url().to_owned();
    let router = support::router(&url, "ids-a").await;
    let other = support::router(&url, "ids-b").await;
    let longest = "Q".repeat(MAX_ID_PART_LEN);
    let ids = [
        TenantId::new(UUID, "main").unwrap(),
        TenantId::new(UUID, UUID).unwrap(),
        TenantId::new(ULID, ULID).unwrap(),
        TenantId::new(&longest, &longest).unwrap(),
        TenantId::new("Acme", "x").unwrap(),
        TenantId::new("acme", "x").unwrap(),
        TenantId::new("acme.com", "org_2NxX.k").unwrap(),
    ];
    for (n, id) in ids.iter().enumerate() {
        let handle = router.open_or_create(id).await.expect("create");
        assert!(handle.created(), "{id}: a tenant of its own");
        assert!(handle.schema().len() <= 57, "{}", handle.schema());
        support::create_log(&handle).await;
        support::append(&handle, "ids", n as i64)
            .await
            .expect("write");
        // The schema exists and is the one the control plane records.
        let recorded: String = admin
            .query_one(
                "SELECT schema_name FROM pgtenant.tenants t
                  WHERE t.key = $1 AND to_regnamespace(t.schema_name) IS NOT NULL",
                &[&id.key()],
            )
            .await
            .expect("recorded schema")
            .get(0);
        assert_eq!(recorded, handle.schema());
        handle.handoff().await.expect("handoff");
        let there = other.open(id).await.expect("open elsewhere");
        let rows = support::count_rows(&there, "SELECT count(*) FROM log").await;
        assert_eq!(rows, 1, "{id}: its own row only");
        there.release().await.expect("release");
    }
    // Case matters: two tenants, two schemas.
    let upper = router.open(&ids[4]).await.expect("Acme/x");
    let lower = router.open(&ids[5]).await.expect("acme/x");
    assert_ne!(upper.schema(), lower.schema());
    // Forgotten, created again as a new life, swept.
    let forgotten = router.open(&ids[3]).await.expect("longest");
    let trash = forgotten.forget(ActiveWork::Refuse).await.expect("forget");
    assert!(trash.len() <= 63, "{trash}");
    let again = router.open_or_create(&ids[3]).await.expect("new life");
    assert_ne!(again.schema(), forgotten.schema());
    let report = pgtenant::admin::sweep(
        &mut admin,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep");
    assert_eq!(report.swept, vec![trash], "{report:?}");
    assert!(
        report.refused.is_empty() && report.unknown.is_empty(),
        "{report:?}"
    );
    support::assert_views_agree(&admin).await;
    router.close().await;
    other.close().await;
}

/// A tenant created under the first rules, by a replica of the previous release (control plane
/// V10, its SQL calls made by hand as that release made them): after the upgrade it keeps its
/// schema, opens, is written, forgotten and swept, and so are the schemas of its earlier lives
/// (trashed, and one left behind by a superseded owner under the first release's
/// single-underscore name).
#[tokio::test]
async fn a_tenant_of_the_first_rules_opens_is_forgotten_and_swept_as_before() {
    let db = TestDatabase::create().await.expect("test database");
    let mut admin = db.connect().await.expect("connect");
    support::control_plane_at(&mut admin, 10).await;
    let (organization, ledger) = ("acme-eu", "in-voices");
    let key = format!("{organization}/{ledger}");
    let session = db.connect().await.expect("a lease session");
    let (incarnation, secret) = support::register_by_hand(&session, "old-r").await;
    // One life as the previous release made it: acquire (creating), the schema by the first
    // rules, the tenant's table, schema_created.
    let life = || {
        let (session, key, secret) = (&session, key.clone(), secret.clone());
        async move {
            let epoch: i64 = session
                .query_one(
                    "SELECT epoch FROM pgtenant.acquire($1, $2, $3, 'old-r', $4, $5, true)",
                    &[&key, &organization, &ledger, &incarnation, &secret],
                )
                .await
                .expect("acquire")
                .get(0);
            let schema = first_rule_name(organization, ledger, epoch, "__");
            session
                .batch_execute(&format!(
                    "CREATE SCHEMA {schema};
                     CREATE TABLE {schema}.log (
                         epoch bigint NOT NULL, seq bigint NOT NULL, writer text NOT NULL,
                         seen_max_epoch bigint NOT NULL, PRIMARY KEY (writer, seq));
                     INSERT INTO {schema}.log VALUES ({epoch}, 1, 'old', 0)"
                ))
                .await
                .expect("schema");
            session
                .execute(
                    "SELECT pgtenant.schema_created($1, $2, 'old-r', $3, $4, $5, 0)",
                    &[&key, &epoch, &incarnation, &secret, &schema],
                )
                .await
                .expect("schema_created");
            (epoch, schema)
        }
    };
    let (first_epoch, first_schema) = life().await;
    let first_trash: String = session
        .query_one(
            "SELECT pgtenant.forget($1, $2, 'old-r', $3, $4)",
            &[&key, &first_epoch, &incarnation, &secret],
        )
        .await
        .expect("forget")
        .get(0);
    assert_eq!(first_trash, format!("trash_{first_schema}"));
    // What a superseded owner of the first life may have left: the first release's
    // single-underscore name, never recorded anywhere.
    let masked = first_rule_name(organization, ledger, first_epoch, "_");
    admin
        .batch_execute(&format!("CREATE SCHEMA {masked}"))
        .await
        .expect("masked schema");
    let (second_epoch, second_schema) = life().await;
    assert!(second_epoch > first_epoch);
    drop(session); // the old replica goes away: its tenant is free to take over

    let upgrade = pgtenant::setup(&mut admin).await.expect("upgrade");
    assert!(!upgrade.applied.is_empty());
    let router = support::router(db.url(), "new-r").await;
    let id = TenantId::new(organization, ledger).unwrap();
    let handle = support::take_over(&router, &id, Duration::from_secs(10)).await;
    assert_eq!(handle.schema(), second_schema, "its schema keeps its name");
    assert_eq!(
        support::count_rows(&handle, "SELECT count(*) FROM log").await,
        1
    );
    support::append(&handle, "new", 2).await.expect("write");
    assert_eq!(
        support::count_rows(&handle, "SELECT count(*) FROM log").await,
        2
    );
    let second_trash = handle.forget(ActiveWork::Refuse).await.expect("forget");
    assert_eq!(second_trash, format!("trash_{second_schema}"));
    let report = pgtenant::admin::sweep(
        &mut admin,
        &SweepOptions::with_retention(Duration::ZERO),
        |_, _| {},
    )
    .await
    .expect("sweep");
    let mut swept = report.swept.clone();
    swept.sort();
    let mut expected = vec![first_trash, second_trash, masked.clone()];
    expected.sort();
    assert_eq!(swept, expected, "{report:?}");
    assert_eq!(report.masked, vec![masked], "{report:?}");
    assert!(
        report.refused.is_empty() && report.unknown.is_empty(),
        "{report:?}"
    );
    router.close().await;
}
