//! `cargo +nightly fuzz run record fuzz/seeds/record` from the repository root. The checks are in
//! fuzz/harness/record.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::record::run(data));
