//! `cargo +nightly fuzz run stream fuzz/seeds/stream` from the repository root. The checks are in
//! fuzz/harness/stream.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::stream::run(data));
