//! Tenant-affine data connections (DESIGN §5 "Data sessions and session fencing", hot path):
//! a connection that just served a tenant's work is parked for that tenant instead of going
//! back to the pool, so the tenant's next work finds it clean and needs no session reset.
//!
//! deadpool hands out whichever idle connection comes first, so with one tenant per client most
//! transactions landed on a connection another tenant used last, and paid the session reset:
//! 40–80 µs of server CPU each (docs/benchmarks.md). Parking keeps at most half the pool, and a
//! parked connection is never idle at anyone's expense: a checkout that finds the pool empty
//! takes the least recently parked connection of another tenant (which then resets, as before)
//! rather than wait.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use deadpool_postgres::Object;

use crate::sync::lock;

/// Connections parked for the tenant they last served, least recently parked first.
pub(crate) struct Parking {
    parked: Mutex<Parked>,
    /// At most this many parked at once (half the pool, none of a pool of one): the rest stay
    /// in the pool for everything else that takes a connection (the control-plane calls).
    cap: usize,
}

#[derive(Default)]
struct Parked {
    by_tenant: HashMap<Arc<str>, Object>,
    order: VecDeque<Arc<str>>,
}

impl Parking {
    pub(crate) fn new(pool_size: usize) -> Parking {
        Parking {
            parked: Mutex::new(Parked::default()),
            cap: pool_size / 2,
        }
    }

    /// The connection parked for `tenant`, if one is and it is still open.
    pub(crate) fn take(&self, tenant: &str) -> Option<Object> {
        let object = {
            let mut parked = lock(&self.parked);
            let object = parked.by_tenant.remove(tenant)?;
            parked.order.retain(|parked| &**parked != tenant);
            object
        };
        (!object.is_closed()).then_some(object)
    }

    /// The least recently parked connection of any tenant: for a checkout that found the pool
    /// empty.
    pub(crate) fn steal(&self) -> Option<Object> {
        let mut parked = lock(&self.parked);
        while let Some(tenant) = parked.order.pop_front() {
            if let Some(object) = parked.by_tenant.remove(&tenant) {
                if !object.is_closed() {
                    return Some(object);
                }
            }
        }
        None
    }

    /// Parks `object`, clean for `tenant`; a connection it displaces (the tenant's previous
    /// one, or the least recently parked past the cap) goes back to the pool.
    pub(crate) fn park(&self, tenant: Arc<str>, object: Object) {
        if self.cap == 0 {
            // A pool of one parks nothing: straight back to the pool, no lock, no allocation.
            drop(object);
            return;
        }
        let displaced = {
            let mut parked = lock(&self.parked);
            let mut displaced = Vec::new();
            if let Some(previous) = parked.by_tenant.insert(tenant.clone(), object) {
                displaced.push(previous);
                parked.order.retain(|parked| *parked != tenant);
            }
            parked.order.push_back(tenant);
            while parked.by_tenant.len() > self.cap {
                let Some(oldest) = parked.order.pop_front() else {
                    break;
                };
                displaced.extend(parked.by_tenant.remove(&oldest));
            }
            displaced
        };
        // Back to the pool, outside the lock.
        drop(displaced);
    }

    /// Every parked connection back to the pool (the router closes).
    pub(crate) fn clear(&self) {
        let parked = std::mem::take(&mut *lock(&self.parked));
        drop(parked);
    }
}
