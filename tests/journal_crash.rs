//! Crash test: a writer child process is SIGKILLed mid-write, repeatedly, on the same
//! journal. After each kill, recovery must return exactly a prefix of what was appended,
//! and that prefix must contain every entry the child reported durable.
//!
//! The child is this test binary re-executed with an env var, running the ignored test
//! `crash_child_writer`; it prints `DURABLE <lsn>` as tickets resolve. The parent reads a
//! random number of those lines (awaiting output, never sleeping), then kills it.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use bytes::Bytes;
use walrus::journal::{Entry, IoBackendChoice, Journal, JournalConfig, ReplayFrom, Tail};

const ENV_DIR: &str = "WALRUS_CRASH_CHILD_DIR";
const ENV_BACKEND: &str = "WALRUS_CRASH_CHILD_BACKEND";
const REPL_ID: [u8; 40] = *b"c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

fn cfg(backend: &str) -> JournalConfig {
    let io_backend = if backend == "sync" {
        IoBackendChoice::Sync
    } else {
        IoBackendChoice::Auto
    };
    JournalConfig {
        io_backend,
        ..JournalConfig::small_for_tests(64 * 1024, 4)
    }
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x
}

/// Deterministic payload of LSN `lsn` written by incarnation `epoch`: [lsn][epoch][pattern].
fn gen_payload(lsn: u64, epoch: u32) -> Vec<u8> {
    let len = 12 + (mix(lsn ^ (u64::from(epoch) << 40)) % 3000) as usize;
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&lsn.to_le_bytes());
    v.extend_from_slice(&epoch.to_le_bytes());
    v.extend((12..len).map(|i| (mix(lsn * 31 + i as u64 + u64::from(epoch)) & 0xff) as u8));
    v
}

fn check_payload(lsn: u64, p: &[u8]) -> Result<(), String> {
    if p.len() < 12 {
        return Err(format!("LSN {lsn}: payload of {} bytes", p.len()));
    }
    let got_lsn = u64::from_le_bytes(p[..8].try_into().unwrap());
    let epoch = u32::from_le_bytes(p[8..12].try_into().unwrap());
    if got_lsn != lsn || gen_payload(lsn, epoch) != p {
        return Err(format!(
            "LSN {lsn}: payload is not what was appended (claims LSN {got_lsn}, epoch {epoch})"
        ));
    }
    Ok(())
}

#[test]
#[ignore = "child process of crash_loop_*; runs only when re-executed by them"]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(ENV_DIR) else {
        return;
    };
    let backend = std::env::var(ENV_BACKEND).unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (j, rec) = Journal::open(Path::new(&dir), &cfg(&backend)).unwrap();
        let j = std::sync::Arc::new(j);
        let epoch = rec.epoch;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<walrus::journal::Ticket>(64);
        // Runs until the process is killed.
        let _printer = tokio::spawn(async move {
            let mut out = std::io::stdout();
            while let Some(t) = rx.recv().await {
                let d = t.wait().await.unwrap();
                writeln!(out, "DURABLE {}", d.lsn).unwrap();
                out.flush().unwrap();
            }
        });
        let mut lsn = rec.end.next_lsn;
        let mut off = rec.end.last_repl_offset;
        // Appends until SIGKILL; the parent never lets it finish.
        loop {
            let p = gen_payload(lsn, epoch);
            off += p.len() as u64;
            let entry = Entry {
                repl_id: REPL_ID,
                repl_offset_end: off,
                payload: Bytes::from(p),
            };
            match j.append(entry.clone()).await {
                Ok(t) => {
                    assert_eq!(t.lsn(), lsn);
                    tx.send(t).await.unwrap();
                    lsn += 1;
                }
                Err(walrus::journal::JournalError::RingFull { .. }) => {
                    // Release everything durable (the segment of the newest entry stays), retry.
                    off -= entry.payload.len() as u64;
                    let mut d = j.durable();
                    let target = lsn - 1;
                    let durable = d.wait_for(|d| d.lsn >= target).await.unwrap().lsn;
                    j.release_through(durable).await.unwrap();
                }
                Err(e) => panic!("append failed: {e}"),
            }
        }
    });
}

/// The crash loops run one at a time. A child spawned by one loop holds, from fork to exec,
/// copies of the parent's open descriptors, among them the other loop's journal lock while
/// that loop checks its journal; the other loop's next child could then find its journal
/// "in use".
static ONE_LOOP_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn crash_loop(backend: &str, rounds: u32) {
    let _one = ONE_LOOP_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = 0x9e3779b97f4a7c15u64 ^ u64::from(rounds);
    let mut total_verified = 0u64;
    let mut kills_mid_ring = 0u32;
    for round in 0..rounds {
        rng = mix(rng.wrapping_add(round as u64));
        let kill_after = 1 + rng % 300;
        let mut child = Command::new(&exe)
            .args([
                "crash_child_writer",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENV_DIR, dir.path())
            .env(ENV_BACKEND, backend)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut max_durable = 0u64;
        let mut seen = 0u64;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("DURABLE ") {
                max_durable = max_durable.max(n.trim().parse().unwrap());
                seen += 1;
                if seen == kill_after {
                    break;
                }
            }
        }
        assert_eq!(seen, kill_after, "round {round}: child exited early");
        // SAFETY: plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
        child.wait().unwrap();

        let (j, rec) = Journal::open(dir.path(), &cfg(backend)).unwrap();
        assert!(
            matches!(rec.tail, Tail::End { .. }),
            "round {round}: crash reported as corruption: {:?}",
            rec.tail
        );
        assert!(
            rec.end.last_lsn() >= max_durable,
            "round {round}: recovered up to LSN {} but LSN {max_durable} was reported durable",
            rec.end.last_lsn()
        );
        if rec.checkpoint.start_pos > 0 {
            kills_mid_ring += 1;
        }
        let mut expect_lsn = rec.checkpoint.start_lsn;
        let mut off = rec.checkpoint.prev_repl_offset;
        for e in j.replay(ReplayFrom::Lsn(0)).unwrap() {
            let e = e.unwrap();
            assert_eq!(e.lsn, expect_lsn, "round {round}: LSN gap");
            check_payload(e.lsn, &e.payload).unwrap_or_else(|m| panic!("round {round}: {m}"));
            off += e.payload.len() as u64;
            assert_eq!(
                e.repl_offset_end, off,
                "round {round}: LSN {} repl offset",
                e.lsn
            );
            expect_lsn += 1;
            total_verified += 1;
        }
        assert_eq!(
            expect_lsn - 1,
            rec.end.last_lsn(),
            "round {round}: replay stops before the recovered end"
        );
        j.close().unwrap();
    }
    eprintln!("{backend}: {rounds} kills, {total_verified} replayed entries verified, {kills_mid_ring} after checkpoints moved");
    assert!(
        total_verified > u64::from(rounds),
        "too little was verified: {total_verified}"
    );
}

#[test]
fn crash_loop_sync_backend() {
    crash_loop("sync", 25);
}

#[test]
fn crash_loop_default_backend() {
    crash_loop("auto", 25);
}
