//! A small RESP load generator for `deploy/bench.py --suite compare`: the workloads
//! redis-benchmark cannot run, a mix of SETs and GETs in a ratio on random keys.
//!
//! ```text
//! cargo run --release --example loadgen -- --port 6379 --clients 50 --requests 100000 \
//!     --set-ratio 1 --get-ratio 3 --data-size 1024 --keys 100000 [--pipeline 16]
//! cargo run --release --example loadgen -- --port 6379 --preload --keys 100000 --data-size 1024
//! ```
//!
//! Like redis-benchmark: each client is one connection that sends `--pipeline` commands,
//! waits for all their replies, and sends the next batch; a request's latency runs from its
//! batch's write to its own reply; everything runs on one thread (redis-benchmark's default,
//! so both take the same share of a small machine). Keys are `<prefix><12-digit number>`, as
//! redis-benchmark's `__rand_int__` with `-r`, values are `--data-size` bytes of "x".
//! `--preload` writes every key once, in order, instead (SETs only). `--seconds S` stops
//! sending after S seconds (or `--requests`, whichever comes first): two loadgens started
//! together then load the server over the same window (readers beside writers).
//!
//! Prints one line: `loadgen ops_per_sec=.. p50_ms=.. p99_ms=.. p999_ms=.. requests=..
//! errors=.. seconds=..`; exits non-zero when a connection fails or a reply is an error.

use hdrhistogram::Histogram;
use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Opts {
    host: String,
    port: u16,
    clients: usize,
    requests: u64,
    set_ratio: u64,
    get_ratio: u64,
    data_size: usize,
    keys: u64,
    pipeline: u64,
    key_prefix: String,
    preload: bool,
    seed: u64,
    /// Stop claiming batches after this long (None: run all `requests`).
    seconds: Option<f64>,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        host: "127.0.0.1".into(),
        port: 6379,
        clients: 50,
        requests: 100_000,
        set_ratio: 1,
        get_ratio: 3,
        data_size: 1024,
        keys: 100_000,
        pipeline: 1,
        key_prefix: "key:".into(),
        preload: false,
        seed: 1,
        seconds: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--preload" {
            o.preload = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let num = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--host" => o.host = value.clone(),
            "--port" => o.port = num()? as u16,
            "--clients" => o.clients = num()? as usize,
            "--requests" => o.requests = num()?,
            "--set-ratio" => o.set_ratio = num()?,
            "--get-ratio" => o.get_ratio = num()?,
            "--data-size" => o.data_size = num()? as usize,
            "--keys" => o.keys = num()?,
            "--pipeline" => o.pipeline = num()?,
            "--key-prefix" => o.key_prefix = value.clone(),
            "--seed" => o.seed = num()?,
            "--seconds" => {
                o.seconds = Some(
                    value
                        .parse::<f64>()
                        .ok()
                        .filter(|s| *s > 0.0)
                        .ok_or(format!("--seconds {value}: not a positive number"))?,
                )
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if o.preload {
        o.requests = o.keys;
        o.set_ratio = 1;
        o.get_ratio = 0;
    }
    if o.clients == 0 || o.pipeline == 0 || o.keys == 0 || o.set_ratio + o.get_ratio == 0 {
        return Err("--clients, --pipeline, --keys and one of the ratios must be positive".into());
    }
    Ok(o)
}

/// A 64-bit LCG (Knuth's MMIX constants), its high bits taken: random enough for picking
/// keys, and free of any dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 16
    }
}

/// The length of the first complete reply in `buf`, None if it is not all there yet.
/// `errors` counts error replies (at any depth).
fn reply_len(buf: &[u8], errors: &mut u64) -> Result<Option<usize>, String> {
    let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let head = eol + 2;
    let number = || -> Result<i64, String> {
        std::str::from_utf8(&buf[1..eol])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                format!(
                    "bad reply header {:?}",
                    String::from_utf8_lossy(&buf[..eol])
                )
            })
    };
    match buf[0] {
        b'+' | b':' | b'_' | b',' | b'#' => Ok(Some(head)),
        b'-' => {
            if *errors == 0 {
                eprintln!(
                    "loadgen: error reply: {}",
                    String::from_utf8_lossy(&buf[..eol])
                );
            }
            *errors += 1;
            Ok(Some(head))
        }
        b'$' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some(head));
            }
            let end = head + n as usize + 2;
            Ok((buf.len() >= end).then_some(end))
        }
        b'*' | b'%' => {
            let n = number()?.max(0) * if buf[0] == b'%' { 2 } else { 1 };
            let mut at = head;
            for _ in 0..n {
                match reply_len(&buf[at..], errors)? {
                    Some(len) => at += len,
                    None => return Ok(None),
                }
            }
            Ok(Some(at))
        }
        other => Err(format!("unexpected reply type {:?}", other as char)),
    }
}

struct Shared {
    next: u64,
    /// When to stop claiming batches (`--seconds`).
    deadline: Option<Instant>,
    histogram: Histogram<u64>,
    errors: u64,
}

async fn client(o: Rc<Opts>, shared: Rc<RefCell<Shared>>, id: u64) -> Result<(), String> {
    let mut stream = TcpStream::connect((o.host.as_str(), o.port))
        .await
        .map_err(|e| format!("connect to {}:{}: {e}", o.host, o.port))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let value = vec![b'x'; o.data_size];
    let key_len = o.key_prefix.len() + 12; // keys below 10^12
    let mut rng = Rng((o.seed ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
    let mut out = Vec::with_capacity(o.pipeline as usize * (o.data_size + key_len + 64));
    let mut inbuf: Vec<u8> = Vec::with_capacity(1 << 16);
    let mut latencies = Vec::with_capacity(o.pipeline as usize);
    loop {
        // Claim the next batch of requests (the last one may be short).
        let (first, count) = {
            let mut s = shared.borrow_mut();
            if s.next >= o.requests || s.deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            let first = s.next;
            let count = o.pipeline.min(o.requests - first);
            s.next += count;
            (first, count)
        };
        out.clear();
        for i in 0..count {
            let key = if o.preload {
                first + i
            } else {
                rng.next() % o.keys
            };
            let (prefix, size) = (&o.key_prefix, value.len());
            // Writes into a Vec cannot fail.
            if rng.next() % (o.set_ratio + o.get_ratio) < o.set_ratio {
                let _ = write!(
                    out,
                    "*3\r\n$3\r\nSET\r\n${key_len}\r\n{prefix}{key:012}\r\n${size}\r\n"
                );
                out.extend_from_slice(&value);
                out.extend_from_slice(b"\r\n");
            } else {
                let _ = write!(
                    out,
                    "*2\r\n$3\r\nGET\r\n${key_len}\r\n{prefix}{key:012}\r\n"
                );
            }
        }
        let sent = Instant::now();
        stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))?;
        latencies.clear();
        let mut errors = 0;
        while (latencies.len() as u64) < count {
            // Every complete reply already read: its latency is now.
            let mut at = 0;
            while (latencies.len() as u64) < count {
                match reply_len(&inbuf[at..], &mut errors)? {
                    Some(len) => {
                        at += len;
                        latencies.push(sent.elapsed().as_micros() as u64);
                    }
                    None => break,
                }
            }
            inbuf.drain(..at);
            if (latencies.len() as u64) < count {
                let n = stream
                    .read_buf(&mut inbuf)
                    .await
                    .map_err(|e| format!("read: {e}"))?;
                if n == 0 {
                    return Err("connection closed by the server".into());
                }
            }
        }
        let mut s = shared.borrow_mut();
        s.errors += errors;
        for &us in &latencies {
            s.histogram.saturating_record(us.max(1));
        }
    }
}

fn main() {
    let o = match parse_opts() {
        Ok(o) => Rc::new(o),
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let shared = Rc::new(RefCell::new(Shared {
        next: 0,
        deadline: o
            .seconds
            .map(|s| started + std::time::Duration::from_secs_f64(s)),
        // Microseconds, 1 µs to 10 minutes, 3 significant digits (as redis-benchmark's).
        histogram: Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds"),
        errors: 0,
    }));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    let result: Result<(), String> = local.block_on(&rt, async {
        let tasks: Vec<_> = (0..o.clients as u64)
            .map(|id| tokio::task::spawn_local(client(o.clone(), shared.clone(), id)))
            .collect();
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        Ok(())
    });
    let seconds = started.elapsed().as_secs_f64();
    if let Err(e) = result {
        eprintln!("loadgen: {e}");
        std::process::exit(1);
    }
    let s = shared.borrow();
    let h = &s.histogram;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "loadgen ops_per_sec={:.1} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} requests={} errors={} seconds={:.3}",
        h.len() as f64 / seconds,
        ms(0.5),
        ms(0.99),
        ms(0.999),
        h.len(),
        s.errors,
        seconds
    );
    if s.errors > 0 {
        std::process::exit(1);
    }
}
