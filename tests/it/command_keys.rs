//! walrus's key extraction (`src/commands/keys.rs`, from the key specs of Valkey's own
//! command table) against Valkey's `COMMAND GETKEYS`, for every command and subcommand of
//! the server under test. Arguments are generated per command from its arity and key specs
//! (filler, numbers where a key count may stand, the keywords its specs search for), many
//! times each, from one seed; wherever GETKEYS answers, walrus must find every key it
//! names (more is safe: a request then waits for more), or say it cannot know them
//! (`Keys::Unknown`: the request then counts as touching every key, the safe side) only
//! where a key spec is incomplete or unknown, or the command's keys move. GETKEYS runs a
//! command's key procedure, which accepts some arguments the command refuses: a key walrus
//! misses there counts only if Valkey runs the command (it is run on this test's own
//! server). Commands that GETKEYS never answers for any generated arguments are listed with
//! the reason.
use crate::common;
use common::*;

use bytes::Bytes;
use redis_protocol::resp2::types::OwnedFrame;
use std::collections::{BTreeMap, BTreeSet};
use walrus::commands::keys::{BeginSearch, FindKeys};
use walrus::commands::{Class, CommandInfo, CommandTable, Keys};

/// Argument lists tried per command.
const TRIES: usize = 40;

/// Commands GETKEYS answers for no argument list this test makes, and why.
// excused: begin
const UNANSWERED: &[(&str, &str)] = &[
    // None today: every command's key procedure or specs answer for some argument list.
];
// excused: end

/// Every entry of the table (subcommands as `container|sub`), with its info.
fn entries(table_frame: &OwnedFrame) -> Vec<(Vec<String>, OwnedFrame)> {
    let OwnedFrame::Array(all) = table_frame else {
        panic!("COMMAND: {table_frame:?}")
    };
    let mut out = Vec::new();
    for e in all {
        let OwnedFrame::Array(f) = e else { continue };
        let name = match &f[0] {
            OwnedFrame::BulkString(b) => String::from_utf8_lossy(b).to_lowercase(),
            _ => continue,
        };
        out.push((vec![name.clone()], e.clone()));
        if let Some(OwnedFrame::Array(subs)) = f.get(9) {
            for s in subs {
                let OwnedFrame::Array(sf) = s else { continue };
                if let OwnedFrame::BulkString(b) = &sf[0] {
                    let full = String::from_utf8_lossy(b).to_lowercase();
                    let sub = full
                        .split_once('|')
                        .map_or(full.clone(), |(_, s)| s.to_string());
                    out.push((vec![name.clone(), sub], s.clone()));
                }
            }
        }
    }
    // COMMAND lists them in the order of Valkey's hash table, whose seed differs every run:
    // sorted, a seed gives the same requests every time.
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// One argument list for `info`, called as `name` (one or two words), from `rng`.
fn arguments(rng: &mut Rng, name: &[String], info: &CommandInfo) -> Vec<Vec<u8>> {
    let min = info.arity.unsigned_abs() as usize;
    let n = if info.arity < 0 {
        min + rng.below(6) as usize
    } else {
        min
    };
    let keywords: Vec<Vec<u8>> = info
        .key_specs
        .iter()
        .filter_map(|s| match &s.begin {
            BeginSearch::Keyword { keyword, .. } => Some(keyword.clone()),
            _ => None,
        })
        .collect();
    let counts = info
        .key_specs
        .iter()
        .any(|s| matches!(s.find, FindKeys::Keynum { .. }));
    let mut args: Vec<Vec<u8>> = name.iter().map(|w| w.as_bytes().to_vec()).collect();
    while args.len() < n.max(name.len()) {
        let i = args.len();
        let a = match rng.below(10) {
            0..=2 if counts => (1 + rng.below(3)).to_string().into_bytes(),
            3 | 4 if !keywords.is_empty() => {
                keywords[rng.below(keywords.len() as u64) as usize].clone()
            }
            5 => b"0".to_vec(),
            _ => format!("a{i}").into_bytes(),
        };
        args.push(a);
    }
    args
}

fn getkeys(c: &mut Raw, args: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, String> {
    let mut full: Vec<&[u8]> = vec![b"COMMAND", b"GETKEYS"];
    full.extend(args.iter().map(Vec::as_slice));
    match decode(&c.cmd(&full)) {
        OwnedFrame::Array(keys) => Ok(keys
            .into_iter()
            .map(|k| match k {
                OwnedFrame::BulkString(b) => b,
                other => panic!("GETKEYS: {other:?}"),
            })
            .collect()),
        OwnedFrame::Error(e) => Err(e),
        other => panic!("GETKEYS: {other:?}"),
    }
}

#[test]
fn key_extraction_agrees_with_valkeys_command_getkeys() {
    let v = Valkey::start();
    let mut c = Raw::connect(&v.addr());
    let table_frame = decode(&c.cmd(&["COMMAND"]));
    let table = CommandTable::from_frame(&table_frame).expect("the table parses");
    let seed = std::env::var("WALRUS_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261203u64);
    let mut rng = Rng(seed | 1);
    let mut mismatches = BTreeMap::new();
    let mut extra = BTreeMap::new();
    let mut unanswered = BTreeSet::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, _) in entries(&table_frame) {
        let words: Vec<Bytes> = name.iter().map(|w| Bytes::from(w.clone())).collect();
        let info = table.lookup(&words).expect("in the table").clone();
        if !info.subcommands.is_empty() {
            // A container: its subcommands are tried apart.
            continue;
        }
        let mut answered = false;
        for _ in 0..TRIES {
            let args = arguments(&mut rng, &name, &info);
            let bytes: Vec<Bytes> = args.iter().map(|a| Bytes::from(a.clone())).collect();
            let ours = Class::of(table.lookup(&bytes), &bytes).keys;
            let theirs = match getkeys(&mut c, &args) {
                Ok(keys) => keys,
                Err(e) if e.contains("no key arguments") => Vec::new(),
                Err(_) => continue,
            };
            answered = true;
            *counts.entry("answered").or_default() += 1;
            let ours = match ours {
                Keys::Args(idx) => idx.iter().map(|&i| args[i].clone()).collect::<Vec<_>>(),
                Keys::Unknown => {
                    *counts.entry("unknown to walrus").or_default() += 1;
                    if !info.key_specs.iter().any(|s| {
                        s.incomplete
                            || s.begin == BeginSearch::Unknown
                            || s.find == FindKeys::Unknown
                    }) && !info.flags.movablekeys
                    {
                        let text = format!(
                            "{}: walrus cannot tell the keys of {}, GETKEYS says {}",
                            info.name,
                            show_args(&args),
                            show_args(&theirs)
                        );
                        mismatches.entry(info.name.clone()).or_insert(text);
                    }
                    continue;
                }
            };
            let (mut a, mut b) = (ours.clone(), theirs.clone());
            a.sort();
            b.sort();
            if a == b {
                continue;
            }
            let text = format!(
                "{}: for {} walrus finds {}, GETKEYS {}",
                info.name,
                show_args(&args),
                show_args(&ours),
                show_args(&theirs)
            );
            // A key walrus misses is a write it would not mark, or a read it would not hold;
            // an argument it takes for a key besides (a shard channel, whose spec says
            // `not_key`) only makes some request wait for more: safe, and shown.
            if b.iter().all(|k| a.contains(k)) {
                extra.entry(info.name.clone()).or_insert(text);
                continue;
            }
            // GETKEYS runs a command's key procedure, which reads arguments the command
            // itself refuses (GEORADIUS ... STORE before its radius, XREADGROUP without
            // GROUP): run it, on this test's own server, to see whether Valkey would.
            if c.cmd(&args).starts_with(b"-") {
                *counts
                    .entry("answered for arguments Valkey refuses")
                    .or_default() += 1;
                continue;
            }
            mismatches.entry(info.name.clone()).or_insert(text);
        }
        if !answered {
            unanswered.insert(info.name.clone());
        }
    }
    eprintln!("COMMAND GETKEYS: {counts:?}; never answered: {unanswered:?}");
    for e in extra.values() {
        eprintln!("walrus takes more for keys than GETKEYS (safe): {e}");
    }
    let listed: BTreeSet<String> = UNANSWERED.iter().map(|(n, _)| n.to_string()).collect();
    let unlisted: Vec<&String> = unanswered.difference(&listed).collect();
    assert!(
        mismatches.is_empty() && unlisted.is_empty(),
        "seed {seed}: keys walrus misses, per command (the first case of each):\n{}\ncommands \
         GETKEYS never answered that are not listed with a reason: {unlisted:?}",
        mismatches.values().cloned().collect::<Vec<_>>().join("\n")
    );
}

fn show_args(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
