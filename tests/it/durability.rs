//! The durable write path against a real Valkey: what walrus acknowledges survives walrus
//! being killed, and no client reads a value the journal does not cover yet.
use crate::common;
use common::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use walrus::journal::{Journal, ReplayFrom};

/// Every kind of write the clients run; each carries a token no other write uses.
const KINDS: usize = 5;

/// One client's loop: unique writes, recording each acknowledged token. Stops when walrus
/// goes away (its connection breaks) or `stop` is set.
fn writer(
    addr: String,
    round: usize,
    client: usize,
    acked: mpsc::Sender<(usize, String)>,
    stop: Arc<AtomicBool>,
) {
    let Ok(stream) = std::net::TcpStream::connect(&addr) else {
        return;
    };
    drop(stream);
    let mut c = Raw::connect(&addr);
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let tok = format!("tok-{round}-{client}-{i}");
        let kind = i % KINDS;
        let reply = match kind {
            0 => {
                let key = format!("s:{tok}");
                c.try_cmd(&["SET", &key, &tok])
            }
            1 => c.try_cmd(&["RPUSH", &format!("l:{client}"), &tok]),
            2 => c.try_cmd(&["HSET", &format!("h:{client}"), &tok, &tok]),
            3 => {
                let key = format!("e:{tok}");
                c.try_cmd(&[
                    "EVAL",
                    "return redis.call('SET', KEYS[1], ARGV[1])",
                    "1",
                    &key,
                    &tok,
                ])
            }
            _ => {
                // A transaction: its acknowledgement is EXEC's reply.
                let key = format!("m:{tok}");
                c.try_cmd(&["MULTI"])
                    .and_then(|_| c.try_cmd(&["SET", &key, &tok]))
                    .and_then(|_| c.try_cmd(&["INCR", &format!("n:{client}")]))
                    .and_then(|_| c.try_cmd(&["EXEC"]))
            }
        };
        match reply {
            Some(r) if !r.starts_with(b"-") => {
                if acked.send((kind, tok)).is_err() {
                    return;
                }
            }
            _ => return, // walrus was killed: the outcome of this write is unknown
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn acknowledged_writes_survive_sigkill_of_walrus() {
    // Uncompressed RDB strings, so that tokens covered by a checkpoint can be found in it.
    let v = Valkey::start_with(&["--rdbcompression", "no"]);
    let data = tempfile::tempdir().unwrap();
    let mut acked: Vec<(usize, String)> = Vec::new();
    let rounds = 6;
    for round in 0..rounds {
        let mut w = Walrus::build()
            .upstream(&v.addr())
            .data(data.path())
            .start();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..8)
            .map(|client| {
                let (addr, tx, stop) = (w.addr.clone(), tx.clone(), stop.clone());
                std::thread::spawn(move || writer(addr, round, client, tx, stop))
            })
            .collect();
        drop(tx);
        // Kill walrus after a varying number of acknowledgements, mid-stream.
        let kill_after = 100 + (round * 137) % 400;
        let mut this_round = 0;
        while this_round < kill_after {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(a) => {
                    acked.push(a);
                    this_round += 1;
                }
                Err(e) => panic!("writers stalled ({e}); walrus log:\n{}", w.proc.log_text()),
            }
        }
        w.proc.signal(libc::SIGKILL);
        w.proc
            .wait_exit(Duration::from_secs(10))
            .expect("walrus exits on SIGKILL");
        stop.store(true, Ordering::Relaxed);
        // Acknowledgements that arrived before the kill count too.
        acked.extend(rx.iter());
        for c in clients {
            c.join().unwrap();
        }
    }
    assert!(acked.len() >= rounds * 100);

    // 1. Valkey (which kept running) has every acknowledged write.
    let mut d = Raw::connect(&v.addr());
    let mut lists: HashMap<String, Vec<u8>> = HashMap::new();
    for (kind, tok) in &acked {
        let client = tok.split('-').nth(2).unwrap();
        let present = match kind {
            0 => d
                .cmd(&["GET", &format!("s:{tok}")])
                .ends_with(format!("{tok}\r\n").as_bytes()),
            1 => {
                let key = format!("l:{client}");
                let all = lists
                    .entry(key.clone())
                    .or_insert_with(|| d.cmd(&["LRANGE", &key, "0", "-1"]));
                contains(all, tok.as_bytes())
            }
            2 => d
                .cmd(&["HGET", &format!("h:{client}"), tok])
                .ends_with(format!("{tok}\r\n").as_bytes()),
            3 => d
                .cmd(&["GET", &format!("e:{tok}")])
                .ends_with(format!("{tok}\r\n").as_bytes()),
            _ => d
                .cmd(&["GET", &format!("m:{tok}")])
                .ends_with(format!("{tok}\r\n").as_bytes()),
        };
        assert!(
            present,
            "acknowledged write {tok} (kind {kind}) is missing from Valkey"
        );
    }

    // 2. The journal (with the checkpoint it starts from) covers every acknowledged write,
    //    and its offsets are Valkey's, contiguous across every restart of walrus.
    let cfg = walrus::config::Config::parse(TEST_JOURNAL).unwrap().journal;
    let (journal, _) = Journal::open(&data.path().join("journal"), &cfg).unwrap();
    let mut covered: Vec<u8> = Vec::new();
    let mut prev: Option<([u8; 40], u64)> = None;
    for e in journal.replay(ReplayFrom::ReplOffset(0)).unwrap() {
        let e = e.unwrap();
        let start = e.repl_offset_end - e.payload.len() as u64;
        if let Some((id, end)) = prev {
            if id == e.repl_id {
                assert_eq!(
                    start, end,
                    "journal entry {} does not start where the previous one ended",
                    e.lsn
                );
            }
        }
        prev = Some((e.repl_id, e.repl_offset_end));
        covered.extend_from_slice(&e.payload);
    }
    for f in std::fs::read_dir(data.path().join("checkpoints")).unwrap() {
        covered.extend(std::fs::read(f.unwrap().path()).unwrap());
    }
    for (kind, tok) in &acked {
        assert!(
            contains(&covered, tok.as_bytes()),
            "acknowledged write {tok} (kind {kind}) is in neither journal nor checkpoint"
        );
    }
}

/// True when `c` has bytes to read right now.
fn has_reply(c: &Raw) -> bool {
    c.stream.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = c.stream.peek(&mut b);
    c.stream.set_nonblocking(false).unwrap();
    matches!(r, Ok(n) if n > 0)
}

#[test]
fn reads_wait_for_the_journal_and_clean_reads_do_not() {
    let v = Valkey::start();
    let w = Walrus::slow(&v, 300);
    let mut writer = Raw::connect(&w.addr);
    let mut reader = Raw::connect(&w.addr);
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(writer.cmd(&["SET", "k", "v1"]), b"+OK\r\n");
    assert_eq!(writer.cmd(&["HSET", "h", "f", "1"]), b":1\r\n");
    assert_eq!(reader.cmd(&["SET", "clean", "c"]), b"+OK\r\n");

    // A write Valkey has executed but the journal does not cover yet.
    writer.send_raw(&walrus::resp::write::command(["SET", "k", "v2"]));
    while direct.cmd(&["GET", "k"]) != b"$2\r\nv2\r\n" {}

    // Reads of other keys are answered at once, while the write still waits.
    assert_eq!(reader.cmd(&["GET", "clean"]), b"$1\r\nc\r\n");
    assert_eq!(reader.cmd(&["HGET", "h", "f"]), b"$1\r\n1\r\n");
    assert!(
        !has_reply(&writer),
        "the write was acknowledged before the journal covered it"
    );

    // Reads that touch the dirty key are held with it: single key, several keys, a
    // keyspace scan, a transaction.
    let held: [&[&str]; 4] = [
        &["GET", "k"],
        &["MGET", "clean", "k"],
        &["DBSIZE"],
        &["EXISTS", "k"],
    ];
    for cmd in held {
        reader.send_raw(&walrus::resp::write::command(cmd.iter().copied()));
    }
    assert!(
        !has_reply(&reader),
        "a read of a dirty key was answered before the journal covered it"
    );
    assert_eq!(writer.read_frame(), b"+OK\r\n");
    assert_eq!(reader.read_frame(), b"$2\r\nv2\r\n");
    assert_eq!(reader.read_frame(), b"*2\r\n$1\r\nc\r\n$2\r\nv2\r\n");
    assert_eq!(reader.read_frame(), b":3\r\n");
    assert_eq!(reader.read_frame(), b":1\r\n");
}

#[test]
fn readers_hammering_a_key_never_see_a_value_before_its_write_is_acknowledged() {
    let v = Valkey::start();
    let delay = Duration::from_millis(200);
    let w = Walrus::slow(&v, delay.as_millis() as u64);
    let acks: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (addr, done) = (w.addr.clone(), done.clone());
            std::thread::spawn(move || {
                let mut c = Raw::connect(&addr);
                let mut seen = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let r = c.cmd(&["GET", "hot"]);
                    let at = Instant::now();
                    if let Some(v) = std::str::from_utf8(&r)
                        .ok()
                        .and_then(|s| s.split("\r\n").nth(1))
                        .and_then(|v| v.parse::<u64>().ok())
                    {
                        seen.push((v, at));
                    }
                }
                seen
            })
        })
        .collect();
    let mut writer = Raw::connect(&w.addr);
    for i in 1..=10u64 {
        assert_eq!(writer.cmd(&["SET", "hot", &i.to_string()]), b"+OK\r\n");
        acks.lock().unwrap().insert(i, Instant::now());
    }
    done.store(true, Ordering::Relaxed);
    let acks = acks.lock().unwrap();
    let mut reads = 0;
    for r in readers {
        for (value, at) in r.join().unwrap() {
            reads += 1;
            let acked = acks[&value];
            // Released together with the acknowledgement (the reader may even see it a hair
            // before the writer thread records it), never a journal write earlier.
            assert!(
                at + delay / 2 >= acked,
                "value {value} was read {:?} before its write was acknowledged",
                acked.duration_since(at)
            );
        }
    }
    assert!(reads > 10, "the readers made only {reads} reads");
}

#[test]
fn checkpoints_let_the_ring_take_more_than_its_size() {
    let v = Valkey::start();
    // The test ring holds 16 MiB; write 48 MiB through it, overwriting the same keys so that
    // each checkpoint's RDB stays small.
    let w = Walrus::build().upstream(&v.addr()).with_metrics().start();
    let taken = w.checkpoints();
    let mut c = Raw::connect(&w.addr);
    let value = "x".repeat(256 << 10);
    for i in 0..192 {
        let key = format!("big:{}", i % 8);
        assert_eq!(c.cmd(&["SET", &key, &value]), b"+OK\r\n", "write {i}");
    }
    w.await_checkpoint(taken);
    let checkpoints: Vec<_> = std::fs::read_dir(w.data.path().join("data/checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".rdb"))
        .collect();
    // The recorded checkpoint, and perhaps the next one, stored but not recorded yet (the
    // ring may still be asking for one): every older one is gone.
    assert!(
        (1..=2).contains(&checkpoints.len()),
        "only the newest checkpoint is kept: {checkpoints:?}"
    );
    assert!(
        checkpoints.iter().all(|c| c.starts_with("checkpoint-")),
        "{checkpoints:?}"
    );
}

#[test]
fn a_failing_journal_refuses_writes_and_keeps_serving_clean_reads() {
    let v = Valkey::start();
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(direct.cmd(&["SET", "clean", "c"]), b"+OK\r\n"); // in the RDB, not the journal
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("io_backend = \"sync\"\n")
        .failpoint("journal::write", "return(write:EIO@poison)")
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "before", "ok"]), b"+OK\r\n");
    // The write runs in Valkey, but its journal write fails: never acknowledged.
    let first = c.cmd(&["SET", "k", "poison"]);
    assert!(
        first.starts_with(b"-MISCONF walrus: journal failed"),
        "{}",
        show(&first)
    );
    // Later writes are refused before they reach Valkey.
    assert!(c.cmd(&["SET", "k2", "v"]).starts_with(b"-MISCONF"));
    assert_eq!(direct.cmd(&["EXISTS", "k2"]), b":0\r\n");
    // A read of the unjournaled write fails; reads of clean keys go on.
    assert!(c.cmd(&["GET", "k"]).starts_with(b"-MISCONF"));
    assert_eq!(c.cmd(&["GET", "clean"]), b"$1\r\nc\r\n");
    assert_eq!(c.cmd(&["GET", "before"]), b"$2\r\nok\r\n");
    assert_eq!(
        direct.cmd(&["GET", "k"]),
        b"$6\r\npoison\r\n",
        "the write did run in Valkey"
    );
}

/// Where the container runtime's default seccomp profile refuses io_uring (containerd's and
/// Docker's RuntimeDefault), a managed walrus with the default `journal.io_backend = "auto"`
/// says so, names the fallback in its log, `/metrics` and `walrus status`, journals with it (O_DSYNC
/// writes), and after a SIGKILL of walrus and Valkey restores every acknowledged write.
#[test]
fn under_a_seccomp_profile_refusing_io_uring_the_fallback_journals_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let metrics = format!("127.0.0.1:{}", free_port());
    let start = || {
        Walrus::build()
            .data(&data)
            .args(&["--metrics-listen", &metrics])
            .refuse_io_uring()
            .start()
    };
    let mut w = start();
    // It logged both before it listened.
    let log = w.proc.log_text();
    assert!(
        log.contains("io_uring unavailable, using the sync backend"),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("journal open")
            && l.contains("backend=sync (pwrite on threads)")
            && l.contains("O_DSYNC on")),
        "{log}"
    );
    let (_, body) = http_get(&metrics, "/metrics");
    let info: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("walrus_journal_info{"))
        .collect();
    assert!(
        matches!(&info[..], [l] if l.starts_with("walrus_journal_info{backend=\"sync\"") && l.ends_with(" 1")),
        "{info:?}"
    );
    let status = output_text(&run_walrus(&["status", "--metrics", &metrics]));
    assert!(
        status.contains("journal      sync (pwrite on threads), O_DIRECT"),
        "{status}"
    );

    // Four clients, each with a pipeline of writes: several journal writes in flight.
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let addr = w.addr.clone();
            std::thread::spawn(move || {
                let cmds: Vec<Vec<String>> = (0..250)
                    .map(|i| vec!["SET".into(), format!("k:{client}:{i}"), format!("v{i}")])
                    .collect();
                pipeline(&mut Raw::connect(&addr), &cmds, b"+OK\r\n", None);
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    assert!(metric(&metrics, "walrus_journal_written_bytes_total") > 0.0);

    w.kill_with_valkey();
    let w = start();
    assert!(
        w.proc.log_text().contains("io_uring unavailable"),
        "{}",
        w.proc.log_text()
    );
    let mut c = Raw::connect(&w.addr);
    for client in 0..4 {
        for i in 0..250 {
            let key = format!("k:{client}:{i}");
            assert_eq!(c.cmd(&["GET", &key]), bulk(format!("v{i}")), "{key}");
        }
    }
}
