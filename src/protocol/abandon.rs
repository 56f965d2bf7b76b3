//! Abandon (DESIGN §5 "Abandon"): stop serving at once and release the lease without waiting
//! for the work in flight; that work either commits before the next owner's acquisition
//! (which waits for it) or fails, so nothing acknowledged is lost. Under session fencing the
//! backends of that work are terminated first (no fence would stop them afterwards).

use std::sync::Arc;

use crate::error::Result;
use crate::lease::Journal;
use crate::protocol::release::give_back;
use crate::state::lifecycle::Step;
use crate::state::replica::HeldLease;

/// Releases at once, without waiting for work in flight; that work either commits before the
/// next owner's acquisition (which waits for it) or fails.
pub(crate) async fn abandon(handle: &Arc<HeldLease>) -> Result<()> {
    if !handle.step(Step::Abandon) {
        return Ok(());
    }
    let replica = &handle.replica;
    if replica.session_fencing() {
        // No fence stops that work once the lease is released: it ends first (its transaction
        // rolls back). Work not yet on a backend finds the handle released and stops.
        let backends = handle.backends_in_flight();
        if let Err(error) = crate::protocol::session_fencing::terminate::terminate_work(
            &replica.pool,
            &handle.credentials,
            &backends,
        )
        .await
        {
            // The lease stays held (and expires with the replica if it comes to that) rather
            // than be released under work that may still commit.
            replica.detach(handle);
            return Err(error);
        }
    }
    give_back(handle, Journal::Released, None).await
}
