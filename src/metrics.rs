//! Metrics through the [`metrics`](https://docs.rs/metrics) facade: pgtenant records, the
//! application installs whatever exporter it likes (Prometheus, StatsD, …) or none, in which
//! case recording costs next to nothing.
//!
//! | name | kind | what |
//! |---|---|---|
//! | `pgtenant_leases_held` | gauge | tenants this process serves or drains |
//! | `pgtenant_acquisitions_total` | counter | leases acquired (opens, creations, restores) |
//! | `pgtenant_takeovers_total` | counter | acquisitions that broke a dead or stalled owner's lease |
//! | `pgtenant_open_seconds` | histogram | time of an open that acquired, label `outcome` = `ok` / `error` |
//! | `pgtenant_fence_refusals_total` | counter | fenced transactions PostgreSQL refused (stale epoch) |
//! | `pgtenant_leases_lost_total` | counter | leases that ended without a release |
//! | `pgtenant_heartbeat_seconds` | histogram | heartbeat round trips, label `outcome` = `renewed` / `failed` |
//! | `pgtenant_drain_seconds` | histogram | how long handoffs waited for work in flight |
//! | `pgtenant_releases_batched` | histogram | releases per release transaction |

use std::time::Duration;

pub(crate) fn leases_held(count: usize) {
    metrics::gauge!("pgtenant_leases_held").set(count as f64);
}

pub(crate) fn lease_acquired() {
    metrics::counter!("pgtenant_acquisitions_total").increment(1);
}

pub(crate) fn takeover() {
    metrics::counter!("pgtenant_takeovers_total").increment(1);
}

pub(crate) fn open_finished(took: Duration, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::histogram!("pgtenant_open_seconds", "outcome" => outcome).record(took.as_secs_f64());
}

pub(crate) fn fence_refused() {
    metrics::counter!("pgtenant_fence_refusals_total").increment(1);
}

pub(crate) fn lease_lost() {
    metrics::counter!("pgtenant_leases_lost_total").increment(1);
}

pub(crate) fn heartbeat(took: Duration, renewed: bool) {
    let outcome = if renewed { "renewed" } else { "failed" };
    metrics::histogram!("pgtenant_heartbeat_seconds", "outcome" => outcome)
        .record(took.as_secs_f64());
}

pub(crate) fn drain_time(took: Duration) {
    metrics::histogram!("pgtenant_drain_seconds").record(took.as_secs_f64());
}

pub(crate) fn releases_batched(size: usize) {
    metrics::histogram!("pgtenant_releases_batched").record(size as f64);
}
