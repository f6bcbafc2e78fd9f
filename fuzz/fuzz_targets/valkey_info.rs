//! `cargo +nightly fuzz run valkey_info fuzz/seeds/valkey_info` from the repository root. The checks are in
//! fuzz/harness/valkey_info.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::valkey_info::run(data));
