//! Names of test databases, which carry their creation time (the sweep reads it), and the
//! clock and nonces behind them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Every test database's name starts with this; the sweep relies on it.
pub(crate) const NAME_PREFIX: &str = "pgtenant_test_";

pub(crate) fn new_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{NAME_PREFIX}{}_{}_{}",
        unix_secs(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// When a test database was created, from its name.
pub(crate) fn created_at(name: &str) -> Option<u64> {
    name.strip_prefix(NAME_PREFIX)?
        .split('_')
        .next()?
        .parse()
        .ok()
}

/// 64 random bits, from the standard library's randomly keyed hasher (no extra dependency
/// for a test role's password).
pub(crate) fn new_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(unix_secs());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_creation_time() {
        let before = unix_secs();
        let a = new_name();
        let b = new_name();
        assert_ne!(a, b);
        let secs = created_at(&a).expect("parses");
        assert!(secs >= before && secs <= unix_secs());
        assert_eq!(created_at("pgtenant_test_x_1_2"), None);
        assert_eq!(created_at("other_1_2_3"), None);
    }
}
