//! Session fencing's seal (DESIGN §5 "Data sessions and session fencing", 2): before any
//! replica takes over a tenant whose owner incarnation is dead or expired, it seals that
//! incarnation and terminates every backend bound to it, waiting for each to exit; only then
//! does the epoch move. The seal runs in SQL (`pgtenant.seal_owner`, and the trigger
//! `seal_on_takeover` on the epoch's UPDATE), first in the acquiring transaction of
//! `acquire.rs` and `forget.rs`' restore: this file is what they send.

use tokio_postgres::types::{ToSql, Type};

use crate::state::bindings::TERMINATE_TIMEOUT;
use crate::credentials::{millis, Credentials};

/// Seals the tenant's dead or expired owner incarnation and terminates its data sessions, in the
/// acquiring transaction, right before `pgtenant.acquire` moves the epoch: (key, replica,
/// incarnation, secret, timeout ms).
const SEAL_SQL: &str = "SELECT pgtenant.seal_owner($1, $2, $3, $4, $5)";

/// The seal an acquisition (`acquire.rs`) or a restore (`forget.rs`) of `key` as
/// `credentials`' incarnation runs first in its transaction: [`SEAL_SQL`] and its parameters
/// (key, replica, incarnation, secret, terminate timeout ms), for `db::call_after`.
pub(crate) struct Seal<'a> {
    key: &'a str,
    replica: &'a str,
    incarnation: i64,
    secret: &'a str,
    terminate_ms: i64,
}

impl<'a> Seal<'a> {
    pub(crate) const SQL: &'static str = SEAL_SQL;

    pub(crate) fn new(key: &'a str, credentials: &'a Credentials) -> Self {
        Seal {
            key,
            replica: credentials.replica.as_str(),
            incarnation: credentials.incarnation.get(),
            secret: credentials.secret(),
            terminate_ms: i64::from(millis(TERMINATE_TIMEOUT)),
        }
    }

    pub(crate) fn params(&self) -> [(&(dyn ToSql + Sync), Type); 5] {
        [
            (&self.key, Type::TEXT),
            (&self.replica, Type::TEXT),
            (&self.incarnation, Type::INT8),
            (&self.secret, Type::TEXT),
            (&self.terminate_ms, Type::INT8),
        ]
    }
}
