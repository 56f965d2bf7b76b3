//! pgtenant lets many replicas of a backend share many tenants through one PostgreSQL
//! database.
//!
//! Each tenant is served by exactly one replica at a time (it holds the tenant's lease), each
//! tenant's data is its own PostgreSQL schema, and every write is fenced by the lease's epoch
//! inside PostgreSQL, so a replica that lost its lease can never commit again.
//!
//! This release lays the foundation: the control plane ([`setup`]), tenant ids
//! ([`TenantId`]) and the [`Error`] type.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let (mut client, connection) =
//!     tokio_postgres::connect("postgres://postgres@127.0.0.1/app", tokio_postgres::NoTls).await?;
//! tokio::spawn(connection);
//! pgtenant::setup(&mut client).await?;
//! let id = pgtenant::TenantId::new("acme", "invoices")?;
//! println!("{id} lives in schema {}", id.schema_name(1));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![warn(rustdoc::broken_intra_doc_links)]

mod admin;
mod connect;
mod control_plane;
mod error;
mod event;
mod handle;
mod id;
mod ledger;
mod liveness;
mod migrate;
mod options;
mod release;
mod router;

pub use admin::{
    clear_quarantine, list_tenants, list_trash, parse_duration, show_tenant, sweep, SweepOptions,
    SweepReport, TenantQuery, TenantRecord, TrashRecord, TENANT_STATES,
};
pub use control_plane::{
    control_plane_version, setup, supported_version, SetupReport, CONTROL_SCHEMA,
};
/// Re-exported for [`RouterOptions::pool`].
pub use deadpool_postgres;
pub use error::{Error, Result, SQLSTATE_FENCED, SQLSTATE_FORGOTTEN};
pub use event::Event;
pub use handle::{ActiveWork, BoxFuture, TenantHandle};
pub use id::{IdPart, IdRule, InvalidTenantId, TenantId, MAX_ID_PART_LEN};
pub use options::{HandoffPolicy, RouterOptions, MAX_TTL, MIN_TTL};
pub use router::{CloseReport, MigrationOutcome, Router, Summary, TenantMigration, TenantStatus};
/// Re-exported so applications use the same driver types pgtenant hands out.
pub use tokio_postgres;

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
