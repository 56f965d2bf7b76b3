//! Statistics and units shared by the benchmark programs.
#![allow(dead_code)] // each benchmark uses a different part

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pgtenant::postgres::Client;
use pgtenant::{Router, TenantHandle, TenantId};
use pgtenant_testkit::TestDatabase;

/// How long a parked waiter waits for a handoff.
pub(crate) const WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time given to a waiter's first open attempt before checking it is parked.
pub(crate) const PARK_SLEEP: Duration = Duration::from_millis(20);

/// One timed handoff.
pub(crate) struct HandoffSample {
    /// The waiter's handle, at a higher epoch.
    pub new_handle: TenantHandle,
    /// From calling `handoff()` to `wait_for` returning the new handle.
    pub to_handle: Duration,
    /// How long the holder's `handoff()` call took (drain, then the release).
    pub handoff_call: Duration,
    /// When `handoff()` was called.
    pub began: Instant,
}

/// One handoff: the waiter parks in `wait_for`, then the holder hands off; the time runs from
/// the start of `handoff()` to `wait_for` returning the new handle.
pub(crate) async fn handoff_once(
    waiter: &Arc<Router>,
    id: &TenantId,
    holder: &TenantHandle,
) -> HandoffSample {
    let entered = Arc::new(AtomicBool::new(false));
    let task = {
        let (waiter, id, entered) = (waiter.clone(), id.clone(), entered.clone());
        tokio::spawn(async move {
            entered.store(true, Ordering::Release);
            let result = waiter.wait_for(&id, WAIT_TIMEOUT).await;
            (result, Instant::now())
        })
    };
    tokio::time::sleep(PARK_SLEEP).await;
    // Parked: the task entered wait_for, its first open attempt is over (no acquisition in
    // flight: it got LeaseHeld, the tenant being held) and it has not returned.
    let park_deadline = Instant::now() + Duration::from_secs(5);
    while !(entered.load(Ordering::Acquire) && waiter.summary().opening == 0) {
        assert!(Instant::now() < park_deadline, "the waiter never parked");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        !task.is_finished(),
        "wait_for returned before the handoff (the tenant was not held?)"
    );
    let began = Instant::now();
    holder.handoff().await.expect("handoff");
    let handoff_call = began.elapsed();
    let (result, returned) = task.await.expect("waiter task");
    let new_handle = result.expect("wait_for gets the tenant");
    assert!(new_handle.epoch() > holder.epoch(), "epoch did not advance");
    HandoffSample {
        new_handle,
        to_handle: returned.saturating_duration_since(began),
        handoff_call,
        began,
    }
}

/// A fresh database on 127.0.0.1 with the control plane set up, and an admin connection.
pub(crate) async fn fresh_database() -> (TestDatabase, Client) {
    let db = TestDatabase::create().await.expect("test database");
    let url = db.url();
    assert!(
        url.contains("@127.0.0.1:") || url.contains("@127.0.0.1/"),
        "this benchmark only connects to 127.0.0.1, got {url}"
    );
    let mut admin = db.connect().await.expect("connect");
    pgtenant::setup(&mut admin).await.expect("pgtenant::setup");
    (db, admin)
}

/// What a report says about the server it ran on.
pub(crate) struct ServerInfo {
    /// When the run started, by the server's clock (UTC, to the minute).
    pub date: String,
    /// `SELECT version()`.
    pub pg_version: String,
    /// The settings that move these numbers.
    pub settings: String,
}

/// The CPU's model name, from /proc/cpuinfo.
pub(crate) fn cpu_model() -> Option<String> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_owned())
        })
}

/// Reads [`ServerInfo`] from the server `admin` is connected to.
pub(crate) async fn server_info(admin: &Client) -> ServerInfo {
    let one = |sql: &'static str| async move {
        admin
            .query_one(sql, &[])
            .await
            .expect("server info")
            .get::<_, String>(0)
    };
    ServerInfo {
        date: one("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI \"UTC\"')").await,
        pg_version: one("SELECT version()").await,
        settings: one(
            "SELECT format('max_connections=%s, shared_buffers=%s, max_wal_size=%s, synchronous_commit=%s, fsync=%s',
                    current_setting('max_connections'), current_setting('shared_buffers'),
                    current_setting('max_wal_size'), current_setting('synchronous_commit'),
                    current_setting('fsync'))",
        )
        .await,
    }
}

/// Median; the mean of the two middle values for an even count.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// [`median`] of durations.
pub(crate) fn median_d(values: &[Duration]) -> Duration {
    let secs: Vec<f64> = values.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(median(&secs))
}

/// Nearest-rank percentile (`p` in 0..=100).
pub(crate) fn percentile_d(values: &[Duration], p: f64) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Milliseconds, for reports.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Mebibytes, for reports.
pub(crate) fn mib(bytes: i64) -> f64 {
    bytes as f64 / 1048576.0
}

/// CPU time used so far (user + system) by this process and by every process named `postgres`
/// on the machine (the server: its backends, WAL writer, checkpointer…), from /proc, in
/// seconds. /proc counts in USER_HZ ticks, 100 per second on every Linux ABI: 10 ms
/// resolution, fine over rounds of seconds. `None` where /proc is not Linux's.
pub(crate) fn cpu_seconds() -> Option<(f64, f64)> {
    fn ticks(stat: &str) -> Option<(String, u64)> {
        // comm is in parentheses and may hold spaces; the fields after it are space-separated.
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let comm = stat[open + 1..close].to_owned();
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some((comm, utime + stime))
    }
    const USER_HZ: f64 = 100.0;
    let own = ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?.1;
    let mut server = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
            if let Some((comm, t)) = ticks(&stat) {
                if comm == "postgres" {
                    server += t;
                }
            }
        }
    }
    Some((own as f64 / USER_HZ, server as f64 / USER_HZ))
}

/// The parent of a server backend (`SELECT pg_backend_pid()`): the postmaster of the server
/// this benchmark talks to, from /proc.
pub(crate) fn postmaster_of(backend_pid: i32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{backend_pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    stat[close + 2..].split(' ').nth(1)?.parse().ok()
}

/// Like [`cpu_seconds`], but the server side counts only the postmaster `postmaster` and its
/// children (the server under test), not other PostgreSQL servers on the same machine.
pub(crate) fn cpu_seconds_of(postmaster: u32) -> Option<(f64, f64)> {
    fn ticks(stat: &str) -> Option<(u32, u32, u64)> {
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let pid: u32 = stat[..open].trim().parse().ok()?;
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ppid: u32 = fields.get(1)?.parse().ok()?;
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some((pid, ppid, utime + stime))
    }
    const USER_HZ: f64 = 100.0;
    let own = ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?.2;
    let mut server = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
            if let Some((pid, ppid, t)) = ticks(&stat) {
                if pid == postmaster || ppid == postmaster {
                    server += t;
                }
            }
        }
    }
    Some((own as f64 / USER_HZ, server as f64 / USER_HZ))
}

/// The 1-, 5- and 15-minute load averages, from /proc/loadavg.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The source measured: git HEAD and how many files differ from it (the working tree is what
/// was compiled).
pub(crate) fn source_revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match (
        git(&["rev-parse", "--short", "HEAD"]),
        git(&["status", "--porcelain", "--untracked-files=no"]),
    ) {
        (Some(head), Some(status)) if status.is_empty() => format!("git {head}, clean"),
        (Some(head), Some(status)) => format!(
            "git {head} plus uncommitted changes to {} tracked files (the working tree as compiled)",
            status.lines().count()
        ),
        _ => "unknown (no git)".to_owned(),
    }
}

/// The value after `--name` on the command line, or `default` when absent or not a number.
pub(crate) fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|at| args.get(at + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A cheap deterministic pseudo-random sequence (xorshift64) for the benchmarks' choices.
pub(crate) fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}
