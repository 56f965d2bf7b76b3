//! The data-path pool (DESIGN §5 "Replica start", G6): the pool pgtenant builds when the
//! application gives none, its sessions read-only by default with TCP keepalives, and the
//! check that a pool the application built gives read-only sessions too. Above `connect.rs`
//! and `options.rs`, which it combines.

use std::time::Duration;

use deadpool_postgres::{ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::Config;

use crate::connect::hosts_in_order;
use crate::error::{Error, Result};
use crate::options::RouterOptions;

/// The data-path pool pgtenant builds when the application gives none: creating a connection
/// and waiting for a free one are both bounded by the connect timeout.
pub(crate) fn default_pool(options: &RouterOptions) -> Result<Pool> {
    let manager = options.connector.manager(
        data_session_config(options),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let bound = Some(options.connector.timeout);
    // Each host gets the bound of its own: with the first one down, the next still has time.
    let hosts = u32::try_from(hosts_in_order(&options.config).len().max(1)).unwrap_or(u32::MAX);
    Pool::builder(manager)
        .max_size(options.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(bound)
        .create_timeout(Some(options.connector.timeout.saturating_mul(hosts)))
        .build()
        .map_err(|e| Error::InvalidOption {
            option: "pool_size",
            reason: e.to_string(),
        })
}

/// The data-path connections' settings: read-only by default (G6: work that ends its fenced
/// transaction cannot write afterwards; only the fenced transaction is READ WRITE), as a
/// startup option, which RESET ALL keeps; and TCP keepalives, so a vanished server ends them.
fn data_session_config(options: &RouterOptions) -> Config {
    let mut config = options.config.clone();
    if options.read_only_data_sessions {
        let startup = match config.get_options() {
            Some(existing) if !existing.trim().is_empty() => {
                format!("{existing} -c default_transaction_read_only=on")
            }
            _ => "-c default_transaction_read_only=on".to_owned(),
        };
        config.options(startup);
    }
    config
        .keepalives(true)
        .keepalives_idle(options.keepalive_idle)
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3);
    config
}

/// A pool the application built must give read-only-by-default sessions (G6), from the
/// connection's startup options or the role's or database's defaults, since pgtenant resets
/// session settings between tenants.
pub(crate) async fn check_read_only(pool: &Pool) -> Result<()> {
    let client = pool
        .get()
        .await
        .map_err(crate::error::pool_error("check the data-path pool"))?;
    let reset_value: String = client
        .query_typed_one(
            "SELECT reset_val FROM pg_settings WHERE name = 'default_transaction_read_only'",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(Error::db("check the data-path pool"))?;
    if reset_value == "on" {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option: "pool",
        reason: "its sessions are not read-only by default, so work that ends its fenced \
                 transaction itself could write unfenced: add `options=-c default_transaction_read_only=on` \
                 to the pool's connection config (or `ALTER ROLE <app> SET default_transaction_read_only = on` \
                 behind a transaction-mode pooler, which drops startup options), or accept the risk \
                 with RouterOptions::read_only_data_sessions(false)"
            .to_owned(),
    })
}
