//! The postmaster process: stopping it (escalating when it takes too long) and reading its log.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Sends `signal`, waits for the exit and escalates (SIGQUIT, then SIGKILL)
/// if postgres takes too long.
pub(crate) fn stop_child(mut child: Child, signal: libc::c_int) -> std::io::Result<ExitStatus> {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        child.kill()?;
        return child.wait();
    };
    for (signal, patience) in [
        (signal, Duration::from_secs(60)),
        (libc::SIGQUIT, Duration::from_secs(10)),
    ] {
        // SAFETY: kill has no memory-safety preconditions; `pid` is our own
        // unreaped child, so it cannot have been reused by another process.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    child.kill()?;
    child.wait()
}

/// The last lines of the server log from `offset` on.
pub(crate) fn read_log(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    let read = fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(())
    });
    if let Err(e) = read {
        return format!("(could not read {}: {e})", path.display());
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
