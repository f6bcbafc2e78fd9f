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
//!
//! The files: [`place`] (entries encoded into the open buffer, in LSN order), [`seal`]
//! (buffers padded, queued and handed to the writer), [`tail_block`] (where the next write
//! resumes, and the block a continuation rewrites). The checkpoint candidates a batcher
//! keeps (each segment's first entry start) are here.

use std::collections::VecDeque;
use std::sync::Arc;

use super::buf::{BufPool, IoBuf};
use super::format::{align_up, entry_buffers_bound, RecordKey, BLOCK_BYTES, REPL_ID_BYTES};
use super::reader::ReplayEntry;
use super::recent::Recent;
use super::recovery::{EntryStart, LogEnd, ScanStart};
use super::ring::Geometry;

pub mod place;
pub mod seal;
pub mod tail_block;

pub use place::Placed;
pub use seal::SealedWrite;
pub use tail_block::{read_tail, resume_tail};

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
    /// The newest entries, for the archive (off unless it asks).
    recent: Recent,
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
            recent: Recent::default(),
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

    /// Where the log ends now, as a scan that reached it would say.
    pub fn log_end(&self) -> LogEnd {
        LogEnd {
            end_pos: self.entry_end,
            next_lsn: self.next_lsn,
            last_repl_id: self.last_repl_id,
            last_repl_offset: self.last_repl_offset,
            last_epoch: self.last_epoch,
        }
    }

    /// Keeps the entry appended last, whose stream bytes are `payload`, among the recent
    /// ones ([`Recent`]) when they are kept: nothing is built or shared otherwise.
    pub fn keep_recent(&mut self, payload: &bytes::Bytes) {
        if !self.recent.is_on() {
            return;
        }
        let end = self.log_end();
        let entry = ReplayEntry {
            lsn: end.last_lsn(),
            repl_id: end.last_repl_id,
            repl_offset_end: end.last_repl_offset,
            payload: payload.clone(),
            // As a replay reads it back: the time stamped, or none for a time of 0.
            time_ms: (self.last_time_ms > 0).then_some(self.last_time_ms),
        };
        self.recent.push(entry, ScanStart::after(&end));
    }

    pub fn recent(&self) -> &Recent {
        &self.recent
    }

    pub fn recent_mut(&mut self) -> &mut Recent {
        &mut self.recent
    }

    /// Moves the retained head forward to the entry `head_lsn` begins at `head_pos`;
    /// segments before it may be overwritten.
    pub fn set_head(&mut self, head_pos: u64, head_lsn: u64) {
        assert!(head_pos >= self.head_pos, "the head never moves backwards");
        self.head_pos = head_pos;
        self.recent.release_before(head_lsn);
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
