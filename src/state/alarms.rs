//! Alarms in memory (DESIGN §5 "Alarms", G11): when each tenant's next alarm is due, as this
//! replica knows it (the clock the firing task sleeps on), and what one fenced transaction did to
//! its tenant's alarms (so that its commit can note it).
//!
//! A due time here is a "wake no later than": an early one costs one look at the tenant's
//! table, whose firing then says the truth; a late one would make an alarm late, so every
//! merge keeps the earlier time. Times are wall-clock (`SystemTime`), as the database stores
//! them; the database's own clock decides what is due when firing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use tokio::sync::Notify;

use crate::id::TenantId;
use crate::sync::lock;

/// One tenant's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Sleeping until `at`; `open`: the database said this replica should wake the tenant even
    /// if it does not hold it (free, or held by an incarnation that is over).
    Due { at: SystemTime, open: bool },
    /// A firing task works on the tenant; `later` is the earliest due time other transactions
    /// committed meanwhile.
    Firing { later: Option<SystemTime> },
}

/// The replica's alarm clock: each tenant's next due time, and a wake-up for the firing task
/// when an earlier one arrives.
#[derive(Default)]
pub(crate) struct AlarmClock {
    slots: Mutex<HashMap<TenantId, Slot>>,
    wake: Notify,
}

/// A tenant whose alarms are due, taken by the firing task.
pub(crate) struct DueTenant {
    pub(crate) id: TenantId,
    /// Open it when it is not held here (the database said so).
    pub(crate) open: bool,
}

fn earlier(a: Option<SystemTime>, b: Option<SystemTime>) -> Option<SystemTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl AlarmClock {
    /// A transaction of a tenant held here committed a change to its alarms, after which its
    /// next pending alarm is due at `next` (None: none pending).
    pub(crate) fn committed(&self, id: &TenantId, next: Option<SystemTime>) {
        let mut slots = lock(&self.slots);
        match slots.get_mut(id) {
            Some(Slot::Firing { later }) => *later = earlier(*later, next),
            Some(Slot::Due { at, .. }) => {
                if let Some(next) = next.filter(|next| next < at) {
                    *at = next;
                    drop(slots);
                    self.wake.notify_one();
                }
            }
            None => {
                if let Some(at) = next {
                    slots.insert(id.clone(), Slot::Due { at, open: false });
                    drop(slots);
                    self.wake.notify_one();
                }
            }
        }
    }

    /// The database says `id`'s next alarm is due at `at` and this replica should fire it.
    pub(crate) fn hinted(&self, id: &TenantId, at: SystemTime) {
        let mut slots = lock(&self.slots);
        match slots.get_mut(id) {
            Some(Slot::Firing { .. }) => {}
            Some(Slot::Due { at: mine, open }) => {
                *open = true;
                if at < *mine {
                    *mine = at;
                }
            }
            None => {
                slots.insert(id.clone(), Slot::Due { at, open: true });
            }
        }
    }

    /// The earliest due time of a tenant no task fires now.
    pub(crate) fn earliest(&self) -> Option<SystemTime> {
        lock(&self.slots)
            .values()
            .filter_map(|slot| match slot {
                Slot::Due { at, .. } => Some(*at),
                Slot::Firing { .. } => None,
            })
            .min()
    }

    /// The tenants due at `now`, at most `limit`, each marked as being fired.
    pub(crate) fn take_due(&self, now: SystemTime, limit: usize) -> Vec<DueTenant> {
        let mut slots = lock(&self.slots);
        let mut due: Vec<(SystemTime, DueTenant)> = slots
            .iter()
            .filter_map(|(id, slot)| match slot {
                Slot::Due { at, open } if *at <= now => Some((
                    *at,
                    DueTenant {
                        id: id.clone(),
                        open: *open,
                    },
                )),
                _ => None,
            })
            .collect();
        due.sort_by_key(|(at, _)| *at);
        due.truncate(limit);
        for (_, tenant) in &due {
            slots.insert(tenant.id.clone(), Slot::Firing { later: None });
        }
        due.into_iter().map(|(_, tenant)| tenant).collect()
    }

    /// The firing task is done with `id`: its next alarm is due at `next` as the firing's last
    /// transaction saw it (None: none, or not this replica's to fire).
    pub(crate) fn fired(&self, id: &TenantId, next: Option<SystemTime>) {
        let mut slots = lock(&self.slots);
        let later = match slots.remove(id) {
            Some(Slot::Firing { later }) => later,
            Some(Slot::Due { at, .. }) => Some(at),
            None => None,
        };
        if let Some(at) = earlier(next, later) {
            slots.insert(id.clone(), Slot::Due { at, open: false });
        }
        drop(slots);
        self.wake.notify_one();
    }

    /// Resolves when an earlier due time or a finished firing arrived since the last call.
    pub(crate) async fn changed(&self) {
        self.wake.notified().await;
    }

    /// Tenants with a slot, for tests and status.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.slots).len()
    }
}

/// What one fenced transaction did to its tenant's alarms (`Tx::schedule_alarm` and the rest):
/// whether it took the alarm lock and made sure of the table, and whether it changed anything,
/// so that the commit notes the tenant's hint; and, once noted, the next due time.
#[derive(Default)]
pub(crate) struct TxAlarms {
    /// Held across the statements that prepare a transaction's first alarm change (the lock,
    /// the table), so that two calls on one transaction prepare it once.
    pub(crate) prepared: tokio::sync::Mutex<Prepared>,
    touched: AtomicBool,
    /// The firing task's own transaction: its commit tells the firing task, not the clock.
    pub(crate) firing: bool,
    noted: Mutex<Option<Option<SystemTime>>>,
}

/// What a transaction already did for its alarms.
#[derive(Default)]
pub(crate) struct Prepared {
    /// The alarm lock is held.
    pub(crate) locked: bool,
    /// The table was made sure of.
    pub(crate) table: bool,
}

impl TxAlarms {
    /// Notes of the firing task's transaction.
    pub(crate) fn firing() -> TxAlarms {
        TxAlarms {
            firing: true,
            ..TxAlarms::default()
        }
    }

    /// This transaction changed (or looked at, under the lock) the tenant's alarms.
    pub(crate) fn touch(&self) {
        self.touched.store(true, Ordering::Release);
    }

    pub(crate) fn touched(&self) -> bool {
        self.touched.load(Ordering::Acquire)
    }

    /// The next due time the transaction's note computed.
    pub(crate) fn set_noted(&self, next: Option<SystemTime>) {
        *lock(&self.noted) = Some(next);
    }

    /// The note's next due time: None when the transaction noted nothing.
    pub(crate) fn noted(&self) -> Option<Option<SystemTime>> {
        *lock(&self.noted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(name: &str) -> TenantId {
        TenantId::new("acme", name).expect("id")
    }

    #[test]
    fn the_earlier_time_wins_and_a_firing_replaces_its_slot() {
        let clock = AlarmClock::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let a = id("a");
        clock.committed(&a, Some(t0 + Duration::from_secs(5)));
        clock.committed(&a, Some(t0 + Duration::from_secs(9)));
        assert_eq!(clock.earliest(), Some(t0 + Duration::from_secs(5)));
        assert!(clock.take_due(t0, 10).is_empty());
        let due = clock.take_due(t0 + Duration::from_secs(5), 10);
        assert_eq!(due.len(), 1);
        assert!(!due[0].open);
        assert_eq!(clock.earliest(), None, "being fired");
        // Another transaction commits meanwhile: kept for after the firing.
        clock.committed(&a, Some(t0 + Duration::from_secs(7)));
        clock.fired(&a, Some(t0 + Duration::from_secs(8)));
        assert_eq!(clock.earliest(), Some(t0 + Duration::from_secs(7)));
        let _ = clock.take_due(t0 + Duration::from_secs(7), 10);
        clock.fired(&a, None);
        assert_eq!(clock.len(), 0);
    }

    #[test]
    fn a_hint_may_open() {
        let clock = AlarmClock::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        clock.hinted(&id("b"), t0);
        let due = clock.take_due(t0, 10);
        assert!(due[0].open);
    }
}
