//! The watchdog: a shell process that removes a cluster's directory (stopping its postmaster)
//! once the test process is gone, however it ended.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Cleans up a cluster directory when its stdin closes, which happens when
/// the owning process exits in any way (even SIGKILL): a static cluster is
/// never dropped, and a killed test never runs `Drop`.
/// `$1` is the directory. It stops the postmaster named in `postmaster.pid`
/// (only if that process is a postgres) and removes the directory.
const WATCHDOG_SCRIPT: &str = r#"
trap '' HUP INT QUIT TERM PIPE
cat >/dev/null 2>&1
dir=$1
pidfile=$dir/data/postmaster.pid
if [ -f "$pidfile" ]; then
  pid=
  read -r pid < "$pidfile" 2>/dev/null
  case $pid in ''|*[!0-9]*) pid= ;; esac
  if [ -n "$pid" ] && [ "$(cat /proc/$pid/comm 2>/dev/null || ps -o comm= -p "$pid" 2>/dev/null)" = postgres ]; then
    kill -QUIT "$pid" 2>/dev/null
    i=0
    while [ -f "$pidfile" ] && [ $i -lt 100 ] && kill -0 "$pid" 2>/dev/null; do
      sleep 0.1
      i=$((i+1))
    done
  fi
fi
rm -rf "$dir"
"#;

pub(crate) struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    /// Closes stdin, which lets the watchdog finish, and reaps it so no zombie is left behind.
    /// Called once the directory is gone already, so it exits at once.
    pub(crate) fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Starts the watchdog of `dir`; `None` (with a warning) when `/bin/sh` cannot be started.
pub(crate) fn spawn_watchdog(dir: &Path) -> Option<Watchdog> {
    let spawned = Command::new("/bin/sh")
        .arg("-c")
        .arg(WATCHDOG_SCRIPT)
        .arg("pgtenant-testkit-watchdog")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Survives a Ctrl-C of the test run, so it can clean up after it.
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut child) => {
            let stdin = child.stdin.take();
            Some(Watchdog { child, stdin })
        }
        Err(e) => {
            tracing::warn!(error = %e, "no cleanup watchdog: /bin/sh could not be started; a killed test may leave its cluster behind");
            None
        }
    }
}
