//! Fuzzes the journal recovery scanner: `cargo +nightly fuzz run recovery` from the repo root.
//! The input builds a real log, damages it, and the scanner's invariants are checked
//! (see `walrus::journal::sim::fuzz_recovery`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    walrus::journal::sim::fuzz_recovery(data);
});
