//! `cargo +nightly fuzz run journal_manifest fuzz/seeds/journal_manifest` from the repository root. The checks are in
//! fuzz/harness/journal_manifest.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::journal_manifest::run(data));
