//! `walrus verify`: would a restore from this data directory succeed, and what would it
//! load? Offline: walrus stopped, or a backup copy. Nothing is written (the journal is read
//! with [`replay_dir`], the store with [`Store::read_only`]).
//!
//! The same checks `serve` makes before it touches Valkey: what the directory holds
//! ([`parts::check`]: its parts belong together), the journal's log scanned as recovery
//! scans it (a torn tail is normal, mid-log corruption is not; a manifest whose key seals no
//! record is another journal's), then as a restore does (`crate::restore::stored_chain`): the
//! checkpoint's RDB against its manifest (size, CRC-64, format), and the chain
//! ([`chain::walk_entries`]): the journal continues the checkpoint's stream from its offset
//! to the end with no hole.

use super::chain::{self, ChainEnd};
use super::{data_dirs, parts};
use crate::checkpoint::manifest::Checkpoint;
use crate::checkpoint::rates::Rates;
use crate::checkpoint::store::Store;
use crate::journal::manifest::{Manifest, MANIFEST_FILE};
use crate::journal::open::{replay_dir, scan_dir};
use crate::journal::recovery::ScanReport;
use crate::journal::{JournalConfig, ReplayFrom};
use std::path::{Path, PathBuf};

/// What a restore from the directory would load.
#[derive(Debug, Clone)]
pub struct Verified {
    pub journal_dir: PathBuf,
    pub manifest: Manifest,
    pub scan: ScanReport,
    /// What the next start writes or removes ([`parts::Verdict`]).
    pub verdict: parts::Verdict,
    /// `None`: no checkpoint and no journal entries, a directory walrus starts fresh from.
    pub restore: Option<Restorable>,
}

#[derive(Debug, Clone)]
pub struct Restorable {
    pub checkpoint: Checkpoint,
    pub rdb_version: u16,
    pub chain: ChainEnd,
}

impl Restorable {
    /// How long the restore should take at `rates`: (RDB seconds, journal seconds).
    pub fn seconds(&self, rates: &Rates) -> (f64, f64) {
        rates.restore_seconds(self.checkpoint.size, self.chain.bytes)
    }
}

/// Why the check could not be made, or failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The directory is not a data directory: a usage or configuration error.
    #[error("{0}")]
    NotADataDir(String),
    /// A restore from it would fail: the text names the file or entry and why.
    #[error("{0}")]
    Fails(String),
}

/// Checks `dir` as a restore would (blocking: reads the whole RDB and the journal once).
/// `lookahead`: how far past the end the scan looks for proof of corruption (None: the
/// whole ring, as `walrus journal verify`).
pub fn verify_data_dir(dir: &Path, lookahead: Option<u64>) -> Result<Verified, VerifyError> {
    if !dir.is_dir() {
        return Err(VerifyError::NotADataDir(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let (journal_dir, cp_dir) = data_dirs(dir);
    let fails = |e: &dyn std::fmt::Display| VerifyError::Fails(e.to_string());
    // The same decision `serve` makes, before the scan and with its entries.
    let check = |entries| parts::check(&journal_dir, &cp_dir, entries).map_err(|e| fails(&e));
    check(None)?;
    if !journal_dir.join(MANIFEST_FILE).is_file() {
        return Err(VerifyError::NotADataDir(format!(
            "no journal in {} (no {MANIFEST_FILE}): --data-dir must be walrus's data directory, \
             the one holding journal/ and checkpoints/",
            journal_dir.display()
        )));
    }
    let cfg = JournalConfig {
        recovery_lookahead_bytes: lookahead,
        ..Default::default()
    };
    let (manifest, scan) = scan_dir(&journal_dir, &cfg).map_err(|e| fails(&e))?;
    if let Some(corrupt) = scan.corruption(&journal_dir) {
        return Err(VerifyError::Fails(corrupt));
    }
    let retained = scan
        .end
        .last_lsn()
        .saturating_sub(manifest.checkpoint.released_through_lsn);
    let verdict = check(Some(retained))?;
    let store = Store::read_only(&cp_dir).map_err(|e| fails(&e))?;
    let Some(cp) = store.recorded() else {
        return Ok(Verified {
            journal_dir,
            manifest,
            scan,
            verdict,
            restore: None,
        });
    };
    let rdb_version = store.verify(&cp).map_err(|e| fails(&e))?;
    let entries =
        replay_dir(&journal_dir, &cfg, ReplayFrom::Lsn(cp.from_lsn)).map_err(|e| fails(&e))?;
    let chain = chain::walk_entries(entries, &cp, |_| Ok(())).map_err(|e| fails(&e))?;
    Ok(Verified {
        journal_dir,
        manifest,
        scan,
        verdict,
        restore: Some(Restorable {
            checkpoint: cp,
            rdb_version,
            chain,
        }),
    })
}
