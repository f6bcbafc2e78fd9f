//! Compact rings ([`super::compact`]) cut, read, refused when cut shorter, and filled out.

use super::format::BLOCK_BYTES;
use super::manifest::Manifest;
use super::open::{cut, scan_dir};
use super::ring::segment_path;
use super::JournalConfig;
use super::{Entry, Journal};
use std::path::Path;

const SEGMENT: u64 = 64 * 1024;

fn cfg() -> JournalConfig {
    JournalConfig::small_for_tests(SEGMENT, 4)
}

/// A sparse journal of `n` entries of 1000 bytes in `dir`, closed: a backup's copy.
fn written(dir: &Path, n: u64) {
    let sparse = crate::journal::OpenOptions {
        sparse: true,
        ..Default::default()
    };
    let (j, _) = Journal::open_with(dir, &cfg(), sparse).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for i in 1..=n {
            let entry = Entry {
                repl_id: [b'a'; 40],
                repl_offset_end: i * 1000,
                payload: bytes::Bytes::from(vec![b'x'; 1000]),
            };
            j.append(entry).await.unwrap().wait().await.unwrap();
        }
    });
    j.close().unwrap();
}

fn lens(dir: &Path) -> Vec<u64> {
    (0..4)
        .map(|i| std::fs::metadata(segment_path(dir, i)).unwrap().len())
        .collect()
}

#[test]
fn a_cut_ring_keeps_its_log_reads_whole_and_is_filled_out_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // About 70 KB: the log ends in the second segment.
    written(dir, 70);
    let (_, before) = scan_dir(dir, &cfg()).unwrap();
    let kept = cut(dir).unwrap();
    let end = before.end.end_pos;
    assert_eq!(kept, end.next_multiple_of(BLOCK_BYTES as u64));
    assert_eq!(lens(dir), [SEGMENT, kept - SEGMENT, 0, 0]);
    let (m, after) = scan_dir(dir, &cfg()).unwrap();
    assert_eq!(m.compact_end_pos, Some(end));
    assert_eq!((after.entries, after.end), (70, before.end));

    // A start interrupted while it filled the ring out left some files longer: the next
    // one finds the mark and finishes.
    for (i, len) in [(2, SEGMENT / 2), (3, SEGMENT)] {
        std::fs::write(segment_path(dir, i), vec![0u8; len as usize]).unwrap();
    }
    assert_eq!(scan_dir(dir, &cfg()).unwrap().1.end, before.end);
    let (j, recovered) = Journal::open(dir, &cfg()).unwrap();
    assert_eq!(recovered.entries, 70);
    j.close().unwrap();
    assert_eq!(lens(dir), [SEGMENT; 4]);
    assert_eq!(Manifest::load(dir).unwrap().unwrap().compact_end_pos, None);
}

#[test]
fn a_cut_ring_cut_shorter_is_refused_not_read_as_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    written(dir, 70);
    cut(dir).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(segment_path(dir, 1))
        .unwrap();
    f.set_len(BLOCK_BYTES as u64).unwrap();
    for refused in [
        scan_dir(dir, &cfg()).map(drop),
        Journal::open(dir, &cfg()).map(drop),
    ] {
        let why = refused.unwrap_err().to_string();
        assert!(why.contains("cut short or changed"), "{why}");
    }
    // Nor filled out: the evidence stays as it is.
    assert_eq!(lens(dir)[1], BLOCK_BYTES as u64);
}
