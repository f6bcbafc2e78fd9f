//! The watcher task: reads the figures on a timer and after every checkpoint, moves the
//! write gate with the watermarks, and checks that the journal's segment files are still
//! the ones walrus opened.

use super::{Change, Reading, Usage, Watermarks};
use crate::durability::Durability;
use crate::journal::Journal;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

pub struct WatchConfig {
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub interval: Duration,
    pub journal_dir: PathBuf,
    pub checkpoint_dir: PathBuf,
    /// The journal's segment files and their size.
    pub segments: Vec<PathBuf>,
    pub segment_bytes: u64,
    /// Set while checkpoints fail (`crate::checkpoint`): only then does a full ring refuse
    /// writes. While a checkpoint is merely under way, writes wait for it instead (the
    /// replica link stops reading until the ring has room).
    pub checkpoint_failing: Arc<AtomicBool>,
}

/// Runs until `stop`. `checkpointed` is notified after each checkpoint (the ring shrank).
pub async fn run(
    cfg: WatchConfig,
    journal: Arc<Journal>,
    durability: Arc<Durability>,
    checkpointed: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut marks = Watermarks::new(cfg.high_watermark, cfg.low_watermark);
    let mut segments = Segments::new(&cfg);
    let mut unreadable = false;
    loop {
        if let Some(why) = segments.check() {
            // Writes into a deleted or truncated file are lost at the next start: nothing
            // more may be called durable.
            tracing::error!("{why}; the journal is fenced, writes are refused");
            journal.fail(why.clone());
            durability.fail(&why);
        }
        match readings(&cfg, &journal) {
            Ok(readings) => {
                unreadable = false;
                match marks.update(&readings) {
                    Change::Refuse(why) => {
                        tracing::error!("disk watermark reached: {why}");
                        crate::metrics::WATERMARK_REACHED.set(1);
                        durability.block_writes(Some(&why));
                    }
                    Change::StillRefused(why) => durability.block_writes(Some(&why)),
                    Change::Resume(why) => {
                        tracing::info!("disk watermark cleared: {why}");
                        crate::metrics::WATERMARK_REACHED.set(0);
                        durability.block_writes(None);
                    }
                    Change::Unchanged => {}
                }
            }
            // Keeps the last state: a transient statvfs error is no reason to move the gate.
            Err(e) if !unreadable => {
                unreadable = true;
                tracing::warn!("cannot read disk usage: {e}");
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {}
            _ = checkpointed.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

fn readings(cfg: &WatchConfig, journal: &Journal) -> std::io::Result<Vec<Reading>> {
    let journal_fs = Usage::of(&cfg.journal_dir)?.ratio();
    let checkpoint_fs = Usage::of(&cfg.checkpoint_dir)?.ratio();
    let status = journal.status();
    let ring = status.used_segments as f64 / f64::from(status.segments);
    crate::metrics::DISK_USED
        .with_label_values(&["journal"])
        .set(journal_fs);
    crate::metrics::DISK_USED
        .with_label_values(&["checkpoints"])
        .set(checkpoint_fs);
    crate::metrics::RING_FILL.set(ring);
    let mut readings = vec![
        Reading {
            what: format!("the journal's file system ({})", cfg.journal_dir.display()),
            used: journal_fs,
        },
        Reading {
            what: format!(
                "the checkpoints' file system ({})",
                cfg.checkpoint_dir.display()
            ),
            used: checkpoint_fs,
        },
    ];
    if cfg.checkpoint_failing.load(Ordering::Relaxed) {
        readings.push(Reading {
            what: format!(
                "the journal ring ({} of {} segments not yet released, and checkpoints are failing: see the log)",
                status.used_segments, status.segments
            ),
            used: ring,
        });
    }
    Ok(readings)
}

/// The segment files as walrus opened them: each must keep its inode and its size.
struct Segments {
    files: Vec<(PathBuf, Option<u64>)>,
    size: u64,
    fenced: bool,
}

impl Segments {
    fn new(cfg: &WatchConfig) -> Segments {
        let files = cfg
            .segments
            .iter()
            .map(|p| (p.clone(), std::fs::metadata(p).ok().map(|m| m.ino())))
            .collect();
        Segments {
            files,
            size: cfg.segment_bytes,
            fenced: false,
        }
    }

    /// The first problem found, once.
    fn check(&mut self) -> Option<String> {
        if self.fenced {
            return None;
        }
        let problem = self.files.iter().find_map(|(path, ino)| {
            let p = path.display();
            match std::fs::metadata(path) {
                Err(e) => Some(format!("journal segment {p} is gone ({e})")),
                Ok(m) if Some(m.ino()) != *ino => {
                    Some(format!("journal segment {p} was replaced by another file"))
                }
                Ok(m) if m.len() < self.size => Some(format!(
                    "journal segment {p} was truncated to {} bytes (expected {})",
                    m.len(),
                    self.size
                )),
                Ok(_) => None,
            }
        });
        self.fenced = problem.is_some();
        problem
    }
}
