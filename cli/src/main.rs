//! `pgtenant`: set up, inspect and demonstrate pgtenant from the command line.

use std::process::ExitCode;

use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

const USAGE: &str = "\
pgtenant: many replicas share many tenants through one PostgreSQL

USAGE:
    pgtenant <COMMAND> [--database-url URL] [--json]

COMMANDS:
    setup     create or upgrade the control plane (schema pgtenant); idempotent
    status    print replicas and tenants from pgtenant.replica_status and pgtenant.lease_status
    demo      show pgtenant working; without a URL it starts a throwaway PostgreSQL
    help      print this text

OPTIONS:
    --database-url URL   the database (default: $DATABASE_URL)
    --json               machine-readable output (status)
";

struct Args {
    command: String,
    database_url: Option<String>,
    json: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut command = None;
    let mut database_url = None;
    let mut json = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--database-url" => {
                database_url = Some(args.next().ok_or(
                    "--database-url needs a value, e.g. postgres://postgres@127.0.0.1/app",
                )?);
            }
            "--json" => json = true,
            "-h" | "--help" => command = Some("help".to_owned()),
            other if other.starts_with("--database-url=") => {
                database_url = Some(other["--database-url=".len()..].to_owned());
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown option {other:?}; see `pgtenant help`"))
            }
            other if command.is_none() => command = Some(other.to_owned()),
            other => {
                return Err(format!(
                    "unexpected argument {other:?}; see `pgtenant help`"
                ))
            }
        }
    }
    Ok(Args {
        command: command.unwrap_or_else(|| "help".to_owned()),
        database_url: database_url.or_else(|| std::env::var("DATABASE_URL").ok()),
        json,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let outcome = match args.command.as_str() {
        "help" => {
            print!("{USAGE}");
            Ok(())
        }
        "setup" => with_database(&args, |client| Box::pin(cmd_setup(client))).await,
        "status" => {
            let json = args.json;
            with_database(&args, move |client| Box::pin(cmd_status(client, json))).await
        }
        "demo" => cmd_demo(&args).await,
        other => Err(format!("unknown command {other:?}; see `pgtenant help`")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

type CommandFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + 'a>>;

async fn with_database(
    args: &Args,
    command: impl for<'a> FnOnce(&'a mut Client) -> CommandFuture<'a>,
) -> Result<(), String> {
    let url = args
        .database_url
        .as_deref()
        .ok_or("no database: pass --database-url URL or set DATABASE_URL")?;
    let mut client = connect(url).await?;
    command(&mut client).await
}

async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|error| format!("cannot connect to the database: {}", describe(&error)))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("database connection ended: {}", describe(&error));
        }
    });
    Ok(client)
}

/// tokio-postgres' Display leaves out the server's message and the I/O cause.
fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        text.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    text
}

async fn cmd_setup(client: &mut Client) -> Result<(), String> {
    let report = pgtenant::setup(client).await.map_err(|e| e.to_string())?;
    if report.applied.is_empty() {
        println!("control plane is up to date (version {})", report.version);
    } else {
        println!(
            "control plane at version {}; applied {}",
            report.version,
            report.applied.join(", ")
        );
    }
    Ok(())
}

async fn cmd_status(client: &mut Client, json: bool) -> Result<(), String> {
    let version = pgtenant::control_plane_version(client)
        .await
        .map_err(|e| e.to_string())?;
    if version == 0 {
        return Err(
            "this database has no pgtenant control plane: run `pgtenant setup` first".into(),
        );
    }
    let replicas = "SELECT replica_id, alive, lock_held, incarnation, tenants_held, expires_in, backend_pid, started_at::timestamp(0) AS started_at FROM pgtenant.replica_status";
    let tenants = "SELECT tenant, state, owner, epoch, owner_alive, expires_in, schema, version, quarantine_cause FROM pgtenant.lease_status";
    if json {
        let sql = format!(
            "SELECT json_build_object('control_plane_version', {version}::int,
                    'replicas', (SELECT coalesce(json_agg(r), '[]') FROM ({replicas}) r),
                    'tenants', (SELECT coalesce(json_agg(t), '[]') FROM ({tenants}) t))::text"
        );
        let text = single_text(client, &sql).await?;
        println!("{text}");
        return Ok(());
    }
    println!("control plane version {version}\n");
    println!("replicas (pgtenant.replica_status):");
    print_table(client, replicas).await?;
    println!("\ntenants (pgtenant.lease_status):");
    print_table(client, tenants).await?;
    Ok(())
}

async fn single_text(client: &Client, sql: &str) -> Result<String, String> {
    for message in client.simple_query(sql).await.map_err(|e| describe(&e))? {
        if let SimpleQueryMessage::Row(row) = message {
            return Ok(row.get(0).unwrap_or("").to_owned());
        }
    }
    Err(format!("no row from {sql}"))
}

/// Prints any query as an aligned text table; simple_query hands every value over as text.
async fn print_table(client: &Client, sql: &str) -> Result<(), String> {
    let mut header: Vec<String> = Vec::new();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for message in client.simple_query(sql).await.map_err(|e| describe(&e))? {
        match message {
            SimpleQueryMessage::RowDescription(columns) => {
                header = columns.iter().map(|c| c.name().to_owned()).collect();
            }
            SimpleQueryMessage::Row(row) => rows.push(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or("").to_owned())
                    .collect(),
            ),
            _ => {}
        }
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|row| row[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    println!("  {}", line(&header));
    for row in &rows {
        println!("  {}", line(row));
    }
    if rows.is_empty() {
        println!("  (none)");
    }
    Ok(())
}

async fn cmd_demo(args: &Args) -> Result<(), String> {
    // Without a URL the demo brings its own throwaway PostgreSQL, removed when it ends.
    let (_cluster, _database, url) = match &args.database_url {
        Some(url) => (None, None, url.clone()),
        None => {
            say("no --database-url or DATABASE_URL: starting a throwaway PostgreSQL from this machine's initdb");
            let cluster = pgtenant_testkit::LocalCluster::start()
                .await
                .map_err(|e| e.to_string())?;
            let database = cluster.create_database().await.map_err(|e| e.to_string())?;
            let url = database.url().to_owned();
            say(&format!("throwaway PostgreSQL at {url}"));
            (Some(cluster), Some(database), url)
        }
    };
    demo(&url).await.map_err(|e| e.to_string())?;
    let mut client = connect(&url).await?;
    println!("\n$ pgtenant status");
    cmd_status(&mut client, false).await?;
    if args.database_url.is_some() {
        println!("\nlook with psql: psql '{url}' -c 'TABLE pgtenant.lease_status'");
    } else {
        println!("\nthe throwaway PostgreSQL is removed now; run with --database-url to keep the database and look with psql");
    }
    Ok(())
}

fn say(line: &str) {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    println!(
        "[{:>7.1} ms] {line}",
        start.elapsed().as_secs_f64() * 1000.0
    );
}

/// The main job in a few seconds: three replicas, fenced writes, LeaseHeld, a handoff to a
/// waiting replica, a crash, a lease session cut by the database, takeovers, a stale write
/// refused by PostgreSQL.
async fn demo(url: &str) -> pgtenant::Result<()> {
    use pgtenant::{Error, Router, RouterOptions, TenantHandle, TenantId};
    use std::time::Duration;

    let mut client = connect(url).await.map_err(|reason| Error::InvalidOption {
        option: "database_url",
        reason,
    })?;
    let report = pgtenant::setup(&mut client).await?;
    say(&format!("control plane ready (version {})", report.version));
    let options = |replica: &str| -> pgtenant::Result<RouterOptions> {
        Ok(RouterOptions::from_url(replica, url)?
            .ttl(Duration::from_secs(3))
            .pool_size(4))
    };
    let a = Router::start(options("replica-a")?).await?;
    let b = Router::start(options("replica-b")?).await?;
    let c = Router::start(options("replica-c")?).await?;
    say("replica-a, -b and -c registered: each holds ONE advisory lock on its own lease session");

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
    ));
    for amount in [120, 80, 42] {
        add(&on_a, amount).await?;
    }
    add(&on_b, 7).await?;
    say("3 entries committed to acme/invoices, 1 to globex/payroll: each transaction fenced by its epoch inside PostgreSQL");

    match c.open(&invoices).await {
        Err(error @ Error::LeaseHeld { .. }) => {
            say(&format!("replica-c tries {invoices}: {error}"))
        }
        Err(other) => return Err(other),
        Ok(_) => say("replica-c opened it?! (unexpected)"),
    }

    say("replica-c waits for acme/invoices (LISTEN/NOTIFY) while replica-a hands it off");
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
    ));

    say("the database cuts replica-b's lease session (pg_terminate_backend)");
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgtenant lease replica-b'",
            &[],
        )
        .await?;
    let cut = std::time::Instant::now();
    let taken = loop {
        match a.open(&payroll).await {
            Ok(handle) => break handle,
            Err(Error::LeaseHeld { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(other) => return Err(other),
        }
    };
    say(&format!(
        "replica-a took over {payroll} at epoch {} after {:.1} ms; it sees sum {}",
        taken.epoch(),
        cut.elapsed().as_secs_f64() * 1000.0,
        total(&taken).await?
    ));
    match add(&on_b, -1000).await {
        Err(error) => say(&format!(
            "replica-b's old handle tries to write: refused ({error})"
        )),
        Ok(()) => say("replica-b's old handle wrote?! (unexpected)"),
    }

    say("replica-c crashes (its process would die: here its router is dropped)");
    drop(c);
    let recovered = loop {
        match a.open(&invoices).await {
            Ok(handle) => break handle,
            Err(Error::LeaseHeld { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(other) => return Err(other),
        }
    };
    say(&format!(
        "replica-a took over {invoices} at epoch {}: sum {}",
        recovered.epoch(),
        total(&recovered).await?
    ));
    match add(&on_c, -1000).await {
        Err(error) => say(&format!(
            "the crashed owner's stale handle tries to write: refused ({error})"
        )),
        Ok(()) => say("the stale handle wrote?! (unexpected)"),
    }
    for (name, router) in [("replica-a", &a), ("replica-b", &b)] {
        let report = router.close().await;
        say(&format!(
            "{name} closed: handed off {} tenant(s), {} failed",
            report.handed_off.len(),
            report.failed.len()
        ));
    }
    Ok(())
}
