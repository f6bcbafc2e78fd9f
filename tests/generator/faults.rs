//! The fault loop: at random moments, one random fault, then (for the ones that take walrus
//! or Valkey away) a wait until walrus serves again: reads retried while it answers
//! -LOADING, and, for a kill in the middle of a restore, the log line of the restore. In
//! the cluster's `shards` mode, kills of several shards at once (`cluster.rs`) and slot
//! moves (`reshard.rs`) too.

use crate::cluster::{kill_shards, revive_with, Kill};
use crate::common::Rng;
use crate::shared::{pick, Ctx};
use crate::system::{Flag, Mode, System, RECOVERY};
use crate::{freeze, power, reshard, stops};
use std::time::{Duration, Instant};

/// Logged when a restore starts loading Valkey.
const RESTORING: &str = "restore: loading Valkey from the checkpoint";
/// How long walrus gets to recover while its checkpoints fail, before the fault is cleared
/// (with a full ring it may need a checkpoint first).
pub const PATIENCE: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL walrus (managed: its Valkey dies with it), restart it on the same data.
    KillWalrus,
    /// SIGKILL Valkey alone (external: a new empty one takes its port).
    KillValkey,
    /// External: SIGKILL both, restart both.
    KillBoth,
    /// SIGKILL Valkey, then walrus while it restores the new one.
    KillDuringRestore,
    /// Checkpoints fail (ENOSPC) until toggled again: the ring fills, writes get refused.
    FailingCheckpoints,
    /// Manifest writes fail (EIO) until toggled again (cleared before any walrus start).
    FailingManifests,
    /// `CLIENT KILL TYPE normal` on Valkey: walrus's upstream connections break.
    DropConnections,
    /// `CLIENT KILL TYPE replica` on Valkey: walrus's replica link breaks.
    DropReplicaLink,
    /// A few MiB written straight into Valkey, around walrus: the stream grows even while
    /// walrus refuses writes, so a ring at its watermark (checkpoints failing) fills up.
    WriteAround,
    /// faultfs only: the disk loses what was not synced, and walrus, Valkey or both die
    /// (`power.rs`).
    PowerLoss,
    /// Cluster: the shard under test and one or both others killed at once (`cluster.rs`).
    KillShards,
    /// Cluster: a slot of the clients' keys moved with MIGRATE, perhaps cut short by a kill
    /// and then fixed (`reshard.rs`).
    MoveSlot,
    /// SIGSTOP Valkey for longer than walrus's reply timeout, then SIGCONT (`freeze.rs`).
    FreezeValkey,
    /// SIGTERM walrus: a graceful stop, then a start on the same data (`stops.rs`).
    Sigterm,
    /// A second walrus started on the running one's data directory (`stops.rs`).
    SecondWalrus,
    /// SIGKILL Valkey, then the next Valkey too as soon as the restore reaches it: walrus
    /// must start over with the one after, well before `restore.timeout_ms`.
    KillInHandshake,
}

/// What the fault loop injects, and how often.
#[derive(Clone, Copy)]
pub struct Plan {
    /// The weight of a power loss among the faults of the mode's table, when walrus's data
    /// is on faultfs (the table's weights add up to about 100).
    pub power_loss: u64,
    /// The pause before each fault: `pause_ms` plus up to `pause_spread_ms`.
    pub pause_ms: u64,
    pub pause_spread_ms: u64,
}

/// The faults of the shard under test in cluster mode (the second walrus's probe write and
/// a freeze of one shard's Valkey are for the modes of one walrus).
const CLUSTER: &[(Fault, u64)] = &[
    (Fault::KillWalrus, 20),
    (Fault::KillValkey, 20),
    (Fault::KillDuringRestore, 8),
    (Fault::FailingCheckpoints, 16),
    (Fault::FailingManifests, 6),
    (Fault::DropConnections, 10),
    (Fault::DropReplicaLink, 6),
    (Fault::WriteAround, 8),
    (Fault::Sigterm, 6),
    (Fault::KillInHandshake, 5),
];

const MANAGED: &[(Fault, u64)] = &[
    (Fault::KillWalrus, 20),
    (Fault::KillValkey, 20),
    (Fault::KillDuringRestore, 8),
    (Fault::FailingCheckpoints, 16),
    (Fault::FailingManifests, 6),
    (Fault::DropConnections, 10),
    (Fault::DropReplicaLink, 6),
    (Fault::WriteAround, 8),
    (Fault::FreezeValkey, 3),
    (Fault::Sigterm, 6),
    (Fault::SecondWalrus, 4),
    (Fault::KillInHandshake, 5),
];

const EXTERNAL: &[(Fault, u64)] = &[
    (Fault::KillWalrus, 16),
    (Fault::KillValkey, 16),
    (Fault::KillBoth, 12),
    (Fault::KillDuringRestore, 8),
    (Fault::FailingCheckpoints, 16),
    (Fault::FailingManifests, 6),
    (Fault::DropConnections, 10),
    (Fault::DropReplicaLink, 6),
    (Fault::WriteAround, 8),
    (Fault::FreezeValkey, 3),
    (Fault::Sigterm, 6),
    (Fault::SecondWalrus, 4),
    (Fault::KillInHandshake, 5),
];

/// Every fault of managed mode on the shard under test, and the faults of several shards,
/// about half of all (few faults fit in a run: each takes seconds, restores in place and a
/// cluster that settles).
const SHARDS: &[(Fault, u64)] = &[
    (Fault::KillWalrus, 10),
    (Fault::KillValkey, 10),
    (Fault::KillDuringRestore, 4),
    (Fault::FailingCheckpoints, 8),
    (Fault::FailingManifests, 3),
    (Fault::DropConnections, 5),
    (Fault::DropReplicaLink, 3),
    (Fault::WriteAround, 4),
    (Fault::KillShards, 25),
    (Fault::MoveSlot, 28),
];

/// Stop injecting once this many violations are known: the run has said enough.
const ENOUGH: usize = 200;

/// How long walrus may take to serve again after the Valkey it was restoring died in the
/// handshake: well below `restore.timeout_ms` (60 s), after which a restore gives up anyway.
const RESTORE_AGAIN: Duration = Duration::from_secs(30);

/// Injects faults until `deadline`. `Err`: walrus did not come back from one.
pub fn run(
    sys: &mut System,
    ctx: &Ctx,
    rng: &mut Rng,
    plan: Plan,
    deadline: Instant,
) -> Result<(), String> {
    let mut table = match sys.mode {
        Mode::Managed => MANAGED,
        Mode::Cluster => CLUSTER,
        Mode::External => EXTERNAL,
        Mode::Shards => SHARDS,
    }
    .to_vec();
    if sys.on_faultfs() && plan.power_loss > 0 {
        table.push((Fault::PowerLoss, plan.power_loss));
    }
    // `WALRUS_GEN_FAULTS=KillShards,MoveSlot`: those faults of the mode's table only.
    if let Some(only) = std::env::var("WALRUS_GEN_FAULTS")
        .ok()
        .filter(|v| !v.is_empty())
    {
        table.retain(|(f, _)| only.split(',').any(|o| o.trim() == format!("{f:?}")));
        assert!(
            !table.is_empty(),
            "WALRUS_GEN_FAULTS: none of {only:?} in this mode"
        );
    }
    loop {
        // Fault pacing: the random moment of the next fault (workload, not synchronization).
        let pause = Duration::from_millis(plan.pause_ms + rng.below(plan.pause_spread_ms));
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(pause.min(left));
        if Instant::now() >= deadline || ctx.h().violations.len() >= ENOUGH {
            return Ok(());
        }
        // A failing checkpoint or manifest is an episode: it ends soon, so that most of the
        // run has a ring that recycles (and writes that are accepted).
        let fault = match (sys.flag(Flag::Checkpoint), sys.flag(Flag::Manifest)) {
            (true, _) if rng.below(3) == 0 => Fault::FailingCheckpoints,
            (_, true) if rng.below(3) == 0 => Fault::FailingManifests,
            _ => pick(rng, &table),
        };
        ctx.h().release.begin();
        let what = inject(sys, ctx, rng, fault).map_err(|e| format!("after {fault:?}: {e}"));
        ctx.h().release.end();
        ctx.h().count(&format!("fault: {}", what?));
    }
}

/// Injects `fault`; returns what it did.
fn inject(sys: &mut System, ctx: &Ctx, rng: &mut Rng, fault: Fault) -> Result<String, String> {
    match fault {
        Fault::KillWalrus => {
            sys.kill_walrus();
            relaunch(sys, ctx)?;
        }
        Fault::KillValkey => {
            if !sys.kill_valkey() {
                return Ok("Valkey kill skipped (it was restarting)".into());
            }
            recover(sys, ctx)?;
        }
        Fault::KillBoth => {
            sys.stop_external_valkey();
            sys.kill_walrus();
            sys.start_external_valkey();
            relaunch(sys, ctx)?;
        }
        // While checkpoints fail, a restore may never start (and without a journal, none
        // does): a plain Valkey kill then.
        Fault::KillDuringRestore if sys.flag(Flag::Checkpoint) || !sys.durable => {
            return inject(sys, ctx, rng, Fault::KillValkey);
        }
        Fault::KillDuringRestore => {
            let before = sys.lines(RESTORING);
            if !sys.kill_valkey() {
                return Ok("Valkey kill skipped (it was restarting)".into());
            }
            sys.await_lines(RESTORING, before, RECOVERY);
            // Somewhere in the restore (pacing of the fault, not synchronization).
            std::thread::sleep(Duration::from_millis(rng.below(300)));
            sys.kill_walrus();
            relaunch(sys, ctx)?;
        }
        Fault::FailingCheckpoints | Fault::FailingManifests => {
            let flag = match fault {
                Fault::FailingCheckpoints => Flag::Checkpoint,
                _ => Flag::Manifest,
            };
            let on = !sys.flag(flag);
            sys.set_flag(flag, on);
            let state = if on { "on" } else { "off" };
            return Ok(format!("{fault:?} {state}"));
        }
        Fault::WriteAround => {
            let n = 32 + rng.below(32) as usize;
            if !sys.write_around(n) {
                return Ok(format!("{fault:?} cut short (Valkey unreachable)"));
            }
        }
        Fault::PowerLoss => return power::power_loss(sys, ctx, rng),
        Fault::FreezeValkey => return freeze::freeze(sys, ctx, rng),
        Fault::Sigterm => return stops::sigterm(sys, ctx),
        // Its probe write needs a ring that takes writes.
        Fault::SecondWalrus if sys.flag(Flag::Checkpoint) || sys.flag(Flag::Manifest) => {
            return Ok("SecondWalrus skipped (checkpoints failing)".into())
        }
        Fault::SecondWalrus => return stops::second_walrus(sys, ctx),
        Fault::KillInHandshake if sys.flag(Flag::Checkpoint) || !sys.durable => {
            return inject(sys, ctx, rng, Fault::KillValkey);
        }
        Fault::KillInHandshake => {
            let before = sys.lines(RESTORING);
            if !sys.kill_valkey() {
                return Ok("Valkey kill skipped (it was restarting)".into());
            }
            sys.await_lines(RESTORING, before, RECOVERY);
            if !sys.kill_valkey() {
                return Ok("KillInHandshake: the restore's Valkey was gone already".into());
            }
            if let Err(e) = sys.await_serving(RESTORE_AGAIN) {
                ctx.h().violation(format!(
                    "slow restore: the Valkey walrus was restoring died in the handshake, and \
                     walrus did not serve again within {RESTORE_AGAIN:?} ({e})"
                ));
                recover(sys, ctx)?;
            }
        }
        Fault::KillShards => return kill_shards(sys, ctx, rng),
        Fault::MoveSlot => return reshard::move_slot(sys, ctx, rng),
        Fault::DropConnections | Fault::DropReplicaLink => {
            let kind = match fault {
                Fault::DropConnections => "normal",
                _ => "replica",
            };
            if !sys.drop_connections(kind) {
                return Ok(format!("{fault:?} skipped (Valkey unreachable)"));
            }
        }
    }
    Ok(format!("{fault:?}"))
}

/// Starts walrus again on the same data directory, points the clients at it, and returns
/// once it serves reads.
pub fn relaunch(sys: &mut System, ctx: &Ctx) -> Result<(), String> {
    let (delay, backend) = sys.launch()?;
    ctx.h().release.started(journal_delay(sys));
    if delay > 0 {
        ctx.h().count(&format!(
            "fault: walrus started with a {delay} ms journal delay"
        ));
    }
    ctx.h()
        .count(&format!("start: walrus with the {backend} journal backend"));
    ctx.target.set(&sys.addr());
    recover(sys, ctx)
}

/// The journal delay the check that needs no crash holds the current walrus to
/// (`release.rs`): none in cluster mode, whose other shards' journals are not slowed.
pub fn journal_delay(sys: &System) -> u64 {
    if sys.mode.cluster() {
        0
    } else {
        sys.delay_ms
    }
}

/// Returns once walrus serves reads again. While checkpoints fail it gets `PATIENCE`, then
/// the fault is cleared (counted): with a full ring, it may need a checkpoint to recover.
pub fn recover(sys: &mut System, ctx: &Ctx) -> Result<(), String> {
    if sys.flag(Flag::Checkpoint) {
        if sys.await_serving(PATIENCE).is_ok() {
            return Ok(());
        }
        ctx.h()
            .count("fault: checkpoint fault cleared, walrus not serving after a kill");
        sys.set_flag(Flag::Checkpoint, false);
    }
    sys.await_serving(RECOVERY)
}

/// The last fault of a run, after its clients stopped: everything dies (walrus and Valkey;
/// in cluster mode, on every shard at once) and comes back from disk, so that the final
/// read checks what the journals hold. On faultfs, in a power loss.
pub fn final_restart(sys: &mut System, ctx: &Ctx, rng: &mut Rng) -> Result<(), String> {
    sys.set_flag(Flag::Checkpoint, false);
    sys.set_flag(Flag::Manifest, false);
    let mut others = Vec::new();
    for i in 1..=sys.peers.len() {
        sys.kill_shard(i, Kill::Walrus);
        others.push((i, Kill::Walrus));
    }
    revive_with(sys, &others, |sys| {
        if sys.on_faultfs() {
            let what = power::cut(sys, ctx, rng, power::Victims::All)?;
            ctx.h().count(&format!("fault: final {what}"));
            return Ok(());
        }
        if sys.mode == Mode::External {
            sys.stop_external_valkey();
            sys.kill_walrus();
            sys.start_external_valkey();
        } else {
            sys.kill_walrus();
        }
        relaunch(sys, ctx)
    })
}
