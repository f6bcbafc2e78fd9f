//! The checks behind every fuzz target, shared by the fuzzer (`fuzz/fuzz_targets/<name>.rs`)
//! and by `cargo test` on stable (`tests/it/fuzz_seeds.rs` replays the committed seeds and
//! regressions through [`TARGETS`]; `tests/it/parser_props.rs` drives the same checks with
//! generated input). A check panics when an invariant breaks, which is what libFuzzer and
//! the tests report; bad input alone must never make it panic.
//!
//! An input is raw bytes: its first bytes choose the parameters (limits, where the input is
//! cut into reads, ...; see each module), the rest is what the parser reads. docs/fuzzing.md
//! says what each target checks and how to run it.

// Each fuzz target uses one module; the test files use them all.
#![allow(dead_code)]

pub mod checkpoint_manifest;
pub mod command_table;
pub mod config;
pub mod journal_manifest;
pub mod lua_script;
pub mod rdb;
pub mod record;
pub mod reply;
pub mod request;
pub mod stream;
pub mod valkey_info;

use std::ops::Range;

/// A target's check: panics when an invariant breaks.
pub type Check = fn(&[u8]);

/// Every target: its name (`fuzz/fuzz_targets/<name>.rs`, `fuzz/seeds/<name>/`) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("checkpoint_manifest", checkpoint_manifest::run),
    ("command_table", command_table::run),
    ("config", config::run),
    ("journal_manifest", journal_manifest::run),
    ("lua_script", lua_script::run),
    ("rdb", rdb::run),
    ("record", record::run),
    ("recovery", walrus::journal::sim::fuzz_recovery),
    ("reply", reply::run),
    ("request", request::run),
    ("stream", stream::run),
    ("valkey_info", valkey_info::run),
];

/// Reads parameters off the front of a fuzz input; an exhausted input reads as zeros.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// What is left: the bytes the parser reads.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// How `len` bytes arrive in reads, from one byte of the input: 0 is a single read, other
/// values seed a generator of reads from 1 byte up to a few hundred, small ones most often
/// (a cut in every header and across every CRLF).
pub fn reads(len: usize, seed: u8) -> Vec<Range<usize>> {
    if seed == 0 {
        return std::iter::once(0..len).collect();
    }
    // xorshift64*: deterministic, so a crash input replays the same reads.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(seed);
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let r = next();
        // Sizes 1..=2^k with k in 0..9: a read of one byte as likely as one of 200.
        let size = 1 + (r >> 8) as usize % (1usize << (r % 9));
        let end = (at + size).min(len);
        out.push(at..end);
        at = end;
    }
    out
}

/// All `len` bytes in one read.
pub fn at_once(len: usize) -> Vec<Range<usize>> {
    reads(len, 0)
}

/// The input as UTF-8 text, lossily (configs and manifests are read as text; invalid
/// UTF-8 is refused before any parser of walrus sees it).
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}
