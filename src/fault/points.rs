//! The fail points ([`POINTS`]: every name, what it means), their configuration from
//! `FAILPOINTS`, and what their actions do. Compiled only with the `failpoints` feature.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::FaultError;

/// What a point takes as `return(<arg>)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `return(kill)`: a SIGKILL of the process.
    Crash,
    /// `return(kill)`, or `return(<errno>[@<path>])`: the operation fails.
    Io,
    /// `return(<fault><trigger>)`: a journal write fails ([`JournalPlan`]).
    JournalWrite,
    /// `return`: the switch is on.
    Switch,
    /// Takes `sleep(<ms>)` (no `return`): the thread that reaches it waits there.
    Stall,
}

/// A fail point: its name, what its `return` takes, and where it is.
#[derive(Debug)]
pub struct Point {
    pub name: &'static str,
    pub kind: Kind,
    pub means: &'static str,
}

const fn point(name: &'static str, kind: Kind, means: &'static str) -> Point {
    Point { name, kind, means }
}

/// Every fail point. A crash point's meaning is the state the process is killed in.
pub const POINTS: &[Point] = &[
    point(
        "journal::write",
        Kind::JournalWrite,
        "each journal write of the `sync` backend: `sleep(<ms>)` makes it that much slower (a \
         slow device); `return(<fault><trigger>)` makes one write fail, and every later one: \
         `write:<errno>` (the pwrite fails), `fsync:<errno>` (the data reaches the file, its \
         sync fails, and the range gets back what it held, as after a crash that lost the \
         unsynced pages) or `tear` (only the write's first bytes reach the file, up to the \
         middle of its last block, then the process aborts: a power cut in a write); the \
         trigger is `@<text>` (the first write whose data contains it) or `#<n>` (the n-th)",
    ),
    point(
        "journal::no_sync",
        Kind::Switch,
        "`return`: journal writes are acknowledged without being made durable, by either \
         backend (segments opened without O_DSYNC): the negative control of the power-loss \
         tests",
    ),
    point(
        "stop::drain",
        Kind::Stall,
        "SIGTERM's drain of client sessions begins: `sleep(<ms>)` holds the runtime's thread \
         there (a stop that cannot finish)",
    ),
    point(
        "journal::init::created",
        Kind::Crash,
        "journal init: a segment's `.tmp` created, empty",
    ),
    point(
        "journal::init::filled",
        Kind::Crash,
        "journal init: each MiB of a segment's zero-fill written, not synced",
    ),
    point(
        "journal::init::synced",
        Kind::Crash,
        "journal init: a segment's `.tmp` filled and synced, not renamed",
    ),
    point(
        "journal::init::renamed",
        Kind::Crash,
        "journal init: a segment renamed to its name",
    ),
    point(
        "journal::init::dir_synced",
        Kind::Crash,
        "journal init: every segment there and the directory synced; no MANIFEST yet",
    ),
    point(
        "journal::repair::found",
        Kind::Crash,
        "`journal repair`: the corruption found, nothing changed yet",
    ),
    point(
        "journal::repair::cut",
        Kind::Crash,
        "`journal repair`: the log from the corruption on zeroed and synced; the MANIFEST \
         not stored yet",
    ),
    point(
        "journal::repair::stored",
        Kind::Crash,
        "`journal repair`: the MANIFEST stored after the cut",
    ),
    point(
        "manifest::write",
        Kind::Io,
        "any manifest replaced (the journal's MANIFEST, a CHECKPOINT, a backup's): \
         `<name>.prev` opened, the new text not written over it yet",
    ),
    point(
        "manifest::written",
        Kind::Crash,
        "a manifest replaced: the new text written over `<name>.prev`, not synced",
    ),
    point(
        "manifest::synced",
        Kind::Crash,
        "a manifest replaced: `<name>.prev` synced, the names not exchanged",
    ),
    point(
        "manifest::replaced",
        Kind::Crash,
        "a manifest replaced: `<name>` is the new version, the directory not synced",
    ),
    point(
        "manifest::dir_synced",
        Kind::Crash,
        "a manifest replaced, and its directory synced",
    ),
    point(
        "rdb::write",
        Kind::Io,
        "an RDB stored (a checkpoint's, or the link's full resync's): each write into its \
         `.rdb.tmp` once 64 KiB are in",
    ),
    point(
        "rdb::written",
        Kind::Crash,
        "an RDB stored: every byte in its `.rdb.tmp`, not synced",
    ),
    point(
        "rdb::synced",
        Kind::Crash,
        "an RDB stored: its `.rdb.tmp` synced, not renamed",
    ),
    point(
        "rdb::renamed",
        Kind::Crash,
        "an RDB stored: renamed to its `.rdb` name, the directory not synced",
    ),
    point(
        "checkpoint::manifest_switched",
        Kind::Crash,
        "an RDB recorded (a checkpoint, or the link's full resync): CHECKPOINT names it, \
         the older RDBs are still there",
    ),
    point(
        "checkpoint::recorded",
        Kind::Crash,
        "a checkpoint recorded, the older RDBs deleted; the journal not released yet",
    ),
    point(
        "checkpoint::journal_released",
        Kind::Crash,
        "a checkpoint taken: the journal's MANIFEST released the entries its RDB covers",
    ),
    point(
        "backup::rdb_copied",
        Kind::Crash,
        "a backup: the RDB copied into `.<name>.partial`, synced and verified",
    ),
    point(
        "backup::journal_copied",
        Kind::Crash,
        "a backup: the journal after the RDB copied, the copy's journal closed",
    ),
    point(
        "backup::manifest_written",
        Kind::Crash,
        "a backup: the copy's CHECKPOINT written; `.<name>.partial` complete",
    ),
    point(
        "backup::renamed",
        Kind::Crash,
        "a backup: `.<name>.partial` renamed to `<name>`, the parent directory not synced",
    ),
    point(
        "archive::checkpoint_uploaded",
        Kind::Crash,
        "the archive: a checkpoint's RDB uploaded, the manifest not updated",
    ),
    point(
        "archive::journal_uploaded",
        Kind::Crash,
        "the archive: a journal object uploaded, the uploader's position not moved",
    ),
    point(
        "archive::merged",
        Kind::Crash,
        "the archive: a merged journal object uploaded, the objects it replaces not deleted",
    ),
    point(
        "restore::before_replicaof",
        Kind::Crash,
        "a restore: Valkey's one-time password set, REPLICAOF not sent yet",
    ),
    point(
        "restore::rdb_sent",
        Kind::Crash,
        "a restore: the checkpoint's RDB sent to Valkey",
    ),
    point(
        "restore::stream_sent",
        Kind::Crash,
        "a restore: the journal's stream after the RDB sent to Valkey",
    ),
    point(
        "restore::before_promote",
        Kind::Crash,
        "a restore: Valkey acknowledged the journal's end; REPLICAOF NO ONE (or SAVE) not \
         sent yet",
    ),
];

/// Configures the points `failpoints` names (`FAILPOINTS`'s text: `<name>=<actions>;...`).
pub fn setup(failpoints: &str) -> Result<(), FaultError> {
    for (name, actions) in parse(failpoints).map_err(FaultError::Invalid)? {
        fail::cfg(name, actions)
            .map_err(|e| FaultError::Invalid(format!("FAILPOINTS: {name}={actions}: {e}")))?;
        eprintln!("walrus: fail point {name}={actions}");
    }
    Ok(())
}

/// The `(name, actions)` pairs of a `FAILPOINTS` text, each name a point's and each
/// `return(<arg>)` one its point takes.
fn parse(failpoints: &str) -> Result<Vec<(&str, &str)>, String> {
    let mut pairs = Vec::new();
    for entry in failpoints
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let bad = |why: String| format!("FAILPOINTS: {entry:?}: {why}");
        let (name, actions) = entry
            .split_once('=')
            .ok_or_else(|| bad("expected <name>=<actions>".into()))?;
        let p = POINTS
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| bad(format!("{name:?} is no fail point (src/fault/points.rs)")))?;
        for action in actions.split("->") {
            if let Some(arg) = action.split_once("return").map(|(_, a)| a) {
                let arg = arg.strip_prefix('(').and_then(|a| a.strip_suffix(')'));
                check(p.kind, arg).map_err(bad)?;
            }
        }
        pairs.push((name, actions));
    }
    Ok(pairs)
}

/// Whether a point of `kind` takes `return(<arg>)` (None: a bare `return`).
fn check(kind: Kind, arg: Option<&str>) -> Result<(), String> {
    match (kind, arg) {
        (Kind::Switch, None) | (Kind::Crash | Kind::Io, Some("kill")) => Ok(()),
        (Kind::Io, Some(fault)) => FsFault::parse(fault).map(drop),
        (Kind::JournalWrite, Some(plan)) => JournalPlan::parse(plan).map(drop),
        (Kind::Switch, Some(_)) => Err("a switch takes a bare `return`".into()),
        (Kind::Stall, _) => Err("a stall point takes `sleep(<ms>)`, no `return`".into()),
        (Kind::Crash, _) => Err("a crash point takes `return(kill)`".into()),
        (Kind::Io, None) => Err("expected return(kill) or return(<errno>[@<path>])".into()),
        (Kind::JournalWrite, None) => Err("expected return(<fault><trigger>)".into()),
    }
}

/// A crash point: SIGKILL when configured so.
pub fn crash(name: &'static str) {
    fail::eval(name, |_| kill(name));
}

/// A file-system point: the error configured, or SIGKILL.
pub fn io(name: &'static str) -> io::Result<()> {
    match fail::eval(name, |arg| arg) {
        None => Ok(()),
        Some(Some(arg)) if arg == "kill" => kill(name),
        Some(arg) => FsFault::parse(arg.as_deref().unwrap_or_default())
            .expect("checked at setup")
            .check(),
    }
}

/// Kills this process with SIGKILL, saying so first.
fn kill(name: &str) -> ! {
    eprintln!("walrus: fail point {name}: SIGKILL");
    // SAFETY: signalling our own process.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL cannot be caught")
}

pub(super) fn journal_no_sync() -> bool {
    fail::eval("journal::no_sync", drop).is_some()
}

/// What a faulty journal write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalFault {
    Write(i32),
    Fsync(i32),
    Tear,
}

static JOURNAL_PLAN: OnceLock<JournalPlan> = OnceLock::new();
static JOURNAL_WRITES: AtomicU64 = AtomicU64::new(0);
static JOURNAL_DEAD: AtomicBool = AtomicBool::new(false);

/// The fault, if any, for the journal write of `data` about to happen (`journal::write`;
/// its `sleep(<ms>)` is slept here). Once a `write` or `fsync` fault fired, every later
/// write gets `write` with the same errno.
pub fn journal_write(data: &[u8]) -> Option<JournalFault> {
    let arg = fail::eval("journal::write", |arg| arg).flatten()?;
    let plan = JOURNAL_PLAN.get_or_init(|| JournalPlan::parse(&arg).expect("checked at setup"));
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

#[derive(Debug, Clone, PartialEq, Eq)]
enum Trigger {
    Containing(Vec<u8>),
    Nth(u64),
}

/// `journal::write`'s `return(<fault><trigger>)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JournalPlan {
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

/// A file-system fault: an errno, while a flag file exists (always without one).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FsFault {
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

    /// `FAILPOINTS` is checked whole before anything is configured: a misspelled name, or
    /// an argument its point does not take, is an error naming it.
    #[test]
    fn failpoints_are_checked_against_the_list() {
        let ok = "rdb::renamed=return(kill); manifest::write=1*off->return(EIO@/flag);\
                  journal::write=sleep(5);journal::no_sync=return;;";
        assert_eq!(
            parse(ok).unwrap(),
            [
                ("rdb::renamed", "return(kill)"),
                ("manifest::write", "1*off->return(EIO@/flag)"),
                ("journal::write", "sleep(5)"),
                ("journal::no_sync", "return"),
            ]
        );
        for (bad, says) in [
            ("rdb::renamd=return(kill)", "is no fail point"),
            ("rdb::renamed", "expected <name>=<actions>"),
            ("rdb::renamed=return(EIO)", "takes `return(kill)`"),
            ("rdb::renamed=return", "takes `return(kill)`"),
            ("manifest::write=return(EFOO)", "unknown errno"),
            ("journal::write=return(write:EIO)", "no trigger"),
            ("journal::no_sync=return(1)", "bare `return`"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
