//! Group commit: places entries into aligned write buffers at logical log positions.
//!
//! Appenders encode entries (header + payload copy + CRC) directly into the open buffer,
//! under one mutex, in LSN order. The writer thread takes the open buffer whenever a write
//! slot is free: everything appended while the previous writes were in flight goes out in
//! one write (group commit). A taken buffer is zero-padded to a block boundary; the next
//! buffer starts at that boundary. No allocation happens per entry: buffers come from a
//! pool; only entries larger than a buffer may use extra one-off buffers, bounded by
//! `max_entry_bytes` of outstanding extra memory.

use std::collections::VecDeque;
use std::sync::Arc;

use super::buf::{BufPool, IoBuf};
use super::error::JournalError;
use super::format::{
    align_up, record_fits_at, seal_crc, Kind, RecordHeader, HEADER_BYTES, REPL_ID_BYTES,
};
use super::recovery::EntryStart;
use super::ring::Geometry;

/// A buffer ready to be written: whole blocks, inside one segment.
#[derive(Debug)]
pub struct SealedWrite {
    pub seg_index: u32,
    pub seg_off: u64,
    pub buf: IoBuf,
    /// Logical position just past the padded write.
    pub end_pos: u64,
    /// (LSN, repl offset) of the last entry completed by this write, if any.
    pub last_complete: Option<(u64, u64)>,
}

struct OpenBuf {
    buf: IoBuf,
    start_pos: u64,
    /// Usable bytes: the buffer capacity, or less at a segment end.
    limit_bytes: usize,
    last_complete: Option<(u64, u64)>,
}

impl OpenBuf {
    fn room(&self) -> usize {
        self.limit_bytes - self.buf.len()
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
    next_lsn: u64,
    /// Logical position of the next record. When no buffer is open it is block-aligned.
    pos: u64,
    cur: Option<OpenBuf>,
    sealed: VecDeque<SealedWrite>,
    pool: BufPool,
    extra_buffers_out: usize,
    max_extra_buffers: usize,
    max_entry_bytes: u64,
    /// Start of the retained log (checkpoint); bounds how far the ring may be written.
    head_pos: u64,
    last_repl_id: [u8; REPL_ID_BYTES],
    last_repl_offset: u64,
    failed: Option<Arc<str>>,
    closed: bool,
    /// First entry start in each segment sequence still retained: checkpoint candidates.
    starts: VecDeque<EntryStart>,
}

/// Initial state, from recovery.
pub struct BatcherInit {
    pub geo: Geometry,
    pub epoch: u32,
    pub next_lsn: u64,
    /// End of the recovered log; writing resumes at the next block boundary.
    pub end_pos: u64,
    pub head_pos: u64,
    pub last_repl_id: [u8; REPL_ID_BYTES],
    pub last_repl_offset: u64,
    pub starts: Vec<EntryStart>,
    pub write_buffers: usize,
    pub max_write_bytes: usize,
    pub max_entry_bytes: u64,
}

impl Batcher {
    pub fn new(init: BatcherInit) -> Batcher {
        let max_extra_buffers = (init.max_entry_bytes as usize).div_ceil(init.max_write_bytes) + 1;
        let mut starts = VecDeque::with_capacity(init.geo.segments as usize + 2);
        starts.extend(init.starts);
        Batcher {
            geo: init.geo,
            epoch: init.epoch,
            next_lsn: init.next_lsn,
            pos: align_up(init.end_pos),
            cur: None,
            sealed: VecDeque::with_capacity(init.write_buffers + max_extra_buffers),
            pool: BufPool::new(init.write_buffers, init.max_write_bytes),
            extra_buffers_out: 0,
            max_extra_buffers,
            max_entry_bytes: init.max_entry_bytes,
            head_pos: init.head_pos,
            last_repl_id: init.last_repl_id,
            last_repl_offset: init.last_repl_offset,
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

    /// Room a fresh buffer opened at aligned `p` would have.
    fn fresh_room(&self, p: u64) -> usize {
        let seg_left = self.geo.seg_end(p) - p;
        (self.pool.buffer_bytes() as u64).min(seg_left) as usize
    }

    /// Walks the placement of a `len`-byte entry without writing. Returns (buffers to open,
    /// logical end position).
    fn plan(&self, len: usize) -> (usize, u64) {
        let mut p = self.pos;
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
                if have_buf {
                    p = align_up(p);
                }
                debug_assert_eq!(p % super::format::BLOCK_BYTES as u64, 0);
                room = self.fresh_room(p);
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

    /// Encodes one entry into the write buffers. Non-blocking: errors are RingFull, Busy,
    /// EntryTooLarge, Failed or Closed, and leave no trace.
    pub fn append(
        &mut self,
        repl_id: &[u8; REPL_ID_BYTES],
        repl_offset_end: u64,
        payload: &[u8],
        durable_hint: u64,
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
        let (new_bufs, end) = self.plan(payload.len());
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
            let large = payload.len() > self.pool.buffer_bytes();
            if !large || self.extra_buffers_out + extra > self.max_extra_buffers {
                return Err(JournalError::Busy);
            }
        }
        let lsn = self.next_lsn;
        self.place(lsn, repl_id, repl_offset_end, payload, durable_hint);
        assert_eq!(self.pos, end, "placement disagrees with plan");
        self.next_lsn += 1;
        self.last_repl_id = *repl_id;
        self.last_repl_offset = repl_offset_end;
        Ok(Placed { lsn })
    }

    fn open_buffer(&mut self) {
        debug_assert!(self.cur.is_none());
        let buf = match self.pool.take() {
            Some(b) => b,
            None => {
                self.extra_buffers_out += 1;
                IoBuf::new(self.pool.buffer_bytes())
            }
        };
        let limit_bytes = self.fresh_room(self.pos);
        self.cur = Some(OpenBuf {
            buf,
            start_pos: self.pos,
            limit_bytes,
            last_complete: None,
        });
    }

    fn place(
        &mut self,
        lsn: u64,
        repl_id: &[u8; REPL_ID_BYTES],
        repl_offset_end: u64,
        payload: &[u8],
        hint: u64,
    ) {
        let whole = HEADER_BYTES + payload.len();
        if let Some(c) = &self.cur {
            if c.room() < whole && whole <= self.pool.buffer_bytes() {
                self.seal_current();
            }
        }
        let mut off = 0usize;
        let mut first = true;
        loop {
            if self.cur.as_ref().is_none_or(|c| c.room() <= HEADER_BYTES) {
                self.seal_current();
                self.open_buffer();
            }
            let cur = self.cur.as_mut().expect("opened above");
            let frag = (payload.len() - off).min(cur.room() - HEADER_BYTES);
            let last = off + frag == payload.len();
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
                    });
                }
            }
            let h = RecordHeader {
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
            rest.copy_from_slice(&payload[off..off + frag]);
            seal_crc(hdr, rest);
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

    /// Pads the open buffer and queues it for writing.
    fn seal_current(&mut self) {
        let Some(mut c) = self.cur.take() else { return };
        if c.buf.is_empty() {
            self.pool.give_back(c.buf);
            return;
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
        self.pos = end_pos;
        self.sealed.push_back(SealedWrite {
            seg_index: self.geo.seg_index(c.start_pos),
            seg_off: self.geo.seg_off(c.start_pos),
            buf: c.buf,
            end_pos,
            last_complete: c.last_complete,
        });
    }

    /// Next write for the I/O thread: a queued buffer, or else the open one (group commit).
    pub fn take_write(&mut self) -> Option<SealedWrite> {
        if self.sealed.is_empty() {
            self.seal_current();
        }
        self.sealed.pop_front()
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
    /// once entries up to `lsn` are released.
    pub fn checkpoint_candidate(&self, lsn: u64) -> Option<EntryStart> {
        self.starts.iter().rev().find(|s| s.lsn <= lsn + 1).copied()
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

    pub fn last_repl(&self) -> ([u8; REPL_ID_BYTES], u64) {
        (self.last_repl_id, self.last_repl_offset)
    }

    pub fn free_buffers(&self) -> usize {
        self.pool.free_count()
    }
}
