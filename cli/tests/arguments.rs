//! The command line itself: what is refused before any connection, and how.

mod common;

use common::{assert_fails_saying, assert_usage_error, command, pgtenant, text};

/// Options belong to their command: one command's options are refused by another.
#[test]
fn options_belong_to_their_command() {
    let mixed = pgtenant(&["setup", "--owner", "bob", "--retention", "3x"]);
    assert_usage_error(&mixed, "unexpected argument '--owner'");
    assert_usage_error(&pgtenant(&["trash", "--retention", "7d"]), "--retention");
    assert_usage_error(&pgtenant(&["sweep", "--dir", "x"]), "--dir");
    assert_usage_error(&pgtenant(&["frobnicate"]), "unrecognized subcommand");
    assert_usage_error(
        &pgtenant(&["tenants", "--quarantined", "--healthy"]),
        "cannot be used with",
    );
    assert_usage_error(&pgtenant(&["show"]), "ORG/LEDGER");
    assert_usage_error(&pgtenant(&["migrate"]), "--dir");
}

#[test]
fn version_and_help() {
    let version = pgtenant(&["--version"]);
    assert!(version.status.success(), "{}", text(&version));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("pgtenant {}", env!("CARGO_PKG_VERSION"))
    );

    let help = pgtenant(&["--help"]);
    assert!(help.status.success(), "{}", text(&help));
    for command in [
        "setup", "status", "tenants", "show", "trash", "sweep", "migrate", "clear", "alarms",
    ] {
        assert!(text(&help).contains(command), "{command}: {}", text(&help));
    }
    // Each command's help has its own options, and only those.
    let tenants = text(&pgtenant(&["tenants", "--help"]));
    assert!(
        tenants.contains("--quarantined") && tenants.contains("--after"),
        "{tenants}"
    );
    assert!(!tenants.contains("--retention"), "{tenants}");
    let sweep = text(&pgtenant(&["help", "sweep"]));
    assert!(
        sweep.contains("--retention") && sweep.contains("[default: 7d]"),
        "{sweep}"
    );
    assert!(!sweep.contains("--owner"), "{sweep}");
}

/// Durations and numbers are checked by the parser: nonsense and huge values are usage errors,
/// never a panic or an overflow later on.
#[test]
fn durations_and_numbers_are_checked_up_front() {
    for retention in [
        "soon",
        "3x",
        "7",
        "-1d",
        "1.5h",
        "7 d",
        "36501d",
        "99999999999999999999d",
        "18446744073709551615s",
        "213503982334601d",
    ] {
        assert_usage_error(
            &pgtenant(&["sweep", &format!("--retention={retention}")]),
            &format!("invalid value '{retention}' for '--retention"),
        );
    }
    for timeout in ["0s", "2h", "18446744073709551615d", "forever"] {
        assert_usage_error(
            &pgtenant(&["status", "--connect-timeout", timeout]),
            "--connect-timeout",
        );
    }
    for args in [
        &["tenants", "--limit", "0"][..],
        &["tenants", "--limit", "10001"],
        &["tenants", "--limit", "99999999999999999999999"],
        &["tenants", "--behind=-1"],
        &["tenants", "--behind", "2147483648"],
        &["tenants", "--state", "nonsense"],
        &["tenants", "--after", "not a tenant"],
        &["migrate", "--dir", "x", "--concurrency", "0"],
        &["migrate", "--dir", "x", "--concurrency", "65536"],
        &["migrate", "--dir", "x", "--max-failures", "0"],
    ] {
        assert_usage_error(&pgtenant(args), "invalid value");
    }
    let hostile = pgtenant(&["show", "acme/x'; DROP SCHEMA pgtenant; --"]);
    assert_usage_error(&hostile, "not allowed");
}

/// `DATABASE_URL=` (empty) is no database, as if unset.
#[test]
fn an_empty_database_url_counts_as_unset() {
    for (variable, flag) in [(Some(""), None), (Some("   "), None), (None, Some(""))] {
        let mut run = command(["status"]);
        if let Some(value) = variable {
            run.env("DATABASE_URL", value);
        }
        if let Some(value) = flag {
            run.args(["--database-url", value]);
        }
        let output = run.output().expect("run pgtenant");
        assert_fails_saying(&output, "no database: pass --database-url");
    }
}

/// A wrong part of the connection string is named, with what is accepted, before anything
/// is tried.
#[test]
fn a_bad_connection_string_says_which_part_is_wrong() {
    for url in [
        "postgres://postgres@127.0.0.1:99999/app",
        "postgres://postgres@127.0.0.1/app?port=99999",
        "host=127.0.0.1 port=99999 dbname=app",
    ] {
        let output = pgtenant(&["status", "--database-url", url]);
        assert_fails_saying(&output, "port \"99999\" is not a TCP port");
        assert_fails_saying(&output, "1 to 65535");
    }
    for url in [
        "postgres://postgres@127.0.0.1/app?sslmode=bogus",
        "host=127.0.0.1 sslmode=bogus",
    ] {
        let output = pgtenant(&["status", "--database-url", url]);
        assert_fails_saying(&output, "sslmode=\"bogus\" is not an sslmode");
        assert_fails_saying(
            &output,
            "disable, allow, prefer, require, verify-ca or verify-full",
        );
    }
    let mut bad_env = command([
        "status",
        "--database-url",
        "postgres://postgres@127.0.0.1/app",
    ]);
    bad_env.env("PGSSLMODE", "sometimes");
    assert_fails_saying(&bad_env.output().expect("run"), "PGSSLMODE");
    assert_fails_saying(
        &pgtenant(&["status", "--database-url", "postgres://h/app?frobnicate=1"]),
        "frobnicate",
    );
}

/// Without the `demo` feature the binary has no demo, and says how to run it.
#[cfg(not(feature = "demo"))]
#[test]
fn the_shipped_binary_points_to_the_demo() {
    let output = pgtenant(&["demo"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("cargo run -p pgtenant-cli --features demo -- demo"),
        "{}",
        text(&output)
    );
}
