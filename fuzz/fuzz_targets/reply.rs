//! `cargo +nightly fuzz run reply fuzz/seeds/reply` from the repository root. The checks are in
//! fuzz/harness/reply.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::reply::run(data));
