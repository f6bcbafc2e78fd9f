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
//! every client with it. A watchdog feed lost that way costs at most a watchdog period; a
//! state change (READY=1 is sent once) is handed to a thread that waits for room instead.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The manager's socket: a file, or `@name` in the abstract namespace.
fn address(path: &OsStr) -> io::Result<SocketAddr> {
    match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)
        }
        None => SocketAddr::from_pathname(path),
    }
}

/// Sends `message` (`KEY=value` lines) to the socket at `path` without blocking.
fn send(path: &OsStr, message: &str) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    sock.send_to_addr(message.as_bytes(), &address(path)?)
        .map(drop)
}

/// Sends to `NOTIFY_SOCKET`, if set. (The managed valkey-server child does not inherit it:
/// see `upstream::managed`.)
fn notify(message: &str) -> io::Result<()> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(path) => send(&path, message),
        None => Ok(()),
    }
}

/// A state change that must arrive (READY=1 is sent once, and the unit waits for it): sent
/// at once when the manager's queue has room, else by a thread that waits for room, so that
/// the event loop never does.
fn deliver(message: String) {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        deliver_to(path, message);
    }
}

fn deliver_to(path: std::ffi::OsString, message: String) {
    match send(&path, &message) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            std::thread::spawn(move || {
                let sent = UnixDatagram::unbound()
                    .and_then(|s| s.send_to_addr(message.as_bytes(), &address(&path)?));
                if let Err(e) = sent {
                    tracing::warn!("cannot notify the service manager: {e}");
                }
            });
        }
        Err(e) => tracing::warn!("cannot notify the service manager: {e}"),
    }
}

/// A free-form status line (`STATUS=`).
pub fn status(text: &str) {
    deliver(format!("STATUS={text}\n"));
}

/// Start-up is over: walrus serves clients.
pub fn ready(text: &str) {
    deliver(format!("READY=1\nSTATUS={text}\n"));
}

/// Shutting down (drain, then exit).
pub fn stopping(text: &str) {
    deliver(format!("STOPPING=1\nSTATUS={text}\n"));
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

    /// READY=1 goes once: to a manager whose queue is full it arrives when the manager reads.
    #[test]
    fn a_state_change_to_a_full_queue_arrives_once_the_manager_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).unwrap();
        while send(path.as_os_str(), "WATCHDOG=1\n").is_ok() {}
        super::deliver_to(path.clone().into_os_string(), "READY=1\n".into());
        let mut buf = [0u8; 64];
        manager
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        loop {
            let n = manager.recv(&mut buf).expect("READY=1 never arrived");
            if &buf[..n] == b"READY=1\n" {
                break;
            }
        }
    }
}
