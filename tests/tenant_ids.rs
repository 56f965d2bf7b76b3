//! G7 for tenant ids: hostile input is refused with the rule it broke, before any SQL.

use pgtenant::{IdPart, IdRule, TenantId};
use pgtenant_testkit::TestDatabase;

fn rule_of(organization: &str, ledger: &str) -> (IdPart, IdRule) {
    let error = TenantId::new(organization, ledger).expect_err("must be refused");
    let message = error.to_string();
    assert!(
        message.contains("lowercase") && message.contains(&error.part.to_string()),
        "the message says what to do: {message}"
    );
    assert!(
        message.len() < 400,
        "bounded message for {} bytes of input",
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
            "pg_catalog",
            "l",
            Organization,
            IdRule::BadChar { found: '_', at: 2 },
        ),
        (
            "Acme",
            "l",
            Organization,
            IdRule::BadFirstChar { found: 'A' },
        ),
        (
            "acme",
            "ledGer",
            Ledger,
            IdRule::BadChar { found: 'G', at: 3 },
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
        ("acme", "a/b", Ledger, IdRule::BadChar { found: '/', at: 1 }),
        ("acme", " l", Ledger, IdRule::BadFirstChar { found: ' ' }),
        (&long, "l", Organization, IdRule::TooLong { len: 10_000 }),
        ("acme", &long[..31], Ledger, IdRule::TooLong { len: 31 }),
    ];
    for (organization, ledger, part, rule) in cases {
        assert_eq!(
            rule_of(organization, ledger),
            (part, rule),
            "{organization:?}/{ledger:?}"
        );
    }
    assert!(
        TenantId::new(&long[..30], &long[..30]).is_ok(),
        "30 bytes is the limit, inclusive"
    );
    assert!(TenantId::new("0", "9-x").is_ok());
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
    assert!(serde_json::from_str::<TenantId>("\"Acme/x\"").is_err());
}

#[test]
fn schema_names_follow_the_rules() {
    let ids = [
        TenantId::new("a", "b").unwrap(),
        TenantId::new("pg", "x").unwrap(),
        TenantId::new(&"z".repeat(30), &"9".repeat(30)).unwrap(),
        TenantId::new("acme-eu", "in-voices").unwrap(),
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
    // The double underscore parts organization from ledger, so these read apart in psql.
    let (left, right) = (
        TenantId::new("a-b", "c").unwrap().schema_name(1),
        TenantId::new("a", "b-c").unwrap().schema_name(1),
    );
    assert!(left.starts_with("t_a_b__c_1_"), "{left}");
    assert!(right.starts_with("t_a__b_c_1_"), "{right}");
}

/// Defence in depth: even SQL that bypasses the Rust type cannot store a hostile id.
#[tokio::test]
async fn the_control_plane_refuses_hostile_ids_too() {
    let db = TestDatabase::create().await.expect("test database");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup");
    for (organization, ledger) in [("Acme", "l"), ("a'b", "l"), ("pg_x", "l"), ("acme", "")] {
        let key = format!("{organization}/{ledger}");
        let error = client
            .execute(
                "INSERT INTO pgtenant.tenants (key, organization, ledger) VALUES ($1, $2, $3)",
                &[&key, &organization, &ledger],
            )
            .await
            .expect_err("check constraint");
        assert_eq!(error.code().map(|c| c.code()), Some("23514"), "{key}");
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
