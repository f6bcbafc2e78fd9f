//! Waits on what walrus says of itself, on its metrics endpoint: `/status` (a checkpoint
//! recorded, the link attached, writes refused) and `/metrics` (checkpoints taken, TLS
//! reloads, clients rejected). A state can be read again at any time: a wait on it cannot
//! miss what happened before it began, nor take an earlier event's log line for the one it
//! waits for, as a wait on a log line can.

use super::{http_get, Proc, Walrus, START_TIMEOUT};
use std::fmt::Debug;
use std::time::{Duration, Instant};
use walrus::http::status::Status;

/// The longest a wait goes without reading the state again. walrus logs as its state
/// changes, so a new line of its output is the moment to read it again; this bounds the wait
/// for a change logged just before its state is set, or not logged at all.
const REREAD_AFTER: Duration = Duration::from_millis(50);

impl Walrus {
    /// Its metrics endpoint; fails the test when it has none.
    pub fn metrics(&self) -> &str {
        self.metrics.as_deref().unwrap_or_else(|| {
            panic!("this walrus has no metrics endpoint: start it with .with_metrics()")
        })
    }

    /// `GET /status`.
    pub fn status(&self) -> Status {
        let (code, body) = http_get(self.metrics(), "/status");
        assert_eq!(code, 200, "/status: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status: {e}: {body}"))
    }

    /// The sample `name` (with its labels) of `/metrics`; `None` while it is not exported.
    pub fn sample(&self, name: &str) -> Option<f64> {
        sample(&http_get(self.metrics(), "/metrics").1, name)
    }

    /// Returns the status once `holds` is true of it; fails the test naming `what`, with the
    /// last status read and the log, after `START_TIMEOUT`.
    pub fn await_status(&self, what: &str, holds: impl Fn(&Status) -> bool) -> Status {
        await_read(&self.proc, what, START_TIMEOUT, || self.status(), holds)
    }

    /// Returns the sample `name` once `holds` is true of it.
    pub fn await_metric(&self, name: &str, holds: impl Fn(f64) -> bool) -> f64 {
        await_read(
            &self.proc,
            name,
            START_TIMEOUT,
            || self.sample(name),
            |v| v.is_some_and(&holds),
        )
        .expect("holds")
    }
}

/// The value of the sample `name` (with its labels) in a `/metrics` body.
pub fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Reads `read` until `holds` is true of what it returns, again whenever `proc` writes a line
/// (at least every [`REREAD_AFTER`]); after `within` the test fails naming `what`, with the
/// last value read and `proc`'s log.
pub fn await_read<T: Debug>(
    proc: &Proc,
    what: &str,
    within: Duration,
    mut read: impl FnMut() -> T,
    holds: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        // Counted before the read: a line written while it runs ends the wait below at once.
        let seen = proc.lines_logged();
        let value = read();
        if holds(&value) {
            return value;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "not within {within:?}: {what}; last read: {value:#?}\nlog:\n{}",
            proc.log_text()
        );
        proc.await_output(seen, left.min(REREAD_AFTER));
    }
}
