//! The daemon: what `walrus serve` runs once the command has its configuration ([`run`]).
//! It owns the data directory, starts walrus's tasks in the order that lets each rely on
//! those before it, supervises them until SIGTERM or SIGINT, and stops them in the order
//! that lets held replies drain, within a bound.
//!
//! - [`run`] (here): the data directory's lock, the log, the runtime.
//! - [`serve`]: the ports, Valkey, the durable half and the proxy, in order, until the stop.
//! - [`learn`]: what walrus learns of its Valkey before it serves.
//! - [`durable`]: the durable half: the journal and checkpoint store, the replica link, the
//!   checkpointer, the disk watcher, the archive's uploader, and their stop.
//! - [`listeners`]: the ports walrus listens on; [`fds`]: file descriptors for
//!   `proxy.max_clients`.
//! - [`readiness`]: what `/readyz` answers.
//! - [`signals`]: SIGTERM, SIGINT and SIGHUP, the service manager's watchdog, the bounded stop.
//! - [`data_dir`]: the data directory, private and one walrus's at a time (the offline
//!   commands take its lock too).

pub mod data_dir;
mod durable;
mod fds;
mod learn;
pub mod listeners;
mod readiness;
mod serve;
mod signals;

use crate::config::{Config, UpstreamMode};

/// The version `--version` prints and the log's first line names: the package's, and the
/// commit it was built from (build.rs; "unknown" outside a git checkout), and whether the
/// build has fail points ([`crate::fault`]: a test build).
#[cfg(not(feature = "failpoints"))]
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("WALRUS_COMMIT"), ")");
#[cfg(feature = "failpoints")]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("WALRUS_COMMIT"),
    ", with fail points: a test build)"
);

/// Why walrus cannot start or go on. Every layer below has its own type (`JournalError`,
/// `UpstreamError`, `Refusal`, ...); here they meet, and the command ([`crate::cli`]) prints
/// them for the operator and exits with the code their kind calls for.
pub type Fatal = Box<dyn std::error::Error + Send + Sync>;

/// Runs walrus as `config` says until it stops (SIGTERM, SIGINT) or cannot go on.
pub fn run(config: Config) -> Result<(), Fatal> {
    // The data directory's owner first, before ports, TLS files or Valkey: a second walrus
    // on it must leave it, and the first one's Valkey, as they were.
    let _owner = uses_data_dir(&config)
        .then(|| data_dir::own(&config.data.dir))
        .transpose()?;
    init_tracing(&config.log);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.proxy.worker_threads())
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime
        .block_on(serve::serve(config))
        .inspect_err(|e| tracing::error!("{e}"))
}

/// Whether walrus keeps anything in `data.dir`: the journal and checkpoints, or the managed
/// Valkey's working directory.
fn uses_data_dir(config: &Config) -> bool {
    config.durability.enabled || config.upstream.mode == UpstreamMode::Managed
}

fn init_tracing(log: &crate::config::LogConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(log.filter().unwrap_or_default()))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match log.format {
        crate::config::LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        crate::config::LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
