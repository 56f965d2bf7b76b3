//! A lease's transitions (DESIGN §5 "Acquire tenant", "Handoff"): `pgtenant.acquire`,
//! `schema_created`, `release` (batched by `protocol/release.rs`), handoff requests, and the
//! lease status one tenant's owner is read from.

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Transaction};

use crate::credentials::{millis, Credentials};
use crate::error::{Error, Result};
use crate::id::TenantId;
use crate::lease::{Epoch, Journal};
use crate::replica_id::ReplicaId;
use crate::schema_version::SchemaVersion;
use crate::sqlstate;

/// One release: the tenant, the lease's epoch, the journal event (`released`, `handed_off`),
/// and an optional reservation (target replica, window).
pub(crate) type Release<'a> = (&'a TenantId, Epoch, Journal, Option<(&'a str, Duration)>);

/// Releases leases of one incarnation in one statement (one transaction: all of them commit,
/// with one WAL flush, or none does): for each, true when released, false when the lease was
/// no longer the caller's at that epoch.
pub(crate) async fn release(
    client: &Client,
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
    let rows = crate::db::call(
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
    client: &Client,
    id: &TenantId,
    credentials: &Credentials,
) -> std::result::Result<(), tokio_postgres::Error> {
    let incarnation = credentials.incarnation.get();
    crate::db::call(
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
    client: &Client,
    credentials: &Credentials,
    id: &TenantId,
    requester: &str,
) -> Result<bool> {
    let incarnation = credentials.incarnation.get();
    let rows = crate::db::call(
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
    .map_err(Error::db_with(|| {
        format!("check a handoff request for tenant {id}")
    }))?;
    match rows.first() {
        Some(row) => row
            .try_get(0)
            .map_err(Error::db("read a handoff request's check")),
        None => Ok(false),
    }
}

/// `pgtenant.acquire` (V11): authenticates, locks the tenant's row, seals a dead or expired
/// session-fenced owner, refuses while prepared transactions hold the tenant, ends the fenced
/// transactions of a superseded lease that still hold it (at once for a takeover, after the
/// grace for a lease given back), bumps the epoch. Every wait is bounded.
const ACQUIRE_SQL: &str =
    "SELECT epoch, schema_name, previous_owner, took_over, quarantine, schema_version, lock_key
       FROM pgtenant.acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// What `pgtenant.acquire` answered.
pub(crate) struct Acquisition {
    pub(crate) epoch: Epoch,
    pub(crate) schema: Option<String>,
    pub(crate) previous_owner: Option<ReplicaId>,
    pub(crate) took_over: Option<String>,
    pub(crate) quarantine: Option<String>,
    pub(crate) version: SchemaVersion,
    pub(crate) lock_key: i32,
}

impl Acquisition {
    fn read(rows: &[Row]) -> std::result::Result<Option<Acquisition>, tokio_postgres::Error> {
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        Ok(Some(Acquisition {
            epoch: Epoch::new(row.try_get(0)?),
            schema: row.try_get(1)?,
            previous_owner: row.try_get(2)?,
            took_over: row.try_get(3)?,
            quarantine: row.try_get(4)?,
            version: row.try_get(5)?,
            lock_key: row.try_get(6)?,
        }))
    }
}

/// `pgtenant.acquire`'s parameters besides the tenant and the credentials: the bounds.
pub(crate) struct AcquireBounds {
    /// How long fenced transactions of a lease that was given back may go on before they are
    /// ended (an abandon's work usually commits within milliseconds): one ttl.
    pub(crate) grace_ms: i32,
    /// The bound on all the waits of one acquisition: the open's.
    pub(crate) wait_ms: i32,
    /// How long a termination waits for the backend to exit.
    pub(crate) terminate_ms: i64,
}

/// `pgtenant.acquire`'s arguments, one list for both ways in.
struct AcquireArgs<'a> {
    key: &'a str,
    organization: &'a str,
    ledger: &'a str,
    credentials: &'a Credentials,
    secret: &'a str,
    incarnation: i64,
    create: bool,
    bounds: &'a AcquireBounds,
}

impl<'a> AcquireArgs<'a> {
    fn new(
        id: &'a TenantId,
        credentials: &'a Credentials,
        create: bool,
        bounds: &'a AcquireBounds,
    ) -> Self {
        AcquireArgs {
            key: id.key(),
            organization: id.organization(),
            ledger: id.ledger(),
            credentials,
            secret: credentials.secret(),
            incarnation: credentials.incarnation.get(),
            create,
            bounds,
        }
    }

    /// In the function's order.
    fn params(&self) -> [(&(dyn ToSql + Sync), Type); 10] {
        [
            (&self.key, Type::TEXT),
            (&self.organization, Type::TEXT),
            (&self.ledger, Type::TEXT),
            (&self.credentials.replica, Type::TEXT),
            (&self.incarnation, Type::INT8),
            (&self.secret, Type::TEXT),
            (&self.create, Type::BOOL),
            (&self.bounds.grace_ms, Type::INT4),
            (&self.bounds.wait_ms, Type::INT4),
            (&self.bounds.terminate_ms, Type::INT8),
        ]
    }
}

/// `pgtenant.acquire` for an existing tenant (`create` false) or a new one, in its own
/// transaction: one round trip. `Ok(None)` only if the function returned no row.
pub(crate) async fn acquire(
    client: &Client,
    id: &TenantId,
    credentials: &Credentials,
    create: bool,
    bounds: &AcquireBounds,
) -> std::result::Result<Option<Acquisition>, tokio_postgres::Error> {
    let args = AcquireArgs::new(id, credentials, create, bounds);
    let rows = crate::db::call(client, ACQUIRE_SQL, &args.params()).await?;
    Acquisition::read(&rows)
}

/// One key's answer from `pgtenant.acquire_many`: the acquisition, or the SQLSTATE and
/// message it failed with (its subtransaction rolled back; the others stand).
pub(crate) type BatchAnswer = (String, std::result::Result<Acquisition, (String, String)>);

/// `pgtenant.acquire_many` (V20): `pgtenant.acquire` of each existing tenant in `ids`, in key
/// order, in one statement and one commit. A whole-batch refusal (not this incarnation) is the
/// Err; a key's own failure is its answer.
pub(crate) async fn acquire_many(
    client: &Client,
    ids: &[TenantId],
    credentials: &Credentials,
    bounds: &AcquireBounds,
) -> std::result::Result<Vec<BatchAnswer>, tokio_postgres::Error> {
    let keys: Vec<&str> = ids.iter().map(TenantId::key).collect();
    let incarnation = credentials.incarnation.get();
    let secret = credentials.secret();
    let rows = crate::db::call(
        client,
        "SELECT key, epoch, schema_name, previous_owner, took_over, quarantine, schema_version,
                lock_key, error_code, error_message
           FROM pgtenant.acquire_many($1, $2, $3, $4, $5, $6, $7)",
        &[
            (&keys, Type::TEXT_ARRAY),
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&secret, Type::TEXT),
            (&bounds.grace_ms, Type::INT4),
            (&bounds.wait_ms, Type::INT4),
            (&bounds.terminate_ms, Type::INT8),
        ],
    )
    .await?;
    let mut answers = Vec::with_capacity(rows.len());
    for row in &rows {
        let key: String = row.try_get(0)?;
        let epoch: Option<i64> = row.try_get(1)?;
        let answer = match (epoch, row.try_get::<_, Option<i32>>(7)?) {
            (Some(epoch), Some(lock_key)) => Ok(Acquisition {
                epoch: Epoch::new(epoch),
                schema: row.try_get(2)?,
                previous_owner: row.try_get(3)?,
                took_over: row.try_get(4)?,
                quarantine: row.try_get(5)?,
                version: row.try_get(6)?,
                lock_key,
            }),
            _ => Err((
                row.try_get::<_, Option<String>>(8)?.unwrap_or_default(),
                row.try_get::<_, Option<String>>(9)?.unwrap_or_default(),
            )),
        };
        answers.push((key, answer));
    }
    Ok(answers)
}

/// `pgtenant.acquire` of a tenant to create, inside `tx` (which also creates its schema),
/// behind the session reset in the same flight: the reset's outcome, then the acquisition's.
pub(crate) async fn acquire_to_create(
    tx: &Transaction<'_>,
    id: &TenantId,
    credentials: &Credentials,
    bounds: &AcquireBounds,
) -> (
    std::result::Result<(), tokio_postgres::Error>,
    std::result::Result<Option<Acquisition>, tokio_postgres::Error>,
) {
    let args = AcquireArgs::new(id, credentials, true, bounds);
    let params = args.params();
    // join! polls in order, and each request goes on the wire at its first poll.
    let (scrubbed, acquired) = tokio::join!(
        crate::db::sessions::reset_session(tx),
        tx.query_typed(ACQUIRE_SQL, &params),
    );
    (scrubbed, acquired.and_then(|rows| Acquisition::read(&rows)))
}

/// `pgtenant.schema_created`: the control plane vouches for the schema a creation made (G8),
/// recording its name and version under the new lease.
pub(crate) async fn schema_created(
    tx: &Transaction<'_>,
    id: &TenantId,
    epoch: Epoch,
    credentials: &Credentials,
    schema: &str,
    version: SchemaVersion,
) -> std::result::Result<(), tokio_postgres::Error> {
    let (epoch, incarnation) = (epoch.get(), credentials.incarnation.get());
    tx.query_typed(
        "SELECT pgtenant.schema_created($1, $2, $3, $4, $5, $6, $7)",
        &[
            (&id.key(), Type::TEXT),
            (&epoch, Type::INT8),
            (&credentials.replica, Type::TEXT),
            (&incarnation, Type::INT8),
            (&credentials.secret(), Type::TEXT),
            (&schema, Type::TEXT),
            (&version, Type::INT4),
        ],
    )
    .await
    .map(drop)
}

/// One tenant's row of `pgtenant.lease_status`.
pub(crate) struct LeaseStatus {
    pub(crate) state: String,
    pub(crate) owner: Option<ReplicaId>,
    pub(crate) epoch: Epoch,
    pub(crate) owner_alive: Option<bool>,
    pub(crate) expires_in_ms: Option<i64>,
    pub(crate) schema: Option<String>,
    pub(crate) version: SchemaVersion,
    pub(crate) quarantine_cause: Option<String>,
    pub(crate) quarantine_repair: Option<String>,
}

/// `id`'s row of `pgtenant.lease_status`; None for a tenant never created.
pub(crate) async fn lease_status(
    client: &Client,
    id: &TenantId,
) -> std::result::Result<Option<LeaseStatus>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT state, owner, epoch, owner_alive,
                    (extract(epoch FROM expires_in) * 1000)::bigint, schema, version,
                    quarantine_cause, quarantine_repair
               FROM pgtenant.lease_status WHERE tenant = $1",
            &[&id.key()],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(LeaseStatus {
        state: row.try_get(0)?,
        owner: row.try_get(1)?,
        epoch: Epoch::new(row.try_get(2)?),
        owner_alive: row.try_get(3)?,
        expires_in_ms: row.try_get(4)?,
        schema: row.try_get(5)?,
        version: row.try_get(6)?,
        quarantine_cause: row.try_get(7)?,
        quarantine_repair: row.try_get(8)?,
    }))
}

/// One tenant's row of `pgtenant.locate`.
pub(crate) struct Located {
    /// Whether the tenant was ever created.
    pub(crate) exists: bool,
    /// The holder, or the replica the tenant is reserved for.
    pub(crate) owner: Option<ReplicaId>,
    pub(crate) epoch: Epoch,
    /// `owner`'s registered address.
    pub(crate) address: Option<String>,
    pub(crate) owner_alive: bool,
    pub(crate) reserved: bool,
    /// Its home among the live replicas, and that one's address.
    pub(crate) home: Option<ReplicaId>,
    pub(crate) home_address: Option<String>,
}

/// `pgtenant.locate(key)`: who serves `id`, where, and its home (primary-key reads and one pass
/// over the replicas).
pub(crate) async fn locate(
    client: &Client,
    id: &TenantId,
) -> std::result::Result<Located, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT owner, epoch, address, owner_alive, reserved_for, reserved_address, home,
                    home_address
               FROM pgtenant.locate($1)",
            &[&id.key()],
        )
        .await?;
    let owner: Option<ReplicaId> = row.try_get(0)?;
    let epoch: Option<i64> = row.try_get(1)?;
    let reserved_for: Option<ReplicaId> = row.try_get(4)?;
    let reserved = owner.is_none() && reserved_for.is_some();
    Ok(Located {
        exists: epoch.is_some(),
        owner: owner.or(reserved_for),
        epoch: Epoch::new(epoch.unwrap_or(0)),
        address: if reserved {
            row.try_get(5)?
        } else {
            row.try_get(2)?
        },
        owner_alive: row.try_get::<_, Option<bool>>(3)?.unwrap_or(false),
        reserved,
        home: row.try_get(6)?,
        home_address: row.try_get(7)?,
    })
}
