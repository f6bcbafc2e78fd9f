//! The `walrus` command: `serve` runs the proxy; `status`, `checkpoint` and `backup` ask a
//! running walrus (over its metrics endpoint, [`http_client`]); `verify` checks a data
//! directory offline; `journal` maintains the journal.

mod admin;
mod durable;
mod fds;
mod http_client;
pub mod journal;
mod serve;
mod status;
mod verify;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// The CLI's error: why walrus cannot start or go on. Every layer below has its own type
/// (`JournalError`, `UpstreamError`, `Refusal`, ...); here they meet, are printed for the
/// operator, and the process exits non-zero.
type Fatal = Box<dyn std::error::Error + Send + Sync>;

/// walrus: a durability proxy for in-memory Valkey.
///
/// Clients connect to walrus instead of Valkey. walrus forwards every command, journals
/// every write to local disk, and acknowledges a write only once it is durable.
#[derive(Debug, Parser)]
#[command(name = "walrus", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (and, in managed mode, its valkey-server).
    Serve(ServeArgs),
    /// Show a running walrus's status (over its metrics endpoint).
    Status(status::StatusArgs),
    /// Ask a running walrus to take a checkpoint now (over its metrics endpoint, from
    /// loopback), and wait for it.
    Checkpoint(admin::CheckpointArgs),
    /// Copy a running walrus's checkpoint and journal into a new data directory on its host
    /// (over its metrics endpoint, from loopback); with --data-dir, a stopped walrus's,
    /// optionally into a ring of another size.
    Backup(admin::BackupArgs),
    /// Check a data directory offline (walrus stopped, or a backup): would a restore from
    /// it succeed, and what would it load? Exit 0 yes, 1 no, 2 usage errors.
    Verify(verify::VerifyArgs),
    /// Journal maintenance: init, inspect, verify, repair, export-aof.
    #[command(subcommand)]
    Journal(journal::JournalCommand),
}

/// Flags override the configuration file, which overrides the built-in defaults
/// (the documented defaults are in config.toml).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address clients connect to [default: 127.0.0.1:6379].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Valkey to use, host:port; switches upstream.mode to "external".
    #[arg(long, value_name = "ADDR")]
    pub upstream: Option<String>,
    /// Data directory: journal, checkpoints, managed Valkey's working dir [default: walrus-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Prometheus, health and readiness endpoint, host:port; "" disables it [default: 127.0.0.1:8379].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Status(args) => status::run(args),
        Command::Checkpoint(args) => admin::checkpoint(args),
        Command::Backup(args) => admin::backup(args),
        Command::Verify(args) => verify::verify(args),
        Command::Journal(cmd) => journal::run(cmd),
    }
}
