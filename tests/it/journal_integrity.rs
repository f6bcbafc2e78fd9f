//! The journal's integrity against what a client controls and what a crash or a repair
//! leaves (issue 19): records forged inside values, repairs that must leave a journal that
//! opens clean forever, entries spliced from two runs, maximum entries back to back, a
//! journal of the format before record keys, and a device that garbles a sector.

use crate::common;

use bytes::Bytes;
use walrus::journal::format::{
    encode_record, Kind, RecordHeader, RecordKey, ENTRY_TIME_BYTES, FORMAT_VERSION, HEADER_BYTES,
    UNKEYED_FORMAT_VERSION,
};
use walrus::journal::manifest::Manifest;
use walrus::journal::recovery::{scan, ScanLimits, ScanStart, Tail};
use walrus::journal::ring::{Geometry, MemRing};
use walrus::journal::sim::{forged_payload, MemLog, Sector, SIM_KEY, SIM_REPL_ID};
use walrus::journal::{Entry, IoBackendChoice, Journal, JournalConfig, OpenOptions, ReplayFrom};

const SEG: u64 = 64 * 1024;
const REPL_ID: [u8; 40] = *b"8c1b2f6e0a7d4c3b9e5f1a2d6c8b0e4f7a9c1d3e";
const FLUSHALL: &[u8] = b"*1\r\n$8\r\nFLUSHALL\r\n";

fn geo(segments: u32) -> Geometry {
    Geometry {
        segment_size_bytes: SEG,
        segments,
    }
}

fn small_log(n: u64, len: usize) -> MemLog {
    let mut log = MemLog::new(geo(4), 16 * 1024);
    for i in 1..=n {
        log.append(i * 1000, &vec![i as u8; len]).unwrap();
    }
    log.flush();
    log
}

/// A record as a client would plant it: well formed, of the right lap, epoch and LSN, but
/// sealed without the journal's key (with a guess, or in the unkeyed format).
fn planted(
    log: &MemLog,
    at: u64,
    lsn: u64,
    durable_hint: u64,
    version: u8,
    key: RecordKey,
) -> Vec<u8> {
    let h = RecordHeader {
        version,
        kind: Kind::Full,
        payload_len: FLUSHALL.len() as u32,
        epoch: log.epoch,
        seg_seq: log.geo.seg_seq(at),
        lsn,
        repl_offset_end: 999_999_999,
        durable_hint,
        repl_id: SIM_REPL_ID,
    };
    let mut rec = vec![0u8; HEADER_BYTES + FLUSHALL.len()];
    encode_record(key, &h, FLUSHALL, &mut rec);
    rec
}

fn replayed(log: &MemLog) -> Vec<(u64, Vec<u8>)> {
    let ring = MemRing {
        segments: log.ring.segments.clone(),
    };
    let sc = walrus::journal::recovery::Scanner::new(ring, log.geo, log.start, log.limits(0));
    walrus::journal::reader::EntryIter::new(sc, ReplayFrom::Lsn(0), u64::MAX)
        .map(|e| {
            let e = e.unwrap();
            (e.lsn, e.payload.to_vec())
        })
        .collect()
}

/// The two reproductions, reduced to the bytes they leave past the end of the log
/// (a value of an earlier lap): a planted record at the next block boundary with the next
/// LSN is not the log's continuation, and one claiming everything durable is not evidence
/// of corruption. The same record sealed with the journal's key is both: the key decides.
#[test]
fn a_planted_record_is_neither_continuation_nor_evidence() {
    for (version, key) in [
        (FORMAT_VERSION, RecordKey(!SIM_KEY.0)),
        (FORMAT_VERSION, RecordKey(0)),
        (UNKEYED_FORMAT_VERSION, RecordKey(0)),
    ] {
        let mut log = small_log(10, 300);
        let end = log.scan(SEG).end.end_pos;
        let next = walrus::journal::format::align_up(end);
        let rec = planted(&log, next, 11, 0, version, key);
        log.ring.write_at(log.geo, next, &rec);
        let evidence_at = next + 3 * 4096 + 17;
        let rec = planted(&log, evidence_at, u64::MAX, u64::MAX, version, key);
        log.ring.write_at(log.geo, evidence_at, &rec);
        let r = log.scan(2 * SEG);
        assert!(
            matches!(r.tail, Tail::End { .. }),
            "format {version}: planted record taken as evidence: {:?}",
            r.tail
        );
        assert_eq!(
            r.end.last_lsn(),
            10,
            "format {version}: planted record replayed"
        );
        assert!(replayed(&log).iter().all(|(_, p)| p != FLUSHALL));
    }
    // Control: sealed with the journal's own key, the same bytes are a record.
    let mut log = small_log(10, 300);
    let end = log.scan(SEG).end.end_pos;
    let next = walrus::journal::format::align_up(end);
    let rec = planted(&log, next, 11, 0, FORMAT_VERSION, SIM_KEY);
    log.ring.write_at(log.geo, next, &rec);
    assert_eq!(log.scan(SEG).end.last_lsn(), 11);
}

/// An ordinary crash tears the write of a value full of planted records: its header never
/// reached the disk, the rest did. The planted records (each claiming everything durable)
/// must not turn the torn tail into "corruption" that blocks every later start.
#[test]
fn planted_records_inside_a_torn_tail_do_not_block_the_restart() {
    let mut log = small_log(5, 200);
    let durable = log.durable_lsn;
    let rec_pos = log.entry_end();
    let seq = log.geo.seg_seq(rec_pos);
    log.append(99_000, &forged_payload(12_000, u64::MAX, seq, log.epoch))
        .unwrap();
    let writes = log.take_writes();
    let header_sectors = rec_pos / 512..=(rec_pos + HEADER_BYTES as u64) / 512;
    for w in &writes {
        let first = w.start_pos / 512;
        log.apply_sectors(w, |s| {
            if header_sectors.contains(&(first + s as u64)) {
                Sector::Old
            } else {
                Sector::New
            }
        });
    }
    let r = log
        .reopen_with(2 * SEG, false)
        .expect("a torn tail is not corruption");
    assert_eq!(r.end.last_lsn(), durable);
}

/// FIRST of one run and LAST of the next at the same LSN: one entry that never existed.
#[test]
fn fragments_of_two_runs_never_splice_into_one_entry() {
    let g = geo(3);
    let mut ring = MemRing::new(g);
    let record = |kind, epoch, fill: u8, len: usize, seg_pos: u64| {
        let h = RecordHeader {
            version: FORMAT_VERSION,
            kind,
            payload_len: len as u32,
            epoch,
            seg_seq: g.seg_seq(seg_pos),
            lsn: 1,
            repl_offset_end: 12_000,
            durable_hint: 0,
            repl_id: SIM_REPL_ID,
        };
        let mut rec = vec![0u8; HEADER_BYTES + len];
        encode_record(SIM_KEY, &h, &vec![fill; len], &mut rec);
        rec
    };
    let first = record(Kind::First, 1, b'1', 7900, 0);
    ring.write_at(g, 0, &first);
    let last = record(Kind::Last, 2, b'2', 4100, first.len() as u64);
    ring.write_at(g, first.len() as u64, &last);
    let start = ScanStart {
        pos: 0,
        lsn: 1,
        repl_id: [0; 40],
        repl_offset: 0,
        epoch: 0,
    };
    let limits = walrus::journal::recovery::ScanLimits {
        max_epoch: 2,
        ..MemLog::new(g, 16 * 1024).limits(SEG)
    };
    let r = scan(ring, g, start, limits).unwrap();
    assert_eq!(r.entries, 0, "spliced entry accepted: {:?}", r.end);
    assert!(r.dropped_partial_entry);
    assert!(matches!(r.tail, Tail::End { .. }), "{:?}", r.tail);
}

/// A device outside the torn-write model garbles the sector of a durable entry while the
/// next write rewrites its block. The next write's record reached the disk: it vouches for
/// the durable entry, so the damage is reported instead of cut silently.
#[test]
fn a_garbled_sector_under_a_durable_entry_is_reported_not_cut() {
    let mut log = MemLog::new(geo(4), 16 * 1024);
    // Fillers until the next entry starts early in a block, where it and the next one's
    // header fit, in different sectors.
    let mut lsn = 0;
    while !(512..1024).contains(&(log.entry_end() % 4096)) {
        lsn = log.append(lsn * 10, &[7]).unwrap();
        log.flush();
    }
    let x_pos = log.entry_end();
    let x = log.append(lsn * 10 + 1, &[b'x'; 1000]).unwrap();
    let w1 = log.take_writes();
    assert_eq!(w1.len(), 1);
    // Appended once the write of `x` is done but before it is published durable: the next
    // write continues its block, and its hint cannot cover `x` yet.
    log.landed(&w1[0]);
    log.append(lsn * 10 + 2, &[b'y'; 100]).unwrap();
    log.set_durable(x);
    let w2 = log.take_writes();
    assert_eq!(w2.len(), 1);
    assert!(
        w2[0].start_pos <= x_pos,
        "the write rewrites the block of x"
    );
    // A sector that holds only bytes of `x` (it starts in the sector before).
    let garbled = (x_pos - w2[0].start_pos) / 512 + 1;
    log.apply_sectors(&w2[0], |s| {
        if s as u64 == garbled {
            Sector::Garbage
        } else {
            Sector::New
        }
    });
    match log.scan(2 * SEG).tail {
        Tail::Corrupt(c) => assert_eq!(c.expected_lsn, x, "{c}"),
        t => panic!("acknowledged entry {x} lost silently: {t:?}"),
    }
}

fn engine_cfg(segments: u32) -> JournalConfig {
    JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::small_for_tests(SEG, segments)
    }
}

fn entry(lsn: u64, len: usize) -> Entry {
    Entry {
        repl_id: REPL_ID,
        repl_offset_end: lsn * 1000,
        payload: Bytes::from(
            (0..len)
                .map(|i| (lsn as usize * 31 + i) as u8)
                .collect::<Vec<u8>>(),
        ),
    }
}

/// Appends one entry at a time, each durable before the next: later records vouch for
/// earlier ones.
async fn append_all(j: &Journal, lsns: std::ops::RangeInclusive<u64>, len: usize) {
    append_each(j, lsns, |lsn| entry(lsn, len)).await
}

/// The same, with the entry each LSN gets.
async fn append_each(
    j: &Journal,
    lsns: std::ops::RangeInclusive<u64>,
    make: impl Fn(u64) -> Entry,
) {
    for lsn in lsns {
        let t = j.append(make(lsn)).await.unwrap();
        assert_eq!(t.lsn(), lsn);
        t.wait().await.unwrap();
    }
}

/// A MANIFEST copied in from another journal (another data directory's) seals none of this
/// ring's records with its key: recovery read that as a clean end at the first record, the
/// journal empty and its entries lost, and a scan (`verify`) said OK. Now both refuse it,
/// naming the file, before anything is written; with its own manifest back, the journal
/// opens with every entry.
#[tokio::test]
async fn another_journals_manifest_is_refused_not_read_as_an_empty_log() {
    let cfg = engine_cfg(4);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for (dir, len) in [(&a, 100), (&b, 300)] {
        let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
        append_all(&j, 1..=20, len).await;
        j.release_through_blocking(20).unwrap();
        append_all(&j, 21..=30, len).await;
        j.close().unwrap();
    }
    let manifest = a.path().join("MANIFEST");
    let own = std::fs::read(&manifest).unwrap();
    std::fs::copy(b.path().join("MANIFEST"), &manifest).unwrap();
    let foreign = std::fs::read(&manifest).unwrap();
    let refusals = [
        walrus::journal::open::scan_dir(a.path(), &cfg).err(),
        Journal::open(a.path(), &cfg).err(),
    ];
    for e in refusals {
        let e = e
            .expect("another journal's manifest must be refused")
            .to_string();
        assert!(
            e.contains(&format!(
                "{}: its record key seals none",
                manifest.display()
            )),
            "{e}"
        );
    }
    assert_eq!(
        std::fs::read(&manifest).unwrap(),
        foreign,
        "the manifest was written"
    );
    std::fs::write(&manifest, own).unwrap();
    let (j, rec) = Journal::open(a.path(), &cfg).unwrap();
    assert_eq!((rec.entries, rec.end.last_lsn()), (10, 30));
    j.close().unwrap();
}

/// The repair reproduction: bit rot in entry 30, a repair with a smaller look-ahead
/// than the service's, then a clean close, then fewer entries than were cut. Every later
/// open, with any look-ahead, is clean.
#[tokio::test]
async fn a_repaired_journal_opens_clean_forever() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = engine_cfg(4);
    {
        let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
        append_all(&j, 1..=120, 300).await;
    }
    // Rot one byte of entry 30's payload.
    let needle = entry(30, 300).payload;
    let seg0 = dir.path().join("seg-00000.wal");
    let mut bytes = std::fs::read(&seg0).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == &needle[..])
        .unwrap();
    bytes[at + 10] ^= 0x40;
    std::fs::write(&seg0, &bytes).unwrap();
    assert!(matches!(
        Journal::open(dir.path(), &cfg),
        Err(walrus::journal::JournalError::Corrupt(_))
    ));
    let repair_cfg = JournalConfig {
        recovery_lookahead_bytes: Some(4096),
        ..cfg.clone()
    };
    {
        let (_j, rec) = Journal::open_with(
            dir.path(),
            &repair_cfg,
            OpenOptions {
                accept_data_loss: true,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        assert_eq!(rec.end.last_lsn(), 29);
    }
    let open_everyway = |last| {
        for lookahead in [4096, 2 * SEG, 4 * SEG] {
            let cfg = JournalConfig {
                recovery_lookahead_bytes: Some(lookahead),
                ..cfg.clone()
            };
            let (j, rec) = Journal::open(dir.path(), &cfg)
                .unwrap_or_else(|e| panic!("look-ahead {lookahead}: refused after repair: {e}"));
            assert_eq!(rec.end.last_lsn(), last);
            drop(j);
        }
    };
    open_everyway(29);
    {
        let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
        append_all(&j, 30..=49, 300).await;
    }
    open_everyway(49);
}

/// Two maximum entries back to back: once the first is released, the second fits.
#[tokio::test]
async fn maximum_entries_back_to_back_never_stall_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = engine_cfg(4);
    let max = cfg.max_entry() as usize;
    let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
    let j = std::sync::Arc::new(j);
    append_all(&j, 1..=1, 10).await;
    for lsn in 2..=6 {
        let t = j
            .append(entry(lsn, max))
            .await
            .unwrap_or_else(|e| panic!("maximum entry {lsn} refused: {e}"));
        t.wait().await.unwrap();
        j.release_through(lsn).await.unwrap();
        // Released whole, the entry's replication id is still known (a checkpoint needs it).
        assert_eq!(j.repl_id_after(lsn).unwrap(), Some(REPL_ID));
    }
    drop(j);
    let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    assert_eq!(rec.end.last_lsn(), 6);
    assert_eq!(rec.entries, 0, "everything was released");
    append_all(&j, 7..=7, max).await;
}

/// Bit rot at the start of the largest entry: the first record that vouches for it lies a
/// whole entry later, and later still when the next entry was encoded before the large one
/// was durable. The default look-ahead reaches it; a shorter one cuts the damage silently.
#[tokio::test]
async fn damage_at_the_start_of_the_largest_entry_is_reported_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = engine_cfg(8);
    let max = cfg.max_entry() as usize;
    {
        let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
        append_all(&j, 1..=1, 10).await;
        let large = j.append(entry(2, max)).await.unwrap();
        // Encoded while the large entry is in flight: its hint cannot cover it.
        let next = j.append(entry(3, 10)).await.unwrap();
        large.wait().await.unwrap();
        next.wait().await.unwrap();
        append_all(&j, 4..=4, 10).await;
    }
    let needle = &entry(2, max).payload[..64];
    let seg0 = dir.path().join("seg-00000.wal");
    let mut bytes = std::fs::read(&seg0).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    bytes[at] ^= 0x40;
    std::fs::write(&seg0, &bytes).unwrap();
    match Journal::open(dir.path(), &cfg) {
        Err(walrus::journal::JournalError::Corrupt(c)) => assert_eq!(c.expected_lsn, 2, "{c}"),
        Err(e) => panic!("{e}"),
        Ok((_, rec)) => panic!("acknowledged entry 2 cut silently: {:?}", rec.tail),
    }
}

/// A copy of tests/fixtures/journal-format-1 to work on.
fn format1_journal() -> tempfile::TempDir {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journal-format-1");
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

/// The payloads of tests/fixtures/journal-format-1, a journal written by walrus before
/// record keys (3 segments of 64 KiB, entries 1..=60 of this shape, released through 54).
fn format1_payload(lsn: u64) -> Vec<u8> {
    let len = (lsn as usize * 7919) % 9000 + 1;
    (0..len).map(|i| (lsn as usize * 31 + i) as u8).collect()
}

fn format1_entry(lsn: u64) -> Entry {
    Entry {
        repl_id: REPL_ID,
        repl_offset_end: lsn * 1000,
        payload: Bytes::from(format1_payload(lsn)),
    }
}

fn assert_replays(j: &Journal, from: u64, to: u64) {
    let got: Vec<_> = j
        .replay(ReplayFrom::Lsn(0))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(got.first().map(|e| e.lsn), Some(from));
    assert_eq!(got.last().map(|e| e.lsn), Some(to));
    for e in got {
        assert_eq!(e.repl_offset_end, e.lsn * 1000);
        assert_eq!(&e.payload[..], &format1_payload(e.lsn)[..], "LSN {}", e.lsn);
    }
}

/// A journal of the format before record keys is read, upgraded at its first open for
/// writing (its records stay readable, new ones are keyed), and keeps working across laps.
#[tokio::test]
async fn a_format_1_journal_is_read_and_upgraded() {
    let dir = format1_journal();
    let cfg = engine_cfg(3);
    let before = Manifest::load(dir.path()).unwrap().unwrap();
    assert_eq!(before.layout_version, 1);
    assert!(before.record_key_hex.is_none());
    // Read-only scans (verify, inspect) read it as it is.
    let (_, report) = walrus::journal::open::scan_dir(dir.path(), &cfg).unwrap();
    assert_eq!(report.end.last_lsn(), 60);
    let end = report.end.end_pos;
    {
        let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
        assert_eq!(rec.end.last_lsn(), 60);
        assert_replays(&j, 55, 60);
        let m = Manifest::load(dir.path()).unwrap().unwrap();
        assert_eq!(m.layout_version, 3);
        assert_eq!(m.keyed_from_epoch, m.epoch);
        let j = std::sync::Arc::new(j);
        append_each(&j, 61..=64, format1_entry).await;
    }
    {
        // Old and new records side by side.
        let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
        assert_eq!(rec.end.last_lsn(), 64);
        assert_replays(&j, 55, 64);
        let j = std::sync::Arc::new(j);
        // Laps of the ring, releasing as it fills.
        for lsn in 65..=200 {
            let t = match j.append(format1_entry(lsn)).await {
                Ok(t) => t,
                Err(walrus::journal::JournalError::RingFull { .. }) => {
                    j.release_through(lsn - 1).await.unwrap();
                    j.append(format1_entry(lsn)).await.unwrap()
                }
                Err(e) => panic!("{e}"),
            };
            t.wait().await.unwrap();
        }
        assert!(
            j.status().head_pos > end + 2 * 3 * SEG,
            "the ring wrapped twice"
        );
    }
    let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    assert_eq!(rec.end.last_lsn(), 200);
    assert_replays(&j, rec.checkpoint.start_lsn, 200);
}

/// The review's reproduction: after the upgrade, a client's value holds a format 1 record
/// (no key needed) of the old epoch, for the block after the log's end, with the next LSN.
/// The write holding it tears: the sector with the entry's header stays old, the rest is
/// new. The log must end where it did, not replay the client's FLUSHALL.
#[tokio::test]
async fn a_format_1_record_in_a_value_after_the_upgrade_is_no_record() {
    let dir = format1_journal();
    let cfg = engine_cfg(3);
    let g = geo(3);
    let (_, report) = walrus::journal::open::scan_dir(dir.path(), &cfg).unwrap();
    let (x, next_lsn, old_epoch) = (
        report.end.end_pos,
        report.end.next_lsn,
        report.end.last_epoch,
    );
    let f = x.div_ceil(4096) * 4096;
    // Where the value starts: after its entry's header and time.
    let value_at = x + (HEADER_BYTES + ENTRY_TIME_BYTES) as u64;
    assert!(x % 4096 != 0 && value_at <= f, "fixture ends at {x}");
    let seg_path = dir.path().join(format!("seg-{:05}.wal", g.seg_index(x)));
    let sector_off = (g.seg_off(x) / 512 * 512) as usize;
    let old_sector = std::fs::read(&seg_path).unwrap()[sector_off..sector_off + 512].to_vec();
    let h = RecordHeader {
        version: UNKEYED_FORMAT_VERSION,
        kind: Kind::Full,
        payload_len: FLUSHALL.len() as u32,
        epoch: old_epoch,
        seg_seq: g.seg_seq(f),
        lsn: next_lsn,
        repl_offset_end: 999_999_999,
        durable_hint: 0,
        repl_id: REPL_ID,
    };
    let mut forged = vec![0u8; HEADER_BYTES + FLUSHALL.len()];
    encode_record(RecordKey(0), &h, FLUSHALL, &mut forged);
    let at = (f - value_at) as usize;
    let mut value = vec![b'v'; at + forged.len() + 100];
    value[at..at + forged.len()].copy_from_slice(&forged);
    {
        let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
        assert_eq!(rec.end.end_pos, x);
        let t = j
            .append(Entry {
                repl_id: REPL_ID,
                repl_offset_end: next_lsn * 1000,
                payload: Bytes::from(value),
            })
            .await
            .unwrap();
        t.wait().await.unwrap();
    }
    let mut bytes = std::fs::read(&seg_path).unwrap();
    bytes[sector_off..sector_off + 512].copy_from_slice(&old_sector);
    std::fs::write(&seg_path, &bytes).unwrap();
    let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    let replayed: Vec<_> = j
        .replay(ReplayFrom::Lsn(next_lsn))
        .unwrap()
        .map(|e| e.unwrap().payload)
        .collect();
    assert_eq!(rec.end.last_lsn(), next_lsn - 1, "replayed {replayed:?}");
}

/// Position and format of the first record of entry `lsn`, scanning `dir` as recovery does.
fn record_of(dir: &std::path::Path, lsn: u64) -> (u64, u8) {
    let m = Manifest::load(dir).unwrap().unwrap();
    let g = geo(m.segments);
    let mut sc = walrus::journal::recovery::Scanner::new(
        walrus::journal::ring::FileRing::open(dir, g).unwrap(),
        g,
        ScanStart::at(&m.checkpoint).unwrap(),
        ScanLimits::of(&m, engine_cfg(m.segments).lookahead_bytes()),
    );
    while let Some(r) = sc.next_record().unwrap() {
        if r.header.lsn == lsn {
            return (r.pos, r.header.version);
        }
    }
    panic!("no entry {lsn}");
}

/// A repair that cuts an upgraded journal inside its format 1 records: the next run's
/// keyed records, written where format 1 ones were, are the log (formats go by epoch, not
/// position), and nothing it acknowledged is lost at the next open.
#[tokio::test]
async fn a_repair_below_the_upgrade_point_keeps_the_next_runs_entries() {
    let dir = format1_journal();
    let cfg = engine_cfg(3);
    {
        let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
        append_each(&j, 61..=63, format1_entry).await;
    }
    // Rot a byte of format 1 entry 57, vouched for by 58..63.
    let (pos, version) = record_of(dir.path(), 57);
    assert_eq!(version, UNKEYED_FORMAT_VERSION);
    let g = geo(3);
    let path = dir.path().join(format!("seg-{:05}.wal", g.seg_index(pos)));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(g.seg_off(pos) + HEADER_BYTES as u64 + 10) as usize] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let repaired = OpenOptions {
        accept_data_loss: true,
        ..OpenOptions::default()
    };
    {
        let (j, rec) = Journal::open_with(dir.path(), &cfg, repaired).unwrap();
        assert_eq!(rec.end.last_lsn(), 56, "cut at the damaged format 1 entry");
        append_all(&j, 57..=61, 500).await;
    }
    let (_j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    assert_eq!(
        rec.end.last_lsn(),
        61,
        "entries acknowledged after the repair were lost"
    );
}

/// A full disk right after `walrus journal init`: the journal's files are all allocated in
/// advance, and its manifest is replaced without allocating, so walrus still starts (the
/// epoch bump at open), journals and releases (the checkpoint pointer) when not one block
/// is free.
#[tokio::test]
async fn a_full_disk_neither_stops_the_start_nor_releases() {
    let Some(fs) = common::Tmpfs::mount(2, false) else {
        return;
    };
    let dir = fs.path().join("journal");
    let cfg = JournalConfig {
        direct_io: walrus::journal::DirectIo::Off,
        ..engine_cfg(3)
    };
    // What `walrus journal init` does, before the first start.
    walrus::journal::open::initialize(&dir, &cfg, &mut |_, _| {}).unwrap();
    // Fill the file system to the last byte.
    let mut fill = std::fs::File::create(fs.path().join("fill")).unwrap();
    let block = vec![0xAA; 4096];
    loop {
        use std::io::Write;
        match fill.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let _ = fill.sync_all();
    assert_eq!(
        std::fs::write(fs.path().join("probe"), b"x").map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOSPC)),
        "the disk is full"
    );
    for round in 0..3u64 {
        let (j, rec) = Journal::open(&dir, &cfg)
            .unwrap_or_else(|e| panic!("round {round}: open on a full disk: {e}"));
        let first = rec.end.next_lsn;
        let j = std::sync::Arc::new(j);
        append_all(&j, first..=first + 4, 300).await;
        j.release_through(first + 2)
            .await
            .unwrap_or_else(|e| panic!("round {round}: release on a full disk: {e}"));
    }
}

/// The largest entry a configuration allows, where a configuration allows any: found by
/// bisection over `validate()`.
fn max_valid_entry(cfg: &JournalConfig) -> Option<u64> {
    let (mut lo, mut hi) = (0u64, cfg.segment_size_bytes * u64::from(cfg.segments));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let c = JournalConfig {
            max_entry_bytes: Some(mid),
            ..cfg.clone()
        };
        if c.validate().is_ok() {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    (lo > 0).then_some(lo)
}

/// Across geometries, write sizes and pool sizes the configuration accepts, and ends of
/// the log anywhere in a segment: with everything released and every buffer free, the
/// largest entry allowed is admitted, never `Busy` (which `append` would wait on forever)
/// nor `RingFull`.
#[test]
fn the_largest_entry_allowed_is_always_admitted_once_everything_is_released() {
    use walrus::journal::batcher::{resume_tail, Batcher, BatcherInit};
    for s in [64u64 << 10, 256 << 10, 1 << 20] {
        for n in [3u32, 4, 8, 32, 200] {
            for w in [8u64 << 10, 16 << 10, 64 << 10] {
                for inflight in [1u32, 4] {
                    let cfg = JournalConfig {
                        segment_size_bytes: s,
                        segments: n,
                        max_write_bytes: w,
                        max_in_flight_writes: inflight,
                        write_buffers: inflight + 1,
                        max_entry_bytes: Some(1),
                        ..JournalConfig::default()
                    };
                    // Rings up to 64 MiB keep the test quick in debug builds.
                    if cfg.validate().is_err() || s * u64::from(n) > 64 << 20 {
                        continue;
                    }
                    let max = max_valid_entry(&cfg).unwrap();
                    // Unset, the limit is the largest the ring allows (these rings are
                    // smaller than the default's), so no small ring needs it set by hand.
                    let derived = JournalConfig {
                        max_entry_bytes: None,
                        ..cfg.clone()
                    };
                    derived.validate().unwrap();
                    assert_eq!(derived.max_entry(), max, "S={s} N={n} W={w}");
                    let payload = vec![7u8; max as usize];
                    let g = Geometry {
                        segment_size_bytes: s,
                        segments: n,
                    };
                    for o in [0u64, 100, 4096, s - 4096 - 50, s - 200, s - 96] {
                        let end = 5 * s + o;
                        let mut b = Batcher::new(BatcherInit {
                            geo: g,
                            epoch: 1,
                            key: SIM_KEY,
                            next_lsn: 1,
                            end_pos: end,
                            tail: resume_tail(g, end).map_or(vec![], |(_, n)| vec![0; n]),
                            head_pos: end,
                            last_repl_id: [0; 40],
                            last_repl_offset: 0,
                            last_epoch: 0,
                            starts: vec![],
                            write_buffers: cfg.write_buffers as usize,
                            max_write_bytes: w as usize,
                            max_entry_bytes: max,
                        });
                        if let Err(e) = b.append(&[0; 40], max, &payload, 0, 0) {
                            panic!(
                                "S={s} N={n} W={w} buffers={} entry {max} at offset {o}: {e:?}",
                                inflight + 1
                            );
                        }
                    }
                }
            }
        }
    }
}
