//! Recovery tests on logs built by the real batcher (journal::sim) in memory: truncation at
//! every byte of the last entries, bit flips, zeroed sectors, torn in-flight writes, stale
//! laps, and leftovers of a crashed incarnation.

use proptest::prelude::*;
use walrus::journal::format::{align_up, HEADER_BYTES};
use walrus::journal::recovery::{ScanLimits, ScanReport, Scanner, Tail};
use walrus::journal::ring::{Geometry, MemRing};
use walrus::journal::sim::MemLog;

const SEG: u64 = 64 * 1024;
const LOOKAHEAD: u64 = 2 * SEG;

fn geo(segments: u32) -> Geometry {
    Geometry {
        segment_size_bytes: SEG,
        segments,
    }
}

fn payload(lsn: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (lsn as usize * 7 + i * 13) as u8)
        .collect()
}

/// (lsn, first record pos, end pos of last record) of every entry in the log, via the scanner.
fn entry_spans(log: &MemLog) -> Vec<(u64, u64, u64)> {
    let ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    let mut s = Scanner::new(ring, log.geo, log.start, log.limits(0));
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    while let Some(r) = s.next_record().unwrap() {
        let end = r.pos + (HEADER_BYTES + r.payload.len()) as u64;
        if r.header.kind.starts_entry() {
            out.push((r.header.lsn, r.pos, end));
        } else {
            out.last_mut().unwrap().2 = end;
        }
    }
    out
}

/// Zeroes logical range [from, to) of the ring.
fn zero(log: &mut MemLog, from: u64, to: u64) {
    log.ring.zero(log.geo, from, to);
}

fn flip_bit(log: &mut MemLog, pos: u64, bit: u8) {
    let g = log.geo;
    let seg = &mut log.ring.segments[g.seg_index(pos) as usize];
    seg[g.seg_off(pos) as usize] ^= 1 << bit;
}

fn assert_end(r: &ScanReport, last_lsn: u64) {
    assert!(
        matches!(r.tail, Tail::End { .. }),
        "expected a clean end, got {:?}",
        r.tail
    );
    assert_eq!(r.end.last_lsn(), last_lsn, "tail {:?}", r.tail);
}

/// One write per `per_write` entries, all durable.
fn build(g: Geometry, sizes: &[usize], per_write: usize) -> MemLog {
    let mut log = MemLog::new(g, 16 * 1024);
    let mut off = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        off += len as u64;
        log.append(off, &payload(i as u64 + 1, len))
            .expect("room in ring");
        if (i + 1) % per_write == 0 {
            log.flush();
        }
    }
    log.flush();
    log
}

#[test]
fn truncation_at_every_byte_of_the_last_entries() {
    let sizes: Vec<usize> = (0..40).map(|i| [10, 200, 37, 600, 1][i % 5]).collect();
    let log = build(geo(3), &sizes, 4);
    let spans = entry_spans(&log);
    assert_eq!(spans.len(), sizes.len());
    let region_start = spans[spans.len() - 4].1;
    let region_end = spans.last().unwrap().2;
    for cut in region_start..=region_end {
        let mut l = MemLog::new(log.geo, 16 * 1024);
        l.ring = MemRing {
            segments: log.ring.segments.clone(),
        };
        zero(&mut l, cut, align_up(region_end));
        let r = l.scan(LOOKAHEAD);
        let expect = spans
            .iter()
            .filter(|s| s.2 <= cut)
            .map(|s| s.0)
            .max()
            .unwrap_or(0);
        assert_end(&r, expect);
    }
}

#[test]
fn flipped_bit_in_tail_is_cut_but_mid_log_is_corruption() {
    let sizes = vec![300usize; 60];
    let log = build(geo(3), &sizes, 5);
    let spans = entry_spans(&log);
    // Every bit of a header and some payload bits of an entry in the middle.
    let (lsn, pos, end) = spans[20];
    for p in (pos..end).step_by(7) {
        let mut l = MemLog::new(log.geo, 16 * 1024);
        l.ring = MemRing {
            segments: log.ring.segments.clone(),
        };
        flip_bit(&mut l, p, (p % 8) as u8);
        let r = l.scan(LOOKAHEAD);
        match &r.tail {
            Tail::Corrupt(c) => {
                assert_eq!(c.expected_lsn, lsn);
                // The damage starts after the last valid record, at or before the bad one.
                assert_eq!(c.pos, spans[19].2);
                assert!(c.pos <= pos);
                assert_eq!(c.segment_index, log.geo.seg_index(c.pos));
                assert!(c.evidence_durable_hint >= lsn);
            }
            t => panic!("flip at {p} not reported as corruption: {t:?}"),
        }
        assert_eq!(r.end.last_lsn(), lsn - 1);
    }
    // The last write's entries are covered by no later durable hint: a torn tail.
    let (lsn, pos, end) = spans[58];
    let mut l = MemLog::new(log.geo, 16 * 1024);
    l.ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    flip_bit(&mut l, (pos + end) / 2, 3);
    assert_end(&l.scan(LOOKAHEAD), lsn - 1);
}

#[test]
fn zeroed_sector_mid_log_is_corruption() {
    let log = build(geo(3), &vec![700usize; 50], 3);
    let spans = entry_spans(&log);
    let (lsn, pos, _) = spans[10];
    let sector = pos / 512 * 512;
    let mut l = MemLog::new(log.geo, 16 * 1024);
    l.ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    zero(&mut l, sector, sector + 512);
    let r = l.scan(LOOKAHEAD);
    let bad_idx = spans.iter().position(|s| s.2 > sector).unwrap();
    let first_bad = spans[bad_idx];
    match &r.tail {
        Tail::Corrupt(c) => {
            assert_eq!((c.expected_lsn, c.pos), (first_bad.0, spans[bad_idx - 1].2))
        }
        t => panic!("zeroed sector not reported: {t:?}"),
    }
    assert!(first_bad.0 <= lsn);
}

#[test]
fn torn_in_flight_writes_cut_at_the_first_hole() {
    let mut log = MemLog::new(geo(4), 8192);
    let mut off = 0;
    for i in 1..=30u64 {
        off += 100;
        log.append(off, &payload(i, 100)).unwrap();
    }
    log.flush();
    // Four writes in flight: 1 KiB entries, 8 KiB buffers. The first continues the last
    // block of the flushed write (five entries after its 30), the others hold seven each.
    for i in 31..=56u64 {
        off += 1000;
        log.append(off, &payload(i, 1000)).unwrap();
    }
    let writes = log.take_writes();
    assert_eq!(writes.len(), 4);
    // The second and fourth complete, the first and third do not.
    log.apply(&writes[1]);
    log.apply(&writes[3]);
    let r = log.scan(LOOKAHEAD);
    assert_end(&r, 30);
    // A restart writes new, different entries over the hole, right after entry 30; the
    // old second write (epoch 1, the right lap, and at the next block boundary after the
    // new entries, the next LSN) must never be taken as their continuation.
    log.reopen(LOOKAHEAD);
    off -= 26 * 1000;
    for i in 31..=35u64 {
        off += 1000;
        log.append(off, &payload(i + 1000, 1000)).unwrap();
    }
    let w = log.take_writes();
    assert_eq!(w.len(), 1);
    log.apply(&w[0]);
    let r = log.scan(LOOKAHEAD);
    assert_end(&r, 35);
    match &r.tail {
        Tail::End { reason, .. } => assert!(
            reason.contains("epoch"),
            "stale incarnation not rejected by epoch: {reason}"
        ),
        t => panic!("{t:?}"),
    }
}

/// A group commit opened while the write holding its block is in flight goes out beside
/// it, at the next block boundary, instead of waiting a device latency to continue that
/// block; with nothing in flight, the next write continues the block (no padding skipped).
#[test]
fn a_write_opened_while_the_one_before_is_in_flight_goes_out_beside_it() {
    let mut log = MemLog::new(geo(4), 8192);
    log.append(100, &payload(1, 100)).unwrap();
    let first = log.take_writes();
    assert_eq!(first.len(), 1);
    log.append(200, &payload(2, 100)).unwrap();
    let second = log.take_writes();
    assert_eq!(second.len(), 1, "the second write waited for the first");
    let end = |w: &walrus::journal::sim::PendingWrite| w.start_pos + w.bytes.len() as u64;
    assert_eq!(
        second[0].start_pos,
        end(&first[0]),
        "not at the next block boundary"
    );
    // Both land: recovery reads the first write's padding, then the boundary.
    log.complete(&first[0]);
    log.complete(&second[0]);
    assert_end(&log.scan(LOOKAHEAD), 2);
    // Idle again: the next write continues the second one's block.
    log.append(300, &payload(3, 100)).unwrap();
    let third = log.take_writes();
    assert_eq!(third.len(), 1);
    assert_eq!(
        third[0].start_pos, second[0].start_pos,
        "an idle journal skipped padding"
    );
    log.complete(&third[0]);
    assert_end(&log.scan(LOOKAHEAD), 3);
}

#[test]
fn previous_lap_entries_after_the_end_are_never_replayed() {
    let g = geo(3);
    let mut log = MemLog::new(g, 16 * 1024);
    let mut off = 0;
    let mut lsn = 0;
    // Write about four segments worth, releasing as we go, so the ring wraps.
    while log.geo.seg_seq(log.start.pos) < 3 || lsn < 500 {
        off += 500;
        lsn = match log.append(off, &payload(lsn + 1, 500)) {
            Some(l) => l,
            None => {
                log.flush();
                log.release_through(log.durable_lsn);
                log.append(off, &payload(lsn + 1, 500))
                    .expect("room after release")
            }
        };
        if lsn % 8 == 0 {
            log.flush();
        }
    }
    log.flush();
    let full = log.scan(LOOKAHEAD);
    assert_end(&full, lsn);
    // Segments beyond the end hold valid records of the previous lap.
    let spans = entry_spans(&log);
    let (last_lsn, _, last_end) = *spans.last().unwrap();
    assert_eq!(last_lsn, lsn);
    let mut stale_seen = false;
    let ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    let mut sc = Scanner::new(
        ring,
        g,
        walrus::journal::recovery::ScanStart {
            pos: align_up(last_end),
            lsn: 0,
            repl_id: [0; 40],
            repl_offset: 0,
            epoch: 0,
        },
        ScanLimits {
            max_epoch: 9,
            ..log.limits(0)
        },
    );
    let _ = sc.next_record();
    if let Tail::End { reason, .. } = sc.finish().unwrap().tail {
        stale_seen = reason.contains("stale") || reason.contains("header");
    }
    assert!(stale_seen);
    let r = log.scan(LOOKAHEAD);
    match &r.tail {
        Tail::End { reason, .. } => assert!(
            reason.contains("stale") || reason.contains("no record"),
            "{reason}"
        ),
        t => panic!("{t:?}"),
    }
    assert_eq!(r.end.last_lsn(), lsn);
}

/// Appends entry `i + 1` (`len` bytes, its stream ending `len` after `off`) and records it;
/// false when the ring is full.
fn append_next(
    log: &mut MemLog,
    off: &mut u64,
    i: usize,
    len: usize,
    appended: &mut Vec<(u64, u64, Vec<u8>)>,
) -> bool {
    *off += len as u64;
    let p = payload(i as u64 + 1, len);
    let Some(lsn) = log.append(*off, &p) else {
        return false;
    };
    appended.push((lsn, *off, p));
    true
}

/// The crash: of the writes in flight, those `applied` picks reach the disk, the first of
/// them torn (only the 512-byte sectors `tear_mask` picks are new).
fn crash(
    log: &mut MemLog,
    in_flight: &[&walrus::journal::sim::PendingWrite],
    applied: impl Fn(usize) -> bool,
    tear_mask: u64,
) {
    use walrus::journal::sim::Sector;
    for (k, w) in in_flight.iter().enumerate().filter(|(k, _)| applied(*k)) {
        if k == 0 {
            log.apply_sectors(w, |s| {
                if tear_mask >> (s % 64) & 1 == 1 {
                    Sector::New
                } else {
                    Sector::Old
                }
            });
        } else {
            log.apply(w);
        }
    }
}

/// After a crash: recovery ends at a clean end (never reports corruption), keeps every
/// durable entry, and replays exactly a prefix of what was appended.
fn recovers_a_prefix(
    log: &MemLog,
    durable: u64,
    appended: &[(u64, u64, Vec<u8>)],
) -> Result<(), TestCaseError> {
    let r = log.scan(LOOKAHEAD);
    prop_assert!(
        matches!(r.tail, Tail::End { .. }),
        "crash reported as corruption: {:?}",
        r.tail
    );
    let last = r.end.last_lsn();
    prop_assert!(
        last >= durable,
        "lost durable entries: recovered {} < durable {}",
        last,
        durable
    );
    prop_assert!(last <= appended.len() as u64);
    let ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    let sc = Scanner::new(ring, log.geo, log.start, log.limits(0));
    let got: Vec<_> =
        walrus::journal::reader::EntryIter::new(sc, walrus::journal::ReplayFrom::Lsn(1), u64::MAX)
            .map(|e| e.unwrap())
            .collect();
    prop_assert_eq!(got.len() as u64, last);
    for (e, (lsn, off, p)) in got.iter().zip(appended.iter()) {
        prop_assert_eq!(e.lsn, *lsn);
        prop_assert_eq!(e.repl_offset_end, *off);
        prop_assert_eq!(&e.payload[..], &p[..]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Writes taken while earlier ones are still in flight (group commits that go out
    /// beside each other), completed in order up to a point, then a crash with any subset
    /// of the rest applied and the first of them torn: every durable entry comes back, and
    /// replay is exactly a prefix of what was appended.
    #[test]
    fn crash_with_overlapping_group_commits(
        sizes in prop::collection::vec(0usize..3000, 1..80),
        take_mask in any::<u64>(),
        complete_mask in any::<u64>(),
        applied_mask in any::<u16>(),
        tear_mask in any::<u64>(),
    ) {
        let mut log = MemLog::new(geo(6), 8192);
        let mut off = 0u64;
        let mut appended = Vec::new();
        let mut pending = std::collections::VecDeque::new();
        for (i, &len) in sizes.iter().enumerate() {
            if !append_next(&mut log, &mut off, i, len, &mut appended) {
                break;
            }
            if take_mask >> (i % 64) & 1 == 1 {
                pending.extend(log.take_writes());
            }
            // Completions in submission order, as the durable position requires.
            if complete_mask >> (i % 64) & 1 == 1 {
                if let Some(w) = pending.pop_front() {
                    log.complete(&w);
                }
            }
        }
        pending.extend(log.take_writes());
        let durable = log.durable_lsn;
        let pending: Vec<_> = pending.iter().collect();
        crash(&mut log, &pending, |k| applied_mask >> (k % 16) & 1 == 1, tear_mask);
        recovers_a_prefix(&log, durable, &appended)?;
    }

    /// As above, with writes completing in any order (the newest first frees its block for
    /// a continuation while older ones are still in flight); the durable position is the
    /// contiguous prefix of completed writes, as the writer publishes it.
    #[test]
    fn crash_with_group_commits_completing_out_of_order(
        sizes in prop::collection::vec(0usize..3000, 1..80),
        take_mask in any::<u64>(),
        land_mask in any::<u64>(),
        pick in prop::collection::vec(any::<prop::sample::Index>(), 80),
        applied_mask in any::<u16>(),
        tear_mask in any::<u64>(),
    ) {
        use walrus::journal::sim::PendingWrite;
        let mut log = MemLog::new(geo(6), 8192);
        let mut off = 0u64;
        let mut appended = Vec::new();
        // In submission order, each with whether it landed.
        let mut flight: Vec<(PendingWrite, bool)> = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            if !append_next(&mut log, &mut off, i, len, &mut appended) {
                break;
            }
            if take_mask >> (i % 64) & 1 == 1 {
                flight.extend(log.take_writes().into_iter().map(|w| (w, false)));
            }
            if land_mask >> (i % 64) & 1 == 1 {
                let open: Vec<usize> = (0..flight.len()).filter(|&k| !flight[k].1).collect();
                if !open.is_empty() {
                    let k = open[pick[i].index(open.len())];
                    log.landed(&flight[k].0);
                    flight[k].1 = true;
                    while flight.first().is_some_and(|w| w.1) {
                        let (w, _) = flight.remove(0);
                        if let Some((lsn, _)) = w.last_complete {
                            log.set_durable(lsn);
                        }
                    }
                }
            }
        }
        flight.extend(log.take_writes().into_iter().map(|w| (w, false)));
        let durable = log.durable_lsn;
        let unlanded: Vec<_> = flight.iter().filter(|(_, landed)| !landed).map(|(w, _)| w).collect();
        crash(&mut log, &unlanded, |k| k == 0 || applied_mask >> (k % 16) & 1 == 1, tear_mask);
        recovers_a_prefix(&log, durable, &appended)?;
    }

    /// Crash with a random set of in-flight writes applied, some torn: recovery returns a
    /// prefix of the appended entries that contains every durable one, never corruption.
    #[test]
    fn crash_with_random_in_flight_writes(
        sizes in prop::collection::vec(0usize..9000, 1..60),
        flush_every in 1usize..8,
        inflight in 1usize..6,
        applied_mask in any::<u8>(),
        tear_mask in any::<u64>(),
    ) {
        let mut log = MemLog::new(geo(6), 8192);
        let mut off = 0u64;
        let mut appended = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            off += len as u64;
            let p = payload(i as u64 + 1, len);
            let Some(lsn) = log.append(off, &p) else { break };
            appended.push((lsn, off, p));
            if (i + 1) % flush_every == 0 && i + 1 < sizes.len() {
                log.flush();
            }
        }
        let durable = log.durable_lsn;
        let writes = log.take_writes();
        // The first in-flight write is torn: after a flush it is the rewrite of the last
        // durable block, whose acknowledged bytes must survive any mix of its sectors.
        let in_flight: Vec<_> = writes.iter().take(inflight).collect();
        crash(&mut log, &in_flight, |k| applied_mask & (1 << k) != 0, tear_mask);
        recovers_a_prefix(&log, durable, &appended)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// The fuzz target's body on random inputs, so CI exercises it without cargo-fuzz.
    #[test]
    fn fuzz_recovery_body(
        appends in prop::collection::vec((0u8..0xFF, any::<u8>()), 0..40),
        damage in prop::collection::vec(prop::array::uniform5(any::<u8>()), 0..6),
    ) {
        let mut data: Vec<u8> = appends.iter().flat_map(|&(a, b)| [a, b]).collect();
        data.extend([0xFF, 0]);
        data.extend(damage.iter().flatten());
        walrus::journal::sim::fuzz_recovery(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// Long runs that wrap the ring several times (releasing as it fills), with entries
    /// that span buffers and segments, then a crash with random in-flight writes applied:
    /// recovery from the checkpoint returns exactly the appended entries from there on,
    /// including every durable one, and never a previous lap's record.
    #[test]
    fn wraparound_with_releases_then_crash(
        sizes in prop::collection::vec(0usize..40_000, 20..120),
        keep_mask in any::<u8>(),
    ) {
        let mut log = MemLog::new(geo(4), 16 * 1024);
        let mut appended: Vec<Vec<u8>> = Vec::new();
        let mut off = 0u64;
        for (i, &len) in sizes.iter().enumerate() {
            let p = payload(i as u64 + 1, len);
            off += len as u64;
            let lsn = match log.append(off, &p) {
                Some(l) => l,
                None => {
                    log.flush();
                    log.release_through(log.durable_lsn);
                    log.append(off, &p).expect("room after releasing everything durable")
                }
            };
            prop_assert_eq!(lsn, i as u64 + 1);
            appended.push(p);
            if i % 3 == 0 {
                log.flush();
            }
        }
        let durable = log.durable_lsn;
        for (k, w) in log.take_writes().iter().enumerate() {
            if keep_mask & (1 << (k % 8)) != 0 {
                log.apply(w);
            }
        }
        let r = log.scan(LOOKAHEAD);
        prop_assert!(matches!(r.tail, Tail::End { .. }), "{:?}", r.tail);
        prop_assert!(r.end.last_lsn() >= durable);
        let ring = MemRing { segments: log.ring.segments.clone() };
        let sc = Scanner::new(ring, log.geo, log.start, log.limits(0));
        let mut expect = log.start.lsn;
        for e in walrus::journal::reader::EntryIter::new(sc, walrus::journal::ReplayFrom::Lsn(0), u64::MAX) {
            let e = e.unwrap();
            prop_assert_eq!(e.lsn, expect);
            prop_assert_eq!(&e.payload[..], &appended[(e.lsn - 1) as usize][..]);
            expect += 1;
        }
        prop_assert_eq!(expect - 1, r.end.last_lsn());
    }
}
