//! The dirty-read checker: with a slowed journal, writers run a random mix of command
//! families (plain writes, pipelines, transactions, scripts and functions with declared and
//! undeclared keys, several databases), readers read with every kind of read, and a chaos
//! thread kills upstream connections and restarts Valkey. Every value a reader sees carries
//! a token; no token may be seen before the write that produced it was acknowledged (a
//! dirty read shows up a whole journal delay early), and no operation may hang.
use crate::common;
use common::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const JOURNAL_DELAY_MS: u64 = 300;
/// A read released with the write's acknowledgement may be seen a little before the writer
/// thread records it; a dirty read is seen a whole journal write earlier.
const SLACK: Duration = Duration::from_millis(100);
const WRITERS: usize = 4;
const READERS: usize = 4;
const RUN: Duration = Duration::from_secs(10);
/// Few keys, so that reads often meet writes still in flight.
const KEYS: u64 = 4;

type Acks = Arc<Mutex<HashMap<String, Instant>>>;
type Seen = Arc<Mutex<Vec<(String, Instant)>>>;

const LIBRARY: &str = "#!lua name=checker\nredis.register_function('setit', function(keys, args) redis.call('set', args[1], args[2]) return 1 end)";

fn cmd(args: &[&str]) -> Vec<u8> {
    walrus::resp::write::command(args.iter().map(|a| a.as_bytes())).to_vec()
}

/// Reads one reply; `Err(true)` when it did not come within the client's timeout (a hang).
fn reply(c: &mut Raw) -> Result<Vec<u8>, bool> {
    c.try_read_frame()
        .map_err(|e| e.contains("temporarily unavailable") || e.contains("timed out"))
}

fn connect(addr: &Arc<Mutex<String>>) -> Raw {
    let a = addr.lock().unwrap().clone();
    let c = Raw::connect(&a);
    c.stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    c
}

/// One writer: each round picks a database and a command family; every value is a token.
fn writer(
    id: usize,
    addr: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    acks: Acks,
    hung: Arc<AtomicBool>,
) {
    let mut rng = Rng(0x51f1 + id as u64 * 7919);
    let mut n = 0u64;
    let mut c = connect(&addr);
    while !stop.load(Ordering::Relaxed) {
        let db = rng.below(2).to_string();
        let key = format!("k{}", rng.below(KEYS));
        let mut tokens = Vec::new();
        let mut tok = || {
            n += 1;
            let t = format!("tok:{id}:{n};");
            tokens.push(t.clone());
            t
        };
        let mut out = cmd(&["SELECT", &db]);
        // SELECT's reply and one for the family's command, unless it sends more.
        let mut replies = 2;
        // Mostly scripts and functions writing keys they do not declare: the hardest case.
        match rng.below(10).saturating_sub(3) {
            0 => {
                // A pipeline of plain writes.
                for _ in 0..4 {
                    out.extend(cmd(&["SET", &format!("p{}", rng.below(20)), &tok()]));
                }
                replies += 3;
            }
            1 => out.extend(cmd(&["RPUSH", "list", &tok()])),
            2 => out.extend(cmd(&["HSET", "hash", &key, &tok()])),
            3 => {
                out.extend(cmd(&["MULTI"]));
                out.extend(cmd(&["SET", &key, &tok()]));
                out.extend(cmd(&["INCR", "counter"]));
                out.extend(cmd(&["EXEC"]));
                replies += 3;
            }
            4 => out.extend(cmd(&[
                "EVAL",
                "redis.call('set', KEYS[1], ARGV[1]); return 1",
                "1",
                &key,
                &tok(),
            ])),
            5 => {
                // Declares one key, writes another.
                let t = tok();
                out.extend(cmd(&[
                    "EVAL",
                    "redis.call('set', KEYS[1], ARGV[1]); redis.call('set', ARGV[2], ARGV[1]); return 1",
                    "1",
                    "declared",
                    &t,
                    &key,
                ]));
            }
            _ => out.extend(cmd(&["FCALL", "setit", "1", "declared", &key, &tok()])),
        }
        c.send_raw(&out);
        let mut all_ok = true;
        for _ in 0..replies {
            match reply(&mut c) {
                Ok(r) => all_ok &= !r.starts_with(b"-"),
                Err(h) => {
                    if h {
                        hung.store(true, Ordering::Relaxed);
                    }
                    all_ok = false;
                    c = connect(&addr);
                    break;
                }
            }
        }
        if all_ok {
            let at = Instant::now();
            let mut acks = acks.lock().unwrap();
            for t in tokens {
                acks.insert(t, at);
            }
        } else {
            // A transaction's dedicated connection may have been killed: start afresh.
            c = connect(&addr);
        }
    }
}

/// One reader: every kind of read, in random databases; every token in a reply is seen.
fn reader(
    id: usize,
    addr: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    seen: Seen,
    hung: Arc<AtomicBool>,
) {
    let mut rng = Rng(0xa5a5 + id as u64 * 104729);
    let mut c = connect(&addr);
    while !stop.load(Ordering::Relaxed) {
        let db = rng.below(2).to_string();
        let key = format!("k{}", rng.below(KEYS));
        let read: Vec<&str> = match rng.below(10) {
            0 => vec!["MGET", "p1", "p2", &key],
            1 => vec!["HGETALL", "hash"],
            2 => vec!["LRANGE", "list", "-5", "-1"],
            3 => vec!["SCAN", "0", "COUNT", "100"],
            4 => vec!["DBSIZE"],
            5 | 6 => vec!["EVAL_RO", "return redis.call('get', ARGV[1])", "0", &key],
            _ => vec!["GET", &key],
        };
        let mut out = cmd(&["SELECT", &db]);
        out.extend(cmd(&read));
        c.send_raw(&out);
        let mut got = Vec::new();
        for _ in 0..2 {
            match reply(&mut c) {
                Ok(r) => got = r,
                Err(h) => {
                    if h {
                        hung.store(true, Ordering::Relaxed);
                    }
                    c = connect(&addr);
                    break;
                }
            }
        }
        let at = Instant::now();
        let text = String::from_utf8_lossy(&got);
        let mut seen = seen.lock().unwrap();
        for part in text.split("tok:").skip(1) {
            if let Some(end) = part.find(';') {
                seen.push((format!("tok:{}", &part[..=end]), at));
            }
        }
    }
}

#[test]
fn no_read_shows_a_write_before_it_is_acknowledged_and_nothing_hangs() {
    let v = Valkey::start();
    let port = v.port;
    let w = Walrus::slow(&v, JOURNAL_DELAY_MS);
    let mut setup = Raw::connect(&w.addr);
    let r = setup.cmd(&["FUNCTION", "LOAD", LIBRARY]);
    assert_eq!(show(&r), "$7⏎checker⏎");
    let addr = Arc::new(Mutex::new(w.addr.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let hung = Arc::new(AtomicBool::new(false));
    let acks: Acks = Arc::default();
    let seen: Seen = Arc::default();
    let mut threads = Vec::new();
    for id in 0..WRITERS {
        let (a, s, k, h) = (addr.clone(), stop.clone(), acks.clone(), hung.clone());
        threads.push(std::thread::spawn(move || writer(id, a, s, k, h)));
    }
    for id in 0..READERS {
        let (a, s, k, h) = (addr.clone(), stop.clone(), seen.clone(), hung.clone());
        threads.push(std::thread::spawn(move || reader(id, a, s, k, h)));
    }

    // Chaos: upstream connections killed every 1.5 s, and Valkey restarted once halfway
    // (walrus restores it while the clients go on).
    let started = Instant::now();
    let mut valkey = Some(v);
    let mut restarted = None;
    while started.elapsed() < RUN {
        if restarted.is_none() && started.elapsed() > RUN / 2 {
            drop(valkey.take());
            restarted = Some(Valkey::start_with(&["--port", &port.to_string()]));
        }
        let mut direct = Raw::connect(&format!("127.0.0.1:{port}"));
        direct.send_raw(&cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]));
        let _ = direct.try_read_frame();
        // Chaos pacing, not synchronization.
        std::thread::sleep(Duration::from_millis(1500));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        !hung.load(Ordering::Relaxed),
        "an operation hung\n{}",
        w.proc.log_text()
    );
    let acks = acks.lock().unwrap();
    let seen = seen.lock().unwrap();
    let mut checked = 0;
    for (token, at) in seen.iter() {
        if let Some(acked) = acks.get(token) {
            checked += 1;
            assert!(
                *at + SLACK >= *acked,
                "{token} was read {:?} before its write was acknowledged",
                acked.duration_since(*at)
            );
        }
    }
    eprintln!(
        "{} acknowledged writes, {} values seen, {checked} checked against their acknowledgement",
        acks.len(),
        seen.len()
    );
    assert!(checked >= 20, "too few reads to check: {checked}");
}
