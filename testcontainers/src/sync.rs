//! The test kit's one poison-proof lock.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, also when a holder panicked: every value the kit guards (a child process, a
/// container handle, a list of role names) stays consistent across a panic, and a test that
/// panicked must still be able to clean up after itself.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
