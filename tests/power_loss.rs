//! Power losses under the generator's workload (`tests/generator.rs`, docs/generator.md):
//! walrus's data directory (journal, checkpoints, the managed Valkey's directory) lives on
//! faultfs (docs/faultfs.md), and most faults are power cuts: faultfs drops, tears or
//! reorders every write not yet synced, walrus and/or Valkey are SIGKILLed, the disk comes
//! back and they restart on what survived (`generator/power.rs`). The generator's checker
//! then holds walrus to its promises: every acknowledged write is there, no read showed a
//! value a power loss then took, counters never go back, list elements appear at most once
//! and in order.
//!
//! Skipped, with the reason printed, where FUSE cannot be mounted. The same settings as the
//! generator's (`WALRUS_GEN_SEED`, `WALRUS_GEN_MODE`, `WALRUS_GEN_KEEP_LOGS`), and:
//!
//! - `WALRUS_GEN_SECONDS`: how long faults are injected (default 36: some 15 power losses);
//!   the long run is `WALRUS_GEN_SECONDS=1800` (docs/power-loss.md).
//! - `FAILPOINTS=journal::no_sync=return` (the fail point, for every walrus of the run): a
//!   negative control. walrus's journal writes are acknowledged before they are durable (the
//!   segments opened without O_DSYNC): a SIGKILL loses none of them, a power loss does, and this test
//!   must then fail.
mod common;
include!("generator/modules.rs");

use faults::Plan;
use runner::{Disk, Settings};

/// Mostly power losses (about two faults in three), the other faults among them, paced
/// faster than the generator's, so that a short run has many.
const POWER_LOSSES: Plan = Plan {
    power_loss: 200,
    pause_ms: 200,
    pause_spread_ms: 1000,
};

#[test]
fn power_losses_keep_walruss_promises() {
    runner::run_all(Settings::from_env(36, Disk::FaultFs, POWER_LOSSES));
}
