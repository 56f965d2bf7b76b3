//! What the data path knows of each pooled data connection (DESIGN G6, §5 "Hot path"), so that
//! a session-fenced transaction sends what an unfenced schema-per-tenant one sends:
//!
//! * whether the connection's server reports the transaction signal (`wire.rs`), checked once
//!   per connection: then the end of the fenced transaction is read from `ParameterStatus`,
//!   with no marker cursor;
//! * the tenant it is clean for: the last tenant whose transaction committed on it, with no
//!   other user of the connection since (deadpool counts every checkout). The session reset
//!   (`pgtenant.reset_session`) runs, pipelined in the transaction, only when that changes: a
//!   tenant's own session state reaching the same tenant's next transaction is not a G6 leak,
//!   reaching the next tenant is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::{Object, ObjectId};
use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::sync::{lock, PooledConnection};
use crate::wire::{Parameters, TOKEN_SETTING, TRANSACTION_SIGNAL};

/// One pooled connection as the data path last left it.
struct Known {
    connection: PooledConnection,
    /// The transaction signal's reader; None: the connection keeps the marker cursor.
    signal: Option<Parameters>,
    /// The transaction characteristics its session would reset to.
    characteristics: Characteristics,
    /// The tenant whose session state alone may be on it.
    clean_for: Option<Arc<str>>,
    /// deadpool's checkout count when the data path last took it.
    checkout: usize,
    /// The distinct tenants it served (hashed keys), for the memory bound.
    served: std::collections::HashSet<u64>,
}

/// The data path's knowledge of this router's pooled connections, by pool object.
#[derive(Default)]
pub(crate) struct DataSessions {
    known: Mutex<HashMap<ObjectId, Known>>,
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

/// How a transaction on one connection enters its tenant.
pub(crate) struct Entered {
    /// Where the server reports the transaction's end; None: the marker cursor.
    pub(crate) signal: Option<Parameters>,
    /// What its `BEGIN` says.
    pub(crate) characteristics: Characteristics,
    /// Whether another user's session state may be on the connection: reset it first.
    pub(crate) reset: bool,
}

impl DataSessions {
    /// What a transaction for `tenant` on `object` must do: one check of the connection the
    /// first time the data path sees it (two round trips), nothing after.
    pub(crate) async fn enter(&self, object: &Object, tenant: &Arc<str>) -> Result<Entered> {
        let checkout = Object::metrics(object).recycle_count;
        let id = Object::id(object);
        {
            let mut known = lock(&self.known);
            if let Some(entry) = known
                .get_mut(&id)
                .filter(|entry| entry.connection.is(object))
            {
                // The same checkout (a guard's second transaction) or the next one: nobody
                // else used the connection in between.
                let alone = checkout == entry.checkout || checkout == entry.checkout + 1;
                let reset = !alone || entry.clean_for.as_deref() != Some(&**tenant);
                entry.checkout = checkout;
                if reset {
                    // Until a transaction for this tenant commits after the reset, the
                    // connection is clean for nobody (a rolled back reset is undone).
                    entry.clean_for = None;
                }
                return Ok(Entered {
                    signal: entry.signal.clone(),
                    characteristics: entry.characteristics,
                    reset,
                });
            }
        }
        let (signal, characteristics) = probe(object).await?;
        let mut known = lock(&self.known);
        if known.len() > 64 && known.len().is_power_of_two() {
            known.retain(|_, entry| !entry.connection.is_gone());
        }
        known.insert(
            id,
            Known {
                connection: PooledConnection::of(object),
                signal: signal.clone(),
                characteristics,
                clean_for: None,
                checkout,
                served: std::collections::HashSet::new(),
            },
        );
        Ok(Entered {
            signal,
            characteristics,
            reset: true,
        })
    }

    /// A transaction for `tenant` committed on connection `object`: it is clean for that
    /// tenant. True when the connection has now served more than `max_tenants` distinct
    /// tenants and should be closed rather than pooled
    /// ([`RouterOptions::max_tenants_per_connection`](crate::RouterOptions::max_tenants_per_connection)).
    pub(crate) fn committed(
        &self,
        object: ObjectId,
        tenant: &Arc<str>,
        max_tenants: usize,
    ) -> bool {
        let mut known = lock(&self.known);
        let Some(entry) = known.get_mut(&object) else {
            return false;
        };
        entry.clean_for = Some(tenant.clone());
        entry.served.insert(hash(tenant));
        if entry.served.len() <= max_tenants {
            return false;
        }
        known.remove(&object);
        true
    }
}

/// What a connection's session defaults to, and whether its server reports the transaction
/// signal: the connection must be one pgtenant opened (its token finds the reader), report `on`
/// now, `off` once a transaction set it for itself, and `on` again after that transaction. A
/// pooler that forwards only some parameters, or a server before PostgreSQL 14, fails one of
/// these: the marker cursor then.
async fn probe(object: &Object) -> Result<(Option<Parameters>, Characteristics)> {
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
    let read = |row: &tokio_postgres::Row| -> std::result::Result<_, tokio_postgres::Error> {
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

fn hash(tenant: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(tenant)
}
