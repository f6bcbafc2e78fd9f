//! One run of the generator: its settings (from the environment), each mode's clients and
//! faults, the final restart and checks, and the report. Shared by `tests/generator.rs`
//! (every fault, on the test's own disk) and `tests/power_loss.rs` (power losses on faultfs).

use crate::common::faultfs::FaultFs;
use crate::common::Rng;
use crate::faults::Plan;
use crate::history::{History, BIG_SLOTS};
use crate::keys::big_key;
use crate::shared::{mix, Ctx};
use crate::system::{Mode, System};
use crate::{bulk, check, faults, listeners, sidechannel, workers};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Subscribers at once, each subscribing at its own random times.
const SUBSCRIBERS: u64 = 2;

/// Where walrus's data directory (journal, checkpoints, the managed Valkey's directory)
/// lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disk {
    /// A temporary directory: what walrus wrote survives every SIGKILL.
    Tmp,
    /// A faultfs mount (docs/faultfs.md): what walrus did not sync is lost in a power loss.
    FaultFs,
}

pub struct Settings {
    pub seed: u64,
    pub seconds: u64,
    pub modes: Vec<Mode>,
    pub disk: Disk,
    pub plan: Plan,
}

impl Settings {
    /// The settings from `WALRUS_GEN_*` (see `tests/generator.rs`), with these defaults.
    pub fn from_env(seconds: u64, disk: Disk, plan: Plan) -> Settings {
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
        let seconds = var("WALRUS_GEN_SECONDS").map_or(seconds, |s| {
            s.parse().expect("WALRUS_GEN_SECONDS: a number")
        });
        let modes = match var("WALRUS_GEN_MODE").as_deref().unwrap_or("both") {
            "managed" => vec![Mode::Managed],
            "external" => vec![Mode::External],
            "cluster" => vec![Mode::Cluster],
            "shards" => vec![Mode::Shards],
            "both" => vec![Mode::Managed, Mode::External],
            other => {
                panic!("WALRUS_GEN_MODE: managed, external, cluster, shards or both, not {other:?}")
            }
        };
        let disk = match var("WALRUS_GEN_DISK").as_deref() {
            None => disk,
            Some("tmp") => Disk::Tmp,
            Some("faultfs") => Disk::FaultFs,
            Some(other) => panic!("WALRUS_GEN_DISK: tmp or faultfs, not {other:?}"),
        };
        Settings {
            seed,
            seconds,
            modes,
            disk,
            plan,
        }
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
/// final read and the final checks. `fs`: the faultfs mount walrus's data lives on.
fn run(mode: Mode, s: &Settings, fs: Option<FaultFs>, duration: Duration) -> Report {
    let tag = format!("seed {}, {}", s.seed, mode.name());
    // Each mode's own random streams, all from the one seed.
    let seed = mix(s.seed, 10 + mode as u64);
    let mut rng = Rng(mix(seed, 1));
    let mut sys = System::start(mode, mix(seed, 2), fs);
    let walruses = if mode.cluster() {
        sys.shards()
    } else {
        Vec::new()
    };
    let ctx = Arc::new(Ctx::new(History::new(tag), &sys.addr(), walruses));
    ctx.h().release.started(faults::journal_delay(&sys));
    ctx.h().count(&format!(
        "start: the first walrus with a {} ms journal delay",
        sys.delay_ms
    ));
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
    let (c, consumer_seed) = (ctx.clone(), mix(seed, 9));
    threads.push((
        "blocked consumer",
        std::thread::spawn(move || listeners::blocked_consumer(c, consumer_seed)),
    ));
    if !mode.cluster() {
        let (c, side_seed) = (ctx.clone(), mix(seed, 7));
        threads.push((
            "keyspace subscriber",
            std::thread::spawn(move || sidechannel::notifications(c, side_seed)),
        ));
        let (c, side_seed) = (ctx.clone(), mix(seed, 8));
        threads.push((
            "tracking client",
            std::thread::spawn(move || sidechannel::tracking(c, side_seed)),
        ));
        let (c, side_seed) = (ctx.clone(), mix(seed, 11));
        threads.push((
            "OPTIN client",
            std::thread::spawn(move || sidechannel::optin(c, side_seed)),
        ));
        let (c, bulk_seed) = (ctx.clone(), mix(seed, 12));
        threads.push((
            "whole-pipeline client",
            std::thread::spawn(move || bulk::pipelines(c, bulk_seed)),
        ));
    }

    let deadline = Instant::now() + duration;
    let faults = catch_unwind(AssertUnwindSafe(|| {
        faults::run(&mut sys, &ctx, &mut rng, s.plan, deadline)
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
            faults::final_restart(&mut sys, &ctx, &mut rng)?;
            check::read_final(&ctx, &big_keys)
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
    let resyncs: Vec<_> = logs
        .iter()
        .flat_map(|(_, text)| crate::release::resyncs(text))
        .collect();
    ctx.h().settle_suspects(&resyncs);
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

/// Writes every process log of a run; returns the directory.
fn save_logs(seed: u64, mode: Mode, logs: &[(String, String)]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("generator-{seed}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (name, text)) in logs.iter().enumerate() {
        let file = dir.join(format!("{}-{i:02}-{name}.log", mode.name()));
        std::fs::write(file, text).unwrap();
    }
    dir
}

/// Runs every mode of `s`, prints what each did, and fails with every violation found.
/// Returns early (passing, after faultfs printed why) where faultfs is asked for and FUSE
/// cannot be mounted.
pub fn run_all(s: Settings) {
    eprintln!(
        "generator: seed {} (replay with WALRUS_GEN_SEED={}), {} s of faults, modes {:?}, \
         disk {:?}",
        s.seed, s.seed, s.seconds, s.modes, s.disk
    );
    let share = Duration::from_secs(s.seconds) / s.modes.len() as u32;
    let mut failures = Vec::new();
    for &mode in &s.modes {
        let fs = match s.disk {
            Disk::Tmp => None,
            Disk::FaultFs => match FaultFs::mount() {
                Some(fs) => Some(fs),
                None => return,
            },
        };
        let report = run(mode, &s, fs, share);
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
