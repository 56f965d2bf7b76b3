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

use crate::sync::{lock, PooledConnection};
use crate::wire::{Characteristics, Parameters};

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
    /// What a transaction for `tenant` on `object` must do; None the first time the data path
    /// sees the connection: then the connection is checked (`db::sessions::probe`, two round
    /// trips) and [`DataSessions::learn`] records what the check found.
    pub(crate) fn enter(&self, object: &Object, tenant: &Arc<str>) -> Option<Entered> {
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
                return Some(Entered {
                    signal: entry.signal.clone(),
                    characteristics: entry.characteristics,
                    reset,
                });
            }
        }
        None
    }

    /// Records what the check of a connection the data path had not seen found: a transaction
    /// on it resets the session first.
    pub(crate) fn learn(
        &self,
        object: &Object,
        signal: Option<Parameters>,
        characteristics: Characteristics,
    ) -> Entered {
        let checkout = Object::metrics(object).recycle_count;
        let id = Object::id(object);
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
        Entered {
            signal,
            characteristics,
            reset: true,
        }
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

fn hash(tenant: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(tenant)
}
