//! `cargo +nightly fuzz run recovery fuzz/seeds/recovery` from the repository root. The
//! input builds a real log, damages it, and the scanner's invariants are checked (see
//! `walrus::journal::sim::fuzz_recovery`, which `cargo test` runs too).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| walrus::journal::sim::fuzz_recovery(data));
