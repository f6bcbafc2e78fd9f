//! The reference point for walrus's power-loss tests (`tests/power_loss.rs`,
//! docs/power-loss.md): plain Valkey with `appendonly yes` and `appendfsync always`, its
//! directory on faultfs (docs/faultfs.md), under the same power losses. Clients INCR
//! counters and RPUSH to lists of their own; at random moments faultfs cuts the power
//! (`crash`, `crash tear` or `crash reorder`, seeded), Valkey is SIGKILLed, the disk comes
//! back and Valkey restarts on what survived. After each restart every acknowledged write
//! must be there: each counter at least its highest acknowledged value (at most the INCRs
//! sent), each list holding every acknowledged element at the position its RPUSH reported,
//! each element once, in order.
//!
//! Skipped where FUSE cannot be mounted. `WALRUS_GEN_SEED` replays the crashes' choices,
//! `WALRUS_AOF_ROUNDS` sets the number of power losses (default 40), and
//! `WALRUS_AOF_FSYNC=everysec` (or `no`) is the negative control: Valkey then acknowledges
//! writes before they are durable, and the test must fail.

use crate::common;

use common::faultfs::{fields, FaultFs};
use common::{free_port, valkey_server_bin, Proc, Raw, Rng, START_TIMEOUT};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 4;
const COUNTERS: usize = 3;
const CRASHES: &[&str] = &["crash", "crash tear", "crash reorder"];

/// A valkey-server with an always-fsynced AOF in `dir`, on `port`; `Err`: its log, when it
/// does not start (what a power loss left may be what it refuses).
fn start_valkey(dir: &str, port: u16, fsync: &str) -> Result<Proc, String> {
    let mut cmd = Command::new(valkey_server_bin());
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "yes", "--appendfsync", fsync])
        .args(["--logfile", "", "--dir", dir]);
    let proc = Proc::spawn(cmd, false);
    match proc.try_wait_line("Ready to accept connections", START_TIMEOUT) {
        Some(_) => Ok(proc),
        None => Err(proc.log_text()),
    }
}

/// What one client had acknowledged: (element number, list length its RPUSH reported) in
/// its own list, and the highest value each counter's INCR returned.
#[derive(Default)]
struct Acked {
    pushes: Vec<(u64, i64)>,
    counters: [i64; COUNTERS],
    incrs_sent: [i64; COUNTERS],
    /// The next element number.
    next: u64,
}

/// One client until `stop`, or until its connection breaks (the power went).
fn client(t: usize, addr: String, stop: Arc<AtomicBool>, seed: u64, mut acked: Acked) -> Acked {
    let mut rng = Rng(seed);
    let Ok(mut c) = Raw::try_connect(&addr) else {
        return acked;
    };
    while !stop.load(Ordering::SeqCst) {
        // Some(k): an INCR of counter k; None: an RPUSH of the next element.
        let incr = (rng.below(2) == 0).then(|| rng.below(COUNTERS as u64) as usize);
        let i = acked.next;
        let reply = match incr {
            Some(k) => {
                acked.incrs_sent[k] += 1;
                c.try_cmd(&["INCR", &format!("c{k}")])
            }
            None => {
                acked.next += 1;
                c.try_cmd(&["RPUSH", &format!("l{t}"), &format!("v{i}")])
            }
        };
        // No reply (the connection broke) or an error: the outcome is unknown, and the
        // power is going.
        let Some(n) = reply.as_deref().and_then(integer) else {
            break;
        };
        match incr {
            Some(k) => acked.counters[k] = acked.counters[k].max(n),
            None => acked.pushes.push((i, n)),
        }
    }
    acked
}

/// An integer reply's value.
fn integer(reply: &[u8]) -> Option<i64> {
    std::str::from_utf8(reply.strip_prefix(b":")?)
        .ok()?
        .trim_end()
        .parse()
        .ok()
}

/// Every acknowledged write of `clients` against what Valkey at `addr` holds; returns the
/// violations and how many writes were checked.
fn check(addr: &str, clients: &[Acked]) -> (Vec<String>, usize) {
    let mut c = Raw::connect(addr);
    let mut found = Vec::new();
    let mut checked = 0;
    for k in 0..COUNTERS {
        let reply = c.cmd(&["GET", &format!("c{k}")]);
        let text = String::from_utf8_lossy(&reply);
        // "$-1" (no key) or "$<len>\r\n<value>".
        let value: i64 = text.lines().nth(1).map_or(0, |v| v.parse().unwrap_or(-1));
        let acked = clients.iter().map(|a| a.counters[k]).max().unwrap_or(0);
        let sent: i64 = clients.iter().map(|a| a.incrs_sent[k]).sum();
        checked += 1;
        if value < acked {
            found.push(format!(
                "c{k} is {value}, an INCR was acknowledged with {acked}"
            ));
        }
        if value > sent {
            found.push(format!("c{k} is {value}, only {sent} INCRs were sent"));
        }
    }
    for (t, a) in clients.iter().enumerate() {
        let reply = c.cmd(&["LRANGE", &format!("l{t}"), "0", "-1"]);
        let items: Vec<u64> = String::from_utf8_lossy(&reply)
            .lines()
            .filter_map(|l| l.strip_prefix('v')?.parse().ok())
            .collect();
        if items.windows(2).any(|w| w[0] >= w[1]) {
            found.push(format!(
                "l{t} is out of order or repeats an element: {items:?}"
            ));
        }
        for &(i, len) in &a.pushes {
            checked += 1;
            if items.get(len as usize - 1) != Some(&i) {
                found.push(format!(
                    "l{t}: v{i}, acknowledged at position {len}, is not there ({} elements)",
                    items.len()
                ));
            }
        }
    }
    (found, checked)
}

/// What the power losses of one crash mode did.
#[derive(Default)]
struct Tally {
    cuts: u64,
    /// Cuts that found writes not yet synced (in flight).
    caught: u64,
    checked: usize,
    lost: usize,
}

#[test]
fn valkey_with_an_always_fsynced_aof_keeps_acknowledged_writes_through_power_losses() {
    let Some(fs) = FaultFs::mount() else { return };
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let seed: u64 = var("WALRUS_GEN_SEED").map_or(1, |s| s.parse().expect("a number"));
    let rounds: u64 = var("WALRUS_AOF_ROUNDS").map_or(40, |s| s.parse().expect("a number"));
    let fsync = var("WALRUS_AOF_FSYNC").unwrap_or_else(|| "always".into());
    eprintln!(
        "valkey AOF under power losses: seed {seed} (WALRUS_GEN_SEED), {rounds} rounds, \
         appendfsync {fsync}"
    );
    let mut rng = Rng(seed | 1);
    fs.ok(&format!("seed {seed}"));
    let dir = fs.path("valkey");
    std::fs::create_dir(&dir).unwrap();
    let dir = dir.to_str().unwrap().to_string();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut valkey = start_valkey(&dir, port, &fsync).expect("valkey-server starts");
    let mut clients: Vec<Acked> = (0..CLIENTS).map(|_| Acked::default()).collect();
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut violations = Vec::new();
    let started = Instant::now();
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = std::mem::take(&mut clients)
            .into_iter()
            .enumerate()
            .map(|(t, acked)| {
                let (addr, stop, seed) = (addr.clone(), stop.clone(), rng.next());
                std::thread::spawn(move || client(t, addr, stop, seed, acked))
            })
            .collect();
        // Pacing of the chaos: the clients write for a random while.
        std::thread::sleep(Duration::from_millis(50 + rng.below(400)));
        if round % 4 == 3 {
            // An AOF rewrite now and then (new base file, new manifest), which the next
            // power loss may catch half done.
            let _ = Raw::connect(&addr).try_cmd(&["BGREWRITEAOF"]);
        }
        // Half the time, a slow disk for a moment, so that the cut finds an fsync waiting.
        if rng.below(2) == 0 {
            fs.ok(&format!("latency {}", 1000 + rng.below(20_000)));
            let deadline = Instant::now() + Duration::from_secs(2);
            // faultfs's counters have no event to await: a short poll, within a deadline.
            while fs.status()["delayed"] == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let crash = CRASHES[rng.below(CRASHES.len() as u64) as usize];
        let outcome = fields(&fs.ok(crash));
        valkey.signal(libc::SIGKILL);
        valkey
            .wait_exit(START_TIMEOUT)
            .expect("SIGKILLed valkey exits");
        stop.store(true, Ordering::SeqCst);
        clients = threads.into_iter().map(|t| t.join().unwrap()).collect();
        fs.ok("recover");
        fs.ok("latency 0");
        let tally = tallies.entry(crash).or_default();
        tally.cuts += 1;
        tally.caught += u64::from(outcome["writes"] > 0);
        valkey = match start_valkey(&dir, port, &fsync) {
            Ok(v) => v,
            Err(log) => {
                let why: Vec<&str> = log.lines().filter(|l| l.contains('#')).collect();
                violations.push(format!(
                    "round {round} ({crash}): Valkey refused to start: {}",
                    why.join(" | ")
                ));
                break;
            }
        };
        let (found, checked) = check(&addr, &clients);
        tally.checked += checked;
        tally.lost += found.len();
        violations.extend(
            found
                .iter()
                .map(|v| format!("round {round} ({crash}): {v}")),
        );
        if !found.is_empty() {
            // Every later check would find the same losses again: this one says it.
            break;
        }
    }
    drop(valkey);
    let acked: usize = clients.iter().map(|a| a.pushes.len()).sum::<usize>()
        + clients
            .iter()
            .flat_map(|a| a.counters)
            .filter(|&v| v > 0)
            .count();
    eprintln!(
        "{} s, {acked} acknowledged writes at the end (pushes, and counters written)",
        started.elapsed().as_secs()
    );
    for (crash, t) in &tallies {
        eprintln!(
            "  {crash:<14} {:>3} power losses, {:>3} with writes in flight; {:>6} acknowledged \
             writes checked after them, {} lost",
            t.cuts, t.caught, t.checked, t.lost
        );
    }
    for v in violations.iter().take(20) {
        eprintln!("  VIOLATION: {v}");
    }
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violation(s), first: {:?}",
        violations.len(),
        violations.first()
    );
}
