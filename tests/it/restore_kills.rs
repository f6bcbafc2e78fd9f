//! External mode under load: Valkey alone, walrus alone, or both are SIGKILLed at random
//! moments, 21 times; every acknowledged write and every value a reader saw is there at the
//! end.
use crate::common;
use common::*;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

const CYCLES: usize = 21;
const WRITERS: usize = 3;

/// Where clients find walrus now (it listens on a new port after each restart).
#[derive(Default)]
struct Target {
    addr: Mutex<String>,
    /// Signalled when `addr` changes, and at the end.
    changed: Condvar,
}

type Addr = Arc<Target>;

impl Target {
    fn set(&self, addr: &str) {
        *self.addr.lock().unwrap() = addr.to_string();
        self.changed.notify_all();
    }

    /// Wakes every client waiting for a new address: the test is over.
    fn stop(&self, stop: &AtomicBool) {
        let _held = self.addr.lock().unwrap();
        stop.store(true, Ordering::Relaxed);
        self.changed.notify_all();
    }
}

/// A connection to walrus; when it is down, waits for the test to restart it elsewhere.
fn connect(target: &Addr, stop: &AtomicBool) -> Option<Raw> {
    let mut addr = target.addr.lock().unwrap();
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let tried = addr.clone();
        if let Ok(c) = Raw::try_connect(&tried) {
            return Some(c);
        }
        addr = target
            .changed
            .wait_while(addr, |a| *a == tried && !stop.load(Ordering::Relaxed))
            .unwrap();
    }
}

/// Writes unique keys; every `+OK` goes to `acked`. Keys about to be written go to
/// `written` first, for the reader.
fn writer(
    id: usize,
    addr: Addr,
    stop: Arc<AtomicBool>,
    written: Arc<Mutex<Vec<(String, String)>>>,
    acked: mpsc::Sender<(String, String)>,
) {
    let mut i = 0u64;
    while let Some(mut c) = connect(&addr, &stop) {
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            i += 1;
            let (key, val) = (format!("w{id}:{i}"), format!("v{id}:{i}"));
            written.lock().unwrap().push((key.clone(), val.clone()));
            match c.try_cmd(&["SET", &key, &val]) {
                Some(r) if r == b"+OK\r\n" => {
                    if acked.send((key, val)).is_err() {
                        return;
                    }
                }
                // -LOADING, -MISCONF, -ERR walrus: ...: the write's fate is unknown.
                Some(r) if r.starts_with(b"-") => {}
                Some(r) => panic!("SET {key}: {}", show(&r)),
                None => break, // walrus died: reconnect
            }
        }
    }
}

/// Reads keys that writers sent; every value it sees is recorded.
fn reader(
    addr: Addr,
    stop: Arc<AtomicBool>,
    written: Arc<Mutex<Vec<(String, String)>>>,
    seen: Arc<Mutex<Vec<(String, String)>>>,
    reads: Arc<AtomicU64>,
) {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    while let Some(mut c) = connect(&addr, &stop) {
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let pick = {
                let w = written.lock().unwrap();
                if w.is_empty() {
                    None
                } else {
                    // Mostly the newest keys: the ones whose writes may be in flight.
                    let n = w.len();
                    let back = (rng.next() % 64).min(n as u64 - 1) as usize;
                    Some(w[n - 1 - back].clone())
                }
            };
            let Some((key, val)) = pick else {
                std::thread::yield_now();
                continue;
            };
            match c.try_cmd(&["GET", &key]) {
                Some(r) if r.starts_with(b"$") && r != b"$-1\r\n" => {
                    let want = format!("${}\r\n{val}\r\n", val.len());
                    assert_eq!(show(&r), show(want.as_bytes()), "GET {key}");
                    seen.lock().unwrap().push((key, val));
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => {}
                None => break,
            }
        }
    }
}

#[test]
fn kills_of_valkey_walrus_or_both_lose_nothing_acknowledged_or_seen() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let data = tempfile::tempdir().unwrap();
    let data = data.path().join("data");
    let mut valkey = Valkey::start();
    let port = valkey.port;
    let upstream = format!("127.0.0.1:{port}");
    let start_walrus = || Walrus::build().upstream(&upstream).data(&data).start();
    let mut w = start_walrus();
    let addr: Addr = Arc::default();
    addr.set(&w.addr);
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reads = Arc::new(AtomicU64::new(0));
    let (acked_tx, acked_rx) = mpsc::channel();
    let mut threads = Vec::new();
    for id in 0..WRITERS {
        let (a, s, wr, tx) = (
            addr.clone(),
            stop.clone(),
            written.clone(),
            acked_tx.clone(),
        );
        threads.push(std::thread::spawn(move || writer(id, a, s, wr, tx)));
    }
    drop(acked_tx);
    {
        let (a, s, wr, se, r) = (
            addr.clone(),
            stop.clone(),
            written.clone(),
            seen.clone(),
            reads.clone(),
        );
        threads.push(std::thread::spawn(move || reader(a, s, wr, se, r)));
    }
    let mut acked = Vec::new();
    let mut kinds = [0usize; 3];
    for cycle in 0..CYCLES {
        // Let the load run for a random number of acknowledged writes: a random moment.
        let n = 20 + rng.next() % 400;
        for _ in 0..n {
            acked.push(acked_rx.recv_timeout(START_TIMEOUT).unwrap_or_else(|_| {
                panic!(
                    "cycle {cycle}: no write acknowledged\n{}",
                    w.proc.log_text()
                )
            }));
        }
        let kind = (rng.next() % 3) as usize;
        kinds[kind] += 1;
        if kind != 1 {
            valkey.proc.signal(libc::SIGKILL);
            valkey.proc.wait_exit(START_TIMEOUT).unwrap();
        }
        if kind != 0 {
            w.proc.signal(libc::SIGKILL);
            w.proc.wait_exit(START_TIMEOUT).unwrap();
        }
        if kind != 1 {
            valkey = Valkey::start_with(&["--port", &port.to_string()]);
        }
        if kind != 0 {
            w = start_walrus();
            addr.set(&w.addr);
        } else {
            w.proc
                .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
        }
    }
    // One more acknowledged write shows the last restart worked.
    acked.push(
        acked_rx
            .recv_timeout(START_TIMEOUT)
            .expect("a write after the last cycle"),
    );
    addr.stop(&stop);
    for t in threads {
        t.join().unwrap();
    }
    acked.extend(acked_rx.try_iter());
    let seen = seen.lock().unwrap().clone();
    eprintln!(
        "{CYCLES} cycles (Valkey {}, walrus {}, both {}): {} acknowledged writes, {} values seen",
        kinds[0],
        kinds[1],
        kinds[2],
        acked.len(),
        seen.len()
    );
    assert!(
        !seen.is_empty(),
        "the reader saw nothing: the check would be empty"
    );
    let mut c = Raw::connect(&w.addr);
    for (what, list) in [("acknowledged", &acked), ("seen", &seen)] {
        for (key, val) in list {
            let r = c.cmd(&["GET", key]);
            assert_eq!(
                show(&r),
                show(format!("${}\r\n{val}\r\n", val.len()).as_bytes()),
                "{what} write {key} is lost (seed {seed})"
            );
        }
    }
}
