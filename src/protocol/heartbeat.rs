//! Heartbeat (DESIGN §5 "Heartbeat"): every `ttl/3` one `pgtenant.heartbeat`, the local
//! deadline it renews (`state/liveness.rs`), the loss of every lease when it finds the
//! incarnation expired or replaced or the lease session dropped, re-registration with a new
//! incarnation (backing off, and not doubling the delay while only standbys answer), and
//! deregistration on shutdown.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tokio_postgres::Client;
use tracing::{info, warn};

use crate::credentials::{millis, Credentials};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::options::RouterOptions;
use crate::protocol::replica_start::{begin_incarnation, LeaseSession};
use crate::state::replica::{RegistrationFailure, Replica};
use crate::sync::lock;

/// One heartbeat: Some(()) renewed, None when the incarnation expired or was replaced.
async fn heartbeat(
    client: &Client,
    credentials: &Credentials,
    options: &RouterOptions,
) -> Result<Option<()>> {
    let renewed = crate::db::replicas::heartbeat(
        client,
        &credentials.replica,
        credentials.incarnation,
        credentials.secret(),
        millis(options.ttl),
    )
    .await?;
    Ok(renewed.then_some(()))
}

enum SessionEnd {
    Shutdown,
    Lost(&'static str),
}

/// The replica's background task: heartbeats, and re-registration when an incarnation ends;
/// deregisters on shutdown.
pub(crate) async fn maintain(
    shared: Arc<Replica>,
    mut session: LeaseSession,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        match heartbeat_until_end(&shared, &mut session, &mut shutdown).await {
            SessionEnd::Shutdown => {
                shared.liveness.end();
                session.deregister().await;
                return;
            }
            SessionEnd::Lost(reason) => {
                warn!(reason, incarnation = %session.incarnation(), "incarnation lost");
                shared.lose_incarnation(reason);
            }
        }
        drop(session);
        let (first, max) = shared.options.reconnect_backoff;
        let mut delay = first;
        // A fresh incarnation refused too: registering again did not cure it at once, so the
        // next tries back off (a refusal no retry cures must not be retried many times a
        // second, DESIGN G9), and a lasting one is reported as such.
        let refused = shared.bindings.refused_in_a_row();
        if refused >= 2 {
            let pause = first.saturating_mul(1 << (refused - 2).min(16)).min(max);
            if let Some(lasting) = shared.bindings.lasting(&shared.options.replica_id) {
                warn!(error = %lasting, retry_in = ?pause, "data sessions refused for incarnation after incarnation");
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => return,
            }
        }
        session = loop {
            if *shutdown.borrow() {
                return;
            }
            let opened = match LeaseSession::open(&shared.options, shared.notices.clone()).await {
                Ok(session) if shared.session_fencing() => {
                    session.declare_session_fencing().await.map(|()| session)
                }
                opened => opened,
            };
            match opened {
                Ok(session) => break session,
                Err(error) => {
                    // Only standbys answered: a failover is under way and a promotion is what
                    // ends it, so keep trying at the first delay instead of doubling it, which
                    // would add up to the longest delay (30 s by default) to the failover's
                    // downtime. It costs one connection to a standby per replica per try.
                    let failing_over = error.sqlstate() == Some(crate::sqlstate::NOT_PRIMARY);
                    if failing_over {
                        delay = first;
                    }
                    warn!(%error, retry_in = ?delay, "re-registration failed");
                    let reason = error.to_string();
                    *lock(&shared.registration) = Some(RegistrationFailure {
                        message: reason.clone(),
                        lasting: error.lasting_copy(),
                    });
                    shared.emit(Event::RegistrationFailed {
                        reason,
                        retryable: error.is_retryable(),
                        retry_in_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    });
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.changed() => return,
                    }
                    delay = delay.saturating_mul(2).min(max);
                }
            }
        };
        *lock(&shared.registration) = None;
        begin_incarnation(&shared, &session);
    }
}

async fn heartbeat_until_end(
    shared: &Replica,
    session: &mut LeaseSession,
    shutdown: &mut watch::Receiver<bool>,
) -> SessionEnd {
    let options = &shared.options;
    let period = options.effective_heartbeat_period();
    let mut last_success = session.registered_at;
    let mut next = session.registered_at + period;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = &mut session.ended => return SessionEnd::Lost("its lease session to the database was lost"),
            _ = shutdown.changed() => return SessionEnd::Shutdown,
            _ = shared.bindings.refusal() => {
                // The database will bind nothing to this incarnation (sealed, or no longer
                // alive by its account): a new incarnation is the cure, and waiting for the
                // heartbeat to find out would leave every write refused meanwhile.
                if shared.bindings.is_refused(session.credentials.registration) {
                    return SessionEnd::Lost(
                        "the database refused to bind a data session to its incarnation (sealed by \
                         a takeover, or no longer alive)",
                    );
                }
                continue;
            }
        }
        let started = Instant::now();
        next = started + period;
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(period, heartbeat(&session.client, &session.credentials, options)) => outcome,
            _ = &mut session.ended => return SessionEnd::Lost("its lease session to the database was lost"),
            _ = shutdown.changed() => return SessionEnd::Shutdown,
        };
        crate::metrics::heartbeat(started.elapsed(), matches!(outcome, Ok(Ok(Some(())))));
        match outcome {
            Ok(Ok(Some(()))) => {
                last_success = started;
                let resumed = shared
                    .liveness
                    .renewed(started + options.ttl - options.effective_margin());
                let incarnation = session.incarnation();
                if resumed {
                    info!(%incarnation, "heartbeat resumed service");
                    shared.emit(Event::Resumed { incarnation });
                }
                if options.renewal_events {
                    shared.emit(Event::Renewed { incarnation });
                }
            }
            Ok(Ok(None)) => {
                return SessionEnd::Lost(
                    "the database expired its lease: no heartbeat reached it within the ttl",
                )
            }
            Ok(Err(error)) if read_only(&error) => {
                // The server is (or became) a standby: no heartbeat can succeed there, and
                // waiting a ttl for it would only delay re-registering on the primary.
                warn!(%error, "heartbeat found the server read-only");
                return SessionEnd::Lost(
                    "its lease session's server became read-only (a standby: a failover)",
                );
            }
            Ok(Err(error)) => {
                warn!(%error, "heartbeat failed");
                shared.emit(Event::RenewFailed {
                    reason: error.to_string(),
                });
            }
            Err(_) => {
                warn!("heartbeat timed out");
                shared.emit(Event::RenewFailed {
                    reason: format!("heartbeat timed out after {period:?}"),
                });
            }
        }
        // The database has expired this incarnation by now unless a renewal got through that
        // we never heard of; a session that cannot answer for a whole ttl is replaced.
        if started.duration_since(last_success) > options.ttl {
            return SessionEnd::Lost("its lease session did not answer for a whole ttl");
        }
    }
}

/// Whether a heartbeat failed because its server takes no writes: SQLSTATE 25006, what a hot
/// standby answers to any write. Defence in depth: a lease session is opened on a primary only
/// (`connect.rs`), PostgreSQL turns a primary into a standby only through a restart, which ends
/// the session, and the session itself sets `default_transaction_read_only = off`; but a
/// proxy that reconnects behind the session's back could land it on a standby.
fn read_only(error: &Error) -> bool {
    error.sqlstate() == Some("25006")
}
