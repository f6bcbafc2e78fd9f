//! Point-in-time restore: where the stream a checkpoint and the journal after it hold is cut,
//! so that a restore brings back the dataset as it was at an earlier point: at a time
//! (`--until`), at a replication offset (`--until-offset`), or right before a command
//! (`--before-command FLUSHALL`). [`find_cut`] decides where; [`through`] hands over the
//! journal's entries up to there, the last one cut short, for [`super::chain`] to walk as
//! it walks any chain. What a local data directory holds is cut so by `walrus restore`
//! ([`dir`]); an archive's restore points are cut by the same two functions.
//!
//! A cut falls between commands, never inside one, and never inside a transaction (MULTI ...
//! EXEC, which is also how Valkey propagates a script's effects): what a replay applies
//! whole or not at all ([`super::commands`]). The checkpoint must be at or before it: the
//! cut can reach back only as far as the checkpoint the data holds (a data directory's
//! current one; the archive's restore points reach further).
//!
//! - **Time**: the entries journaled at or before it; the cut falls before the first entry
//!   stamped later (an entry is whole commands and transactions). Entries carry their time
//!   since journal format 3; those of an older walrus have none, and a time that falls among
//!   them cannot be placed: refused, naming them. The checkpoint must hold nothing later
//!   either: it was recorded at or before the time, and holds no entry stamped after it.
//! - **Offset**: the commands that end at or before it (a transaction only whole).
//! - **Before a command**: right before a command of that name (and first arguments, if
//!   given), or before the MULTI of the transaction it is in; the newest such command unless
//!   `occurrence` counts further back (1: the newest). The newest is what an operator
//!   undoes first: the FLUSHALL just run by mistake, whatever earlier ones the data holds.

pub mod dir;

use super::chain::{self, ChainEnd, Slice};
use super::commands::{Command, Commands};
use super::DataDirError;
use crate::checkpoint::store::Checkpoint;
use crate::journal::reader::ReplayEntry;
use crate::journal::JournalError;
use crate::units::time::format_time;

/// Where a point-in-time restore stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Until {
    /// Everything the data holds.
    End,
    /// The entries journaled at or before this time (milliseconds since the Unix epoch).
    Time(u64),
    /// The commands that end at or before this replication offset.
    Offset(u64),
    /// Right before a command.
    BeforeCommand(BeforeCommand),
}

/// A command to stop before: its name (any case) and, if given, its first arguments (as
/// written), the `occurrence`-th such command counting back from the newest (1: the newest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeforeCommand {
    pub words: Vec<Vec<u8>>,
    pub occurrence: u32,
}

impl BeforeCommand {
    fn matches(&self, c: &Command) -> bool {
        let args = &c.request.args;
        let Some((name, rest)) = self.words.split_first() else {
            return false;
        };
        args.len() >= self.words.len()
            && args[0].eq_ignore_ascii_case(name)
            && rest.iter().zip(&args[1..]).all(|(w, a)| w[..] == a[..])
    }

    fn describe(&self) -> String {
        let words: Vec<_> = self
            .words
            .iter()
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        words.join(" ")
    }
}

impl Until {
    /// One line, as an in-place rewind's request carries it to a running walrus
    /// ([`Until::parse`] reads it back): `end`, `time MS`, `offset N`, or `command N WORDS...`.
    pub fn to_line(&self) -> String {
        match self {
            Until::End => "end".into(),
            Until::Time(t) => format!("time {t}"),
            Until::Offset(o) => format!("offset {o}"),
            Until::BeforeCommand(b) => format!("command {} {}", b.occurrence, b.describe()),
        }
    }

    pub fn parse(line: &str) -> Result<Until, String> {
        let mut words = line.split_whitespace();
        let number = |w: Option<&str>| {
            w.and_then(|w| w.parse::<u64>().ok())
                .ok_or_else(|| format!("{line:?}: a number expected"))
        };
        let until = match words.next() {
            Some("end") => Until::End,
            Some("time") => Until::Time(number(words.next())?),
            Some("offset") => Until::Offset(number(words.next())?),
            Some("command") => {
                let occurrence = u32::try_from(number(words.next())?)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{line:?}: the occurrence counts from 1"))?;
                let words: Vec<Vec<u8>> = words.map(|w| w.as_bytes().to_vec()).collect();
                if words.is_empty() {
                    return Err(format!("{line:?}: a command name expected"));
                }
                return Ok(Until::BeforeCommand(BeforeCommand { words, occurrence }));
            }
            _ => return Err(format!("{line:?}: end, time, offset or command expected")),
        };
        match words.next() {
            None => Ok(until),
            Some(w) => Err(format!("{line:?}: {w:?} is one word too many")),
        }
    }
}

impl std::fmt::Display for Until {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Until::End => f.write_str("everything it holds"),
            Until::Time(t) => write!(f, "--until {}", format_time(*t)),
            Until::Offset(o) => write!(f, "--until-offset {o}"),
            Until::BeforeCommand(b) => write!(
                f,
                "--before-command {:?} --occurrence {}",
                b.describe(),
                b.occurrence
            ),
        }
    }
}

/// A place in the stream: after entry `lsn`'s bytes up to `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// The last entry whose bytes are kept (before the checkpoint's `from_lsn` when none
    /// after it is).
    pub lsn: u64,
    pub offset: u64,
    /// When that entry was journaled.
    pub time_ms: Option<u64>,
    /// Entries kept after the checkpoint.
    pub entries: u64,
}

/// A command `--before-command` matched, and where the cut before it falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// Where the command starts, and when its entry was journaled.
    pub offset: u64,
    pub time_ms: Option<u64>,
    pub cut: Point,
}

/// Where a point-in-time restore cuts the data, and what it keeps and leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub until: Until,
    pub checkpoint: Checkpoint,
    /// Where the data ends, and when its first and last entries after the checkpoint were
    /// journaled.
    pub end: ChainEnd,
    pub first_time_ms: Option<u64>,
    pub last_time_ms: Option<u64>,
    pub at: Point,
    /// `--before-command`'s matches, oldest first.
    pub matches: Vec<Match>,
}

impl Cut {
    /// Stream bytes kept after the checkpoint.
    pub fn kept_bytes(&self) -> u64 {
        self.at.offset - self.checkpoint.offset
    }

    /// A copy made up to the cut ended where it was decided: the data did not change
    /// between the two reads.
    pub fn reached(&self, end: &ChainEnd) -> Result<(), String> {
        if end.offset == self.at.offset {
            return Ok(());
        }
        Err(format!(
            "the stream ended at offset {} where the cut was decided at {}: decide it again",
            end.offset, self.at.offset
        ))
    }
}

fn time_or_unknown(t: Option<u64>) -> String {
    t.map_or_else(|| "at an unknown time".into(), format_time)
}

/// When the entries from `first` to `last` were journaled, as far as they say.
fn journaled(first: Option<u64>, last: Option<u64>) -> String {
    match (first, last) {
        (Some(a), Some(b)) => format!("journaled {} to {}", format_time(a), format_time(b)),
        (None, Some(b)) => format!(
            "journaled up to {} (the oldest without their time)",
            format_time(b)
        ),
        (_, None) => "without their time (a walrus before times wrote them)".into(),
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cp = &self.checkpoint;
        writeln!(
            f,
            "checkpoint: {} (history {}, offset {}, recorded {})",
            cp.file,
            cp.replid,
            cp.offset,
            time_or_unknown(cp.time_ms)
        )?;
        writeln!(
            f,
            "journal after it: {} entries, offsets {}..{}, {}",
            self.end.entries,
            cp.offset,
            self.end.offset,
            journaled(self.first_time_ms, self.last_time_ms)
        )?;
        if !self.matches.is_empty() {
            writeln!(f, "matches, oldest first:")?;
            let n = self.matches.len();
            for (i, m) in self.matches.iter().enumerate() {
                writeln!(
                    f,
                    "  --occurrence {}: offset {}, journaled {}{}",
                    n - i,
                    m.offset,
                    time_or_unknown(m.time_ms),
                    if m.cut == self.at { "  <- the cut" } else { "" }
                )?;
            }
        }
        writeln!(
            f,
            "cut ({}): at offset {} of history {}, after {} entries ({} bytes of stream, the last journaled {}); leaves out {} entries ({} bytes of stream)",
            self.until,
            self.at.offset,
            self.end
                .ids
                .last()
                .map_or(cp.replid.as_str(), String::as_str),
            self.at.entries,
            self.kept_bytes(),
            time_or_unknown(self.at.time_ms.or(cp.time_ms)),
            self.end.entries - self.at.entries,
            self.end.offset - self.at.offset
        )
    }
}

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
    finder.commands.finish().map_err(DataDirError::Failed)?;
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

/// `entries` up to the cut: those before `cut.at.lsn` as they are, that one ending at
/// `cut.at.offset`, none after it.
pub fn through(
    entries: impl Iterator<Item = Result<ReplayEntry, JournalError>>,
    at: Point,
) -> impl Iterator<Item = Result<ReplayEntry, JournalError>> {
    entries.map_while(move |e| match e {
        Ok(e) if e.lsn > at.lsn => None,
        Ok(mut e) if e.lsn == at.lsn && e.repl_offset_end > at.offset => {
            let start = e.repl_offset_end - e.payload.len() as u64;
            e.payload.truncate(at.offset.saturating_sub(start) as usize);
            e.repl_offset_end = at.offset.max(start);
            Some(Ok(e))
        }
        other => Some(other),
    })
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
                fed?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::write::command;
    use bytes::Bytes;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn a_cut_crosses_to_a_running_walrus_as_one_line_and_back() {
        let command = |words: &[&str], occurrence| {
            Until::BeforeCommand(BeforeCommand {
                words: words.iter().map(|w| w.as_bytes().to_vec()).collect(),
                occurrence,
            })
        };
        for until in [
            Until::End,
            Until::Time(1_764_800_000_123),
            Until::Offset(187),
            command(&["FLUSHALL"], 1),
            command(&["DEL", "important-key"], 3),
        ] {
            assert_eq!(Until::parse(&until.to_line()), Ok(until.clone()), "{until}");
        }
        for (line, why) in [
            ("", "end, time, offset or command expected"),
            ("offset x", "a number expected"),
            ("offset 1 2", "one word too many"),
            ("command 0 FLUSHALL", "counts from 1"),
            ("command 1", "a command name expected"),
        ] {
            let e = Until::parse(line).unwrap_err();
            assert!(e.contains(why), "{line:?}: {e}");
        }
    }

    fn checkpoint(offset: u64, from_lsn: u64, time_ms: Option<u64>) -> Checkpoint {
        Checkpoint {
            file: "c.rdb".into(),
            replid: A.into(),
            offset,
            size: 1,
            crc64: 0,
            from_lsn,
            rdb_version: None,
            written_by: None,
            newest_server: None,
            time_ms,
        }
    }

    /// Entries of whole commands from offset 100, LSN 1 on, each stamped 1000 * its LSN.
    fn journal(commands: &[&[&[u8]]]) -> Vec<ReplayEntry> {
        let mut offset = 100;
        commands
            .iter()
            .enumerate()
            .map(|(i, cmds)| {
                let payload = Bytes::from(cmds.concat());
                offset += payload.len() as u64;
                ReplayEntry {
                    lsn: i as u64 + 1,
                    repl_id: A.as_bytes().try_into().unwrap(),
                    repl_offset_end: offset,
                    payload,
                    time_ms: Some(1000 * (i as u64 + 1)),
                }
            })
            .collect()
    }

    fn cut(cp: &Checkpoint, entries: &[ReplayEntry], until: Until) -> Result<Cut, String> {
        find_cut(cp, entries.iter().cloned().map(Ok), &until).map_err(|e| e.to_string())
    }

    /// The stream `through` hands over, as the chain walks it.
    fn kept(cp: &Checkpoint, entries: &[ReplayEntry], c: &Cut) -> Vec<u8> {
        let mut out = Vec::new();
        let end = chain::walk_entries(through(entries.iter().cloned().map(Ok), c.at), cp, |s| {
            out.extend_from_slice(&s.bytes);
            Ok(())
        })
        .unwrap();
        assert_eq!(end.offset, c.at.offset);
        out
    }

    fn before(words: &[&str], occurrence: u32) -> Until {
        Until::BeforeCommand(BeforeCommand {
            words: words.iter().map(|w| w.as_bytes().to_vec()).collect(),
            occurrence,
        })
    }

    #[test]
    fn a_cut_before_a_command_falls_right_before_it_or_before_its_transaction() {
        let set = |k: &str| command(["SET", k, "v"]);
        let (multi, exec, flush) = (command(["MULTI"]), command(["EXEC"]), command(["FLUSHALL"]));
        let (s1, s2, s3) = (set("a"), set("b"), set("c"));
        let e = journal(&[
            &[&s1, &flush, &s2],
            &[&multi, &s3, &flush, &s1, &flush, &exec],
            &[&flush],
            &[&s3],
        ]);
        let cp = checkpoint(100, 1, Some(500));
        // The newest: entry 3 whole, so the cut is at the end of entry 2.
        let c = cut(&cp, &e, before(&["flushall"], 1)).unwrap();
        assert_eq!((c.at.lsn, c.at.entries), (2, 2));
        assert_eq!(c.matches.len(), 3, "two in one transaction count once");
        let all: Vec<u8> = e.iter().flat_map(|e| e.payload.to_vec()).collect();
        let len = |parts: &[&Bytes]| parts.iter().map(|p| p.len()).sum::<usize>();
        assert_eq!(
            kept(&cp, &e, &c),
            all[..len(&[&s1, &flush, &s2, &multi, &s3, &flush, &s1, &flush, &exec])]
        );
        // The one in the transaction: before its MULTI, the end of entry 1.
        let c = cut(&cp, &e, before(&["FLUSHALL"], 2)).unwrap();
        assert_eq!(
            (c.at.lsn, c.at.offset),
            (1, 100 + len(&[&s1, &flush, &s2]) as u64)
        );
        // The oldest: inside entry 1, which is cut short.
        let c = cut(&cp, &e, before(&["FLUSHALL"], 3)).unwrap();
        assert_eq!((c.at.lsn, c.at.entries), (1, 1));
        assert_eq!(kept(&cp, &e, &c), s1.to_vec());
        // Arguments narrow it; the name's case does not matter, arguments' does.
        let c = cut(&cp, &e, before(&["set", "c"], 1)).unwrap();
        assert_eq!((c.at.lsn, c.at.offset), (3, e[2].repl_offset_end));
        let why = cut(&cp, &e, before(&["SET", "C"], 1)).unwrap_err();
        assert!(why.contains("holds 0 such commands"), "{why}");
        let why = cut(&cp, &e, before(&["FLUSHALL"], 4)).unwrap_err();
        assert!(why.contains("holds 3 such commands"), "{why}");
        // Before the first command after the checkpoint: the checkpoint alone.
        let c = cut(&cp, &e, before(&["SET", "a"], 2)).unwrap();
        assert_eq!((c.at.lsn, c.at.offset, c.at.entries), (0, 100, 0));
        assert!(kept(&cp, &e, &c).is_empty());
    }

    #[test]
    fn a_cut_at_an_offset_keeps_the_commands_that_end_by_it_and_transactions_whole() {
        let set = command(["SET", "k", "v"]);
        let (multi, exec) = (command(["MULTI"]), command(["EXEC"]));
        let e = journal(&[&[&set, &set], &[&multi, &set, &exec], &[&set]]);
        let cp = checkpoint(100, 1, None);
        let n = set.len() as u64;
        let offsets: Vec<u64> = (100..=e[2].repl_offset_end).collect();
        for o in offsets {
            let c = cut(&cp, &e, Until::Offset(o)).unwrap();
            let tx_end = e[1].repl_offset_end;
            let want = if o >= e[2].repl_offset_end {
                e[2].repl_offset_end
            } else if o >= tx_end {
                tx_end
            } else if o >= 100 + 2 * n {
                100 + 2 * n
            } else if o >= 100 + n {
                100 + n
            } else {
                100
            };
            assert_eq!(c.at.offset, want, "--until-offset {o}");
            assert_eq!(kept(&cp, &e, &c).len() as u64, want - 100);
        }
        for o in [99, e[2].repl_offset_end + 1] {
            let why = cut(&cp, &e, Until::Offset(o)).unwrap_err();
            assert!(why.contains("outside what the data holds"), "{why}");
        }
    }

    #[test]
    fn a_cut_at_a_time_keeps_the_entries_journaled_by_then() {
        let set = command(["SET", "k", "v"]);
        let e = journal(&[&[&set], &[&set, &set], &[&set]]);
        let cp = checkpoint(100, 1, Some(500));
        for (t, lsn) in [
            (500, 0),
            (999, 0),
            (1000, 1),
            (2500, 2),
            (3000, 3),
            (9999, 3),
        ] {
            let c = cut(&cp, &e, Until::Time(t)).unwrap();
            assert_eq!(c.at.lsn, lsn, "--until {t}");
            let want = if lsn == 0 {
                100
            } else {
                e[lsn as usize - 1].repl_offset_end
            };
            assert_eq!(c.at.offset, want);
        }
        // Before the checkpoint was recorded.
        let why = cut(&cp, &e, Until::Time(499)).unwrap_err();
        assert!(why.contains("as late as"), "{why}");
        // The checkpoint holds entry 1 (it ends before the checkpoint's offset): not before it.
        let inside = checkpoint(e[0].repl_offset_end, 1, Some(500));
        let why = cut(&inside, &e, Until::Time(999)).unwrap_err();
        assert!(why.contains("as late as"), "{why}");
        assert_eq!(
            cut(&inside, &e, Until::Time(1000)).unwrap().at.offset,
            e[0].repl_offset_end
        );
        // Untimed entries (an older walrus) cannot be placed before a time that stops after
        // them, nor when nothing after them is stamped.
        let mut old = e.clone();
        old[0].time_ms = None;
        old[1].time_ms = None;
        assert_eq!(cut(&cp, &old, Until::Time(3000)).unwrap().at.lsn, 3);
        for t in [1500, 2999] {
            let why = cut(&cp, &old, Until::Time(t)).unwrap_err();
            assert!(why.contains("entries 1..=2"), "{why}");
        }
        old[2].time_ms = None;
        assert!(cut(&cp, &old, Until::Time(9999)).is_err());
        // A checkpoint without a time: before the first entry journaled after it, unknown.
        let untimed = checkpoint(100, 1, None);
        assert!(cut(&untimed, &e, Until::Time(999))
            .unwrap_err()
            .contains("records no time"));
        assert_eq!(cut(&untimed, &e, Until::Time(1000)).unwrap().at.lsn, 1);
    }
}
