//! The uploader: one task that keeps the archive behind the journal, never on the path that
//! acknowledges writes (it reads what is durable already).
//!
//! Each round: make sure the archive is still this walrus's ([`super::owner`]); make sure the
//! archive has a restore point the journal's entries continue (the local checkpoint,
//! uploaded when there is none on this timeline, when the stream broke, when the journal
//! released entries before they were archived, or once `archive.checkpoint_after_bytes` of
//! journal were archived after the last one); then upload the durable entries not yet
//! archived as one object, at once when `archive.object_bytes` wait (a sealed segment's
//! worth) or with `durability.ack = "archive"` (group commit: what waits goes together),
//! else half of `archive.max_lag_ms` after the oldest of them became durable. Small objects
//! are merged, `archive.merge_objects` at a time, from the local journal.
//!
//! Nothing is lost or duplicated across a crash: objects are written whole (a PUT, or a
//! rename), named by what they hold, so one written again holds the same bytes; a restart
//! lists the timeline to find where the archive ends, and objects left over by a merge cut
//! short are deleted then. A failure is retried with backoff, logged once per kind, counted,
//! and shown in `/status`; the journal goes on meanwhile, and the archive catches up after.

use super::identity::Identity;
use super::manifest::{Manifest, RestorePoint};
use super::object::JournalObject;
use super::owner::Owned;
use super::status::ArchiveStatus;
use super::store::Store;
use super::{timeline, ArchiveError};
use crate::checkpoint::{manifest::Checkpoint, store::Store as LocalStore, Pin};
use crate::journal::{Durable, Journal, ScanStart};
use crate::task::backoff::Backoff;
use crate::units::time::now_ms;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::read::{read_batch, Batch, Read, ReplId};

/// How the uploader paces itself (from `[archive]` and `durability.ack`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_lag: Duration,
    pub object_bytes: u64,
    pub merge_objects: u32,
    pub checkpoint_after_bytes: u64,
    /// Zero: none.
    pub checkpoint_interval: Duration,
    pub keep_restore_points: u32,
    pub keep_for: Duration,
    pub max_backoff: Duration,
    pub owner_check_interval: Duration,
    pub ack_archive: bool,
}

pub struct Uploader {
    /// Where a checkpoint is asked for when the newest restore point is older than
    /// `checkpoint_interval` and no newer checkpoint came by itself.
    pub checkpoint: Option<super::ask::Asker>,
    pub store: Store,
    pub journal: Arc<Journal>,
    pub local: LocalStore,
    pub pin: Pin,
    pub data_dir: PathBuf,
    pub identity: Identity,
    pub settings: Settings,
    pub status: Arc<ArchiveStatus>,
}

/// The local checkpoint a restore point was uploaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Point {
    replid: String,
    offset: u64,
    crc64: u64,
    from_lsn: u64,
}

impl Point {
    fn of(c: &Checkpoint) -> Point {
        Point {
            replid: c.replid.clone(),
            offset: c.offset,
            crc64: c.crc64,
            from_lsn: c.from_lsn,
        }
    }
}

/// A journal object after the current restore point, and where its entries begin in the
/// local journal (for a merge).
#[derive(Debug, Clone)]
pub(super) struct Uploaded {
    pub(super) object: JournalObject,
    pub(super) from: Option<ScanStart>,
}

/// Where the uploader is on its timeline.
#[derive(Debug, Clone)]
pub(super) struct Position {
    pub(super) timeline: u64,
    point: Point,
    /// Replication ids of the stream since the restore point.
    ids: Vec<ReplId>,
    /// The stream offset the archive holds through on this timeline.
    end: u64,
    /// The next local entry to archive, and where the journal's replay resumes before it.
    next_lsn: u64,
    cursor: Option<ScanStart>,
    /// Stream bytes archived since the restore point, and when it was recorded.
    since_point: u64,
    point_at: Instant,
    /// When a checkpoint was last asked for (`checkpoint_interval`).
    asked: Option<Instant>,
    pub(super) objects: Vec<Uploaded>,
    /// The local journal cannot continue this timeline's stream: a new restore point is due.
    broken: bool,
    /// The local journal has not been read since the timeline was resumed: where it stands
    /// against the archive is found at once, not when an upload is due.
    unread: bool,
}

enum Step {
    /// Something was done: go round again at once.
    Busy,
    /// Nothing to do before this instant, nor (unless `wake`: then as soon as it moves)
    /// before the journal's durable position moves.
    Idle(Instant),
    /// Nothing to do before this instant, whatever the journal does meanwhile: entries wait,
    /// and are uploaded together when due (waking at every group commit of the journal
    /// would cost the cores the writes need).
    Sleep(Instant),
}

impl Uploader {
    /// Runs until walrus stops, or until another walrus takes the archive over.
    pub async fn run(self) {
        let mut owned: Option<Owned> = None;
        let mut pos: Option<Position> = None;
        let mut failures = 0u32;
        let mut backoff = Backoff::up_to(self.settings.max_backoff);
        let mut last_failure = String::new();
        let mut durable = self.journal.durable();
        loop {
            match self.step(&mut owned, &mut pos).await {
                Ok(step) => {
                    if failures > 0 {
                        tracing::info!(url = %self.status.url, "the archive is reachable again; catching up");
                    }
                    failures = 0;
                    backoff.reset();
                    last_failure.clear();
                    match step {
                        // A round may find all it awaited ready: yielding lets an abort
                        // (walrus stopping) in between rounds whatever they do.
                        Step::Busy => tokio::task::yield_now().await,
                        Step::Idle(until) => tokio::select! {
                            r = durable.changed() => if r.is_err() { return },
                            _ = tokio::time::sleep_until(until.into()) => {}
                        },
                        Step::Sleep(until) => tokio::time::sleep_until(until.into()).await,
                    }
                }
                Err(ArchiveError::Owner(why)) => {
                    tracing::error!(url = %self.status.url, "walrus no longer writes the archive: {why}");
                    self.status.stop(why);
                    return;
                }
                Err(e) => {
                    failures += 1;
                    let text = e.to_string();
                    let kind = text.split(':').next().unwrap_or(&text).to_string();
                    if kind != last_failure {
                        tracing::warn!(url = %self.status.url, "archive upload failed (retrying; the journal is unaffected): {e}");
                        last_failure = kind;
                    }
                    self.status.failed(text);
                    // The manifest is read again: a write whose answer was lost may have
                    // happened.
                    owned = None;
                    tokio::time::sleep(backoff.advance()).await;
                }
            }
        }
    }

    async fn step(
        &self,
        owned: &mut Option<Owned>,
        pos: &mut Option<Position>,
    ) -> Result<Step, ArchiveError> {
        let now = Instant::now();
        let o = match owned {
            Some(o) if now.duration_since(o.checked) < self.settings.owner_check_interval => o,
            _ => {
                let claimed =
                    super::owner::claim(&self.store, &self.identity, &self.data_dir).await?;
                if pos
                    .as_ref()
                    .is_some_and(|p| p.timeline < claimed.manifest.timeline)
                {
                    *pos = None;
                }
                owned.insert(claimed)
            }
        };
        let Some(lc) = self.local.recorded() else {
            return Ok(Step::Idle(now + self.settings.max_lag / 2));
        };
        self.note_server(o, &lc).await?;
        let lp = Point::of(&lc);
        match pos {
            None => {
                *pos = Some(self.resume_or_start(o, &lc).await?);
                return Ok(Step::Busy);
            }
            Some(p) if p.point != lp => {
                let replid: Option<ReplId> = lc.replid.as_bytes().try_into().ok();
                let continues =
                    replid.is_some_and(|r| p.ids.contains(&r)) && lc.offset >= p.point.offset;
                if !continues {
                    *pos = Some(self.start_timeline(o, &lc).await?);
                    return Ok(Step::Busy);
                }
                let interval = self.settings.checkpoint_interval;
                let old = !interval.is_zero() && now.duration_since(p.point_at) >= interval;
                if p.broken
                    || p.since_point >= self.settings.checkpoint_after_bytes
                    || (old && p.since_point > 0)
                {
                    let timeline = p.timeline;
                    if !self.add_point(o, &lc, timeline, None).await? {
                        return Ok(Step::Busy);
                    }
                    p.point = lp;
                    p.since_point = 0;
                    p.point_at = now;
                    p.objects.retain(|u| u.object.end > lc.offset);
                    if p.broken || p.end < lc.offset {
                        p.end = lc.offset;
                        p.next_lsn = lc.from_lsn;
                        p.cursor = None;
                        p.broken = false;
                    }
                    self.status.advanced(Durable {
                        lsn: lc.from_lsn - 1,
                        repl_offset: lc.offset,
                        failed: false,
                    });
                    return Ok(Step::Busy);
                }
            }
            Some(p) if p.broken => {
                // Only a new checkpoint can carry the archive on: wait for one.
                return Ok(Step::Idle(now + self.settings.max_lag / 2));
            }
            Some(p) => self.ask_for_checkpoint(p, now),
        }
        let p = pos.as_mut().expect("set above");
        self.upload_journal(p, now).await
    }

    /// The newest restore point is older than `checkpoint_interval`, writes came since, and
    /// no checkpoint was taken meanwhile (the ring's rules did not need one): asks for one,
    /// once per interval; the next round uploads it.
    fn ask_for_checkpoint(&self, p: &mut Position, now: Instant) {
        let interval = self.settings.checkpoint_interval;
        let due = |t: Instant| now.duration_since(t) >= interval;
        if interval.is_zero() || p.since_point == 0 || !due(p.point_at) || !p.asked.is_none_or(due)
        {
            return;
        }
        p.asked = Some(now);
        self.request_checkpoint(
            "the newest restore point is older than archive.checkpoint_interval_ms",
        );
    }

    /// Asks the checkpointer for a checkpoint (none while an earlier request is unanswered:
    /// [`super::ask::Asker`]), and logs it when asked.
    pub(super) fn request_checkpoint(&self, why: &str) {
        if self.checkpoint.as_ref().is_some_and(|c| c.ask()) {
            tracing::info!(url = %self.status.url, "archive: asking for a checkpoint: {why}");
        }
    }

    /// At start: the timeline goes on if its newest restore point is the local checkpoint
    /// (and this walrus did not just take the archive over); else a new one starts.
    async fn resume_or_start(
        &self,
        o: &mut Owned,
        lc: &Checkpoint,
    ) -> Result<Position, ArchiveError> {
        let t = o.manifest.timeline;
        let same = |r: &RestorePoint| r.timeline == t && r.of_checkpoint(lc);
        if !o.manifest.restore_points.iter().any(same) {
            return self.start_timeline(o, lc).await;
        }
        let objects = timeline::objects(&self.store, t).await?;
        let cover = timeline::cover(&objects, lc.offset);
        for r in &cover.redundant {
            self.store.delete(&r.key()).await?;
        }
        tracing::info!(
            url = %self.status.url,
            timeline = t,
            end = cover.end,
            objects = cover.objects.len(),
            "archive: going on from where it ends"
        );
        let p = Position {
            timeline: t,
            point: Point::of(lc),
            ids: vec![replid_bytes(&lc.replid)?],
            end: cover.end,
            next_lsn: lc.from_lsn,
            cursor: None,
            since_point: cover.end - lc.offset,
            point_at: Instant::now(),
            asked: None,
            objects: cover
                .objects
                .into_iter()
                .map(|object| Uploaded { object, from: None })
                .collect(),
            broken: false,
            unread: true,
        };
        self.status.restore_points(t, &created(&o.manifest));
        // What the archive holds is archived: the position is found by the next read.
        Ok(p)
    }

    /// A new timeline, from the local checkpoint.
    async fn start_timeline(
        &self,
        o: &mut Owned,
        lc: &Checkpoint,
    ) -> Result<Position, ArchiveError> {
        // A timeline with no restore point yet (a new archive, one just taken over) holds
        // no object either: it is this one's.
        let current = o.manifest.timeline;
        let t = if o
            .manifest
            .restore_points
            .iter()
            .any(|r| r.timeline == current)
        {
            current + 1
        } else {
            current.max(1)
        };
        // The local journal may run past the checkpoint already (this walrus was restored
        // from the archive, or had data before the archive was set): the new timeline's
        // restore point is whole only once that much is uploaded on it again.
        let durable = self.journal.durable().borrow().repl_offset;
        let complete_at = (durable > lc.offset).then_some(durable);
        if !self.add_point(o, lc, t, complete_at).await? {
            return Err(ArchiveError::Local(
                "the checkpoint changed while it was uploaded; trying the new one".into(),
            ));
        }
        tracing::info!(url = %self.status.url, timeline = t, offset = lc.offset, "archive: a new timeline starts from the checkpoint");
        self.status.advanced(Durable {
            lsn: lc.from_lsn - 1,
            repl_offset: lc.offset,
            failed: false,
        });
        Ok(Position {
            timeline: t,
            point: Point::of(lc),
            ids: vec![replid_bytes(&lc.replid)?],
            end: lc.offset,
            next_lsn: lc.from_lsn,
            cursor: None,
            since_point: 0,
            point_at: Instant::now(),
            asked: None,
            objects: Vec::new(),
            broken: false,
            unread: false,
        })
    }

    /// Uploads the durable entries not yet archived, when due.
    async fn upload_journal(&self, p: &mut Position, now: Instant) -> Result<Step, ArchiveError> {
        let durable = *self.journal.durable().borrow();
        let idle = Step::Idle(now + self.settings.max_lag / 2);
        if durable.lsn < p.next_lsn {
            return Ok(idle);
        }
        let waiting = durable.repl_offset.saturating_sub(p.end);
        let due_at = self
            .status
            .waiting_since()
            .map_or(now, |t| t + self.settings.max_lag / 2);
        let due = self.settings.ack_archive
            || p.unread
            || waiting >= self.settings.object_bytes
            || now >= due_at;
        if !due {
            // Near a segment's worth, each group commit may make the upload due.
            return Ok(if waiting * 2 >= self.settings.object_bytes {
                Step::Idle(due_at)
            } else {
                Step::Sleep(due_at)
            });
        }
        let batch = self
            .read(Read {
                from: p.cursor,
                next_lsn: p.next_lsn,
                upto_lsn: durable.lsn,
                pos: p.end,
                ids: p.ids.clone(),
                max_bytes: self.settings.object_bytes,
            })
            .await?;
        p.unread = false;
        if batch.released || batch.broke {
            p.broken = true;
            if batch.released {
                tracing::warn!(url = %self.status.url, lsn = p.next_lsn, "archive: the journal released entries before they were archived; the next restore point carries the archive on");
            }
        }
        if batch.entries.is_empty() {
            if batch.next_lsn > p.next_lsn {
                // Entries the restore point covers already.
                self.status.advanced(Durable {
                    lsn: batch.next_lsn - 1,
                    repl_offset: p.end,
                    failed: false,
                });
            }
            p.next_lsn = batch.next_lsn;
            p.cursor = batch.cursor;
            return Ok(if p.broken { Step::Busy } else { idle });
        }
        let replid = batch.replid.expect("entries have an id");
        let object = JournalObject::of(p.timeline, replid, &batch.entries, 0);
        let bytes = object.encode(&batch.entries, now_ms());
        let r = self.store.put(&object.key(), bytes).await;
        uploaded("journal", &r);
        r?;
        crate::fault::fail_point!("archive::journal_uploaded");
        let stream = object.end - object.start;
        crate::metrics::ARCHIVE_JOURNAL_BYTES.inc_by(stream);
        p.ids = batch.ids;
        p.end = object.end;
        p.next_lsn = batch.next_lsn;
        p.cursor = batch.cursor;
        p.since_point += stream;
        self.status.advanced(Durable {
            lsn: object.last_lsn,
            repl_offset: object.end,
            failed: false,
        });
        p.objects.push(Uploaded {
            object,
            from: batch.start_cursor,
        });
        self.merge(p).await?;
        Ok(Step::Busy)
    }

    /// Reads entries from the journal (under the pin: no release meanwhile).
    pub(super) async fn read(&self, r: Read) -> Result<Batch, ArchiveError> {
        let pinned = self.pin.clone().read_owned().await;
        let journal = self.journal.clone();
        let batch = tokio::task::spawn_blocking(move || read_batch(&journal, r))
            .await
            .map_err(|e| ArchiveError::Local(format!("archive read task failed: {e}")))?;
        drop(pinned);
        batch.map_err(|e| ArchiveError::Local(format!("reading the journal: {e}")))
    }
}

pub(super) fn uploaded<T>(kind: &str, r: &Result<T, ArchiveError>) {
    let result = if r.is_ok() { "ok" } else { "error" };
    crate::metrics::ARCHIVE_UPLOADS
        .with_label_values(&[kind, result])
        .inc();
}

fn replid_bytes(replid: &str) -> Result<ReplId, ArchiveError> {
    replid
        .as_bytes()
        .try_into()
        .map_err(|_| ArchiveError::Local(format!("{replid:?} is not a replication id")))
}

pub(super) fn created(m: &Manifest) -> Vec<i64> {
    m.restore_points.iter().map(|r| r.created).collect()
}
