//! A frozen Valkey: SIGSTOP, a while, SIGCONT (a stalled VM, a partitioned external
//! Valkey). walrus gives up a connection that owes replies and hears nothing for
//! `upstream.reply_timeout_ms` (`node::REPLY_TIMEOUT_MS` here): every request sent while
//! Valkey is frozen gets an answer, an error, within `FREEZE_BOUND`, not when Valkey comes
//! back. The freeze lasts longer than that bound, so that a request walrus forgot to bound
//! is seen waiting (`Ctx::freeze_hang`, checked by every request of `conn.rs`).

use crate::common::Rng;
use crate::conn::{cmd, Conn};
use crate::faults::recover;
use crate::node::REPLY_TIMEOUT_MS;
use crate::shared::Ctx;
use crate::system::System;
use std::time::{Duration, Instant};

/// How long a request sent to a frozen Valkey may wait for its error: the reply timeout
/// twice for the request's own connection (walrus gives up a connection silent for two of
/// its ticks) and twice more for one opened for it (a transaction's dedicated connection,
/// say), and slack.
pub const FREEZE_BOUND: Duration = Duration::from_millis(4 * REPLY_TIMEOUT_MS + 2000);

/// The first commands of the sessions that start while Valkey is frozen.
const FIRSTS: &[&[&str]] = &[
    &["MULTI"],
    &["WATCH", "{gen}:l0"],
    &["SUBSCRIBE", "{gen}:chan"],
    &["AUTH", "default", "nopass"],
];

/// Freezes Valkey for longer than `FREEZE_BOUND`, then lets it go on; returns once walrus
/// serves again.
pub fn freeze(sys: &mut System, ctx: &Ctx, rng: &mut Rng) -> Result<String, String> {
    let Some(pid) = sys.valkey_pid() else {
        return Ok("FreezeValkey skipped (walrus was restarting it)".into());
    };
    let length = FREEZE_BOUND + Duration::from_millis(1500 + rng.below(1500));
    ctx.freeze(Some(Instant::now()));
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Sessions that start now: the first command of each that needs a connection of its
    // own (MULTI, WATCH, SUBSCRIBE), or AUTH, must be answered in time too.
    let addr = sys.addr();
    std::thread::scope(|s| {
        for first in FIRSTS {
            let (addr, ctx) = (&addr, &*ctx);
            s.spawn(move || {
                if let Some(mut c) = Conn::connect(addr) {
                    ctx.h()
                        .count(&format!("op: {} while Valkey is frozen", first[0]));
                    c.call(ctx, &[cmd(first)]);
                }
            });
        }
        // The freeze itself (fault pacing, not synchronization).
        std::thread::sleep(length);
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    ctx.freeze(None);
    recover(sys, ctx)?;
    Ok(format!("FreezeValkey ({} ms)", length.as_millis()))
}
