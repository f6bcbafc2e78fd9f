//! `cargo +nightly fuzz run command_table fuzz/seeds/command_table` from the repository root. The checks are in
//! fuzz/harness/command_table.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::command_table::run(data));
