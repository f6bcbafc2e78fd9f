//! The archive end to end on a directory store, without Valkey: a journal and a checkpoint
//! archived, merged, restored into a new data directory, verified; the archive refused to a
//! second walrus and taken over by a directory restored from it.

use super::*;
use crate::checkpoint::store::tests::stored;
use crate::journal::{Entry, JournalConfig};
use std::path::Path;

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

struct Node {
    journal: Arc<Journal>,
    local: LocalStore,
    data: std::path::PathBuf,
}

fn node(data: &Path) -> Node {
    let cfg = JournalConfig::small_for_tests(64 * 1024, 8);
    let (journal, _) = Journal::open(&data.join("journal"), &cfg).unwrap();
    Node {
        journal: Arc::new(journal),
        local: LocalStore::open(&data.join("checkpoints")).unwrap(),
        data: data.to_path_buf(),
    }
}

/// Appends entries of 10 bytes each, ending at offsets `ends`; waits for them.
async fn append(n: &Node, ends: impl IntoIterator<Item = u64>) {
    let mut last = None;
    for end in ends {
        let entry = Entry {
            repl_id: A.as_bytes().try_into().unwrap(),
            repl_offset_end: end,
            payload: bytes::Bytes::from(format!("{end:>10}")),
        };
        last = Some(n.journal.append(entry).await.unwrap());
    }
    last.unwrap().wait().await.unwrap();
}

fn settings() -> upload::Settings {
    upload::Settings {
        max_lag: Duration::from_millis(40),
        object_bytes: 1 << 20,
        merge_objects: 3,
        checkpoint_after_bytes: 1 << 30,
        checkpoint_interval: Duration::ZERO,
        keep_restore_points: 7,
        keep_for: Duration::ZERO,
        max_backoff: Duration::from_millis(50),
        owner_check_interval: Duration::from_secs(60),
        ack_archive: false,
    }
}

fn uploader(n: &Node, store: &store::Store, status: Arc<ArchiveStatus>) -> upload::Uploader {
    upload::Uploader {
        store: store.clone(),
        journal: n.journal.clone(),
        local: n.local.clone(),
        pin: Pin::default(),
        data_dir: n.data.clone(),
        identity: identity::of(&n.data).unwrap(),
        settings: settings(),
        status,
    }
}

/// Waits (bounded) until the archive holds LSN `lsn`.
async fn archived(status: &ArchiveStatus, lsn: u64) {
    let mut rx = status.archived();
    let reached =
        tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|d| d.lsn >= lsn)).await;
    assert!(
        reached.is_ok(),
        "not archived through {lsn}: {:?}",
        status.snapshot()
    );
}

fn dir_store(root: &Path) -> store::Store {
    std::fs::create_dir_all(root).unwrap();
    store::Store::open(
        &format!("file://{}", root.display()),
        &crate::config::ArchiveConfig::default(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_and_its_checkpoint_are_archived_merged_and_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let store = dir_store(&tmp.path().join("bucket"));
    // Entries 1..=5 end at 10..=50; the checkpoint at 30 covers the first three.
    append(&n, (1..=5).map(|i| i * 10)).await;
    let rdb = stored(&n.local, A, 30, b"REDIS0011body");
    n.local
        .record_or_discard(&rdb, "Valkey 9.1.2", A, 30, 2)
        .unwrap();
    let status = Arc::new(ArchiveStatus::new("test".into(), Duration::from_millis(40)));
    let clock = tokio::spawn(clock(n.journal.durable(), status.clone()));
    let task = tokio::spawn(uploader(&n, &store, status.clone()).run());
    archived(&status, 5).await;
    // Uploads come one by one; every third is merged with the two before.
    for i in 6..=12 {
        append(&n, [i * 10]).await;
        archived(&status, i).await;
    }
    let objects = timeline::objects(&store, 1).await.unwrap();
    let cover = timeline::cover(&objects, 30);
    assert_eq!(cover.end, 120);
    assert!(cover.redundant.is_empty(), "{:?}", cover.redundant);
    assert!(cover.objects.iter().any(|o| o.level == 1), "{objects:?}");
    assert!(cover.objects.len() < 9, "{objects:?}");
    // A new data directory from the archive holds the checkpoint and the stream after it.
    let plan = fetch::latest(&store).await.unwrap().unwrap();
    assert_eq!((plan.point.offset, plan.point.timeline), (30, 1));
    let to = tmp.path().join("new");
    let restored = fetch::restore(&store, plan, &to, (64 * 1024, 8))
        .await
        .unwrap();
    assert_eq!((restored.entries, restored.end_offset), (9, 120));
    let v = crate::restore::verify::verify_data_dir(&to, None).unwrap();
    let chain = v.restore.unwrap().chain;
    assert_eq!((chain.offset, chain.entries), (120, 9));
    assert!(!to.join(fetch::STAGING).exists());
    // It may take the archive over: it was restored from it.
    assert_eq!(
        identity::of(&to).unwrap().restored_from,
        Some(identity::of(&n.data).unwrap().id)
    );
    task.abort();
    clock.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_walrus_is_refused_and_a_restored_one_takes_the_archive_over() {
    let tmp = tempfile::tempdir().unwrap();
    let store = dir_store(&tmp.path().join("bucket"));
    let first = tmp.path().join("first");
    std::fs::create_dir_all(&first).unwrap();
    let me = identity::of(&first).unwrap();
    let o = owner::claim(&store, &me, &first).await.unwrap();
    assert_eq!(o.manifest.writer.identity, me.id);
    // The same walrus again: still its own.
    owner::claim(&store, &me, &first).await.unwrap();
    let second = tmp.path().join("second");
    std::fs::create_dir_all(&second).unwrap();
    let other = identity::of(&second).unwrap();
    let e = owner::claim(&store, &other, &second).await.unwrap_err();
    assert!(matches!(e, ArchiveError::Owner(_)), "{e}");
    assert!(
        e.to_string().contains(&me.name) && e.to_string().contains(&me.id),
        "{e}"
    );
    // Restored from the first's archive, the second takes it over on a timeline of its own,
    // and the first finds out at its next manifest write.
    identity::note_restored(&second, &me.id).unwrap();
    let restored = identity::of(&second).unwrap();
    let took = owner::claim(&store, &restored, &second).await.unwrap();
    assert_eq!(took.manifest.writer.identity, other.id);
    assert_eq!(took.manifest.timeline, o.manifest.timeline + 1);
    assert_eq!(identity::of(&second).unwrap().restored_from, None);
    let mut stale = o.clone();
    let e = owner::replace(&store, &me, &mut stale, o.manifest.clone())
        .await
        .unwrap_err();
    assert!(matches!(e, ArchiveError::Owner(_)), "{e}");
    assert!(owner::claim(&store, &me, &first).await.is_err());
}
