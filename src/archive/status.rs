//! What the archive has, how far behind it is, and why: shared by the uploader (which moves
//! it), the durability gate (`durability.ack = "archive"` waits for it; past
//! `archive.max_lag_ms` with `archive.enforce_max_lag`, writes are refused), `/status` and
//! the metrics.
//!
//! The lag in seconds is how long the oldest durable entry not yet in the archive has been
//! durable: a clock of the journal's durable position kept apart from the uploads, so that
//! it runs on while an upload hangs.

use crate::journal::Durable;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

pub struct ArchiveStatus {
    pub url: String,
    /// The journal's position the archive holds (LSN and offset of the last entry in it, or
    /// the offset its restore point covers).
    archived: watch::Sender<Durable>,
    inner: Mutex<Inner>,
    /// How finely the lag clock notes when the journal became durable.
    resolution: Duration,
}

#[derive(Default)]
struct Inner {
    /// (durable LSN, since when): the first time in each `resolution` the journal's durable
    /// position passed an LSN.
    durable_at: VecDeque<(u64, Instant)>,
    archived_lsn: u64,
    durable: Durable,
    last_upload: Option<SystemTime>,
    last_error: Option<String>,
    /// Why walrus no longer writes the archive (another walrus took it over).
    stopped: Option<String>,
    timeline: u64,
    restore_points: usize,
    oldest_restore_point: Option<i64>,
    newest_restore_point: Option<i64>,
}

/// `/status`'s view of the archive.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    pub url: String,
    /// Seconds the oldest durable entry not in the archive has waited (0: caught up).
    pub lag_seconds: f64,
    pub lag_bytes: u64,
    pub archived_lsn: u64,
    pub archived_offset: u64,
    pub timeline: u64,
    pub restore_points: usize,
    pub oldest_restore_point: Option<i64>,
    pub newest_restore_point: Option<i64>,
    /// When the last upload succeeded (seconds since the epoch).
    pub last_upload: Option<i64>,
    /// The last failure, until an upload succeeds again.
    pub error: Option<String>,
    /// Set when walrus stopped writing the archive, and why.
    pub stopped: Option<String>,
}

impl ArchiveStatus {
    pub fn new(url: String, max_lag: Duration) -> ArchiveStatus {
        ArchiveStatus {
            url,
            archived: watch::channel(Durable::default()).0,
            inner: Mutex::default(),
            resolution: (max_lag / 16).max(Duration::from_millis(1)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The archive's position, for a follower that releases replies by it.
    pub fn archived(&self) -> watch::Receiver<Durable> {
        self.archived.subscribe()
    }

    /// The journal's durable position moved to `d`.
    pub fn durable(&self, d: Durable, now: Instant) {
        let mut s = self.lock();
        s.durable = d;
        if d.lsn <= s.archived_lsn {
            return;
        }
        match s.durable_at.back_mut() {
            Some((lsn, at)) if now.duration_since(*at) < self.resolution => *lsn = d.lsn,
            _ => s.durable_at.push_back((d.lsn, now)),
        }
    }

    /// The archive now holds the journal up to `d` (its LSN, its offset).
    pub fn advanced(&self, d: Durable) {
        {
            let mut s = self.lock();
            if d.lsn < s.archived_lsn {
                return;
            }
            s.archived_lsn = d.lsn;
            while s.durable_at.front().is_some_and(|(lsn, _)| *lsn <= d.lsn) {
                s.durable_at.pop_front();
            }
            s.last_upload = Some(SystemTime::now());
            s.last_error = None;
        }
        self.archived.send_if_modified(|a| {
            let newer = d.lsn > a.lsn || (d.lsn == a.lsn && d.repl_offset > a.repl_offset);
            if newer {
                *a = d;
            }
            newer
        });
    }

    /// How long the oldest durable entry not in the archive has been durable.
    pub fn lag(&self, now: Instant) -> Duration {
        self.lock()
            .durable_at
            .front()
            .map_or(Duration::ZERO, |(_, at)| now.saturating_duration_since(*at))
    }

    /// When the oldest entry not in the archive became durable, if one is waiting.
    pub fn waiting_since(&self) -> Option<Instant> {
        self.lock().durable_at.front().map(|(_, at)| *at)
    }

    pub fn failed(&self, why: String) {
        self.lock().last_error = Some(why);
    }

    pub fn stop(&self, why: String) {
        self.lock().stopped = Some(why);
    }

    pub fn stopped(&self) -> Option<String> {
        self.lock().stopped.clone()
    }

    pub fn error(&self) -> Option<String> {
        let s = self.lock();
        s.stopped.clone().or_else(|| s.last_error.clone())
    }

    /// The restore points now in the archive: how many, the oldest's and newest's times.
    pub fn restore_points(&self, timeline: u64, created: &[i64]) {
        let mut s = self.lock();
        s.timeline = timeline;
        s.restore_points = created.len();
        s.oldest_restore_point = created.iter().min().copied();
        s.newest_restore_point = created.iter().max().copied();
    }

    pub fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        let lag = self.lag(now);
        let archived = *self.archived.borrow();
        let s = self.lock();
        let secs = |t: SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        };
        Snapshot {
            url: self.url.clone(),
            lag_seconds: lag.as_secs_f64(),
            lag_bytes: if s.durable.lsn > archived.lsn {
                s.durable.repl_offset.saturating_sub(archived.repl_offset)
            } else {
                0
            },
            archived_lsn: archived.lsn,
            archived_offset: archived.repl_offset,
            timeline: s.timeline,
            restore_points: s.restore_points,
            oldest_restore_point: s.oldest_restore_point,
            newest_restore_point: s.newest_restore_point,
            last_upload: s.last_upload.map(secs),
            error: s.last_error.clone(),
            stopped: s.stopped.clone(),
        }
    }

    /// Sets the archive's gauges (a scrape hook).
    pub fn publish_metrics(&self) {
        use crate::metrics as m;
        let s = self.snapshot();
        m::ARCHIVE_LAG_SECONDS.set(s.lag_seconds);
        m::ARCHIVE_LAG_BYTES.set(s.lag_bytes as i64);
        m::ARCHIVE_RESTORE_POINTS.set(s.restore_points as i64);
        m::ARCHIVE_OLDEST_RESTORE_POINT.set(s.oldest_restore_point.unwrap_or(0) as f64);
        m::ARCHIVE_NEWEST_RESTORE_POINT.set(s.newest_restore_point.unwrap_or(0) as f64);
        m::ARCHIVE_LAST_UPLOAD.set(s.last_upload.unwrap_or(0) as f64);
        m::ARCHIVE_STOPPED.set(i64::from(s.stopped.is_some()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(lsn: u64) -> Durable {
        Durable {
            lsn,
            repl_offset: lsn * 10,
            failed: false,
        }
    }

    #[test]
    fn the_lag_counts_from_when_the_oldest_entry_not_archived_became_durable() {
        let s = ArchiveStatus::new("file:///x".into(), Duration::from_millis(1600));
        let t0 = Instant::now();
        assert_eq!(s.lag(t0), Duration::ZERO);
        s.durable(d(1), t0);
        // Within the resolution (100 ms), later positions keep the earlier time.
        s.durable(d(2), t0 + Duration::from_millis(50));
        s.durable(d(5), t0 + Duration::from_millis(300));
        assert_eq!(s.lag(t0 + Duration::from_secs(1)), Duration::from_secs(1));
        // Archived through 2: entries 3..5 became durable at 300 ms.
        s.advanced(d(2));
        assert_eq!(
            s.lag(t0 + Duration::from_secs(1)),
            Duration::from_millis(700)
        );
        s.advanced(d(5));
        assert_eq!(s.lag(t0 + Duration::from_secs(9)), Duration::ZERO);
        assert_eq!(*s.archived().borrow(), d(5));
        // An older report moves nothing back.
        s.advanced(d(3));
        assert_eq!(*s.archived().borrow(), d(5));
    }
}
