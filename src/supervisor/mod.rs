//! What walrus tells the service manager that runs it: systemd's notify protocol
//! (`Type=notify`, deploy/systemd/walrus.service). `READY=1` only once clients are served,
//! that is after any restore; `STATUS=` lines while it starts and restores, so that
//! `systemctl status walrus` says what it is waiting for; `STOPPING=1` on SIGTERM; and
//! `WATCHDOG=1`, when the unit sets `WatchdogSec=`, from a task on walrus's own event loop,
//! so that a loop that stops turning (a deadlock, a blocked worker) gets walrus restarted.
//!
//! Without `NOTIFY_SOCKET` in the environment (not under systemd) every call does nothing.
//! A failure to notify is logged, never fatal: the service manager's own timeout decides.

use sd_notify::NotifyState;
use std::time::Duration;

fn notify(states: &[NotifyState]) {
    // `false`: keep NOTIFY_SOCKET set, later states go to the same socket. (The managed
    // valkey-server child does not inherit it: see `upstream::managed`.)
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// A free-form status line (`STATUS=`).
pub fn status(text: &str) {
    notify(&[NotifyState::Status(text)]);
}

/// Start-up is over: walrus serves clients.
pub fn ready(text: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(text)]);
}

/// Shutting down (drain, then exit).
pub fn stopping(text: &str) {
    notify(&[NotifyState::Stopping, NotifyState::Status(text)]);
}

/// How often the service manager wants to hear `WATCHDOG=1` (`WatchdogSec=`), if at all: as
/// sd_watchdog_enabled(3) reads it, `WATCHDOG_USEC`, for this process when `WATCHDOG_PID`
/// is set and names another. (sd-notify's own reading insists on `WATCHDOG_PID`, which a
/// supervisor that is not systemd may leave out.)
pub fn watchdog_interval() -> Option<Duration> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if var("WATCHDOG_PID").is_some_and(|pid| pid != u64::from(std::process::id())) {
        return None;
    }
    var("WATCHDOG_USEC")
        .filter(|&usec| usec > 0)
        .map(Duration::from_micros)
}

/// Feeds the watchdog.
pub fn watchdog() {
    notify(&[NotifyState::Watchdog]);
}
