//! `walrus verify --data-dir DIR`: the checks of [`crate::datadir::verify`], printed, under
//! the data directory's shared lock (a running walrus refuses it: what it writes would move
//! under the check).
//!
//! Exit codes, by the command's one rule (`cli`'s module doc): 0 a restore from DIR would
//! succeed; 2 it would not, or DIR is no data directory: the problem is named, and a person
//! must act, as on any damaged journal; 1 a walrus runs on it.

use crate::checkpoint::rates::Rates;
use crate::datadir::verify::{verify_data_dir, VerifyError};
use crate::journal::lock::Access;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The data directory (holding journal/ and checkpoints/): a stopped walrus's, or a
    /// backup.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// How far past the journal's end to look for proof of corruption [default: the
    /// whole ring].
    #[arg(long)]
    pub recovery_lookahead_bytes: Option<u64>,
}

pub fn verify(args: VerifyArgs) -> ExitCode {
    let (journal_dir, _) = crate::datadir::data_dirs(&args.data_dir);
    let _reading = match super::lock_for_command(&journal_dir, Access::Shared) {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    let v = match verify_data_dir(&args.data_dir, args.recovery_lookahead_bytes) {
        Ok(v) => v,
        Err(VerifyError::NotADataDir(why)) => {
            eprintln!("walrus: {why}");
            return ExitCode::from(super::EXIT_FIX);
        }
        Err(VerifyError::Fails(why)) => {
            eprintln!(
                "FAILED: a restore from {} would fail: {why}",
                args.data_dir.display()
            );
            return ExitCode::from(super::EXIT_FIX);
        }
    };
    let m = &v.manifest;
    println!(
        "journal: {}: {} segments of {} bytes (journal.segments and journal.segment_size_bytes must match); {} entries retained",
        v.journal_dir.display(),
        m.segments,
        m.segment_size_bytes,
        v.scan.entries
    );
    if v.verdict.adopt {
        println!(
            "identity: a manifest lacks this data directory's identity (written before walrus recorded one); the next start writes it into both"
        );
    }
    if !v.verdict.leftovers.is_empty() {
        println!(
            "leftovers: {} (a checkpoint interrupted before it was recorded); the next start removes them",
            v.verdict.leftovers.join(", ")
        );
    }
    let Some(r) = &v.restore else {
        println!("OK: no checkpoint and no journal entries: walrus starts a new history from this directory");
        return ExitCode::SUCCESS;
    };
    let cp = &r.checkpoint;
    println!(
        "checkpoint: {} at offset {} of {}: {} bytes, CRC-64 {:016x} and RDB format {} verified",
        cp.file, cp.offset, cp.replid, cp.size, cp.crc64, r.rdb_version
    );
    println!(
        "chain: {} journal entries continue it to offset {} with no gap ({} bytes of stream; histories {})",
        r.chain.entries,
        r.chain.offset,
        r.chain.bytes,
        r.chain.ids.join(" then ")
    );
    // Learned rates live in a running walrus's memory only (checkpoint/rates.rs): offline,
    // the defaults are what there is. `walrus status` shows the learned estimate.
    let (rdb_s, journal_s) = r.seconds(&Rates::default());
    println!(
        "a restore loads {} bytes of RDB and {} bytes of journal: about {:.1} s ({rdb_s:.1} s + {journal_s:.1} s) at walrus's default rates ({} MB/s RDB, {} MB/s journal; a running walrus's learned estimate is in `walrus status`)",
        cp.size,
        r.chain.bytes,
        rdb_s + journal_s,
        Rates::default().rdb_load / 1e6,
        Rates::default().journal_replay / 1e6,
    );
    println!(
        "OK: a restore from {} would succeed",
        args.data_dir.display()
    );
    ExitCode::SUCCESS
}
