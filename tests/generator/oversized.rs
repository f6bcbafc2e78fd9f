//! One client's reply over walrus's limits costs that client alone (not in cluster mode).
//! A client sends a script whose reply is nested deeper than `proxy.max_reply_depth` (128)
//! or is larger than `proxy.max_reply_bytes` (8 MiB for the generator's walruses:
//! `system.rs`), after keeping Valkey busy for some 10 ms; right behind it another client
//! of the same user and protocol sends a few writes and reads. Both go through the one
//! pooled connection of that user and protocol (`upstream.pool_size` is 1), where the
//! other's requests wait behind the script. The script's client must get an error naming
//! the limit; the other its real replies: walrus skips the refused reply as it arrives and
//! the connection serves on, so `connection to Valkey lost` for them, with no fault
//! between, is a violation.

use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd, Conn, Reply, Wait, HANG_BOUND};
use crate::shared::Ctx;
use std::time::Instant;

/// Spins through ARGV[1] empty loops (a script sees one time, its start's: `TIME` cannot
/// time it), then returns a table nested 200 deep (ARGV[2] `deep`) or a string of ARGV[2]
/// bytes.
const SCRIPT: &str = "for i = 1, tonumber(ARGV[1]) do end \
     if ARGV[2] == 'deep' then local r = 1 for i = 1, 200 do r = {r} end return r end \
     return string.rep('x', tonumber(ARGV[2]))";

/// Loops that keep Valkey busy for some 10 ms before the script answers.
const SPIN: u64 = 1_000_000;

/// `proxy.max_reply_bytes` of the generator's walruses; the script's large reply exceeds it.
pub const MAX_REPLY_BYTES: usize = 8 << 20;

/// The key the other client writes and reads (nobody else does).
const KEY: &str = "{gen}:oversized";

/// Reads `n` replies on `conn`, reporting a hang (as `Conn::call` does) for a reply that
/// does not come within `HANG_BOUND`.
fn replies(ctx: &Ctx, conn: &mut Conn, cmds: &[Cmd]) -> Vec<Reply> {
    let deadline = Instant::now() + HANG_BOUND;
    let mut out = Vec::with_capacity(cmds.len());
    for c in cmds {
        match conn.reply(deadline) {
            Ok(r) => out.push(r),
            Err(Wait::TimedOut) => {
                ctx.h().violation(format!(
                    "hang: no reply to `{}` within {HANG_BOUND:?}",
                    describe(c)
                ));
                break;
            }
            Err(Wait::Closed) => break,
        }
    }
    out.resize_with(cmds.len(), || Reply::Lost);
    out
}

/// One round: the refused reply, and the other client's requests behind it.
pub fn round(ctx: &Ctx, rng: &mut Rng) -> bool {
    let resp3 = rng.below(2) == 0;
    let addr = ctx.target.get();
    let (Some(mut refused), Some(mut other)) =
        (Conn::connect_as(&addr, resp3), Conn::connect_as(&addr, resp3))
    else {
        return false;
    };
    let (size, limit) = if rng.below(4) == 0 {
        ((MAX_REPLY_BYTES + (1 << 20)).to_string(), "max_reply_bytes")
    } else {
        ("deep".to_string(), "max_reply_depth")
    };
    let script = cmd(&["EVAL_RO", SCRIPT, "0", &SPIN.to_string(), &size]);
    // A new client's first requests go at once (its window is 4).
    let behind = [
        cmd(&["INCR", KEY]),
        cmd(&["GET", KEY]),
        cmd(&["INCR", KEY]),
        cmd(&["GET", KEY]),
    ];
    let before = {
        let mut h = ctx.h();
        h.count(&format!("op: a reply over {limit}, another client behind it"));
        h.seen()
    };
    if refused.send(std::slice::from_ref(&script)).is_err() || other.send(&behind).is_err() {
        return false;
    }
    let mine = replies(ctx, &mut refused, std::slice::from_ref(&script)).remove(0);
    let theirs = replies(ctx, &mut other, &behind);
    let mut h = ctx.h();
    let quiet = crate::release::Release::quiet_between(&before, &h.seen());
    let mut clean = true;
    match mine {
        Reply::Error(e) if e.contains(limit) => h.count("check: a reply over a limit refused"),
        Reply::Error(e) => {
            h.error("EVAL_RO (a reply over a limit)", &e);
            clean = false;
        }
        Reply::Frame(_) => h.violation(format!(
            "reply over a limit passed: `EVAL_RO` of a reply over proxy.{limit} was answered"
        )),
        Reply::Lost => clean = false,
    }
    for (c, reply) in behind.iter().zip(theirs) {
        match reply {
            Reply::Frame(_) => h.count("check: a reply behind one over a limit"),
            Reply::Error(e) if quiet && e.contains("connection to Valkey lost") => {
                h.violation(format!(
                    "another client's reply lost: `{}` got -{e}, behind a reply over \
                     proxy.{limit} to another client of the same user, with no fault between",
                    describe(c)
                ));
            }
            Reply::Error(e) => {
                h.error(&describe(c), &e);
                clean = false;
            }
            Reply::Lost => clean = false,
        }
    }
    clean
}
