//! The volatile cache: what was written but is not durable yet, per file, in write order.
//!
//! This plays the part of a page cache and a disk's write cache at once. Reads see it (a
//! read is the backing file with the pending writes laid over it, oldest first), and only a
//! sync moves it to the backing file, which stands for the disk. A crash throws it away.
//!
//! Every write gets a sequence number from one counter shared by all files, so that "the
//! last write" (for a torn crash) and "the writes before this fsync" (for an fsync's
//! barrier) mean the same thing across files. When a write becomes durable ahead of older
//! pending writes it overlaps (an O_DSYNC write), the overlapped bytes of the older ones are
//! cut away: they are superseded, and laying them over the backing file afterwards would
//! show stale bytes. A write can so end up as several fragments sharing its number.

use std::collections::HashMap;

/// A pending write, or what is left of one after newer durable writes cut into it.
#[derive(Clone, Debug)]
pub struct Frag {
    pub seq: u64,
    pub offset: u64,
    pub data: Vec<u8>,
    /// A failed sync (`fail sync ... lose`) covered it: readers still see it, but no sync
    /// writes it and a crash drops it, as Linux treats dirty pages after a writeback error
    /// (marked clean: kept in the page cache, never written).
    pub lost: bool,
}

impl Frag {
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }

    /// The parts of this fragment outside `[start, end)` (none, one or two).
    fn without(self, start: u64, end: u64) -> Vec<Frag> {
        if end <= self.offset || start >= self.end() {
            return vec![self];
        }
        let mut out = Vec::new();
        if start > self.offset {
            let n = (start - self.offset) as usize;
            out.push(Frag {
                data: self.data[..n].to_vec(),
                ..self.clone_empty(self.offset)
            });
        }
        if end < self.end() {
            let from = (end - self.offset) as usize;
            out.push(Frag {
                data: self.data[from..].to_vec(),
                ..self.clone_empty(end)
            });
        }
        out
    }

    /// A fragment of the same write at `offset`, without data yet.
    fn clone_empty(&self, offset: u64) -> Frag {
        Frag {
            seq: self.seq,
            offset,
            data: Vec::new(),
            lost: self.lost,
        }
    }

    /// This fragment cut to the bytes below `size` (None when nothing is left).
    fn below(mut self, size: u64) -> Option<Frag> {
        if self.offset >= size {
            return None;
        }
        if self.end() > size {
            self.data.truncate((size - self.offset) as usize);
        }
        Some(self)
    }
}

/// The pending writes of every file, keyed by inode number.
#[derive(Default)]
pub struct Cache {
    /// Per inode, fragments in ascending `seq` (fragments of one write in any order).
    files: HashMap<u64, Vec<Frag>>,
    next_seq: u64,
}

impl Cache {
    /// The number the next write will get: an fsync arriving now covers every write below it.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Records a write; returns its sequence number.
    pub fn add(&mut self, ino: u64, offset: u64, data: Vec<u8>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if !data.is_empty() {
            self.files.entry(ino).or_default().push(Frag {
                seq,
                offset,
                data,
                lost: false,
            });
        }
        seq
    }

    /// Lays the pending writes of `ino` over `buf`, which holds the file's bytes from
    /// `offset` on as the backing file has them.
    pub fn overlay(&self, ino: u64, offset: u64, buf: &mut [u8]) {
        let Some(frags) = self.files.get(&ino) else {
            return;
        };
        let end = offset + buf.len() as u64;
        for f in frags {
            let (lo, hi) = (f.offset.max(offset), f.end().min(end));
            if lo < hi {
                let src = &f.data[(lo - f.offset) as usize..(hi - f.offset) as usize];
                buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(src);
            }
        }
    }

    /// Where the pending writes of `ino` end (0 without any): the file is at least that long.
    pub fn end(&self, ino: u64) -> u64 {
        self.files
            .get(&ino)
            .map_or(0, |f| f.iter().map(Frag::end).max().unwrap_or(0))
    }

    pub fn has(&self, ino: u64) -> bool {
        self.files.contains_key(&ino)
    }

    /// A truncation: pending bytes at or past `size` are gone with it.
    pub fn clip(&mut self, ino: u64, size: u64) {
        self.update(ino, |frags| {
            frags.into_iter().filter_map(|f| f.below(size)).collect()
        });
    }

    /// Forgets the pending bytes of `ino` in `[start, end)` that are older than `seq`: newer
    /// bytes (a durable write, a hole punched) replaced them.
    pub fn supersede(&mut self, ino: u64, start: u64, end: u64, seq: u64) {
        self.update(ino, |frags| {
            frags
                .into_iter()
                .flat_map(|f| {
                    if f.seq < seq {
                        f.without(start, end)
                    } else {
                        vec![f]
                    }
                })
                .collect()
        });
    }

    /// Removes and returns the fragments of write `seq` (to make it durable), after
    /// cutting the bytes it overlaps out of older pending writes.
    pub fn take_write(&mut self, ino: u64, seq: u64) -> Vec<Frag> {
        let Some(frags) = self.files.get_mut(&ino) else {
            return Vec::new();
        };
        let (mine, rest): (Vec<Frag>, Vec<Frag>) = std::mem::take(frags)
            .into_iter()
            .partition(|f| f.seq == seq);
        *frags = rest;
        for f in &mine {
            self.supersede(ino, f.offset, f.end(), seq);
        }
        self.drop_empty(ino);
        mine
    }

    /// Removes and returns the fragments of `ino` older than `barrier`, oldest first (an
    /// fsync makes them durable). Lost ones stay: visible, never durable (`Frag::lost`).
    pub fn take_before(&mut self, ino: u64, barrier: u64) -> Vec<Frag> {
        let Some(frags) = self.files.get_mut(&ino) else {
            return Vec::new();
        };
        let (old, rest): (Vec<Frag>, Vec<Frag>) = std::mem::take(frags)
            .into_iter()
            .partition(|f| f.seq < barrier && !f.lost);
        *frags = rest;
        self.drop_empty(ino);
        old
    }

    /// A failed sync of `ino` loses its writes older than `barrier` (see `Frag::lost`).
    pub fn lose_before(&mut self, ino: u64, barrier: u64) {
        for f in self.files.get_mut(&ino).into_iter().flatten() {
            if f.seq < barrier {
                f.lost = true;
            }
        }
    }

    /// Removes and returns every pending fragment of every file (a crash).
    pub fn take_all(&mut self) -> Vec<(u64, Frag)> {
        let mut all: Vec<(u64, Frag)> = self
            .files
            .drain()
            .flat_map(|(ino, frags)| frags.into_iter().map(move |f| (ino, f)))
            .collect();
        all.sort_by_key(|(_, f)| (f.seq, f.offset));
        all
    }

    /// (writes, bytes) pending over all files.
    pub fn totals(&self) -> (usize, u64) {
        let mut seqs = std::collections::HashSet::new();
        let mut bytes = 0;
        for f in self.files.values().flatten() {
            seqs.insert(f.seq);
            bytes += f.data.len() as u64;
        }
        (seqs.len(), bytes)
    }

    fn update(&mut self, ino: u64, f: impl FnOnce(Vec<Frag>) -> Vec<Frag>) {
        if let Some(frags) = self.files.get_mut(&ino) {
            *frags = f(std::mem::take(frags));
            self.drop_empty(ino);
        }
    }

    fn drop_empty(&mut self, ino: u64) {
        if self.files.get(&ino).is_some_and(Vec::is_empty) {
            self.files.remove(&ino);
        }
    }
}
