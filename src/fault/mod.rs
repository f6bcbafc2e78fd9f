//! Fault injection for tests. Each fault is read once from a `WALRUS_FAULT_*` environment
//! variable that a test sets on the walrus it starts, never from the configuration file.
//! Unset in production, where every check below costs the load of a `None`.
//!
//! - `WALRUS_FAULT_JOURNAL_WRITE_DELAY_MS=<ms>`: every journal write of the `sync` backend
//!   takes that much longer (a slow device).
//! - `WALRUS_FAULT_JOURNAL=<fault><trigger>`: one journal write of the `sync` backend fails.
//!   The trigger is `@<text>` (the first write whose data contains it) or `#<n>` (the n-th
//!   write, counted from 1). The fault is one of:
//!   - `write:<errno>`: the pwrite fails, and so does every later write (a dead device);
//!   - `fsync:<errno>`: the pwrite succeeds and the fdatasync fails. The written range then
//!     gets back what it held before, as if the page cache had dropped the unsynced data (a
//!     crash after a failed writeback, LazyFS's "lose unsynced data"). Every later write
//!     fails too;
//!   - `tear`: only the write's first bytes reach the file, up to the middle of its last
//!     block, and then the process aborts (a power cut in the middle of a write).
//! - `WALRUS_FAULT_JOURNAL_NO_SYNC=1`: journal writes are acknowledged without being made
//!   durable, by either backend: segments are opened without O_DSYNC and the `sync` backend
//!   skips its fdatasync. A SIGKILL loses nothing then (the page cache keeps the writes), a
//!   power loss does: the negative control of the power-loss tests (`tests/power_loss.rs`).
//! - `WALRUS_FAULT_CHECKPOINT=<errno>[@<path>]`: writing a checkpoint's RDB fails once its
//!   first 64 KiB are written.
//! - `WALRUS_FAULT_MANIFEST=<errno>[@<path>]`: writing a manifest (the journal's or the
//!   checkpoints') fails.
//!
//! - `WALRUS_FAULT_INIT_KILL=<n>`: the n-th step of a journal initialization (creating,
//!   filling, syncing or renaming a segment or the MANIFEST, syncing the directory; counted
//!   from 1) is replaced by a SIGKILL of the process: a pod killed during its first start.
//!
//! With `@<path>`, those two faults hold only while `<path>` exists: a test turns them on and
//! off at run time.
//!
//! `<errno>` is a name: ENOSPC, EIO, EINVAL (O_DIRECT's misalignment error), EROFS, EDQUOT.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

/// What a faulty journal write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalFault {
    Write(i32),
    Fsync(i32),
    Tear,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Trigger {
    Containing(Vec<u8>),
    Nth(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalPlan {
    fault: JournalFault,
    trigger: Trigger,
}

fn errno(name: &str) -> Result<i32, String> {
    Ok(match name {
        "ENOSPC" => libc::ENOSPC,
        "EIO" => libc::EIO,
        "EINVAL" => libc::EINVAL,
        "EROFS" => libc::EROFS,
        "EDQUOT" => libc::EDQUOT,
        _ => return Err(format!("unknown errno {name:?}")),
    })
}

impl JournalPlan {
    fn parse(text: &str) -> Result<JournalPlan, String> {
        let at = text
            .find(['@', '#'])
            .ok_or_else(|| format!("{text:?}: no trigger (@text or #n)"))?;
        let (fault, trigger) = text.split_at(at);
        let trigger = match trigger.split_at(1) {
            ("@", t) if !t.is_empty() => Trigger::Containing(t.as_bytes().to_vec()),
            (_, n) => Trigger::Nth(
                n.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{text:?}: bad write number"))?,
            ),
        };
        let fault = match fault.split_once(':') {
            Some(("write", e)) => JournalFault::Write(errno(e)?),
            Some(("fsync", e)) => JournalFault::Fsync(errno(e)?),
            None if fault == "tear" => JournalFault::Tear,
            _ => {
                return Err(format!(
                    "{text:?}: expected write:<errno>, fsync:<errno> or tear"
                ))
            }
        };
        Ok(JournalPlan { fault, trigger })
    }
}

fn from_env<T>(var: &str, parse: impl Fn(&str) -> Result<T, String>) -> Option<T> {
    let text = std::env::var(var).ok().filter(|t| !t.is_empty())?;
    match parse(&text) {
        Ok(v) => {
            tracing::warn!("fault injection: {var}={text}");
            Some(v)
        }
        // A test that sets a fault it misspelled must not pass by testing nothing.
        Err(e) => panic!("{var}: {e}"),
    }
}

static WRITE_DELAY: LazyLock<Option<Duration>> = LazyLock::new(|| {
    from_env("WALRUS_FAULT_JOURNAL_WRITE_DELAY_MS", |t| {
        t.parse()
            .map(Duration::from_millis)
            .map_err(|e| e.to_string())
    })
});
static NO_SYNC: LazyLock<Option<()>> = LazyLock::new(|| {
    from_env("WALRUS_FAULT_JOURNAL_NO_SYNC", |t| match t {
        "1" => Ok(()),
        _ => Err(format!("{t:?}: only 1 turns it on")),
    })
});
static JOURNAL: LazyLock<Option<JournalPlan>> =
    LazyLock::new(|| from_env("WALRUS_FAULT_JOURNAL", JournalPlan::parse));
/// A file-system fault: an errno, while a flag file exists (always without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsFault {
    errno: i32,
    while_exists: Option<std::path::PathBuf>,
}

impl FsFault {
    fn parse(text: &str) -> Result<FsFault, String> {
        let (e, path) = match text.split_once('@') {
            Some((e, p)) => (e, Some(std::path::PathBuf::from(p))),
            None => (text, None),
        };
        Ok(FsFault {
            errno: errno(e)?,
            while_exists: path,
        })
    }

    fn check(&self) -> io::Result<()> {
        match &self.while_exists {
            Some(p) if !p.exists() => Ok(()),
            _ => Err(io::Error::from_raw_os_error(self.errno)),
        }
    }
}

static CHECKPOINT: LazyLock<Option<FsFault>> =
    LazyLock::new(|| from_env("WALRUS_FAULT_CHECKPOINT", FsFault::parse));
static MANIFEST: LazyLock<Option<FsFault>> =
    LazyLock::new(|| from_env("WALRUS_FAULT_MANIFEST", FsFault::parse));

static INIT_KILL: LazyLock<Option<u64>> = LazyLock::new(|| {
    from_env("WALRUS_FAULT_INIT_KILL", |t| {
        t.parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{t:?}: bad step number"))
    })
});
static INIT_STEPS: AtomicU64 = AtomicU64::new(0);

static JOURNAL_WRITES: AtomicU64 = AtomicU64::new(0);
static JOURNAL_DEAD: AtomicBool = AtomicBool::new(false);

/// Delays a journal write when the test asked for a slow device.
pub fn journal_write_delay() {
    if let Some(d) = *WRITE_DELAY {
        std::thread::sleep(d);
    }
}

/// True when journal writes must not be made durable (`WALRUS_FAULT_JOURNAL_NO_SYNC`).
pub fn journal_no_sync() -> bool {
    NO_SYNC.is_some()
}

/// The fault, if any, for the journal write of `data` about to happen. Once a `write` or
/// `fsync` fault fired, every later write gets `write` with the same errno.
pub fn journal_write(data: &[u8]) -> Option<JournalFault> {
    let plan = JOURNAL.as_ref()?;
    let n = JOURNAL_WRITES.fetch_add(1, Ordering::SeqCst) + 1;
    if JOURNAL_DEAD.load(Ordering::SeqCst) {
        return Some(match plan.fault {
            JournalFault::Write(e) | JournalFault::Fsync(e) => JournalFault::Write(e),
            JournalFault::Tear => JournalFault::Tear,
        });
    }
    let hit = match &plan.trigger {
        Trigger::Nth(k) => n == *k,
        Trigger::Containing(t) => data.windows(t.len()).any(|w| w == t.as_slice()),
    };
    if hit {
        JOURNAL_DEAD.store(true, Ordering::SeqCst);
        return Some(plan.fault);
    }
    None
}

/// The error a checkpoint write gets once `written` bytes of its RDB are on disk.
pub fn checkpoint_write(written: u64) -> io::Result<()> {
    match &*CHECKPOINT {
        Some(f) if written >= 64 << 10 => f.check(),
        _ => Ok(()),
    }
}

/// Called before each step of a journal initialization: kills the process at the step the
/// test named, with SIGKILL, so that nothing (no destructor, no buffered write) runs after.
pub fn init_step() {
    let Some(kill_at) = *INIT_KILL else { return };
    if INIT_STEPS.fetch_add(1, Ordering::SeqCst) + 1 == kill_at {
        // SAFETY: signalling our own process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// The error a manifest write gets.
pub fn manifest_write() -> io::Result<()> {
    MANIFEST.as_ref().map_or(Ok(()), FsFault::check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse() {
        assert_eq!(
            JournalPlan::parse("write:ENOSPC@poison").unwrap(),
            JournalPlan {
                fault: JournalFault::Write(libc::ENOSPC),
                trigger: Trigger::Containing(b"poison".to_vec())
            }
        );
        assert_eq!(
            JournalPlan::parse("fsync:EIO#3").unwrap(),
            JournalPlan {
                fault: JournalFault::Fsync(libc::EIO),
                trigger: Trigger::Nth(3)
            }
        );
        assert_eq!(
            JournalPlan::parse("tear@x").unwrap().fault,
            JournalFault::Tear
        );
        assert_eq!(
            FsFault::parse("ENOSPC@/x").unwrap(),
            FsFault {
                errno: libc::ENOSPC,
                while_exists: Some("/x".into())
            }
        );
        assert!(FsFault::parse("ENOSPC").unwrap().check().is_err());
        assert!(FsFault::parse("EIO@/nonexistent/flag")
            .unwrap()
            .check()
            .is_ok());
        for bad in [
            "write:ENOSPC",
            "write:EFOO@x",
            "fsync:EIO#0",
            "burn@x",
            "tear@",
        ] {
            assert!(JournalPlan::parse(bad).is_err(), "{bad}");
        }
    }
}
