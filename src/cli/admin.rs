//! Admin commands against a running walrus, over its metrics endpoint (`metrics.listen`):
//! `walrus checkpoint` and `walrus backup` (which, given `--data-dir`, copies a stopped
//! walrus's directory itself instead). `walrus status` is in `status.rs`.

use super::http_client::request;
use super::Fatal;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// walrus's metrics endpoint, as every admin command takes it.
#[derive(Debug, Args)]
pub struct Endpoint {
    /// walrus's metrics endpoint, host:port (its `metrics.listen`). Default: the
    /// configuration's with --config, else 127.0.0.1:8379.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// The admin token, from this file (walrus's `metrics.admin_token_file`; with --config,
    /// the configuration's unless given).
    #[arg(long, value_name = "FILE", env = "WALRUS_ADMIN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// walrus's configuration file: its `metrics.listen` and `metrics.admin_token_file` are
    /// used where --metrics and --token-file are not given.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Where walrus's metrics endpoint is when nothing says otherwise (config.toml's default).
const DEFAULT_METRICS: &str = "127.0.0.1:8379";

impl Endpoint {
    fn config(&self) -> Result<Option<crate::config::Config>, String> {
        self.config
            .as_deref()
            .map(crate::config::Config::load)
            .transpose()
            .map_err(|e| e.to_string())
    }

    /// The metrics endpoint to ask and, with `want_token`, the admin token to send (read as
    /// walrus reads its own). The configuration file, where one is given and a flag leaves
    /// something to it, is read once for both.
    pub fn resolve(&self, want_token: bool) -> Result<(String, Option<String>), Fatal> {
        let token_from_config = want_token && self.token_file.is_none();
        let config = if self.metrics.is_none() || token_from_config {
            self.config()?
        } else {
            None
        };
        let addr = match (&self.metrics, &config) {
            (Some(m), _) => m.clone(),
            (None, None) => DEFAULT_METRICS.into(),
            (None, Some(c)) if c.metrics.listen.is_empty() => {
                return Err(Fatal::from(format!(
                    "{}: metrics.listen is empty, so that walrus has no endpoint to ask; set it, or pass --metrics",
                    self.config.as_ref().expect("a configuration").display()
                )))
            }
            (None, Some(c)) => c.metrics.listen.clone(),
        };
        let file = match (&self.token_file, &config) {
            _ if !want_token => None,
            (Some(f), _) => Some(f.clone()),
            (None, Some(c)) if !c.metrics.admin_token_file.is_empty() => {
                Some(PathBuf::from(&c.metrics.admin_token_file))
            }
            _ => None,
        };
        let token = file
            .map(|f| crate::config::read_secret("--token-file", &f).map_err(|e| e.to_string()))
            .transpose()?;
        Ok((addr, token))
    }
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub endpoint: Endpoint,
    /// How long to wait for the checkpoint, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub endpoint: Endpoint,
    /// Where the backup goes: an absolute path on walrus's host (in its container), a new
    /// or empty directory. It is a data directory: `walrus serve --data-dir` restores from
    /// it, `walrus verify --data-dir` checks it.
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// How long to wait for the backup, in seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout_secs: u64,
    /// Offline: copy this stopped walrus's data directory instead of asking a running one
    /// (its lock is taken: a running walrus is refused).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Offline only: the copy's ring has this many segments (resizing) [default: the
    /// original's].
    #[arg(long, requires = "data_dir")]
    pub segments: Option<u32>,
    /// Offline only: the copy's segment size in bytes [default: the original's].
    #[arg(long, requires = "data_dir")]
    pub segment_size_bytes: Option<u64>,
}

/// `walrus checkpoint`: POST /checkpoint, print walrus's answer.
pub fn checkpoint(args: CheckpointArgs) -> ExitCode {
    post(
        &args.endpoint,
        "/checkpoint",
        "",
        args.timeout_secs,
        "checkpoint",
    )
}

/// `walrus backup`: POST /backup with the directory, print what walrus copied.
pub fn backup(args: BackupArgs) -> ExitCode {
    let Some(to) = args.to.to_str().filter(|t| !t.contains(['\r', '\n'])) else {
        eprintln!(
            "walrus: --to {} must be a UTF-8 path without line breaks",
            args.to.display()
        );
        return ExitCode::from(super::EXIT_FIX);
    };
    if let Some(from) = &args.data_dir {
        let (journal_dir, _) = crate::datadir::data_dirs(from);
        let _owner =
            match super::lock_for_command(&journal_dir, crate::journal::lock::Access::Exclusive) {
                Ok(lock) => lock,
                Err(code) => return code,
            };
        let geometry = (args.segment_size_bytes, args.segments);
        return match crate::datadir::backup::offline(from, &args.to, geometry) {
            Ok(summary) => {
                print!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("walrus: backup failed: {e}");
                ExitCode::from(match e {
                    crate::datadir::DataDirError::Refused(_) => super::EXIT_FIX,
                    _ => super::EXIT_RETRY,
                })
            }
        };
    }
    if !args.to.is_absolute() {
        eprintln!("walrus: --to {to} must be absolute: walrus, not this command, writes it, from its own working directory");
        return ExitCode::from(super::EXIT_FIX);
    }
    post(&args.endpoint, "/backup", to, args.timeout_secs, "backup")
}

pub(super) fn post(
    endpoint: &Endpoint,
    path: &str,
    body: &str,
    timeout_secs: u64,
    what: &str,
) -> ExitCode {
    let (addr, token) = match endpoint.resolve(true) {
        Ok(at) => at,
        Err(e) => {
            eprintln!("walrus: {e}");
            return ExitCode::from(super::EXIT_FIX);
        }
    };
    let timeout = Duration::from_secs(timeout_secs);
    match request(&addr, "POST", path, body, token.as_deref(), timeout) {
        Ok(a) if a.ok() => {
            print!("{}", a.body);
            ExitCode::SUCCESS
        }
        // 4xx: refused as asked (a person must act); 5xx: failed, or not now (retry).
        Ok(a) => {
            eprint!("walrus: {what} refused ({}): {}", a.code, a.body);
            ExitCode::from(if (400..500).contains(&a.code) {
                super::EXIT_FIX
            } else {
                super::EXIT_RETRY
            })
        }
        Err(e) => {
            eprintln!("walrus: {e}");
            ExitCode::from(super::EXIT_RETRY)
        }
    }
}
