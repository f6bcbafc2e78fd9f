//! A client that sends its whole pipeline before it reads a reply, as redis-py's
//! `Pipeline.execute()` and bulk loaders do (not in cluster mode): 30,000 to 40,000 reads
//! of a value of its own, under a long key, written in one go (13 to 17 MB of requests,
//! 18 to 24 MB of replies: more than the sockets between it and walrus hold, both ways),
//! then every reply read. walrus must read on while the replies pile up: a send it takes
//! none of for `STALL_BOUND` (10 s), or not all of within `HANG_BOUND`, is a hang, and every reply
//! must come, the value or an error a fault explains.

use crate::common::Rng;
use crate::conn::{cmd, Conn, Reply, Wait, HANG_BOUND};
use crate::shared::Ctx;
use redis_protocol::resp2::types::OwnedFrame;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long walrus may take none of a pipeline it is sent: reads of a key no one else
/// writes wait for nothing but Valkey, whose every wait walrus bounds, so the bound of a
/// frozen Valkey's requests. Much shorter than `HANG_BOUND`, so that a stall shows between
/// the faults that restart walrus (one every few seconds), which end it.
const STALL_BOUND: Duration = crate::freeze::FREEZE_BOUND;

/// Bytes of the key and of the value each read carries and returns.
const KEY_BYTES: usize = 400;
const VALUE_BYTES: usize = 600;

/// Sends a whole pipeline every 3 to 8 s, on a new connection (RESP2 or RESP3) each time;
/// again at once after one a fault cut short.
pub fn pipelines(ctx: Arc<Ctx>, seed: u64) {
    let mut rng = Rng(seed);
    let key = format!("{{gen}}:bulk:{}", "k".repeat(KEY_BYTES));
    let mut round = 0u64;
    // Pacing of the workload (not synchronization): a few pipelines per mode, retried
    // sooner while walrus restarts.
    let mut pause = Duration::from_millis(500 + rng.below(1500));
    while !ctx.stopping() {
        std::thread::sleep(pause);
        pause = Duration::from_millis(200);
        round += 1;
        let Some(mut conn) = Conn::connect_as(&ctx.target.get(), rng.below(2) == 0) else {
            continue;
        };
        let value = format!("{round:0>width$}", width = VALUE_BYTES);
        let set = cmd(&["SET", &key, &value]);
        if !matches!(conn.call(&ctx, &[set]).remove(0), Reply::Frame(_)) {
            continue;
        }
        let n = 30_000 + rng.below(10_000) as usize;
        if whole(&ctx, &mut conn, &key, &value, n) {
            pause = Duration::from_millis(3000 + rng.below(5000));
        }
    }
}

/// `n` GETs of `key` sent in one write, then their replies, each `value`. Returns whether
/// every reply came (`false`: a fault cut it short, or a violation).
fn whole(ctx: &Ctx, conn: &mut Conn, key: &str, value: &str, n: usize) -> bool {
    ctx.h().count("op: a whole pipeline before any reply is read");
    let get = cmd(&["GET", key]);
    match conn.send_within(&vec![get; n], STALL_BOUND) {
        Ok(()) => {}
        Err(Wait::TimedOut) => {
            ctx.h().violation(format!(
                "hang: walrus stopped reading a pipeline of {n} GETs sent whole before any \
                 reply is read (none of it taken for {STALL_BOUND:?}, or not all of it within \
                 {HANG_BOUND:?})"
            ));
            return false;
        }
        Err(Wait::Closed) => return false,
    }
    for i in 0..n {
        let reply = match conn.reply(Instant::now() + HANG_BOUND) {
            Ok(r) => r,
            Err(Wait::TimedOut) => {
                ctx.h().violation(format!(
                    "hang: reply {i} of a pipeline of {n} GETs sent whole did not come within \
                     {HANG_BOUND:?}"
                ));
                return false;
            }
            Err(Wait::Closed) => return false,
        };
        match reply {
            Reply::Frame(OwnedFrame::BulkString(v)) if v == value.as_bytes() => {}
            Reply::Error(e) => {
                // What a fault explains ends the pipeline's checks: its client gives up.
                ctx.h().error("GET (a whole pipeline)", &e);
                return false;
            }
            other => {
                ctx.h()
                    .unexpected(&format!("GET {i} of a whole pipeline"), &other);
                return false;
            }
        }
    }
    ctx.h().count("check: a whole pipeline served");
    true
}
