//! `walrus archive list | restore | verify`: the archive's restore points, a data directory
//! made from the latest one, and the restore drill ([`crate::archive::fetch`]).
//!
//! Exit codes as every command's: 0 done; 1 the store could not be reached, or a local I/O
//! error (try again); 2 a person must act (a configuration mistake, a damaged archive, a
//! target that holds data already, no restore point).

use super::{EXIT_FIX, EXIT_RETRY};
use crate::archive::{fetch, store::Store, ArchiveError};
use crate::config::Config;
use crate::units::time::format_time;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum ArchiveCommand {
    /// List the archive's restore points: each checkpoint in it, and how far the journal
    /// after it goes.
    List(Source),
    /// Make a new data directory from the archive's latest restore point (a lost node's
    /// replacement), or up to a point in time (--until TIME, --until-offset N,
    /// --before-command FLUSHALL, cut as `walrus restore` cuts) from the newest restore point
    /// before it; `walrus serve --data-dir DIR` then restores Valkey from it, and takes the
    /// archive over.
    Restore(RestoreArgs),
    /// The restore drill: restore the latest restore point into a scratch directory, check
    /// it as `walrus verify` checks a data directory, and remove it. Exit 0 a restore would
    /// work, 2 it would not (the problem is named), 1 the archive could not be reached.
    Verify(VerifyArgs),
}

/// Which archive: `--from`, else `archive.url` of `--config`; the rest of `[archive]`
/// (endpoint, region, credentials) from `--config`.
#[derive(Debug, Args)]
pub struct Source {
    /// Configuration file (TOML) with the `[archive]` settings (and `[journal]`'s ring).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The archive: s3://BUCKET/PREFIX or file:///PATH [default: archive.url].
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub source: Source,
    /// The data directory to make (new, or holding no journal and no checkpoint).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub until: super::restore::UntilArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub source: Source,
    /// Where the scratch copy is made (it needs the RDB's size and a ring) [default: the
    /// system's temporary directory].
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
}

pub fn run(cmd: ArchiveCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("walrus: cannot start a runtime: {e}");
            return ExitCode::from(EXIT_RETRY);
        }
    };
    match runtime.block_on(go(cmd)) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("walrus: {e}");
            ExitCode::from(match e {
                ArchiveError::Store(_) | ArchiveError::Local(_) => EXIT_RETRY,
                ArchiveError::Config(_)
                | ArchiveError::Owner(_)
                | ArchiveError::Corrupt(_)
                | ArchiveError::Malformed(_) => EXIT_FIX,
            })
        }
    }
}

fn open(source: &Source) -> Result<(Config, Store), ArchiveError> {
    let config = match &source.config {
        Some(path) => Config::load(path).map_err(|e| ArchiveError::Config(e.to_string()))?,
        None => Config::default(),
    };
    let url = source.from.clone().unwrap_or(config.archive.url.clone());
    if url.is_empty() {
        return Err(ArchiveError::Config(
            "which archive? give --from s3://BUCKET/PREFIX or file:///PATH, or --config with archive.url".into(),
        ));
    }
    let store = Store::open(&url, &config.archive)?;
    Ok((config, store))
}

async fn go(cmd: ArchiveCommand) -> Result<String, ArchiveError> {
    match cmd {
        ArchiveCommand::List(source) => {
            let (_, store) = open(&source)?;
            let plans = fetch::list(&store).await?;
            if plans.is_empty() {
                return Ok(format!("{}: no restore point yet\n", store.url()));
            }
            let mut out = format!(
                "{}: written by {}\n{:<9} {:<20} {:<24} {:<20} {:>14} {:>8} {:<40}\n",
                store.url(),
                plans[0].manifest.writer.name,
                "timeline",
                "recorded",
                "journal to time",
                "journal to offset",
                "RDB bytes",
                "objects",
                "checkpoint"
            );
            for p in &plans {
                // A restore point still waiting for its journal says how far it must reach.
                let reach = match p.waiting_for() {
                    Some(at) => format!("{} of {at}", p.cover.end),
                    None => p.cover.end.to_string(),
                };
                out.push_str(&format!(
                    "{:<9} {:<20} {:<24} {:<20} {:>14} {:>8} {}:{}\n",
                    p.point.timeline,
                    p.point.recorded(),
                    p.cover.journaled_until().map_or("-".into(), format_time),
                    reach,
                    p.point.size,
                    p.cover.objects.len(),
                    p.point.replid,
                    p.point.offset
                ));
            }
            Ok(out)
        }
        ArchiveCommand::Restore(a) => {
            let (config, store) = open(&a.source)?;
            let until = a
                .until
                .until()
                .map_err(|e| ArchiveError::Config(e.to_string()))?;
            let plan = fetch::plan(&store, &until).await?;
            // One walrus at a time owns a data directory: a running one is not written under.
            let _owner = crate::daemon::data_dir::own(&a.data_dir)
                .map_err(|e| ArchiveError::Local(e.to_string()))?;
            let geometry = (config.journal.segment_size_bytes, config.journal.segments);
            let r = fetch::restore(&store, plan, &a.data_dir, geometry).await?;
            Ok(format!(
                "data directory {} made from {}\n{r}start walrus with --data-dir {} to restore Valkey from it\n",
                a.data_dir.display(),
                store.url(),
                a.data_dir.display()
            ))
        }
        ArchiveCommand::Verify(a) => {
            let (config, store) = open(&a.source)?;
            let scratch = a.scratch.unwrap_or_else(std::env::temp_dir);
            let geometry = (config.journal.segment_size_bytes, config.journal.segments);
            let (r, v) = fetch::verify(&store, &scratch, geometry).await?;
            let chain = v.restore.map(|r| r.chain.offset).unwrap_or_default();
            Ok(format!(
                "OK: the latest restore point of {} restores, verified\n{r}the restored journal ends at offset {chain}\n",
                store.url()
            ))
        }
    }
}
