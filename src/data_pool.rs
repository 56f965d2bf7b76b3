//! The data-path pool (DESIGN §5 "Replica start", G6, G9): the pool pgtenant builds when the
//! application gives none, its sessions read-only by default and bounded on both ends of TCP
//! (user timeout and keepalives), and the check of a pool the application built: read-only
//! sessions, and a warning when the server has no bound on them. Above `connect.rs` and
//! `options.rs`, which it combines.

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

/// The data-path connections' settings, as startup options, which RESET ALL (and so the
/// session hygiene between tenants) keeps: read-only by default (G6: work that ends its
/// fenced transaction cannot write afterwards; only the fenced transaction is READ WRITE); and
/// the TCP bounds on both ends (G9): a partitioned replica's backends, and the locks their
/// transactions hold (under transaction fencing, the tenant's fence lock), end within the
/// bound whatever they were doing (blocked sending a result, waiting in a COPY), and a
/// vanished server ends the client's connections.
fn data_session_config(options: &RouterOptions) -> Config {
    let mut config = options.config.clone();
    let bounds = options.tcp_bounds();
    bounds.client(&mut config);
    let mut startup: Vec<String> = config
        .get_options()
        .filter(|existing| !existing.trim().is_empty())
        .map(str::to_owned)
        .into_iter()
        .collect();
    if options.read_only_data_sessions {
        startup.push("-c default_transaction_read_only=on".to_owned());
    }
    startup.extend(
        bounds
            .server_settings()
            .iter()
            .map(|(setting, value)| format!("-c {setting}={value}")),
    );
    config.options(startup.join(" "));
    config
}

/// A pool the application built must give read-only-by-default sessions (G6) when
/// `read_only` is asked for, from the connection's startup options or the role's or
/// database's defaults, since pgtenant resets session settings between tenants. Its sessions
/// should also have a server-side `tcp_user_timeout` (G9); that is the application's to set,
/// so its absence is only logged.
pub(crate) async fn check_given_pool(pool: &Pool, read_only: bool) -> Result<()> {
    let client = pool
        .get()
        .await
        .map_err(crate::error::pool_error("check the data-path pool"))?;
    let (reset_value, unbounded): (String, bool) = client
        .query_typed_one(
            "SELECT (SELECT reset_val FROM pg_settings WHERE name = 'default_transaction_read_only'),
                    inet_client_addr() IS NOT NULL
                    AND (SELECT reset_val FROM pg_settings WHERE name = 'tcp_user_timeout') = '0'",
            &[],
        )
        .await
        .and_then(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .map_err(Error::db("check the data-path pool"))?;
    if unbounded {
        tracing::warn!(
            "the data-path pool's sessions have no server-side tcp_user_timeout: a partitioned \
             replica's backends, and the locks their transactions hold, can outlive it by the \
             server's retransmission timeout (tcp_retries2, ~15 min); add `options=-c \
             tcp_user_timeout=<ms> -c tcp_keepalives_idle=5` to the pool's connection config \
             (or ALTER ROLE <app> SET tcp_user_timeout = ... behind a pooler that drops startup \
             options), and tcp_user_timeout and keepalives on its client side"
        );
    }
    if !read_only || reset_value == "on" {
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
