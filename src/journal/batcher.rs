//! Group commit: places entries into aligned write buffers at logical log positions.
//!
//! Appenders encode entries (header + payload copy + CRC) directly into the open buffer,
//! under one mutex, in LSN order. The writer thread takes the open buffer whenever a write
//! slot is free: everything appended while the previous writes were in flight goes out in
//! one write (group commit). A taken buffer is zero-padded to a block boundary, as O_DIRECT
//! needs whole blocks. When that write has completed by the time the next buffer opens, the
//! next write does not skip the padding: it starts at the same, partly filled block and
//! rewrites that block's existing bytes unchanged before its own records (PostgreSQL and
//! etcd do the same), so a small entry costs its own bytes of ring, not a block. Two writes
//! over the same block are never in flight together (either could land last), so a buffer
//! opened while the write before it is still in flight starts at the next block boundary
//! instead and goes out beside it ([`Batcher::open_pos`]), as does a buffer following one
//! sealed because it is full. docs/journal.md gives the torn-write argument.
//!
//! No allocation happens per entry: buffers come from a pool; only entries larger than a
//! buffer may use extra one-off buffers, bounded by `max_entry_bytes` of outstanding extra
//! memory.

use std::collections::VecDeque;
use std::sync::Arc;

use super::buf::{BufPool, IoBuf};
use super::error::JournalError;
use super::format::{
    align_down, align_up, entry_buffers_bound, record_fits_at, seal_crc, Kind, RecordHeader,
    RecordKey, BLOCK_BYTES, ENTRY_TIME_BYTES, FORMAT_VERSION, HEADER_BYTES, REPL_ID_BYTES,
};
use super::recovery::EntryStart;
use super::ring::{Geometry, RingRead};

/// A buffer ready to be written: whole blocks, inside one segment.
#[derive(Debug)]
pub struct SealedWrite {
    pub seg_index: u32,
    pub seg_off: u64,
    pub buf: IoBuf,
    /// Logical position just past the padded write.
    pub end_pos: u64,
    /// Bytes at its start rewritten unchanged from the previous write's last block.
    pub rewritten: usize,
    /// (LSN, repl offset) of the last entry completed by this write, if any.
    pub last_complete: Option<(u64, u64)>,
}

impl SealedWrite {
    /// Logical position of the write's first byte (block-aligned).
    pub fn start_pos(&self) -> u64 {
        self.end_pos - self.buf.len() as u64
    }
}

struct OpenBuf {
    buf: IoBuf,
    /// Block-aligned; a continuation's first bytes (up to the batcher's `pos` when it was
    /// opened) are the rewritten tail of the previous write.
    start_pos: u64,
    /// Usable bytes: the buffer capacity, or less at a segment end.
    limit_bytes: usize,
    /// Bytes rewritten from the previous write's last block (0: a fresh block).
    rewritten: usize,
    last_complete: Option<(u64, u64)>,
}

impl OpenBuf {
    fn room(&self) -> usize {
        self.limit_bytes - self.buf.len()
    }
}

/// Whether the next record goes right after a log ending at `end` (mid-block: the next
/// write rewrites that block's bytes before `end`, returned as (block start, length)), or
/// at the next block boundary (None). It continues whenever a record fits there, the one
/// placement rule recovery also uses, so that no run, whatever its buffer size, leaves a
/// record at `end` that a later run would skip: after a crash, a stale fragment there
/// could otherwise be taken for the continuation of the log.
pub fn resume_tail(geo: Geometry, end: u64) -> Option<(u64, usize)> {
    let start = align_down(end);
    (start != end && record_fits_at(geo.seg_off(end), geo.segment_size_bytes))
        .then_some((start, (end - start) as usize))
}

/// The bytes a writer resuming at `end` rewrites (see [`resume_tail`]), read back from the
/// ring: empty when it resumes at the next block boundary.
pub fn read_tail(ring: &mut impl RingRead, geo: Geometry, end: u64) -> std::io::Result<Vec<u8>> {
    let Some((start, len)) = resume_tail(geo, end) else {
        return Ok(Vec::new());
    };
    let mut tail = vec![0; len];
    ring.read_exact_at(geo.seg_index(start), geo.seg_off(start), &mut tail)?;
    Ok(tail)
}

/// Raises the durable hint of a continuation's first new record (at `rewritten`) to the
/// durable LSN at its submission, and reseals it. A continuation rewrites the block holding
/// the previous write's last records, which are durable by the time it is submitted (it
/// waits for that write); its own records were encoded earlier, with an older hint. With
/// the fresh hint, a device that garbles those rewritten sectors (outside the torn-write
/// model: a sector is old or new) leaves evidence that acknowledged entries were damaged,
/// and recovery refuses to start instead of cutting them silently, as long as the new
/// record itself reached the disk.
fn vouch_for_rewritten(key: RecordKey, buf: &mut IoBuf, rewritten: usize, durable_lsn: u64) {
    let len = buf.len();
    if rewritten == 0 || len < rewritten + HEADER_BYTES {
        return;
    }
    let rec = &mut buf.as_full_mut()[rewritten..len];
    // A buffer is opened for a record, so one follows the rewritten bytes.
    let Ok(h) = RecordHeader::parse(rec) else {
        return;
    };
    if h.durable_hint >= durable_lsn {
        return;
    }
    RecordHeader {
        durable_hint: durable_lsn,
        ..h
    }
    .write_fields(rec);
    let (hdr, payload) = rec.split_at_mut(HEADER_BYTES);
    seal_crc(key, hdr, &payload[..h.payload_len as usize]);
}

/// An entry as stored: its time, then its payload, one byte run cut into records.
struct Stored<'a> {
    time: [u8; ENTRY_TIME_BYTES],
    payload: &'a [u8],
}

impl Stored<'_> {
    fn len(&self) -> usize {
        ENTRY_TIME_BYTES + self.payload.len()
    }

    /// Fills `out` with the stored bytes from `from` on.
    fn copy_to(&self, from: usize, out: &mut [u8]) {
        let to = from + out.len();
        let time = &self.time[from.min(ENTRY_TIME_BYTES)..to.min(ENTRY_TIME_BYTES)];
        let (head, tail) = out.split_at_mut(time.len());
        head.copy_from_slice(time);
        tail.copy_from_slice(
            &self.payload
                [from.saturating_sub(ENTRY_TIME_BYTES)..to.saturating_sub(ENTRY_TIME_BYTES)],
        );
    }
}

/// Where the caller's entry landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub lsn: u64,
}

pub struct Batcher {
    geo: Geometry,
    epoch: u32,
    key: RecordKey,
    next_lsn: u64,
    /// End of the last entry's last record: where entry `next_lsn` begins, as recovery sees
    /// it (the next record goes there or at the next block boundary).
    entry_end: u64,
    /// Logical position of the next record. When no buffer is open and it is not
    /// block-aligned, the next buffer continues the open tail block held in `tail`.
    pos: u64,
    /// The bytes of `pos`'s block before `pos`, as last written: a continuation rewrites
    /// them unchanged (never re-encoded, so a torn rewrite cannot damage them).
    tail: Box<[u8; BLOCK_BYTES]>,
    /// End of the newest write handed out and not yet completed (0: none). A write whose
    /// first block lies below it must wait for it.
    unfinished_end: u64,
    cur: Option<OpenBuf>,
    sealed: VecDeque<SealedWrite>,
    pool: BufPool,
    extra_buffers_out: usize,
    max_extra_buffers: usize,
    max_entry_bytes: u64,
    /// Start of the retained log (checkpoint); bounds how far the ring may be written.
    head_pos: u64,
    last_repl_id: [u8; REPL_ID_BYTES],
    /// From this LSN to the last appended one, every entry has `last_repl_id` (known without
    /// reading the ring: a checkpoint asks for the id of the last durable entry).
    last_repl_id_from: u64,
    last_repl_offset: u64,
    /// Epoch of the last complete entry (this run's once it appended one).
    last_epoch: u32,
    /// The time stamped on the last entry this run appended: no later entry of the run gets
    /// an earlier one, whatever the wall clock does.
    last_time_ms: u64,
    failed: Option<Arc<str>>,
    closed: bool,
    /// First entry start in each segment sequence still retained: checkpoint candidates.
    starts: VecDeque<EntryStart>,
}

/// Initial state, from recovery.
pub struct BatcherInit {
    pub geo: Geometry,
    pub epoch: u32,
    pub key: RecordKey,
    pub next_lsn: u64,
    /// End of the recovered log; writing resumes there (see [`resume_tail`]).
    pub end_pos: u64,
    /// The bytes of `end_pos`'s block before `end_pos`, as read back from the segment,
    /// when [`resume_tail`] says writing continues inside that block.
    pub tail: Vec<u8>,
    pub head_pos: u64,
    pub last_repl_id: [u8; REPL_ID_BYTES],
    pub last_repl_offset: u64,
    /// Epoch of the last entry of the recovered log.
    pub last_epoch: u32,
    pub starts: Vec<EntryStart>,
    pub write_buffers: usize,
    pub max_write_bytes: usize,
    pub max_entry_bytes: u64,
}

impl Batcher {
    pub fn new(init: BatcherInit) -> Batcher {
        // Enough for the largest entry with no pooled buffer free, so that an entry the
        // configuration allows is never refused for want of buffers when none is in use.
        let max_extra_buffers = entry_buffers_bound(
            init.max_entry_bytes,
            init.max_write_bytes as u64,
            init.geo.segment_size_bytes,
        ) as usize;
        let mut starts = VecDeque::with_capacity(init.geo.segments as usize + 2);
        starts.extend(init.starts);
        let resume = resume_tail(init.geo, init.end_pos);
        let mut tail = Box::new([0; BLOCK_BYTES]);
        let tail_len = resume.map_or(0, |(_, n)| n);
        assert_eq!(init.tail.len(), tail_len, "recovered tail block length");
        tail[..tail_len].copy_from_slice(&init.tail);
        Batcher {
            geo: init.geo,
            epoch: init.epoch,
            key: init.key,
            next_lsn: init.next_lsn,
            entry_end: init.end_pos,
            pos: if resume.is_some() {
                init.end_pos
            } else {
                align_up(init.end_pos)
            },
            tail,
            unfinished_end: 0,
            cur: None,
            sealed: VecDeque::with_capacity(init.write_buffers + max_extra_buffers),
            pool: BufPool::new(init.write_buffers, init.max_write_bytes),
            extra_buffers_out: 0,
            max_extra_buffers,
            max_entry_bytes: init.max_entry_bytes,
            head_pos: init.head_pos,
            last_repl_id: init.last_repl_id,
            // Which recovered entries share it is in the ring only.
            last_repl_id_from: init.next_lsn,
            last_repl_offset: init.last_repl_offset,
            last_epoch: init.last_epoch,
            last_time_ms: 0,
            failed: None,
            closed: false,
            starts,
        }
    }

    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    pub fn head_pos(&self) -> u64 {
        self.head_pos
    }

    pub fn write_pos(&self) -> u64 {
        self.pos
    }

    /// End of the last entry's last record.
    pub fn entry_end(&self) -> u64 {
        self.entry_end
    }

    pub fn failed(&self) -> Option<Arc<str>> {
        self.failed.clone()
    }

    pub fn set_failed(&mut self, why: Arc<str>) {
        if self.failed.is_none() {
            self.failed = Some(why);
        }
    }

    pub fn close(&mut self) {
        self.closed = true;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Room for records in a buffer opened for position `p`: the buffer starts at `p`'s
    /// block, and ends at its capacity or the segment's end.
    fn fresh_room(&self, p: u64) -> usize {
        let start = align_down(p);
        let from_start = (self.pool.buffer_bytes() as u64).min(self.geo.seg_end(p) - start);
        (from_start - (p - start)) as usize
    }

    /// Where the next buffer opens: at `pos`, continuing its block, unless that block is in
    /// the write handed out last and not yet completed. A continuation would wait for that
    /// write (two writes over one block are never in flight together), so every write would
    /// wait out the one before it, one device latency each: on a network disk (1-5 ms a
    /// sync), a durable reply would take two. The buffer then opens at the next block
    /// boundary and goes out beside it; the bytes skipped are that write's zero padding,
    /// and recovery looks for the next record there too. When the journal keeps up (one
    /// client: its write completes before its next entry), the block is continued and
    /// small entries cost no padding.
    fn open_pos(&self) -> u64 {
        let block = align_down(self.pos);
        if block != self.pos && block < self.unfinished_end {
            align_up(self.pos)
        } else {
            self.pos
        }
    }

    /// Walks the placement of an entry of `len` stored bytes (its time and its payload)
    /// without writing. Returns (buffers to open, logical end position).
    fn plan(&self, len: usize) -> (usize, u64) {
        let mut p = if self.cur.is_some() {
            self.pos
        } else {
            self.open_pos()
        };
        let mut room = self.cur.as_ref().map_or(0, |c| c.room());
        let mut have_buf = self.cur.is_some();
        let mut new_bufs = 0;
        let mut left = len;
        let whole = HEADER_BYTES + len;
        // Prefer a fresh buffer over fragmenting an entry that fits in one.
        if room < whole && whole <= self.pool.buffer_bytes() && have_buf {
            p = align_up(p);
            have_buf = false;
            room = 0;
        }
        loop {
            if room <= HEADER_BYTES {
                // A full buffer is followed at the next block; with none open, `pos` may
                // continue the tail block (`seal_current` left room there).
                if have_buf {
                    p = align_up(p);
                }
                room = self.fresh_room(p);
                debug_assert!(room > HEADER_BYTES);
                have_buf = true;
                new_bufs += 1;
                debug_assert!(record_fits_at(
                    self.geo.seg_off(p),
                    self.geo.segment_size_bytes
                ));
            }
            let frag = left.min(room - HEADER_BYTES);
            p += (HEADER_BYTES + frag) as u64;
            room -= HEADER_BYTES + frag;
            left -= frag;
            if left == 0 {
                return (new_bufs, p);
            }
        }
    }

    /// Encodes one entry, stamped with `time_ms` (raised to the run's last stamp if the clock
    /// went back), into the write buffers. Non-blocking: errors are RingFull, Busy,
    /// EntryTooLarge, Failed or Closed, and leave no trace.
    pub fn append(
        &mut self,
        repl_id: &[u8; REPL_ID_BYTES],
        repl_offset_end: u64,
        payload: &[u8],
        durable_hint: u64,
        time_ms: u64,
    ) -> Result<Placed, JournalError> {
        if let Some(why) = &self.failed {
            return Err(JournalError::Failed(why.clone()));
        }
        if self.closed {
            return Err(JournalError::Closed);
        }
        if payload.len() as u64 > self.max_entry_bytes {
            return Err(JournalError::EntryTooLarge {
                len_bytes: payload.len() as u64,
                max_entry_bytes: self.max_entry_bytes,
            });
        }
        let stored_len = ENTRY_TIME_BYTES + payload.len();
        let (new_bufs, end) = self.plan(stored_len);
        let limit = self.geo.write_limit(self.head_pos);
        if end > limit {
            return Err(JournalError::RingFull {
                needed_seg_seq: self.geo.seg_seq(end - 1),
                head_seg_seq: self.geo.seg_seq(self.head_pos),
            });
        }
        let free = self.pool.free_count();
        if new_bufs > free {
            let extra = new_bufs - free;
            let large = stored_len > self.pool.buffer_bytes();
            if !large || self.extra_buffers_out + extra > self.max_extra_buffers {
                return Err(JournalError::Busy);
            }
        }
        let lsn = self.next_lsn;
        let time_ms = time_ms.max(self.last_time_ms);
        let stored = Stored {
            time: time_ms.to_le_bytes(),
            payload,
        };
        self.place(lsn, repl_id, repl_offset_end, &stored, durable_hint);
        assert_eq!(self.pos, end, "placement disagrees with plan");
        self.last_time_ms = time_ms;
        self.entry_end = end;
        self.next_lsn += 1;
        if *repl_id != self.last_repl_id {
            self.last_repl_id_from = lsn;
        }
        self.last_repl_id = *repl_id;
        self.last_repl_offset = repl_offset_end;
        self.last_epoch = self.epoch;
        Ok(Placed { lsn })
    }

    fn open_buffer(&mut self) {
        debug_assert!(self.cur.is_none());
        let mut buf = match self.pool.take() {
            Some(b) => b,
            None => {
                self.extra_buffers_out += 1;
                IoBuf::new(self.pool.buffer_bytes())
            }
        };
        self.pos = self.open_pos();
        // A continuation starts with the open tail block's bytes, as they were written.
        let start_pos = align_down(self.pos);
        let rewritten = (self.pos - start_pos) as usize;
        buf.as_full_mut()[..rewritten].copy_from_slice(&self.tail[..rewritten]);
        buf.set_len(rewritten);
        let limit_bytes = rewritten + self.fresh_room(self.pos);
        self.cur = Some(OpenBuf {
            buf,
            start_pos,
            limit_bytes,
            rewritten,
            last_complete: None,
        });
    }

    fn place(
        &mut self,
        lsn: u64,
        repl_id: &[u8; REPL_ID_BYTES],
        repl_offset_end: u64,
        stored: &Stored,
        hint: u64,
    ) {
        let whole = HEADER_BYTES + stored.len();
        if let Some(c) = &self.cur {
            if c.room() < whole && whole <= self.pool.buffer_bytes() {
                self.seal_current(false);
            }
        }
        let mut off = 0usize;
        let mut first = true;
        loop {
            if self.cur.as_ref().is_none_or(|c| c.room() <= HEADER_BYTES) {
                self.seal_current(false);
                self.open_buffer();
            }
            let cur = self.cur.as_mut().expect("opened above");
            let frag = (stored.len() - off).min(cur.room() - HEADER_BYTES);
            let last = off + frag == stored.len();
            let kind = match (first, last) {
                (true, true) => Kind::Full,
                (true, false) => Kind::First,
                (false, true) => Kind::Last,
                (false, false) => Kind::Middle,
            };
            let rec_pos = self.pos;
            if first {
                let seq = self.geo.seg_seq(rec_pos);
                if self.starts.back().map(|s| self.geo.seg_seq(s.pos)) != Some(seq) {
                    if self.starts.len() == self.starts.capacity() {
                        self.starts.pop_front(); // oldest can no longer be retained anyway
                    }
                    self.starts.push_back(EntryStart {
                        pos: rec_pos,
                        lsn,
                        prev_repl_id: self.last_repl_id,
                        prev_repl_offset: self.last_repl_offset,
                        prev_epoch: self.last_epoch,
                    });
                }
            }
            let h = RecordHeader {
                version: FORMAT_VERSION,
                kind,
                payload_len: frag as u32,
                epoch: self.epoch,
                seg_seq: self.geo.seg_seq(rec_pos),
                lsn,
                repl_offset_end,
                durable_hint: hint,
                repl_id: *repl_id,
            };
            let at = cur.buf.len();
            let full = cur.buf.as_full_mut();
            let (hdr, rest) = full[at..at + HEADER_BYTES + frag].split_at_mut(HEADER_BYTES);
            h.write_fields(hdr);
            stored.copy_to(off, rest);
            seal_crc(self.key, hdr, rest);
            cur.buf.set_len(at + HEADER_BYTES + frag);
            if last {
                cur.last_complete = Some((lsn, repl_offset_end));
            }
            self.pos += (HEADER_BYTES + frag) as u64;
            debug_assert_eq!(self.pos, cur.start_pos + cur.buf.len() as u64);
            off += frag;
            first = false;
            if last {
                return;
            }
        }
    }

    /// Pads the open buffer and queues it for writing. With `continue_tail` (a group-commit
    /// write, not a full buffer) the next record still goes right after this one's last
    /// record, in the same block, when there is room for it there; otherwise at the next
    /// block boundary.
    fn seal_current(&mut self, continue_tail: bool) {
        let Some(mut c) = self.cur.take() else { return };
        if c.buf.is_empty() {
            self.pool.give_back(c.buf);
            return;
        }
        let continues = resume_tail(self.geo, self.pos).filter(|_| continue_tail);
        if let Some((tail_start, tail_len)) = continues {
            let from = (tail_start - c.start_pos) as usize;
            self.tail[..tail_len].copy_from_slice(&c.buf.as_slice()[from..from + tail_len]);
        }
        c.buf.pad_to_block();
        let end_pos = c.start_pos + c.buf.len() as u64;
        assert_eq!(
            end_pos,
            align_up(self.pos),
            "padded buffer end must be the next block boundary"
        );
        assert!(
            self.geo.seg_seq(c.start_pos) == self.geo.seg_seq(end_pos - 1),
            "a write must never cross a segment"
        );
        if continues.is_none() {
            self.pos = end_pos;
        }
        self.sealed.push_back(SealedWrite {
            seg_index: self.geo.seg_index(c.start_pos),
            seg_off: self.geo.seg_off(c.start_pos),
            buf: c.buf,
            end_pos,
            rewritten: c.rewritten,
            last_complete: c.last_complete,
        });
    }

    /// Next write for the I/O thread: a queued buffer, or else the open one (group commit).
    /// None also while the next write's first block is still being written by the previous
    /// write: the open buffer then keeps gathering entries until `write_done`.
    /// `durable_lsn` is the durable LSN now: a continuation vouches for it (see
    /// [`vouch_for_rewritten`]).
    pub fn take_write(&mut self, durable_lsn: u64) -> Option<SealedWrite> {
        if self.sealed.is_empty() {
            let cur = self.cur.as_mut()?;
            if cur.start_pos < self.unfinished_end {
                return None;
            }
            // Before `seal_current` copies the new tail: the next continuation must rewrite
            // the bytes exactly as this write puts them on disk.
            vouch_for_rewritten(self.key, &mut cur.buf, cur.rewritten, durable_lsn);
            self.seal_current(true);
        } else {
            let front = self.sealed.front_mut()?;
            if front.start_pos() < self.unfinished_end {
                return None;
            }
            // Sealed because full: no tail was copied from it, the next write starts at the
            // next block.
            let rewritten = front.rewritten;
            vouch_for_rewritten(self.key, &mut front.buf, rewritten, durable_lsn);
        }
        let w = self.sealed.pop_front()?;
        self.unfinished_end = w.end_pos;
        Some(w)
    }

    /// The write ending at `end_pos` completed.
    pub fn write_done(&mut self, end_pos: u64) {
        if end_pos == self.unfinished_end {
            self.unfinished_end = 0;
        }
    }

    /// True when nothing waits to be written.
    pub fn is_idle(&self) -> bool {
        self.sealed.is_empty() && self.cur.as_ref().is_none_or(|c| c.buf.is_empty())
    }

    /// A completed write returns its buffer.
    pub fn give_back(&mut self, buf: IoBuf) {
        if self.pool.free_count() < self.pool.total() && buf.capacity() == self.pool.buffer_bytes()
        {
            self.pool.give_back(buf);
        } else {
            debug_assert!(
                self.extra_buffers_out > 0,
                "more buffers returned than handed out"
            );
            self.extra_buffers_out = self.extra_buffers_out.saturating_sub(1);
        }
    }

    /// The newest checkpoint start at or before `lsn + 1`, i.e. where recovery can start
    /// once entries up to `lsn` are released: the end of the log when that is everything
    /// appended (an entry spanning several segments leaves them without a start of their
    /// own, and the head must still get past it), else the first entry start of a segment.
    pub fn checkpoint_candidate(&self, lsn: u64) -> Option<EntryStart> {
        if lsn + 1 == self.next_lsn {
            return Some(EntryStart {
                pos: self.entry_end,
                lsn: self.next_lsn,
                prev_repl_id: self.last_repl_id,
                prev_repl_offset: self.last_repl_offset,
                prev_epoch: self.last_epoch,
            });
        }
        self.starts.iter().rev().find(|s| s.lsn <= lsn + 1).copied()
    }

    /// The replication id of appended entry `lsn`, when it is known without reading the
    /// ring: that of the last entry, for every entry since the history last changed.
    pub fn repl_id_of(&self, lsn: u64) -> Option<[u8; REPL_ID_BYTES]> {
        (self.last_repl_id_from..self.next_lsn)
            .contains(&lsn)
            .then_some(self.last_repl_id)
    }

    /// Moves the retained head forward; segments before it may be overwritten.
    pub fn set_head(&mut self, head_pos: u64) {
        assert!(head_pos >= self.head_pos, "the head never moves backwards");
        self.head_pos = head_pos;
        let head_seq = self.geo.seg_seq(head_pos);
        while self
            .starts
            .front()
            .is_some_and(|s| self.geo.seg_seq(s.pos) < head_seq)
        {
            self.starts.pop_front();
        }
    }
}
