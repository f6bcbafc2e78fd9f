//! A seeded, randomized generator of client histories under faults, and a checker of the
//! promises walrus makes: no client ever sees data a crash could lose, no acknowledged
//! write is ever lost, and walrus never hangs.
//!
//! Concurrent clients (`generator/workers.rs`, `generator/listeners.rs`) append unique
//! elements to lists: single, pipelined, in scripts, in MULTI/EXEC (with WATCH, with a
//! command refused while queued, with a read between the pushes), and in pipelines whose
//! client vanishes without reading a reply. They read them (LRANGE, EVAL_RO, LLEN, DBSIZE,
//! INFO keyspace, RANDOMKEY, EXISTS, SCAN), increment counters and read them (INCR, GET),
//! push and pop jobs on queues (BLPOP with a timeout, and one consumer blocked in BLPOP 0),
//! publish and subscribe, and write large values (and, rarely, a transaction of them too
//! large for one journal entry). They send commands of several keys (`generator/registers.rs`:
//! MSET, DEL, UNLINK, MGET, EXISTS; BLMPOP, BLMOVE), use other databases and SELECT inside
//! MULTI (`generator/databases.rs`), write keys that expire (`generator/expiry.rs`), speak
//! RESP3 (half the workers), send administrative commands walrus must refuse
//! (`generator/admin.rs`), and listen to keyspace notifications and tracking invalidations
//! (`generator/sidechannel.rs`). Meanwhile a fault loop (`generator/faults.rs`) SIGKILLs
//! walrus, Valkey or both, sometimes in the middle of a restore or of its handshake, fails
//! checkpoints and manifests, slows the journal, breaks walrus's upstream connections,
//! writes around walrus, freezes Valkey (`generator/freeze.rs`), stops walrus with SIGTERM
//! and starts a second walrus on its data directory (`generator/stops.rs`) and, on faultfs,
//! cuts the power (`generator/power.rs`). With a slowed journal, no reply may reveal a write
//! before the journal can hold it: a dirty read seen without a crash
//! (`generator/release.rs`). Each mode ends with everything
//! killed and restored from disk, and a final read of every key. The checks are in
//! `generator/history.rs` and its companions (as things happen) and `generator/check.rs`
//! (against the final state). `generator/runner.rs` runs it all.
//!
//! - `WALRUS_GEN_SEED`: the seed (default: from the clock); printed at the start and in every
//!   failure. Thread scheduling is not replayed, but every random choice is, and the fault
//!   loop's sequence of faults is the same.
//! - `WALRUS_GEN_SECONDS`: how long faults are injected, in total (default 40).
//! - `WALRUS_GEN_MODE`: `managed`, `external`, `cluster`, `shards` or `both` (default:
//!   managed, then external, each half the time). `cluster`: walrus's Valkey is one primary
//!   of a Valkey Cluster of three, each behind its walrus; the clients' keys carry the hash
//!   tag `{gen}` (that shard's slot) or `{gen2}` (another shard's: `generator/keys.rs`), and
//!   the clients follow MOVED and ASK, which must name walruses only (`generator/route.rs`);
//!   the faults hit that shard, whose restores are in place. `shards`: the same cluster,
//!   and among the faults kills of two or three shards at once and slot moves with MIGRATE,
//!   some cut short by a kill on either side (`generator/cluster.rs`,
//!   `generator/reshard.rs`). The second and third tests run these modes alone.
//! - `WALRUS_GEN_FAULTS`: a comma-separated list of fault names (`KillShards,MoveSlot`,
//!   ...): only those of the mode's table, to look at one kind at a time.
//! - `WALRUS_GEN_OPS`: a comma-separated list of the workers' operations (`Append`,
//!   `RegWrite`, `Database`, `Expire`, `Refused`, ...: `generator/workers.rs`): only those.
//! - `WALRUS_GEN_FIX=redis-cli`: a cut slot move is finished with `redis-cli --cluster fix`
//!   rather than by running the rest of the move (`generator/reshard.rs` says why that loses
//!   acknowledged writes, walrus or not).
//! - `WALRUS_GEN_DISK`: `tmp` (default) or `faultfs`: walrus's data directory on a faultfs
//!   mount (docs/faultfs.md), and power losses among the faults (`generator/power.rs`).
//!   `tests/power_loss.rs` runs mostly power losses on faultfs.
//! - `WALRUS_TEST_NO_DURABILITY=1` (the harness's switch) runs walrus without its journal: a
//!   negative control, which must fail with lost writes and dirty reads.
//!
//! A failing run writes every process log under `target/tmp/generator-<seed>/` (every run
//! does with `WALRUS_GEN_KEEP_LOGS=1`).
mod common;
include!("generator/modules.rs");

use faults::Plan;
use runner::{Disk, Settings};
use system::Mode;

/// Every fault, at a pace that leaves the clients time to work in between; power losses
/// only with `WALRUS_GEN_DISK=faultfs` (then as often as a SIGKILL of walrus).
const EVERY_FAULT: Plan = Plan {
    power_loss: 20,
    pause_ms: 300,
    pause_spread_ms: 2700,
};

#[test]
fn generated_histories_keep_walruss_promises() {
    runner::run_all(Settings::from_env(40, Disk::Tmp, EVERY_FAULT));
}

/// The same in cluster mode: one shard of a three-primary Valkey Cluster under every fault
/// of managed mode, restored in place (docs/cluster.md, "Valkey Cluster"); the clients' keys on it
/// and on another shard.
#[test]
fn generated_histories_keep_walruss_promises_on_a_cluster_shard() {
    let mut s = Settings::from_env(20, Disk::Tmp, EVERY_FAULT);
    s.modes = vec![Mode::Cluster];
    runner::run_all(s);
}

/// The cluster with faults on several shards at once and slot moves with MIGRATE, some cut
/// short by a kill on either side, then finished; the clients' keys on every shard a move
/// takes them to.
#[test]
fn generated_histories_keep_walruss_promises_across_cluster_shards() {
    let mut s = Settings::from_env(20, Disk::Tmp, EVERY_FAULT);
    s.modes = vec![Mode::Shards];
    runner::run_all(s);
}
