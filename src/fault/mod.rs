//! Fault injection for tests: named fail points, compiled in only with the `failpoints`
//! feature. `cargo test` turns it on for everything it builds, the walrus binary the tests
//! run among them (the package's dev-dependency on itself); `cargo build` and `cargo build
//! --release` leave it off, and then every point below is no code at all, `walrus
//! --version` says nothing of them, and `FAILPOINTS` is ignored with a warning. Building
//! with them on, for the crash, generator and benchmark tools: `cargo build [--release]
//! --features failpoints` (docs/testing.md).
//!
//! A walrus with fail points reads `FAILPOINTS=<name>=<actions>;...` once, at start (tikv's
//! `fail` crate: an action is `off`, `return`, `return(<arg>)`, `sleep(<ms>)`, `pause`,
//! `panic`..., optionally counted, `<n>*`, and chained with `->`: `2*off->return(kill)`
//! acts at the third pass). A name that is not a point of [`points::POINTS`] (the list, with
//! what each point means), or a `return(<arg>)` its point does not take, stops walrus at
//! start: a test that misspells one must not pass by testing nothing.
//!
//! Three kinds of points:
//! - crash points ([`fail_point!`]): `return(kill)` is a SIGKILL of the process right there
//!   (a crash, not a panic: nothing runs after it, no destructor, no buffered write);
//! - file-system points ([`io_point!`]): `return(kill)`, or `return(<errno>[@<path>])`,
//!   the operation fails with that errno (ENOSPC, EIO, EINVAL, EROFS, EDQUOT), while the
//!   file `<path>` exists if one is named (a test turns the fault on and off at run time);
//! - the journal's writes: `journal::write` ([`points::journal_write`], a slow or failing
//!   device) and `journal::no_sync` ([`journal_no_sync`]).

#[cfg(feature = "failpoints")]
pub mod points;

/// A crash point named `$name` (listed in [`points::POINTS`]); with a condition, only
/// where it holds. No code without the `failpoints` feature.
#[cfg(feature = "failpoints")]
macro_rules! fail_point {
    ($name:literal) => {
        $crate::fault::points::crash($name)
    };
    ($name:literal, $cond:expr) => {
        if $cond {
            $crate::fault::points::crash($name)
        }
    };
}
#[cfg(not(feature = "failpoints"))]
macro_rules! fail_point {
    ($name:literal) => {};
    ($name:literal, $cond:expr) => {};
}
pub(crate) use fail_point;

/// A file-system point named `$name`: an `io::Result<()>`, the error its `return(<errno>)`
/// configures (or a SIGKILL); with a condition, only where it holds. `Ok(())` without the
/// `failpoints` feature.
#[cfg(feature = "failpoints")]
macro_rules! io_point {
    ($name:literal) => {
        $crate::fault::points::io($name)
    };
    ($name:literal, $cond:expr) => {
        if $cond {
            $crate::fault::points::io($name)
        } else {
            Ok(())
        }
    };
}
#[cfg(not(feature = "failpoints"))]
macro_rules! io_point {
    ($name:literal) => {
        ::std::io::Result::<()>::Ok(())
    };
    ($name:literal, $cond:expr) => {
        ::std::io::Result::<()>::Ok(())
    };
}
pub(crate) use io_point;

/// True when journal writes must not be made durable (`journal::no_sync`).
#[cfg(feature = "failpoints")]
pub fn journal_no_sync() -> bool {
    points::journal_no_sync()
}
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn journal_no_sync() -> bool {
    false
}

/// What in `FAILPOINTS` is wrong: the message names the entry and why.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("{0}")]
    Invalid(String),
}

/// Reads `FAILPOINTS` (once, at start, before anything else runs); Err says what in it is
/// wrong. Without fail points, a `FAILPOINTS` set anyway is ignored, with a warning.
pub fn setup() -> Result<(), FaultError> {
    #[cfg(feature = "failpoints")]
    return points::setup(std::env::var("FAILPOINTS").ok().as_deref().unwrap_or(""));
    #[cfg(not(feature = "failpoints"))]
    {
        if std::env::var_os("FAILPOINTS").is_some_and(|v| !v.is_empty()) {
            eprintln!(
                "walrus: FAILPOINTS is ignored: this walrus was built without fail points (cargo build --features failpoints)"
            );
        }
        Ok(())
    }
}
