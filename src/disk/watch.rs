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
    /// The ring's own (high, low) marks (`Config::ring_watermarks`).
    pub ring_marks: (f64, f64),
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
/// The file systems are read on the timer; the ring after every durable advance too, so
/// that the write that fills it past the high mark is the last one admitted.
pub async fn run(
    cfg: WatchConfig,
    journal: Arc<Journal>,
    durability: Arc<Durability>,
    checkpointed: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut marks = Watermarks::new(cfg.high_watermark, cfg.low_watermark);
    let segments = Arc::new(std::sync::Mutex::new(Segments::new(&cfg)));
    let cfg = Arc::new(cfg);
    let mut durable = journal.durable();
    let mut file_systems: Option<Vec<Reading>> = None;
    // One interval for the whole run: durable advances (every group commit) must not keep
    // postponing the file systems' reading.
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut timer = true;
    loop {
        if timer {
            // Off the proxy's threads: on a file system that stopped answering (a network
            // volume whose server went away) `stat` and `statfs` wait with it, and walrus
            // runs one worker on two cores. Only this task waits then; clean reads go on.
            let read = tokio::task::spawn_blocking({
                let (cfg, segments) = (cfg.clone(), segments.clone());
                move || {
                    let problem = segments.lock().expect("segments lock").check();
                    (problem, fs_readings(&cfg))
                }
            });
            let (problem, readings) = tokio::select! {
                read = read => read.expect("reading the disk's figures panicked"),
                _ = stop.wait_for(|s| *s) => return,
            };
            if let Some(why) = problem {
                // Writes into a deleted or truncated file are lost at the next start:
                // nothing more may be called durable.
                journal.fail(why.clone());
                durability.fail(&why);
                tracing::error!("{why}; the journal is fenced, writes are refused");
            }
            match readings {
                Ok(r) => file_systems = Some(r),
                // Keeps the last figures: a transient statvfs error is no reason to move
                // the gate.
                Err(e) if file_systems.is_some() => {
                    tracing::warn!("cannot read disk usage: {e}")
                }
                Err(e) => tracing::warn!("cannot read disk usage yet: {e}"),
            }
        }
        if let Some(fs) = &file_systems {
            let mut readings = fs.clone();
            readings.extend(ring_reading(&cfg, &journal));
            apply(marks.update(&readings), &durability);
        }
        timer = tokio::select! {
            _ = tick.tick() => true,
            _ = checkpointed.notified() => true,
            r = durable.changed() => match r {
                Ok(()) => false,
                Err(_) => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
    }
}

/// Moves the write gate, logging each transition once: after the move, so that whoever
/// reads the line finds the gate as it says.
fn apply(change: Change, durability: &Durability) {
    match change {
        Change::Refuse(why) => {
            durability.block_writes(Some(&why));
            crate::metrics::WATERMARK_REACHED.set(1);
            tracing::error!("disk watermark reached: {why}");
        }
        Change::StillRefused(why) => durability.block_writes(Some(&why)),
        Change::Resume(why) => {
            durability.block_writes(None);
            crate::metrics::WATERMARK_REACHED.set(0);
            tracing::info!("disk watermark cleared: {why}");
        }
        Change::Unchanged => {}
    }
}

fn fs_readings(cfg: &WatchConfig) -> std::io::Result<Vec<Reading>> {
    let journal_fs = Usage::of(&cfg.journal_dir)?.ratio();
    let checkpoint_fs = Usage::of(&cfg.checkpoint_dir)?.ratio();
    crate::metrics::DISK_USED
        .with_label_values(&["journal"])
        .set(journal_fs);
    crate::metrics::DISK_USED
        .with_label_values(&["checkpoints"])
        .set(checkpoint_fs);
    Ok(vec![
        Reading {
            what: format!("the journal's file system ({})", cfg.journal_dir.display()),
            used: journal_fs,
            remedy: super::FREE_SPACE,
            marks: None,
        },
        Reading {
            what: format!(
                "the checkpoints' file system ({})",
                cfg.checkpoint_dir.display()
            ),
            used: checkpoint_fs,
            remedy: super::FREE_SPACE,
            marks: None,
        },
    ])
}

/// The ring's figure, which counts only while checkpoints fail.
fn ring_reading(cfg: &WatchConfig, journal: &Journal) -> Option<Reading> {
    let status = journal.status();
    let ring = status.used_segments as f64 / f64::from(status.segments);
    crate::metrics::RING_FILL.set(ring);
    cfg.checkpoint_failing
        .load(Ordering::Relaxed)
        .then(|| Reading {
            what: format!(
                "the journal ring ({} of {} segments not yet released, and checkpoints are failing: see the log)",
                status.used_segments, status.segments
            ),
            used: ring,
            remedy: super::FIX_CHECKPOINTS,
            marks: (cfg.ring_marks != (cfg.high_watermark, cfg.low_watermark)).then_some(cfg.ring_marks),
        })
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
