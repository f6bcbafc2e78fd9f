//! A seeded, randomized generator of client histories under faults, and a checker of the
//! promises walrus makes: no client ever sees data a crash could lose, no acknowledged
//! write is ever lost, and walrus never hangs.
//!
//! Concurrent clients (`generator/workers.rs`, `generator/listeners.rs`) append unique
//! elements to lists: single, pipelined, in scripts, in MULTI/EXEC (with WATCH, with a
//! command refused while queued, with a read between the pushes), and in pipelines whose
//! client vanishes without reading a reply. They read them (LRANGE, EVAL_RO, LLEN, DBSIZE,
//! INFO keyspace, RANDOMKEY, EXISTS, SCAN), push and pop jobs on queues (BLPOP with a timeout,
//! and one consumer blocked in BLPOP 0), publish and subscribe, and write large values (and,
//! rarely, a transaction of them too large for one journal entry). Meanwhile a fault loop
//! (`generator/faults.rs`) SIGKILLs walrus, Valkey or both, sometimes in the middle of a
//! restore, fails checkpoints and manifests, slows the journal, breaks walrus's upstream
//! connections and writes around walrus. Each mode ends with everything killed and restored
//! from disk, and a final read of every key. The checks are in `generator/history.rs` and
//! its companions (as things happen) and `generator/check.rs` (against the final state).
//!
//! - `WALRUS_GEN_SEED`: the seed (default: from the clock); printed at the start and in every
//!   failure. Thread scheduling is not replayed, but every random choice is, and the fault
//!   loop's sequence of faults is the same.
//! - `WALRUS_GEN_SECONDS`: how long faults are injected, in total (default 40).
//! - `WALRUS_GEN_MODE`: `managed`, `external` or `both` (default: managed, then external,
//!   each half the time).
//! - `WALRUS_TEST_NO_DURABILITY=1` (the harness's switch) runs walrus without its journal: a
//!   negative control, which must fail with lost writes and dirty reads.
//!
//! A failing run writes every process log under `target/tmp/generator-<seed>/` (every run
//! does with `WALRUS_GEN_KEEP_LOGS=1`).
#[path = "generator/check.rs"]
mod check;
mod common;
#[path = "generator/conn.rs"]
mod conn;
#[path = "generator/faults.rs"]
mod faults;
#[path = "generator/history.rs"]
mod history;
#[path = "generator/large.rs"]
mod large;
#[path = "generator/listeners.rs"]
mod listeners;
#[path = "generator/pubsub.rs"]
mod pubsub;
#[path = "generator/queues.rs"]
mod queues;
#[path = "generator/reads.rs"]
mod reads;
#[path = "generator/shared.rs"]
mod shared;
#[path = "generator/system.rs"]
mod system;
#[path = "generator/transactions.rs"]
mod transactions;
#[path = "generator/values.rs"]
mod values;
#[path = "generator/workers.rs"]
mod workers;

use common::Rng;
use history::{big_key, History, BIG_SLOTS};
use shared::{mix, Ctx};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use system::{Mode, System};

/// Subscribers at once, each subscribing at its own random times.
const SUBSCRIBERS: u64 = 2;

struct Settings {
    seed: u64,
    seconds: u64,
    modes: Vec<Mode>,
}

fn settings() -> Settings {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let seed = var("WALRUS_GEN_SEED").map_or_else(
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        },
        |s| s.parse().expect("WALRUS_GEN_SEED: a number"),
    );
    let seconds =
        var("WALRUS_GEN_SECONDS").map_or(40, |s| s.parse().expect("WALRUS_GEN_SECONDS: a number"));
    let modes = match var("WALRUS_GEN_MODE").as_deref().unwrap_or("both") {
        "managed" => vec![Mode::Managed],
        "external" => vec![Mode::External],
        "both" => vec![Mode::Managed, Mode::External],
        other => panic!("WALRUS_GEN_MODE: managed, external or both, not {other:?}"),
    };
    Settings {
        seed,
        seconds,
        modes,
    }
}

/// What one mode's run found.
struct Report {
    counts: BTreeMap<String, u64>,
    violations: Vec<String>,
    logs: Vec<(String, String)>,
}

/// A panic's message, cut to a readable length (the harness puts whole logs in them).
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    let text = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into());
    match text.char_indices().nth(1500) {
        Some((cut, _)) => format!("{}… (the whole log is in the saved logs)", &text[..cut]),
        None => text,
    }
}

/// One mode: clients and faults for `duration`, then everything restarted from disk, the
/// final read and the final checks.
fn run(mode: Mode, user_seed: u64, duration: Duration) -> Report {
    let tag = format!("seed {user_seed}, {}", mode.name());
    // Each mode's own random streams, all from the one seed.
    let seed = mix(user_seed, 10 + mode as u64);
    let mut rng = Rng(mix(seed, 1));
    let mut sys = System::start(mode, mix(seed, 2));
    let ctx = Arc::new(Ctx::new(History::new(tag), &sys.addr()));
    let mut threads = Vec::new();
    for id in 0..workers::WORKERS {
        let w = workers::Worker::new(id, ctx.clone(), mix(seed, 100 + id as u64));
        threads.push(("worker", std::thread::spawn(move || w.run())));
    }
    for i in 0..SUBSCRIBERS {
        let (c, sub_seed) = (ctx.clone(), mix(seed, 3 + i));
        let t = std::thread::spawn(move || listeners::subscriber(c, sub_seed));
        threads.push(("subscriber", t));
    }
    let c = ctx.clone();
    threads.push((
        "blocked consumer",
        std::thread::spawn(move || listeners::blocked_consumer(c)),
    ));

    let deadline = Instant::now() + duration;
    let faults = catch_unwind(AssertUnwindSafe(|| {
        faults::run(&mut sys, &ctx, &mut rng, deadline)
    }));
    let failed = match faults {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(p) => Some(panic_text(p)),
    };
    if let Some(e) = &failed {
        ctx.h()
            .violation(format!("walrus did not come back from a fault: {e}"));
    }
    ctx.stop();
    for (name, t) in threads {
        if let Err(p) = t.join() {
            ctx.h()
                .violation(format!("the {name} thread panicked: {}", panic_text(p)));
        }
    }
    if failed.is_none() {
        let big_keys: Vec<String> = (0..workers::WORKERS)
            .flat_map(|w| (0..BIG_SLOTS).map(move |s| big_key(w, s)))
            .collect();
        let fin = catch_unwind(AssertUnwindSafe(|| {
            faults::final_restart(&mut sys, &ctx)?;
            check::read_final(&ctx, &sys.addr(), &big_keys)
        }));
        match fin {
            Ok(Ok(f)) => ctx.h().check_final(&f),
            Ok(Err(e)) => ctx
                .h()
                .violation(format!("the final restart and read failed: {e}")),
            Err(p) => ctx.h().violation(format!(
                "the final restart and read failed: {}",
                panic_text(p)
            )),
        }
    }
    let logs = sys.logs();
    drop(sys);
    let mut h = ctx.h();
    Report {
        counts: std::mem::take(&mut h.counts),
        violations: std::mem::take(&mut h.violations),
        logs,
    }
}

/// The counts, grouped by what they count (`op`, `ack`, `unknown`, `fault`, `check`, ...).
fn print_counts(mode: Mode, counts: &BTreeMap<String, u64>) {
    eprintln!("generator, {} mode:", mode.name());
    let mut group = "";
    for (what, n) in counts {
        let (g, item) = what.split_once(": ").unwrap_or(("", what));
        if g != group {
            let total: u64 = counts
                .iter()
                .filter(|(w, _)| w.starts_with(&format!("{g}: ")))
                .map(|(_, n)| n)
                .sum();
            eprintln!("  {g} ({total}):");
            group = g;
        }
        eprintln!("    {n:>8}  {item}");
    }
}

/// Violations grouped by kind (the text before their first colon): how many of each, and
/// the first few.
fn by_kind(violations: &[String]) -> String {
    let mut kinds: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for v in violations {
        let kind = v.split_once(':').map_or(v.as_str(), |(k, _)| k);
        kinds.entry(kind).or_default().push(v);
    }
    let mut text = String::new();
    for (kind, all) in kinds {
        text.push_str(&format!("\n  {kind}: {} violation(s), first:", all.len()));
        for v in all.iter().take(3) {
            text.push_str(&format!("\n    - {v}"));
        }
    }
    text
}

/// Writes every process log of a failed run; returns the directory.
fn save_logs(seed: u64, mode: Mode, logs: &[(String, String)]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("generator-{seed}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (name, text)) in logs.iter().enumerate() {
        let file = dir.join(format!("{}-{i:02}-{name}.log", mode.name()));
        std::fs::write(file, text).unwrap();
    }
    dir
}

#[test]
fn generated_histories_keep_walruss_promises() {
    let s = settings();
    eprintln!(
        "generator: seed {} (replay with WALRUS_GEN_SEED={}), {} s of faults, modes {:?}",
        s.seed, s.seed, s.seconds, s.modes
    );
    let share = Duration::from_secs(s.seconds) / s.modes.len() as u32;
    let mut failures = Vec::new();
    for &mode in &s.modes {
        let report = run(mode, s.seed, share);
        print_counts(mode, &report.counts);
        let keep = std::env::var_os("WALRUS_GEN_KEEP_LOGS").is_some();
        if report.violations.is_empty() {
            eprintln!("  no violations");
            if keep {
                let dir = save_logs(s.seed, mode, &report.logs);
                eprintln!("  logs in {}", dir.display());
            }
            continue;
        }
        let dir = save_logs(s.seed, mode, &report.logs);
        let mut text = format!(
            "{} mode: {} violation(s), logs in {}:",
            mode.name(),
            report.violations.len(),
            dir.display()
        );
        text.push_str(&by_kind(&report.violations));
        failures.push(text);
    }
    assert!(
        failures.is_empty(),
        "seed {} (replay with WALRUS_GEN_SEED={}):\n{}",
        s.seed,
        s.seed,
        failures.join("\n")
    );
}
