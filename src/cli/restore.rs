//! `walrus restore`: a point-in-time restore (`crate::datadir::pitr` says where each cut
//! falls). With `--data-dir NEW`, offline: what a data directory (a stopped walrus's, or a
//! backup) holds, up to the cut, into a new data directory that `walrus serve` starts from.
//! `--dry-run` says where the cut falls, and changes nothing. With `--keep-present DIR
//! --confirm`, in place: the running walrus (its metrics endpoint, as `walrus checkpoint`)
//! keeps the present in DIR and rewinds its Valkey to the cut (`crate::restore::rewind`);
//! without `--confirm`, what it would do, and exit 2.

use super::Fatal;
use crate::datadir::pitr::{BeforeCommand, Until};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where a point-in-time restore stops: at most one of these (none: everything).
#[derive(Debug, Args)]
pub struct UntilArgs {
    /// The writes journaled at or before this time, RFC 3339 with its offset
    /// (2026-12-03T21:18:45Z, 2026-12-03T22:18:45.250+01:00).
    #[arg(long, value_name = "TIME", value_parser = crate::units::time::parse_time,
          conflicts_with_all = ["until_offset", "before_command"])]
    pub until: Option<u64>,
    /// The commands that end at or before this replication offset (a transaction only
    /// whole).
    #[arg(long, value_name = "OFFSET", conflicts_with = "before_command")]
    pub until_offset: Option<u64>,
    /// Everything before a command: its name, and if given its first arguments as written
    /// ("FLUSHALL", "FLUSHDB", "DEL important-key"); before its transaction's MULTI when it
    /// is in one. The newest such command, unless --occurrence counts further back.
    #[arg(long, value_name = "COMMAND")]
    pub before_command: Option<String>,
    /// With --before-command: which one, counting back from the newest (1: the newest).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "before_command",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub occurrence: u32,
}

impl UntilArgs {
    pub fn until(&self) -> Result<Until, Fatal> {
        if let Some(t) = self.until {
            return Ok(Until::Time(t));
        }
        if let Some(o) = self.until_offset {
            return Ok(Until::Offset(o));
        }
        let Some(command) = &self.before_command else {
            return Ok(Until::End);
        };
        let words: Vec<Vec<u8>> = command
            .split_whitespace()
            .map(|w| w.as_bytes().to_vec())
            .collect();
        if words.is_empty() {
            return Err(Fatal::from("--before-command needs a command name"));
        }
        Ok(Until::BeforeCommand(BeforeCommand {
            words,
            occurrence: self.occurrence,
        }))
    }
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The data directory to restore from: a stopped walrus's, or a backup (read only; its
    /// lock is shared, so a running walrus's is refused).
    #[arg(long, value_name = "DIR", required_unless_present = "keep_present")]
    pub from_dir: Option<PathBuf>,
    /// The new data directory to write (new or empty): `walrus serve --data-dir` restores
    /// Valkey from it. Not needed with --dry-run.
    #[arg(long, value_name = "DIR", required_unless_present_any = ["dry_run", "keep_present"])]
    pub data_dir: Option<PathBuf>,
    /// In place: rewind the running walrus's Valkey (reached at --metrics) to the cut, after
    /// keeping the present in this directory (absolute, new or empty, on walrus's host): the
    /// way back. Clients get -LOADING meanwhile; Valkey goes on under a new history.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["from_dir", "data_dir", "dry_run"])]
    pub keep_present: Option<PathBuf>,
    /// In place: do it. Without it, say what would be done and change nothing (exit 2).
    #[arg(long, requires = "keep_present")]
    pub confirm: bool,
    #[command(flatten)]
    pub endpoint: super::admin::Endpoint,
    /// In place: how long to wait for the rewind, in seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout_secs: u64,
    #[command(flatten)]
    pub until: UntilArgs,
    /// Say where the cut falls and what it keeps and leaves out; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The new data directory's ring: this many segments [default: the original's].
    #[arg(long)]
    pub segments: Option<u32>,
    /// The new data directory's segment size in bytes [default: the original's].
    #[arg(long, value_parser = crate::units::parse_size)]
    pub segment_size_bytes: Option<u64>,
}

pub fn run(args: RestoreArgs) -> ExitCode {
    let until = match args.until.until() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("walrus: {e}");
            return ExitCode::from(super::EXIT_FIX);
        }
    };
    let Some(from_dir) = &args.from_dir else {
        return in_place(&args, &until);
    };
    let (journal_dir, _) = crate::datadir::data_dirs(from_dir);
    let _reading = match super::lock_for_command(&journal_dir, crate::journal::lock::Access::Shared)
    {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    let done = match (&args.data_dir, args.dry_run) {
        (_, true) => crate::datadir::backup::cut::plan(from_dir, &until).map(|c| c.to_string()),
        (Some(to), false) => crate::datadir::backup::cut::into_new_dir(
            from_dir,
            to,
            &until,
            (args.segment_size_bytes, args.segments),
        )
        .map(|r| r.to_string()),
        (None, false) => unreachable!("clap requires --data-dir without --dry-run"),
    };
    match done {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("walrus: restore failed: {e}");
            super::exit_code(&e)
        }
    }
}

/// `--keep-present DIR`: asks the running walrus to rewind its Valkey in place (`POST
/// /rewind`), only with --confirm.
fn in_place(args: &RestoreArgs, until: &Until) -> ExitCode {
    let keep = args
        .keep_present
        .as_ref()
        .expect("in place: --keep-present");
    let Some(keep) = keep.to_str().filter(|k| !k.contains(['\r', '\n'])) else {
        eprintln!(
            "walrus: --keep-present {} must be a UTF-8 path without line breaks",
            keep.display()
        );
        return ExitCode::from(super::EXIT_FIX);
    };
    if !Path::new(keep).is_absolute() {
        eprintln!("walrus: --keep-present {keep} must be absolute: walrus, not this command, writes it, from its own working directory");
        return ExitCode::from(super::EXIT_FIX);
    }
    if *until == Until::End {
        eprintln!("walrus: an in-place restore needs where to cut: --until, --until-offset or --before-command");
        return ExitCode::from(super::EXIT_FIX);
    }
    if !args.confirm {
        eprintln!(
            "walrus: this would rewind the running walrus at {} in place ({until}): keep the present \
             (its checkpoint and whole journal) in {keep}, the way back; answer clients -LOADING \
             while Valkey is loaded up to the cut; then go on under a new history, leaving out \
             every write after the cut. Writes after the cut are lost to Valkey (kept only in \
             {keep}). To see where the cut falls first: `walrus backup --to DIR`, then \
             `walrus restore --from-dir DIR {until} --dry-run`. Run again with --confirm to do it.",
            args.endpoint.resolve(false).map_or_else(|e| e.to_string(), |(a, _)| a)
        );
        return ExitCode::from(super::EXIT_FIX);
    }
    let body = format!("{keep}\n{}\n", until.to_line());
    super::admin::post(
        &args.endpoint,
        "/rewind",
        &body,
        args.timeout_secs,
        "restore in place",
    )
}
