//! `pgtenant`: set up, inspect and demonstrate pgtenant from the command line.

use std::process::ExitCode;

use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use tokio_postgres_rustls::MakeRustlsConnect;

mod tls;

const USAGE: &str = "\
pgtenant: many replicas share many tenants through one PostgreSQL

USAGE:
    pgtenant <COMMAND> [--database-url URL] [--json]

COMMANDS:
    setup                 create or upgrade the control plane (schema pgtenant); idempotent
    status                replicas and tenants, from pgtenant.replica_status and lease_status
    tenants               tenants, a page at a time:
                            [--owner REPLICA] [--state STATE] [--quarantined | --healthy]
                            [--behind VERSION] [--after ORG/LEDGER] [--limit N]
    show ORG/LEDGER       one tenant's record
    trash                 trashed schemas
    sweep                 drop trashed schemas past retention and masked ones
                            [--retention 7d]   (s, m, h or d)
    migrate --dir DIR     bring every tenant up to the SQL migrations in DIR (V<n>__name.sql)
                            [--concurrency 8] [--replica ID]
    clear ORG/LEDGER      clear a tenant's quarantine (after repairing what it names)
    demo                  show pgtenant working; without a URL it starts a throwaway PostgreSQL
    help                  print this text

OPTIONS:
    --database-url URL    the database (default: $DATABASE_URL)
    --json                machine-readable output
";

struct Args {
    command: String,
    database_url: Option<String>,
    json: bool,
    /// Positional arguments after the command.
    positional: Vec<String>,
    /// `--name value` options and `--flag` switches (value "true").
    options: std::collections::BTreeMap<String, String>,
}

/// Options that take a value, per command; every other `--x` is refused.
const VALUED: [&str; 9] = [
    "--owner",
    "--state",
    "--behind",
    "--after",
    "--limit",
    "--retention",
    "--dir",
    "--concurrency",
    "--replica",
];
const SWITCHES: [&str; 2] = ["--quarantined", "--healthy"];

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut command = None;
    let mut database_url = None;
    let mut json = false;
    let mut positional = Vec::new();
    let mut options = std::collections::BTreeMap::new();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                (name.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        match name.as_str() {
            "--database-url" => {
                database_url = Some(inline.or_else(|| args.next()).ok_or(
                    "--database-url needs a value, e.g. postgres://postgres@127.0.0.1/app",
                )?);
            }
            "--json" => json = true,
            "-h" | "--help" => command = Some("help".to_owned()),
            option if VALUED.contains(&option) => {
                let value = inline
                    .or_else(|| args.next())
                    .ok_or(format!("{option} needs a value; see `pgtenant help`"))?;
                options.insert(option.to_owned(), value);
            }
            switch if SWITCHES.contains(&switch) => {
                options.insert(switch.to_owned(), "true".to_owned());
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown option {other:?}; see `pgtenant help`"))
            }
            other if command.is_none() => command = Some(other.to_owned()),
            other => positional.push(other.to_owned()),
        }
    }
    Ok(Args {
        command: command.unwrap_or_else(|| "help".to_owned()),
        database_url: database_url.or_else(|| std::env::var("DATABASE_URL").ok()),
        json,
        positional,
        options,
    })
}

impl Args {
    fn option(&self, name: &str) -> Option<&str> {
        self.options.get(name).map(String::as_str)
    }

    fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.option(name) {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|_| format!("{name} takes a whole number, not {text:?}")),
        }
    }

    /// The one ORG/LEDGER argument of `show` and `clear`.
    fn tenant(&self) -> Result<pgtenant::TenantId, String> {
        match self.positional.as_slice() {
            [key] => pgtenant::TenantId::parse(key).map_err(|e| e.to_string()),
            _ => Err(format!(
                "`pgtenant {}` takes one ORG/LEDGER argument",
                self.command
            )),
        }
    }
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
        "tenants" => cmd_tenants(&args).await,
        "show" => cmd_show(&args).await,
        "trash" => cmd_trash(&args).await,
        "sweep" => cmd_sweep(&args).await,
        "migrate" => cmd_migrate(&args).await,
        "clear" => cmd_clear(&args).await,
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
    let (config, tls) = parse_url(url)?;
    let failed = |error: tokio_postgres::Error| {
        format!("cannot connect to the database: {}", describe(&error))
    };
    let ended = |error: tokio_postgres::Error| {
        eprintln!("database connection ended: {}", describe(&error));
    };
    match tls {
        None => {
            let (client, connection) = config.connect(NoTls).await.map_err(failed)?;
            tokio::spawn(async move { connection.await.map_err(ended) });
            Ok(client)
        }
        Some(tls) => {
            let (client, connection) = config.connect(tls).await.map_err(failed)?;
            tokio::spawn(async move { connection.await.map_err(ended) });
            Ok(client)
        }
    }
}

/// Router options for `url`, with TLS as [`connect`] makes it.
fn router_options(replica: String, url: &str) -> Result<pgtenant::RouterOptions, String> {
    let (config, tls) = parse_url(url)?;
    let options = pgtenant::RouterOptions::new(replica, config);
    Ok(match tls {
        None => options,
        Some(tls) => options.tls(tls),
    })
}

/// The URL's connection settings, and the TLS connector its `sslmode` asks for (none for
/// `disable`).
fn parse_url(url: &str) -> Result<(tokio_postgres::Config, Option<MakeRustlsConnect>), String> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|error| format!("bad database URL: {}", describe(&error)))?;
    let tls = match config.get_ssl_mode() {
        SslMode::Disable => None,
        _ => Some(tls::connector()?),
    };
    Ok((config, tls))
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
    let supported = pgtenant::supported_version();
    if version < supported {
        println!(
            "control plane version {version}: this pgtenant needs {supported}, and routers refuse \
             to start until `pgtenant setup` upgrades it\n"
        );
    } else {
        println!("control plane version {version}\n");
    }
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

/// Prints rows as an aligned text table.
fn print_rows(header: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|row| row[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    println!("  {}", line(header.to_vec()));
    for row in rows {
        println!("  {}", line(row.iter().map(String::as_str).collect()));
    }
    if rows.is_empty() {
        println!("  (none)");
    }
}

fn opt(value: &Option<impl ToString>) -> String {
    value.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn print_json(value: &impl serde::Serialize) -> Result<(), String> {
    println!(
        "{}",
        serde_json::to_string_pretty(value).map_err(|e| e.to_string())?
    );
    Ok(())
}

async fn cmd_tenants(args: &Args) -> Result<(), String> {
    let mut query = pgtenant::TenantQuery::default();
    query.owner = args.option("--owner").map(str::to_owned);
    query.state = args.option("--state").map(str::to_owned);
    query.after = args.option("--after").map(str::to_owned);
    query.limit = args.number("--limit", 100)?;
    query.behind = args
        .option("--behind")
        .map(|_| args.number("--behind", 0))
        .transpose()?;
    query.quarantined = match (args.option("--quarantined"), args.option("--healthy")) {
        (Some(_), Some(_)) => return Err("--quarantined and --healthy exclude each other".into()),
        (Some(_), None) => Some(true),
        (None, Some(_)) => Some(false),
        (None, None) => None,
    };
    let client = connect_to(args).await?;
    let records = pgtenant::list_tenants(&client, &query)
        .await
        .map_err(|e| e.to_string())?;
    if args.json {
        return print_json(&records);
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.tenant.clone(),
                r.state.clone(),
                opt(&r.owner),
                r.epoch.to_string(),
                r.version.to_string(),
                opt(&r.schema),
                opt(&r.quarantine_cause),
            ]
        })
        .collect();
    print_rows(
        &[
            "tenant",
            "state",
            "owner",
            "epoch",
            "version",
            "schema",
            "quarantine",
        ],
        &rows,
    );
    if records.len() as i64 == query.limit {
        if let Some(last) = records.last() {
            println!("  … more: --after {}", last.tenant);
        }
    }
    Ok(())
}

async fn cmd_show(args: &Args) -> Result<(), String> {
    let id = args.tenant()?;
    let client = connect_to(args).await?;
    let record = pgtenant::show_tenant(&client, &id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or(format!("tenant {id} is unknown to this control plane"))?;
    if args.json {
        return print_json(&record);
    }
    let fields = [
        ("tenant", record.tenant.clone()),
        ("state", record.state.clone()),
        ("created", record.created_at.clone()),
        ("schema", opt(&record.schema)),
        ("version", record.version.to_string()),
        ("owner", opt(&record.owner)),
        ("owner alive", opt(&record.owner_alive)),
        ("epoch", record.epoch.to_string()),
        ("acquired", opt(&record.acquired_at)),
        ("forgotten at epoch", record.forgotten_at_epoch.to_string()),
        ("quarantine", opt(&record.quarantine_cause)),
        ("repair", opt(&record.quarantine_repair)),
    ];
    for (name, value) in fields {
        println!("{name:>18}: {value}");
    }
    Ok(())
}

async fn cmd_trash(args: &Args) -> Result<(), String> {
    let client = connect_to(args).await?;
    let trash = pgtenant::list_trash(&client)
        .await
        .map_err(|e| e.to_string())?;
    if args.json {
        return print_json(&trash);
    }
    let rows: Vec<Vec<String>> = trash
        .iter()
        .map(|t| {
            vec![
                t.schema.clone(),
                t.tenant.clone(),
                t.epoch.to_string(),
                t.trashed_at.clone(),
                opt(&t.swept_at),
            ]
        })
        .collect();
    print_rows(&["schema", "tenant", "epoch", "trashed", "swept"], &rows);
    Ok(())
}

async fn cmd_sweep(args: &Args) -> Result<(), String> {
    let retention = match args.option("--retention") {
        Some(text) => pgtenant::parse_duration(text).map_err(|e| e.to_string())?,
        None => pgtenant::SweepOptions::default().retention,
    };
    let mut client = connect_to(args).await?;
    let json = args.json;
    let report = pgtenant::sweep(
        &mut client,
        &pgtenant::SweepOptions::with_retention(retention),
        |schema, dropped| {
            if !json {
                println!("  {schema}: {dropped} objects dropped");
            }
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    if json {
        return print_json(&report);
    }
    println!(
        "swept {} schema(s) ({} masked); kept {} within retention; deferred {}; unknown {}; pruned {} journal row(s)",
        report.swept.len(),
        report.masked.len(),
        report.kept,
        report.deferred.len(),
        report.unknown.len(),
        report.history_pruned
    );
    for (schema, why) in &report.deferred {
        println!("  deferred {schema}: {why}");
    }
    for schema in &report.unknown {
        println!("  unknown {schema}: no tenant accounts for it; left alone");
    }
    Ok(())
}

async fn cmd_migrate(args: &Args) -> Result<(), String> {
    let dir = args
        .option("--dir")
        .ok_or("`pgtenant migrate` needs --dir DIR with the tenant migrations (V<n>__name.sql)")?;
    let migrations = refinery::load_sql_migrations(dir)
        .map_err(|e| format!("cannot load migrations from {dir}: {e}"))?;
    if migrations.is_empty() {
        return Err(format!("no V<n>__name.sql migrations in {dir}"));
    }
    let concurrency = args.number("--concurrency", 8)?;
    let replica = args
        .option("--replica")
        .map(str::to_owned)
        .unwrap_or_else(|| format!("pgtenant-cli-{}", std::process::id()));
    let url = args
        .database_url
        .as_deref()
        .ok_or("no database: pass --database-url URL or set DATABASE_URL")?;
    let options = router_options(replica, url)?.migrations(refinery::Runner::new(&migrations));
    let router = pgtenant::Router::start(options)
        .await
        .map_err(|e| e.to_string())?;
    let json = args.json;
    let results = router
        .migrate_all(concurrency, |step| {
            if !json {
                println!(
                    "  [{}/{}] {}: {:?}",
                    step.done, step.total, step.tenant, step.outcome
                );
            }
        })
        .await
        .map_err(|e| e.to_string());
    router.close().await;
    let results = results?;
    if json {
        return print_json(&results);
    }
    let count = |f: fn(&pgtenant::MigrationOutcome) -> bool| {
        results.iter().filter(|r| f(&r.outcome)).count()
    };
    println!(
        "{} tenant(s) behind: {} migrated, {} held elsewhere, {} quarantined, {} failed",
        results.len(),
        count(|o| matches!(o, pgtenant::MigrationOutcome::Migrated { .. })),
        count(|o| matches!(o, pgtenant::MigrationOutcome::HeldElsewhere { .. })),
        count(|o| matches!(o, pgtenant::MigrationOutcome::Quarantined { .. })),
        count(|o| matches!(o, pgtenant::MigrationOutcome::Failed { .. })),
    );
    Ok(())
}

async fn cmd_clear(args: &Args) -> Result<(), String> {
    let id = args.tenant()?;
    let client = connect_to(args).await?;
    let by = format!("pgtenant-cli-{}", std::process::id());
    let cleared = pgtenant::clear_quarantine(&client, &id, &by)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "{}",
        if cleared {
            format!("quarantine of {id} cleared")
        } else {
            format!("{id} was not quarantined")
        }
    );
    Ok(())
}

async fn connect_to(args: &Args) -> Result<Client, String> {
    let url = args
        .database_url
        .as_deref()
        .ok_or("no database: pass --database-url URL or set DATABASE_URL")?;
    connect(url).await
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
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    print_rows(&header, &rows);
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
        let options =
            router_options(replica.to_owned(), url).map_err(|reason| Error::InvalidOption {
                option: "database_url",
                reason,
            })?;
        Ok(options.ttl(Duration::from_secs(3)).pool_size(4))
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
