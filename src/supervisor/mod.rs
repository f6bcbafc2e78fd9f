//! What walrus tells the service manager that runs it: systemd's notify protocol
//! (`Type=notify`, deploy/systemd/walrus.service). `READY=1` only once clients are served,
//! that is after any restore; `STATUS=` lines while it starts and restores, so that
//! `systemctl status walrus` says what it is waiting for; `STOPPING=1` on SIGTERM; and
//! `WATCHDOG=1`, when the unit sets `WatchdogSec=`, from a task on walrus's own event loop,
//! so that a loop that stops turning (a deadlock, a blocked worker) gets walrus restarted.
//!
//! Without `NOTIFY_SOCKET` in the environment (not under systemd) every call does nothing.
//! A failure to notify is logged, never fatal: the service manager's own timeout decides.
//!
//! The datagram is sent without blocking, by hand rather than with the sd-notify crate, whose
//! send blocks: walrus notifies from tasks on its event loop, and a manager that does not
//! read its socket (busy, re-executing) would fill the socket's queue and stall the loop,
//! every client with it. A notification lost that way costs at most a watchdog period.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Sends `message` (`KEY=value` lines) to the socket at `path` (a file, or `@name` in the
/// abstract namespace) without blocking.
fn send(path: &OsStr, message: &str) -> io::Result<()> {
    let addr = match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        None => SocketAddr::from_pathname(path)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    sock.send_to_addr(message.as_bytes(), &addr).map(drop)
}

/// Sends to `NOTIFY_SOCKET`, if set. (The managed valkey-server child does not inherit it:
/// see `upstream::managed`.)
fn notify(message: &str) -> io::Result<()> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(path) => send(&path, message),
        None => Ok(()),
    }
}

fn notify_or_warn(message: &str) {
    if let Err(e) = notify(message) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// A free-form status line (`STATUS=`).
pub fn status(text: &str) {
    notify_or_warn(&format!("STATUS={text}\n"));
}

/// Start-up is over: walrus serves clients.
pub fn ready(text: &str) {
    notify_or_warn(&format!("READY=1\nSTATUS={text}\n"));
}

/// Shutting down (drain, then exit).
pub fn stopping(text: &str) {
    notify_or_warn(&format!("STOPPING=1\nSTATUS={text}\n"));
}

/// How often the service manager wants to hear `WATCHDOG=1` (`WatchdogSec=`), if at all, read
/// as sd_watchdog_enabled(3) reads it: `WATCHDOG_USEC`, unless `WATCHDOG_PID` names another
/// process (a supervisor that is not systemd may leave `WATCHDOG_PID` out).
pub fn watchdog_interval() -> Option<Duration> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if var("WATCHDOG_PID").is_some_and(|pid| pid != u64::from(std::process::id())) {
        return None;
    }
    var("WATCHDOG_USEC")
        .filter(|&usec| usec > 0)
        .map(Duration::from_micros)
}

/// Feeds the watchdog. A failure is logged once, not at every feed, until one succeeds.
pub fn watchdog() {
    static FAILING: AtomicBool = AtomicBool::new(false);
    match notify("WATCHDOG=1\n") {
        Ok(()) => FAILING.store(false, Ordering::Relaxed),
        Err(e) => {
            if !FAILING.swap(true, Ordering::Relaxed) {
                tracing::warn!("cannot feed the service manager's watchdog: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::send;
    use std::os::unix::net::UnixDatagram;

    /// A manager that does not read: its queue fills, and every send after that fails at
    /// once instead of blocking walrus's event loop.
    #[test]
    fn a_manager_that_does_not_read_never_blocks_a_notification() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).unwrap();
        let (done_tx, done) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let refused = (0..10_000)
                .filter(|_| send(p.as_os_str(), "WATCHDOG=1\n").is_err())
                .count();
            done_tx.send(refused).unwrap();
        });
        let refused = done
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("a notification blocked");
        assert!(refused > 0, "the queue never filled");
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1\n");
        // The abstract namespace (`@name`), which systemd uses too.
        let name = format!("walrus-test-{}", std::process::id());
        let abstract_manager = {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
            UnixDatagram::bind_addr(&addr).unwrap()
        };
        send(std::ffi::OsStr::new(&format!("@{name}")), "READY=1\n").unwrap();
        let n = abstract_manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\n");
    }
}
