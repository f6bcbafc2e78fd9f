//! Pipelining under load: many clients, each with a long pipeline of mixed commands written in
//! large batches, every reply checked byte for byte against the reply computed from the
//! commands' semantics, in order. Plus SELECT and MULTI in the middle of a pipeline.

use crate::common;
use common::*;

use bytes::BytesMut;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;
use walrus::resp::{Limits, ReplyScanner};

const CLIENTS: usize = 50;
const COMMANDS_PER_CLIENT: usize = 10_000;
/// Commands are written in batches of about this many bytes.
const BATCH_BYTES: usize = 64 << 10;

fn cmd(args: &[&[u8]]) -> Vec<u8> {
    walrus::resp::write::command(args.iter().copied()).to_vec()
}

fn int(n: i64) -> Vec<u8> {
    format!(":{n}\r\n").into_bytes()
}

const NIL: &[u8] = b"$-1\r\n";

/// A small deterministic generator (xorshift64*), so a failure can be reproduced.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Mostly small values, some up to 4 KiB, a few of 100 KiB; text or arbitrary bytes
    /// (CR, LF and NUL included).
    fn value(&mut self) -> Vec<u8> {
        let len = match self.below(1000) {
            0..=1 => 100 << 10,
            2..=249 => self.below(4097) as usize,
            _ => self.below(65) as usize,
        };
        if self.below(2) == 0 {
            (0..len).map(|_| self.next() as u8).collect()
        } else {
            (0..len).map(|i| b'a' + (i % 26) as u8).collect()
        }
    }
}

/// What one client's keys hold, to compute each reply.
#[derive(Default)]
struct Model {
    strings: HashMap<Vec<u8>, Vec<u8>>,
    counter: Option<i64>,
    list: Vec<Vec<u8>>,
    hash: HashMap<Vec<u8>, Vec<u8>>,
}

/// Generates one command and its expected reply.
fn step(rng: &mut Rng, m: &mut Model, client: usize) -> (Vec<u8>, Vec<u8>) {
    let skey = |j: u64| format!("pipe:{client}:s{j}").into_bytes();
    let nkey = format!("pipe:{client}:n").into_bytes();
    let lkey = format!("pipe:{client}:l").into_bytes();
    let hkey = format!("pipe:{client}:h").into_bytes();
    match rng.below(100) {
        0..=17 => {
            let k = skey(rng.below(8));
            let v = rng.value();
            let c = cmd(&[b"SET", &k, &v]);
            m.strings.insert(k, v);
            (c, b"+OK\r\n".to_vec())
        }
        18..=35 => {
            let k = skey(rng.below(8));
            let r = m.strings.get(&k).map_or(NIL.to_vec(), bulk);
            (cmd(&[b"GET", &k]), r)
        }
        36..=47 => {
            let n = m.counter.unwrap_or(0) + 1;
            m.counter = Some(n);
            (cmd(&[b"INCR", &nkey]), int(n))
        }
        48..=57 => {
            let v = rng.value();
            let c = cmd(&[b"RPUSH", &lkey, &v]);
            m.list.push(v);
            (c, int(m.list.len() as i64))
        }
        58..=64 => {
            // The last three elements, as Valkey clamps the range.
            let from = m.list.len().saturating_sub(3);
            let items = &m.list[from..];
            let mut r = format!("*{}\r\n", items.len()).into_bytes();
            for i in items {
                r.extend_from_slice(&bulk(i));
            }
            (cmd(&[b"LRANGE", &lkey, b"-3", b"-1"]), r)
        }
        65..=74 => {
            let f = format!("f{}", rng.below(16)).into_bytes();
            let v = rng.value();
            let c = cmd(&[b"HSET", &hkey, &f, &v]);
            let new = m.hash.insert(f, v).is_none();
            (c, int(new as i64))
        }
        75..=84 => {
            let f = format!("f{}", rng.below(16)).into_bytes();
            let r = m.hash.get(&f).map_or(NIL.to_vec(), bulk);
            (cmd(&[b"HGET", &hkey, &f]), r)
        }
        85..=92 => {
            let (k, existed) = match rng.below(4) {
                0 => {
                    let k = skey(rng.below(8));
                    let e = m.strings.remove(&k).is_some();
                    (k, e)
                }
                1 => (nkey, m.counter.take().is_some()),
                2 => {
                    let e = !m.list.is_empty();
                    m.list.clear();
                    (lkey, e)
                }
                _ => {
                    let e = !m.hash.is_empty();
                    m.hash.clear();
                    (hkey, e)
                }
            };
            (cmd(&[b"DEL", &k]), int(existed as i64))
        }
        _ => (cmd(&[b"PING"]), b"+PONG\r\n".to_vec()),
    }
}

/// Reads replies and checks each against the next expected one.
fn check_replies(
    mut rd: TcpStream,
    expected: mpsc::Receiver<Vec<Vec<u8>>>,
    client: usize,
) -> usize {
    let mut scanner = ReplyScanner::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut chunk = vec![0u8; 256 << 10];
    let mut n = 0;
    for batch in expected {
        for want in batch {
            let got = loop {
                if let Some(len) = scanner.scan(&buf).unwrap() {
                    break buf.split_to(len);
                }
                let r = rd
                    .read(&mut chunk)
                    .unwrap_or_else(|e| panic!("client {client}: reply {n}: {e}"));
                assert!(r > 0, "client {client}: connection closed at reply {n}");
                buf.extend_from_slice(&chunk[..r]);
            };
            if got[..] != want[..] {
                panic!(
                    "client {client}: reply {n}: expected {:.200}, got {:.200}",
                    show(&want),
                    show(&got)
                );
            }
            n += 1;
        }
    }
    assert!(
        buf.is_empty(),
        "client {client}: extra bytes {}",
        show(&buf)
    );
    n
}

fn run_client(addr: String, client: usize, commands: usize) -> usize {
    let stream = TcpStream::connect(&addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let rd = stream.try_clone().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || check_replies(rd, rx, client));
    let mut wr = stream;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((client as u64 + 1) * 0x1000_0001));
    let mut model = Model::default();
    let mut out = Vec::with_capacity(BATCH_BYTES * 2);
    let mut expected = Vec::new();
    for i in 0..commands {
        let (c, r) = step(&mut rng, &mut model, client);
        out.extend_from_slice(&c);
        expected.push(r);
        if out.len() >= BATCH_BYTES || i + 1 == commands {
            // The reader learns what to expect before the replies can arrive.
            tx.send(std::mem::take(&mut expected)).unwrap();
            wr.write_all(&out).unwrap();
            out.clear();
        }
    }
    drop(tx);
    reader.join().unwrap()
}

/// Every client's pipeline, each reply checked; walrus answers a PING afterwards.
fn fifty_clients_pipelining(w: &Walrus, commands: usize) {
    let threads: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let addr = w.addr.clone();
            std::thread::spawn(move || run_client(addr, client, commands))
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), commands);
    }
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
}

#[test]
fn fifty_clients_pipelining_mixed_commands_get_every_reply_in_order() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    fifty_clients_pipelining(&w, COMMANDS_PER_CLIENT);
}

/// With a connection allowed to owe only two replies, walrus keeps hitting the bound
/// (`upstream.max_in_flight_requests`): it waits for replies and sends the rest as they
/// arrive, in order, never dropping or mixing one up, and never stalling.
#[test]
fn a_connection_owing_its_most_replies_waits_for_them_and_loses_none() {
    let v = Valkey::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[upstream]\nmax_in_flight_requests = 2\n")
        .args(&["--metrics-listen", &metrics])
        .start();
    fifty_clients_pipelining(&w, COMMANDS_PER_CLIENT / 10);
    let (_, body) = http_get(&metrics, "/metrics");
    let waits: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("walrus_upstream_in_flight_full_total "))
        .expect("the metric is exported")
        .parse()
        .unwrap();
    assert!(waits > 0, "the bound was never reached");
}

/// Writes `commands` in one go and checks the replies, in order.
fn pipeline(c: &mut Raw, commands: &[(Vec<u8>, Vec<u8>)]) {
    let all: Vec<u8> = commands.iter().flat_map(|(c, _)| c.clone()).collect();
    c.send_raw(&all);
    for (i, (cmd, want)) in commands.iter().enumerate() {
        let got = c.read_frame();
        assert_eq!(show(&got), show(want), "reply {i} (to {:.100})", show(cmd));
    }
}

#[test]
fn select_in_the_middle_of_a_pipeline_switches_databases_in_order() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    let mut p = Vec::new();
    for i in 0..500 {
        let k = format!("sel:{i}").into_bytes();
        let v0 = format!("zero-{i}").into_bytes();
        let v3 = format!("three-{i}").into_bytes();
        p.push((cmd(&[b"SET", &k, &v0]), b"+OK\r\n".to_vec()));
        p.push((cmd(&[b"SELECT", b"3"]), b"+OK\r\n".to_vec()));
        p.push((cmd(&[b"GET", &k]), NIL.to_vec()));
        p.push((cmd(&[b"SET", &k, &v3]), b"+OK\r\n".to_vec()));
        p.push((cmd(&[b"SELECT", b"0"]), b"+OK\r\n".to_vec()));
        p.push((cmd(&[b"GET", &k]), bulk(&v0)));
        p.push((cmd(&[b"SELECT", b"3"]), b"+OK\r\n".to_vec()));
        p.push((cmd(&[b"GET", &k]), bulk(&v3)));
        p.push((
            cmd(&[b"SELECT", b"99"]),
            b"-ERR DB index is out of range\r\n".to_vec(),
        ));
        p.push((cmd(&[b"INCR", b"sel:n"]), int(i + 1)));
        p.push((cmd(&[b"SELECT", b"0"]), b"+OK\r\n".to_vec()));
    }
    pipeline(&mut c, &p);
    // Valkey agrees on where each value went.
    let mut d = Raw::connect(&v.addr());
    assert_eq!(d.cmd(&["GET", "sel:7"]), bulk(b"zero-7"));
    assert_eq!(d.cmd(&["GET", "sel:n"]), NIL);
    assert_eq!(d.cmd(&["SELECT", "3"]), b"+OK\r\n");
    assert_eq!(d.cmd(&["GET", "sel:7"]), bulk(b"three-7"));
    assert_eq!(d.cmd(&["GET", "sel:n"]), bulk(b"500"));
}

#[test]
fn pooled_pipeline_followed_by_multi_keeps_order() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    let mut p = vec![(cmd(&[b"SET", b"m:x", b"1"]), b"+OK\r\n".to_vec())];
    for i in 2..=1000 {
        p.push((cmd(&[b"INCR", b"m:x"]), int(i)));
        p.push((cmd(&[b"RPUSH", b"m:l", b"v"]), int(i - 1)));
    }
    p.push((cmd(&[b"SELECT", b"2"]), b"+OK\r\n".to_vec()));
    p.push((cmd(&[b"SET", b"m:x", b"db2"]), b"+OK\r\n".to_vec()));
    p.push((cmd(&[b"SELECT", b"0"]), b"+OK\r\n".to_vec()));
    // MULTI pins the session: everything before it must be answered first, and what follows
    // runs on the dedicated connection, in database 0.
    p.push((cmd(&[b"MULTI"]), b"+OK\r\n".to_vec()));
    p.push((cmd(&[b"INCR", b"m:x"]), b"+QUEUED\r\n".to_vec()));
    p.push((cmd(&[b"LLEN", b"m:l"]), b"+QUEUED\r\n".to_vec()));
    p.push((cmd(&[b"GET", b"m:x"]), b"+QUEUED\r\n".to_vec()));
    p.push((
        cmd(&[b"EXEC"]),
        b"*3\r\n:1001\r\n:999\r\n$4\r\n1001\r\n".to_vec(),
    ));
    for i in 1002..=1500 {
        p.push((cmd(&[b"INCR", b"m:x"]), int(i)));
    }
    p.push((cmd(&[b"SELECT", b"2"]), b"+OK\r\n".to_vec()));
    p.push((cmd(&[b"GET", b"m:x"]), bulk(b"db2")));
    p.push((cmd(&[b"PING"]), b"+PONG\r\n".to_vec()));
    pipeline(&mut c, &p);
}
