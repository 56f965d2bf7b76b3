//! The control plane (DESIGN §4): schema `pgtenant`, created and upgraded by embedded refinery
//! migrations.

use serde::Serialize;
use tokio_postgres::Client;
use tracing::{info, instrument};

use crate::db;
use crate::error::{Error, Result};
use crate::migrate::InTransaction;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The schema that holds pgtenant's own tables and views.
pub const CONTROL_SCHEMA: &str = "pgtenant";

/// What [`setup`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetupReport {
    /// The migrations applied by this call, as `V<n>__<name>`; empty when it was up to date.
    pub applied: Vec<String>,
    /// The control plane's version after the call.
    pub version: i64,
}

/// The newest control-plane version this library carries.
pub fn supported_version() -> i64 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|migration| i64::from(migration.version()))
        .max()
        .unwrap_or(0)
}

/// Which roles [`setup_with`] grants to (DESIGN G8). Each must exist already.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SetupOptions {
    /// The application's role: gets EXECUTE on the protocol functions, SELECT on what the
    /// fence and the status views read, and CREATE on the database (it creates and owns the
    /// tenant schemas), and no write access to any control-plane table.
    pub app_role: Option<String>,
    /// The operators' role: SELECT on the control plane, and the operator functions
    /// (clearing quarantines, recording sweeps, pruning). To drop tenant schemas, the sweep's
    /// role must also be a member of the application's role (or a superuser).
    pub operator_role: Option<String>,
}

impl SetupOptions {
    /// Grants to the application's role `role`.
    #[must_use]
    pub fn app_role(mut self, role: impl Into<String>) -> Self {
        self.app_role = Some(role.into());
        self
    }

    /// Grants to the operators' role `role`.
    #[must_use]
    pub fn operator_role(mut self, role: impl Into<String>) -> Self {
        self.operator_role = Some(role.into());
        self
    }
}

/// Like [`setup`], then grants the roles in `options` exactly what they need (in the same
/// transaction). The control plane is owned by the role that runs this; with an application
/// role, that owner must be a superuser or a member of the application's role, because
/// `forget` and `restore` rename the application's tenant schemas as the owner.
///
/// # Errors
/// [`Error::InvalidOption`] for a role that does not exist or an owner that could not rename
/// the application's schemas, before anything changes; otherwise as [`setup`].
pub async fn setup_with(client: &mut Client, options: &SetupOptions) -> Result<SetupReport> {
    for (option, role) in [
        ("app_role", &options.app_role),
        ("operator_role", &options.operator_role),
    ] {
        if let Some(role) = role {
            check_role(client, option, role).await?;
        }
    }
    if let Some(app) = &options.app_role {
        if !db::setup::owner_can_act_as(client, app).await? {
            return Err(Error::InvalidOption {
                option: "app_role",
                reason: format!(
                    "the role running setup owns the control plane and must be able to rename {app}'s tenant \
                     schemas (forget, restore): run setup as a superuser, or `GRANT {app} TO <owner>` first"
                ),
            });
        }
    }
    setup_inner(client, Some(options)).await
}

async fn check_role(client: &Client, option: &'static str, role: &str) -> Result<()> {
    if db::setup::role_exists(client, role).await? {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option,
        reason: format!(
            "role {:?} does not exist: create it first (CREATE ROLE … LOGIN)",
            role.chars().take(70).collect::<String>()
        ),
    })
}

/// Creates or upgrades the control plane, idempotently.
///
/// Safe when many processes call it at once: the whole run is one transaction under a
/// transaction-level advisory lock, so concurrent callers wait for each other, and a failing
/// migration leaves nothing half-built. A database whose control plane is newer than this
/// library is refused with [`Error::ControlPlaneTooNew`] before anything changes.
///
/// On a Citus coordinator (the database has the `citus` extension) the control plane is made a
/// plain local schema there, never distributed nor propagated to the workers, whatever the
/// session's `citus.enable_schema_based_sharding` is; one an earlier setup left distributed
/// is made local again.
///
/// ```no_run
/// # async fn example(client: &mut tokio_postgres::Client) -> pgtenant::Result<()> {
/// let report = pgtenant::setup(client).await?;
/// println!("control plane at version {}", report.version);
/// # Ok(()) }
/// ```
#[instrument(skip_all)]
pub async fn setup(client: &mut Client) -> Result<SetupReport> {
    setup_inner(client, None).await
}

async fn setup_inner(client: &mut Client, roles: Option<&SetupOptions>) -> Result<SetupReport> {
    let transaction = db::begin_read_write(client)
        .await
        .map_err(Error::db("begin control-plane setup"))?;
    db::setup::setup_lock(&transaction).await?;
    // On Citus the control plane stays a local schema on the coordinator (see citus.rs).
    if db::citus::present(&transaction).await? {
        db::citus::localize_control_plane(&transaction).await?;
        db::citus::keep_local(&transaction).await?;
    }
    // Checked under the lock, so a newer library cannot upgrade the schema in between.
    let found = db::setup::read_version(&transaction).await?;
    let supported = supported_version();
    if found > supported {
        return Err(Error::ControlPlaneTooNew { found, supported });
    }
    db::setup::create_schema(&transaction).await?;
    let mut runner = embedded::migrations::runner();
    runner.set_migration_table_name(db::setup::HISTORY_TABLE);
    let report = runner
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .run_async(&mut InTransaction(&transaction, false))
        .await
        .map_err(Error::Migration)?;
    if let Some(roles) = roles {
        db::setup::grant_roles(
            &transaction,
            roles.app_role.as_deref(),
            roles.operator_role.as_deref(),
        )
        .await?;
        if let Some(app) = &roles.app_role {
            // A GRANT its grantor may not give is only a warning: check it took effect.
            if !db::setup::has_database_privilege(&transaction, app).await? {
                return Err(Error::InvalidOption {
                    option: "app_role",
                    reason: format!(
                        "{app} needs CREATE on this database for its tenant schemas, and the role running \
                         setup may not grant it: have a superuser run `GRANT CREATE ON DATABASE <db> TO {app}` \
                         (or give the setup role that privilege WITH GRANT OPTION); nothing was changed"
                    ),
                });
            }
        }
    }
    transaction
        .commit()
        .await
        .map_err(Error::db("commit control-plane setup"))?;
    let applied: Vec<String> = report
        .applied_migrations()
        .iter()
        .map(|migration| format!("V{}__{}", migration.version(), migration.name()))
        .collect();
    let version = found.max(supported);
    if !applied.is_empty() {
        info!(?applied, version, "control plane upgraded");
    }
    Ok(SetupReport { applied, version })
}

/// [`setup`] on a connection of its own to `url` (without TLS: with TLS, connect yourself and
/// call [`setup`]). The connection, startup included, is bounded by the URL's
/// `connect_timeout`, else [`DEFAULT_CONNECT_TIMEOUT`](crate::connect::DEFAULT_CONNECT_TIMEOUT).
///
/// # Errors
/// [`Error::InvalidOption`] for a URL that does not parse; otherwise as [`setup`].
pub async fn setup_url(url: &str) -> Result<SetupReport> {
    let config: tokio_postgres::Config =
        url.parse()
            .map_err(|error: tokio_postgres::Error| Error::InvalidOption {
                option: "database_url",
                reason: format!("{error}; expected postgres://user@host:port/database"),
            })?;
    let bound = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(crate::connect::DEFAULT_CONNECT_TIMEOUT);
    let connected = tokio::time::timeout(bound, config.connect(tokio_postgres::NoTls)).await;
    let (mut client, connection) = match connected {
        Ok(connected) => connected.map_err(Error::db("connect for control-plane setup"))?,
        Err(_) => {
            return Err(Error::connect_timeout(
                "connect for control-plane setup".to_owned(),
                bound,
            ))
        }
    };
    let driver = tokio::spawn(connection);
    let report = setup(&mut client).await;
    drop(client);
    let _ = driver.await;
    report
}

/// The control plane's version in this database: 0 when it has none.
pub async fn control_plane_version(client: &Client) -> Result<i64> {
    db::setup::read_version(client).await
}

/// Refuses to work on a database whose control plane is not exactly this library's.
pub(crate) async fn ensure_current(client: &Client) -> Result<()> {
    let found = db::setup::read_version(client).await?;
    let supported = supported_version();
    if found > supported {
        return Err(Error::ControlPlaneTooNew { found, supported });
    }
    if found < supported {
        return Err(Error::ControlPlaneOutdated {
            found,
            needed: supported,
        });
    }
    Ok(())
}
