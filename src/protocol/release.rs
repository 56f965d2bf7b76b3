//! Release (DESIGN §5 "Handoff", its voluntary end without a target or a bound): stop taking
//! new work, wait for the work in flight however long it takes, then give the lease back
//! (`state/leases.rs`), which NOTIFYs a replica waiting for the tenant. A handoff is the same
//! with a drain timeout and an optional reservation (`handoff.rs`); abandon does not wait
//! (`abandon.rs`).

use std::sync::Arc;

use crate::error::Result;
use crate::lease::{HandleState, Journal};
use crate::state::leases::give_back;
use crate::state::shared::HandleInner;

/// Stops taking new work, waits for the work in flight (however long), then releases.
pub(crate) async fn release(handle: &Arc<HandleInner>) -> Result<()> {
    if !handle.transition(HandleState::Serving, HandleState::Released) {
        return Ok(());
    }
    handle.wait_idle().await;
    give_back(handle, Journal::Released, None).await
}
