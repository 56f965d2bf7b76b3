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

/// The main job in one minute: two replicas, one tenant, a fenced write, a crash, a takeover.
async fn demo(url: &str) -> pgtenant::Result<()> {
    use pgtenant::{Error, Router, RouterOptions, TenantId};
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
    say(
        "replica-a and replica-b registered: each holds one liveness lock on its own lease session",
    );

    let id = TenantId::new("acme", "invoices")?;
    let tenant = a.open_or_create(&id).await?;
    say(&format!(
        "replica-a opened {id}: epoch {}, schema {}",
        tenant.epoch(),
        tenant.schema()
    ));
    for amount in [120_i64, 80, 42] {
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
            .await?;
    }
    say("replica-a committed 3 entries, each in a transaction fenced by epoch inside PostgreSQL");

    match b.open(&id).await {
        Err(error @ Error::LeaseHeld { .. }) => {
            say(&format!("replica-b tries to open it: {error}"))
        }
        Err(other) => return Err(other),
        Ok(_) => say("replica-b opened it?! (unexpected)"),
    }

    say("replica-a crashes (its lease session closes, PostgreSQL drops its liveness lock)");
    let stale = tenant.clone();
    drop(a);
    let taken = loop {
        match b.open(&id).await {
            Ok(handle) => break handle,
            Err(Error::LeaseHeld { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(other) => return Err(other),
        }
    };
    let total: i64 = taken
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, Error>(
                    tx.query_one("SELECT sum(amount)::bigint FROM entries", &[])
                        .await?
                        .get(0),
                )
            })
        })
        .await?;
    say(&format!(
        "replica-b took over {id} at epoch {}: it sees all 3 entries (sum {total}); no data was copied",
        taken.epoch()
    ));
    let refused = stale
        .run(|tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO entries VALUES (-1000)", &[])
                    .await?;
                Ok::<_, Error>(())
            })
        })
        .await;
    if let Err(error) = refused {
        say(&format!(
            "the crashed owner's stale handle tries to write: refused ({error})"
        ));
    }
    taken.release().await?;
    say("replica-b released the tenant");
    b.close().await;
    say("replica-b closed");
    Ok(())
}
