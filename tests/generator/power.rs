//! Power losses, with walrus's data directory on faultfs (docs/faultfs.md). The harness's
//! procedure: faultfs `crash` (every write not yet synced is lost), `crash tear` (a
//! sector-aligned prefix of the newest one survives) or `crash reorder` (a random subset
//! survives, in a random order), chosen at random; then SIGKILL of the processes of the
//! machine that lost power; then `recover` (the disk is back), and they restart on what
//! survived. Which processes die:
//!
//! - managed mode: walrus, and its Valkey with it;
//! - external mode: walrus (Valkey runs elsewhere), both, or Valkey alone: then walrus ran
//!   on while its disk lost its cache and fenced every operation (a storage controller
//!   reset), and a new, empty Valkey takes the old one's port.
//!
//! Between the cut and the kills faultfs fails every operation with EIO, so nothing walrus
//! does then reaches the disk: as in a power cut, what was synced before it is all there is.

use crate::common::faultfs::fields;
use crate::common::Rng;
use crate::faults::{relaunch, PATIENCE};
use crate::shared::{pick, Ctx};
use crate::system::{Flag, Mode, System, RECOVERY};
use std::time::{Duration, Instant};

/// Who dies in a power loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victims {
    /// walrus (in managed mode, its Valkey too).
    Walrus,
    /// External mode: Valkey alone; walrus lives through its disk's power loss.
    Valkey,
    /// Everything: walrus and Valkey.
    All,
}

/// faultfs's crash commands, equally likely.
const CRASHES: &[(&str, u64)] = &[("crash", 1), ("crash tear", 1), ("crash reorder", 1)];

/// The crash commands a run uses: all, or the one `WALRUS_GEN_CRASH` names (`drop`,
/// `tear`, `reorder`), to look at one kind at a time.
fn crashes() -> &'static [(&'static str, u64)] {
    match std::env::var("WALRUS_GEN_CRASH").as_deref() {
        Err(_) | Ok("") | Ok("all") => CRASHES,
        Ok("drop") => &CRASHES[..1],
        Ok("tear") => &CRASHES[1..2],
        Ok("reorder") => &CRASHES[2..],
        Ok(other) => panic!("WALRUS_GEN_CRASH: drop, tear, reorder or all, not {other:?}"),
    }
}

/// How long a power cut waits for a write in flight (none come while walrus refuses
/// writes, or no client is writing).
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(2);

/// External mode's victims.
const EXTERNAL: &[(Victims, u64)] = &[
    (Victims::Walrus, 2),
    (Victims::All, 2),
    (Victims::Valkey, 1),
];

/// A power loss with random victims; returns what it did.
pub fn power_loss(sys: &mut System, ctx: &Ctx, rng: &mut Rng) -> Result<String, String> {
    let victims = match sys.mode {
        Mode::Managed | Mode::Cluster | Mode::Shards => Victims::Walrus,
        Mode::External => pick(rng, EXTERNAL),
    };
    cut(sys, ctx, rng, victims)
}

/// Cuts the power (a random crash mode), kills `victims`, brings the disk back and
/// restarts them; returns once walrus serves again, with what it did.
pub fn cut(sys: &mut System, ctx: &Ctx, rng: &mut Rng, victims: Victims) -> Result<String, String> {
    let crash = pick(rng, crashes());
    // Half the time, the cut waits for a journal write (or a checkpoint's sync) in flight:
    // a slow disk for a moment, so that walrus has one waiting when the power goes.
    if rng.below(2) == 0 {
        let latency_us = 1000 + rng.below(20_000);
        sys.power(&format!("latency {latency_us}"));
        let caught = sys.await_in_flight(IN_FLIGHT_WAIT);
        ctx.h().count(if caught {
            "power: cut with a write in flight"
        } else {
            "power: cut waited for a write in flight in vain"
        });
    }
    let outcome = fields(&sys.power(crash));
    let walrus_dies = victims != Victims::Valkey;
    let valkey_dies = victims != Victims::Walrus || sys.mode.managed();
    if valkey_dies {
        sys.stop_external_valkey();
    }
    if walrus_dies {
        sys.kill_walrus();
    }
    sys.power("recover");
    sys.restore_latency();
    record(ctx, &outcome);
    if valkey_dies && sys.mode == Mode::External {
        sys.start_external_valkey();
    }
    if walrus_dies {
        relaunch(sys, ctx)?;
    } else {
        survived(sys, ctx)?;
    }
    let who = match (walrus_dies, valkey_dies) {
        (true, true) => "walrus and Valkey killed",
        (true, false) => "walrus killed",
        _ => "Valkey killed, walrus ran on",
    };
    Ok(format!("power loss ({crash}), {who}"))
}

/// Counts what the crash did to the writes in flight or not yet synced (faultfs's reply).
fn record(ctx: &Ctx, outcome: &std::collections::HashMap<String, u64>) {
    let writes = outcome.get("writes").copied().unwrap_or(0);
    let kept = outcome.get("kept_writes").copied().unwrap_or(0);
    let mut h = ctx.h();
    if writes > 0 {
        h.count("power: power losses that caught unsynced writes");
    }
    h.count_n("power: unsynced writes lost", writes - kept.min(writes));
    h.count_n("power: unsynced writes kept (torn or reordered)", kept);
}

/// walrus lived through its disk's power loss. A journal write that failed in it fenced its
/// journal (docs/failure-modes.md, rows 5 and 6): writes are then refused until a restart,
/// which is what an operator does, and so does this. Returns once walrus acknowledges a
/// write (so that no later write can be fenced by this power loss).
fn survived(sys: &mut System, ctx: &Ctx) -> Result<(), String> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < RECOVERY {
        match sys.try_write() {
            Ok(()) => return Ok(()),
            Err(e) if e.contains("journal failed") => {
                ctx.h()
                    .count("power: journal fenced in a power loss walrus ran through, restarted");
                sys.kill_walrus();
                return relaunch(sys, ctx);
            }
            Err(e) => last = e,
        }
        // With a full ring, it may need a checkpoint before it takes writes (as `recover`).
        if start.elapsed() > PATIENCE && (sys.flag(Flag::Checkpoint) || sys.flag(Flag::Manifest)) {
            ctx.h()
                .count("fault: checkpoint fault cleared, walrus not writable after a power loss");
            sys.set_flag(Flag::Checkpoint, false);
            sys.set_flag(Flag::Manifest, false);
        }
        // Retry pacing while walrus restores the new Valkey.
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "walrus took no write within {RECOVERY:?} of a power loss it ran through; last: {last}"
    ))
}
