use super::copy::{new_journal, Read, Summary};
use super::target::Target;
use crate::checkpoint::manifest::CHECKPOINT_FILE;
use crate::checkpoint::store::tests::stored;
use crate::checkpoint::store::Store;
use crate::datadir::DataDirError;
use crate::journal::lock::{Access, DirLock};
use crate::journal::{Entry, Journal, JournalConfig};
use std::path::Path;

/// A journal of five entries after a checkpoint at offset 30, as a running walrus has.
fn data(dir: &Path) -> (Journal, Store) {
    let cfg = JournalConfig::small_for_tests(64 * 1024, 4);
    let (journal, _) = Journal::open(&dir.join("journal"), &cfg).unwrap();
    let a = "a".repeat(40);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut last = None;
        for i in 1..=5u64 {
            let entry = Entry {
                repl_id: a.as_bytes().try_into().unwrap(),
                repl_offset_end: 20 + i * 10,
                payload: bytes::Bytes::from(vec![b'x'; 10]),
            };
            last = Some(journal.append(entry).await.unwrap());
        }
        last.unwrap().wait().await.unwrap();
    });
    let store = crate::checkpoint::store::tests::open(&dir.join("checkpoints"));
    let rdb = stored(&store, &a, 30, b"REDIS0011body");
    store
        .record_or_discard(&rdb, "Valkey 9.1.2", &a, 30, 2)
        .unwrap();
    (journal, store)
}

fn write(
    journal: &Journal,
    store: &Store,
    to: &Path,
    give_up: &dyn Fn() -> Option<String>,
) -> Result<Summary, DataDirError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let target = Target::prepare(to, &[])?;
    let copy = new_journal(&target.staging, (64 * 1024, 4))?;
    target.write(
        &Read::Open(journal),
        store,
        copy,
        (64 * 1024, 4),
        runtime.handle(),
        give_up,
        None,
    )
}

#[test]
fn a_backup_appears_under_its_name_only_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let (journal, store) = data(&tmp.path().join("data"));
    let to = tmp.path().join("backups/b1");
    // Given up half way (walrus stopping, the ring wanting room): nothing is left, under
    // its name or beside it.
    let asked = std::cell::Cell::new(0);
    let give_up = || {
        asked.set(asked.get() + 1);
        (asked.get() > 2).then(|| "walrus is stopping".to_string())
    };
    let e = write(&journal, &store, &to, &give_up).unwrap_err();
    assert!(matches!(e, DataDirError::Failed(_)), "{e}");
    assert!(e.to_string().contains("walrus is stopping"), "{e}");
    assert!(!to.exists());
    let parent = tmp.path().join("backups");
    assert_eq!(std::fs::read_dir(&parent).unwrap().count(), 0);
    // A staging directory left by a crash is not a backup, and the next one replaces it;
    // so are those of backups to other names, unless a backup holds one, or it holds
    // what no backup writes.
    for left in [".b1.partial", ".b0.partial", ".b2.partial"] {
        std::fs::create_dir_all(parent.join(left).join("checkpoints")).unwrap();
    }
    let writing = DirLock::take(&parent.join(".b2.partial"), Access::Exclusive).unwrap();
    std::fs::create_dir_all(parent.join(".notes.partial")).unwrap();
    std::fs::write(parent.join(".notes.partial/notes.txt"), b"mine").unwrap();
    let done = write(&journal, &store, &to, &|| None).unwrap();
    assert!(!parent.join(".b0.partial").exists());
    assert!(parent.join(".b2.partial/checkpoints").is_dir());
    assert!(parent.join(".notes.partial/notes.txt").is_file());
    drop(writing);
    for kept in [".b2.partial", ".notes.partial"] {
        std::fs::remove_dir_all(parent.join(kept)).unwrap();
    }
    assert_eq!(done.to, to);
    assert_eq!(done.entries, 4, "the entries after the checkpoint's offset");
    assert!(to.join("checkpoints").join(CHECKPOINT_FILE).is_file());
    assert!(!parent.join(".b1.partial").exists());
    let v = crate::datadir::verify::verify_data_dir(&to, None).unwrap();
    assert_eq!(v.restore.unwrap().chain.entries, 4);
    // A copy whose manifest is missing (a copy by hand, cut short) is no backup.
    std::fs::remove_file(to.join("checkpoints").join(CHECKPOINT_FILE)).unwrap();
    std::fs::remove_dir_all(to.join("journal")).unwrap();
    drop(journal.close());
    let cfg = JournalConfig::small_for_tests(64 * 1024, 4);
    drop(Journal::open(&to.join("journal"), &cfg).unwrap());
    let e = crate::datadir::verify::verify_data_dir(&to, None).unwrap_err();
    assert!(e.to_string().contains("an incomplete copy"), "{e}");
}

#[test]
fn a_backup_into_walruss_own_directories_is_refused_however_it_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let live = [data.join("journal"), data.join("checkpoints")];
    for d in &live {
        std::fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::symlink(data.join("journal"), tmp.path().join("link")).unwrap();
    for to in [
        data.join("checkpoints/nightly.rdb"),
        tmp.path().join("link/b1"),
        tmp.path().join("link/x/y/b1"),
    ] {
        let e = Target::prepare(&to, &live).err().expect("refused");
        assert!(
            matches!(e, DataDirError::Refused(_)) && e.to_string().contains("inside walrus's own"),
            "{}: {e}",
            to.display()
        );
    }
    // Nothing was created inside them on the way to the refusal.
    assert!(!data.join("journal/x").exists());
    // Names that are not a plain new or empty directory are refused as such.
    std::fs::create_dir_all(tmp.path().join("empty")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("empty"), tmp.path().join("to-empty")).unwrap();
    std::fs::write(tmp.path().join("a-file"), b"x").unwrap();
    for (to, why) in [
        (
            data.join("backups/../checkpoints/nightly"),
            "without . or ..",
        ),
        (tmp.path().join("empty/."), "without . or .."),
        (tmp.path().join("to-empty"), "is a symlink"),
        (tmp.path().join("a-file"), "is not a directory"),
    ] {
        let e = Target::prepare(&to, &live).err().expect("refused");
        assert!(
            matches!(e, DataDirError::Refused(_)) && e.to_string().contains(why),
            "{}: {e}",
            to.display()
        );
    }
    // Beside them is fine, and so is an empty directory.
    assert!(Target::prepare(&data.join("backups/b1"), &live).is_ok());
    assert!(Target::prepare(&tmp.path().join("empty"), &live).is_ok());
}

#[test]
fn a_backup_its_file_system_cannot_hold_or_that_would_pass_the_watermark_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let live = [tmp.path().join("data")];
    std::fs::create_dir_all(&live[0]).unwrap();
    let target = Target::prepare(&tmp.path().join("b1"), &live).unwrap();
    let e = target.check_room(u64::MAX / 2, &live, None).unwrap_err();
    assert!(e.to_string().contains("free"), "{e}");
    // On the data's own file system, any figure past the high watermark refuses writes.
    let e = target.check_room(1, &live, Some((1e-12, 0))).unwrap_err();
    assert!(e.to_string().contains("disk.high_watermark"), "{e}");
    // On another file system (none of walrus's directories there), the watermark is not
    // walrus's concern.
    assert!(target.check_room(1, &[], Some((1e-12, 0))).is_ok());
    assert!(target.check_room(1, &live, Some((0.999_999, 0))).is_ok());
    // ... unless the next checkpoint would then not fit below it.
    let avail = crate::disk::Usage::of(tmp.path()).unwrap().avail_bytes;
    let e = target
        .check_room(1, &live, Some((0.999_999, avail)))
        .unwrap_err();
    assert!(e.to_string().contains("the next checkpoint"), "{e}");
}
