//! What survives a power loss: the choice among the pending writes, for each crash mode.
//!
//! Pure functions over the fragments the cache gives up; the caller writes the survivors to
//! the backing files. Randomness comes from a seeded generator (`seed N`), so that a run
//! that found a bug can be replayed.

use std::collections::BTreeMap;

use crate::cache::Frag;

/// A pending fragment and the inode it belongs to.
pub type Placed = (u64, Frag);

/// The sector: the unit a device writes atomically, so a torn write is cut at a multiple
/// of it (in file offsets).
pub const SECTOR: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every pending write is lost.
    Drop,
    /// Every pending write is lost but a sector-aligned prefix of the newest one.
    Tear,
    /// A random subset of the pending writes survives, written in a random order.
    Reorder,
}

/// The survivors of a crash, in the order to write them, and what the crash did.
pub struct Outcome {
    pub keep: Vec<Placed>,
    pub writes: usize,
    pub bytes: u64,
    pub kept_writes: usize,
    pub kept_bytes: u64,
    /// Tear: (inode, file offset of the cut). Bytes of the last write below it survive.
    pub torn: Option<(u64, u64)>,
}

/// xorshift64*: small, fast and reproducible from a seed; no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Zero is xorshift's one fixed point: map it elsewhere.
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Decides which of `pending` (every pending fragment, as the cache gives them up)
/// survives a crash in `mode`.
pub fn decide(mode: Mode, pending: Vec<Placed>, rng: &mut Rng) -> Outcome {
    // Whole writes, by sequence number: a write's fragments share its fate.
    let mut writes: BTreeMap<u64, Vec<Placed>> = BTreeMap::new();
    for (ino, f) in pending {
        writes.entry(f.seq).or_default().push((ino, f));
    }
    let count = writes.len();
    let bytes = writes
        .values()
        .flatten()
        .map(|(_, f)| f.data.len() as u64)
        .sum();
    let mut torn = None;
    let keep: Vec<Placed> = match mode {
        Mode::Drop => Vec::new(),
        Mode::Tear => match writes.pop_last() {
            Some((_, last)) => {
                let (keep, cut) = tear(last, rng);
                torn = cut;
                keep
            }
            None => Vec::new(),
        },
        Mode::Reorder => {
            // Each write survives with probability 1/2, independently of the others (so
            // the survivors need not be a prefix), and they reach the disk shuffled.
            let mut kept: Vec<Vec<Placed>> =
                writes.into_values().filter(|_| rng.below(2) == 1).collect();
            for i in (1..kept.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                kept.swap(i, j);
            }
            kept.into_iter().flatten().collect()
        }
    };
    let kept_writes = keep
        .iter()
        .map(|(_, f)| f.seq)
        .collect::<std::collections::HashSet<_>>()
        .len();
    let kept_bytes = keep.iter().map(|(_, f)| f.data.len() as u64).sum();
    Outcome {
        keep,
        writes: count,
        bytes,
        kept_writes,
        kept_bytes,
        torn,
    }
}

/// Cuts one write at a random sector boundary strictly inside it and keeps what lies
/// below. A write within a single sector has no such boundary: the sector is written
/// whole or not at all, and here not at all.
fn tear(write: Vec<Placed>, rng: &mut Rng) -> (Vec<Placed>, Option<(u64, u64)>) {
    let ino = write[0].0;
    let lo = write.iter().map(|(_, f)| f.offset).min().unwrap_or(0);
    let hi = write.iter().map(|(_, f)| f.end()).max().unwrap_or(0);
    let first = lo / SECTOR + 1; // the first boundary above lo
    let last = hi.saturating_sub(1) / SECTOR; // the last boundary below hi
    if first > last {
        return (Vec::new(), Some((ino, lo)));
    }
    let cut = (first + rng.below(last - first + 1)) * SECTOR;
    let keep = write
        .into_iter()
        .filter_map(|(ino, mut f)| {
            if f.offset >= cut {
                return None;
            }
            if f.end() > cut {
                f.data.truncate((cut - f.offset) as usize);
            }
            Some((ino, f))
        })
        .collect();
    (keep, Some((ino, cut)))
}
