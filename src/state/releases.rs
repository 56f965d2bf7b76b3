//! The release queue (DESIGN §5 "Handoff", "Abandon", "Close"): how every voluntary end of a
//! lease reaches the release batcher (`protocol/release.rs`), which sends `pgtenant.release`
//! for many leases at once. Memory only: a channel and the requests on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::credentials::Credentials;
use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, Journal};

/// What [`ReleaseQueue::release`] asks of the batcher.
pub(crate) struct Request {
    pub(crate) id: TenantId,
    pub(crate) epoch: Epoch,
    pub(crate) credentials: Arc<Credentials>,
    pub(crate) event: Journal,
    pub(crate) reserve: Option<(String, Duration)>,
    pub(crate) reply: oneshot::Sender<Result<bool>>,
}

/// The batcher's end of the queue.
pub(crate) type Requests = mpsc::UnboundedReceiver<Request>;

/// The router's way to its release batcher, which lives as long as this queue.
pub(crate) struct ReleaseQueue {
    requests: mpsc::UnboundedSender<Request>,
}

impl ReleaseQueue {
    /// A queue, and the end the batcher reads.
    pub(crate) fn new() -> (ReleaseQueue, Requests) {
        let (requests, incoming) = mpsc::unbounded_channel();
        (ReleaseQueue { requests }, incoming)
    }

    /// Releases the lease: `Ok(false)` when it was no longer this incarnation's at this
    /// epoch. `reserve` keeps the tenant for a live replica for a window.
    pub(crate) async fn release(
        &self,
        id: &TenantId,
        epoch: Epoch,
        credentials: &Arc<Credentials>,
        event: Journal,
        reserve: Option<(&str, Duration)>,
    ) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            id: id.clone(),
            epoch,
            credentials: credentials.clone(),
            event,
            reserve: reserve.map(|(replica, window)| (replica.to_owned(), window)),
            reply,
        };
        // The batcher ends only when this queue is dropped, or if it panicked.
        self.requests
            .send(request)
            .map_err(|_| Error::RouterClosed)?;
        answer.await.map_err(|_| Error::RouterClosed)?
    }
}
