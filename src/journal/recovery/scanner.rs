//! The scan: records accepted in sequence from a start, the entries they make, and where
//! the log ends. Used by recovery, verify, inspect and replay.

use super::super::error::JournalError;
use super::super::format::{align_up, Kind, RecordHeader, HEADER_BYTES, REPL_ID_BYTES};
use super::super::ring::{Geometry, RingRead};
use super::candidate::{Candidates, Reject};
use super::report::{ScanReport, SegStat};
use super::start::{EntryStart, LogEnd, ScanLimits, ScanStart};
use super::tail::{classify, Stop};

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

/// Walks the records of the log in order.
pub struct Scanner<R> {
    cand: Candidates<R>,
    geo: Geometry,
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
            cand: Candidates::new(ring, geo, limits),
            geo,
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

    fn check(&mut self, c: u64) -> std::io::Result<Result<RecordHeader, Reject>> {
        if c >= self.limit_pos {
            return Ok(Err(Reject::BeyondRing));
        }
        let h = match self.cand.decode_at(c)? {
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
        if h.epoch < self.last_epoch || h.epoch > self.cand.limits.max_epoch {
            return Ok(Err(Reject::Epoch {
                found: h.epoch,
                min: self.last_epoch,
                max: self.cand.limits.max_epoch,
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
            .cand
            .bytes(c + HEADER_BYTES as u64, h.payload_len as usize)?;
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
        let (expected_lsn, dropped_partial) = match &self.in_entry {
            Some(f) => (f.lsn, true),
            None => (self.end.next_lsn, false),
        };
        let reason = self
            .last_reject
            .as_ref()
            .map(|(_, r)| r.to_string())
            .unwrap_or_else(|| "end of scan".to_string());
        let stop = Stop {
            pos: self.pos,
            expected_lsn,
            last_epoch: self.last_epoch,
            reason,
            limit_pos: self.limit_pos,
        };
        let tail = classify(&mut self.cand, stop)?;
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
