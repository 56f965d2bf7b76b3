//! Shared by the integration tests, one file per thing provided (each re-exported here, so a
//! test names any helper as `support::name`):
//!
//! - [`database`]: fresh databases, throwaway servers, the control plane of old releases;
//! - [`routers`]: routers with short leases, tenant and replica ids, work on handles;
//! - [`log`]: the log table tests write in a tenant's schema, and reading it back;
//! - [`child`]: replica child processes and the line protocol they speak;
//! - [`by_hand`]: plain sessions, SQL by hand against the control plane;
//! - [`takeover`]: taking a tenant over, and the bound for serving again;
//! - [`events`]: waiting for a router's events about one tenant;
//! - [`history`]: the history harness under faults and its verdict;
//! - [`alarm_workload`]: the history's alarm workload and its verdict (G11);
//! - [`netns`]: replicas in network namespaces and silent partitions.
#![allow(dead_code)] // each test binary uses a different part

pub(crate) mod alarm_workload;
pub(crate) mod by_hand;
pub(crate) mod child;
pub(crate) mod database;
pub(crate) mod events;
pub(crate) mod history;
pub(crate) mod log;
pub(crate) mod netns;
pub(crate) mod routers;
pub(crate) mod takeover;

#[allow(unused_imports)] // likewise for the re-exports
pub(crate) use {
    alarm_workload::*, by_hand::*, child::*, database::*, events::*, history::*, log::*,
    routers::*, takeover::*,
};
