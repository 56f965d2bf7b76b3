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

use crate::error::{Error, Result as PgtenantResult};
use crate::wire::{Characteristics, Parameters, TOKEN_SETTING, TRANSACTION_SIGNAL};

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
    let rows = crate::db::call(
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
    crate::db::call(
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

/// `pgtenant.reset_session(NULL)`: the session as a fresh one, serving no tenant, so the next
/// fence on it scrubs it again (outside a transaction, or first in one that also acquires).
pub(crate) async fn reset_session(
    client: &impl tokio_postgres::GenericClient,
) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute("SELECT pgtenant.reset_session(NULL)")
        .await
}

/// What a connection's session defaults to, and whether its server reports the transaction
/// signal: the connection must be one pgtenant opened (its token finds the reader), report `on`
/// now, `off` once a transaction set it for itself, and `on` again after that transaction. A
/// pooler that forwards only some parameters, or a server before PostgreSQL 14, fails one of
/// these: the marker cursor then.
pub(crate) async fn probe(
    object: &Client,
) -> PgtenantResult<(Option<Parameters>, Characteristics)> {
    const CONTEXT: &str = "check what a data connection's server reports";
    let row = object
        .query_typed_one(
            "SELECT pg_catalog.current_setting($1, true),
                    (SELECT reset_val FROM pg_catalog.pg_settings
                      WHERE name = 'default_transaction_isolation'),
                    (SELECT reset_val FROM pg_catalog.pg_settings
                      WHERE name = 'default_transaction_deferrable')",
            &[(&TOKEN_SETTING, Type::TEXT)],
        )
        .await
        .map_err(Error::db(CONTEXT))?;
    let read = |row: &tokio_postgres::Row| -> Result<_, tokio_postgres::Error> {
        Ok((
            row.try_get::<_, Option<String>>(0)?,
            row.try_get::<_, Option<String>>(1)?,
            row.try_get::<_, Option<String>>(2)?,
        ))
    };
    let (token, isolation, deferrable) = read(&row).map_err(Error::db(CONTEXT))?;
    let characteristics = Characteristics {
        isolation: match isolation.as_deref() {
            Some("read committed") => Some(tokio_postgres::IsolationLevel::ReadCommitted),
            Some("repeatable read") => Some(tokio_postgres::IsolationLevel::RepeatableRead),
            Some("serializable") => Some(tokio_postgres::IsolationLevel::Serializable),
            Some("read uncommitted") => Some(tokio_postgres::IsolationLevel::ReadUncommitted),
            _ => None,
        },
        deferrable: deferrable.as_deref() == Some("on"),
    };
    let Some(reader) = token.as_deref().and_then(crate::wire::find) else {
        return Ok((None, characteristics));
    };
    let reported = |want: &str| reader(TRANSACTION_SIGNAL).as_deref() == Some(want);
    if !reported("on") {
        return Ok((None, characteristics));
    }
    let (begun, set) = tokio::join!(
        object.batch_execute("BEGIN"),
        object.query_typed(
            "SELECT pg_catalog.set_config($1, 'off', true)",
            &[(&TRANSACTION_SIGNAL, Type::TEXT)],
        ),
    );
    begun.map_err(Error::db(CONTEXT))?;
    let set = set.map(drop).map_err(Error::db(CONTEXT));
    let during = reported("off");
    object
        .batch_execute("ROLLBACK")
        .await
        .map_err(Error::db(CONTEXT))?;
    set?;
    Ok((
        (during && reported("on")).then_some(reader),
        characteristics,
    ))
}
