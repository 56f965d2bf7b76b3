//! Forget and restore (DESIGN §5 "Forget"): a tenant's schema goes to the trash with a catalog
//! rename under its lease, and comes back from it as a new life. Both are one control-plane
//! call whose time does not depend on the ledger's size.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::CancelToken;
use tracing::info;

use crate::db;
use crate::error::pool_error;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::{TenantId, SCHEMA_NAME_SALTS};
use crate::lease::Epoch;
use crate::protocol::acquire::install_handle;
use crate::protocol::tenant_migrations::migrate_held;
use crate::refusal::{self, Scope};
use crate::sqlstate;
use crate::state::lifecycle::Step;
use crate::state::replica::{Acquired, ActiveWork, HeldLease, Replica};

/// How often `forget(ActiveWork::Cancel)` repeats its cancel requests while work remains.
const CANCEL_REPEAT: Duration = Duration::from_millis(50);

/// [`TenantHandle::forget`](crate::TenantHandle::forget): deal with the work in flight as `active` says, then one
/// transaction masks every epoch up to this one, renames the schema into the trash, journals it
/// and ends the lease.
pub(crate) async fn forget(handle: &Arc<HeldLease>, active: ActiveWork) -> Result<String> {
    handle.admit()?;
    if !handle.step(Step::Drain) {
        return Err(Error::Draining {
            tenant: handle.id.clone(),
        });
    }
    let in_flight = handle.in_flight();
    if active == ActiveWork::Refuse && in_flight > 0 {
        handle.step(Step::Resume);
        return Err(Error::Busy {
            tenant: handle.id.clone(),
            in_flight,
        });
    }
    let replica = &handle.replica;
    let timeout = replica.options.drain_timeout;
    let drained = if active == ActiveWork::Cancel {
        // A cancel reaches only the statement running at that moment: repeat it until the
        // work ends, so work between statements is caught at its next one.
        tokio::time::timeout(timeout, async {
            loop {
                let tokens: Vec<CancelToken> = handle
                    .lock_cancels()
                    .iter()
                    .map(|(_, token, _)| token.clone())
                    .collect();
                for token in tokens {
                    let _ = replica.options.connector.cancel(token).await;
                }
                if tokio::time::timeout(CANCEL_REPEAT, handle.wait_idle())
                    .await
                    .is_ok()
                {
                    return;
                }
            }
        })
        .await
    } else {
        tokio::time::timeout(timeout, handle.wait_idle()).await
    };
    if drained.is_err() {
        handle.step(Step::Resume);
        return Err(Error::DrainTimeout {
            tenant: handle.id.clone(),
            in_flight: handle.in_flight(),
            timeout,
        });
    }
    let client = replica
        .pool
        .get()
        .await
        .map_err(pool_error("forget a tenant"))?;
    let forgotten =
        db::tenants::forget(&client, &handle.id, handle.epoch, &handle.credentials).await;
    let trash = match forgotten {
        Ok(trash) => trash,
        Err(error) => {
            let error = handle.refused(error, "forget a tenant");
            handle.step(Step::Resume);
            return Err(error);
        }
    };
    handle.step(Step::Forget);
    replica.detach(handle);
    info!(tenant = %handle.id, epoch = %handle.epoch, %trash, "forgotten");
    replica.emit(Event::Forgotten {
        tenant: handle.id.clone(),
        epoch: handle.epoch,
        trash: trash.clone(),
    });
    Ok(trash)
}

/// Restores a forgotten tenant's newest trashed schema as a new life held by this replica.
pub(crate) async fn restore(shared: &Arc<Replica>, id: &TenantId) -> Result<Arc<HeldLease>> {
    let credentials = shared.current_credentials()?;
    let context = || format!("restore tenant {id}");
    let scope = Scope {
        doing: "restore a tenant",
        tenant: Some(id),
        epoch: Epoch::new(0),
        replica: credentials.replica.as_str(),
    };
    let mut client = shared
        .pool
        .get()
        .await
        .map_err(pool_error("restore a tenant"))?;
    // The epoch restore will bump to: pgtenant.next_epoch (V4) keeps it above every epoch of
    // an older timeline, so after a failover it is not simply the current epoch + 1.
    let next: i64 = db::tenants::next_epoch(&client, id)
        .await
        .map_err(Error::db_with(context))?
        .ok_or_else(|| Error::TenantNotFound {
            tenant: id.clone(),
            reason: "never created".to_owned(),
        })?;
    let mut salt = 0;
    let restored = loop {
        // The new life's name is derived for the epoch restore will bump to, which the
        // function checks; a taken name (a deliberate hash collision) moves to the next salt.
        let name = id.schema_name_salted(next, salt);
        let restored = db::tenants::restore(&client, id, &credentials, &name).await;
        match restored {
            Err(error)
                if sqlstate::of(&error) == Some(sqlstate::DUPLICATE_SCHEMA)
                    && salt + 1 < SCHEMA_NAME_SALTS =>
            {
                salt += 1;
            }
            Err(error) => return Err(refusal::map(error, &scope)),
            Ok(restored) => break restored,
        }
    };
    let (epoch, schema, version, lock_key) = restored.ok_or_else(|| Error::UnexpectedReply {
        context: context(),
        detail: "pgtenant.restore returned no row".to_owned(),
    })?;
    let migrated_from = (version < shared.options.code_version()).then_some(version);
    if migrated_from.is_some() {
        let lease = (epoch, lock_key);
        migrate_held(shared, &mut client, id, lease, &credentials, &schema).await?;
    }
    drop(client);
    info!(%epoch, %schema, "restored");
    let event = Event::Restored {
        tenant: id.clone(),
        epoch,
        schema: schema.clone(),
    };
    let lease = Acquired {
        epoch,
        credentials,
        lock_key,
        migrated_from,
        created: false,
        schema,
    };
    install_handle(shared, id, lease, event).await
}
