//! Noticing that this process itself did not run (DESIGN G9: "a paused replica resumes"; §5
//! "Heartbeat": the local deadline): a `SIGSTOP`, a suspended machine, CPU starvation, an async
//! runtime whose threads were blocked. Meanwhile every timer of the process passes its deadline,
//! and when it runs again they fire at once: a connect timeout, the stuck timeout of a statement
//! whose answer may be waiting in the socket, the lease's local deadline. Those errors must say
//! that the process was not running, not that the database did not answer (issue 27: after a
//! 30 s pause a healthy database was blamed for "not finishing a new connection within
//! connect_timeout").
//!
//! Each running router keeps a [`Ticker`], a task that notes the time every [`TICK`] in one
//! process-wide clock; a gap between two notes (by any ticker) longer than [`TICK`] + [`STALL`]
//! is a stall: no ticker ran, so the process did not. [`recent`] reports a stall that ended
//! within [`RECENT`], or one still under way as far as the tickers know (a timer that fired
//! late is often handled before any ticker has run again). Without a running router there is
//! no ticker, and nothing is reported.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often a ticker notes the time: 10 wake-ups a second per router, nothing measurable.
const TICK: Duration = Duration::from_millis(100);

/// A gap this much longer than a tick is a stall. Below it is scheduling noise: on the shared
/// 2-core development machine at a load average of 4 to 5 (other builds running), 898 ticks
/// over 90 s came at most 85 ms late (p99 6 ms).
const STALL: Duration = Duration::from_secs(1);

/// How long after a stall ended a timeout is still taken for its doing. A timer that passed its
/// deadline during the stall fires as soon as the process runs; 2 s leaves room for the
/// statement or connect it bounded to report.
const RECENT: Duration = Duration::from_secs(2);

/// Milliseconds since the first use, as the atomics hold them (0: never).
pub(crate) fn now_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    // Never 0 once running, so 0 can mean "never".
    u64::try_from(base.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The latest note of any ticker.
static LAST_TICK: AtomicU64 = AtomicU64::new(0);
/// Tickers running.
static TICKERS: AtomicUsize = AtomicUsize::new(0);
/// The last stall: when it ended, and how long it lasted (milliseconds).
static STALL_END: AtomicU64 = AtomicU64::new(0);
static STALL_LENGTH: AtomicU64 = AtomicU64::new(0);

/// Notes the time; records a stall when nothing was noted for longer than a tick and
/// [`STALL`].
fn tick() {
    let now = now_ms();
    let last = LAST_TICK.fetch_max(now, Ordering::AcqRel);
    let gap = now.saturating_sub(last);
    if last != 0 && gap > millis(TICK + STALL) {
        STALL_LENGTH.store(gap - millis(TICK), Ordering::Release);
        STALL_END.store(now, Ordering::Release);
        tracing::warn!(
            stalled_ms = gap - millis(TICK),
            "this process did not run for a while (stopped, suspended or starved of CPU)"
        );
    }
}

/// A router's ticker: noting the time while it lives. Dropping it stops the task.
pub(crate) struct Ticker {
    task: tokio::task::JoinHandle<()>,
}

/// Starts a ticker on the current tokio runtime.
pub(crate) fn ticker() -> Ticker {
    if TICKERS.fetch_add(1, Ordering::AcqRel) == 0 {
        // No ticker ran since the last one stopped: that gap is no stall.
        LAST_TICK.store(now_ms(), Ordering::Release);
    }
    let task = tokio::spawn(async {
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            tick();
        }
    });
    Ticker { task }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
        TICKERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long this process did not run, when it was not running just now: a stall that ended
/// within [`RECENT`], or one that no ticker has run since. None when no router runs.
pub(crate) fn recent() -> Option<Stalled> {
    if TICKERS.load(Ordering::Acquire) == 0 {
        return None;
    }
    let now = now_ms();
    let since_tick = now.saturating_sub(LAST_TICK.load(Ordering::Acquire));
    if since_tick > millis(TICK + STALL) {
        return Some(Stalled(Duration::from_millis(since_tick - millis(TICK))));
    }
    let end = STALL_END.load(Ordering::Acquire);
    if end != 0 && now.saturating_sub(end) <= millis(RECENT) {
        return Some(Stalled(Duration::from_millis(
            STALL_LENGTH.load(Ordering::Acquire),
        )));
    }
    None
}

/// How long this process did not run. Displays as "this process did not run for 27.9 s
/// (stopped, suspended or starved of CPU)".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stalled(pub(crate) Duration);

impl fmt::Display for Stalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this process did not run for {:.1} s (stopped, suspended or starved of CPU)",
            self.0.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runtime's only thread blocked for longer than a stall: the timeouts that pass
    /// meanwhile say that this process did not run, and the pool's and a statement's errors
    /// too; without a stall they blame the server, as before.
    #[test]
    fn errors_say_when_this_process_did_not_run() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let _ticker = ticker();
            // Two ticks: the ticker runs.
            tokio::time::sleep(TICK * 2).await;
            let stuck = crate::Error::stuck("commit tenant work", Duration::from_secs(1));
            assert_eq!(stuck.stalled(), None, "{stuck}");
            assert!(
                stuck.to_string().contains("the server did not answer"),
                "{stuck}"
            );

            // What SIGSTOP does to the runtime: nothing of it runs.
            std::thread::sleep(Duration::from_millis(2500));
            let stuck = crate::Error::stuck("commit tenant work", Duration::from_secs(1));
            let stalled = stuck.stalled().expect("a stall");
            assert!(stalled >= Duration::from_secs(2), "{stalled:?}");
            let message = stuck.to_string();
            assert!(
                message.contains("this process did not run for 2.")
                    && !message.contains("the server did not answer"),
                "{message}"
            );
            let pool = crate::error::pool_error("get a connection for tenant work")(
                deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Create),
            );
            assert!(pool.stalled().is_some(), "{pool}");
            assert!(
                pool.to_string().contains("did not run")
                    && !pool.to_string().contains("did not finish a new connection"),
                "{pool}"
            );
            // Once the ticker has run again the stall is still recent, for a while.
            tokio::time::sleep(TICK * 2).await;
            assert!(recent().is_some());
            tokio::time::sleep(RECENT + TICK * 2).await;
            assert_eq!(recent(), None, "a stall long past explains nothing");
        });
    }
}
