//! Disk watermarks: new writes are refused before a disk fills, and resume by themselves.
//!
//! Three figures are watched ([`watch`]): the fraction in use of the journal's file system,
//! of the checkpoints' file system (the same one, usually), and of the journal ring itself
//! (segments a checkpoint has not released yet), which counts only while checkpoints fail:
//! a checkpoint under way frees the ring, and writes wait for it meanwhile (the replica
//! link's backpressure). When any passes `disk.high_watermark`,
//! new writes get `-MISCONF` before they reach Valkey; reads go on. Writes already sent
//! still complete: the journal's segments are pre-allocated, so they need no new space, and
//! the ring keeps `1 - high_watermark` of itself for them (a ring of few segments has marks of
//! its own, the high one with a segment left: `Config::ring_watermarks`). Once every figure is below
//! `disk.low_watermark` again, writes resume. Each transition is logged once with the
//! figures.
//!
//! A checkpoint writes a new RDB next to the current one before deleting it, so it needs
//! that much room: [`Room::check`] refuses one that would take its file system past the
//! high mark, with a log line that says so, instead of filling the disk.
//!
//! Other I/O failures, and what each one does, are in docs/failure-modes.md.

pub mod watch;

use std::path::{Path, PathBuf};

/// Why the disk layer refuses: a figure it cannot read, or not enough room.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot read the free space of {}: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The text says how much is missing, where, and what to do.
    #[error("{0}")]
    NoRoom(String),
}

impl DiskError {
    fn unreadable(path: &Path) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
        move |source| DiskError::Unreadable {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Space on the file system holding a path, as `df` counts it (blocks reserved for root
/// are neither used nor available).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub used_bytes: u64,
    pub avail_bytes: u64,
}

impl Usage {
    pub fn of(path: &Path) -> std::io::Result<Usage> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let frsize = s.f_frsize as u64;
        Ok(Usage {
            used_bytes: (s.f_blocks as u64).saturating_sub(s.f_bfree as u64) * frsize,
            avail_bytes: s.f_bavail as u64 * frsize,
        })
    }

    /// The fraction in use (df's Use%).
    pub fn ratio(&self) -> f64 {
        self.ratio_with(0)
    }

    /// The fraction in use once `more` bytes are written.
    pub fn ratio_with(&self, more: u64) -> f64 {
        let total = self.used_bytes + self.avail_bytes;
        if total == 0 {
            return 1.0;
        }
        (self.used_bytes + more) as f64 / total as f64
    }
}

/// Percent, for messages.
pub fn pct(ratio: f64) -> String {
    format!("{:.1}%", ratio * 100.0)
}

/// The check a checkpoint makes before it asks Valkey for an RDB.
#[derive(Debug, Clone)]
pub struct Room {
    pub dir: PathBuf,
    pub high_watermark: f64,
}

impl Room {
    /// `Err` (the log line) when an RDB of about `estimate` bytes would take the
    /// checkpoints' file system past the high watermark. `how`: where the estimate comes from.
    pub fn check(&self, estimate: u64, how: &str) -> Result<(), DiskError> {
        let usage = Usage::of(&self.dir).map_err(DiskError::unreadable(&self.dir))?;
        let after = usage.ratio_with(estimate);
        if after <= self.high_watermark {
            return Ok(());
        }
        Err(DiskError::NoRoom(format!(
            "not enough room for a checkpoint: it needs about {} ({how}), and {} has {} free of {}: \
             {} in use afterwards, over disk.high_watermark ({}). Free space or grow the volume",
            crate::units::format_size(estimate),
            self.dir.display(),
            crate::units::format_size(usage.avail_bytes),
            crate::units::format_size(usage.used_bytes + usage.avail_bytes),
            pct(after),
            pct(self.high_watermark),
        )))
    }
}

/// Refuses a journal whose ring alone would keep its file system above the low watermark:
/// writes would be refused forever.
pub fn check_ring_fits(dir: &Path, ring_bytes: u64, low_watermark: f64) -> Result<(), DiskError> {
    let usage = Usage::of(dir).map_err(DiskError::unreadable(dir))?;
    let total = usage.used_bytes + usage.avail_bytes;
    let share = ring_bytes as f64 / total.max(1) as f64;
    if share < low_watermark {
        return Ok(());
    }
    Err(DiskError::NoRoom(format!(
        "the journal ring ({}, journal.segments x journal.segment_size_bytes) alone takes {} of its file system ({}, {}), \
         at or above disk.low_watermark ({}): writes would never be accepted. Shrink the ring or grow the volume",
        crate::units::format_size(ring_bytes),
        pct(share),
        dir.display(),
        crate::units::format_size(total),
        pct(low_watermark)
    )))
}

/// One watched figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// What it measures, for messages: "the journal's file system (/data/journal)".
    pub what: String,
    pub used: f64,
    /// What an operator does about it.
    pub remedy: &'static str,
    /// Its own (high, low) marks, where the disk's do not fit it (a ring of few segments).
    pub marks: Option<(f64, f64)>,
}

/// The remedy for a full file system.
pub const FREE_SPACE: &str = "free space on the volume or grow it";
/// The remedy for a ring no checkpoint frees.
pub const FIX_CHECKPOINTS: &str = "make checkpoints succeed again (the log says why they fail)";

impl std::fmt::Display for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is {} full", self.what, pct(self.used))?;
        match self.marks {
            Some((high, low)) => write!(f, " (its own marks: {}, {})", pct(high), pct(low)),
            None => Ok(()),
        }
    }
}

/// The watermark state machine: refusing from the moment a figure reaches the high mark
/// until every figure is below the low mark (the gap keeps it from flapping).
#[derive(Debug)]
pub struct Watermarks {
    pub high: f64,
    pub low: f64,
    refusing: bool,
}

/// What a new set of readings changes.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// Writes must be refused from now on, for this reason.
    Refuse(String),
    /// Still refused; the reason with today's figures.
    StillRefused(String),
    /// Writes may resume.
    Resume(String),
    Unchanged,
}

impl Watermarks {
    pub fn new(high: f64, low: f64) -> Watermarks {
        Watermarks {
            high,
            low,
            refusing: false,
        }
    }

    pub fn update(&mut self, readings: &[Reading]) -> Change {
        let high = |r: &Reading| r.marks.map_or(self.high, |m| m.0);
        let low = |r: &Reading| r.marks.map_or(self.low, |m| m.1);
        let over: Vec<&Reading> = readings.iter().filter(|r| r.used >= high(r)).collect();
        let all = || {
            readings
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let reason = || {
            // Between the marks nothing is over the high one: name what is still above the
            // low one.
            let named: Vec<&Reading> = if over.is_empty() {
                readings.iter().filter(|r| r.used >= low(r)).collect()
            } else {
                over.clone()
            };
            let mut remedies: Vec<&str> = named.iter().map(|r| r.remedy).collect();
            remedies.dedup();
            format!(
                "writes are refused: {} (disk.high_watermark is {}); they resume once every figure is below disk.low_watermark ({}): {}",
                named.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", "),
                pct(self.high),
                pct(self.low),
                remedies.join(", and ")
            )
        };
        if !self.refusing {
            if over.is_empty() {
                return Change::Unchanged;
            }
            self.refusing = true;
            return Change::Refuse(reason());
        }
        if readings.iter().all(|r| r.used < low(r)) {
            self.refusing = false;
            return Change::Resume(format!(
                "writes resume: {} (below disk.low_watermark, {})",
                all(),
                pct(self.low)
            ));
        }
        Change::StillRefused(reason())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(used: f64) -> Vec<Reading> {
        vec![
            Reading {
                what: "the ring".into(),
                used: 0.1,
                remedy: FIX_CHECKPOINTS,
                marks: None,
            },
            Reading {
                what: "the disk".into(),
                used,
                remedy: FREE_SPACE,
                marks: None,
            },
        ]
    }

    #[test]
    fn refuses_at_high_and_resumes_below_low_only() {
        let mut w = Watermarks::new(0.9, 0.85);
        assert_eq!(w.update(&r(0.89)), Change::Unchanged);
        let Change::Refuse(why) = w.update(&r(0.9)) else {
            panic!()
        };
        assert!(why.contains("the disk is 90.0% full"), "{why}");
        assert!(
            !why.contains("the ring is"),
            "names only what is over: {why}"
        );
        assert!(
            why.ends_with(FREE_SPACE) && !why.contains(FIX_CHECKPOINTS),
            "{why}"
        );
        // Between the marks: still refused.
        assert!(matches!(w.update(&r(0.87)), Change::StillRefused(_)));
        assert!(matches!(w.update(&r(0.85)), Change::StillRefused(_)));
        assert!(matches!(w.update(&r(0.84)), Change::Resume(_)));
        assert_eq!(w.update(&r(0.87)), Change::Unchanged);
    }

    /// A ring of three segments, with its own marks (2/3, 1/2): refused with two segments
    /// in use, which the disk's 90% would never see before the ring is full; resumed at one.
    #[test]
    fn a_reading_with_its_own_marks_is_judged_by_them() {
        let ring = |used: f64| {
            vec![Reading {
                what: "the ring".into(),
                used,
                remedy: FIX_CHECKPOINTS,
                marks: Some((2.0 / 3.0, 0.5)),
            }]
        };
        let mut w = Watermarks::new(0.9, 0.85);
        assert_eq!(w.update(&ring(1.0 / 3.0)), Change::Unchanged);
        let Change::Refuse(why) = w.update(&ring(2.0 / 3.0)) else {
            panic!()
        };
        assert!(why.contains("its own marks: 66.7%, 50.0%"), "{why}");
        assert!(matches!(w.update(&ring(1.0 / 3.0)), Change::Resume(_)));
    }

    #[test]
    fn room_for_a_checkpoint_is_judged_against_the_high_mark() {
        let dir = tempfile::tempdir().unwrap();
        let usage = Usage::of(dir.path()).unwrap();
        assert!(usage.ratio() > 0.0 && usage.ratio() <= 1.0);
        let room = Room {
            dir: dir.path().to_path_buf(),
            high_watermark: 0.999_999,
        };
        room.check(0, "nothing").unwrap();
        let err = room
            .check(u64::MAX / 4, "a huge one")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a huge one") && err.contains("disk.high_watermark"),
            "{err}"
        );
    }
}
