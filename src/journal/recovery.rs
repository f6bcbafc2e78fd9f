//! Recovery: find the true end of the log, and tell a torn tail from mid-log corruption.
//!
//! Scanning starts at the checkpoint (a record start with a known LSN) and walks records.
//! After a record ending at `end`, the next record is at `end` (same write) or at
//! `align_up(end)` (a new write; this may be the next segment's start). A candidate is
//! accepted only when all of these hold:
//! - magic, version, kind and reserved bytes are right, the record fits in its segment;
//! - the CRC over the journal's key, header and payload matches (a record a client planted
//!   inside a value never has the key); unkeyed format 1 records only from the epochs before
//!   a journal made before keys was upgraded;
//! - `seg_seq` equals the position's segment sequence (a previous lap's record is stale);
//! - `epoch` is not older than the previous record's (leftovers of a crashed run) and not
//!   newer than the manifest's;
//! - the kind and LSN continue the sequence: FULL/FIRST with LSN exactly previous + 1,
//!   MIDDLE/LAST of the entry in progress, with its FIRST's epoch, replication id and
//!   offset (fragments of two runs never splice into one entry).
//!
//! The first rejected position is the end. Then a look-ahead searches the following bytes
//! (a write may continue inside the previous write's last block, so records start
//! anywhere) for a valid record of the current lap whose
//! `durable_hint` is at least the expected LSN: such a record was encoded after the missing
//! entry had been acknowledged durable, so the gap is corruption, not a torn tail. Without
//! such proof the tail is cut silently: writes after a torn one may have completed, but none
//! of them was reported durable (durability is the contiguous prefix of completed writes).

use super::error::{Corruption, JournalError};
use super::format::{
    align_up, record_crc, record_fits_at, stored_crc, Kind, RecordHeader, RecordKey, HEADER_BYTES,
    MAGIC, REPL_ID_BYTES, UNKEYED_FORMAT_VERSION,
};
use super::manifest::{Checkpoint, Manifest};
use super::ring::{Geometry, RingRead};

/// Where a scan starts: a record boundary with the LSN expected there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanStart {
    pub pos: u64,
    pub lsn: u64,
    /// Replication position at the end of the entry before `lsn`.
    pub repl_id: [u8; REPL_ID_BYTES],
    pub repl_offset: u64,
    /// Epoch of the entry before `lsn`: the log's epochs never decrease, so nothing older
    /// continues it (a checkpoint at the very end of the log reads no record first).
    pub epoch: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct ScanLimits {
    /// Records from a newer epoch than the manifest's cannot exist; treat them as junk.
    pub max_epoch: u32,
    pub lookahead_bytes: u64,
    /// The journal's secret: only records whose checksum includes it are records.
    pub key: RecordKey,
    /// Records of epochs below this are unkeyed (format 1), those from it on keyed: 0 for a
    /// journal made keyed, the upgrade's epoch for one made before keys, `u32::MAX` before.
    pub keyed_from_epoch: u32,
    /// Format 1 records lie only below this position (0: none; `u64::MAX` before the
    /// upgrade): a client's value may hold one, well formed without the key.
    pub unkeyed_below_pos: u64,
    /// Where the newest run (of epoch `max_epoch`) began writing, if known: past it, only
    /// that run's records are evidence (older ones were cut by its open).
    pub resumed_at_pos: Option<u64>,
}

impl ScanLimits {
    /// How recovery reads `m`'s records: its key, epochs, and how far it looks past a bad
    /// record (`JournalConfig::lookahead_bytes`).
    pub fn of(m: &Manifest, lookahead_bytes: u64) -> ScanLimits {
        let (key, keyed_from_epoch, unkeyed_below_pos) = m.record_keys();
        ScanLimits {
            max_epoch: m.epoch,
            lookahead_bytes,
            key,
            keyed_from_epoch,
            unkeyed_below_pos,
            resumed_at_pos: m.resumed_at_pos,
        }
    }
}

impl ScanStart {
    /// The start of a journal that never released anything: the ring's first byte, LSN 1.
    pub const ORIGIN: ScanStart = ScanStart {
        pos: 0,
        lsn: 1,
        repl_id: [0; REPL_ID_BYTES],
        repl_offset: 0,
        epoch: 0,
    };

    /// Where a scan resumes after the entry that ends the log at `end`.
    pub fn after(end: &LogEnd) -> ScanStart {
        ScanStart {
            pos: end.end_pos,
            lsn: end.next_lsn,
            repl_id: end.last_repl_id,
            repl_offset: end.last_repl_offset,
            epoch: end.last_epoch,
        }
    }

    /// Where recovery starts: the checkpoint's first retained record and what came before.
    pub fn at(cp: &Checkpoint) -> Result<ScanStart, JournalError> {
        Ok(ScanStart {
            pos: cp.start_pos,
            lsn: cp.start_lsn,
            repl_id: cp.prev_repl_id()?,
            repl_offset: cp.prev_repl_offset,
            epoch: cp.prev_epoch,
        })
    }
}

/// End of the recovered log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEnd {
    /// Logical position just after the last record of the last complete entry.
    pub end_pos: u64,
    /// LSN the next appended entry gets.
    pub next_lsn: u64,
    pub last_repl_id: [u8; REPL_ID_BYTES],
    pub last_repl_offset: u64,
    pub last_epoch: u32,
}

impl LogEnd {
    pub fn last_lsn(&self) -> u64 {
        self.next_lsn - 1
    }
}

/// First entry starting in a segment: a place where a checkpoint can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStart {
    pub pos: u64,
    pub lsn: u64,
    pub prev_repl_id: [u8; REPL_ID_BYTES],
    pub prev_repl_offset: u64,
    /// Epoch of the entry before `lsn`.
    pub prev_epoch: u32,
}

/// What the scan saw in one segment of the live log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegStat {
    pub seg_seq: u64,
    pub records: u64,
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub first_repl_offset_end: u64,
    pub last_repl_offset_end: u64,
    /// Offset just past the last accepted record in this segment.
    pub used_bytes: u64,
    pub first_entry_start: Option<EntryStart>,
}

/// How the log ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Normal end (never written, stale lap, or torn tail). `reason` says what was found.
    End { pos: u64, reason: String },
    /// Mid-log corruption: valid, acknowledged-after entries follow a bad record.
    Corrupt(Corruption),
}

#[derive(Debug, Clone)]
pub struct ScanReport {
    pub start: ScanStart,
    pub end: LogEnd,
    pub entries: u64,
    pub records: u64,
    pub segments: Vec<SegStat>,
    pub tail: Tail,
    /// True when the last entry was cut because it ended inside a fragmented entry.
    pub dropped_partial_entry: bool,
}

impl ScanReport {
    /// Mid-log corruption, as `walrus journal verify` and `walrus verify` report it: what
    /// is wrong, what is lost, and the command that cuts the log there. `None`: the log is
    /// clean (a torn tail is a normal end). `dir` is the journal's directory.
    pub fn corruption(&self, dir: &std::path::Path) -> Option<String> {
        let Tail::Corrupt(c) = &self.tail else {
            return None;
        };
        Some(format!(
            "CORRUPT: {c}; entries after LSN {} are unreachable; \
             `walrus journal repair --dir {} --accept-data-loss` cuts the log there",
            self.end.last_lsn(),
            dir.display()
        ))
    }

    /// What cutting the log at its end overwrites (`journal repair`): from the end to the
    /// end of the ring. What an older run wrote past a cut is valid, of the current lap,
    /// with durable hints beyond the cut: left in place, any later open whose look-ahead
    /// reaches it would take it as evidence of corruption.
    pub fn repair_range(&self, geo: Geometry) -> (u64, u64) {
        (self.end.end_pos, geo.write_limit(self.start.pos))
    }
}

/// Size of the read-ahead window: large sequential reads.
const WINDOW_BYTES: usize = 1 << 20;

/// Caches a window of one segment so that small records do not each cost a syscall.
struct Window<R> {
    ring: R,
    geo: Geometry,
    buf: Vec<u8>,
    /// Logical position of buf[0]; u64::MAX when empty.
    start: u64,
    len: usize,
}

impl<R: RingRead> Window<R> {
    fn new(ring: R, geo: Geometry) -> Self {
        Window {
            ring,
            geo,
            buf: Vec::new(),
            start: u64::MAX,
            len: 0,
        }
    }

    /// Bytes `[pos, pos+len)`; the range must lie within one segment.
    fn get(&mut self, pos: u64, len: usize) -> std::io::Result<&[u8]> {
        let seg_end = self.geo.seg_end(pos);
        assert!(
            pos + len as u64 <= seg_end,
            "window read crosses a segment end"
        );
        let cached = self.start != u64::MAX
            && pos >= self.start
            && pos + len as u64 <= self.start + self.len as u64;
        if !cached {
            let want = (len.max(WINDOW_BYTES) as u64).min(seg_end - pos) as usize;
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            self.ring.read_exact_at(
                self.geo.seg_index(pos),
                self.geo.seg_off(pos),
                &mut self.buf[..want],
            )?;
            self.start = pos;
            self.len = want;
        }
        let o = (pos - self.start) as usize;
        Ok(&self.buf[o..o + len])
    }
}

/// Why a candidate position does not hold the next record.
fn describe_reject(r: &Reject) -> String {
    match r {
        Reject::NoRoom => "no room for a record before the segment end".into(),
        Reject::Header(e) => format!("no record header ({e:?})"),
        Reject::Length(n) => format!("payload length {n} runs past the segment end"),
        Reject::Crc => "CRC mismatch".into(),
        Reject::Format(v) => format!("format {v} record where the journal writes another format"),
        Reject::StaleLap { found, expected } => {
            format!("stale record from an earlier lap (seg_seq {found}, expected {expected})")
        }
        Reject::Epoch { found, min, max } => format!("record epoch {found} outside [{min}, {max}]"),
        Reject::Sequence {
            kind,
            lsn,
            expected,
        } => {
            format!("{kind:?} record with LSN {lsn}, expected {expected}")
        }
        Reject::BeyondRing => "the ring is full up to here".into(),
    }
}

#[derive(Debug)]
enum Reject {
    NoRoom,
    Header(super::format::HeaderError),
    Length(u32),
    Crc,
    Format(u8),
    StaleLap {
        found: u64,
        expected: u64,
    },
    Epoch {
        found: u32,
        min: u32,
        max: u32,
    },
    Sequence {
        kind: Kind,
        lsn: u64,
        expected: String,
    },
    BeyondRing,
}

/// A fragmented entry in progress: its FIRST record, which the rest must match.
#[derive(Debug, Clone, Copy)]
struct Fragmented {
    lsn: u64,
    epoch: u32,
    repl_id: [u8; REPL_ID_BYTES],
    repl_offset_end: u64,
}

impl Fragmented {
    fn continued_by(&self, h: &RecordHeader) -> bool {
        matches!(h.kind, Kind::Middle | Kind::Last)
            && h.lsn == self.lsn
            && h.epoch == self.epoch
            && h.repl_id == self.repl_id
            && h.repl_offset_end == self.repl_offset_end
    }
}

/// One accepted record.
pub struct Record<'a> {
    pub pos: u64,
    pub header: RecordHeader,
    pub payload: &'a [u8],
}

/// Walks the records of the log in order. Used by recovery, verify, inspect and replay.
pub struct Scanner<R> {
    win: Window<R>,
    geo: Geometry,
    limits: ScanLimits,
    start: ScanStart,
    /// End of the last accepted record (or the start position).
    pos: u64,
    limit_pos: u64,
    in_entry: Option<Fragmented>,
    last_epoch: u32,
    end: LogEnd,
    entries: u64,
    records: u64,
    last_reject: Option<(u64, Reject)>,
    segments: Vec<SegStat>,
    stopped: bool,
}

impl<R: RingRead> Scanner<R> {
    pub fn new(ring: R, geo: Geometry, start: ScanStart, limits: ScanLimits) -> Self {
        Scanner {
            win: Window::new(ring, geo),
            geo,
            limits,
            start,
            pos: start.pos,
            limit_pos: geo.write_limit(start.pos),
            in_entry: None,
            last_epoch: start.epoch,
            end: LogEnd {
                end_pos: start.pos,
                next_lsn: start.lsn,
                last_repl_id: start.repl_id,
                last_repl_offset: start.repl_offset,
                last_epoch: start.epoch,
            },
            entries: 0,
            records: 0,
            last_reject: None,
            segments: Vec::new(),
            stopped: false,
        }
    }

    /// Where the log ends so far: after the last complete entry read.
    pub fn end(&self) -> LogEnd {
        self.end
    }

    /// The well-formed, correctly keyed record at `c`, whatever its place in the sequence.
    fn decode_at(&mut self, c: u64) -> std::io::Result<Result<RecordHeader, Reject>> {
        let seg_size = self.geo.segment_size_bytes;
        if !record_fits_at(self.geo.seg_off(c), seg_size) {
            return Ok(Err(Reject::NoRoom));
        }
        let h = match RecordHeader::parse(self.win.get(c, HEADER_BYTES)?) {
            Ok(h) => h,
            Err(e) => return Ok(Err(Reject::Header(e))),
        };
        let total = HEADER_BYTES as u64 + u64::from(h.payload_len);
        if c + total > self.geo.seg_end(c) {
            return Ok(Err(Reject::Length(h.payload_len)));
        }
        let may_be_unkeyed =
            h.epoch < self.limits.keyed_from_epoch && c < self.limits.unkeyed_below_pos;
        if (h.version == UNKEYED_FORMAT_VERSION) != may_be_unkeyed {
            return Ok(Err(Reject::Format(h.version)));
        }
        let rec = self.win.get(c, total as usize)?;
        if record_crc(self.limits.key, rec, &rec[HEADER_BYTES..]) != stored_crc(rec) {
            return Ok(Err(Reject::Crc));
        }
        Ok(Ok(h))
    }

    fn check(&mut self, c: u64) -> std::io::Result<Result<RecordHeader, Reject>> {
        if c >= self.limit_pos {
            return Ok(Err(Reject::BeyondRing));
        }
        let h = match self.decode_at(c)? {
            Ok(h) => h,
            Err(r) => return Ok(Err(r)),
        };
        let expected_seq = self.geo.seg_seq(c);
        if h.seg_seq != expected_seq {
            return Ok(Err(Reject::StaleLap {
                found: h.seg_seq,
                expected: expected_seq,
            }));
        }
        if h.epoch < self.last_epoch || h.epoch > self.limits.max_epoch {
            return Ok(Err(Reject::Epoch {
                found: h.epoch,
                min: self.last_epoch,
                max: self.limits.max_epoch,
            }));
        }
        let ok = match &self.in_entry {
            Some(f) => f.continued_by(&h),
            None => h.kind.starts_entry() && h.lsn == self.end.next_lsn,
        };
        if !ok {
            let expected = match &self.in_entry {
                Some(f) => format!(
                    "MIDDLE/LAST of LSN {} from epoch {} at offset {}",
                    f.lsn, f.epoch, f.repl_offset_end
                ),
                None => format!("FULL/FIRST with LSN {}", self.end.next_lsn),
            };
            return Ok(Err(Reject::Sequence {
                kind: h.kind,
                lsn: h.lsn,
                expected,
            }));
        }
        Ok(Ok(h))
    }

    /// The next accepted record, or None at the end of the log.
    pub fn next_record(&mut self) -> std::io::Result<Option<Record<'_>>> {
        if self.stopped {
            return Ok(None);
        }
        let end = self.pos;
        let aligned = align_up(end);
        let mut accepted = None;
        let candidates = [Some(end), (aligned != end).then_some(aligned)];
        for c in candidates.into_iter().flatten() {
            match self.check(c)? {
                Ok(h) => {
                    accepted = Some((c, h));
                    break;
                }
                // Keep the last candidate's reason: after a write's zero padding, the
                // block boundary says more than the padding.
                Err(r) => self.last_reject = Some((c, r)),
            }
        }
        let Some((c, h)) = accepted else {
            self.stopped = true;
            return Ok(None);
        };
        self.last_reject = None;
        let rec_end = c + HEADER_BYTES as u64 + u64::from(h.payload_len);
        self.note_record(c, rec_end, &h);
        self.pos = rec_end;
        self.last_epoch = h.epoch;
        self.records += 1;
        match h.kind {
            Kind::First => {
                self.in_entry = Some(Fragmented {
                    lsn: h.lsn,
                    epoch: h.epoch,
                    repl_id: h.repl_id,
                    repl_offset_end: h.repl_offset_end,
                })
            }
            Kind::Middle => {}
            Kind::Full | Kind::Last => {
                self.in_entry = None;
                self.entries += 1;
                self.end = LogEnd {
                    end_pos: rec_end,
                    next_lsn: h.lsn + 1,
                    last_repl_id: h.repl_id,
                    last_repl_offset: h.repl_offset_end,
                    last_epoch: h.epoch,
                };
            }
        }
        let payload = self
            .win
            .get(c + HEADER_BYTES as u64, h.payload_len as usize)?;
        Ok(Some(Record {
            pos: c,
            header: h,
            payload,
        }))
    }

    fn note_record(&mut self, pos: u64, rec_end: u64, h: &RecordHeader) {
        let seq = self.geo.seg_seq(pos);
        if self.segments.last().map(|s| s.seg_seq) != Some(seq) {
            self.segments.push(SegStat {
                seg_seq: seq,
                records: 0,
                first_lsn: h.lsn,
                last_lsn: h.lsn,
                first_repl_offset_end: h.repl_offset_end,
                last_repl_offset_end: h.repl_offset_end,
                used_bytes: 0,
                first_entry_start: None,
            });
        }
        let (end_repl_id, end_repl_off, end_epoch) = (
            self.end.last_repl_id,
            self.end.last_repl_offset,
            self.end.last_epoch,
        );
        let s = self.segments.last_mut().expect("pushed above");
        s.records += 1;
        s.last_lsn = h.lsn;
        s.last_repl_offset_end = h.repl_offset_end;
        s.used_bytes = self.geo.seg_off(rec_end - 1) + 1;
        if s.first_entry_start.is_none() && h.kind.starts_entry() {
            s.first_entry_start = Some(EntryStart {
                pos,
                lsn: h.lsn,
                prev_repl_id: end_repl_id,
                prev_repl_offset: end_repl_off,
                prev_epoch: end_epoch,
            });
        }
    }

    /// Runs to the end, then classifies the tail.
    pub fn finish(mut self) -> std::io::Result<ScanReport> {
        while self.next_record()?.is_some() {}
        if let Some(f) = &self.in_entry {
            // The entry whose fragments stop early is not in the log: its FIRST is no
            // place for a checkpoint to start (the next run writes its own entries from
            // the end, before it).
            for s in &mut self.segments {
                if s.first_entry_start.is_some_and(|e| e.lsn == f.lsn) {
                    s.first_entry_start = None;
                }
            }
        }
        let bad_pos = self.pos;
        let (expected_lsn, dropped_partial) = match &self.in_entry {
            Some(f) => (f.lsn, true),
            None => (self.end.next_lsn, false),
        };
        let reason = self
            .last_reject
            .as_ref()
            .map(|(_, r)| describe_reject(r))
            .unwrap_or_else(|| "end of scan".to_string());
        let tail = match self.look_ahead(bad_pos, expected_lsn)? {
            Some((epos, eh)) => Tail::Corrupt(Corruption {
                pos: bad_pos,
                segment_index: self.geo.seg_index(bad_pos),
                segment_offset: self.geo.seg_off(bad_pos),
                expected_lsn,
                reason,
                evidence_pos: epos,
                evidence_lsn: eh.lsn,
                evidence_durable_hint: eh.durable_hint,
            }),
            None => Tail::End {
                pos: bad_pos,
                reason,
            },
        };
        Ok(ScanReport {
            start: self.start,
            end: self.end,
            entries: self.entries,
            records: self.records,
            segments: self.segments,
            tail,
            dropped_partial_entry: dropped_partial,
        })
    }

    /// The first position in `[from, stop)` holding the record magic, if any.
    fn find_magic(&mut self, from: u64, stop: u64) -> std::io::Result<Option<u64>> {
        const HAY_BYTES: u64 = 64 * 1024;
        let magic = MAGIC.to_le_bytes();
        let mut p = from;
        while p < stop {
            let hay_end = (p + HAY_BYTES).min(self.geo.seg_end(p)).min(stop);
            let hay = self.win.get(p, (hay_end - p) as usize)?;
            if let Some(i) = memchr::memmem::find(hay, &magic) {
                return Ok(Some(p + i as u64));
            }
            // The magic may straddle the end of this piece, unless a segment ends there.
            let overlap = (magic.len() as u64 - 1) * u64::from(hay_end < self.geo.seg_end(p));
            p = (hay_end - overlap).max(p + 1);
        }
        Ok(None)
    }

    /// Searches the bytes from `bad_pos` on for a valid current-lap record, of an epoch not
    /// older than the log's last record (nor than the newest run's, past where it began),
    /// whose durable hint covers `expected_lsn`. Every
    /// position holding the magic is a candidate; only keyed records count (a client's
    /// value may hold anything, but not the key). A valid record that is not evidence is
    /// stepped over whole.
    fn look_ahead(
        &mut self,
        bad_pos: u64,
        expected_lsn: u64,
    ) -> std::io::Result<Option<(u64, RecordHeader)>> {
        // The log's own epochs never decrease; and where the log still ends where the
        // newest run's open said it ends, anything older past it was cut by that open.
        let cut_by_last_open = self.limits.resumed_at_pos.is_some_and(|r| bad_pos >= r);
        let min_epoch = if cut_by_last_open {
            self.last_epoch.max(self.limits.max_epoch)
        } else {
            self.last_epoch
        };
        let stop = (bad_pos.saturating_add(self.limits.lookahead_bytes)).min(self.limit_pos);
        let mut p = bad_pos;
        while let Some(c) = self.find_magic(p, stop)? {
            p = c + 1;
            let Ok(h) = self.decode_at(c)? else {
                continue;
            };
            if h.seg_seq == self.geo.seg_seq(c)
                && h.lsn > expected_lsn
                && h.durable_hint >= expected_lsn
                && (min_epoch..=self.limits.max_epoch).contains(&h.epoch)
            {
                return Ok(Some((c, h)));
            }
            p = c + HEADER_BYTES as u64 + u64::from(h.payload_len);
        }
        Ok(None)
    }
}

/// Scans the whole live log from `start`.
pub fn scan<R: RingRead>(
    ring: R,
    geo: Geometry,
    start: ScanStart,
    limits: ScanLimits,
) -> Result<ScanReport, JournalError> {
    Scanner::new(ring, geo, start, limits)
        .finish()
        .map_err(|e| JournalError::io("reading journal segments", e))
}

/// Whether the manifest's key is its ring's. A manifest copied in from another journal has
/// another key: every record of this ring then fails its checksum, and a scan reads the log
/// as empty (a clean end at its first record), losing it. Asked when a scan accepted no
/// record although the manifest says entries were written: the ring then holds records of
/// this journal (the released ones, or older laps'), sealed with its key, unless the key is
/// not its own. `false`: the ring holds well-formed records and not one is sealed with the
/// key (a client's value may hold record-like bytes, never the key). Reads only until the
/// first record that is, which in a journal's own ring comes soon.
pub fn key_seals_the_ring<R: RingRead>(
    ring: R,
    geo: Geometry,
    limits: ScanLimits,
) -> Result<bool, JournalError> {
    let mut s = Scanner::new(ring, geo, ScanStart::ORIGIN, limits);
    let io = |e| JournalError::io("reading journal segments", e);
    let (mut p, mut sealed_otherwise) = (0, false);
    while let Some(c) = s.find_magic(p, geo.ring_bytes()).map_err(io)? {
        p = c + 1;
        match s.decode_at(c).map_err(io)? {
            Ok(_) => return Ok(true),
            Err(Reject::Crc | Reject::Format(_)) => sealed_otherwise = true,
            Err(_) => {}
        }
    }
    Ok(!sealed_otherwise)
}
