//! `pgtenant demo` (cargo feature `demo`, off by default so that the shipped binary does not
//! link the test kit): three replicas, fenced writes, a refused open, a handoff to a waiting
//! replica, a lease session cut by the database, a crash, takeovers and stale writes refused by
//! PostgreSQL, in a few seconds.

use crate::cli::Connection;
use crate::commands::start_router;
use crate::commands::status::{status_of, StatusView};
use crate::conn::Target;
use crate::error::CliError;
use crate::output::out;

pub(crate) async fn run(connection: &Connection) -> Result<(), CliError> {
    // Without a URL the demo brings its own throwaway PostgreSQL, removed when it ends.
    let given = crate::commands::database_url(connection);
    let (_cluster, _database, url) = match given.clone() {
        Some(url) => (None, None, url),
        None => {
            say("no --database-url or DATABASE_URL: starting a throwaway PostgreSQL from this machine's initdb")?;
            let cluster = pgtenant_testkit::LocalCluster::start().await?;
            let database = cluster.create_database().await?;
            let url = database.url().to_owned();
            say(&format!("throwaway PostgreSQL at {url}"))?;
            (Some(cluster), Some(database), url)
        }
    };
    let target = Target::parse(&url, connection.connect_timeout)?;
    demo(&target).await?;
    let connected = target.connect().await?;
    out!("\n$ pgtenant status")?;
    status_of(&connected.client, StatusView::text()).await?;
    if given.is_some() {
        out!("\nlook with psql: psql '{url}' -c 'TABLE pgtenant.lease_status'")
    } else {
        out!("\nthe throwaway PostgreSQL is removed now; run with --database-url to keep the database and look with psql")
    }
}

fn say(line: &str) -> Result<(), CliError> {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    out!(
        "[{:>7.1} ms] {line}",
        start.elapsed().as_secs_f64() * 1000.0
    )
}

/// The main job in a few seconds: three replicas, fenced writes, LeaseHeld, a handoff to a
/// waiting replica, a crash, a lease session cut by the database, takeovers, a stale write
/// refused by PostgreSQL.
async fn demo(target: &Target) -> Result<(), CliError> {
    use pgtenant::{Error, RouterOptions, TenantHandle, TenantId};
    use std::time::Duration;

    let mut connected = target.connect().await?;
    let report = pgtenant::setup(&mut connected.client).await?;
    say(&format!("control plane ready (version {})", report.version))?;
    let options = |replica: &str| -> Result<RouterOptions, CliError> {
        let options = target.router_options(replica.to_owned(), &connected)?;
        Ok(options.ttl(Duration::from_secs(3)).pool_size(4))
    };
    let a = start_router(target, options("replica-a")?).await?;
    let b = start_router(target, options("replica-b")?).await?;
    let c = start_router(target, options("replica-c")?).await?;
    say("replica-a, -b and -c registered: each holds ONE advisory lock on its own lease session")?;

    async fn add(tenant: &TenantHandle, amount: i64) -> pgtenant::Result<()> {
        tenant
            .run(move |tx| {
                Box::pin(async move {
                    tx.batch_execute("CREATE TABLE IF NOT EXISTS entries (amount bigint NOT NULL)")
                        .await?;
                    tx.execute("INSERT INTO entries VALUES ($1)", &[&amount])
                        .await?;
                    Ok::<_, Error>(())
                })
            })
            .await
    }
    async fn total(tenant: &TenantHandle) -> pgtenant::Result<i64> {
        tenant
            .read(|tx| {
                Box::pin(async move {
                    let row = tx
                        .query_one("SELECT coalesce(sum(amount), 0)::bigint FROM entries", &[])
                        .await?;
                    Ok::<_, Error>(row.get(0))
                })
            })
            .await
    }

    let invoices = TenantId::new("acme", "invoices")?;
    let payroll = TenantId::new("globex", "payroll")?;
    let on_a = a.open_or_create(&invoices).await?;
    let on_b = b.open_or_create(&payroll).await?;
    say(&format!(
        "replica-a opened {invoices} (epoch {}, schema {}); replica-b opened {payroll}",
        on_a.epoch(),
        on_a.schema()
    ))?;
    for amount in [120, 80, 42] {
        add(&on_a, amount).await?;
    }
    add(&on_b, 7).await?;
    say("3 entries committed to acme/invoices, 1 to globex/payroll: each transaction fenced by its epoch inside PostgreSQL")?;

    match c.open(&invoices).await {
        Err(error @ Error::LeaseHeld { .. }) => {
            say(&format!("replica-c tries {invoices}: {error}"))
        }
        Err(other) => return Err(other.into()),
        Ok(_) => say("replica-c opened it?! (unexpected)"),
    }?;

    say("replica-c waits for acme/invoices (LISTEN/NOTIFY) while replica-a hands it off")?;
    let (waited, handed) = tokio::join!(c.wait_for(&invoices, Duration::from_secs(10)), async {
        // Let replica-c's first attempt find the tenant held, so it really waits.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        on_a.handoff().await.map(|()| started)
    });
    let handoff_started = handed?;
    let on_c = waited?;
    let took = handoff_started.elapsed();
    say(&format!(
        "handoff: replica-c serves {invoices} at epoch {} with sum {}, {:.1} ms after the handoff began; no data copied",
        on_c.epoch(),
        total(&on_c).await?,
        took.as_secs_f64() * 1000.0
    ))?;

    say("the database cuts replica-b's lease session (pg_terminate_backend)")?;
    connected
        .client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgtenant lease replica-b'",
            &[],
        )
        .await
        .map_err(CliError::db("terminate replica-b's lease session"))?;
    let cut = std::time::Instant::now();
    let taken = loop {
        match a.open(&payroll).await {
            Ok(handle) => break handle,
            Err(Error::LeaseHeld { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(other) => return Err(other.into()),
        }
    };
    say(&format!(
        "replica-a took over {payroll} at epoch {} after {:.1} ms; it sees sum {}",
        taken.epoch(),
        cut.elapsed().as_secs_f64() * 1000.0,
        total(&taken).await?
    ))?;
    match add(&on_b, -1000).await {
        Err(error) => say(&format!(
            "replica-b's old handle tries to write: refused ({error})"
        )),
        Ok(()) => say("replica-b's old handle wrote?! (unexpected)"),
    }?;

    say("replica-c crashes (its process would die: here its router is dropped)")?;
    drop(c);
    let recovered = loop {
        match a.open(&invoices).await {
            Ok(handle) => break handle,
            Err(Error::LeaseHeld { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(other) => return Err(other.into()),
        }
    };
    say(&format!(
        "replica-a took over {invoices} at epoch {}: sum {}",
        recovered.epoch(),
        total(&recovered).await?
    ))?;
    match add(&on_c, -1000).await {
        Err(error) => say(&format!(
            "the crashed owner's stale handle tries to write: refused ({error})"
        )),
        Ok(()) => say("the stale handle wrote?! (unexpected)"),
    }?;
    for (name, router) in [("replica-a", &a), ("replica-b", &b)] {
        let report = router.close().await;
        say(&format!(
            "{name} closed: handed off {} tenant(s), {} failed",
            report.handed_off.len(),
            report.failed.len()
        ))?;
    }
    Ok(())
}
