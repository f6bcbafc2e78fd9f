//! `cargo +nightly fuzz run rdb fuzz/seeds/rdb` from the repository root. The checks are in
//! fuzz/harness/rdb.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::rdb::run(data));
