//! pgtenant lets many replicas of a backend share many tenants through one PostgreSQL
//! database.
//!
//! Each tenant is served by exactly one replica at a time (it holds the tenant's lease), each
//! tenant's data is its own PostgreSQL schema, and every write is fenced by the lease's epoch
//! inside PostgreSQL, so a replica that lost its lease can never commit again. Handing a tenant
//! to another replica moves the lease, not the data.
//!
//! * [`setup`] creates or upgrades the control plane (schema `pgtenant`), idempotently and
//!   safely from many processes at once.
//! * A [`Router`] is one replica. It starts from [`RouterOptions`], holds a liveness lock on a
//!   dedicated lease session and heartbeats it. It opens tenants ([`Router::open`],
//!   [`Router::open_or_create`], [`Router::wait_for`]) and hands them all off on
//!   [`Router::close`].
//! * A [`TenantHandle`] is one lease. [`TenantHandle::run`] and [`TenantHandle::read`] run
//!   fenced transactions on the tenant's schema. [`TenantHandle::handoff`],
//!   [`TenantHandle::release`], [`TenantHandle::abandon`] and [`TenantHandle::forget`] end the
//!   lease.
//! * [`Router::subscribe`] streams typed [`Event`]s, and [`Router::summary`] feeds a health
//!   endpoint. [`list_tenants`], [`show_tenant`], [`list_trash`], [`sweep`] and
//!   [`clear_quarantine`] serve operators (also as the `pgtenant` command).
//! * Every failure is an [`Error`], which a caller can match on.
//!   [`Error::is_retryable`] separates an unavailable database from everything else.
//!
//! ```no_run
//! # async fn example() -> pgtenant::Result<()> {
//! use pgtenant::{Router, RouterOptions, TenantId};
//!
//! let (mut client, connection) =
//!     tokio_postgres::connect("postgres://postgres@127.0.0.1/app", tokio_postgres::NoTls).await?;
//! tokio::spawn(connection);
//! pgtenant::setup(&mut client).await?;
//!
//! let router = Router::start(RouterOptions::from_url("replica-1", "postgres://postgres@127.0.0.1/app")?).await?;
//! let tenant = router.open_or_create(&TenantId::new("acme", "invoices")?).await?;
//! tenant
//!     .run(|tx| {
//!         Box::pin(async move {
//!             tx.batch_execute("CREATE TABLE IF NOT EXISTS entries (amount bigint)").await?;
//!             tx.execute("INSERT INTO entries VALUES ($1)", &[&42_i64]).await?;
//!             Ok::<_, pgtenant::Error>(())
//!         })
//!     })
//!     .await?;
//! router.close().await; // hands every tenant off, then frees the liveness lock
//! # Ok(()) }
//! ```
//!
//! Connections: the lease session must reach PostgreSQL directly, or through PgBouncer in
//! session mode; a transaction-mode pooler is refused with [`Error::NotASession`]. The data
//! path works behind transaction pooling. For TLS, see [`RouterOptions::tls`].
#![deny(missing_docs)]
#![warn(rustdoc::broken_intra_doc_links)]

mod acquire;
mod admin;
mod connect;
mod control;
mod control_plane;
mod error;
mod event;
mod forget;
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
pub use connect::DEFAULT_CONNECT_TIMEOUT;
pub use control_plane::{
    control_plane_version, setup, setup_with, supported_version, SetupOptions, SetupReport,
    CONTROL_SCHEMA,
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
