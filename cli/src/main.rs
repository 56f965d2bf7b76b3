//! `pgtenant`: set up, inspect and run pgtenant from the command line (`pgtenant --help`).
// Doc comments in cli.rs are the help texts clap prints, where `V<n>__name.sql` is plain text.
#![allow(rustdoc::invalid_html_tags)]

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod commands;
mod conn;
#[cfg(feature = "demo")]
mod demo;
mod duration;
mod error;
mod output;
mod tls;

use cli::{Cli, Command};
use error::CliError;

#[tokio::main]
async fn main() -> ExitCode {
    // clap exits with 2 on a usage error, 0 after --help and --version.
    let cli = Cli::parse();
    let connection = &cli.connection;
    let outcome = match &cli.command {
        Command::Setup(args) => commands::setup::run(connection, args).await,
        Command::Status(args) => commands::status::run(connection, args).await,
        Command::Tenants(args) => commands::tenants::run(connection, args).await,
        Command::Show(args) => commands::show::run(connection, args).await,
        Command::Trash(args) => commands::trash::run(connection, args).await,
        Command::Alarms(args) => commands::alarms::run(connection, args).await,
        Command::Sweep(args) => commands::sweep::run(connection, args).await,
        Command::Migrate(args) => commands::migrate::run(connection, args).await,
        Command::Clear(args) => commands::clear::run(connection, args).await,
        #[cfg(feature = "demo")]
        Command::Demo => demo::run(connection).await,
        #[cfg(not(feature = "demo"))]
        Command::Demo => {
            output::warn(
                "this pgtenant was built without the demo (it would link the test kit); run it \
                 from a checkout with: cargo run -p pgtenant-cli --features demo -- demo",
            );
            return ExitCode::from(2);
        }
    };
    exit(outcome)
}

fn exit(outcome: Result<(), CliError>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        // Whoever read the output stopped reading (`| head`): nothing is wrong.
        Err(error) if error.is_broken_pipe() => ExitCode::SUCCESS,
        Err(error) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr().lock(), "error: {error}");
            ExitCode::FAILURE
        }
    }
}
