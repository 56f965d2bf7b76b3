//! A cluster's temporary directory: its name, the file naming its owner, its making. The
//! sweep of leftovers (`sweep.rs`) reads the same name and file, so they live here, below both.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cluster::run_as::RunAs;
use crate::error::TestkitError;

/// Temporary directories are named `<TEMP_PREFIX><pid>-<n>`; the sweep of
/// leftovers relies on it.
pub(crate) const TEMP_PREFIX: &str = "pgtenant-testkit-";

/// The file in a temporary directory naming the process that made it, so a
/// sweep never removes the directory of a live test process.
pub(crate) const OWNER_FILE: &str = "owner.pid";

/// A new directory `<TEMP_PREFIX><pid>-<n>` in the temp dir, readable by `run_as` only.
pub(crate) fn make_temp_dir(run_as: Option<&RunAs>) -> Result<PathBuf, TestkitError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let parent = std::env::temp_dir();
    let pid = std::process::id();
    // A leftover of a dead process with our pid may exist; take the next name.
    let dir = loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("{TEMP_PREFIX}{pid}-{n}"));
        match fs::create_dir(&dir) {
            Ok(()) => break dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => continue,
            Err(e) => return Err(TestkitError::io(format!("creating {}", dir.display()), e)),
        }
    };
    let setup = || -> std::io::Result<()> {
        fs::write(dir.join(OWNER_FILE), pid.to_string())?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        if let Some(user) = run_as {
            std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid))?;
        }
        Ok(())
    };
    if let Err(e) = setup() {
        let _ = fs::remove_dir_all(&dir);
        return Err(TestkitError::io(format!("preparing {}", dir.display()), e));
    }
    Ok(dir)
}
