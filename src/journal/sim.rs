//! A deterministic in-memory journal for tests and the fuzzer.
//!
//! It drives the real [`Batcher`] (the same placement and encoding as production) and
//! applies its writes to a [`MemRing`], so tests can crash "between" writes, apply writes
//! out of order, tear them, and then run the real recovery scanner on the result.

use super::batcher::{Batcher, BatcherInit, SealedWrite};
use super::format::{RecordKey, REPL_ID_BYTES};
use super::recovery::{scan, ScanLimits, ScanReport, ScanStart};
use super::ring::{Geometry, MemRing};

pub const SIM_REPL_ID: [u8; REPL_ID_BYTES] = *b"0123456789abcdef0123456789abcdef01234567";
/// The simulated journal's record key.
pub const SIM_KEY: RecordKey = RecordKey(0x7761_6c72_7573_6b65);

/// What a torn write left in one 512-byte sector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sector {
    /// The bytes before the write.
    Old,
    /// The write's bytes.
    New,
    /// Neither: what a device outside the torn-write model may return.
    Garbage,
}

/// A write taken from the batcher but not yet applied (in flight).
#[derive(Debug)]
pub struct PendingWrite {
    /// Block-aligned; a continuation's first bytes rewrite the previous write's tail.
    pub start_pos: u64,
    pub bytes: Vec<u8>,
    pub last_complete: Option<(u64, u64)>,
}

pub struct MemLog {
    pub geo: Geometry,
    pub ring: MemRing,
    batcher: Batcher,
    pub epoch: u32,
    pub start: ScanStart,
    /// Highest LSN whose write (and all before it) was applied.
    pub durable_lsn: u64,
    /// Where the current run (epoch) began writing, as the manifest records it.
    pub resumed_at_pos: u64,
    max_write_bytes: usize,
}

impl MemLog {
    pub fn new(geo: Geometry, max_write_bytes: usize) -> MemLog {
        let start = ScanStart::ORIGIN;
        assert!(
            max_write_bytes >= 2 * super::format::BLOCK_BYTES,
            "journal.max_write_bytes is at least two blocks"
        );
        let ring = MemRing::new(geo);
        MemLog {
            geo,
            ring,
            batcher: Self::batcher(
                geo,
                max_write_bytes,
                1,
                start,
                start.pos,
                Vec::new(),
                Vec::new(),
            ),
            epoch: 1,
            start,
            durable_lsn: 0,
            resumed_at_pos: 0,
            max_write_bytes,
        }
    }

    /// A batcher that writes from `end` (the end of the log, or its start when empty).
    fn batcher(
        geo: Geometry,
        max_write_bytes: usize,
        epoch: u32,
        end: ScanStart,
        head_pos: u64,
        starts: Vec<super::recovery::EntryStart>,
        tail: Vec<u8>,
    ) -> Batcher {
        Batcher::new(BatcherInit {
            geo,
            epoch,
            key: SIM_KEY,
            next_lsn: end.lsn,
            end_pos: end.pos,
            tail,
            head_pos,
            last_repl_id: end.repl_id,
            last_repl_offset: end.repl_offset,
            last_epoch: end.epoch,
            starts,
            write_buffers: 64,
            max_write_bytes,
            max_entry_bytes: geo.segment_size_bytes * u64::from(geo.segments - 2),
        })
    }

    /// Appends an entry, stamped with its offset (deterministic); returns its LSN, or None
    /// when the ring is full.
    pub fn append(&mut self, repl_offset_end: u64, payload: &[u8]) -> Option<u64> {
        loop {
            match self.batcher.append(
                &SIM_REPL_ID,
                repl_offset_end,
                payload,
                self.durable_lsn,
                repl_offset_end,
            ) {
                Ok(p) => return Some(p.lsn),
                // Pool exhausted: apply queued writes (as the writer thread would), retry.
                Err(super::error::JournalError::Busy) => self.flush(),
                Err(_) => return None,
            }
        }
    }

    /// Takes every write the writer could have in flight now (group commit) without
    /// applying it; a write over the last one's tail block is not among them until
    /// [`MemLog::complete`] reports that one done.
    pub fn take_writes(&mut self) -> Vec<PendingWrite> {
        let mut out = Vec::new();
        while let Some(w) = self.batcher.take_write(self.durable_lsn) {
            out.push(self.pending(w));
        }
        out
    }

    fn pending(&mut self, w: SealedWrite) -> PendingWrite {
        let start_pos = w.end_pos - w.buf.len() as u64;
        let p = PendingWrite {
            start_pos,
            bytes: w.buf.as_slice().to_vec(),
            last_complete: w.last_complete,
        };
        self.batcher.give_back(w.buf);
        p
    }

    /// Applies a write to the ring (its bytes reach the "disk").
    pub fn apply(&mut self, w: &PendingWrite) {
        self.ring.write_at(self.geo, w.start_pos, &w.bytes);
    }

    /// Applies a torn write: each 512-byte sector ends up as `fate` says.
    pub fn apply_sectors(&mut self, w: &PendingWrite, fate: impl Fn(usize) -> Sector) {
        for (s, sector) in w.bytes.chunks(512).enumerate() {
            let at = w.start_pos + (s * 512) as u64;
            match fate(s) {
                Sector::Old => {}
                Sector::New => self.ring.write_at(self.geo, at, sector),
                Sector::Garbage => {
                    let junk: Vec<u8> =
                        (0..sector.len()).map(|i| (i * 131 + s) as u8 | 1).collect();
                    self.ring.write_at(self.geo, at, &junk);
                }
            }
        }
    }

    /// End of the last appended entry's last record (logical position).
    pub fn entry_end(&self) -> u64 {
        self.batcher.entry_end()
    }

    /// How recovery reads this log.
    pub fn limits(&self, lookahead_bytes: u64) -> ScanLimits {
        ScanLimits {
            max_epoch: self.epoch,
            lookahead_bytes,
            key: SIM_KEY,
            keyed_from_epoch: 0,
            unkeyed_below_pos: 0,
            resumed_at_pos: Some(self.resumed_at_pos),
        }
    }

    /// Applies a write and tells the batcher it is done, without publishing it durable yet:
    /// the writer thread's moment between `write_done` and storing the durable LSN, when an
    /// appender can open a continuation with an older durable hint.
    pub fn landed(&mut self, w: &PendingWrite) {
        self.apply(w);
        self.batcher.write_done(w.start_pos + w.bytes.len() as u64);
    }

    /// Applies a write and reports it done, as its completion would.
    pub fn complete(&mut self, w: &PendingWrite) {
        self.landed(w);
        if let Some((lsn, _)) = w.last_complete {
            self.durable_lsn = lsn;
        }
    }

    /// Writes everything queued and marks it durable.
    pub fn flush(&mut self) {
        loop {
            let writes = self.take_writes();
            if writes.is_empty() {
                return;
            }
            for w in &writes {
                self.complete(w);
            }
        }
    }

    /// Marks writes up to `lsn` durable (the caller applied them).
    pub fn set_durable(&mut self, lsn: u64) {
        self.durable_lsn = lsn;
    }

    /// Releases entries through `lsn` (which must be durable): recovery starts later and
    /// the segments before may be recycled.
    pub fn release_through(&mut self, lsn: u64) {
        assert!(lsn <= self.durable_lsn, "release beyond durable");
        if let Some(c) = self.batcher.checkpoint_candidate(lsn) {
            if c.pos > self.start.pos {
                self.batcher.set_head(c.pos, c.lsn);
                self.start = ScanStart {
                    pos: c.pos,
                    lsn: c.lsn,
                    repl_id: c.prev_repl_id,
                    repl_offset: c.prev_repl_offset,
                    epoch: c.prev_epoch,
                };
            }
        }
    }

    pub fn scan(&self, lookahead_bytes: u64) -> ScanReport {
        let ring = MemRing {
            segments: self.ring.segments.clone(),
        };
        scan(ring, self.geo, self.start, self.limits(lookahead_bytes))
            .expect("memory reads do not fail")
    }

    /// Simulates a restart: recover, bump the epoch, continue writing after the end. On
    /// mid-log corruption it refuses, as `Journal::open` does, unless `accept_data_loss`:
    /// then it cuts the log and overwrites what a repair overwrites.
    pub fn reopen_with(
        &mut self,
        lookahead_bytes: u64,
        accept_data_loss: bool,
    ) -> Result<ScanReport, super::error::Corruption> {
        let r = self.scan(lookahead_bytes);
        if let super::recovery::Tail::Corrupt(c) = &r.tail {
            if !accept_data_loss {
                return Err(c.clone());
            }
            let (from, to) = r.repair_range(self.geo);
            self.ring.zero(self.geo, from, to);
        }
        self.epoch += 1;
        let starts = r
            .segments
            .iter()
            .filter_map(|s| s.first_entry_start)
            .collect();
        let resume = ScanStart {
            pos: r.end.end_pos,
            lsn: r.end.next_lsn,
            repl_id: r.end.last_repl_id,
            repl_offset: r.end.last_repl_offset,
            epoch: r.end.last_epoch,
        };
        let tail = super::batcher::read_tail(&mut self.ring, self.geo, r.end.end_pos)
            .expect("memory reads do not fail");
        self.batcher = Self::batcher(
            self.geo,
            self.max_write_bytes,
            self.epoch,
            resume,
            self.start.pos,
            starts,
            tail,
        );
        self.durable_lsn = r.end.last_lsn();
        self.resumed_at_pos = r.end.end_pos;
        Ok(r)
    }

    /// [`MemLog::reopen_with`], cutting any corruption.
    pub fn reopen(&mut self, lookahead_bytes: u64) -> ScanReport {
        self.reopen_with(lookahead_bytes, true)
            .expect("corruption is cut")
    }
}

/// A value a client could send to forge journal records: back-to-back copies of a
/// well-formed record (FLUSHALL as the entry at `lsn`, durable hint `u64::MAX`, so also a
/// claim that everything before it was acknowledged) for segment sequences `seg_seq` to
/// `seg_seq + 3` and epochs around `epoch`, sealed with a key the client cannot know or in
/// the unkeyed format 1, at every offset modulo 8.
pub fn forged_payload(len: usize, lsn: u64, seg_seq: u64, epoch: u32) -> Vec<u8> {
    use super::format::{encode_record, Kind, RecordHeader, HEADER_BYTES, UNKEYED_FORMAT_VERSION};
    let body = b"*1\r\n$8\r\nFLUSHALL\r\n";
    let mut out = vec![0u8; len];
    let mut at = 0;
    for i in 0usize.. {
        at += i % 8;
        if at + HEADER_BYTES + body.len() > len {
            break;
        }
        let h = RecordHeader {
            version: if i % 2 == 0 {
                super::format::FORMAT_VERSION
            } else {
                UNKEYED_FORMAT_VERSION
            },
            kind: Kind::Full,
            payload_len: body.len() as u32,
            epoch: epoch.saturating_sub(1) + (i % 3) as u32,
            seg_seq: seg_seq + (i % 4) as u64,
            lsn,
            repl_offset_end: 999_999_999,
            durable_hint: u64::MAX,
            repl_id: SIM_REPL_ID,
        };
        at += encode_record(RecordKey(!SIM_KEY.0), &h, body, &mut out[at..]);
    }
    out
}

/// The fuzz target's body (fuzz/fuzz_targets/recovery.rs), also run by a property test.
///
/// Builds a real log from the input (entry sizes, flush points; some entries are values
/// full of forged records, as a client may send), then damages it as the input says (byte
/// writes, zeroed ranges, junk records sealed with the journal's own key), and checks the
/// scanner's invariants: it never panics, and every entry it returns is one that was
/// appended, in order, with the same payload; when nothing was damaged, all durable
/// entries come back and nothing is reported as corruption.
pub fn fuzz_recovery(data: &[u8]) {
    let geo = Geometry {
        segment_size_bytes: 64 * 1024,
        segments: 3,
    };
    let mut log = MemLog::new(geo, 8192);
    let mut it = data.iter().copied();
    let mut next = move || it.next();
    let mut appended: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut off = 0u64;
    // Phase 1: appends. Each step: a size byte pair; 0xFF ends the phase.
    while let (Some(a), Some(b)) = (next(), next()) {
        if a == 0xFF {
            break;
        }
        let len = (usize::from(a) << 6 | usize::from(b)) % 20_000;
        let lsn_guess = appended.len() as u64 + 1;
        let payload: Vec<u8> = if b & 2 == 0 {
            (0..len).map(|i| (lsn_guess as usize ^ i) as u8).collect()
        } else {
            forged_payload(
                len,
                lsn_guess + u64::from(a % 3),
                u64::from(a % 8),
                log.epoch,
            )
        };
        off += len as u64;
        match log.append(off, &payload) {
            Some(lsn) => appended.push((lsn, payload)),
            None => break,
        }
        if b & 1 == 0 {
            log.flush();
        }
    }
    log.flush();
    let durable = log.durable_lsn;
    // Phase 2: damage. Each step: kind, position (3 bytes), value.
    let mut damaged = false;
    while let (Some(kind), Some(p0), Some(p1), Some(p2), Some(v)) =
        (next(), next(), next(), next(), next())
    {
        let pos = (u64::from(p0) << 16 | u64::from(p1) << 8 | u64::from(p2)) % geo.ring_bytes();
        damaged = true;
        match kind % 3 {
            0 => log.ring.write_at(geo, pos, &[v]),
            1 => {
                let n = (u64::from(v) * 16).min(geo.seg_end(pos) - pos) as usize;
                log.ring.write_at(geo, pos, &vec![0u8; n]);
            }
            _ => {
                // A record of a plausible shape, sealed with the journal's own key (a
                // leftover of walrus's own, not a client's: an entry's time and some bytes),
                // dropped at a block boundary.
                let at = pos / 4096 * 4096;
                let h = super::format::RecordHeader {
                    version: super::format::FORMAT_VERSION,
                    kind: super::format::Kind::Full,
                    payload_len: u32::from(v) + super::format::ENTRY_TIME_BYTES as u32,
                    epoch: u32::from(v % 3),
                    seg_seq: geo.seg_seq(at) + u64::from(v % 2),
                    lsn: u64::from(v) % (appended.len() as u64 + 3),
                    repl_offset_end: 0,
                    durable_hint: u64::from(v),
                    repl_id: SIM_REPL_ID,
                };
                let len = super::format::ENTRY_TIME_BYTES + usize::from(v);
                let mut rec = vec![0u8; super::format::HEADER_BYTES + len];
                let payload = vec![v; len];
                super::format::encode_record(SIM_KEY, &h, &payload, &mut rec);
                log.ring.write_at(geo, at, &rec);
            }
        }
    }
    let r = log.scan(2 * geo.segment_size_bytes);
    assert!(r.end.end_pos <= geo.write_limit(log.start.pos));
    if !damaged {
        assert!(matches!(r.tail, super::recovery::Tail::End { .. }));
        assert_eq!(r.end.last_lsn(), durable, "undamaged log lost entries");
    }
    if let super::recovery::Tail::Corrupt(c) = &r.tail {
        assert!(c.evidence_pos >= c.pos && c.evidence_durable_hint >= c.expected_lsn);
    }
    let ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    let sc = super::recovery::Scanner::new(ring, geo, log.start, log.limits(0));
    let mut n = 0u64;
    for e in super::reader::EntryIter::new(sc, super::reader::ReplayFrom::Lsn(0), u64::MAX) {
        let e = e.expect("memory reads do not fail");
        // Injected junk records are well-formed and CRC-valid; one with the right lap,
        // epoch and next LSN at the right place is indistinguishable from a real record
        // (the format cannot tell, by design). So with damage, replay must match what was
        // appended only up to the first forged entry.
        let Some((lsn, payload)) = appended.get(n as usize) else {
            assert!(
                damaged,
                "undamaged log replayed LSN {} that was never appended",
                e.lsn
            );
            return;
        };
        assert_eq!(e.lsn, *lsn);
        if e.payload[..] != payload[..] {
            assert!(
                damaged,
                "undamaged log replayed a wrong payload for LSN {lsn}"
            );
            return;
        }
        n += 1;
    }
    assert_eq!(
        n,
        r.end.last_lsn(),
        "replay and recovery disagree on the end"
    );
}
