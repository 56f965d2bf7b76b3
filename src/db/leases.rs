//! A lease's transitions (DESIGN §5 "Acquire tenant", "Handoff"): `pgtenant.acquire`,
//! `schema_created`, `release` (batched by `protocol/release.rs`), handoff requests, and the
//! lease status one tenant's owner is read from.

use std::time::Duration;

use tokio_postgres::types::Type;

use crate::credentials::{millis, Credentials};
use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, Journal};
use crate::replica_id::ReplicaId;
use crate::sqlstate;

/// One release: the tenant, the lease's epoch, the journal event (`released`, `handed_off`),
/// and an optional reservation (target replica, window).
pub(crate) type Release<'a> = (&'a TenantId, Epoch, Journal, Option<(&'a str, Duration)>);

/// Releases leases of one incarnation in one statement (one transaction: all of them commit,
/// with one WAL flush, or none does): for each, true when released, false when the lease was
/// no longer the caller's at that epoch.
pub(crate) async fn release(
    client: &tokio_postgres::Client,
    credentials: &Credentials,
    releases: &[Release<'_>],
) -> Result<Vec<bool>> {
    let keys: Vec<&str> = releases.iter().map(|r| r.0.key()).collect();
    let epochs: Vec<i64> = releases.iter().map(|r| r.1.get()).collect();
    let events: Vec<&str> = releases.iter().map(|r| r.2.as_str()).collect();
    let reserve_for: Vec<Option<&str>> = releases
        .iter()
        .map(|r| r.3.map(|(replica, _)| replica))
        .collect();
    let reserve_ms: Vec<Option<i32>> = releases
        .iter()
        .map(|r| r.3.map(|(_, window)| millis(window)))
        .collect();
    let (secret, incarnation) = (credentials.secret(), credentials.incarnation.get());
    let context = || match releases {
        [(id, ..)] => format!("release tenant {id}"),
        _ => format!("release {} leases", releases.len()),
    };
    let rows = super::call(
        client,
        "SELECT ord, released FROM pgtenant.release($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&keys, Type::TEXT_ARRAY),
            (&epochs, Type::INT8_ARRAY),
            (&events, Type::TEXT_ARRAY),
            (&reserve_for, Type::TEXT_ARRAY),
            (&reserve_ms, Type::INT4_ARRAY),
        ],
    )
    .await
    .map_err(|error| match error.as_db_error() {
        Some(db) if db.code().code() == sqlstate::NO_SUCH_REPLICA => Error::NoSuchReplica {
            replica_id: releases
                .iter()
                .find_map(|r| r.3.map(|(replica, _)| ReplicaId::unchecked(replica)))
                .unwrap_or_else(|| ReplicaId::unchecked("")),
            message: db.message().to_owned(),
        },
        _ => Error::db_with(context)(error),
    })?;
    let mut released = vec![false; releases.len()];
    for row in rows {
        let ord: i64 = row.try_get(0).map_err(Error::db_with(context))?;
        let ok: bool = row.try_get(1).map_err(Error::db_with(context))?;
        if let Some(slot) = usize::try_from(ord - 1)
            .ok()
            .and_then(|i| released.get_mut(i))
        {
            *slot = ok;
        }
    }
    Ok(released)
}

/// `pgtenant.request_handoff`: asks the tenant's owner, through a row the control plane
/// authenticates, to hand the tenant to this replica.
pub(crate) async fn request_handoff(
    client: &tokio_postgres::Client,
    id: &TenantId,
    credentials: &Credentials,
) -> std::result::Result<(), tokio_postgres::Error> {
    let incarnation = credentials.incarnation.get();
    super::call(
        client,
        "SELECT pgtenant.request_handoff($1, $2, $3, $4)",
        &[
            (&id.key(), Type::TEXT),
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&credentials.secret(), Type::TEXT),
        ],
    )
    .await
    .map(drop)
}

/// `pgtenant.take_handoff_request`: consumes `requester`'s request for `id` when its live
/// incarnation wrote one; whether it did.
pub(crate) async fn take_handoff_request(
    client: &tokio_postgres::Client,
    credentials: &Credentials,
    id: &TenantId,
    requester: &str,
) -> Result<bool> {
    let incarnation = credentials.incarnation.get();
    let rows = super::call(
        client,
        "SELECT pgtenant.take_handoff_request($1, $2, $3, $4, $5)",
        &[
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&credentials.secret(), Type::TEXT),
            (&id.key(), Type::TEXT),
            (&requester, Type::TEXT),
        ],
    )
    .await
    .map_err(Error::db_with(|| format!("check a handoff request for tenant {id}")))?;
    match rows.first() {
        Some(row) => row
            .try_get(0)
            .map_err(Error::db("read a handoff request's check")),
        None => Ok(false),
    }
}
