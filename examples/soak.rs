//! The soak's client (`deploy/soak.py`): a mixed load at a fixed rate for a long time, every
//! reply checked, latency reported per window, and every acknowledged write checked at the
//! end.
//!
//! ```text
//! cargo run --release --example soak -- --port 6380 --clients 32 --rate 8000 --seconds 3600 \
//!     --keys 2000 --data-size 256 --window 10 --out soak.csv
//! ```
//!
//! Each client owns its keys (`soak:<client>:<n>` and the counter `soak:<client>:count`) and
//! runs one command at a time: GET 50%, SET 35% (the value is the write's sequence number,
//! padded to `--data-size`), INCR 15%. Because nobody else writes a client's keys, every reply
//! can be checked: a GET returns the last acknowledged SET of that key (or one whose reply
//! was lost to an error: it may have run); an INCR returns one more than the last value seen,
//! plus at most the INCRs whose replies were lost. `--rate` is the total offered load: each
//! client starts its commands on a schedule, and a command's latency runs from when it was
//! due, not when it was sent, so a stall counts fully (no coordinated omission). `--rate 0`
//! runs closed-loop, as fast as replies come (to measure the maximum).
//!
//! A connection that fails is opened again at the next command; commands that fail (no
//! connection, an error reply, no reply within `--timeout`) are counted per window, by kind.
//! At the end every key is read back and checked the same way. Each window is a CSV line;
//! the last line printed is `soak ops=.. errors=.. violations=.. checked_keys=..`. Exits 1
//! on a violation.

use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use redis::Value;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::rc::Rc;
use std::time::Duration;
use tokio::time::Instant;

struct Opts {
    port: u16,
    clients: u64,
    rate: f64,
    seconds: u64,
    keys: u64,
    data_size: usize,
    window: u64,
    timeout: Duration,
    out: Option<String>,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        port: 6379,
        clients: 32,
        rate: 0.0,
        seconds: 60,
        keys: 1000,
        data_size: 256,
        window: 10,
        timeout: Duration::from_secs(30),
        out: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--port" => o.port = value.parse().map_err(|e| bad(&e))?,
            "--clients" => o.clients = value.parse().map_err(|e| bad(&e))?,
            "--rate" => o.rate = value.parse().map_err(|e| bad(&e))?,
            "--seconds" => o.seconds = value.parse().map_err(|e| bad(&e))?,
            "--keys" => o.keys = value.parse().map_err(|e| bad(&e))?,
            "--data-size" => o.data_size = value.parse().map_err(|e| bad(&e))?,
            "--window" => o.window = value.parse().map_err(|e| bad(&e))?,
            "--timeout" => o.timeout = Duration::from_secs(value.parse().map_err(|e| bad(&e))?),
            "--out" => o.out = Some(value),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if o.clients == 0 || o.keys == 0 || o.window == 0 || o.data_size < 20 {
        return Err(
            "--clients, --keys and --window must be positive, --data-size at least 20".into(),
        );
    }
    Ok(o)
}

/// One window's results.
struct Window {
    /// Microseconds from when a command was due to its reply.
    latency: Histogram<u64>,
    errors: BTreeMap<String, u64>,
}

struct Shared {
    windows: Vec<Window>,
    violations: Vec<String>,
    /// Keys read back at the end.
    checked: u64,
}

impl Shared {
    fn window(&mut self, i: usize) -> &mut Window {
        while self.windows.len() <= i {
            self.windows.push(Window {
                latency: Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds"),
                errors: BTreeMap::new(),
            });
        }
        &mut self.windows[i]
    }

    fn violation(&mut self, what: String) {
        eprintln!("soak: VIOLATION {what}");
        self.violations.push(what);
    }
}

/// What one client knows of its keys.
struct Model {
    /// Per key: the last acknowledged write's sequence number (0: none).
    acked: Vec<u64>,
    /// Per key: writes whose replies were lost (they may have run, even later).
    unknown: Vec<Vec<u64>>,
    /// The counter's last value seen, and INCRs since whose replies were lost.
    count: i64,
    count_unknown: i64,
}

impl Model {
    /// Whether `value` (a GET's reply) is a value key `k` may hold.
    fn readable(&self, k: usize, value: Option<u64>) -> bool {
        match value {
            None => self.acked[k] == 0,
            Some(v) => v == self.acked[k] || self.unknown[k].contains(&v),
        }
    }
}

/// The sequence number a value carries (its first 20 digits).
fn seq_of(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v.get(..20)?).ok()?.parse().ok()
}

fn value_of(seq: u64, size: usize) -> Vec<u8> {
    let mut v = format!("{seq:020}").into_bytes();
    v.resize(size, b'.');
    v
}

enum Op {
    Get(usize),
    Set(usize, u64),
    Incr,
}

/// A short name for a failure, to count by kind.
fn kind(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        return "timeout".into();
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return "connection".into();
    }
    match e.code() {
        Some(code) => code.to_string(),
        None => e.to_string().chars().take(40).collect(),
    }
}

async fn connect(o: &Opts) -> Result<MultiplexedConnection, redis::RedisError> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", o.port))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(o.timeout)
        .set_response_timeout(o.timeout);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn client(o: Rc<Opts>, shared: Rc<RefCell<Shared>>, id: u64, start: Instant) {
    let keys = o.keys as usize;
    let name = |k: usize| format!("soak:{id}:{k}");
    let counter = format!("soak:{id}:count");
    let mut m = Model {
        acked: vec![0; keys],
        unknown: vec![Vec::new(); keys],
        count: 0,
        count_unknown: 0,
    };
    let mut rng = (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Writes are numbered across the run; a client's first is 1.
    let mut seq = 0u64;
    let interval = (o.rate > 0.0).then(|| Duration::from_secs_f64(o.clients as f64 / o.rate));
    // Spread the clients' schedules over one interval.
    let mut due =
        start + interval.map_or(Duration::ZERO, |i| i.mul_f64(id as f64 / o.clients as f64));
    let end = start + Duration::from_secs(o.seconds);
    let mut conn: Option<MultiplexedConnection> = None;
    while due < end {
        match interval {
            Some(i) => {
                tokio::time::sleep_until(due).await;
                due += i;
            }
            None => due = Instant::now(),
        }
        let started = due.max(start);
        let r = next() % 100;
        let op = if r < 50 {
            Op::Get((next() % o.keys) as usize)
        } else if r < 85 {
            seq += 1;
            Op::Set((next() % o.keys) as usize, seq)
        } else {
            Op::Incr
        };
        let cmd = match op {
            Op::Get(k) => redis::cmd("GET").arg(name(k)).clone(),
            Op::Set(k, s) => redis::cmd("SET")
                .arg(name(k))
                .arg(value_of(s, o.data_size))
                .clone(),
            Op::Incr => redis::cmd("INCR").arg(&counter).clone(),
        };
        let reply: Result<Value, redis::RedisError> = async {
            if conn.is_none() {
                conn = Some(connect(&o).await?);
            }
            cmd.query_async(conn.as_mut().expect("connected")).await
        }
        .await;
        let at = ((started - start).as_secs() / o.window) as usize;
        let mut sh = shared.borrow_mut();
        match reply {
            Err(e) => {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    conn = None;
                }
                *sh.window(at).errors.entry(kind(&e)).or_default() += 1;
                match op {
                    Op::Set(k, s) => m.unknown[k].push(s),
                    Op::Incr => m.count_unknown += 1,
                    Op::Get(_) => {}
                }
            }
            Ok(v) => {
                let us = started.elapsed().as_micros() as u64;
                sh.window(at).latency.saturating_record(us.max(1));
                match (op, v) {
                    (Op::Set(k, s), Value::Okay) => m.acked[k] = s,
                    (Op::Get(k), Value::Nil) if m.readable(k, None) => {}
                    (Op::Get(k), Value::BulkString(b)) if m.readable(k, seq_of(&b)) => {}
                    (Op::Incr, Value::Int(n))
                        if n > m.count && n <= m.count + 1 + m.count_unknown =>
                    {
                        m.count = n;
                        m.count_unknown = 0;
                    }
                    (Op::Get(k), v) => sh.violation(format!(
                        "{} read {v:?}; last acknowledged {}, unacknowledged {:?}",
                        name(k),
                        m.acked[k],
                        m.unknown[k]
                    )),
                    (Op::Set(k, s), v) => {
                        sh.violation(format!("SET {} {s} answered {v:?}", name(k)))
                    }
                    (Op::Incr, v) => sh.violation(format!(
                        "INCR {counter} answered {v:?}; last seen {}, unacknowledged {}",
                        m.count, m.count_unknown
                    )),
                }
            }
        }
    }
    // Every key read back once the load is over.
    drop(conn);
    let mut conn = match connect(&o).await {
        Ok(c) => c,
        Err(e) => {
            return shared
                .borrow_mut()
                .violation(format!("client {id}: cannot connect to check: {e}"))
        }
    };
    for k in 0..keys {
        let v: Result<Option<Vec<u8>>, _> =
            redis::cmd("GET").arg(name(k)).query_async(&mut conn).await;
        let ok = match &v {
            Ok(None) => m.readable(k, None),
            Ok(Some(b)) => seq_of(b).is_some_and(|s| m.readable(k, Some(s))),
            Err(_) => false,
        };
        if !ok {
            shared.borrow_mut().violation(format!(
                "check: {} is {:?}; last acknowledged {}, unacknowledged {:?}",
                name(k),
                v.map(|v| v.as_deref().and_then(seq_of)),
                m.acked[k],
                m.unknown[k]
            ));
        }
    }
    let n: Result<Option<i64>, _> = redis::cmd("GET").arg(&counter).query_async(&mut conn).await;
    match n {
        Ok(n) if (m.count..=m.count + m.count_unknown).contains(&n.unwrap_or(0)) => {}
        other => shared.borrow_mut().violation(format!(
            "check: {counter} is {other:?}; last seen {}, unacknowledged {}",
            m.count, m.count_unknown
        )),
    }
    shared.borrow_mut().checked += o.keys + 1;
}

fn main() {
    let o = match parse_opts() {
        Ok(o) => Rc::new(o),
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::exit(2);
        }
    };
    let shared = Rc::new(RefCell::new(Shared {
        windows: Vec::new(),
        violations: Vec::new(),
        checked: 0,
    }));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..o.clients)
            .map(|id| tokio::task::spawn_local(client(o.clone(), shared.clone(), id, start)))
            .collect();
        for t in tasks {
            t.await.expect("client task");
        }
    });
    let sh = shared.borrow();
    let mut csv: Box<dyn Write> = match &o.out {
        Some(path) => Box::new(std::fs::File::create(path).expect("--out")),
        None => Box::new(std::io::sink()),
    };
    let _ = writeln!(csv, "t,ops,p50_ms,p99_ms,p999_ms,max_ms,errors,error_kinds");
    let (mut ops, mut errors) = (0, 0);
    for (i, w) in sh.windows.iter().enumerate() {
        let h = &w.latency;
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let e: u64 = w.errors.values().sum();
        let kinds: Vec<String> = w.errors.iter().map(|(k, n)| format!("{k}={n}")).collect();
        let _ = writeln!(
            csv,
            "{},{},{:.3},{:.3},{:.3},{:.3},{},{}",
            i as u64 * o.window,
            h.len(),
            ms(0.5),
            ms(0.99),
            ms(0.999),
            h.max() as f64 / 1000.0,
            e,
            kinds.join(" ")
        );
        ops += h.len();
        errors += e;
    }
    println!(
        "soak ops={ops} ops_per_sec={:.1} errors={errors} violations={} checked_keys={}",
        ops as f64 / o.seconds as f64,
        sh.violations.len(),
        sh.checked
    );
    if !sh.violations.is_empty() {
        std::process::exit(1);
    }
}
