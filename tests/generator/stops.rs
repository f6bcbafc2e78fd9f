//! Stops that are not crashes: a graceful SIGTERM of walrus (it must exit, with status 0,
//! within its `proxy.shutdown_timeout_ms` and some slack; what it acknowledged stays), and a
//! second walrus started on the running one's data directory by mistake (a person beside
//! the service, two pods on one volume): the second must exit without serving, and the
//! first must keep serving, its way to Valkey intact: its upstream connections are broken
//! after the second is gone, so that it has to open new ones.

use crate::common::{LISTENING, START_TIMEOUT};
use crate::faults::relaunch;
use crate::shared::Ctx;
use crate::system::System;
use std::time::{Duration, Instant};

/// `proxy.shutdown_timeout_ms` (10 s, the default), and slack.
const STOP_BOUND: Duration = Duration::from_secs(20);

/// How long the first walrus may take to write again once the second is gone.
const SERVE_AGAIN: Duration = Duration::from_secs(20);

pub fn sigterm(sys: &mut System, ctx: &Ctx) -> Result<String, String> {
    match sys.stop_walrus(STOP_BOUND) {
        None => ctx.h().violation(format!(
            "hang: walrus did not exit within {STOP_BOUND:?} of a SIGTERM"
        )),
        Some(status) if !status.success() => ctx.h().violation(format!(
            "unclean stop: walrus exited with {status} on SIGTERM"
        )),
        Some(_) => {}
    }
    relaunch(sys, ctx)?;
    Ok("Sigterm".into())
}

pub fn second_walrus(sys: &mut System, ctx: &Ctx) -> Result<String, String> {
    let (mut second, _config) = sys.spawn_second();
    let status = second.wait_exit(START_TIMEOUT);
    let log = second.log_text();
    let mut h = ctx.h();
    match status {
        None => {
            h.violation(format!(
                "second walrus: one started on a running walrus's data directory did not exit \
                 within {START_TIMEOUT:?}"
            ));
            second.signal(libc::SIGKILL);
            second.wait_exit(Duration::from_secs(10));
        }
        Some(s) if s.success() => h.violation(
            "second walrus: one started on a running walrus's data directory exited with \
             status 0"
                .into(),
        ),
        Some(_) => {}
    }
    if log.contains(LISTENING) {
        h.violation(
            "second walrus: one started on a running walrus's data directory listened".into(),
        );
    }
    drop(h);
    sys.keep_log("second-walrus", log);
    // The first must reach its Valkey again: its connections broken, it opens new ones.
    if !sys.drop_connections("normal") {
        ctx.h().violation(
            "second walrus: after it, the first walrus's Valkey cannot be reached (its socket \
             is gone)"
                .into(),
        );
    }
    let deadline = Instant::now() + SERVE_AGAIN;
    let mut last = String::new();
    while Instant::now() < deadline {
        match sys.try_write() {
            Ok(()) => return Ok("SecondWalrus".into()),
            Err(e) => last = e,
        }
        // Retry pacing while walrus reconnects.
        std::thread::sleep(Duration::from_millis(100));
    }
    ctx.h().violation(format!(
        "second walrus: after it, the first walrus took no write within {SERVE_AGAIN:?}; last: \
         {last}"
    ));
    // Back to a walrus that serves, for the rest of the run.
    sys.kill_walrus();
    relaunch(sys, ctx)?;
    Ok("SecondWalrus".into())
}
