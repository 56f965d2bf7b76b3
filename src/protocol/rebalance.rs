//! Rebalancing (DESIGN §5 "Placement"): with [`RouterOptions::placement`](crate::RouterOptions::placement)
//! on, each replica hands the tenants it holds whose home is another replica straight to that
//! home (a directed handoff, `handoff.rs`), and opens at once what another replica reserved
//! for it (`open.rs`).
//!
//! A home is computed in PostgreSQL (`pgtenant.placement_moves`, weighted rendezvous hashing)
//! among the live replicas that have been alive, in their current incarnation, for
//! `placement_stable_for`, this replica always included: a joiner receives nothing until it is
//! stable, and one that restarts or flaps within the window receives nothing at all. The
//! members (ids, weights, stable or not) are read every [`PERIOD`]; the moves are looked for
//! when they change, while a round found more than it could move, every [`RECHECK`] when a
//! tenant was opened here (on demand, perhaps away from its home) or a move failed since the
//! last look, and every [`FULL_RECHECK`] regardless. A round moves at most
//! `placement_moves_per_second × PERIOD` tenants, [`LANES`] at a time, each drained first like
//! any handoff (a busy tenant whose drain times out stays, and is tried again at the next
//! look).
//!
//! A tenant still held by an incarnation that is over (a crash, a kill, a restart under the
//! same id) is taken over by its home among the live replicas, and by no other
//! (`pgtenant.orphaned_homes`, looked for with the moves): one acquisition per tenant, however
//! many replicas notice the death, and every tenant served again without waiting for a request.
//!
//! The receiving side: a release reserved for this replica NOTIFYs `pgtenant_reserved` with
//! its id (control plane V16), and this task opens what `pgtenant.reserved_for` lists, so a
//! moved tenant is served again within milliseconds rather than at its next request. A forged
//! notice costs one indexed read: only what is really reserved here is opened. The reads also
//! run every [`PICKUP_EVERY`] in case a notice was missed (the lease session reconnecting).
//! What this task opens unasked, reserved or orphaned, it acquires in batches
//! (`open::open_many`, `pgtenant.acquire_many`): one acquisition per tenant topped out near
//! 600 a second under the placement benchmark's load, behind the moves it was picking up.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, watch};
use tracing::debug;

use crate::db;
use crate::db::placement::Member;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::state::liveness::{Notice, RESERVED_CHANNEL};
use crate::state::replica::Replica;
use crate::sync::in_lanes;

/// How often the members are read.
pub(crate) const PERIOD: Duration = Duration::from_millis(250);
/// A look for moves at least this often, membership unchanged, when a tenant was opened here
/// or a move failed since the last look. Each look computes the home of every tenant held here
/// (86 ms of PostgreSQL for 2 000 tenants among 5 members, idle), which every replica did every
/// 5 s whether or not anything could be away.
pub(crate) const RECHECK: Duration = Duration::from_secs(5);
/// A look at least this often in any case.
pub(crate) const FULL_RECHECK: Duration = Duration::from_secs(60);
/// The reserved tenants are read at least this often without a notice.
pub(crate) const PICKUP_EVERY: Duration = Duration::from_secs(2);
/// Handoffs or opens at once.
pub(crate) const LANES: usize = 64;
/// Ordinary opens at once when picking up what a batch left out.
pub(crate) const PICKUP_LANES: usize = 8;
/// Tenants acquired in one statement when picking up; an open of one of them waits for the
/// statement. Under the placement benchmark's load a batch of 16 pickups took 5 ms; takeovers
/// cost more (each also seals the dead incarnation and terminates its sessions): a survivor
/// took over 150 tenants in 0.6 s.
const PICKUP_BATCH_SIZE: usize = 64;
/// Batched statements at once: a moved tenant is unserved until its home opens it.
const PICKUP_BATCHES: usize = 2;
/// Reserved tenants read at a time.
const PICKUP_BATCH: usize = 512;

/// Rebalances `replica` until the router closes or is dropped.
pub(crate) async fn rebalance(
    replica: Weak<Replica>,
    mut shutdown: watch::Receiver<bool>,
    mut notices: broadcast::Receiver<Notice>,
) {
    let mut seen: Option<Vec<Member>> = None;
    let mut last_look: Option<Instant> = None;
    let mut more_to_move = false;
    let mut last_pickup: Option<Instant> = None;
    let mut pickup_due = true;
    let mut next_tick = Instant::now();
    loop {
        // Wait for the tick, or a notice that something was reserved for this replica.
        loop {
            if pickup_due {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next_tick.into()) => break,
                _ = shutdown.changed() => return,
                notice = notices.recv() => match notice {
                    Ok(n) if n.channel == RESERVED_CHANNEL => {
                        let Some(replica) = replica.upgrade() else { return };
                        if n.payload == replica.options.replica_id.as_str() {
                            pickup_due = true;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => pickup_due = true,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
        if *shutdown.borrow() {
            return;
        }
        let Some(replica) = replica.upgrade() else {
            return;
        };
        if replica.is_closed() {
            return;
        }
        let now = Instant::now();
        if pickup_due || last_pickup.is_none_or(|at| now - at >= PICKUP_EVERY) {
            pickup_due = false;
            last_pickup = Some(now);
            match pick_up(&replica).await {
                // A full batch: more may be waiting.
                Ok(picked) => pickup_due = picked >= PICKUP_BATCH,
                Err(error) => {
                    debug!(%error, "could not read the tenants reserved for this replica")
                }
            }
        }
        if Instant::now() < next_tick {
            continue;
        }
        next_tick = Instant::now() + PERIOD;
        let options = &replica.options;
        let members = {
            let client = match replica.pool.get().await {
                Ok(client) => client,
                Err(error) => {
                    debug!(%error, "no connection to read the placement members");
                    continue;
                }
            };
            match db::placement::placement_members(&client, options.placement_stable_for).await {
                Ok(members) => members,
                Err(error) => {
                    debug!(%error, "could not read the placement members");
                    continue;
                }
            }
        };
        let changed = seen.as_ref() != Some(&members);
        let since = last_look.map(|at| at.elapsed());
        let due = since.is_none_or(|since| {
            since >= FULL_RECHECK
                || (since >= RECHECK && replica.maybe_away.load(Ordering::Acquire))
        });
        if !(changed || due || more_to_move) {
            continue;
        }
        seen = Some(members);
        last_look = Some(Instant::now());
        more_to_move = false;
        // Cleared before the look: what is opened during it is looked at next time.
        replica.maybe_away.store(false, Ordering::Release);
        let budget = (options.placement_moves_per_second as f64 * PERIOD.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        match take_over_orphans(&replica, budget).await {
            Ok(found) => more_to_move |= found >= budget,
            Err(error) => debug!(%error, "could not look for a dead replica's tenants"),
        }
        match move_home(&replica, budget).await {
            Ok(moved) => more_to_move |= moved >= budget,
            Err(error) => debug!(%error, "could not look for tenants away from home"),
        }
    }
}

/// Opens the tenants reserved for this replica; how many were listed.
async fn pick_up(replica: &Arc<Replica>) -> Result<usize> {
    let doing = "read the tenants reserved for this replica";
    let reserved = {
        let client = replica.pool.get().await.map_err(pool_error(doing))?;
        db::placement::reserved_for(&client, &replica.options.replica_id, PICKUP_BATCH)
            .await
            .map_err(Error::db(doing))?
    };
    open_all(replica, reserved).await
}

/// Takes over the tenants a dead incarnation held whose home is this replica (each tenant's
/// home alone does, so a crash brings no herd); how many were listed. Each acquisition waits
/// for the dead lease's expiry like any takeover.
async fn take_over_orphans(replica: &Arc<Replica>, budget: usize) -> Result<usize> {
    let doing = "look for a dead replica's tenants";
    let orphans = {
        let client = replica.pool.get().await.map_err(pool_error(doing))?;
        db::placement::orphaned_homes(&client, &replica.options.replica_id, budget)
            .await
            .map_err(Error::db(doing))?
    };
    // The first takeover of a dead incarnation seals it (session fencing, control plane V8):
    // until that seal commits, every other takeover of its tenants locks the dead replica's
    // row and waits for the transaction holding it, a whole batch. Survivors' first batches
    // ran one after another so (a queue of up to 10 on that row, 0.4 s each, sampled in
    // pg_locks during the placement benchmark's crash); one takeover alone commits the seal
    // in milliseconds, and the batches after it find it and run side by side.
    let (first, rest) = orphans.split_at(orphans.len().min(1));
    let listed =
        open_all(replica, first.to_vec()).await? + open_all(replica, rest.to_vec()).await?;
    // One not taken (busy, or reserved for a replica that is alive again): the next periodic
    // look tries again.
    if orphans.iter().any(|id| replica.handle(id).is_none()) {
        replica.maybe_away.store(true, Ordering::Release);
    }
    Ok(listed)
}

/// Opens `tenants` here: [`PICKUP_BATCH_SIZE`] to a statement, [`PICKUP_BATCHES`] statements
/// at a time (`open::open_many`), then what a batch left out the ordinary way,
/// [`PICKUP_LANES`] at a time; how many there were.
async fn open_all(replica: &Arc<Replica>, tenants: Vec<TenantId>) -> Result<usize> {
    let listed = tenants.len();
    let rest = std::sync::Mutex::new(Vec::new());
    let chunks = tenants.chunks(PICKUP_BATCH_SIZE).map(<[_]>::to_vec);
    in_lanes(chunks, PICKUP_BATCHES, |chunk| async {
        let (opened, left) = crate::protocol::open::open_many(replica, chunk).await;
        crate::metrics::placement_pickups(opened);
        crate::sync::lock(&rest).extend(left);
    })
    .await;
    let rest = std::mem::take(&mut *crate::sync::lock(&rest));
    in_lanes(rest, PICKUP_LANES, |id| async move {
        match crate::protocol::open::open(replica, &id, false).await {
            Ok(_) => crate::metrics::placement_pickups(1),
            Err(error) => {
                debug!(tenant = %id, %error, "could not open a tenant whose home this is")
            }
        }
    })
    .await;
    Ok(listed)
}

/// Hands up to `budget` tenants held here to their homes; how many were listed.
async fn move_home(replica: &Arc<Replica>, budget: usize) -> Result<usize> {
    let options = &replica.options;
    let moves = {
        let client = replica
            .pool
            .get()
            .await
            .map_err(pool_error("look for tenants away from home"))?;
        db::placement::placement_moves(
            &client,
            &options.replica_id,
            options.placement_stable_for,
            false,
            budget,
        )
        .await
        .map_err(Error::db("look for tenants away from home"))?
    };
    let listed = moves.len();
    in_lanes(moves, LANES, |next| async move {
        let Some(handle) = replica
            .handle(&next.tenant)
            .filter(|h| h.is_serving() && h.epoch == next.epoch)
        else {
            return;
        };
        match crate::protocol::handoff::hand_over(&handle, Some(&next.home)).await {
            Ok(()) => crate::metrics::placement_move(),
            // Busy (the drain gave up), or the tenure ended meanwhile: the next look tries
            // again.
            Err(error) => {
                replica.maybe_away.store(true, Ordering::Release);
                debug!(tenant = %next.tenant, to = %next.home, %error, "could not move a tenant home");
            }
        }
    })
    .await;
    Ok(listed)
}
