//! pgtenant lets many replicas of a backend share many tenants through one PostgreSQL
//! database.
//!
//! Each tenant is served by exactly one replica at a time (it holds the tenant's lease), each
//! tenant's data is its own PostgreSQL schema, and every write is fenced by the lease's epoch
//! inside PostgreSQL, so a replica that lost its lease can never commit again. Handing a tenant
//! to another replica moves the lease, not the data.
//!
//! * [`setup`] creates or upgrades the control plane (schema `pgtenant`), idempotently and
//!   safely from many processes at once; [`setup_with`] also grants an application role and an
//!   operator role exactly what they need.
//! * A [`Router`] is one replica. It starts from [`RouterOptions`], holds a liveness lock on a
//!   dedicated lease session and heartbeats it. It opens tenants ([`Router::open`],
//!   [`Router::open_or_create`], [`Router::wait_for`]) and hands them all off on
//!   [`Router::close`].
//! * A [`TenantHandle`] is one lease, bound to one [`Epoch`]. [`TenantHandle::run`] and
//!   [`TenantHandle::read`] run fenced transactions on the tenant's schema;
//!   [`TenantHandle::connect`] gives guard-style ones. [`TenantHandle::handoff`],
//!   [`TenantHandle::release`], [`TenantHandle::abandon`] and [`TenantHandle::forget`] end the
//!   lease.
//! * [`Router::subscribe`] streams typed [`Event`]s, [`Router::summary`] feeds a health
//!   endpoint, and the [`metrics`](https://docs.rs/metrics) facade records counters and
//!   timings (names, labels and units in [`metrics`]).
//! * Operators use [`admin`] (and the `pgtenant` command): listing, the sweep, quarantines.
//! * Every failure is an [`Error`]; [`Error::kind`] sorts it, [`Error::is_retryable`] separates
//!   an unavailable database from everything else. [`sqlstate`] names the SQLSTATEs a fenced
//!   statement fails with; [`limits`] the bounds input is checked against.
//!
//! ```no_run
//! # async fn example() -> pgtenant::Result<()> {
//! use pgtenant::{Router, RouterOptions, TenantId};
//!
//! pgtenant::setup_url("postgres://postgres@127.0.0.1/app").await?;
//! let router = Router::start(RouterOptions::from_url("replica-1", "postgres://postgres@127.0.0.1/app")?).await?;
//! let tenant = router.open_or_create(&TenantId::new("acme", "invoices")?).await?;
//! let amount = 42_i64;
//! tenant
//!     .run(|tx| Box::pin(async move {
//!         tx.batch_execute("CREATE TABLE IF NOT EXISTS entries (amount bigint)").await?;
//!         tx.execute("INSERT INTO entries VALUES ($1)", &[&amount]).await?;
//!         Ok::<_, pgtenant::Error>(())
//!     }))
//!     .await?;
//! router.close().await; // hands every tenant off, then frees the liveness lock
//! # Ok(()) }
//! ```
//!
//! Connections: the lease session must reach PostgreSQL directly, or through PgBouncer in
//! session mode; a transaction-mode pooler is refused with [`Error::NotASession`]. The data
//! path works behind transaction pooling. For TLS, see [`RouterOptions::tls`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rustdoc::broken_intra_doc_links)]

// Layers, bottom to top, each importing only layers below it (`tests/layers.rs` fails on an
// import that goes up or sideways, or on an import circle): vocabulary and connections (`id`,
// `lease`, `stall`, `error`, `sqlstate`, `event`, `metrics`, `sync`, `wire`, `connect`, `options`,
// `data_pool`, `citus`, `control`, `control_plane`, `migrate`, `refusal`), then `state/` (what
// the protocols share), then `protocol/` (one file per DESIGN §5 protocol, in the order of its
// table), then the facades `router.rs`, `handle.rs` and `admin/`.
pub mod admin;
mod citus;
mod connect;
mod control_plane;
mod credentials;
mod data_pool;
mod db;
mod error;
mod event;
mod handle;
mod id;
mod lease;
pub mod limits;
pub mod metrics;
mod migrate;
mod options;
mod protocol;
mod refusal;
mod replica_id;
mod router;
mod schema_version;
pub mod sqlstate;
mod stall;
mod state;
mod sync;
mod wire;

pub use control_plane::{setup, setup_url, setup_with, SetupOptions, SetupReport};
pub use error::{Error, ErrorKind, Result};
pub use event::Event;
pub use handle::{ActiveWork, TenantHandle};
pub use protocol::fenced_transaction::{TenantConnection, TenantTransaction, Tx};

pub use id::{IdPart, IdRule, InvalidTenantId, TenantId};
pub use lease::{Epoch, HandleState, Incarnation, TenantState};
pub use options::{Fencing, HandoffPolicy, RouterOptions};
pub use protocol::alarms::{Alarm, AlarmError, MAX_ALARM_NAME_LEN, MAX_ALARM_PAYLOAD_LEN};
pub use protocol::tenant_migrations::{MigrationOutcome, TenantMigration};
pub use replica_id::{InvalidReplicaId, ReplicaId};
pub use router::{CloseReport, Location, Route, Router, Summary, TenantStatus};
pub use schema_version::SchemaVersion;
pub use sync::BoxFuture;

/// The PostgreSQL driver pgtenant is built on, for the types work names (`Row`,
/// `types::ToSql`, …) without a separate dependency that could drift in version.
pub use tokio_postgres as postgres;

/// The connection pool [`RouterOptions::pool`] takes, at the version pgtenant uses.
pub use deadpool_postgres as pool;

/// refinery at the version pgtenant uses, for [`RouterOptions::migrations`] (or pass SQL with
/// [`RouterOptions::tenant_migrations`] and name no refinery type at all).
pub use refinery;

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
