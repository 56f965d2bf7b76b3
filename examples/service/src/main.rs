//! `pgtenant-example-service`: one replica of the example HTTP service.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres app   # once: the service sets up pgtenant in it
//! cargo run -p pgtenant-example-service -- --database-url postgres://postgres@127.0.0.1/app \
//!     --replica-id replica-a --listen 127.0.0.1:8080 --ttl 3s
//! ```
//!
//! Several replicas on one database share the tenants; a request that reaches a replica which
//! does not serve its tenant is forwarded once to the one that does (`--address` says where
//! that is). `--placement` (or `PLACEMENT=1`) gives each tenant a home replica: a request for a
//! tenant nobody serves is sent there, and tenants move home by themselves.
//!
//! Stops on SIGTERM or ctrl-c: no new connections, the requests in flight finish, every tenant
//! is handed off, and what happened is printed.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use pgtenant::{CloseReport, Router};
use pgtenant_example_service::{install_metrics, router_options, serve};
use tokio::net::TcpListener;

const USAGE: &str = "\
usage: pgtenant-example-service [--database-url URL] [--replica-id ID] [--listen ADDR] [--address URL] [--ttl DURATION] [--placement]

  --database-url URL  PostgreSQL, e.g. postgres://postgres@127.0.0.1/app  [env DATABASE_URL]
                      (the database must exist: createdb -h 127.0.0.1 -U postgres app)
  --replica-id ID     unique among the live replicas                       [env REPLICA_ID, default service-<pid>]
  --listen ADDR       address to serve HTTP on                             [env LISTEN, default 127.0.0.1:8080]
  --address URL       where other replicas and clients reach this one, registered with the
                      replica: requests for its tenants that reach another replica are
                      forwarded here (an http:// URL; anything else is only told, with a 409)
                                                                           [env ADDRESS, default http://<listen>]
  --placement         each tenant has a home replica (rendezvous hashing over the live
                      replicas): a request for a tenant nobody serves goes to its home, and
                      tenants move home by themselves; give every replica the same setting
                                                                           [env PLACEMENT=1, default off]
  --ttl DURATION      the lease ttl, e.g. 3s or 500ms (1s to 1h): how long a stopped replica
                      keeps its tenants before others take them over       [env TTL, default 10s]";

struct Config {
    database_url: String,
    replica_id: String,
    listen: SocketAddr,
    address: Option<String>,
    ttl: Option<Duration>,
    placement: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = match Config::from_args() {
        Ok(Some(config)) => config,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(report) => {
            print_report(&report);
            if report.failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> Result<CloseReport, Box<dyn std::error::Error>> {
    // First, so that nothing pgtenant records is lost.
    let metrics = install_metrics()?;
    tokio::spawn(upkeep(metrics.clone()));
    // Bind before registering the replica: a taken port fails here, with no lease involved.
    let listener = TcpListener::bind(config.listen).await.map_err(|error| {
        format!(
            "cannot listen on {}: {error}; pass another --listen address",
            config.listen
        )
    })?;
    // Idempotent and safe from many replicas starting at once; a deployment may instead run
    // `pgtenant setup` once before rolling out.
    pgtenant::setup_url(&config.database_url)
        .await
        .map_err(|error| match error.sqlstate() {
            // 3D000: no such database. The service sets pgtenant up in it, but does not create it.
            Some("3D000") => format!(
                "{error}: create the database first (createdb, or CREATE DATABASE in psql), \
                 then start the service again"
            )
            .into(),
            _ => Box::<dyn std::error::Error>::from(error),
        })?;
    let mut options = router_options(&config.replica_id, &config.database_url)?;
    if let Some(ttl) = config.ttl {
        options = options.ttl(ttl);
    }
    // The bound address, so that `--listen 127.0.0.1:0` registers the port it got.
    let address = match config.address {
        Some(address) => address,
        None => format!("http://{}", listener.local_addr()?),
    };
    options = options.address(address).placement(config.placement);
    let router = Router::start(options).await?;
    // Tests and scripts read this line to find the port of `--listen 127.0.0.1:0`.
    println!(
        "replica {} listening on http://{}",
        router.replica_id(),
        listener.local_addr()?
    );
    Ok(serve(listener, router, metrics, shutdown_signal()).await?)
}

/// Resolves on ctrl-c or SIGTERM (what container runtimes send before killing).
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            eprintln!("cannot listen for ctrl-c ({error}); stop with SIGTERM");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(error) => {
                eprintln!("cannot listen for SIGTERM ({error}); stop with ctrl-c");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    println!("shutting down: no new connections; requests in flight finish, then every tenant is handed off");
}

/// The exporter drains its histograms only when asked; without its own HTTP listener nobody
/// else asks.
async fn upkeep(metrics: PrometheusHandle) {
    let mut every = tokio::time::interval(Duration::from_secs(5));
    loop {
        every.tick().await;
        metrics.run_upkeep();
    }
}

fn print_report(report: &CloseReport) {
    println!(
        "closed: {} tenant(s) handed off, {} forgotten, {} failed",
        report.handed_off.len(),
        report.forgotten.len(),
        report.failed.len()
    );
    for tenant in &report.handed_off {
        println!("  handed off {tenant}");
    }
    for tenant in &report.forgotten {
        println!("  forgotten  {tenant}");
    }
    // Their leases ended with the replica's deregistration all the same: nothing is stuck.
    for (tenant, error) in &report.failed {
        println!("  failed     {tenant}: {error}");
    }
}

impl Config {
    /// None for `--help`.
    fn from_args() -> Result<Option<Config>, String> {
        let mut database_url = std::env::var("DATABASE_URL").ok();
        let mut replica_id = std::env::var("REPLICA_ID").ok();
        let mut listen = std::env::var("LISTEN").ok();
        let mut ttl = std::env::var("TTL").ok();
        let mut address = std::env::var("ADDRESS").ok();
        let mut placement = match std::env::var("PLACEMENT") {
            Ok(value) => parse_switch(&value)?,
            Err(_) => false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Ok(None);
            }
            if arg == "--placement" {
                placement = true;
                continue;
            }
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (arg, None),
            };
            let slot = match name.as_str() {
                "--database-url" => &mut database_url,
                "--replica-id" => &mut replica_id,
                "--listen" => &mut listen,
                "--ttl" => &mut ttl,
                "--address" => &mut address,
                other => return Err(format!("unknown argument {other:?}")),
            };
            let value = inline.or_else(|| args.next());
            *slot = Some(value.ok_or_else(|| format!("{name} needs a value"))?);
        }
        let database_url = database_url.ok_or(
            "no database: pass --database-url postgres://user@host:port/database or set DATABASE_URL",
        )?;
        let listen = listen.as_deref().unwrap_or("127.0.0.1:8080");
        let listen = listen.parse().map_err(|error| {
            format!("--listen {listen:?}: {error}; expected an address like 127.0.0.1:8080")
        })?;
        let ttl = ttl.as_deref().map(parse_duration).transpose()?;
        Ok(Some(Config {
            database_url,
            replica_id: replica_id.unwrap_or_else(|| format!("service-{}", std::process::id())),
            listen,
            address,
            ttl,
            placement,
        }))
    }
}

/// `PLACEMENT`'s value: `1` turns placement on, `0` (or nothing) leaves it off.
fn parse_switch(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" | "" => Ok(false),
        _ => Err(format!(
            "PLACEMENT={value:?}: expected 1 (placement on) or 0 (off)"
        )),
    }
}

/// `3s`, `500ms`, `2m`, or a number of seconds. The range is the router's to check
/// (`Router::start` says which values it takes).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |at| text.split_at(at));
    let value: u64 = number
        .parse()
        .map_err(|_| format!("--ttl {text:?}: expected a duration like 3s, 500ms or 2m"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "s" => Ok(Duration::from_secs(value)),
        "m" => Ok(Duration::from_secs(value.saturating_mul(60))),
        _ => Err(format!(
            "--ttl {text:?}: unknown unit {unit:?}; use ms, s or m (3s, 500ms, 2m)"
        )),
    }
}
