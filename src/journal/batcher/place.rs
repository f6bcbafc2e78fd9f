//! Grouping: entries encoded into the open write buffer at their logical positions, in LSN
//! order, fragmented across buffers when they do not fit.

use super::super::buf::IoBuf;
use super::super::error::JournalError;
use super::super::format::{
    align_down, align_up, record_fits_at, seal_crc, Kind, RecordHeader, ENTRY_TIME_BYTES,
    FORMAT_VERSION, HEADER_BYTES, REPL_ID_BYTES,
};
use super::super::recovery::EntryStart;
use super::{Batcher, OpenBuf};

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

impl Batcher {
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
}
