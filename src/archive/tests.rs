//! The archive end to end on a directory store, without Valkey: a journal and a checkpoint
//! archived, merged, restored into a new data directory, verified; the archive kept from a
//! second walrus and taken over by a directory restored from it.

use super::*;
use crate::checkpoint::store::tests::stored;
use crate::journal::{Entry, JournalConfig};
use std::path::Path;
use std::time::Instant;

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

struct Node {
    journal: Arc<Journal>,
    local: LocalStore,
    data: std::path::PathBuf,
}

fn node(data: &Path) -> Node {
    let cfg = JournalConfig::small_for_tests(64 * 1024, 8);
    let (journal, _) = Journal::open(&data.join("journal"), &cfg).unwrap();
    let local = LocalStore::open(&data.join("checkpoints"), &journal.data_dir_id()).unwrap();
    Node {
        journal: Arc::new(journal),
        local,
        data: data.to_path_buf(),
    }
}

/// Appends entries of 10 bytes each, ending at offsets `ends`; waits for them.
async fn append(n: &Node, ends: impl IntoIterator<Item = u64>) {
    append_sized(n, ends, 10).await
}

/// Appends entries of `size` bytes each, ending at offsets `ends`; waits for them.
async fn append_sized(n: &Node, ends: impl IntoIterator<Item = u64>, size: usize) {
    let mut last = None;
    for end in ends {
        let entry = Entry {
            repl_id: A.as_bytes().try_into().unwrap(),
            repl_offset_end: end,
            payload: bytes::Bytes::from(format!("{end:>size$}")),
        };
        last = Some(n.journal.append(entry).await.unwrap());
    }
    last.unwrap().wait().await.unwrap();
}

/// Records a local checkpoint at `offset` whose journal starts at `from_lsn`.
fn checkpoint(n: &Node, offset: u64, from_lsn: u64) {
    let rdb = stored(
        &n.local,
        A,
        offset,
        format!("REDIS0011at{offset}").as_bytes(),
    );
    n.local
        .record_or_discard(&rdb, "Valkey 9.1.2", A, offset, from_lsn)
        .unwrap();
}

/// Waits (bounded) until the archive's manifest has a restore point at `offset`.
async fn await_point(store: &store::Store, offset: u64) -> manifest::Manifest {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((m, _)) = owner::read(store).await.unwrap() {
            if m.restore_points.iter().any(|r| r.offset == offset) {
                return m;
            }
        }
        assert!(Instant::now() < deadline, "no restore point at {offset}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
        checkpoint: None,
        store: store.clone(),
        journal: n.journal.clone(),
        local: n.local.clone(),
        pin: Pin::default(),
        data_dir: n.data.clone(),
        identity: identity::of(&n.data, &n.journal.data_dir_id()).unwrap(),
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

/// The archive's status, and the task that tells it when the journal's durable position
/// moves (the clock of its lag).
fn watched(n: &Node) -> (Arc<ArchiveStatus>, tokio::task::JoinHandle<()>) {
    let status = Arc::new(ArchiveStatus::new("test".into(), Duration::from_millis(40)));
    let clock = tokio::spawn(clock(n.journal.durable(), status.clone()));
    (status, clock)
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
    archived_merged_and_restored(0).await
}

/// The same, with the journal's newest entries in memory (`archive.memory_bytes`): all of
/// them, or so few that a read takes the rest from the ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_from_the_journals_memory_whole_or_in_part() {
    archived_merged_and_restored(1 << 20).await;
    archived_merged_and_restored(
        2 * (10 + crate::journal::recent::ENTRY_OVERHEAD_BYTES as u64) + 5,
    )
    .await;
}

async fn archived_merged_and_restored(memory_bytes: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    n.journal.keep_recent(memory_bytes);
    let store = dir_store(&tmp.path().join("bucket"));
    // Entries 1..=5 end at 10..=50; the checkpoint at 30 covers the first three.
    append(&n, (1..=5).map(|i| i * 10)).await;
    let rdb = stored(&n.local, A, 30, b"REDIS0011body");
    n.local
        .record_or_discard(&rdb, "Valkey 9.1.2", A, 30, 2)
        .unwrap();
    let (status, clock) = watched(&n);
    let task = tokio::spawn(uploader(&n, &store, status.clone()).run());
    archived(&status, 5).await;
    // Uploads come one by one; every third is merged with the two before.
    for i in 6..=12 {
        append(&n, [i * 10]).await;
        archived(&status, i).await;
    }
    // A merge's parts go once the merged object is up (after the upload that made it due
    // was counted).
    let deadline = Instant::now() + Duration::from_secs(20);
    let (objects, cover) = loop {
        let objects = timeline::objects(&store, 1).await.unwrap();
        let cover = timeline::cover(&objects, 30);
        if cover.redundant.is_empty() {
            break (objects, cover);
        }
        assert!(Instant::now() < deadline, "{:?}", cover.redundant);
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(cover.end, 120);
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
    let v = crate::datadir::verify::verify_data_dir(&to, None).unwrap();
    let chain = v.restore.unwrap().chain;
    assert_eq!((chain.offset, chain.entries), (120, 9));
    assert!(!to.join(fetch::STAGING).exists());
    // It may take the archive over: it was restored from it.
    let id = crate::journal::manifest::DataDirId::random().unwrap();
    assert_eq!(
        identity::of(&to, &id).unwrap().restored_from,
        Some(n.journal.data_dir_id().to_string())
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
    let ids = [(); 2].map(|_| crate::journal::manifest::DataDirId::random().unwrap());
    let me = identity::of(&first, &ids[0]).unwrap();
    let o = owner::claim(&store, &me, &first).await.unwrap();
    assert_eq!(o.manifest.writer.identity, me.id);
    // The same walrus again: still its own.
    owner::claim(&store, &me, &first).await.unwrap();
    let second = tmp.path().join("second");
    std::fs::create_dir_all(&second).unwrap();
    let other = identity::of(&second, &ids[1]).unwrap();
    let e = owner::claim(&store, &other, &second).await.unwrap_err();
    assert!(matches!(e, ArchiveError::Owner(_)), "{e}");
    assert!(
        e.to_string().contains(&me.name) && e.to_string().contains(&me.id),
        "{e}"
    );
    // Restored from the first's archive, the second takes it over on a timeline of its own,
    // and the first finds out at its next manifest write.
    identity::note_restored(&second, &me.id).unwrap();
    let restored = identity::of(&second, &ids[1]).unwrap();
    let took = owner::claim(&store, &restored, &second).await.unwrap();
    assert_eq!(took.manifest.writer.identity, other.id);
    assert_eq!(took.manifest.timeline, o.manifest.timeline + 1);
    assert_eq!(identity::of(&second, &ids[1]).unwrap().restored_from, None);
    let mut stale = o.clone();
    let e = owner::replace(&store, &me, &mut stale, o.manifest.clone())
        .await
        .unwrap_err();
    assert!(matches!(e, ArchiveError::Owner(_)), "{e}");
    assert!(owner::claim(&store, &me, &first).await.is_err());
}

/// Journal released locally before it was archived (the store was gone meanwhile): the next
/// restore point carries the archive on, and a restore from it has everything after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_released_before_it_was_archived_is_carried_on_by_a_new_restore_point() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let bucket = tmp.path().join("bucket");
    let store = dir_store(&bucket);
    // Entries of 20 KB: three to a 64 KiB segment.
    let kb = 20_000;
    append_sized(&n, (1..=3).map(|i| i * kb), kb as usize).await;
    checkpoint(&n, kb, 2);
    let (status, clock) = watched(&n);
    let task = tokio::spawn(uploader(&n, &store, status.clone()).run());
    archived(&status, 3).await;
    // The store goes away; the journal goes on, a checkpoint is taken, and the segments
    // before it are released (and may be recycled).
    std::fs::rename(&bucket, tmp.path().join("away")).unwrap();
    append_sized(&n, (4..=9).map(|i| i * kb), kb as usize).await;
    checkpoint(&n, 7 * kb, 8);
    n.journal.release_through(7).await.unwrap();
    assert!(n.journal.status().head_pos > 0, "nothing was released");
    std::fs::rename(tmp.path().join("away"), &bucket).unwrap();
    archived(&status, 9).await;
    let m = await_point(&store, 7 * kb).await;
    assert_eq!(m.restore_points.len(), 2, "{m:?}");
    // The first restore point's stream stops where the released journal began: entries 4
    // to 7 are in the new one's RDB, not in the archive's journal.
    let objects = timeline::objects(&store, 1).await.unwrap();
    assert_eq!(timeline::cover(&objects, kb).end, 3 * kb, "{objects:?}");
    let plan = fetch::latest(&store).await.unwrap().unwrap();
    assert_eq!(plan.point.offset, 7 * kb);
    let to = tmp.path().join("new");
    let restored = fetch::restore(&store, plan, &to, (64 * 1024, 8))
        .await
        .unwrap();
    assert_eq!((restored.entries, restored.end_offset), (2, 9 * kb));
    task.abort();
    clock.abort();
}

/// Retention: past `keep_restore_points`, the oldest restore point goes, with its RDB and
/// the journal objects only it needed; what the others need stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_what_only_a_removed_restore_point_needed() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let bucket = tmp.path().join("bucket");
    let store = dir_store(&bucket);
    append(&n, (1..=3).map(|i| i * 10)).await;
    checkpoint(&n, 10, 2);
    let (status, clock) = watched(&n);
    let mut up = uploader(&n, &store, status.clone());
    up.settings.checkpoint_after_bytes = 25;
    up.settings.keep_restore_points = 2;
    up.settings.merge_objects = 0;
    let task = tokio::spawn(up.run());
    await_point(&store, 10).await;
    archived(&status, 3).await;
    append(&n, (4..=6).map(|i| i * 10)).await;
    archived(&status, 6).await;
    checkpoint(&n, 40, 5);
    await_point(&store, 40).await;
    append(&n, (7..=9).map(|i| i * 10)).await;
    archived(&status, 9).await;
    checkpoint(&n, 70, 8);
    let m = await_point(&store, 70).await;
    let offsets: Vec<u64> = m.restore_points.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [40, 70]);
    // The first restore point's RDB goes (after the manifest no longer names it); so does
    // every journal object before 40.
    let deadline = Instant::now() + Duration::from_secs(20);
    let objects = loop {
        let rdbs = store.list("checkpoints/", None).await.unwrap();
        let objects = timeline::objects(&store, 1).await.unwrap();
        if rdbs.len() == 2 && objects.iter().all(|o| o.end > 40) {
            break objects;
        }
        assert!(Instant::now() < deadline, "{rdbs:?} {objects:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(timeline::cover(&objects, 40).end, 90);
    task.abort();
    clock.abort();
}

/// Writes came, no checkpoint did, and the newest restore point is older than
/// `checkpoint_interval`: the uploader asks the checkpointer for one, once per interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_restore_point_gets_a_checkpoint_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let store = dir_store(&tmp.path().join("bucket"));
    append(&n, (1..=3).map(|i| i * 10)).await;
    checkpoint(&n, 30, 4);
    let (status, clock) = watched(&n);
    let (tx, mut asked) = tokio::sync::mpsc::channel(4);
    let mut up = uploader(&n, &store, status.clone());
    up.checkpoint = Some(ask::Asker::new(tx));
    up.settings.checkpoint_interval = Duration::from_millis(200);
    let task = tokio::spawn(up.run());
    await_point(&store, 30).await;
    // Nothing written since the restore point: nothing asked, however long.
    let quiet = tokio::time::timeout(Duration::from_millis(600), asked.recv()).await;
    assert!(
        quiet.is_err(),
        "a checkpoint was asked for with no write since"
    );
    append(&n, [40]).await;
    let request = tokio::time::timeout(Duration::from_secs(20), asked.recv()).await;
    assert!(matches!(request, Ok(Some(_))), "no checkpoint asked for");
    task.abort();
    clock.abort();
}

/// Valkey upgraded under walrus after its checkpoint: the restore point says so, and a data
/// directory restored from it records the newer server (a restore then refuses an older
/// Valkey, as one from the local disk does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_server_noted_after_the_checkpoint_reaches_the_restore_point() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let store = dir_store(&tmp.path().join("bucket"));
    append(&n, (1..=3).map(|i| i * 10)).await;
    checkpoint(&n, 30, 4);
    let status = Arc::new(ArchiveStatus::new("test".into(), Duration::from_millis(40)));
    let task = tokio::spawn(uploader(&n, &store, status.clone()).run());
    await_point(&store, 30).await;
    n.local
        .note_server(&"Valkey 9.9.0".parse().unwrap())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (m, _) = owner::read(&store).await.unwrap().unwrap();
        if m.restore_points[0].newest_server.as_deref() == Some("Valkey 9.9.0") {
            break;
        }
        assert!(Instant::now() < deadline, "{m:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let plan = fetch::latest(&store).await.unwrap().unwrap();
    let to = tmp.path().join("new");
    fetch::restore(&store, plan, &to, (64 * 1024, 8))
        .await
        .unwrap();
    let cp = LocalStore::read_only(&to.join("checkpoints"))
        .unwrap()
        .recorded()
        .unwrap();
    assert_eq!(cp.newest_server.as_deref(), Some("Valkey 9.9.0"));
    task.abort();
}

/// A timeline started from a checkpoint the local journal already runs past (an archive set
/// on a walrus with data, or a walrus restored from the archive taking it over) records its
/// first restore point as whole only once that journal is uploaded again; until then a
/// restore takes the restore point before it, and with none before it, says why it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_point_waiting_for_its_journal_is_passed_over_for_a_whole_one() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let store = dir_store(&tmp.path().join("bucket"));
    append(&n, (1..=5).map(|i| i * 10)).await;
    checkpoint(&n, 30, 4);
    let (status, clock) = watched(&n);
    let task = tokio::spawn(uploader(&n, &store, status.clone()).run());
    archived(&status, 5).await;
    task.abort();
    clock.abort();
    let m = await_point(&store, 30).await;
    assert_eq!(m.restore_points[0].complete_at, Some(50), "{m:?}");
    assert_eq!(fetch::latest(&store).await.unwrap().unwrap().cover.end, 50);

    // The next timeline's first restore point, its journal not uploaded yet.
    let me = identity::of(&n.data, &n.journal.data_dir_id()).unwrap();
    let rewrite = |edit: &dyn Fn(&mut manifest::Manifest)| {
        let (store, me, data) = (store.clone(), me.clone(), n.data.clone());
        let mut next = m.clone();
        edit(&mut next);
        async move {
            let mut o = owner::claim(&store, &me, &data).await.unwrap();
            owner::replace(&store, &me, &mut o, next).await.unwrap();
        }
    };
    let next = |complete_at| {
        move |m: &mut manifest::Manifest| {
            let mut p = m.restore_points[0].clone();
            (p.timeline, p.complete_at) = (2, complete_at);
            m.timeline = 2;
            m.restore_points.push(p);
        }
    };
    rewrite(&next(Some(50))).await;
    let plan = fetch::latest(&store).await.unwrap().unwrap();
    assert_eq!((plan.point.timeline, plan.cover.end), (1, 50));
    // A cut, too, is made from the whole one: up to a time after every entry.
    let later = crate::datadir::pitr::Until::Time(u64::MAX / 2);
    let plan = fetch::plan(&store, &later).await.unwrap();
    assert_eq!((plan.point.timeline, plan.cover.end), (1, 50));
    // Once it is whole, it is the one.
    rewrite(&next(Some(30))).await;
    assert_eq!(
        fetch::latest(&store).await.unwrap().unwrap().point.timeline,
        2
    );
    // With nothing whole to fall back on: refused, saying how far it reaches.
    rewrite(&|m: &mut manifest::Manifest| {
        next(Some(50))(m);
        m.restore_points.remove(0);
    })
    .await;
    let Err(e) = fetch::latest(&store).await else {
        panic!("a restore with no whole restore point was not refused")
    };
    assert!(e.to_string().contains("uploaded to offset 30 of 50"), "{e}");
}

/// The recorded checkpoint's file deleted by hand before its restore point was uploaded: the
/// uploader says so and waits for the next checkpoint, instead of going round at once on it
/// for ever (a core spent, and a stop that waited on a task that never yielded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_checkpoint_deleted_by_hand_is_reported_and_the_next_one_carries_on() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let store = dir_store(&tmp.path().join("bucket"));
    append(&n, (1..=3).map(|i| i * 10)).await;
    checkpoint(&n, 10, 2);
    let (status, clock) = watched(&n);
    let mut up = uploader(&n, &store, status.clone());
    // A new restore point once more than 20 bytes follow the last one: not before entry 4.
    up.settings.checkpoint_after_bytes = 25;
    let (tx, mut asked) = tokio::sync::mpsc::channel(4);
    up.checkpoint = Some(ask::Asker::new(tx));
    let task = tokio::spawn(up.run());
    archived(&status, 3).await;
    checkpoint(&n, 30, 4);
    std::fs::remove_file(n.local.path_of(&n.local.recorded().unwrap())).unwrap();
    append(&n, [40]).await;
    let error = await_error(
        &status,
        |e| e.is_some(),
        "the missing checkpoint was not reported",
    )
    .await
    .unwrap();
    assert!(error.contains("is gone from the data directory"), "{error}");
    // The uploader asks for the checkpoint that carries the archive on, rather than waiting
    // for the ring's rules to take one.
    let request = tokio::time::timeout(Duration::from_secs(20), asked.recv()).await;
    assert!(matches!(request, Ok(Some(_))), "no checkpoint asked for");
    checkpoint(&n, 40, 5);
    let m = await_point(&store, 40).await;
    assert!(m.restore_points.iter().all(|r| r.offset != 30), "{m:?}");
    // Cleared once the new restore point is recorded, a moment after the manifest names it.
    let error = await_error(&status, |e| e.is_none(), "the error stayed").await;
    assert_eq!(error, None);
    task.abort();
    clock.abort();
}

/// Waits (bounded) until the archive's last error satisfies `done`, and returns it.
async fn await_error(
    status: &ArchiveStatus,
    done: impl Fn(&Option<String>) -> bool,
    why: &str,
) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let error = status.snapshot().error;
        if done(&error) {
            return error;
        }
        assert!(Instant::now() < deadline, "{why}: {error:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The uploader read the record; newer checkpoints at the same offset came meanwhile, and
/// one of them took the name of the one read (no record names it any more). What that name
/// holds now is not uploaded as the checkpoint read, under its size and CRC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_whose_name_went_to_a_newer_rdb_is_not_uploaded_as_the_one_read() {
    let tmp = tempfile::tempdir().unwrap();
    let n = node(&tmp.path().join("data"));
    let store = dir_store(&tmp.path().join("bucket"));
    append(&n, [10]).await;
    checkpoint(&n, 10, 2);
    let read = n.local.recorded().unwrap();
    checkpoint(&n, 10, 2);
    let newer = stored(&n.local, A, 10, b"REDIS0011newer, not recorded yet");
    assert_eq!(newer.path, n.local.path_of(&read));
    let (status, clock) = watched(&n);
    let up = uploader(&n, &store, status);
    let mut o = owner::claim(&store, &up.identity, &n.data).await.unwrap();
    let added = up.add_point(&mut o, &read, 1, None).await.unwrap();
    let m = owner::read(&store).await.unwrap().map(|(m, _)| m);
    assert!(
        !added && m.as_ref().is_none_or(|m| m.restore_points.is_empty()),
        "{m:?}"
    );
    clock.abort();
}
