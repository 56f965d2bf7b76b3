//! Waiting for a router's events about one tenant, in tests that follow a lease through its
//! states.

use pgtenant::Event;
use tokio::sync::broadcast;

/// The next event about `tenant`, skipping heartbeats and other tenants.
pub(crate) async fn next_for(events: &mut broadcast::Receiver<Event>, tenant: &str) -> Event {
    loop {
        let event = events.recv().await.expect("event");
        let key = match &event {
            Event::Acquired { tenant, .. }
            | Event::Created { tenant, .. }
            | Event::Lost { tenant, .. }
            | Event::Released { tenant, .. }
            | Event::HandedOff { tenant, .. }
            | Event::Draining { tenant, .. }
            | Event::DrainTimeout { tenant, .. }
            | Event::HandoffRequested { tenant, .. }
            | Event::Quarantined { tenant, .. } => tenant.clone(),
            _ => continue,
        };
        if key == tenant {
            return event;
        }
    }
}

/// The next event of one kind about `tenant`.
pub(crate) async fn wait_event(
    events: &mut broadcast::Receiver<Event>,
    tenant: &str,
    wanted: &str,
) -> Event {
    loop {
        let event = next_for(events, tenant).await;
        if kind(&event) == wanted {
            return event;
        }
    }
}

/// The event's kind, as its serialized `kind` names it.
pub(crate) fn kind(event: &Event) -> &'static str {
    match event {
        Event::Acquired { .. } => "acquired",
        Event::Created { .. } => "created",
        Event::Lost { .. } => "lost",
        Event::Released { .. } => "released",
        Event::HandedOff { .. } => "handed_off",
        Event::Draining { .. } => "draining",
        Event::DrainTimeout { .. } => "drain_timeout",
        Event::HandoffRequested { .. } => "handoff_requested",
        Event::Quarantined { .. } => "quarantined",
        _ => "other",
    }
}
