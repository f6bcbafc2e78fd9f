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
//! large for one journal entry). Meanwhile a fault loop (`generator/faults.rs`) SIGKILLs
//! walrus, Valkey or both, sometimes in the middle of a restore, fails checkpoints and
//! manifests, slows the journal, breaks walrus's upstream connections, writes around walrus
//! and, on faultfs, cuts the power (`generator/power.rs`). Each mode ends with everything
//! killed and restored from disk, and a final read of every key. The checks are in
//! `generator/history.rs` and its companions (as things happen) and `generator/check.rs`
//! (against the final state). `generator/runner.rs` runs it all.
//!
//! - `WALRUS_GEN_SEED`: the seed (default: from the clock); printed at the start and in every
//!   failure. Thread scheduling is not replayed, but every random choice is, and the fault
//!   loop's sequence of faults is the same.
//! - `WALRUS_GEN_SECONDS`: how long faults are injected, in total (default 40).
//! - `WALRUS_GEN_MODE`: `managed`, `external`, `cluster` or `both` (default: managed, then
//!   external, each half the time). `cluster`: walrus's Valkey is one primary of a Valkey
//!   Cluster of three, each behind its walrus, and owns the slot of every key the clients
//!   use (they all carry the hash tag `{gen}`); the faults hit that shard, whose restores
//!   are in place. The second test runs cluster mode alone.
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
/// of managed mode, restored in place (README, "Valkey Cluster").
#[test]
fn generated_histories_keep_walruss_promises_on_a_cluster_shard() {
    let mut s = Settings::from_env(20, Disk::Tmp, EVERY_FAULT);
    s.modes = vec![Mode::Cluster];
    runner::run_all(s);
}
