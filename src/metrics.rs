//! The metrics pgtenant records (DESIGN §6), through the [`metrics`](https://docs.rs/metrics)
//! facade: the application installs whatever recorder it likes (Prometheus, StatsD, …) or
//! none, in which case recording costs next to nothing.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `pgtenant_leases_held` | gauge | `replica` | tenants this replica serves or drains |
//! | `pgtenant_acquisitions_total` | counter | | leases acquired (opens, creations, restores) |
//! | `pgtenant_takeovers_total` | counter | | acquisitions that broke a dead or stalled owner's lease |
//! | `pgtenant_open_seconds` | histogram | `outcome` = `ok` / `error` | time of an open that went to the database |
//! | `pgtenant_fence_refusals_total` | counter | | fenced transactions PostgreSQL refused (stale epoch) |
//! | `pgtenant_leases_lost_total` | counter | | leases that ended without a release |
//! | `pgtenant_heartbeat_seconds` | histogram | `outcome` = `renewed` / `failed` | heartbeat round trips |
//! | `pgtenant_drain_seconds` | histogram | | how long handoffs waited for work in flight |
//! | `pgtenant_releases_batched` | histogram | | releases per release transaction |
//! | `pgtenant_placement_moves_total` | counter | | tenants this replica handed to their home (placement) |
//! | `pgtenant_placement_pickups_total` | counter | | tenants whose home this replica is that it opened unasked: reserved for it, or left by a dead incarnation (placement) |
//!
//! [`Router::start`](crate::Router::start) calls [`describe`], so a recorder installed before
//! it gets each metric's unit and help text; call [`describe`] yourself for one installed
//! later.

use std::time::Duration;

use metrics::Unit;

/// Gauge: tenants this replica serves or drains (label `replica`).
pub const LEASES_HELD: &str = "pgtenant_leases_held";
/// Counter: leases acquired (opens, creations, restores).
pub const ACQUISITIONS: &str = "pgtenant_acquisitions_total";
/// Counter: acquisitions that broke a dead or stalled owner's lease.
pub const TAKEOVERS: &str = "pgtenant_takeovers_total";
/// Histogram (seconds): opens that went to the database (label `outcome`: `ok`, `error`).
pub const OPEN_SECONDS: &str = "pgtenant_open_seconds";
/// Counter: fenced transactions PostgreSQL refused because their epoch was stale.
pub const FENCE_REFUSALS: &str = "pgtenant_fence_refusals_total";
/// Counter: leases that ended without a release (lost, taken over, incarnation ended).
pub const LEASES_LOST: &str = "pgtenant_leases_lost_total";
/// Histogram (seconds): heartbeat round trips (label `outcome`: `renewed`, `failed`).
pub const HEARTBEAT_SECONDS: &str = "pgtenant_heartbeat_seconds";
/// Histogram (seconds): how long handoffs waited for work in flight.
pub const DRAIN_SECONDS: &str = "pgtenant_drain_seconds";
/// Histogram: releases per release transaction.
pub const RELEASES_BATCHED: &str = "pgtenant_releases_batched";

/// Counter: tenants handed to their home by rebalancing.
pub const PLACEMENT_MOVES: &str = "pgtenant_placement_moves_total";
/// Counter: tenants whose home this replica is that it opened unasked (reserved for it, or
/// left by a dead incarnation).
pub const PLACEMENT_PICKUPS: &str = "pgtenant_placement_pickups_total";

/// Counter: alarms fired (their handler's transaction committed).
pub const ALARMS_FIRED: &str = "pgtenant_alarms_fired_total";
/// Counter: alarm attempts whose handler failed (label `outcome`: `retry`, `parked`).
pub const ALARMS_FAILED: &str = "pgtenant_alarms_failed_total";
/// Histogram (seconds): from an alarm's due time to its firing's commit.
pub const ALARM_LATENESS_SECONDS: &str = "pgtenant_alarm_lateness_seconds";

/// Registers every metric's unit and help text with the installed recorder.
pub fn describe() {
    metrics::describe_gauge!(LEASES_HELD, "Tenants this replica serves or drains.");
    metrics::describe_counter!(
        ACQUISITIONS,
        "Leases acquired (opens, creations, restores)."
    );
    metrics::describe_counter!(
        TAKEOVERS,
        "Acquisitions that broke a dead or stalled owner's lease."
    );
    metrics::describe_histogram!(
        OPEN_SECONDS,
        Unit::Seconds,
        "Time of an open that went to the database."
    );
    metrics::describe_counter!(
        FENCE_REFUSALS,
        "Fenced transactions PostgreSQL refused because their epoch was stale."
    );
    metrics::describe_counter!(LEASES_LOST, "Leases that ended without a release.");
    metrics::describe_histogram!(
        HEARTBEAT_SECONDS,
        Unit::Seconds,
        "Heartbeat round trips of the lease session."
    );
    metrics::describe_histogram!(
        DRAIN_SECONDS,
        Unit::Seconds,
        "How long handoffs waited for work in flight."
    );
    metrics::describe_histogram!(
        RELEASES_BATCHED,
        Unit::Count,
        "Releases per release transaction."
    );
    metrics::describe_counter!(
        ALARMS_FIRED,
        "Alarms fired (their handler's transaction committed)."
    );
    metrics::describe_counter!(
        ALARMS_FAILED,
        "Alarm attempts whose handler failed (outcome: retry or parked)."
    );
    metrics::describe_histogram!(
        ALARM_LATENESS_SECONDS,
        Unit::Seconds,
        "From an alarm's due time to its firing's commit."
    );
    metrics::describe_counter!(
        PLACEMENT_MOVES,
        "Tenants handed to their home by rebalancing."
    );
    metrics::describe_counter!(
        PLACEMENT_PICKUPS,
        "Tenants whose home this replica is that it opened unasked (reserved for it, or left by a dead incarnation)."
    );
}

pub(crate) fn leases_held(replica: &str, count: usize) {
    metrics::gauge!(LEASES_HELD, "replica" => replica.to_owned()).set(count as f64);
}

pub(crate) fn lease_acquired() {
    metrics::counter!(ACQUISITIONS).increment(1);
}

pub(crate) fn takeover() {
    metrics::counter!(TAKEOVERS).increment(1);
}

pub(crate) fn open_finished(took: Duration, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::histogram!(OPEN_SECONDS, "outcome" => outcome).record(took.as_secs_f64());
}

pub(crate) fn fence_refused() {
    metrics::counter!(FENCE_REFUSALS).increment(1);
}

pub(crate) fn lease_lost() {
    metrics::counter!(LEASES_LOST).increment(1);
}

pub(crate) fn heartbeat(took: Duration, renewed: bool) {
    let outcome = if renewed { "renewed" } else { "failed" };
    metrics::histogram!(HEARTBEAT_SECONDS, "outcome" => outcome).record(took.as_secs_f64());
}

pub(crate) fn drain_time(took: Duration) {
    metrics::histogram!(DRAIN_SECONDS).record(took.as_secs_f64());
}

pub(crate) fn releases_batched(size: usize) {
    metrics::histogram!(RELEASES_BATCHED).record(size as f64);
}

pub(crate) fn placement_move() {
    metrics::counter!(PLACEMENT_MOVES).increment(1);
}

pub(crate) fn alarm_fired(late: Duration) {
    metrics::counter!(ALARMS_FIRED).increment(1);
    metrics::histogram!(ALARM_LATENESS_SECONDS).record(late.as_secs_f64());
}

pub(crate) fn alarm_failed(parked: bool) {
    let outcome = if parked { "parked" } else { "retry" };
    metrics::counter!(ALARMS_FAILED, "outcome" => outcome).increment(1);
}

pub(crate) fn placement_pickups(tenants: usize) {
    metrics::counter!(PLACEMENT_PICKUPS).increment(tenants as u64);
}
