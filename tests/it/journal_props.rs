//! Issue 19: no record a client can forge, no crash or repair that blocks the next start,
//! no entry that stalls the ring.
//!
//! A random program of appends (empty to the largest entry, some of them values full of
//! forged records), flushes, releases, crashes with torn in-flight writes, and deliberate
//! damage followed by a repair runs against the journal model (`journal::sim::MemLog`: the
//! real batcher and the real recovery scanner over an in-memory ring), on small rings that
//! wrap several times. After every restart it checks the guarantees the journal gives:
//!
//! 1. it opens: a crash alone is never reported as corruption, and once a repair has cut
//!    the log, later clean starts are never refused, whatever the look-ahead;
//! 2. no durable entry is lost: every entry durable at the crash, not released and not cut
//!    by a deliberate repair, comes back with its payload and replication offset;
//! 3. nothing is invented: every replayed entry is one that was appended, under its LSN;
//! 4. a forged value is never replayed as an entry of its own;
//! 5. releasing everything durable always makes room for an entry of the largest size.
//!
//! The deterministic tests after it pin down single cases: the real engine over files
//! (sync backend) for several laps of values full of forged records, reopened with every
//! look-ahead; a forged record exactly where the scanner looks after a torn write; and
//! three cases the property test found (a repair with a short look-ahead, a checkpoint
//! candidate left by a dropped entry, a checkpoint at the end of the log that lets an older
//! run's entry back in).

use std::collections::BTreeMap;

use proptest::prelude::*;
use walrus::journal::format::{ENTRY_TIME_BYTES, HEADER_BYTES};
use walrus::journal::reader::{EntryIter, ReplayEntry};
use walrus::journal::recovery::{ScanReport, Scanner, Tail};
use walrus::journal::ring::{Geometry, MemRing};
use walrus::journal::sim::{forged_payload, MemLog, Sector};
use walrus::journal::ReplayFrom;

const SEG: u64 = 64 * 1024;
/// Shorter than one write: evidence of corruption farther on is out of sight.
const SMALL_LOOKAHEAD: u64 = 4096;

fn geometry(segments: u32) -> Geometry {
    Geometry {
        segment_size_bytes: SEG,
        segments,
    }
}
/// The command every forged record carries (see `forged_payload`).
const FORGED_BODY: &[u8] = b"*1\r\n$8\r\nFLUSHALL\r\n";
/// The replication offset every forged record claims.
const FORGED_REPL_OFFSET: u64 = 999_999_999;

/// How large an appended entry is.
#[derive(Debug, Clone, Copy)]
enum Size {
    /// The common case: a command or two.
    Small(u16),
    /// Spans write buffers.
    Medium(u32),
    /// Anything up to the largest entry (spans segments); reduced modulo that size.
    Any(u32),
    /// Exactly the largest entry the ring accepts.
    Max,
}

impl Size {
    fn len(self, max_entry: usize) -> usize {
        match self {
            Size::Small(n) => usize::from(n),
            Size::Medium(n) => n as usize,
            Size::Any(n) => n as usize % (max_entry + 1),
            Size::Max => max_entry,
        }
    }
}

/// A client's guess at where its value will land, to forge records that would continue
/// the log there: the LSNs ahead of the next one, and the segment sequence of a position
/// `seg_ahead` segments after the checkpoint, `laps_ahead` laps later (a guess for when
/// the ring comes round and its bytes lie just past the end of the log).
#[derive(Debug, Clone, Copy)]
struct Forge {
    lsn_ahead: u16,
    seg_ahead: u8,
    laps_ahead: u8,
}

#[derive(Debug, Clone)]
enum Op {
    Append {
        size: Size,
        forged: Option<Forge>,
    },
    /// Every queued write completes.
    Flush,
    /// Releases through the durable LSN `frac`/255 of the way from the checkpoint.
    Release {
        frac: u8,
    },
    /// Flushes, releases everything durable, and then appends an entry of this size,
    /// which must fit.
    MakeRoom {
        size: Size,
    },
    /// Takes the writes in flight, completes the first `completed` (they become durable),
    /// and crashes: of the rest, those whose bit in `applied` is set reached the disk; the
    /// one `tear` selects (if any) reached it as a random mix of old and new sectors.
    /// With `retry`, the next run first appends entries of the same sizes as some of those
    /// the crash lost (as a client retrying them would), so its records land where theirs
    /// did and a later write of the crashed run lines up with its end; then it restarts.
    Crash {
        completed: u8,
        applied: u32,
        tear: Option<(u8, u64)>,
        small_lookahead: bool,
        retry: Option<u8>,
    },
    /// Flushes, flips one bit of a durable record (from the checkpoint on), and restarts
    /// accepting data loss, which cuts the log there (a repair whose look-ahead misses
    /// the records that vouch for the damaged one takes it for a torn tail: it cuts at the
    /// same place).
    Repair {
        record: u16,
        byte: u32,
        bit: u8,
        small_lookahead: bool,
    },
}

fn size() -> impl Strategy<Value = Size> {
    prop_oneof![
        6 => (0u16..2048).prop_map(Size::Small),
        3 => (0u32..24_000).prop_map(Size::Medium),
        1 => any::<u32>().prop_map(Size::Any),
        1 => Just(Size::Max),
    ]
}

fn forge() -> impl Strategy<Value = Forge> {
    (
        prop_oneof![3 => 0u16..4, 1 => any::<u16>().prop_map(|n| n % 2000)],
        0u8..8,
        0u8..4,
    )
        .prop_map(|(lsn_ahead, seg_ahead, laps_ahead)| Forge {
            lsn_ahead,
            seg_ahead,
            laps_ahead,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (size(), prop::option::weighted(0.3, forge()))
            .prop_map(|(size, forged)| Op::Append { size, forged }),
        2 => Just(Op::Flush),
        2 => any::<u8>().prop_map(|frac| Op::Release { frac }),
        1 => size().prop_map(|size| Op::MakeRoom { size }),
        2 => (
            0u8..4,
            any::<u32>(),
            prop::option::of((any::<u8>(), any::<u64>())),
            any::<bool>(),
            prop::option::weighted(0.3, any::<u8>()),
        )
            .prop_map(|(completed, applied, tear, small_lookahead, retry)| Op::Crash {
                completed,
                applied,
                tear,
                small_lookahead,
                retry,
            }),
        1 => (any::<u16>(), any::<u32>(), 0u8..8, any::<bool>())
            .prop_map(|(record, byte, bit, small_lookahead)| Op::Repair {
                record,
                byte,
                bit,
                small_lookahead,
            }),
    ]
}

/// The journal model and what the test expects of it.
struct Harness {
    log: MemLog,
    max_entry: usize,
    /// Appended and not lost to a crash (beyond the durable point) or a repair, from the
    /// checkpoint on: LSN -> (replication offset at its end, payload).
    entries: BTreeMap<u64, (u64, Vec<u8>)>,
    /// LSN the next append gets.
    next_lsn: u64,
    /// Highest LSN released (0: none); entries after it must come back.
    released: u64,
    repl_offset: u64,
    /// Counts appends, so that an LSN re-used after a crash gets a different payload and
    /// a leftover of the earlier run cannot pass for the new entry.
    appends: u64,
    /// Forged values appended, and restarts survived (to report coverage).
    forged: u64,
    restarts: u64,
}

impl Harness {
    fn new(segments: u32, max_write_bytes: usize) -> Harness {
        let geo = Geometry {
            segment_size_bytes: SEG,
            segments,
        };
        Harness {
            log: MemLog::new(geo, max_write_bytes),
            // The sim batcher's limit: the ring less two segments.
            max_entry: (SEG * u64::from(segments - 2)) as usize,
            entries: BTreeMap::new(),
            next_lsn: 1,
            released: 0,
            repl_offset: 0,
            appends: 0,
            forged: 0,
            restarts: 0,
        }
    }

    fn ring_bytes(&self) -> u64 {
        self.log.geo.ring_bytes()
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Append { size, forged } => self.append(size.len(self.max_entry), forged),
            Op::Flush => self.log.flush(),
            Op::Release { frac } => {
                let from = self.log.start.lsn - 1;
                let to = self.log.durable_lsn.max(from);
                self.release(from + (to - from) * u64::from(frac) / 255);
            }
            Op::MakeRoom { size } => {
                self.log.flush();
                self.release(self.log.durable_lsn);
                let len = size.len(self.max_entry);
                let payload = self.payload(len, None);
                let lsn = self.log.append(self.repl_offset + len as u64, &payload);
                assert!(
                    lsn.is_some(),
                    "ring full for an entry of {len} bytes right after releasing everything durable"
                );
                self.appended(lsn, payload);
            }
            Op::Crash {
                completed,
                applied,
                tear,
                small_lookahead,
                retry,
            } => {
                let lost = self.crash(completed, applied, tear, small_lookahead);
                if let Some(k) = retry {
                    for len in lost.iter().take(usize::from(k) % (lost.len() + 1)) {
                        self.append(*len, None);
                    }
                    self.run(&Op::Crash {
                        completed: u8::MAX,
                        applied: 0,
                        tear: None,
                        small_lookahead,
                        retry: None,
                    });
                }
            }
            Op::Repair {
                record,
                byte,
                bit,
                small_lookahead,
            } => self.repair(record, byte, bit, small_lookahead),
        }
    }

    fn payload(&mut self, len: usize, forged: Option<Forge>) -> Vec<u8> {
        self.appends += 1;
        let stamp = self.appends.to_le_bytes();
        let Some(f) = forged else {
            let mut p: Vec<u8> = (0..len)
                .map(|i| (self.appends as usize * 7 + i * 13) as u8)
                .collect();
            let n = len.min(8);
            p[..n].copy_from_slice(&stamp[..n]);
            return p;
        };
        self.forged += 1;
        let geo = self.log.geo;
        let seg_seq = geo.seg_seq(self.log.start.pos)
            + u64::from(f.seg_ahead)
            + u64::from(f.laps_ahead) * u64::from(geo.segments);
        let lsn = self.next_lsn + u64::from(f.lsn_ahead);
        let mut p = forged_payload(len, lsn, seg_seq, self.log.epoch);
        // The stamp goes last: it clips at most the last forged record.
        if len >= 8 {
            p[len - 8..].copy_from_slice(&stamp);
        }
        p
    }

    fn append(&mut self, len: usize, forged: Option<Forge>) {
        let payload = self.payload(len, forged);
        let off = self.repl_offset + len as u64;
        let lsn = match self.log.append(off, &payload) {
            Some(lsn) => Some(lsn),
            None => {
                // Property 5: a full ring never stalls an entry once everything durable
                // is released.
                self.log.flush();
                self.release(self.log.durable_lsn);
                let lsn = self.log.append(off, &payload);
                assert!(
                    lsn.is_some(),
                    "ring full for an entry of {len} bytes after releasing everything durable"
                );
                lsn
            }
        };
        self.appended(lsn, payload);
    }

    fn appended(&mut self, lsn: Option<u64>, payload: Vec<u8>) {
        let lsn = lsn.expect("checked by the caller");
        assert_eq!(lsn, self.next_lsn, "LSNs are dense");
        self.repl_offset += payload.len() as u64;
        self.entries.insert(lsn, (self.repl_offset, payload));
        self.next_lsn += 1;
    }

    fn release(&mut self, lsn: u64) {
        self.log.release_through(lsn);
        self.released = self.released.max(lsn);
        // Entries before the checkpoint are gone from the log: nothing to compare them to.
        let start = self.log.start.lsn;
        self.entries = self.entries.split_off(&start);
    }

    fn crash(
        &mut self,
        completed: u8,
        applied: u32,
        tear: Option<(u8, u64)>,
        small_lookahead: bool,
    ) -> Vec<usize> {
        let mut in_flight = self.log.take_writes();
        let done = usize::from(completed).min(in_flight.len());
        for w in in_flight.drain(..done) {
            self.log.complete(&w);
        }
        // A write over the tail block of the last completed one may be handed out now.
        in_flight.extend(self.log.take_writes());
        let durable = self.log.durable_lsn;
        let torn = tear.map(|(i, _)| usize::from(i) % in_flight.len().max(1));
        for (i, w) in in_flight.iter().enumerate() {
            if torn == Some(i) {
                let mask = tear.expect("torn implies tear").1;
                // Sectors only ever hold their old or new bytes (the device model).
                self.log.apply_sectors(w, |s| {
                    if mask.rotate_left((s / 64) as u32) >> (s % 64) & 1 == 1 {
                        Sector::New
                    } else {
                        Sector::Old
                    }
                });
            } else if applied >> (i % 32) & 1 == 1 {
                self.log.apply(w);
            }
        }
        // Property 1: whatever the look-ahead, a crash is not corruption.
        for lookahead in [SMALL_LOOKAHEAD, self.ring_bytes()] {
            let r = self.log.scan(lookahead);
            assert!(
                matches!(r.tail, Tail::End { .. }),
                "a crash reported as corruption (look-ahead {lookahead}, durable LSN {durable}, \
                 {} writes in flight): {:?}",
                in_flight.len(),
                r.tail
            );
        }
        let lookahead = self.lookahead(small_lookahead);
        let r = self
            .log
            .reopen_with(lookahead, false)
            .unwrap_or_else(|c| panic!("open refused after a crash: {c}"));
        // Property 2: nothing durable is lost.
        assert!(
            r.end.last_lsn() >= durable,
            "recovered up to LSN {} but LSN {durable} was durable",
            r.end.last_lsn()
        );
        self.recovered(&r)
    }

    fn repair(&mut self, record: u16, byte: u32, bit: u8, small_lookahead: bool) {
        self.log.flush();
        let records = record_spans(&self.log);
        if records.is_empty() {
            return;
        }
        let (lsn, pos, len) = records[usize::from(record) % records.len()];
        let at = pos + u64::from(byte) % len;
        let geo = self.log.geo;
        self.log.ring.segments[geo.seg_index(at) as usize][geo.seg_off(at) as usize] ^= 1 << bit;
        let r = self
            .log
            .reopen_with(self.lookahead(small_lookahead), true)
            .expect("a repair accepts data loss");
        assert_eq!(
            r.end.last_lsn(),
            lsn - 1,
            "a repair keeps every entry before the damaged one (damage at {at}, in LSN {lsn})"
        );
        self.released = self.released.min(lsn - 1);
        let _ = self.recovered(&r);
        // Property 1: after a repair the next start is clean, whatever its look-ahead.
        for lookahead in [SMALL_LOOKAHEAD, self.ring_bytes()] {
            let r = self.log.scan(lookahead);
            assert!(
                matches!(r.tail, Tail::End { .. }),
                "a repaired log still refused (look-ahead {lookahead}): {:?}",
                r.tail
            );
        }
    }

    fn lookahead(&self, small: bool) -> u64 {
        if small {
            SMALL_LOOKAHEAD
        } else {
            self.ring_bytes()
        }
    }

    /// After a restart: what was appended past the recovered end is gone (its LSNs will be
    /// re-used), and replay from the checkpoint must be exactly what remains. Returns the
    /// sizes of the entries lost.
    fn recovered(&mut self, r: &ScanReport) -> Vec<usize> {
        self.restarts += 1;
        let last = r.end.last_lsn();
        assert!(last < self.next_lsn, "recovered LSN {last}, never appended");
        let lost = self.entries.split_off(&(last + 1));
        self.next_lsn = last + 1;
        self.repl_offset = r.end.last_repl_offset;
        // Everything not released is still in the retained log.
        assert!(
            self.log.start.lsn <= self.released + 1,
            "checkpoint at LSN {} but only LSN {} was released",
            self.log.start.lsn,
            self.released
        );
        let mut expect = self.log.start.lsn;
        for e in replay(&self.log) {
            // Property 4: a forged record never stands as an entry.
            assert!(
                &e.payload[..] != FORGED_BODY && e.repl_offset_end != FORGED_REPL_OFFSET,
                "a forged record was replayed as LSN {}",
                e.lsn
            );
            // Property 3: every replayed entry was appended, under this LSN, with these bytes.
            assert_eq!(e.lsn, expect, "replay skipped or repeated an LSN");
            let Some((off, payload)) = self.entries.get(&e.lsn) else {
                panic!(
                    "replayed LSN {} that was never appended (or was lost)",
                    e.lsn
                );
            };
            assert!(
                e.payload[..] == payload[..],
                "LSN {} replayed with other bytes ({} bytes, appended {})",
                e.lsn,
                e.payload.len(),
                payload.len()
            );
            assert_eq!(
                e.repl_offset_end, *off,
                "replication offset of LSN {}",
                e.lsn
            );
            expect += 1;
        }
        // Property 2 (with the bound above): replay reaches the recovered end, so every
        // entry from the checkpoint to the durable point came back.
        assert_eq!(expect - 1, last, "replay and recovery disagree on the end");
        lost.values().map(|(_, p)| p.len()).collect()
    }

    /// Laps of the ring the log has made (the checkpoint's lap).
    fn laps(&self) -> u64 {
        self.log.start.pos / self.ring_bytes()
    }
}

/// Every entry from the checkpoint on, as replay reads it.
fn replay(log: &MemLog) -> Vec<ReplayEntry> {
    let ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    let scanner = Scanner::new(ring, log.geo, log.start, log.limits(0));
    EntryIter::new(scanner, ReplayFrom::Lsn(0), u64::MAX)
        .map(|e| e.expect("memory reads do not fail"))
        .collect()
}

/// (LSN, position, length) of every record from the checkpoint on.
fn record_spans(log: &MemLog) -> Vec<(u64, u64, u64)> {
    let ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    let mut s = Scanner::new(ring, log.geo, log.start, log.limits(0));
    let mut out = Vec::new();
    while let Some(r) = s.next_record().expect("memory reads do not fail") {
        out.push((r.header.lsn, r.pos, (HEADER_BYTES + r.payload.len()) as u64));
    }
    out
}

fn run_program(segments: u32, max_write_bytes: usize, ops: &[Op]) -> Harness {
    let mut h = Harness::new(segments, max_write_bytes);
    for op in ops {
        h.run(op);
    }
    // A last clean restart checks whatever the program left.
    h.run(&Op::Crash {
        completed: u8::MAX,
        applied: 0,
        tear: None,
        small_lookahead: false,
        retry: None,
    });
    h
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    /// Random appends, releases, crashes with torn writes and repairs over rings of 3 to 6
    /// segments that wrap several times: the journal always opens, keeps every durable
    /// entry, invents none, never replays a forged record, and always makes room.
    #[test]
    fn crashes_repairs_and_forged_values_over_many_laps(
        segments in 3u32..=6,
        max_write_bytes in prop::sample::select(vec![8192usize, 16 * 1024, 64 * 1024]),
        ops in prop::collection::vec(op(), 150..300),
    ) {
        let h = run_program(segments, max_write_bytes, &ops);
        if std::env::var_os("JOURNAL_PROPS_STATS").is_some() {
            eprintln!(
                "segments {segments}: {} laps, {} appends ({} forged), {} restarts",
                h.laps(), h.appends, h.forged, h.restarts
            );
        }
    }
}

/// A repair whose look-ahead is too short to reach the records that vouch for a damaged
/// entry takes the damage for a torn tail and cuts there, as it may. But it must also leave
/// nothing behind that a later start, with a longer look-ahead (the service's default after
/// `walrus journal repair --recovery-lookahead-bytes 4096`, say), takes for evidence of
/// corruption: a repair must never block the next start.
#[test]
fn a_repair_with_a_short_lookahead_never_blocks_a_later_start() {
    let geo = geometry(3);
    let mut log = MemLog::new(geo, 16 * 1024);
    // Entry 2 is longer than the short look-ahead; entry 3, appended once entry 2 was
    // durable, vouches for it.
    let mut off = 0;
    for (lsn, len) in [(1u8, 100usize), (2, 10_000), (3, 100)] {
        off += len as u64;
        log.append(off, &vec![lsn; len])
            .expect("room in an empty ring");
        log.flush();
    }
    let (_, pos, _) = record_spans(&log)
        .into_iter()
        .find(|s| s.0 == 2)
        .expect("entry 2 is in the log");
    let at = pos + HEADER_BYTES as u64 + 10;
    log.ring.segments[geo.seg_index(at) as usize][geo.seg_off(at) as usize] ^= 1;
    let r = log
        .reopen_with(SMALL_LOOKAHEAD, true)
        .expect("a repair accepts data loss");
    assert_eq!(r.end.last_lsn(), 1, "the repair cuts at the damaged entry");
    let next = log.reopen_with(geo.ring_bytes(), false);
    assert!(
        next.is_ok(),
        "the start after a repair was refused: {}",
        next.unwrap_err()
    );
}

/// The real engine over files: values full of forged records (guessing the LSNs, and the
/// segment sequences of this lap and the next ones) for more than three laps of the ring,
/// releasing as it fills; then a clean restart replays exactly what was appended since the
/// checkpoint, whatever the look-ahead.
#[tokio::test]
async fn engine_reopens_cleanly_after_laps_of_forged_values() {
    use bytes::Bytes;
    use walrus::journal::{Entry, IoBackendChoice, Journal, JournalConfig, JournalError, Ticket};

    const SEGMENTS: u32 = 4;
    /// Entries appended after the last release: the final replay checks all of them.
    const LAST_ENTRIES: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::small_for_tests(SEG, SEGMENTS)
    };
    let geo = Geometry {
        segment_size_bytes: SEG,
        segments: SEGMENTS,
    };
    let max_entry = cfg.max_entry() as usize;
    // Mostly up to a few KiB (several per write, and writes that continue the block of the
    // one before), sometimes spanning buffers or segments, and the largest entry.
    let sizes = [
        0, 115, 700, 3000, 9000, 2500, 300, 17_000, 1200, 40_000, 90, 5000, 70_000, 1800, 600,
        max_entry,
    ];
    let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    let epoch = rec.epoch;
    let mut appended: BTreeMap<u64, (u64, Bytes)> = BTreeMap::new();
    let mut tickets: Vec<Ticket> = Vec::new();
    let mut off = 0u64;
    let mut full_rings = 0;
    let mut last_phase = None;
    for i in 1u64.. {
        let laps = geo.seg_seq(j.status().write_pos) / u64::from(SEGMENTS);
        if laps >= 3 && last_phase.is_none() {
            // From here on nothing is released: what follows is all replayed at the end.
            for t in tickets.drain(..) {
                t.wait().await.unwrap();
            }
            let durable = j.durable().borrow().lsn;
            j.release_through_blocking(durable).unwrap();
            last_phase = Some(i);
        }
        if last_phase.is_some_and(|first| i - first == LAST_ENTRIES) {
            break;
        }
        let len = match last_phase {
            // Now and then one that seldom fits what is left of the open write buffer: it
            // goes at the next block boundary, in a fresh one. In all, well under the three
            // segments an emptied ring has.
            Some(_) if i % 4 == 0 => 10_000,
            Some(_) => (i * 331 % 1000) as usize,
            None => sizes[(i * 7 % sizes.len() as u64) as usize],
        };
        let st = j.status();
        let seg_seq = geo.seg_seq(st.write_pos) + i % 4 * u64::from(SEGMENTS) + i / 4 % 2;
        let payload = Bytes::from(forged_payload(len, st.next_lsn + i % 3, seg_seq, epoch));
        off += len as u64;
        let entry = Entry {
            repl_id: walrus::journal::sim::SIM_REPL_ID,
            repl_offset_end: off,
            payload: payload.clone(),
        };
        let t = match j.append(entry.clone()).await {
            Ok(t) => t,
            Err(JournalError::RingFull { .. }) => {
                assert!(last_phase.is_none(), "the last entries fit an emptied ring");
                // Releasing everything durable always makes room, even for the largest entry.
                full_rings += 1;
                for t in tickets.drain(..) {
                    t.wait().await.unwrap();
                }
                let durable = j.durable().borrow().lsn;
                j.release_through_blocking(durable).unwrap();
                j.append(entry).await.unwrap_or_else(|e| {
                    panic!("entry of {len} bytes refused after releasing everything durable: {e}")
                })
            }
            Err(e) => panic!("append {i} failed: {e}"),
        };
        appended.insert(t.lsn(), (off, payload));
        tickets.push(t);
        // Group commit gathers a few entries per write; a release now and then.
        if i % 3 == 0 {
            for t in tickets.drain(..) {
                t.wait().await.unwrap();
            }
        }
        if i % 5 == 0 && last_phase.is_none() {
            let durable = j.durable().borrow().lsn;
            j.release_through_blocking(durable / 2 + durable / 4)
                .unwrap();
        }
    }
    for t in tickets.drain(..) {
        t.wait().await.unwrap();
    }
    assert!(full_rings > 0, "the ring never filled");
    let last = *appended.keys().next_back().unwrap();
    let released = j.released_through();
    drop(j);
    for lookahead in [cfg.lookahead_bytes(), SMALL_LOOKAHEAD, geo.ring_bytes()] {
        let cfg = JournalConfig {
            recovery_lookahead_bytes: Some(lookahead),
            ..cfg.clone()
        };
        let (j, rec) = Journal::open(dir.path(), &cfg)
            .unwrap_or_else(|e| panic!("reopen (look-ahead {lookahead}) refused: {e}"));
        assert!(
            matches!(rec.tail, Tail::End { .. }),
            "look-ahead {lookahead}: {:?}",
            rec.tail
        );
        assert_eq!(rec.end.last_lsn(), last);
        let start = rec.checkpoint.start_lsn;
        assert!(
            start <= released + 1,
            "checkpoint {start} past the release {released}"
        );
        let mut expect = start;
        for e in j.replay(ReplayFrom::Lsn(0)).unwrap() {
            let e = e.unwrap();
            assert_eq!(e.lsn, expect, "replay skipped or repeated an LSN");
            let (off, payload) = &appended[&e.lsn];
            assert_eq!(
                e.repl_offset_end, *off,
                "replication offset of LSN {}",
                e.lsn
            );
            assert!(
                e.payload == payload,
                "LSN {} replayed with other bytes",
                e.lsn
            );
            expect += 1;
        }
        assert_eq!(expect - 1, last, "replay stops short of the end");
        assert!(
            last - start + 1 >= LAST_ENTRIES - 1,
            "the last entries were not all replayed"
        );
        j.close().unwrap();
    }
}

/// The one place the scanner reads a client's bytes as a record candidate: where the log
/// resumes after a torn write (the end, and the next block boundary). Here a value holds a
/// forged record, claiming the very LSN the value was appended as, exactly at the next block
/// boundary, and the crash loses the sector with the value's own header. The forged record
/// is well-formed, of the right lap, epoch and LSN; only the key it lacks keeps it from
/// being replayed as a FLUSHALL.
#[test]
fn a_forged_record_where_the_log_resumes_is_not_an_entry() {
    let geo = geometry(3);
    let mut log = MemLog::new(geo, 16 * 1024);
    log.append(100, &[7; 100]).expect("room in an empty ring");
    log.flush();
    // Entry 2 continues the first block right after entry 1; its payload starts a header
    // and its time later, and the forged record lies at the next block boundary.
    let stored = (HEADER_BYTES + ENTRY_TIME_BYTES) as u64;
    let entry_2_at = stored + 100;
    let forged_at = 4096;
    let prefix = (forged_at - entry_2_at - stored) as usize;
    let mut value = vec![b'x'; prefix];
    // forged_payload's first record has the lap given and the epoch before the one given.
    value.extend(forged_payload(
        2000,
        2,
        geo.seg_seq(forged_at),
        log.epoch + 1,
    ));
    assert_eq!(log.append(100 + value.len() as u64, &value), Some(2));
    let writes = log.take_writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].start_pos, 0, "entry 2 continues the first block");
    // The first sector (entry 1, then entry 2's header) keeps its old bytes, the rest is new.
    log.apply_sectors(
        &writes[0],
        |s| if s == 0 { Sector::Old } else { Sector::New },
    );
    for lookahead in [SMALL_LOOKAHEAD, geo.ring_bytes()] {
        let r = log.scan(lookahead);
        assert!(matches!(r.tail, Tail::End { .. }), "{:?}", r.tail);
        assert_eq!(
            r.end.last_lsn(),
            1,
            "the forged record was taken for entry 2"
        );
    }
    log.reopen(geo.ring_bytes());
    let entries = replay(&log);
    assert_eq!(entries.len(), 1);
    assert_eq!(&entries[0].payload[..], &[7; 100][..]);
}

/// A crash can leave the FIRST fragment of an entry whose other fragments never reached
/// the disk; recovery accepts it, then drops the entry (the log ends before it). That
/// fragment must not remain a checkpoint candidate: the next run writes its own entries
/// from the recovered end, before it, and a release that moved the checkpoint there would
/// skip them, losing durable entries (or making the next start refuse, when a later record
/// vouches for them).
#[test]
fn a_release_after_a_crash_never_moves_the_checkpoint_past_live_entries() {
    let geo = geometry(4);
    let mut log = MemLog::new(geo, 16 * 1024);
    // Entry 1 runs from segment 0 into segment 1: seven full 16 KiB buffers, then its LAST
    // (388 bytes, its time counted in the first) at 114688, in the last buffer of segment
    // 1, ending at 115172. Entry 2
    // does not fit the rest of that buffer but fits a buffer: it goes to a fresh one at the
    // next block (118784), where the segment end splits it: FIRST there (the first entry
    // start of segment 1), LAST at the start of segment 2.
    let one = 7 * (16 * 1024 - HEADER_BYTES as u64) + 388 - ENTRY_TIME_BYTES as u64;
    assert_eq!(log.append(one, &vec![1; one as usize]), Some(1));
    assert_eq!(log.append(one + 16_000, &vec![2; 16_000]), Some(2));
    let writes = log.take_writes();
    let last = writes.last().expect("writes in flight");
    assert_eq!(last.start_pos, 2 * SEG, "entry 2's LAST starts segment 2");
    assert_eq!(
        writes[writes.len() - 2].start_pos,
        118_784,
        "entry 2's FIRST"
    );
    // The crash: every write but the one with entry 2's LAST reached the disk.
    for w in &writes[..writes.len() - 1] {
        log.apply(w);
    }
    let r = log
        .reopen_with(geo.ring_bytes(), false)
        .expect("a crash opens");
    assert_eq!((r.end.last_lsn(), r.end.end_pos), (1, 115_172));
    // The next run: entries 2 and 3 from the recovered end, durable; then entry 1 is
    // released.
    for lsn in [2u8, 3] {
        assert_eq!(
            log.append(one + 100 * u64::from(lsn - 1), &[lsn; 100]),
            Some(lsn.into())
        );
    }
    log.flush();
    log.release_through(1);
    assert!(
        log.start.pos <= 115_172,
        "the checkpoint moved to {:?}, past entry 2 (at 115172)",
        log.start
    );
    let r = log
        .reopen_with(geo.ring_bytes(), false)
        .unwrap_or_else(|c| panic!("the start after a release was refused: {c}"));
    assert_eq!(r.end.last_lsn(), 3, "durable entries lost");
}

/// Records a crashed run left past the end of the log carry an older epoch than those of
/// the runs after it, which is how recovery tells them from a continuation. When a release
/// puts the checkpoint at the very end of the log, a scan from there must still refuse them:
/// here run 1 leaves entry 3 at a block boundary after a hole, run 2 writes its own entry 2
/// (the old entry 3 is rejected after it, by epoch), releases everything and crashes before
/// its entry 3 reaches the disk. Run 1's entry 3 was never acknowledged and is no part of
/// the log: it must not come back as entry 3.
#[test]
fn a_checkpoint_at_the_end_of_the_log_keeps_older_runs_out() {
    let geo = geometry(3);
    let mut log = MemLog::new(geo, 16 * 1024);
    // Run 1: entry 1 durable at 0..196; entry 2 in the rest of that block; entry 3 does not
    // fit the rest of the open buffer, so it goes to a fresh one at 4096. Only that write
    // reaches the disk.
    assert_eq!(log.append(100, &[1; 100]), Some(1));
    log.flush();
    assert_eq!(log.append(200, &[2; 100]), Some(2));
    assert_eq!(log.append(16_200, &[3; 16_000]), Some(3));
    let writes = log.take_writes();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[1].start_pos, 4096, "entry 3 starts the next block");
    log.apply(&writes[1]);
    let r = log
        .reopen_with(geo.ring_bytes(), false)
        .expect("a crash opens");
    assert_eq!(r.end.last_lsn(), 1);
    // Run 2: its own entry 2, durable; everything released; entry 3 never reaches the disk.
    assert_eq!(log.append(200, &[20; 100]), Some(2));
    log.flush();
    assert_eq!(
        log.scan(geo.ring_bytes()).end.last_lsn(),
        2,
        "run 1's entry 3 is refused"
    );
    log.release_through(2);
    assert_eq!(log.append(300, &[30; 100]), Some(3));
    drop(log.take_writes());
    let r = log
        .reopen_with(geo.ring_bytes(), false)
        .expect("a crash opens");
    let replayed = replay(&log);
    assert!(
        replayed.iter().all(|e| e.payload[..] != [3; 16_000][..]),
        "run 1's unacknowledged entry 3 came back as LSN 3 (recovered end LSN {})",
        r.end.last_lsn()
    );
    assert_eq!(r.end.last_lsn(), 2);
}
