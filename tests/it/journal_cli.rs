//! `walrus journal init|inspect|verify|repair` against a real journal, including mid-log
//! corruption: verify reports where, open refuses, repair cuts with an explicit flag.

use crate::common;
use common::{append_numbered_entries, flip_journal_byte};

use std::process::Command;

use bytes::Bytes;
use walrus::journal::{Entry, IoBackendChoice, Journal, JournalConfig, JournalError, ReplayFrom};

fn walrus(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_walrus"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn init_inspect_verify_corruption_repair() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("j");
    let d = dir.to_str().unwrap();
    let (code, out, _) = walrus(&[
        "journal",
        "init",
        "--dir",
        d,
        "--segment-size-bytes",
        "65536",
        "--segments",
        "4",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("4 segments of 65536 bytes (4 created now)"),
        "{out}"
    );
    let (code, _, err) = walrus(&[
        "journal",
        "init",
        "--dir",
        d,
        "--segment-size-bytes",
        "65536",
        "--segments",
        "5",
    ]);
    // Another geometry over an existing journal: a mistake to fix (exit 2), not a retry.
    assert_eq!(code, 2);
    assert!(err.contains("segments = 4"), "{err}");

    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::small_for_tests(65536, 4)
    };
    let (j, _) = Journal::open(&dir, &cfg).unwrap();
    let positions = append_numbered_entries(&j).await;
    j.close().unwrap();

    let (code, out, _) = walrus(&["journal", "verify", "--dir", d]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("OK: 40 entries, LSN 1..=40"), "{out}");
    // --dir takes walrus's data directory too, as export-aof and verify --data-dir do.
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::os::unix::fs::symlink(&dir, data.join("journal")).unwrap();
    for sub in ["verify", "inspect"] {
        let (code, out, err) = walrus(&["journal", sub, "--dir", data.to_str().unwrap()]);
        assert_eq!(code, 0, "{sub}: {out}{err}");
        assert!(out.contains("LSN 1..="), "{sub}: {out}");
    }
    let (code, out, _) = walrus(&["journal", "inspect", "--dir", d]);
    assert_eq!(code, 0);
    assert!(
        out.contains("durable end: LSN 40") && out.contains("LSN 1..="),
        "{out}"
    );
    assert!(out.contains("free: empty"), "{out}");
    let id = walrus::journal::manifest::Manifest::load(&dir)
        .unwrap()
        .unwrap()
        .data_dir_id
        .expect("a journal made now has an identity");
    assert!(out.contains(&format!("data directory: {id}")), "{out}");

    // Flip a byte inside entry 11 (entry N starts at the write position after entry N-1).
    flip_journal_byte(&dir, positions[9] + 200);

    let (code, _, err) = walrus(&["journal", "verify", "--dir", d]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("expected LSN 11") && err.contains("segment file 0"),
        "{err}"
    );
    match Journal::open(&dir, &cfg) {
        Err(JournalError::Corrupt(c)) => assert_eq!(c.expected_lsn, 11),
        other => panic!("open must refuse corruption, got {:?}", other.map(|_| ())),
    }
    let (code, _, err) = walrus(&["journal", "repair", "--dir", d]);
    assert_eq!(code, 1);
    assert!(err.contains("--accept-data-loss"), "{err}");
    let (code, out, err) = walrus(&["journal", "repair", "--dir", d, "--accept-data-loss"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("log now ends at LSN 10"), "{out}");
    let (code, out, _) = walrus(&["journal", "verify", "--dir", d]);
    assert_eq!(code, 0, "{out}");
    let (j, rec) = Journal::open(&dir, &cfg).unwrap();
    assert_eq!(rec.end.last_lsn(), 10);
    assert_eq!(j.replay(ReplayFrom::Lsn(1)).unwrap().count(), 10);
    let t = j
        .try_append(&Entry {
            repl_id: [b'r'; 40],
            repl_offset_end: 11_000,
            payload: Bytes::from_static(b"x"),
        })
        .unwrap();
    assert_eq!(t.lsn(), 11);
    t.wait().await.unwrap();
}
