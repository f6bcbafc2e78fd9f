//! Where a cut falls: the chain walked once, its commands read ([`Commands`]) where the cut
//! is at an offset or before a command, each entry's time where it is at a time; and whether
//! the data can be cut so at all (the module doc of [`super`] says when it cannot).

use super::{time_or_unknown, Cut, Match, Point, Until};
use crate::checkpoint::manifest::Checkpoint;
use crate::datadir::chain::{self, ChainEnd, Slice};
use crate::datadir::commands::{Command, Commands};
use crate::datadir::DataDirError;
use crate::journal::reader::ReplayEntry;
use crate::journal::JournalError;
use crate::units::time::format_time;

/// Decides where `until` cuts the stream of `cp` and `entries` (the journal from the
/// checkpoint's `from_lsn` on, or before it), reading them all once (blocking when they come
/// from files). A cut that cannot be made as asked is [`DataDirError::Refused`], saying why
/// and what the data holds; a damaged or broken chain is the chain's error.
pub fn find_cut(
    cp: &Checkpoint,
    entries: impl Iterator<Item = Result<ReplayEntry, JournalError>>,
    until: &Until,
) -> Result<Cut, DataDirError> {
    let mut finder = Finder::new(cp, until);
    let held = InCheckpoint::default();
    let entries = entries.inspect(|e| {
        if let Ok(e) = e {
            held.pulled(e);
        }
    });
    let mut failure = None;
    let end = chain::walk_entries(entries, cp, |s| {
        held.sliced(&s);
        finder.slice(&s).map_err(|why| {
            failure = Some(why);
            chain::ChainError::Journal(JournalError::InvalidArgument("unreadable stream".into()))
        })
    });
    if let Some(why) = failure {
        return Err(DataDirError::Failed(why));
    }
    let end = end?;
    finder.commands.finish()?;
    finder.finish(end, held.latest())
}

/// The latest time among the entries the checkpoint holds: those the chain skips before its
/// first slice, and that slice's own when it began inside the checkpoint.
#[derive(Default)]
struct InCheckpoint {
    sliced: std::cell::Cell<bool>,
    /// The last entry pulled: where it starts, when it was journaled.
    last: std::cell::Cell<Option<(u64, Option<u64>)>>,
    latest: std::cell::Cell<Option<u64>>,
}

impl InCheckpoint {
    fn fold(&self, time: Option<u64>) {
        self.latest.set(self.latest.get().max(time));
    }

    fn pulled(&self, e: &ReplayEntry) {
        if !self.sliced.get() {
            if let Some((_, t)) = self.last.get() {
                self.fold(t);
            }
        }
        let start = e.repl_offset_end - e.payload.len() as u64;
        self.last.set(Some((start, e.time_ms)));
    }

    fn sliced(&self, s: &Slice) {
        if self.sliced.replace(true) {
            return;
        }
        if let Some((start, t)) = self.last.get() {
            if start < s.end - s.bytes.len() as u64 {
                self.fold(t);
            }
        }
    }

    fn latest(&self) -> Option<u64> {
        if !self.sliced.get() {
            self.fold(self.last.get().and_then(|l| l.1));
        }
        self.latest.get()
    }
}

/// The walk's state: the commands read so far and where a cut may fall.
struct Finder<'a> {
    cp: &'a Checkpoint,
    until: &'a Until,
    commands: Commands,
    /// The end of the last slice read.
    last: Point,
    /// The slice being read: lsn, start, time.
    current: (u64, u64, Option<u64>),
    /// Where the cut falls so far (time, offset, the end).
    at: Point,
    /// `--until TIME`: a slice stamped later was read; the cut stays where it is.
    stopped: bool,
    /// `--until TIME`: untimed slices read and not yet followed by one stamped at or before
    /// the time (their LSNs), which would place them before it.
    untimed: Option<(u64, u64)>,
    /// Why the cut cannot be made as asked, once the walk showed it.
    refusal: Option<String>,
    /// The point before the open transaction's MULTI.
    before_transaction: Option<Point>,
    matches: Vec<Match>,
    first_time_ms: Option<u64>,
    last_time_ms: Option<u64>,
}

impl<'a> Finder<'a> {
    fn new(cp: &'a Checkpoint, until: &'a Until) -> Self {
        let start = Point {
            lsn: cp.from_lsn - 1,
            offset: cp.offset,
            time_ms: None,
            entries: 0,
        };
        Finder {
            cp,
            until,
            commands: Commands::new(cp.offset),
            last: start,
            current: (0, cp.offset, None),
            at: start,
            stopped: false,
            untimed: None,
            refusal: None,
            before_transaction: None,
            matches: Vec::new(),
            first_time_ms: None,
            last_time_ms: None,
        }
    }

    /// The point right before the command starting at `offset` in the current slice.
    fn before(&self, offset: u64) -> Point {
        let (lsn, start, time_ms) = self.current;
        if offset > start {
            Point {
                lsn,
                offset,
                time_ms,
                entries: self.last.entries + 1,
            }
        } else {
            self.last
        }
    }

    fn slice(&mut self, s: &Slice) -> Result<(), String> {
        let start = s.end - s.bytes.len() as u64;
        self.current = (s.lsn, start, s.time_ms);
        self.first_time_ms = self.first_time_ms.or(s.time_ms);
        self.last_time_ms = s.time_ms.or(self.last_time_ms);
        let end = Point {
            lsn: s.lsn,
            offset: s.end,
            time_ms: s.time_ms,
            entries: self.last.entries + 1,
        };
        match self.until {
            Until::End => self.at = end,
            Until::Time(t) if !self.stopped => match s.time_ms {
                Some(time) if time > *t => {
                    if let Some((from, to)) = self.untimed {
                        self.refusal = Some(untimed_refusal(from, to, *t));
                    }
                    self.stopped = true;
                }
                Some(_) => {
                    self.untimed = None;
                    self.at = end;
                }
                None => {
                    let from = self.untimed.map_or(s.lsn, |u| u.0);
                    self.untimed = Some((from, s.lsn));
                    self.at = end;
                }
            },
            Until::Time(_) => {}
            Until::Offset(_) | Until::BeforeCommand(_) => {
                let mut commands = std::mem::replace(&mut self.commands, Commands::new(0));
                let fed = commands.feed(&s.bytes, |c| {
                    self.command(&c);
                    Ok(())
                });
                self.commands = commands;
                fed.map_err(|e| e.to_string())?;
            }
        }
        self.last = end;
        Ok(())
    }

    fn command(&mut self, c: &Command) {
        if c.name().eq_ignore_ascii_case(b"MULTI") {
            self.before_transaction = Some(self.before(c.start));
        }
        match self.until {
            Until::Offset(o) if c.end <= *o && c.cut_after() => {
                let (lsn, _, time_ms) = self.current;
                self.at = Point {
                    lsn,
                    offset: c.end,
                    time_ms,
                    entries: self.last.entries + 1,
                };
            }
            Until::BeforeCommand(b) if b.matches(c) => {
                let cut = match c.transaction {
                    Some(_) => self.before_transaction.unwrap_or(self.last),
                    None => self.before(c.start),
                };
                // Several matches in one transaction cut before its MULTI: one place.
                if self.matches.last().is_none_or(|m| m.cut != cut) {
                    self.matches.push(Match {
                        offset: c.start,
                        time_ms: self.current.2,
                        cut,
                    });
                }
            }
            _ => {}
        }
    }

    fn finish(self, end: ChainEnd, covered_max: Option<u64>) -> Result<Cut, DataDirError> {
        let refused = |why: String| DataDirError::Refused(why);
        if let Some(why) = self.refusal {
            return Err(refused(why));
        }
        let cp = self.cp;
        let holds = format!(
            "the data holds checkpoint {} (offset {}, recorded {}) and the journal after it to offset {}",
            cp.file,
            cp.offset,
            time_or_unknown(cp.time_ms),
            end.offset
        );
        let mut at = self.at;
        match self.until {
            Until::End => {}
            Until::Time(t) => {
                if let Some((from, to)) = self.untimed {
                    return Err(refused(untimed_refusal(from, to, *t)));
                }
                let later = cp
                    .time_ms
                    .filter(|c| c > t)
                    .or(covered_max.filter(|c| c > t));
                if let Some(later) = later {
                    return Err(refused(format!(
                        "--until {}: the checkpoint holds writes journaled as late as {}, after that time, and a restore cannot go back before its checkpoint; {holds}",
                        format_time(*t),
                        format_time(later)
                    )));
                }
                if cp.time_ms.is_none() && at.entries == 0 {
                    return Err(refused(format!(
                        "--until {}: the checkpoint records no time (a walrus before times recorded it) and no entry after it was journaled by then, so whether it is before that time is unknown; use --until-offset {} to restore it as it is; {holds}",
                        format_time(*t),
                        cp.offset
                    )));
                }
            }
            Until::Offset(o) => {
                if *o < cp.offset || *o > end.offset {
                    return Err(refused(format!(
                        "--until-offset {o} is outside what the data holds: {holds}"
                    )));
                }
            }
            Until::BeforeCommand(b) => {
                let n = b.occurrence as usize;
                let Some(m) = self.matches.len().checked_sub(n).map(|i| self.matches[i]) else {
                    return Err(refused(format!(
                        "--before-command {:?} --occurrence {n}: the journal after the checkpoint holds {} such command{} (a transaction counts once); {holds}",
                        b.describe(),
                        self.matches.len(),
                        if self.matches.len() == 1 { "" } else { "s" }
                    )));
                };
                at = m.cut;
            }
        }
        Ok(Cut {
            until: self.until.clone(),
            checkpoint: cp.clone(),
            end,
            first_time_ms: self.first_time_ms,
            last_time_ms: self.last_time_ms,
            at,
            matches: self.matches,
        })
    }
}

fn untimed_refusal(from: u64, to: u64, t: u64) -> String {
    format!(
        "--until {}: journal entries {from}..={to} were written by a walrus that did not record times yet, so whether they came before that time is unknown; cut with --until-offset or --before-command instead",
        format_time(t)
    )
}
