//! Slot moves while the clients run, with MIGRATE, made as `redis-cli --cluster reshard`
//! makes them (docs/cluster.md, "Resharding"): the target imports the slot of one
//! of the clients' tags, the source migrates it, every key goes by MIGRATE sent through the
//! source's walrus and naming the target's walrus (which answers RESTORE-ASKING once its
//! journal holds the key), then each node is told the new owner, the target first. Two moves
//! in three are cut short: one side's walrus or Valkey is SIGKILLed between two steps, or
//! with a MIGRATE in flight. Once it is back, the move is finished from where it stopped
//! (what running the reshard again does), and `redis-cli --cluster check` must find the
//! cluster whole. Every move ends with all nodes agreeing on the slot's owner and no slot
//! open, before the next fault.
//!
//! `WALRUS_GEN_FIX=redis-cli` finishes a cut move with `redis-cli --cluster fix` instead.
//! Its way loses acknowledged writes under clients, walrus or not: when the target holds
//! more of the slot's keys, it makes the target the owner at once and moves the rest
//! "cold", so clients are sent to the target before the source's keys are there and write
//! fresh ones; the rest then fail with BUSYKEY, and its check of the values (DEBUG
//! DIGEST-VALUE) is refused by a Valkey that does not enable DEBUG.

use crate::cluster::{await_settled, call, owner_in, revive, view, Kill};
use crate::common::{Raw, Rng};
use crate::faults::PATIENCE;
use crate::keys::{tag_slot, TAGS};
use crate::shared::Ctx;
use crate::system::{Flag, System, RECOVERY};
use redis_protocol::resp2::types::OwnedFrame;
use std::io::Write;
use std::time::{Duration, Instant};

/// Keys per MIGRATE: a move of a tag's keys (a dozen) takes several, so cuts fall between.
const BATCH: usize = 2;
/// How long the nodes get to agree once a move is done (gossip).
const SETTLE: Duration = Duration::from_secs(30);

/// Where a move is cut short: after step `step` (or during it, for a MIGRATE `in_flight`),
/// by SIGKILL of the `what` of the source (or of the target).
struct Cut {
    step: usize,
    source: bool,
    what: Kill,
    in_flight: bool,
}

/// Where a cut fell: the shard, what was killed there, and when.
type Fell = (usize, Kill, &'static str);

/// One move: a slot from one shard to another.
struct Move {
    slot: String,
    shards: Vec<String>,
    ids: Vec<String>,
    source: usize,
    target: usize,
    /// Steps done.
    step: usize,
    cut: Option<Cut>,
    /// How long a cut in flight waits after sending its MIGRATE.
    pause: Duration,
}

/// The fault: one move, perhaps cut short; returns what it did.
pub fn move_slot(sys: &mut System, ctx: &Ctx, rng: &mut Rng) -> Result<String, String> {
    // A move asks every shard CLUSTER commands, which walrus holds, as any keyless read,
    // while writes wait for its journal: with a ring that failing checkpoints let fill, for
    // as long as they fail. The episode ends before a move.
    if sys.flag(Flag::Checkpoint) || sys.flag(Flag::Manifest) {
        ctx.h()
            .count("fault: checkpoint and manifest faults cleared before a move");
        sys.set_flag(Flag::Checkpoint, false);
        sys.set_flag(Flag::Manifest, false);
    }
    let slot = tag_slot(rng.below(TAGS.len() as u64) as usize);
    let source = await_settled(sys, slot, SETTLE)?;
    let target = (source + 1 + rng.below(2) as usize) % 3;
    let shards = sys.shards();
    let count = ["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()];
    let keys = match call(&shards[source], &count)? {
        OwnedFrame::Integer(n) => n as usize,
        other => return Err(format!("CLUSTER COUNTKEYSINSLOT: {other:?}")),
    };
    // IMPORTING, MIGRATING, the MIGRATEs, the owner on the target: a cut after any of them.
    let steps = 2 + keys.div_ceil(BATCH) + 1;
    let cut = (rng.below(3) != 0).then(|| Cut {
        step: rng.below(steps as u64) as usize,
        source: rng.below(2) == 0,
        what: match rng.below(2) {
            0 => Kill::Walrus,
            _ => Kill::Valkey,
        },
        in_flight: rng.below(2) == 0,
    });
    let plan =
        match &cut {
            Some(c) => format!(
            "slot {slot} from shard {source} to {target}, {keys} keys, cut at step {} of {steps} \
             ({}, the {}'s {:?})",
            c.step,
            if c.in_flight { "in flight" } else { "between steps" },
            if c.source { "source" } else { "target" },
            c.what
        ),
            None => format!("slot {slot} from shard {source} to {target}, {keys} keys"),
        };
    sys.keep_log("move", plan.clone());
    let mut m = Move {
        slot: slot.to_string(),
        ids: sys.ids.clone(),
        shards,
        source,
        target,
        step: 0,
        cut,
        pause: Duration::from_millis(rng.below(10)),
    };
    let context = |e: String| format!("{plan}: {e}");
    let fell = m.run(sys, ctx).map_err(context)?;
    let with_redis_cli = std::env::var("WALRUS_GEN_FIX").is_ok_and(|v| v == "redis-cli");
    if let Some((victim, killed, _)) = fell {
        revive(sys, ctx, &[(victim, killed)])?;
        m.cut = None;
        match with_redis_cli {
            true => redis_cli(sys, &["fix", "--cluster-yes"], false),
            false => m.finish(sys, ctx),
        }
        .map_err(context)?;
    }
    let owner = await_settled(sys, slot, SETTLE).map_err(context)?;
    if owner != target && !with_redis_cli {
        return Err(context(format!("shard {owner} owns the slot at the end")));
    }
    let Some((victim, killed, stage)) = fell else {
        return Ok(match m.cut {
            Some(_) => "MoveSlot (finished before its cut)".to_string(),
            None => "MoveSlot".to_string(),
        });
    };
    // What a user checks after an interrupted reshard.
    redis_cli(sys, &["check"], true).map_err(context)?;
    let side = if victim == source { "source" } else { "target" };
    Ok(format!(
        "MoveSlot cut {stage}: the {side}'s {killed:?} killed, then finished"
    ))
}

impl Move {
    /// Runs the move (the rest of it, when the target owns the slot already); returns where
    /// the cut fell, if it did.
    fn run(&mut self, sys: &mut System, ctx: &Ctx) -> Result<Option<Fell>, String> {
        let (src_id, dst_id) = (self.ids[self.source].clone(), self.ids[self.target].clone());
        let target_owns = owner_in(&view(&self.shards[self.target])?, self.slot_number())
            .is_some_and(|id| id == dst_id);
        if !target_owns {
            self.setslot(self.target, &["IMPORTING", &src_id])?;
            if let Some(fell) = self.after(sys, "after SETSLOT IMPORTING") {
                return Ok(Some(fell));
            }
            self.setslot(self.source, &["MIGRATING", &dst_id])?;
            if let Some(fell) = self.after(sys, "after SETSLOT MIGRATING") {
                return Ok(Some(fell));
            }
        }
        loop {
            let keys = self.keys_left()?;
            if keys.is_empty() {
                break;
            }
            if self
                .cut
                .as_ref()
                .is_some_and(|c| c.in_flight && c.step == self.step)
            {
                // Sent, not answered: the kill comes while it runs (somewhere in it: pacing
                // of the fault, not synchronization). The connection stays open until then.
                let addr = &self.shards[self.source];
                let mut c = Raw::try_connect(addr).map_err(|e| format!("{addr}: {e}"))?;
                let migrate = walrus::resp::write::command(self.migrate(&keys, false));
                c.stream.write_all(&migrate).map_err(|e| e.to_string())?;
                std::thread::sleep(self.pause);
                return Ok(self.after(sys, "during a MIGRATE"));
            }
            self.migrate_until_done(sys, ctx, &keys)?;
            if let Some(fell) = self.after(sys, "after a MIGRATE") {
                return Ok(Some(fell));
            }
        }
        // The target first: once it owns the slot, the source's answers (MOVED) agree.
        self.setslot(self.target, &["NODE", &dst_id])?;
        if let Some(fell) = self.after(sys, "after SETSLOT NODE on the target") {
            return Ok(Some(fell));
        }
        self.setslot(self.source, &["NODE", &dst_id])?;
        let third = 3 - self.source - self.target;
        self.setslot(third, &["NODE", &dst_id])?;
        Ok(None)
    }

    /// After a cut: the rest of the move, from where it stopped (the shards just back may
    /// answer errors for a moment: -LOADING, -CLUSTERDOWN), within `RECOVERY`.
    fn finish(&mut self, sys: &mut System, ctx: &Ctx) -> Result<(), String> {
        let start = Instant::now();
        loop {
            match self.run(sys, ctx) {
                Ok(_) => return Ok(()),
                Err(e) if start.elapsed() > RECOVERY => {
                    return Err(format!("the move did not finish within {RECOVERY:?}: {e}"))
                }
                // Retry pacing while the shard that was cut rejoins.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn slot_number(&self) -> u16 {
        self.slot.parse().expect("a slot")
    }

    /// One step done: if the cut falls here, its victim is killed, and where it fell is
    /// returned.
    fn after(&mut self, sys: &mut System, stage: &'static str) -> Option<Fell> {
        let cut = self.cut.as_ref().filter(|c| c.step == self.step);
        self.step += 1;
        let cut = cut?;
        let victim = if cut.source { self.source } else { self.target };
        // A Valkey that walrus is restarting has nothing to kill: its restore is the cut.
        sys.kill_shard(victim, cut.what);
        Some((victim, cut.what, stage))
    }

    fn setslot(&self, shard: usize, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["CLUSTER", "SETSLOT", &self.slot];
        all.extend_from_slice(args);
        match call(&self.shards[shard], &all)? {
            OwnedFrame::SimpleString(ok) if ok == b"OK" => Ok(()),
            other => Err(format!(
                "{} at {}: {other:?}",
                all.join(" "),
                self.shards[shard]
            )),
        }
    }

    /// Up to `BATCH` keys of the slot still on the source.
    fn keys_left(&self) -> Result<Vec<String>, String> {
        let get = ["CLUSTER", "GETKEYSINSLOT", &self.slot, &BATCH.to_string()];
        match call(&self.shards[self.source], &get)? {
            OwnedFrame::Array(keys) => Ok(keys
                .into_iter()
                .map(|k| match k {
                    OwnedFrame::BulkString(k) => String::from_utf8_lossy(&k).into_owned(),
                    other => format!("{other:?}"),
                })
                .collect()),
            other => Err(format!("CLUSTER GETKEYSINSLOT: {other:?}")),
        }
    }

    /// `MIGRATE <target walrus> "" 0 <timeout> [REPLACE] KEYS ...`
    fn migrate<'a>(&'a self, keys: &'a [String], replace: bool) -> Vec<&'a str> {
        let (host, port) = self.shards[self.target]
            .rsplit_once(':')
            .expect("host:port");
        let mut args = vec!["MIGRATE", host, port, "", "0", "10000"];
        if replace {
            args.push("REPLACE");
        }
        args.push("KEYS");
        args.extend(keys.iter().map(String::as_str));
        args
    }

    /// MIGRATEs `keys`, retried while either side refuses (a restore, a ring full while
    /// checkpoints fail: that fault is cleared after `PATIENCE`, as `recover` does); with
    /// REPLACE once the target holds a key already: a copy an interrupted MIGRATE left
    /// there. The source's counts: while the source has a key, clients are served its copy
    /// (and the target's walrus held its own copy's acknowledgement until journaled, the
    /// source's the deletion's, so no client was sent to the target's copy before).
    fn migrate_until_done(&self, sys: &System, ctx: &Ctx, keys: &[String]) -> Result<(), String> {
        let start = Instant::now();
        let mut replace = false;
        loop {
            let last = match call(&self.shards[self.source], &self.migrate(keys, replace)) {
                Ok(OwnedFrame::SimpleString(s)) if s == b"OK" || s == b"NOKEY" => return Ok(()),
                Ok(OwnedFrame::Error(e)) if e.contains("BUSYKEY") => {
                    ctx.h()
                        .count("move: MIGRATE again with REPLACE after -BUSYKEY");
                    replace = true;
                    format!("-{e}")
                }
                other => format!("{other:?}"),
            };
            if start.elapsed() > RECOVERY {
                return Err(format!(
                    "MIGRATE of {keys:?} kept failing for {RECOVERY:?}: {last}"
                ));
            }
            if start.elapsed() > PATIENCE && sys.flag(Flag::Checkpoint) {
                ctx.h()
                    .count("fault: checkpoint fault cleared, MIGRATE refused meanwhile");
                sys.set_flag(Flag::Checkpoint, false);
            }
            // Retry pacing while a side restores or refuses writes.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `redis-cli --cluster <args[0]> <a walrus> <args[1..]>`, its output kept with the run's
/// logs. `clean`: it must find every slot covered, by one owner, none open.
fn redis_cli(sys: &mut System, args: &[&str], clean: bool) -> Result<(), String> {
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", args[0], &sys.addr()])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    sys.keep_log(&format!("redis-cli-{}", args[0]), text.clone());
    let whole = text.contains("[OK] All nodes agree about slots configuration")
        && text.contains("[OK] All 16384 slots covered")
        && !text.contains("[WARNING]")
        && !text.contains("[ERR]");
    if clean && !(out.status.success() && whole) {
        return Err(format!(
            "redis-cli --cluster {} finds the cluster not whole:\n{text}",
            args[0]
        ));
    }
    Ok(())
}
