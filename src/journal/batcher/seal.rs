//! Sealing: the open buffer padded to whole blocks and queued, and the queued writes handed
//! to the writer thread one at a time over any block, and their buffers taken back.

use super::super::buf::IoBuf;
use super::super::format::align_up;
use super::tail_block::{resume_tail, vouch_for_rewritten};
use super::Batcher;

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

impl Batcher {
    /// Pads the open buffer and queues it for writing. With `continue_tail` (a group-commit
    /// write, not a full buffer) the next record still goes right after this one's last
    /// record, in the same block, when there is room for it there; otherwise at the next
    /// block boundary.
    pub(super) fn seal_current(&mut self, continue_tail: bool) {
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
}
