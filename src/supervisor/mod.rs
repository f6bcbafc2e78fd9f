//! What walrus tells the service manager that runs it: systemd's notify protocol
//! (`Type=notify`, deploy/systemd/walrus.service). `READY=1` only once clients are served,
//! that is after any restore; `STATUS=` lines while it starts and restores, so that
//! `systemctl status walrus` says what it is waiting for; `STOPPING=1` on SIGTERM.
//!
//! Without `NOTIFY_SOCKET` in the environment (not under systemd) every call does nothing.
//! A failure to notify is logged, never fatal: the service manager's own timeout decides.

use sd_notify::NotifyState;

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
