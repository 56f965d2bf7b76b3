//! Session fencing's control-plane calls (DESIGN §5 "Session fencing"): bind, seal, terminate,
//! whether this role can terminate sessions, and the session reset every pooled use starts with.
//!
//! The seal (DESIGN §5 "Data sessions and session fencing", 2): before any replica takes over
//! a tenant whose owner incarnation is dead or expired, it seals that incarnation and
//! terminates every backend bound to it, waiting for each to exit; only then does the epoch
//! move. It runs in SQL (`pgtenant.seal_owner`, and the trigger `seal_on_takeover` on the
//! epoch's UPDATE), first in `pgtenant.acquire` and before a restore (`tenants.rs`).

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::credentials::{millis, Credentials};

/// How long a seal or a termination of work in flight waits for each terminated backend to
/// exit: a backend that does not exit in time fails the acquisition or the voluntary end
/// (retryably) rather than let the epoch move, or the lease go, under it.
pub(crate) const TERMINATE_TIMEOUT: Duration = Duration::from_secs(5);

/// Seals the tenant's dead or expired owner incarnation and terminates its data sessions, in the
/// acquiring transaction, right before the epoch moves: (key, replica, incarnation, secret,
/// timeout ms).
const SEAL_SQL: &str = "SELECT pgtenant.seal_owner($1, $2, $3, $4, $5)";

/// The seal a restore of `key` as `credentials`' incarnation runs first in its transaction.
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

/// `pgtenant.bind`: binds this data session to the credentials' incarnation; its backend pid.
pub(crate) async fn bind(
    client: &Client,
    credentials: &Credentials,
) -> Result<i32, tokio_postgres::Error> {
    let (secret, incarnation) = (credentials.secret(), credentials.incarnation.get());
    let rows = super::call(
        client,
        "SELECT pgtenant.bind($1, $2, $3)",
        &[
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
        ],
    )
    .await?;
    match rows.first() {
        Some(row) => row.try_get(0),
        None => Ok(0),
    }
}

/// `pgtenant.terminate_work`: terminates these backends of this incarnation's own work and
/// waits for each to exit.
pub(crate) async fn terminate_work(
    client: &Client,
    credentials: &Credentials,
    pids: &[i32],
) -> Result<(), tokio_postgres::Error> {
    let (secret, incarnation) = (credentials.secret(), credentials.incarnation.get());
    let timeout = i64::from(millis(TERMINATE_TIMEOUT));
    super::call(
        client,
        "SELECT pgtenant.terminate_work($1, $2, $3, $4, $5)",
        &[
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&pids, Type::INT4_ARRAY),
            (&timeout, Type::INT8),
        ],
    )
    .await
    .map(drop)
}

/// `pgtenant.reset_session(NULL)` outside any transaction: the session as a fresh one, serving
/// no tenant, so the next fence on it scrubs it again.
pub(crate) async fn reset_session(client: &Client) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute("SELECT pgtenant.reset_session(NULL)")
        .await
}
