//! Command line (placeholder until the proxy lands).
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(name = "walrus", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Journal maintenance: init, inspect, verify.
    #[command(subcommand)]
    Journal(crate::journal::cli::JournalCommand),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Journal(cmd) => crate::journal::cli::run(cmd),
    }
}
