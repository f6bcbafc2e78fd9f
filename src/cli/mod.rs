//! The `walrus` command: `serve` runs the daemon ([`crate::daemon`]); `status`,
//! `checkpoint` and `backup` ask a running walrus (over its metrics endpoint,
//! [`http_client`]); `verify` checks a data directory offline; `restore` restores one to a
//! point in time; `archive` lists, restores from and verifies the archive; `journal`
//! maintains the journal; `config` checks a configuration file; `completions` and `man`
//! document the command itself.
//!
//! Exit codes, one rule for every command: 0 done; 1 failed, and the same command may
//! succeed later (Valkey not reachable yet, an I/O error, a busy lock: another walrus owns
//! the data directory, until it stops); 2 nothing will change until a person acts: a usage
//! or configuration error, a journal whose geometry is not the configuration's, a corrupted
//! journal, a data directory whose parts do not prove what it holds (a lost or foreign
//! manifest), a request walrus refuses as given (an admin request answered 4xx), a file
//! system walrus cannot use as it is (a file where its directory belongs, no permission,
//! read-only, full, or too small for the ring). clap exits 2 on usage errors too; a
//! configuration file that does not exist yet is 1, as it may yet be written. The systemd unit restarts on 1 and not on
//! 2 (`RestartPreventExitStatus=2`), so a mistake is reported once, not retried forever.

mod admin;
mod archive;
mod config;
mod http_client;
pub mod journal;
mod manual;
mod restore;
mod serve;
mod status;
mod verify;

use crate::config::ConfigError;
use crate::daemon::data_dir::{lock, of_journal};
use crate::daemon::{Fatal, VERSION};
use crate::journal::lock::{Access, DirLock};
use crate::journal::JournalError;
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code: trying again may succeed.
pub const EXIT_RETRY: u8 = 1;
/// Exit code: a person must act first (see the module's doc).
pub const EXIT_FIX: u8 = 2;

/// The exit code for an error that reached the top: [`EXIT_FIX`] when it, or any error it
/// wraps, is one a person must fix; otherwise [`EXIT_RETRY`]. A configuration or password
/// file that does not exist yet is worth a retry: it may be written by an agent that starts
/// alongside walrus (a secret rendered at boot); one that cannot be read otherwise (not
/// UTF-8, a directory, no permission), or an empty token file, is a mistake. The TLS
/// certificate, key and CA files follow the same rule: missing is 1; unreadable, expired,
/// not yet valid, or a key that is not the certificate's is 2.
fn exit_code(e: &(dyn std::error::Error + 'static)) -> ExitCode {
    let mut next = Some(e);
    while let Some(e) = next {
        // The TLS files are configuration too, read like the secret files.
        if let Some(t) = e.downcast_ref::<crate::net::tls::TlsError>() {
            return ExitCode::from(if t.missing_file() {
                EXIT_RETRY
            } else {
                EXIT_FIX
            });
        }
        if let Some(c) = e.downcast_ref::<ConfigError>() {
            let missing = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
            return ExitCode::from(match c {
                ConfigError::Read { source, .. } | ConfigError::SecretFile { source, .. }
                    if missing(source) =>
                {
                    EXIT_RETRY
                }
                _ => EXIT_FIX,
            });
        }
        // Another walrus's archive, a damaged one, or [archive] that cannot work: a person
        // must act. An archive that cannot be reached (a bootstrap) is retried.
        if let Some(a) = e.downcast_ref::<crate::archive::ArchiveError>() {
            use crate::archive::ArchiveError as A;
            return ExitCode::from(match a {
                A::Config(_) | A::Owner(_) | A::Corrupt(_) | A::Malformed(_) => EXIT_FIX,
                A::Store(_) | A::Local(_) => EXIT_RETRY,
            });
        }
        if let Some(crate::restore::RestoreError::Refused(_)) = e.downcast_ref() {
            return ExitCode::from(EXIT_FIX);
        }
        if let Some(crate::datadir::DataDirError::Refused(_)) = e.downcast_ref() {
            return ExitCode::from(EXIT_FIX);
        }
        // A ring its volume cannot hold: shrink one or grow the other.
        if let Some(crate::disk::DiskError::NoRoom(_)) = e.downcast_ref() {
            return ExitCode::from(EXIT_FIX);
        }
        let must_fix = e.downcast_ref::<JournalError>().is_some_and(|j| {
            matches!(
                j,
                JournalError::Config(_)
                    | JournalError::Layout(_)
                    | JournalError::Manifest(_)
                    | JournalError::Corrupt(_)
            )
        });
        if must_fix || io_must_fix(e) {
            return ExitCode::from(EXIT_FIX);
        }
        next = e.source();
    }
    ExitCode::from(EXIT_RETRY)
}

/// A file-system error that waiting does not cure: a path that is a file where a directory
/// belongs (or the reverse), no permission, a read-only or full file system (a ring larger
/// than its volume), a quota reached. Other I/O errors (an interrupted or timed-out call, a
/// device error that may pass) are worth a retry.
fn io_must_fix(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    let io = e.downcast_ref::<std::io::Error>().or_else(|| {
        e.downcast_ref::<std::sync::Arc<std::io::Error>>()
            .map(|a| &**a)
    });
    io.is_some_and(|io| {
        matches!(
            io.kind(),
            K::AlreadyExists
                | K::NotADirectory
                | K::IsADirectory
                | K::PermissionDenied
                | K::ReadOnlyFilesystem
                | K::StorageFull
                | K::QuotaExceeded
        )
    })
}

/// [`lock`](crate::daemon::data_dir::lock) for an offline command on `journal_dir`: its data directory's, if it belongs to
/// one that exists (a command on a directory that does not exist says so itself, and
/// creates nothing). A refusal is printed, and its exit code returned.
fn lock_for_command(journal_dir: &Path, access: Access) -> Result<Option<DirLock>, ExitCode> {
    of_journal(journal_dir)
        .filter(|d| d.is_dir())
        .map(|d| lock(d, access))
        .transpose()
        .map_err(|e| {
            eprintln!("walrus: {e}");
            ExitCode::from(EXIT_RETRY)
        })
}

/// walrus: a durability proxy for in-memory Valkey.
///
/// Clients connect to walrus instead of Valkey. walrus forwards every command, journals
/// every write to local disk, and acknowledges a write only once it is durable.
#[derive(Debug, Parser)]
#[command(name = "walrus", version = VERSION, about, long_about)]
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
    /// it succeed, and what would it load? Exit 0 yes, 2 no (the problem is named).
    Verify(verify::VerifyArgs),
    /// Restore a data directory to a point in time (--until TIME, --until-offset N,
    /// --before-command FLUSHALL): what a stopped walrus's data directory or a backup holds,
    /// up to there, into a new data directory that `walrus serve` starts from.
    Restore(restore::RestoreArgs),
    /// The archive in object storage: list its restore points, restore a data directory
    /// from it, verify it with a restore drill.
    #[command(subcommand)]
    Archive(archive::ArchiveCommand),
    /// Journal maintenance: init, inspect, verify, repair, export-aof.
    #[command(subcommand)]
    Journal(journal::JournalCommand),
    /// Check a configuration file, or print the JSON Schema of one.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(manual::CompletionsArgs),
    /// Print walrus's man page (roff), or write one page per command into a directory.
    Man(manual::ManArgs),
}

/// Flags override the configuration file, which overrides the built-in defaults
/// (the documented defaults are in config.toml).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address plaintext clients connect to; "" for none (TLS clients only, at tls.listen)
    /// [default: 127.0.0.1:6379].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Valkey to use, host:port or unix:/path (its Unix socket); switches upstream.mode to
    /// "external".
    #[arg(long, value_name = "ADDR")]
    pub upstream: Option<String>,
    /// Data directory: journal, checkpoints, managed Valkey's working dir [default: walrus-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Prometheus, health, readiness and admin endpoint, host:port; "" disables it
    /// [default: 127.0.0.1:8379].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// cluster.announce_ip: the address cluster clients are told for this shard (in
    /// Kubernetes, the pod's IP: `--cluster-announce-ip $(POD_IP)`).
    #[arg(long, value_name = "IP")]
    pub cluster_announce_ip: Option<std::net::IpAddr>,
}

pub fn main() -> ExitCode {
    if let Err(e) = crate::fault::setup() {
        eprintln!("walrus: {e}");
        return ExitCode::from(EXIT_FIX);
    }
    crate::daemon::data_dir::private_files();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Status(args) => status::run(args),
        Command::Checkpoint(args) => admin::checkpoint(args),
        Command::Backup(args) => admin::backup(args),
        Command::Verify(args) => verify::verify(args),
        Command::Restore(args) => restore::run(args),
        Command::Archive(cmd) => archive::run(cmd),
        Command::Journal(cmd) => journal::run(cmd),
        Command::Config(cmd) => config::run(cmd),
        Command::Completions(args) => manual::completions(args),
        Command::Man(args) => manual::man(args),
    }
}
