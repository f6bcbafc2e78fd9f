//! `GET /status`: what `walrus status` shows, as one flat JSON object.
//!
//! Read at request time from what walrus keeps anyway: the gate's offsets (one lock, as a
//! scrape takes it), the journal's positions, the checkpoint store's record (memory), the
//! restore and watermark gauges, and the readiness function `/readyz` answers with. Nothing
//! is maintained for it on the hot path. The fields are documented in docs/operations.md;
//! a field that does not apply (no checkpoint yet, durability off) is `null`.

use super::Ready;
use crate::checkpoint::store::Store;
use crate::durability::{Durability, LinkState};
use crate::journal::Journal;
use crate::units::format_size;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// Where the status is read from; the durable half is set once the journal is open.
pub struct Sources {
    pub ready: Ready,
    pub started: Instant,
    /// `durability.enabled`: without it there is no link, journal or checkpoint to show.
    pub durability: bool,
    pub durable: OnceLock<DurableSources>,
}

pub struct DurableSources {
    pub gate: Arc<Durability>,
    /// Weak: the journal must close at shutdown while the endpoint still answers.
    pub journal: Weak<Journal>,
    pub store: Store,
    /// The archive, when `[archive]` is set.
    pub archive: Option<Arc<crate::archive::status::ArchiveStatus>>,
}

/// The status, flat: one key per figure (docs/operations.md lists them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub commit: String,
    pub uptime_seconds: u64,
    pub ready: bool,
    /// Why not ready ("" when ready): `/readyz`'s reason.
    pub ready_reason: String,
    /// `durability.enabled`.
    pub durability: bool,
    /// The replica link: "attached", "detached", "restoring", "failed", "starting" (the
    /// journal is not open yet), "off" (durability off).
    pub link: String,
    pub attached: bool,
    /// Valkey's replication offset after the writes walrus sent.
    pub valkey_offset: Option<u64>,
    /// The offset the journal holds durably.
    pub durable_offset: Option<u64>,
    pub lag_bytes: Option<u64>,
    pub ring_segments_used: Option<u64>,
    pub ring_segments_total: Option<u64>,
    pub ring_bytes_used: Option<u64>,
    pub ring_bytes_total: Option<u64>,
    /// The journal's I/O backend and its flags, as its open logs them.
    pub journal_backend: Option<String>,
    /// The recorded checkpoint (null: none).
    pub checkpoint_file: Option<String>,
    pub checkpoint_offset: Option<u64>,
    pub checkpoint_size_bytes: Option<u64>,
    /// Since walrus recorded it (the manifest's `time_ms`; for a manifest written before
    /// those, its RDB's modification time when walrus started), from memory.
    pub checkpoint_age_seconds: Option<u64>,
    pub restore_in_progress: bool,
    pub restore_sent_bytes: u64,
    pub restore_total_bytes: u64,
    /// How long a restore would take now (the checkpointer's estimate).
    pub restore_estimate_seconds: f64,
    pub disk_watermark_reached: bool,
    /// Why a new write is refused now, Valkey's error text as a client gets it (null:
    /// writes are accepted). Reads go on meanwhile, so `/readyz` stays ready.
    pub writes_refused: Option<String>,
    /// `archive.url` (null: no archive).
    pub archive_url: Option<String>,
    /// How long the oldest durable entry not in the archive has waited (0: caught up).
    pub archive_lag_seconds: Option<f64>,
    pub archive_lag_bytes: Option<u64>,
    pub archive_restore_points: Option<u64>,
    /// The timeline walrus writes (docs/archive.md).
    pub archive_timeline: Option<u64>,
    /// Unix time of the newest restore point, and of the last upload.
    pub archive_newest_restore_point: Option<i64>,
    pub archive_last_upload: Option<i64>,
    /// The last upload's failure, until one succeeds; or why walrus stopped writing it.
    pub archive_error: Option<String>,
    pub archive_stopped: bool,
}

impl Sources {
    pub fn new(ready: Ready, durability: bool) -> Sources {
        Sources {
            ready,
            started: Instant::now(),
            durability,
            durable: OnceLock::new(),
        }
    }

    /// The status now.
    pub fn read(&self) -> Status {
        use crate::metrics as m;
        let ready = (self.ready)();
        let mut s = Status {
            version: m::VERSION.into(),
            commit: m::COMMIT.into(),
            uptime_seconds: self.started.elapsed().as_secs(),
            ready: ready.is_ok(),
            ready_reason: ready.err().unwrap_or_default(),
            durability: self.durability,
            link: if self.durability { "starting" } else { "off" }.into(),
            restore_in_progress: m::RESTORE_IN_PROGRESS.get() != 0,
            restore_sent_bytes: m::RESTORE_SENT_BYTES.get().max(0) as u64,
            restore_total_bytes: m::RESTORE_TOTAL_BYTES.get().max(0) as u64,
            restore_estimate_seconds: m::RESTORE_ESTIMATE.get(),
            disk_watermark_reached: m::WATERMARK_REACHED.get() != 0,
            ..Status::default()
        };
        let Some(d) = self.durable.get() else {
            return s;
        };
        s.writes_refused = d.gate.write_refusal().map(|r| r.to_string());
        let link = d.gate.status();
        s.attached = link == LinkState::Attached;
        s.link = match link {
            LinkState::Attached => "attached",
            LinkState::Detached => "detached",
            LinkState::Restoring => "restoring",
            LinkState::Failed(_) => "failed",
        }
        .into();
        let (durable, executed, _, _) = d.gate.snapshot();
        s.valkey_offset = Some(executed);
        s.durable_offset = Some(durable);
        s.lag_bytes = Some(executed.saturating_sub(durable));
        if let Some(journal) = d.journal.upgrade() {
            s.journal_backend = Some(journal.backend().to_string());
            let j = journal.status();
            s.ring_segments_used = Some(j.used_segments);
            s.ring_segments_total = Some(u64::from(j.segments));
            s.ring_bytes_used = Some(j.write_pos - j.head_pos);
            s.ring_bytes_total = Some(u64::from(j.segments) * j.segment_bytes);
        }
        if let Some(c) = d.store.recorded() {
            s.checkpoint_age_seconds = d
                .store
                .written_at()
                .and_then(|t| t.elapsed().ok())
                .map(|a| a.as_secs());
            s.checkpoint_offset = Some(c.offset);
            s.checkpoint_size_bytes = Some(c.size);
            s.checkpoint_file = Some(c.file);
        }
        if let Some(a) = d.archive.as_ref().map(|a| a.snapshot()) {
            s.archive_lag_seconds = Some(a.lag_seconds);
            s.archive_lag_bytes = Some(a.lag_bytes);
            s.archive_restore_points = Some(a.restore_points as u64);
            s.archive_timeline = Some(a.timeline);
            s.archive_newest_restore_point = a.newest_restore_point;
            s.archive_last_upload = a.last_upload;
            s.archive_stopped = a.stopped.is_some();
            s.archive_error = a.stopped.or(a.error);
            s.archive_url = Some(a.url);
        }
        s
    }
}

impl Status {
    /// The human-readable form `walrus status` prints.
    pub fn human(&self) -> String {
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k:<12} {v}\n"));
        line(
            "walrus",
            format!(
                "{} (commit {}), up {}",
                self.version,
                self.commit,
                duration(self.uptime_seconds)
            ),
        );
        line(
            "ready",
            if self.ready {
                "yes".into()
            } else {
                format!("no: {}", self.ready_reason)
            },
        );
        if !self.durability {
            line(
                "durability",
                "off: writes are not journaled, acknowledged writes can be lost".into(),
            );
        } else {
            line("link", self.link.clone());
            line(
                "offsets",
                format!(
                    "valkey {}, durable {}, lag {}",
                    opt(self.valkey_offset),
                    opt(self.durable_offset),
                    size(self.lag_bytes)
                ),
            );
            line(
                "ring",
                format!(
                    "{} of {} segments, {} of {}",
                    opt(self.ring_segments_used),
                    opt(self.ring_segments_total),
                    size(self.ring_bytes_used),
                    size(self.ring_bytes_total)
                ),
            );
            line(
                "journal",
                self.journal_backend
                    .clone()
                    .unwrap_or_else(|| "not open".into()),
            );
            line(
                "checkpoint",
                match (&self.checkpoint_file, self.checkpoint_offset) {
                    (Some(f), Some(o)) => format!(
                        "{f}: offset {o}, {}, {} old",
                        size(self.checkpoint_size_bytes),
                        self.checkpoint_age_seconds.map_or("?".into(), duration)
                    ),
                    _ => "none".into(),
                },
            );
        }
        if let Some(url) = &self.archive_url {
            let mut a = format!(
                "{url}: {:.1} s behind ({}), {} restore points",
                self.archive_lag_seconds.unwrap_or(0.0),
                size(self.archive_lag_bytes),
                opt(self.archive_restore_points)
            );
            if let Some(e) = &self.archive_error {
                a.push_str(&format!(
                    "; {}: {e}",
                    if self.archive_stopped {
                        "stopped"
                    } else {
                        "failing"
                    }
                ));
            }
            line("archive", a);
        }
        line(
            "restore",
            if self.restore_in_progress {
                format!(
                    "in progress: {} of {} sent",
                    format_size(self.restore_sent_bytes),
                    format_size(self.restore_total_bytes)
                )
            } else {
                format!(
                    "none running; one would take about {:.1} s",
                    self.restore_estimate_seconds
                )
            },
        );
        line(
            "writes",
            match &self.writes_refused {
                Some(why) => format!("refused: {why}"),
                None if self.link == "starting" => "-".into(),
                None if self.durability => "accepted".into(),
                None => "accepted (durability off)".into(),
            },
        );
        line(
            "disk",
            if self.disk_watermark_reached {
                "high watermark reached: new writes are refused".into()
            } else {
                "below the high watermark".into()
            },
        );
        out
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn size(v: Option<u64>) -> String {
    v.map_or("-".into(), format_size)
}

fn duration(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}
