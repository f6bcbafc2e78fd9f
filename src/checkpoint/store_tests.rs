use super::*;
use crate::journal::manifest::seal;

/// The identity the tests' data directories have.
pub(crate) fn id() -> DataDirId {
    DataDirId::try_from("0123456789abcdef0123456789abcdef".to_string()).unwrap()
}

/// The store in `dir`, of the tests' data directory.
pub(crate) fn open(dir: &Path) -> Store {
    Store::open(dir, &id()).unwrap()
}

pub(crate) fn rdb_bytes(body: &[u8]) -> Vec<u8> {
    let mut d = crate::valkey::rdb::RdbDigest::default();
    d.update(body);
    d.update(&[0; 8]);
    let crc = d.finish().unwrap().crc64;
    let mut v = body.to_vec();
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// An RDB of `body` stored as the checkpointer stores one (also for the checkpointer's
/// own tests).
pub(crate) fn stored(store: &Store, replid: &str, offset: u64, body: &[u8]) -> StoredRdb {
    let path = store.path_for(replid, offset).unwrap();
    let bytes = rdb_bytes(body);
    // As `rdb_file::receive` does: the reserved temporary file becomes the RDB.
    let tmp = path.with_extension("rdb.tmp");
    std::fs::write(&tmp, &bytes).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let sum = rdb_file::sum_file(&path).unwrap();
    StoredRdb {
        path,
        bytes: sum.bytes,
        crc64: sum.crc64,
        version: sum.version,
        eof_mark: false,
    }
}

#[test]
fn record_replaces_verify_detects_damage_open_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    assert_eq!(store.current().unwrap(), None);
    let a = "a".repeat(40);
    let first = stored(&store, &a, 10, b"REDIS0011first");
    let before = crate::units::time::now_ms();
    let c1 = store.record(&first, "Valkey 9.1.2", &a, 10, 1).unwrap();
    let after = crate::units::time::now_ms();
    assert!(c1.time_ms.is_some_and(|t| (before..=after).contains(&t)));
    assert_eq!(store.current().unwrap(), Some(c1.clone()));
    assert_eq!(store.verify(&c1).unwrap(), 11);
    assert_eq!(c1.rdb_version, Some(11));
    let second = stored(&store, &a, 99, b"REDIS0011second");
    let c2 = store.record(&second, "Valkey 9.1.2", &a, 99, 7).unwrap();
    assert!(
        !first.path.exists(),
        "the older RDB goes once a newer one is recorded"
    );
    assert_eq!(store.current().unwrap().unwrap().from_lsn, 7);
    // A flipped bit is caught, naming the file.
    let mut bytes = std::fs::read(&second.path).unwrap();
    bytes[3] ^= 0x10;
    std::fs::write(&second.path, &bytes).unwrap();
    let err = store.verify(&c2).unwrap_err().to_string();
    assert!(err.contains(&c2.file), "{err}");
    // Leftovers of a crash: a temp file and an unrecorded RDB.
    std::fs::write(tmp.path().join("x.rdb.tmp"), b"half").unwrap();
    let orphan = stored(&store, &a, 200, b"REDIS0011orphan");
    let reopened = open(tmp.path());
    assert!(!tmp.path().join("x.rdb.tmp").exists() && !orphan.path.exists());
    assert!(second.path.exists());
    assert_eq!(reopened.current().unwrap(), Some(c2));
    // A damaged manifest is an error, never "no checkpoint".
    let m = tmp.path().join(CHECKPOINT_FILE);
    let text = std::fs::read_to_string(&m)
        .unwrap()
        .replace("offset = 99", "offset = 98");
    std::fs::write(&m, text).unwrap();
    assert!(matches!(
        reopened.current(),
        Err(StoreError::Manifest { .. })
    ));
}

/// The manifest is written with the data directory's identity before there is any
/// checkpoint, and keeps it in every record; an RDB is removed only on a manifest's word.
#[test]
fn the_manifest_carries_the_identity_and_rdbs_go_only_on_its_word() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = || Store::manifest(tmp.path()).unwrap();
    let store = open(tmp.path());
    let empty = Recorded {
        data_dir_id: Some(id()),
        checkpoint: None,
    };
    assert_eq!(manifest(), Some(empty.clone()));
    assert_eq!(store.current().unwrap(), None);
    // An RDB stored but not recorded (a first checkpoint interrupted): a leftover.
    let a = "a".repeat(40);
    let left = stored(&store, &a, 10, b"REDIS0011left");
    open(tmp.path());
    assert!(!left.path.exists());
    let rdb = stored(&store, &a, 10, b"REDIS0011body");
    let c = store.record(&rdb, "Valkey 9.1.2", &a, 10, 1).unwrap();
    assert_eq!(manifest().unwrap().data_dir_id, Some(id()));
    // A manifest written before identities takes this one; one of another data
    // directory, recording a checkpoint, is refused, and nothing is removed.
    std::fs::write(tmp.path().join(CHECKPOINT_FILE), c.render()).unwrap();
    assert_eq!(manifest().unwrap().data_dir_id, None);
    assert_eq!(open(tmp.path()).current().unwrap(), Some(c.clone()));
    assert_eq!(manifest().unwrap().data_dir_id, Some(id()));
    let other = DataDirId::random().unwrap();
    let e = Store::open(tmp.path(), &other).unwrap_err().to_string();
    assert!(e.contains(&format!("of data directory {}", id())), "{e}");
    // A manifest whose RDB is gone: the others stay.
    std::fs::rename(&rdb.path, tmp.path().join("moved.rdb")).unwrap();
    open(tmp.path());
    assert!(tmp.path().join("moved.rdb").exists());
    std::fs::rename(tmp.path().join("moved.rdb"), &rdb.path).unwrap();
    // No manifest: the RDB stays, and the store does not open.
    std::fs::remove_file(tmp.path().join(CHECKPOINT_FILE)).unwrap();
    let e = Store::open(tmp.path(), &id()).unwrap_err().to_string();
    assert!(e.contains("not removed on a guess"), "{e}");
    assert!(rdb.path.exists());
    // A manifest holds an identity, a checkpoint, or both.
    assert_eq!(
        Recorded::parse(&empty.render()).map_err(|e| e.to_string()),
        Ok(empty)
    );
    let nothing = Recorded {
        data_dir_id: None,
        checkpoint: None,
    };
    assert!(Recorded::parse(&nothing.render()).is_err());
}

/// Found by fuzzing (fuzz/regressions/checkpoint_manifest): a record naming a file that
/// is no RDB of the store (the parent directory, a `.tmp` that `open` deletes) was read.
#[test]
fn a_record_names_an_rdb_of_the_store() {
    let c = Checkpoint {
        file: "checkpoint-a-1.rdb".into(),
        replid: "a".repeat(40),
        offset: 1,
        size: 17,
        crc64: 7,
        from_lsn: 1,
        rdb_version: Some(11),
        written_by: None,
        newest_server: None,
        time_ms: Some(1_796_332_725_250),
    };
    assert_eq!(
        Checkpoint::parse(&c.render()).map_err(|e| e.to_string()),
        Ok(c.clone())
    );
    for file in ["..", "", "CHECKPOINT", "x.rdb.tmp", "../x.rdb", "sub/x.rdb"] {
        let bad = Checkpoint {
            file: file.into(),
            ..c.clone()
        };
        assert!(Checkpoint::parse(&bad.render()).is_err(), "{file:?}");
    }
}

#[test]
fn manifests_without_a_format_are_read_and_verified_by_the_rdbs_header() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let a = "a".repeat(40);
    let rdb = stored(&store, &a, 10, b"VALKEY080body");
    let c = store.record(&rdb, "Valkey 9.1.2", &a, 10, 1).unwrap();
    // As walrus wrote manifests before it recorded formats.
    let old = Checkpoint {
        rdb_version: None,
        written_by: None,
        newest_server: None,
        ..c.clone()
    };
    let body = toml::to_string(&Recorded {
        data_dir_id: None,
        checkpoint: Some(old),
    })
    .unwrap();
    assert!(!body.contains("rdb_version"), "{body}");
    replace_file(tmp.path(), CHECKPOINT_FILE, seal(&body).as_bytes()).unwrap();
    let read = store.current().unwrap().unwrap();
    assert_eq!(read.rdb_version, None);
    assert_eq!(store.verify(&read).unwrap(), 80);
    // A recorded format the file does not have is damage.
    let wrong = Checkpoint {
        rdb_version: Some(11),
        ..c
    };
    let err = store.verify(&wrong).unwrap_err().to_string();
    assert!(
        err.contains("RDB format 80, the manifest records Some(11)"),
        "{err}"
    );
}

#[test]
fn a_new_rdb_never_replaces_the_recorded_one_and_offsets_never_go_back() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let a = "a".repeat(40);
    let first = stored(&store, &a, 10, b"REDIS0011first");
    let c1 = store.record(&first, "Valkey 9.1.2", &a, 10, 1).unwrap();
    // A second checkpoint at the same offset gets a name of its own; until the
    // manifest names it, the first stays whole.
    let second = stored(&store, &a, 10, b"REDIS0011second");
    assert_ne!(second.path, first.path);
    assert_eq!(store.verify(&c1).unwrap(), 11);
    let c2 = store.record(&second, "Valkey 9.1.2", &a, 10, 2).unwrap();
    assert!(!first.path.exists() && second.path.exists());
    // An older one of the same history is refused, and the recorded one stays.
    let older = stored(&store, &a, 5, b"REDIS0011older");
    let err = store
        .record_or_discard(&older, "Valkey 9.1.2", &a, 5, 3)
        .unwrap_err();
    assert!(err.to_string().contains("the recorded"), "{err}");
    assert!(!older.path.exists(), "a refused RDB keeps no space");
    // Two names asked for at once (the link and a checkpoint) differ.
    let (x, y) = (
        store.path_for(&a, 10).unwrap(),
        store.path_for(&a, 10).unwrap(),
    );
    assert_ne!(x, y);
    assert_eq!(store.current().unwrap(), Some(c2));
    // Another history's may start anywhere.
    let b = "b".repeat(40);
    let new_history = stored(&store, &b, 0, b"REDIS0011new");
    store
        .record(&new_history, "Valkey 9.1.2", &b, 0, 4)
        .unwrap();
}

/// The recorded RDB deleted by hand, then a checkpoint at the same offset: the new RDB
/// must not take the recorded one's name, or a reader holding the old record (the archive's
/// uploader) would take the new bytes for the old checkpoint's, under its size and CRC.
#[test]
fn a_new_rdb_never_takes_the_name_of_a_recorded_one_deleted_by_hand() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let a = "a".repeat(40);
    let first = stored(&store, &a, 10, b"REDIS0011first");
    let c1 = store.record(&first, "Valkey 9.1.2", &a, 10, 1).unwrap();
    std::fs::remove_file(store.path_of(&c1)).unwrap();
    let second = stored(&store, &a, 10, b"REDIS0011second");
    assert_ne!(second.path, store.path_of(&c1));
}

/// Found by the power-loss generator (docs/power-loss.md): the link's full resync and a
/// checkpoint stored their RDBs at once; the checkpoint's record removed every other
/// RDB, and the link's record then named its removed file. The next start refused:
/// "checkpoint ... fails verification: No such file or directory".
#[test]
fn an_rdb_removed_by_a_concurrent_record_is_never_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let a = "a".repeat(40);
    let links = stored(&store, &a, 20, b"REDIS0011link");
    let checkpoints = stored(&store, &a, 10, b"REDIS0011checkpoint");
    let c = store
        .record(&checkpoints, "Valkey 9.1.2", &a, 10, 1)
        .unwrap();
    assert!(!links.path.exists(), "a record removes every other RDB");
    let err = store
        .record_or_discard(&links, "Valkey 9.1.2", &a, 20, 2)
        .unwrap_err();
    assert!(err.to_string().contains("removed it"), "{err}");
    assert_eq!(store.current().unwrap(), Some(c.clone()));
    assert_eq!(store.verify(&c).unwrap(), 11);
}

#[test]
fn the_newest_server_that_fed_the_journal_is_noted_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let v = |s: &str| s.parse::<ServerVersion>().unwrap();
    // No checkpoint yet: nothing to note.
    store.note_server(&v("Valkey 9.1.2")).unwrap();
    assert_eq!(store.current().unwrap(), None);
    let a = "a".repeat(40);
    let rdb = stored(&store, &a, 10, b"REDIS0011body");
    store.record(&rdb, "Valkey 8.1.8", &a, 10, 1).unwrap();
    store.note_server(&v("Valkey 8.1.2")).unwrap();
    assert_eq!(store.current().unwrap().unwrap().newest_server, None);
    store.note_server(&v("Valkey 9.1.2")).unwrap();
    store.note_server(&v("Valkey 9.0.0")).unwrap();
    let c = store.current().unwrap().unwrap();
    assert_eq!(c.newest_server.as_deref(), Some("Valkey 9.1.2"));
    assert_eq!(store.recorded(), Some(c.clone()));
    // A new checkpoint starts over from its own writer.
    let rdb = stored(&store, &a, 20, b"VALKEY080body");
    let c = store.record(&rdb, "Valkey 9.1.2", &a, 20, 2).unwrap();
    assert_eq!(c.newest_server, None);
}

/// A record the manifest's reader refuses is never written: the store would not open again.
#[test]
#[should_panic(
    expected = "the checkpoint manifest about to be written does not read back as written"
)]
fn a_manifest_that_would_not_read_back_is_never_written() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let short = "a".repeat(39);
    let rdb = stored(&store, &short, 10, b"REDIS0011body");
    let _ = store.record(&rdb, "Valkey 9.1.2", &short, 10, 1);
}

/// When the recorded checkpoint was written is known from memory: its `time_ms` once
/// recorded, and for a manifest written before those, its RDB's modification time read when
/// the store opens (INFO and `/status` ask on the proxy's threads, which must not stat).
#[test]
fn written_at_is_the_record_time_or_for_an_older_manifest_the_rdbs_mtime() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    assert_eq!(store.written_at(), None);
    let a = "a".repeat(40);
    let rdb = stored(&store, &a, 10, b"REDIS0011body");
    let c = store.record(&rdb, "Valkey 9.1.2", &a, 10, 1).unwrap();
    let at = |ms: u64| Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
    assert_eq!(store.written_at(), at(c.time_ms.unwrap()));
    let older = Checkpoint {
        time_ms: None,
        ..c.clone()
    };
    store.write(&older).unwrap();
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    std::fs::File::options()
        .write(true)
        .open(&rdb.path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(open(tmp.path()).written_at(), Some(mtime));
}
