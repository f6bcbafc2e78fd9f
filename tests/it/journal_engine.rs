//! End-to-end tests of the journal handle: append, durability, reopen, replay, ring full,
//! release, large entries, both backends.
use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use walrus::journal::{
    Entry, IoBackendChoice, Journal, JournalConfig, JournalError, ReplayFrom, Tail,
};

const REPL_ID: [u8; 40] = *b"8c1b2f6e0a7d4c3b9e5f1a2d6c8b0e4f7a9c1d3e";

fn cfg(backend: IoBackendChoice) -> JournalConfig {
    JournalConfig {
        io_backend: backend,
        ..JournalConfig::small_for_tests(64 * 1024, 4)
    }
}

fn payload(lsn: u64, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (lsn as usize * 31 + i) as u8;
    }
    Bytes::from(v)
}

async fn append_and_replay(backend: IoBackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    // 24 entries of up to 70 KB: about 290 KB, so 8 segments of 64 KiB.
    let cfg = JournalConfig {
        segments: 8,
        ..cfg(backend)
    };
    let mut off = 0u64;
    let sizes = [1usize, 100, 1000, 5000, 20_000, 70_000, 0, 333];
    {
        let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
        assert_eq!(rec.end.next_lsn, 1);
        assert_eq!(rec.segments_initialized, 8);
        eprintln!("backend in use: {}", rec.backend);
        let mut tickets = Vec::new();
        for (i, &len) in sizes.iter().cycle().take(24).enumerate() {
            off += len as u64;
            let t = j
                .append(Entry {
                    repl_id: REPL_ID,
                    repl_offset_end: off,
                    payload: payload(i as u64 + 1, len),
                })
                .await
                .unwrap();
            assert_eq!(t.lsn(), i as u64 + 1);
            tickets.push(t);
        }
        for t in tickets {
            let lsn = t.lsn();
            let d = t.wait().await.unwrap();
            assert!(d.lsn >= lsn);
        }
        let d = *j.durable().borrow();
        assert_eq!(d.lsn, 24);
        // Several buffers were queued at once: besides the direct write at queue depth 1,
        // writes went through the concurrent path (io_uring ring or sync workers).
        let st = j.status();
        assert!(st.writes_total > st.writes_inline, "{st:?}");
        assert!(st.writes_inline >= 1, "{st:?}");
        assert_eq!(d.repl_offset, off);
        let got: Vec<_> = j
            .replay(ReplayFrom::Lsn(5))
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(got.len(), 20);
        assert_eq!(got[0].lsn, 5);
        j.close().unwrap();
    }
    let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    assert_eq!(rec.end.next_lsn, 25);
    assert_eq!(rec.end.last_repl_offset, off);
    assert_eq!(rec.end.last_repl_id, REPL_ID);
    assert!(matches!(rec.tail, Tail::End { .. }));
    let all: Vec<_> = j
        .replay(ReplayFrom::Lsn(1))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(all.len(), 24);
    for (i, e) in all.iter().enumerate() {
        let len = sizes[i % sizes.len()];
        assert_eq!(e.lsn, i as u64 + 1);
        assert_eq!(e.payload, payload(e.lsn, len), "payload of LSN {}", e.lsn);
    }
    // Replay from a replication offset: first entry whose range ends after it.
    let mid = all[10].repl_offset_end;
    let from_off: Vec<_> = j
        .replay(ReplayFrom::ReplOffset(mid))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(
        from_off[0].lsn,
        all.iter().find(|e| e.repl_offset_end > mid).unwrap().lsn
    );
    // Appending continues the LSN sequence after reopen.
    let t = j
        .try_append(&Entry {
            repl_id: REPL_ID,
            repl_offset_end: off + 3,
            payload: payload(25, 3),
        })
        .unwrap();
    assert_eq!(t.lsn(), 25);
    t.wait().await.unwrap();
}

#[tokio::test]
async fn sync_backend_append_reopen_replay() {
    append_and_replay(IoBackendChoice::Sync).await;
}

#[tokio::test]
async fn auto_backend_append_reopen_replay() {
    append_and_replay(IoBackendChoice::Auto).await;
}

#[tokio::test]
async fn ring_full_then_release_recycles() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg(IoBackendChoice::Auto);
    let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
    let j = Arc::new(j);
    let mut lsn = 0;
    let mut off = 0;
    // Fill the ring with 3 KiB entries until RingFull.
    let full = loop {
        off += 3000;
        match j
            .append(Entry {
                repl_id: REPL_ID,
                repl_offset_end: off,
                payload: payload(lsn + 1, 3000),
            })
            .await
        {
            Ok(t) => {
                lsn = t.lsn();
                t.wait().await.unwrap();
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(full, JournalError::RingFull { .. }), "{full}");
    assert!(
        lsn > 60,
        "a 256 KiB ring holds more than 60 entries of 3 KiB, got {lsn}"
    );
    // The refusal is remembered and announced, for the checkpointer to make room whatever
    // the ring's fill (a large entry meets a full ring below any fill trigger).
    assert!(j.status().room_wanted);
    tokio::time::timeout(std::time::Duration::from_secs(10), j.room_wanted())
        .await
        .expect("an append refused for room was not announced");
    // Releasing beyond the durable point is refused.
    assert!(j.release_through(lsn + 1).await.is_err());
    let cp = j.release_through(lsn / 2).await.unwrap();
    assert!(cp.start_lsn <= lsn / 2 + 1 && cp.start_lsn > 1, "{cp:?}");
    // Now there is room again, and the log wraps into recycled segments.
    for _ in 0..10 {
        off += 3000;
        let t = j
            .append(Entry {
                repl_id: REPL_ID,
                repl_offset_end: off,
                payload: payload(lsn + 1, 3000),
            })
            .await
            .unwrap();
        lsn = t.lsn();
        t.wait().await.unwrap();
        assert!(
            !j.status().room_wanted,
            "an append that fit left the flag set"
        );
    }
    let j = Arc::into_inner(j).unwrap();
    j.close().unwrap();
    let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
    assert_eq!(rec.end.last_lsn(), lsn);
    assert_eq!(rec.checkpoint.start_lsn, cp.start_lsn);
    let first = j
        .replay(ReplayFrom::Lsn(0))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(first.lsn, cp.start_lsn);
    assert_eq!(
        j.replay(ReplayFrom::Lsn(0)).unwrap().count() as u64,
        lsn - cp.start_lsn + 1
    );
}

#[tokio::test]
async fn oversized_entry_rejected_large_entry_spans_segments() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = JournalConfig {
        max_entry_bytes: Some(150_000),
        segments: 5,
        ..cfg(IoBackendChoice::Sync)
    };
    let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
    let err = j
        .try_append(&Entry {
            repl_id: REPL_ID,
            repl_offset_end: 1,
            payload: payload(1, 150_001),
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::EntryTooLarge {
                len_bytes: 150_001,
                max_entry_bytes: 150_000
            }
        ),
        "{err}"
    );
    // 150 KB spans three 64 KiB segments and ten 16 KiB write buffers (pool has 8).
    let t = j
        .append(Entry {
            repl_id: REPL_ID,
            repl_offset_end: 150_000,
            payload: payload(1, 150_000),
        })
        .await
        .unwrap();
    t.wait().await.unwrap();
    let e = j
        .replay(ReplayFrom::Lsn(1))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(e.payload, payload(1, 150_000));
}

#[test]
fn geometry_change_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg(IoBackendChoice::Sync);
    drop(Journal::open(dir.path(), &cfg).unwrap());
    let other = JournalConfig { segments: 5, ..cfg };
    let err = Journal::open(dir.path(), &other).err().unwrap().to_string();
    assert!(
        err.contains("segments = 4") && err.contains("never resized in place"),
        "{err}"
    );
}

#[test]
fn auto_falls_back_to_sync_when_seccomp_blocks_io_uring() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        common::seccomp::refuse_io_uring().expect("installing the seccomp filter");
        let forced = JournalConfig {
            io_backend: IoBackendChoice::IoUring,
            ..cfg(IoBackendChoice::IoUring)
        };
        let err = Journal::open(&path, &forced)
            .err()
            .expect("io_uring must be unavailable");
        assert!(err.to_string().contains("io_uring is unavailable"), "{err}");
        let (j, rec) = Journal::open(&path, &cfg(IoBackendChoice::Auto)).unwrap();
        assert_eq!(
            rec.backend.kind,
            walrus::journal::BackendKind::Sync,
            "{}",
            rec.backend
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let t = j
            .try_append(&Entry {
                repl_id: REPL_ID,
                repl_offset_end: 5,
                payload: payload(1, 5),
            })
            .unwrap();
        rt.block_on(t.wait()).unwrap();
        j.close().unwrap();
    })
    .join()
    .unwrap();
}

/// On a device where every synchronous write takes a while (a network volume), both
/// backends keep several writes in flight. The kernel serializes the syncs of one file on its
/// inode lock, so a backend that followed each write with fdatasync would have one sync in
/// flight whatever its threads (one write per device latency); O_DSYNC writes to one file
/// overlap (docs/faultfs.md). faultfs counts the synchronous replies waiting out their
/// latency: appenders that each wait for their entry keep the writer loop busy, and two of
/// them must be waiting at once.
#[test]
fn both_backends_keep_several_synchronous_writes_in_flight_on_a_slow_device() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for backend in [IoBackendChoice::Sync, IoBackendChoice::Auto] {
        let dir = fs.path(&format!("{backend:?}"));
        std::fs::create_dir(&dir).unwrap();
        // Segments large enough that every write of the test goes to one file: writes to two
        // files would overlap in any case.
        let cfg = JournalConfig {
            segment_size_bytes: 4 << 20,
            ..cfg(backend)
        };
        let (j, rec) = Journal::open(&dir, &cfg).unwrap();
        // Long enough that the status poll sees writes waiting, short enough for a quick test.
        fs.ok("latency 100000");
        let (j, stop) = (
            Arc::new(j),
            Arc::new(std::sync::atomic::AtomicBool::new(false)),
        );
        let offset = Arc::new(std::sync::Mutex::new(0u64));
        let appenders: Vec<_> = (0..4)
            .map(|_| {
                let (j, stop, offset) = (j.clone(), stop.clone(), offset.clone());
                rt.spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let t = {
                            let mut o = offset.lock().unwrap();
                            *o += 100;
                            j.try_append(&Entry {
                                repl_id: REPL_ID,
                                repl_offset_end: *o,
                                payload: payload(*o, 100),
                            })
                            .unwrap()
                        };
                        t.wait().await.unwrap();
                    }
                })
            })
            .collect();
        fs.await_status("delayed", |n| n >= 2);
        assert!(rec.backend.dsync, "{backend:?}: {}", rec.backend);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        fs.ok("latency 0");
        for a in appenders {
            rt.block_on(a).unwrap();
        }
        Arc::into_inner(j).unwrap().close().unwrap();
    }
}

#[test]
fn second_writer_is_refused_while_open() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg(IoBackendChoice::Sync);
    let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
    let err = Journal::open(dir.path(), &cfg)
        .err()
        .expect("second open must fail")
        .to_string();
    let owner = format!("is in use by pid {} on ", std::process::id());
    assert!(err.contains(&owner), "{err}");
    j.close().unwrap();
    let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
    j.close().unwrap();
}

/// Ring space per entry is the record itself (96-byte header, the entry's 8-byte time and its
/// payload), not a 4 KiB block
/// per group commit, at one appender and any entry size: a write continues the previous
/// write's last block. Under concurrency a write opened while the one before is in flight
/// starts at the next block instead (so that the two overlap), which costs at most a block
/// of ring per write. A reopened journal continues at the end too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_entries_use_their_own_bytes_of_ring_and_at_most_a_block_per_write() {
    // A record's header and its entry's time.
    const HEADER: u64 = 96 + 8;
    const BLOCK: u64 = 4096;
    for backend in [IoBackendChoice::Sync, IoBackendChoice::Auto] {
        for (len, appenders) in [
            (100usize, 1u64),
            (100, 16),
            (1000, 1),
            (1000, 16),
            (8000, 16),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = JournalConfig {
                segments: 16,
                segment_size_bytes: 1 << 20,
                max_write_bytes: 256 << 10,
                ..cfg(backend)
            };
            let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
            let j = Arc::new(j);
            let per_appender = 400 / appenders;
            let off = Arc::new(std::sync::Mutex::new(0u64));
            let mut tasks = Vec::new();
            for _ in 0..appenders {
                let (j, off) = (j.clone(), off.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..per_appender {
                        // Each appender waits for its entry: one entry per write at 1.
                        let t = {
                            let mut o = off.lock().unwrap();
                            *o += len as u64;
                            j.try_append(&Entry {
                                repl_id: REPL_ID,
                                repl_offset_end: *o,
                                payload: payload(*o, len),
                            })
                            .unwrap()
                        };
                        t.wait().await.unwrap();
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let status = j.status();
            let records = per_appender * appenders * (HEADER + len as u64);
            let ratio = status.write_pos as f64 / records as f64;
            eprintln!(
                "{backend:?}, {len} B x {appenders}: {} writes, ring {} B for {records} B of records: {ratio:.3}x",
                status.writes_total, status.write_pos
            );
            let bound = if appenders == 1 {
                records + records / 4
            } else {
                records + status.writes_total * BLOCK
            };
            assert!(
                status.write_pos <= bound,
                "{backend:?}, {len}-byte entries, {appenders} appenders: ring space {ratio:.2}x the records"
            );
            let end = status.write_pos;
            Arc::into_inner(j).unwrap().close().unwrap();
            let (j, rec) = Journal::open(dir.path(), &cfg).unwrap();
            assert_eq!(rec.end.end_pos, end);
            j.try_append(&Entry {
                repl_id: REPL_ID,
                repl_offset_end: u64::MAX / 2,
                payload: payload(1, len),
            })
            .unwrap()
            .wait()
            .await
            .unwrap();
            assert_eq!(
                j.status().write_pos,
                end + HEADER + len as u64,
                "a reopened journal continues inside its last block"
            );
        }
    }
}

/// Initialization writes zero-filled segments one by one (each to a `.tmp` file, synced,
/// renamed into place) and the MANIFEST last. A crash after any step (SIGKILL, a pod killed
/// during its first start) leaves no MANIFEST, some segments and perhaps a partial `.tmp`:
/// the next open finishes the initialization by itself. Segments that hold data without a
/// MANIFEST are not an interrupted initialization, and are still refused.
#[tokio::test]
async fn an_interrupted_initialization_is_finished_by_the_next_open() {
    let cfg = cfg(IoBackendChoice::Sync);
    let seg = |d: &std::path::Path, i: u32| d.join(format!("seg-{i:05}.wal"));
    let entry = Entry {
        repl_id: REPL_ID,
        repl_offset_end: 10,
        payload: payload(1, 10),
    };
    for done in 0..=cfg.segments {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..done {
            std::fs::write(
                seg(dir.path(), i),
                vec![0u8; cfg.segment_size_bytes as usize],
            )
            .unwrap();
        }
        if done < cfg.segments {
            let tmp = dir.path().join(format!("seg-{done:05}.wal.tmp"));
            std::fs::write(tmp, vec![0u8; 4096]).unwrap();
        }
        let (j, rec) = Journal::open(dir.path(), &cfg)
            .unwrap_or_else(|e| panic!("after {done} of {} segments: {e}", cfg.segments));
        assert_eq!(rec.segments_initialized, cfg.segments - done);
        j.append(entry.clone()).await.unwrap().wait().await.unwrap();
        j.close().unwrap();
        assert!(
            Journal::open(dir.path(), &cfg).is_ok(),
            "reopen after {done}"
        );
    }
    // A journal that was written, then lost its MANIFEST.
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), &cfg).unwrap();
    j.append(entry).await.unwrap().wait().await.unwrap();
    j.close().unwrap();
    std::fs::remove_file(dir.path().join("MANIFEST")).unwrap();
    let err = Journal::open(dir.path(), &cfg)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("is not zero-filled"), "{err}");
}

/// A journal of 8 segments of 64 KiB on the sync backend.
fn open_eight_segments(dir: &std::path::Path) -> Arc<Journal> {
    let cfg = JournalConfig {
        segments: 8,
        ..cfg(IoBackendChoice::Sync)
    };
    Arc::new(Journal::open(dir, &cfg).unwrap().0)
}

/// A replay goes on from where an earlier one stopped (its resume point), reading nothing
/// before it, also across segments and entries fragmented over them; a resume point that a
/// release has left behind is refused, never read as recycled data.
#[tokio::test]
async fn a_replay_resumes_where_another_stopped_and_never_behind_a_release() {
    let dir = tempfile::tempdir().unwrap();
    let j = open_eight_segments(dir.path());
    let mut off = 0u64;
    let mut last = None;
    for (i, len) in [30_000usize, 50_000, 10, 90_000, 40_000, 7]
        .into_iter()
        .enumerate()
    {
        off += len as u64;
        let entry = Entry {
            repl_id: REPL_ID,
            repl_offset_end: off,
            payload: payload(i as u64 + 1, len),
        };
        last = Some(j.append(entry).await.unwrap());
    }
    last.unwrap().wait().await.unwrap();
    let all: Vec<_> = j
        .replay(ReplayFrom::Lsn(1))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    let mut first = j.replay(ReplayFrom::Lsn(1)).unwrap();
    for _ in 0..3 {
        first.next().unwrap().unwrap();
    }
    let at = first.resume_point().unwrap();
    assert_eq!(at.lsn, 4);
    let rest: Vec<_> = j.replay_at(at).unwrap().map(|e| e.unwrap()).collect();
    assert_eq!(rest, all[3..]);
    // Released through LSN 4: the head moved past where the resume point is.
    j.release_through(4).await.unwrap();
    assert!(j.status().head_pos > at.pos);
    let e = j.replay_at(at).err().expect("refused");
    assert!(e.to_string().contains("released"), "{e}");
}

/// The archive takes the newest entries from memory rather than reading back what was just
/// written: memory must return what a replay of the ring returns, entry for entry, resume
/// point for resume point (the archive goes on from either in the ring), through fragmented
/// entries, several histories, laps of the ring and releases; and never an entry the ring
/// no longer holds, nor one not yet durable.
#[tokio::test]
async fn the_newest_entries_in_memory_are_what_a_replay_of_the_ring_returns() {
    let dir = tempfile::tempdir().unwrap();
    let j = open_eight_segments(dir.path());
    assert!(j.recent_from(1, usize::MAX).is_none(), "off until asked");
    j.keep_recent(1 << 30);
    let ids = [REPL_ID, *b"0000000000111111111122222222223333333333"];
    let sizes = [1usize, 20_000, 100, 90_000, 3000, 16_000, 0, 40_000];
    let (mut off, mut lsn) = (0u64, 0u64);
    for round in 0..12usize {
        let mut last = None;
        let mut appended = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            lsn += 1;
            off += len as u64 + 1;
            let entry = Entry {
                repl_id: ids[(round + i / 5) % 2],
                repl_offset_end: off,
                payload: payload(lsn, len),
            };
            appended.push(entry.payload.clone());
            last = Some(j.append(entry).await.unwrap());
        }
        let first = lsn + 1 - sizes.len() as u64;
        let not_durable = j.recent_from(first, usize::MAX).unwrap();
        assert!(not_durable
            .iter()
            .all(|(e, _)| e.lsn <= j.durable().borrow().lsn));
        last.unwrap().wait().await.unwrap();
        let mut ring = j.replay(ReplayFrom::Lsn(first)).unwrap();
        let mut from_ring = Vec::new();
        while let Some(e) = ring.next() {
            from_ring.push((e.unwrap(), ring.resume_point().unwrap()));
        }
        assert_eq!(from_ring.len(), sizes.len());
        let from_memory = j.recent_from(first, usize::MAX).unwrap();
        assert_eq!(from_memory, from_ring, "round {round}");
        // The link's own bytes, not a copy.
        for ((e, _), p) in from_memory.iter().zip(&appended) {
            assert_eq!(e.payload.as_ptr(), p.as_ptr(), "entry {} was copied", e.lsn);
        }
        // A replay of the ring resumes at any of memory's points.
        let (_, at) = from_memory[2];
        let rest: Vec<_> = j.replay_at(at).unwrap().map(|e| e.unwrap()).collect();
        let expected: Vec<_> = from_ring[3..].iter().map(|(e, _)| e.clone()).collect();
        assert_eq!(rest, expected);
        assert_eq!(j.recent_from(lsn + 1, usize::MAX), Some(vec![]));
        // Released (the ring laps every few rounds): memory forgets it too.
        let head = j.release_through(lsn - 2).await.unwrap().start_lsn;
        assert!(head > 1 && head < lsn);
        assert!(
            j.recent_from(head - 1, usize::MAX).is_none(),
            "round {round}: released"
        );
        let held = j.recent_from(head, usize::MAX).unwrap();
        assert_eq!(held.len() as u64, lsn + 1 - head);
    }
    assert!(off > 8 * 64 * 1024 * 2, "the ring lapped");
    // Within its bound: the oldest go first.
    // The last three entries hold 16,000, 0 and 40,000 bytes.
    j.keep_recent(45_000);
    assert!(j.recent_from(lsn - 2, usize::MAX).is_none());
    assert_eq!(j.recent_from(lsn - 1, usize::MAX).unwrap().len(), 2);
}

/// A checkpoint asks for the replication id of the last durable entry: it is known from
/// what was appended, without reading the ring (a scan from the checkpoint through a ring
/// of hundreds of MB delayed every checkpoint under load by seconds). Entries of an earlier
/// history are still read from the ring.
#[tokio::test]
async fn the_last_entries_replication_id_is_known_without_reading_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), &cfg(IoBackendChoice::Sync)).unwrap();
    let other = *b"0000000000000000000000000000000000000002";
    let mut last = None;
    for lsn in 1..=6u64 {
        let entry = Entry {
            repl_id: if lsn <= 3 { REPL_ID } else { other },
            repl_offset_end: lsn * 10,
            payload: payload(lsn, 100),
        };
        last = Some(j.append(entry).await.unwrap());
    }
    last.unwrap().wait().await.unwrap();
    assert_eq!(j.repl_id_after(3).unwrap(), Some(REPL_ID));
    // Reading the ring now fails: what is answered was not read from it.
    let paths = j.segment_paths();
    for p in &paths {
        std::fs::rename(p, p.with_extension("moved")).unwrap();
    }
    assert_eq!(j.repl_id_after(6).unwrap(), Some(other));
    assert_eq!(j.repl_id_after(4).unwrap(), Some(other));
    assert!(j.repl_id_after(3).is_err(), "read from the ring");
    for p in &paths {
        std::fs::rename(p.with_extension("moved"), p).unwrap();
    }
    assert_eq!(j.repl_id_after(3).unwrap(), Some(REPL_ID));
}

/// Dropping the last handle of a journal drains what was appended and waits for its writer
/// thread. On a runtime worker that wait must not take the worker from the other tasks:
/// walrus runs one worker on two cores, and a drop at shutdown that waited there on a slow or
/// stalled disk left every session and the stop itself without a thread.
#[test]
fn a_journal_dropped_on_a_runtime_worker_leaves_the_worker_to_the_other_tasks() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = fs.path("j");
    std::fs::create_dir(&dir).unwrap();
    let (j, _) = Journal::open(&dir, &cfg(IoBackendChoice::Sync)).unwrap();
    fs.ok("stall");
    let t = j
        .try_append(&Entry {
            repl_id: REPL_ID,
            repl_offset_end: 100,
            payload: payload(100, 100),
        })
        .unwrap();
    fs.await_status("held", |n| n >= 1);
    // The drop waits for the held write; another task must run meanwhile.
    let dropped = rt.spawn(async move { drop(j) });
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move { tx.send(()).unwrap() });
    let ran = rx.recv_timeout(std::time::Duration::from_secs(10));
    fs.ok("resume");
    rt.block_on(dropped).unwrap();
    assert!(
        ran.is_ok(),
        "no other task ran while a dropped journal waited for its writer"
    );
    rt.block_on(t.wait()).unwrap();
}
