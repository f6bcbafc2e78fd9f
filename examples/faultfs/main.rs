//! faultfs: a FUSE passthrough that models a disk with a volatile write cache, and the
//! faults of one (power loss, torn and reordered writes, errors, latency, stalls), for
//! walrus's crash tests. docs/faultfs.md describes the model and the control commands.
//!
//!   faultfs <backing-dir> <mountpoint> --control <unix-socket-path>
//!
//! Prints "faultfs ready <mountpoint>" once mounted; unmounts on SIGTERM or SIGINT.
//!
//! Modules, one concept each: cache (pending writes), names (name operations not yet
//! durable), crash (what survives), faults (errors, latency), sched (deferred replies),
//! inodes and handles (the mount's numbers), state (the shared state and its lock), meta
//! (namespace and attributes), data (file data and the model), fs (the fuser glue),
//! control (the socket).

mod cache;
mod control;
mod crash;
mod data;
mod faults;
mod fs;
mod handles;
mod inodes;
mod meta;
mod names;
mod sched;
mod state;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use fuser::{Config, MountOption, Session};

const USAGE: &str = "usage: faultfs <backing-dir> <mountpoint> --control <unix-socket-path>";

fn main() {
    if let Err(e) = run() {
        eprintln!("faultfs: {e}");
        std::process::exit(1);
    }
}

fn args() -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let mut positional = Vec::new();
    let mut control = None;
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        if a == "--control" {
            control = Some(PathBuf::from(it.next().ok_or(USAGE)?));
        } else if a == "-h" || a == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        } else {
            positional.push(PathBuf::from(a));
        }
    }
    match (positional.as_slice(), control) {
        ([backing, mountpoint], Some(control)) => {
            Ok((backing.clone(), mountpoint.clone(), control))
        }
        _ => Err(USAGE.into()),
    }
}

/// Why the main thread wakes up.
enum Event {
    Signal,
    SessionEnded(std::io::Result<()>),
}

fn run() -> Result<(), String> {
    let (backing, mountpoint, control_path) = args()?;
    // Modes come from callers, with their umask applied by the kernel: none of ours.
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0) };
    // Before any thread starts, so that every thread inherits the mask and only the
    // signal thread below receives SIGTERM/SIGINT.
    let signals = block_signals();

    let backing = backing
        .canonicalize()
        .map_err(|e| format!("{}: {e}", backing.display()))?;
    let m = std::fs::metadata(&backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    if !m.is_dir() {
        return Err(format!("{} is not a directory", backing.display()));
    }
    let sh = state::Shared::new(backing.clone(), (m.dev(), m.ino()))
        .map_err(|e| format!("{}: {e}", backing.join(names::GRAVE).display()))?;
    let listener = control::bind(&control_path)
        .map_err(|e| format!("control socket {}: {e}", control_path.display()))?;

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("faultfs".into()),
        MountOption::Subtype("faultfs".into()),
        // The kernel checks permissions from the modes, as a local file system would.
        MountOption::DefaultPermissions,
    ];
    let fs = fs::FaultFs { sh: sh.clone() };
    let mut session = Session::new(fs, &mountpoint, &config)
        .map_err(|e| format!("mounting at {}: {e}", mountpoint.display()))?;
    let mut unmounter = session.unmount_callable();

    let (tx, rx) = mpsc::channel();
    let ended = tx.clone();
    std::thread::Builder::new()
        .name("faultfs-session".into())
        .spawn(move || {
            let _ = ended.send(Event::SessionEnded(session.run()));
        })
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("faultfs-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: waits for one of the blocked signals of a set we own.
            while unsafe { libc::sigwait(&signals, &mut sig) } != 0 {}
            let _ = tx.send(Event::Signal);
        })
        .map_err(|e| e.to_string())?;
    control::serve(listener, sh.clone());
    println!("faultfs ready {}", mountpoint.display());

    let result = match rx.recv() {
        Ok(Event::Signal) => {
            unmount(&mut unmounter, &mountpoint);
            // The session loop ends when the kernel closes the connection; after a lazy
            // unmount that waits for the last open file, so do not wait long.
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(Event::SessionEnded(r)) => r.map_err(|e| e.to_string()),
                _ => Ok(()),
            }
        }
        Ok(Event::SessionEnded(r)) => r.map_err(|e| e.to_string()),
        Err(_) => Ok(()),
    };
    let _ = std::fs::remove_file(&control_path);
    result
}

/// Unmounts; when files are still open in the mount (EBUSY), detaches it instead: the
/// mount point is free at once and the open files fail once this process exits.
fn unmount(unmounter: &mut fuser::SessionUnmounter, mountpoint: &std::path::Path) {
    if let Err(e) = unmounter.unmount() {
        eprintln!("faultfs: unmount: {e}; detaching lazily");
        if let Ok(c) = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes()) {
            // SAFETY: a valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Blocks SIGTERM and SIGINT in this thread (and the threads it starts); returns the set
/// for sigwait.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a zeroed set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}
