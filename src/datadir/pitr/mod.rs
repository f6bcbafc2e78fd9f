//! Point-in-time restore: where the stream a checkpoint and the journal after it hold is cut,
//! so that a restore brings back the dataset as it was at an earlier point: at a time
//! (`--until`), at a replication offset (`--until-offset`), or right before a command
//! (`--before-command FLUSHALL`). [`find::find_cut`] decides where; [`through`] hands over the
//! journal's entries up to there, the last one cut short, for [`super::chain`] to walk as
//! it walks any chain. What a local data directory holds is cut so by `walrus restore`
//! ([`crate::datadir::backup::cut`]); an archive's restore points are cut by the same two functions.
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

pub mod find;

use super::chain::ChainEnd;
use super::commands::Command;
use super::DataDirError;
use crate::checkpoint::manifest::Checkpoint;
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

    pub fn parse(line: &str) -> Result<Until, DataDirError> {
        Until::read(line).map_err(DataDirError::Refused)
    }

    /// [`Until::parse`], saying what in `line` is wrong.
    fn read(line: &str) -> Result<Until, String> {
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
    pub fn reached(&self, end: &ChainEnd) -> Result<(), DataDirError> {
        if end.offset == self.at.offset {
            return Ok(());
        }
        Err(DataDirError::Failed(format!(
            "the stream ended at offset {} where the cut was decided at {}: decide it again",
            end.offset, self.at.offset
        )))
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

#[cfg(test)]
mod tests;
