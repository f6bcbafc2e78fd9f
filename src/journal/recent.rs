//! The newest entries, kept in memory for a reader that follows the journal closely (the
//! archive's uploader). It takes them from here instead of reading back, from the disk the
//! journal writes to, what was written a moment before: those reads took the bandwidth the
//! writes needed (docs/benchmarks.md, "The archive").
//!
//! Bounded by bytes: each entry's payload and what keeping it costs besides (small entries,
//! one command each under light load, cost more in bookkeeping than in payload). An entry
//! leaves when the bound needs its room or when the journal releases it, so every entry held
//! here is one the ring still holds, and a read from here returns exactly what a replay of
//! the ring would: the same entries, the same resume points. The entries are the link's own
//! `Bytes`, shared, not copied.

use std::collections::VecDeque;

use super::reader::ReplayEntry;
use super::recovery::ScanStart;

struct Kept {
    entry: ReplayEntry,
    /// Where a replay resumes after it ([`super::reader::EntryIter::resume_point`]).
    resume: ScanStart,
}

/// Consecutive entries, the newest appended last.
#[derive(Default)]
pub struct Recent {
    kept: VecDeque<Kept>,
    bytes: u64,
    max_bytes: u64,
}

impl Recent {
    /// Holds at most `max_bytes` from now on, payloads and bookkeeping (0: nothing).
    pub fn set_max_bytes(&mut self, max_bytes: u64) {
        self.max_bytes = max_bytes;
        self.trim();
    }

    /// Whether it keeps anything: appenders need not build an entry for it otherwise.
    pub fn is_on(&self) -> bool {
        self.max_bytes > 0
    }

    /// Keeps the entry appended last (its LSN follows the one kept before it, if any).
    pub fn push(&mut self, entry: ReplayEntry, resume: ScanStart) {
        if !self.is_on() {
            return;
        }
        debug_assert!(
            self.kept
                .back()
                .is_none_or(|k| k.entry.lsn + 1 == entry.lsn),
            "recent entries are consecutive"
        );
        self.bytes += cost(&entry);
        self.kept.push_back(Kept { entry, resume });
        self.trim();
    }

    /// Forgets the entries the journal released: those before the retained log's first.
    pub fn release_before(&mut self, head_lsn: u64) {
        while self.kept.front().is_some_and(|k| k.entry.lsn < head_lsn) {
            self.pop();
        }
    }

    /// Up to `max_entries` entries from `lsn` through `upto_lsn`, each with the point a replay
    /// resumes at after it; `None` when `lsn` is not held (older than the oldest: read the
    /// ring).
    pub fn from(
        &self,
        lsn: u64,
        upto_lsn: u64,
        max_entries: usize,
    ) -> Option<Vec<(ReplayEntry, ScanStart)>> {
        let first = self.kept.front()?.entry.lsn;
        let last = self.kept.back()?.entry.lsn;
        if lsn < first || lsn > last + 1 {
            return None;
        }
        let upto = upto_lsn.min(last);
        let n = (upto + 1).saturating_sub(lsn).min(max_entries as u64) as usize;
        let at = (lsn - first) as usize;
        Some(
            self.kept
                .range(at..at + n)
                .map(|k| (k.entry.clone(), k.resume))
                .collect(),
        )
    }

    fn trim(&mut self) {
        while self.bytes > self.max_bytes {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some(k) = self.kept.pop_front() {
            self.bytes -= cost(&k.entry);
        }
    }
}

/// What holding an entry costs besides its payload: its place in the queue.
pub const ENTRY_OVERHEAD_BYTES: usize = std::mem::size_of::<Kept>();

fn cost(entry: &ReplayEntry) -> u64 {
    (entry.payload.len() + ENTRY_OVERHEAD_BYTES) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn entry(lsn: u64, len: usize) -> (ReplayEntry, ScanStart) {
        let e = ReplayEntry {
            lsn,
            repl_id: [b'a'; 40],
            repl_offset_end: lsn * 10,
            payload: Bytes::from(vec![lsn as u8; len]),
            time_ms: Some(lsn),
        };
        let resume = ScanStart {
            pos: lsn * 100,
            lsn: lsn + 1,
            repl_id: [b'a'; 40],
            repl_offset: lsn * 10,
            epoch: 1,
        };
        (e, resume)
    }

    fn lsns(r: &Recent, from: u64, upto: u64, max: usize) -> Option<Vec<u64>> {
        r.from(from, upto, max)
            .map(|v| v.iter().map(|(e, _)| e.lsn).collect())
    }

    #[test]
    fn holds_the_newest_entries_within_its_bound_and_nothing_released() {
        let mut r = Recent::default();
        let (e, at) = entry(1, 10);
        r.push(e, at);
        assert_eq!(lsns(&r, 1, 9, usize::MAX), None, "holds nothing while off");
        r.set_max_bytes(3 * (10 + ENTRY_OVERHEAD_BYTES as u64));
        for lsn in 1..=5 {
            let (e, at) = entry(lsn, 10);
            r.push(e, at);
        }
        assert_eq!(lsns(&r, 3, 9, usize::MAX), Some(vec![3, 4, 5]));
        assert_eq!(lsns(&r, 2, 9, usize::MAX), None, "entry 2 left for room");
        assert_eq!(
            lsns(&r, 6, 9, usize::MAX),
            Some(vec![]),
            "nothing newer yet"
        );
        assert_eq!(lsns(&r, 7, 9, usize::MAX), None);
        assert_eq!(
            lsns(&r, 3, 4, usize::MAX),
            Some(vec![3, 4]),
            "up to upto_lsn"
        );
        assert_eq!(lsns(&r, 3, 9, 2), Some(vec![3, 4]), "max_entries");
        assert_eq!(
            lsns(&r, 4, 2, usize::MAX),
            Some(vec![]),
            "upto_lsn before lsn"
        );
        let resumes: Vec<_> = r
            .from(4, 9, usize::MAX)
            .unwrap()
            .iter()
            .map(|(_, s)| s.lsn)
            .collect();
        assert_eq!(resumes, vec![5, 6]);
        r.release_before(4);
        assert_eq!(lsns(&r, 3, 9, usize::MAX), None, "entry 3 was released");
        assert_eq!(lsns(&r, 4, 9, usize::MAX), Some(vec![4, 5]));
        r.set_max_bytes(0);
        assert_eq!(lsns(&r, 5, 9, usize::MAX), None);
    }
}
