//! `cargo +nightly fuzz run checkpoint_manifest fuzz/seeds/checkpoint_manifest` from the repository root. The checks are in
//! fuzz/harness/checkpoint_manifest.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::checkpoint_manifest::run(data));
