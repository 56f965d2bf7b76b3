//! Running the real `pgtenant` binary, as a user would.
#![allow(dead_code)] // each test file uses a part

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The binary under test. `PGTENANT_CLI_BIN` points the tests at another build, e.g. one of an
/// older commit, to check that a test fails without the fix it covers.
pub(crate) fn binary() -> PathBuf {
    std::env::var_os("PGTENANT_CLI_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pgtenant")))
}

/// The command with `args`, in an environment free of the caller's PostgreSQL settings.
pub(crate) fn command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(binary());
    command.args(args);
    for name in [
        "DATABASE_URL",
        "PGSSLROOTCERT",
        "PGSSLMODE",
        "PGCONNECT_TIMEOUT",
    ] {
        command.env_remove(name);
    }
    command
}

pub(crate) fn pgtenant(args: &[&str]) -> Output {
    command(args).output().expect("run pgtenant")
}

/// Runs `command`, killing it if it has not ended within `limit`: a test of a bound must not
/// hang when the bound is missing. `None` when it had to be killed.
pub(crate) async fn within(command: Command, limit: Duration) -> Option<Output> {
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().expect("run pgtenant");
    tokio::time::timeout(limit, child.wait_with_output())
        .await
        .ok()
        .map(|output| output.expect("wait for pgtenant"))
}

/// stdout and stderr together.
pub(crate) fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Asserts the run failed (not a usage error, not a panic) and said `expected`.
#[track_caller]
pub(crate) fn assert_fails_saying(output: &Output, expected: &str) {
    let shown = text(output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains(expected),
        "{expected:?} missing from:\n{shown}"
    );
    assert!(!shown.contains("panicked"), "{shown}");
}

/// Asserts clap refused the command line (exit status 2) and said `expected`.
#[track_caller]
pub(crate) fn assert_usage_error(output: &Output, expected: &str) {
    let shown = text(output);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(
        shown.contains(expected),
        "{expected:?} missing from:\n{shown}"
    );
    assert!(!shown.contains("panicked"), "{shown}");
}

/// `pgtenant setup` on `url`, which must succeed.
pub(crate) fn setup(url: &str) {
    let output = pgtenant(&["setup", "--database-url", url]);
    assert!(output.status.success(), "{}", text(&output));
}

/// JSON from a successful run.
#[track_caller]
pub(crate) fn json(args: &[&str]) -> serde_json::Value {
    let output = pgtenant(args);
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: not JSON:\n{}", text(&output)))
}
