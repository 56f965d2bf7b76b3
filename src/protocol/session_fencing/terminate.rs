//! Session fencing's termination of work in flight (DESIGN §5 "Data sessions and session
//! fencing", 3): no fence stops a session-fenced transaction once its lease is released, so a
//! voluntary end that does not wait for its work (abandon) terminates the
//! backends of that work first and waits for each to exit (`pgtenant.terminate_work`).

use deadpool_postgres::Pool;

use crate::credentials::Credentials;
use crate::db;
use crate::error::pool_error;
use crate::error::{Error, Result};

/// Terminates the backends of this replica's own work still in flight (their transactions roll
/// back), waiting for each to exit: before a voluntary end's release commits under session
/// fencing, since no fence stops that work afterwards.
pub(crate) async fn terminate_work(
    pool: &Pool,
    credentials: &Credentials,
    pids: &[i32],
) -> Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    let client = pool
        .get()
        .await
        .map_err(pool_error("terminate work in flight"))?;
    db::sessions::terminate_work(&client, credentials, pids)
        .await
        .map_err(Error::db("terminate work in flight"))
}
