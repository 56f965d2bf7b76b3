//! What the server says on a data connection besides its replies (DESIGN G6, §5 "Hot path"):
//! the `ParameterStatus` messages that tell, without a statement, whether work ended its fenced
//! transaction itself.
//!
//! A fenced transaction sets `default_transaction_read_only` to `off` for itself (in the same
//! statement that pins `search_path`), over the data session's `on`. PostgreSQL (14+) reports
//! every change of that setting to the client before its next `ReadyForQuery`: `off` after the
//! pin, and `on` again as soon as the transaction ends, whoever ended it. So if the work
//! committed or rolled back the fenced transaction itself (and perhaps began another, even a
//! `READ WRITE` one), the connection has been told `on` by the time the work's last reply
//! arrived, and pgtenant rolls back instead of committing: no marker cursor, no statement.
//!
//! tokio-postgres keeps the reported values in its `Connection`, which the connection's driver
//! task owns. For the connections pgtenant opens itself, the connection is shared between the
//! driver and a [`Parameters`] reader; each data connection carries a token in its startup
//! options (`pgtenant.connection`) that finds its reader in this process's registry. A
//! connection without one (a pool the application built) or whose server or pooler does not
//! report the setting (checked once per connection) keeps the marker cursor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::sync::lock;

/// Reads a parameter's value as the server last reported it on one connection.
pub(crate) type Parameters = Arc<Reader>;

/// The setting a fenced transaction changes for itself: `on` in a data session, `off` inside
/// the fenced transaction.
pub(crate) const TRANSACTION_SIGNAL: &str = "default_transaction_read_only";

/// The custom setting that carries a connection's token (a startup option, which `RESET ALL`
/// keeps).
pub(crate) const TOKEN_SETTING: &str = "pgtenant.connection";

type Reader = dyn Fn(&str) -> Option<String> + Send + Sync;
type Readers = HashMap<String, Weak<Reader>>;
type Registry = Mutex<Readers>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// A new token for a connection about to be opened: unique in this process (the process id
/// keeps another process's tokens from matching).
pub(crate) fn new_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Registers an opened connection's reader under its token, for as long as the connection
/// lives (the registry holds it weakly).
pub(crate) fn register(token: String, parameters: &Parameters) {
    let mut map = lock(registry());
    // Connections come and go: forget the gone ones now and then.
    if map.len() > 64 && map.len().is_power_of_two() {
        map.retain(|_, reader| reader.strong_count() > 0);
    }
    map.insert(token, Arc::downgrade(parameters));
}

/// The reader of the connection that presented `token`, if it is one of this process's and
/// still open.
pub(crate) fn find(token: &str) -> Option<Parameters> {
    lock(registry()).get(token).and_then(Weak::upgrade)
}

/// The characteristics a fenced transaction begins with, said explicitly in its `BEGIN`: the
/// connection's defaults (startup options, role or database settings), never a session `SET`
/// of an earlier tenant's work, which the session reset undoes only after `BEGIN`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Characteristics {
    /// The default isolation level; None when the server named one this driver does not know.
    pub(crate) isolation: Option<tokio_postgres::IsolationLevel>,
    pub(crate) deferrable: bool,
}
