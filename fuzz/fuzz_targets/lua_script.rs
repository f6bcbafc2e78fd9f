//! `cargo +nightly fuzz run lua_script fuzz/seeds/lua_script` from the repository root. The checks are in
//! fuzz/harness/lua_script.rs, which `cargo test` runs too (tests/it/fuzz_seeds.rs).
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::lua_script::run(data));
