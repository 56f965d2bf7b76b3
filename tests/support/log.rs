//! The log table the tests write in a tenant's schema: creating it (with or without the commit
//! stamps of the history driver), appending a row, and reading it back.

use std::collections::BTreeSet;

use pgtenant::TenantHandle;

/// The ledger table every test writes: which epoch committed which sequence number, and the
/// highest epoch already committed when the row was written (the history checker's witness).
pub(crate) async fn create_log(handle: &TenantHandle) {
    try_create_log(handle).await.expect("create log table");
}

pub(crate) async fn try_create_log(handle: &TenantHandle) -> pgtenant::Result<()> {
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(
                    "CREATE TABLE IF NOT EXISTS log (
                         epoch bigint NOT NULL, seq bigint NOT NULL, writer text NOT NULL,
                         seen_max_epoch bigint NOT NULL, PRIMARY KEY (writer, seq))",
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
}

/// The log with a second witness, for the child replicas of the history driver (not on Citus,
/// which runs no triggers on distributed tables): a deferred constraint trigger that sleeps up
/// to 3 ms inside each COMMIT (so a write cut at a random point is often cut mid-COMMIT) and
/// then records the tenant's epoch as the control plane has it at that moment. A row whose
/// recorded epoch is above its own committed after a later epoch was granted: stale, whether or
/// not a later row exists to show it.
pub(crate) async fn try_create_stamped_log(handle: &TenantHandle) -> pgtenant::Result<()> {
    try_create_log(handle).await?;
    handle
        .run(|tx| {
            Box::pin(async move {
                // Asked of the database, not of PGTENANT_TESTKIT: tests/citus.rs runs its own
                // Citus cluster whatever the test kit's source is.
                let citus: bool = tx
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
                        &[],
                    )
                    .await?
                    .get(0);
                if citus {
                    return Ok(());
                }
                tx.batch_execute(
                    "CREATE TABLE IF NOT EXISTS stamps (writer text, seq bigint, row_epoch bigint,
                                                        epoch_at_commit bigint);
                     CREATE OR REPLACE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$
                     BEGIN
                         PERFORM pg_sleep(random() * 0.003);
                         INSERT INTO stamps
                         SELECT NEW.writer, NEW.seq, NEW.epoch, t.epoch FROM pgtenant.tenants t
                          WHERE t.schema_name = current_schema();
                         RETURN NULL;
                     END $$;
                     DROP TRIGGER IF EXISTS stamp ON log;
                     CREATE CONSTRAINT TRIGGER stamp AFTER INSERT ON log DEFERRABLE INITIALLY DEFERRED
                         FOR EACH ROW EXECUTE FUNCTION stamp();",
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
}

/// One log row; `seen_max_epoch` is the highest epoch committed before this write. Written as
/// INSERT … SELECT, which Citus also runs on a distributed table (it refuses a subquery in
/// VALUES).
pub(crate) const APPEND_SQL: &str = "INSERT INTO log (epoch, seq, writer, seen_max_epoch)
     SELECT $1::bigint, $2::bigint, $3::text, coalesce(max(epoch), 0) FROM log";

pub(crate) async fn append(handle: &TenantHandle, writer: &str, seq: i64) -> pgtenant::Result<()> {
    let epoch = handle.epoch();
    let writer = writer.to_owned();
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.execute(APPEND_SQL, &[&epoch, &seq, &writer]).await?;
                Ok(())
            })
        })
        .await
}

/// A single bigint from a read-only fenced query.
pub(crate) async fn count_rows(handle: &TenantHandle, sql: &'static str) -> i64 {
    handle
        .read(move |tx| {
            Box::pin(async move { Ok::<_, pgtenant::Error>(tx.query_one(sql, &[]).await?.get(0)) })
        })
        .await
        .expect(sql)
}

/// Every row of the ledger's log: (epoch, seq, writer, seen_max_epoch).
pub(crate) async fn log_rows(handle: &TenantHandle) -> Vec<(i64, i64, String, i64)> {
    handle
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, pgtenant::Error>(
                    tx.query("SELECT epoch, seq, writer, seen_max_epoch FROM log", &[])
                        .await?
                        .iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                        .collect(),
                )
            })
        })
        .await
        .expect("read the log")
}

/// The sequence numbers in the ledger's log.
pub(crate) async fn log_seqs(handle: &TenantHandle) -> BTreeSet<i64> {
    handle
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, pgtenant::Error>(
                    tx.query("SELECT seq FROM log", &[])
                        .await?
                        .iter()
                        .map(|r| r.get(0))
                        .collect(),
                )
            })
        })
        .await
        .expect("read the log")
}
