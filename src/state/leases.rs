//! How a lease this replica holds ends, the one way every protocol ends it (DESIGN §5
//! "Handoff", "Abandon", "Close", "Tenant migrations"): the handle leaves the served set, the
//! release goes through the batcher (`releases.rs`), and the event says how it ended. Giving a
//! lease back is a state change of the control plane (`pgtenant.release`), so it lives here,
//! below every protocol that decides *when* to give one back.

use std::sync::Arc;

use tracing::warn;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::TenantId;
use crate::lease::{Epoch, Journal};
use crate::replica_id::ReplicaId;
use crate::state::credentials::Credentials;
use crate::state::releases::release_now;
use crate::state::shared::{HandleInner, Shared};

/// Releases `handle`'s lease (reserved for `to` when given) and reports how it ended. The
/// caller has stopped the handle's work already: drained it, or terminated what was in flight.
pub(crate) async fn give_back(
    handle: &Arc<HandleInner>,
    event: Journal,
    to: Option<&ReplicaId>,
) -> Result<()> {
    let router = &handle.router;
    router.detach(handle);
    let reservation = to.map(|replica| (replica.as_str(), router.options.reservation));
    let released = match router
        .releases
        .release(
            &handle.id,
            handle.epoch,
            &handle.credentials,
            event,
            reservation,
        )
        .await
    {
        Err(Error::NoSuchReplica { replica_id, .. }) => {
            // The target died between the check before the drain and this release: the
            // tenant is already drained, so it is released for anyone rather than kept.
            warn!(tenant = %handle.id, to = %replica_id, "handoff target gone; released without a reservation");
            router
                .releases
                .release(&handle.id, handle.epoch, &handle.credentials, event, None)
                .await?
        }
        released => released?,
    };
    let (tenant, epoch) = (handle.id.clone(), handle.epoch);
    router.emit(match (released, event) {
        (false, _) => Event::Lost {
            tenant,
            epoch,
            reason: "already taken over when released".to_owned(),
        },
        (true, Journal::HandedOff) => Event::HandedOff {
            tenant,
            epoch,
            to: to.cloned(),
        },
        (true, Journal::Released) => Event::Released { tenant, epoch },
    });
    Ok(())
}

/// Gives a lease acquired in vain straight back, before any handle served it (a schema ahead
/// of the code, a migration that failed for a reason other than the migration): on `client`,
/// at once, not batched. A failure is logged: the lease ends with its expiry.
pub(crate) async fn give_back_unused(
    shared: &Shared,
    client: &tokio_postgres::Client,
    id: &TenantId,
    epoch: Epoch,
    credentials: &Credentials,
) {
    let released = release_now(client, credentials, &[(id, epoch, Journal::Released, None)]).await;
    if let Err(error) = released {
        warn!(tenant = %id, %error, replica = %shared.options.replica_id, "could not give the lease back; it ends with its expiry");
    }
}
