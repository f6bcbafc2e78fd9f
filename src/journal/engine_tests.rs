//! What the proxy's threads ask of an open journal does not wait on its disk.

use super::{Entry, Journal, JournalConfig};

/// A release holds the manifest's lock across the manifest's write and fsync, which a disk
/// that stopped answering holds for as long; `released_through` (INFO, the checkpoint task:
/// both on the proxy's one worker) answers meanwhile.
#[test]
fn released_through_answers_while_a_release_holds_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), &JournalConfig::small_for_tests(64 * 1024, 4)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let entry = Entry {
            repl_id: [b'a'; 40],
            repl_offset_end: 100,
            payload: bytes::Bytes::from(vec![b'x'; 100]),
        };
        j.append(entry).await.unwrap().wait().await.unwrap();
    });
    j.release_through_blocking(1).unwrap();
    let j = std::sync::Arc::new(j);
    let held = j.manifest.lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = j.clone();
    let asked = std::thread::spawn(move || tx.send(reader.released_through()).unwrap());
    let answered = rx.recv_timeout(std::time::Duration::from_secs(5));
    drop(held);
    asked.join().unwrap();
    assert_eq!(
        answered,
        Ok(1),
        "released_through waited for the manifest's lock"
    );
}
