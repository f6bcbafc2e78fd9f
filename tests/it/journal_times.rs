//! The time each journal entry carries (format 3): stamped when walrus journals it, kept by
//! copies, read back by replay; entries of journals written before times (layout 2, the
//! fixture tests/fixtures/data-dir-33285bf) read as untimed, and such a journal upgraded at
//! its first open for writing.

use bytes::Bytes;
use walrus::journal::format::{Kind, ENTRY_TIME_BYTES, HEADER_BYTES};
use walrus::journal::manifest::Manifest;
use walrus::journal::reader::{EntryIter, ReplayEntry};
use walrus::journal::recovery::Scanner;
use walrus::journal::ring::{Geometry, MemRing};
use walrus::journal::sim::MemLog;
use walrus::journal::{Entry, IoBackendChoice, Journal, JournalConfig, ReplayFrom};
use walrus::units::time::now_ms;

const SEG: u64 = 64 * 1024;
const REPL_ID: [u8; 40] = *b"8c1b2f6e0a7d4c3b9e5f1a2d6c8b0e4f7a9c1d3e";

fn cfg(segments: u32) -> JournalConfig {
    JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::small_for_tests(SEG, segments)
    }
}

fn entry(offset_end: u64, len: usize) -> Entry {
    Entry {
        repl_id: REPL_ID,
        repl_offset_end: offset_end,
        payload: Bytes::from(vec![b'x'; len]),
    }
}

fn replayed(j: &Journal) -> Vec<ReplayEntry> {
    j.replay(ReplayFrom::Lsn(0))
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
}

/// Appends are stamped with the wall clock when they are journaled, never earlier than the
/// run's last stamp; a copy's given time is kept, and 0 reads back as unknown. The time is
/// not part of the payload or of the offsets.
#[tokio::test]
async fn entries_carry_the_time_they_were_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), &cfg(4)).unwrap();
    let before = now_ms();
    for i in 1..=20u64 {
        j.append(entry(i * 100, 100)).await.unwrap();
    }
    let after = now_ms();
    // A copy keeps its entries' times (and unknown stays unknown): a later stamp.
    let given = after + 3_600_000;
    j.append_at(entry(2_100, 100), given).await.unwrap();
    // The clock "went back": a stamp below the run's last is raised to it.
    j.append_at(entry(2_200, 100), given - 5).await.unwrap();
    j.settled().await.unwrap();
    let got = replayed(&j);
    assert_eq!(got.len(), 22);
    let mut last = 0;
    for e in &got[..20] {
        let t = e.time_ms.expect("a time");
        assert!(
            (before..=after).contains(&t),
            "{t} outside {before}..={after}"
        );
        assert!(t >= last, "times went back: {last} then {t}");
        last = t;
        assert_eq!(e.payload.len(), 100);
        assert_eq!(e.repl_offset_end, e.lsn * 100);
    }
    assert_eq!(got[20].time_ms, Some(given));
    assert_eq!(got[21].time_ms, Some(given));
    drop(j);
    let copy = tempfile::tempdir().unwrap();
    let (c, _) = Journal::open(copy.path(), &cfg(4)).unwrap();
    c.append_at(entry(100, 10), 0).await.unwrap();
    c.settled().await.unwrap();
    assert_eq!(replayed(&c)[0].time_ms, None);
}

/// The time is the first bytes of an entry, so an entry cut into fragments may have some of
/// them in its FIRST record and the rest in the next: every split comes back whole.
#[test]
fn a_time_split_across_fragments_reads_back_whole() {
    let geo = Geometry {
        segment_size_bytes: SEG,
        segments: 4,
    };
    let buffer = 16 * 1024u64;
    for k in 1..=ENTRY_TIME_BYTES as u64 + 1 {
        let mut log = MemLog::new(geo, buffer as usize);
        // Entry 1 leaves a header and k bytes of its buffer for entry 2, larger than a
        // buffer: its FIRST record holds k bytes of its stored bytes.
        let one = buffer - 2 * HEADER_BYTES as u64 - ENTRY_TIME_BYTES as u64 - k;
        log.append(one, &vec![1; one as usize]).unwrap();
        let two = 40_000u64;
        log.append(one + two, &vec![2; two as usize]).unwrap();
        log.flush();
        let ring = || MemRing {
            segments: log.ring.segments.clone(),
        };
        let mut sc = Scanner::new(ring(), geo, log.start, log.limits(0));
        let mut first = None;
        while let Some(r) = sc.next_record().unwrap() {
            if r.header.kind == Kind::First {
                first = Some(r.payload.len() as u64);
            }
        }
        assert_eq!(first, Some(k), "entry 2's FIRST record");
        let sc = Scanner::new(ring(), geo, log.start, log.limits(0));
        let got: Vec<_> = EntryIter::new(sc, ReplayFrom::Lsn(0), u64::MAX)
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(got.len(), 2, "k = {k}");
        assert_eq!(got[1].time_ms, Some(one + two), "k = {k}");
        assert_eq!(&got[1].payload[..], &vec![2; two as usize][..], "k = {k}");
    }
}

/// A copy of the journal of tests/fixtures/data-dir-33285bf: a data directory written by
/// walrus at commit 33285bf, before entries carried their time (layout 2, format 2 records),
/// in managed mode with a ring of 4 segments of 64 KiB: `SET key:N value-N` for N in 0..30,
/// `walrus checkpoint` (which released the journal through LSN 31), N in 30..60,
/// `FLUSHALL`, `SET after:N v-N` for N in 0..10, then SIGTERM. The journal holds LSN 32..=72.
fn layout_2_journal() -> tempfile::TempDir {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/data-dir-33285bf/journal");
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

/// A journal written before times is read as it is (its entries untimed), and upgraded at
/// its first open for writing: its entries stay untimed and readable, new ones are timed,
/// across reopens.
#[tokio::test]
async fn a_journal_of_layout_2_is_read_and_upgraded() {
    let dir = layout_2_journal();
    let cfg = cfg(4);
    let (_, report) = walrus::journal::open::scan_dir(dir.path(), &cfg).unwrap();
    assert_eq!(report.end.last_lsn(), 72);
    let layout = || Manifest::load(dir.path()).unwrap().unwrap().layout_version;
    assert_eq!(layout(), 2, "a read-only scan changes nothing");
    let old: Vec<_> = walrus::journal::open::replay_dir(dir.path(), &cfg, ReplayFrom::Lsn(0))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(
        (old.first().map(|e| e.lsn), old.len()),
        (Some(32), 41),
        "LSN 32..=72"
    );
    assert!(old.iter().all(|e| e.time_ms.is_none()));
    let flushes = old
        .iter()
        .filter(|e| e.payload.windows(8).any(|w| w == b"FLUSHALL"))
        .count();
    assert_eq!(flushes, 1);
    let end = old.last().unwrap().repl_offset_end;
    let started = now_ms();
    {
        let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
        assert_eq!(rec.end.last_lsn(), 72);
        assert_eq!(layout(), 3, "upgraded at the first open for writing");
        let id = rec.end.last_repl_id;
        for i in 1..=3u64 {
            let e = Entry {
                repl_id: id,
                ..entry(end + i * 10, 10)
            };
            j.append(e).await.unwrap();
        }
        j.settled().await.unwrap();
    }
    let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    assert_eq!(rec.end.last_lsn(), 75);
    let all = replayed(&j);
    assert_eq!(all.len(), 44);
    for (e, o) in all.iter().zip(&old) {
        assert_eq!((e.lsn, &e.payload, e.time_ms), (o.lsn, &o.payload, None));
    }
    for e in &all[41..] {
        assert!(e.time_ms.is_some_and(|t| t >= started), "{e:?}");
        assert_eq!(
            e.repl_offset_end - e.payload.len() as u64,
            end + (e.lsn - 73) * 10
        );
    }
}
