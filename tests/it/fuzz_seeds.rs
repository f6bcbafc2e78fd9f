//! The fuzz targets' checks, on stable: every committed seed (`fuzz/seeds/<target>/`) and
//! every crash input kept from a fuzzing run (`fuzz/regressions/<target>/`) goes through the
//! same check the fuzzer runs (`fuzz/harness/`), so a regression fails `cargo test` without
//! nightly. docs/fuzzing.md says what each target checks and how to fuzz.
//!
//! The seeds that walrus's own code writes (journal records, both manifests) are generated
//! here, and checked to be what the code writes today: a format change fails this test until
//! the seeds are rewritten (`WALRUS_WRITE_SEEDS=1 cargo test --test it fuzz_seeds::`). The others
//! come from a real Valkey (`fuzz/capture_seeds.py`).

use crate::harness;

use std::path::{Path, PathBuf};
use walrus::checkpoint::manifest::{Checkpoint, Recorded};
use walrus::journal::format::{encode_record, Kind, RecordHeader, FORMAT_VERSION, HEADER_BYTES};
use walrus::journal::format::{RecordKey, UNKEYED_FORMAT_VERSION};
use walrus::journal::manifest::{DataDirId, Manifest};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `dir/<target>/`, for every target that has such a directory.
fn inputs(dir: &str) -> Vec<(&'static str, harness::Check, PathBuf)> {
    let mut out = Vec::new();
    for &(target, check) in harness::TARGETS {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
        files.sort();
        out.extend(files.into_iter().map(|f| (target, check, f)));
    }
    out
}

/// Runs every input through its target's check; the failures are named together.
fn replay(dir: &str) -> usize {
    let inputs = inputs(dir);
    let failed: Vec<String> = inputs
        .iter()
        .filter_map(|(target, check, file)| {
            let data = std::fs::read(file).unwrap();
            std::panic::catch_unwind(|| check(&data))
                .is_err()
                .then(|| format!("{target}: {}", file.display()))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "inputs failing their checks:\n{}",
        failed.join("\n")
    );
    inputs.len()
}

#[test]
fn every_seed_passes_its_targets_checks() {
    assert!(
        replay("seeds") >= harness::TARGETS.len(),
        "the seeds are missing"
    );
}

#[test]
fn every_input_that_once_failed_passes_now() {
    replay("regressions");
}

/// The list of targets, the fuzz crate's target files, and the seed and regression
/// directories name the same targets, and every target has seeds of its own.
#[test]
fn every_target_is_fuzzable_and_seeded() {
    let names = |dir: &Path, suffix: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        v.retain(|n| n.ends_with(suffix));
        v.iter_mut()
            .for_each(|n| n.truncate(n.len() - suffix.len()));
        v.sort();
        v
    };
    let targets: Vec<String> = harness::TARGETS.iter().map(|t| t.0.to_string()).collect();
    assert_eq!(names(&fuzz_dir().join("fuzz_targets"), ".rs"), targets);
    let cargo = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for t in &targets {
        assert!(
            cargo.contains(&format!("name = \"{t}\"")),
            "fuzz/Cargo.toml lacks {t}"
        );
        assert!(
            !names(&fuzz_dir().join("seeds").join(t), "").is_empty(),
            "no seeds for {t}"
        );
    }
    for dir in ["seeds", "regressions"] {
        for d in names(&fuzz_dir().join(dir), "") {
            assert!(targets.contains(&d), "fuzz/{dir}/{d} is no target");
        }
    }
}

#[test]
fn seeds_written_by_walrus_are_current() {
    let write = std::env::var_os("WALRUS_WRITE_SEEDS").is_some();
    let mut stale = Vec::new();
    for (target, name, bytes) in walrus_seeds() {
        let path = fuzz_dir().join("seeds").join(target).join(name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else if std::fs::read(&path).ok() != Some(bytes) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "seeds differ from what walrus writes now (WALRUS_WRITE_SEEDS=1 rewrites them):\n{}",
        stale.join("\n")
    );
}

/// The seeds made by walrus's encoders, and the recovery target's hand-made programs.
fn walrus_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut out = Vec::new();
    let key = RecordKey(0x0123_4567_89ab_cdef);
    let mut m = Manifest::new(64 << 10, 3, key);
    out.push(("journal_manifest", "new", m.render().into_bytes()));
    m.epoch = 7;
    m.resume_at(3 << 16);
    m.checkpoint.released_through_lsn = 41;
    m.checkpoint.start_pos = 1 << 17;
    m.checkpoint.start_lsn = 42;
    m.checkpoint.prev_repl_id_hex = walrus::journal::manifest::hex_encode(&[0xab; 40]);
    m.checkpoint.prev_repl_offset = 123_456;
    m.checkpoint.prev_epoch = 6;
    out.push((
        "journal_manifest",
        "after-a-checkpoint",
        m.render().into_bytes(),
    ));
    let mut untimed = m.clone();
    untimed.layout_version = 2;
    out.push((
        "journal_manifest",
        "layout-2",
        untimed.render().into_bytes(),
    ));
    let mut unkeyed = m.clone();
    unkeyed.layout_version = 1;
    unkeyed.record_key_hex = None;
    unkeyed.resumed_at_pos = None;
    out.push((
        "journal_manifest",
        "layout-1",
        unkeyed.render().into_bytes(),
    ));
    unkeyed.epoch += 1;
    unkeyed.resume_at(5 << 16);
    unkeyed.upgrade(|| Ok(key)).unwrap();
    out.push((
        "journal_manifest",
        "upgraded",
        unkeyed.render().into_bytes(),
    ));
    let identity = DataDirId::try_from("0123456789abcdef0123456789abcdef".to_string()).unwrap();
    let mut identified = m.clone();
    identified.data_dir_id = Some(identity.clone());
    out.push((
        "journal_manifest",
        "with-identity",
        identified.render().into_bytes(),
    ));
    // Padded to a block with newlines, as `replace_file` leaves it.
    let mut padded = m.render().into_bytes();
    padded.resize(4096, b'\n');
    out.push(("journal_manifest", "padded", padded));

    let c = Checkpoint {
        file: format!("checkpoint-{}-1234.rdb", "a".repeat(40)),
        replid: "a".repeat(40),
        offset: 1234,
        size: 279,
        crc64: 0xddf8_81e7_1bd6_a1ab,
        from_lsn: 42,
        rdb_version: Some(80),
        written_by: Some("Valkey 9.1.2".into()),
        newest_server: None,
        time_ms: Some(1_796_332_725_250),
    };
    out.push(("checkpoint_manifest", "current", c.render().into_bytes()));
    let made = Recorded {
        data_dir_id: Some(identity.clone()),
        checkpoint: None,
    };
    out.push(("checkpoint_manifest", "made", made.render().into_bytes()));
    let identified = Recorded {
        data_dir_id: Some(identity),
        checkpoint: Some(c.clone()),
    };
    out.push((
        "checkpoint_manifest",
        "with-identity",
        identified.render().into_bytes(),
    ));
    let upgraded = Checkpoint {
        written_by: Some("Valkey 8.1.8".into()),
        newest_server: Some("Valkey 9.1.2".into()),
        rdb_version: Some(11),
        ..c.clone()
    };
    out.push((
        "checkpoint_manifest",
        "newer-server",
        upgraded.render().into_bytes(),
    ));
    let old = Checkpoint {
        rdb_version: None,
        written_by: None,
        time_ms: None,
        ..c
    };
    out.push((
        "checkpoint_manifest",
        "before-formats",
        old.render().into_bytes(),
    ));

    let record = |version, kind, payload: &[u8]| {
        let h = RecordHeader {
            version,
            kind,
            payload_len: payload.len() as u32,
            epoch: 3,
            seg_seq: 7,
            lsn: 42,
            repl_offset_end: 1000,
            durable_hint: 40,
            repl_id: *b"70e03b3fce3a3c8a1747c5e25749ff471bca3225",
        };
        let mut out = vec![0u8; HEADER_BYTES + payload.len()];
        encode_record(harness::record::KEY, &h, payload, &mut out);
        out
    };
    let set = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
    out.push(("record", "full", record(FORMAT_VERSION, Kind::Full, set)));
    out.push((
        "record",
        "first-fragment",
        record(FORMAT_VERSION, Kind::First, &set[..10]),
    ));
    out.push((
        "record",
        "last-fragment",
        record(FORMAT_VERSION, Kind::Last, &set[10..]),
    ));
    out.push((
        "record",
        "unkeyed",
        record(UNKEYED_FORMAT_VERSION, Kind::Full, set),
    ));
    let mut in_block = record(FORMAT_VERSION, Kind::Full, set);
    in_block.resize(4096, 0);
    out.push(("record", "full-then-zeros", in_block));
    out.push((
        "record",
        "empty-payload",
        record(FORMAT_VERSION, Kind::Full, b""),
    ));

    // `journal::sim::fuzz_recovery` programs: (size, flags) pairs of appends, 0xFF, then
    // (kind, position, value) damages.
    let appends: &[u8] = &[0, 10, 0, 11, 1, 0, 2, 2, 0, 64, 0xFE, 0x3F, 0, 9];
    let with = |damage: &[u8]| [appends, &[0xFF, 0], damage].concat();
    out.push(("recovery", "appends", with(&[])));
    out.push(("recovery", "byte-written", with(&[0, 0, 0, 0x70, 0xAB])));
    out.push(("recovery", "zeroed-range", with(&[1, 0, 0x10, 0, 0x20])));
    out.push(("recovery", "junk-record", with(&[2, 0, 0x20, 0, 7])));
    out.push((
        "recovery",
        "forged-values",
        [2, 2, 0, 250, 1, 6, 0xFF, 0].to_vec(),
    ));
    out
}
