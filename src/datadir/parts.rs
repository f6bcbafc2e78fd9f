//! What a data directory holds, decided once, from its manifests, before anything opens it:
//! `walrus serve` and `walrus verify` call [`check`] (and the offline backup and the export
//! too), so what one refuses the other refuses, with the same words.
//!
//! The parts must prove they belong together. The journal's manifest and the checkpoints'
//! carry the data directory's identity ([`DataDirId`], drawn when the journal is made; the
//! checkpoints' manifest is written with it before there is any checkpoint), and the
//! journal released only entries the checkpoint no longer needs (`released_through_lsn <
//! from_lsn`). Where they cannot prove what the directory holds, walrus refuses (exit 2, a
//! person must act), naming the files and the way out; it never starts empty, nor deletes
//! an RDB, on a guess:
//!
//! | journal/MANIFEST | checkpoints/CHECKPOINT | verdict |
//! |---|---|---|
//! | none | none, and no RDB | a new data directory |
//! | none | none, with an RDB | refused: an incomplete copy |
//! | none | records a checkpoint | refused: the journal is lost |
//! | none | no checkpoint yet | a new data directory (the manifest held nothing) |
//! | identity J | identity K != J, with a checkpoint (or J none, K some) | refused: parts of two data directories |
//! | any | a checkpoint from LSN F, the journal released through R >= F | refused: not of one moment |
//! | released entries, or holds any | none, or no checkpoint yet | refused: the checkpoint is lost |
//! | released none, holds none | none, with an RDB | refused: an RDB no manifest names |
//! | released none, holds none | no checkpoint yet, with an RDB | a checkpoint interrupted before it was recorded: the RDB is removed |
//! | otherwise | | consistent; a manifest without the identity takes it (adopted) |
//!
//! A directory written before identities (no `data_dir_id` in either manifest) is adopted
//! at its first start when its parts agree as far as they can be checked: the release point
//! against the checkpoint, the chain from the checkpoint to the journal's end (what every
//! restore walks), and the journal's key against its segments
//! (`crate::journal::recovery::key_seals_the_ring`). From then on the identity tells a
//! foreign manifest at once.

use super::DataDirError;
use crate::checkpoint::manifest::{Recorded, CHECKPOINT_FILE};
use crate::checkpoint::store::Store;
use crate::journal::manifest::{DataDirId, Manifest, MANIFEST_FILE};
use std::path::{Path, PathBuf};

/// What a start would do with a directory whose parts agree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// A manifest lacks the identity (one written before identities, or a directory made
    /// by `walrus journal init`): the next start writes it.
    pub adopt: bool,
    /// RDBs of a checkpoint interrupted before it was recorded: the next start removes them.
    pub leftovers: Vec<String>,
}

/// What the journal's manifest says, and how many entries its log holds (once scanned).
#[derive(Debug, Clone)]
struct JournalSide {
    id: Option<DataDirId>,
    released_through: u64,
    /// The last entry it says was written
    /// ([`crate::journal::manifest::Checkpoint::written_through`]).
    written_through: u64,
    entries: Option<u64>,
}

/// A data directory's parts, as its files say.
#[derive(Debug, Clone)]
struct Parts {
    journal_manifest: PathBuf,
    checkpoint_manifest: PathBuf,
    journal: Option<JournalSide>,
    checkpoints: Option<Recorded>,
    rdbs: Vec<String>,
}

/// Reads the manifests of the journal in `journal_dir` and of the checkpoints in `cp_dir`,
/// and the RDBs beside the latter (changing nothing), and decides whether they prove what
/// the directory holds. `entries`: how many entries the journal's log holds, once it was
/// scanned (before, the rules that need it wait). The error says what is wrong and what to
/// do ([`DataDirError::Refused`]: exit 2), or why the files could not be read.
pub fn check(
    journal_dir: &Path,
    cp_dir: &Path,
    entries: Option<u64>,
) -> Result<Verdict, DataDirError> {
    let journal = Manifest::load(journal_dir)?.map(|m| JournalSide {
        id: m.data_dir_id,
        released_through: m.checkpoint.released_through_lsn,
        written_through: m.checkpoint.written_through(),
        entries,
    });
    let parts = Parts {
        journal_manifest: journal_dir.join(MANIFEST_FILE),
        checkpoint_manifest: cp_dir.join(CHECKPOINT_FILE),
        journal,
        checkpoints: Store::manifest(cp_dir)?,
        rdbs: Store::rdbs(cp_dir)
            .map_err(|e| DataDirError::Failed(format!("reading {}: {e}", cp_dir.display())))?,
    };
    decide(&parts).map_err(DataDirError::Refused)
}

/// The way out of a refusal, the same everywhere.
const WAY_OUT: &str = "Put back what this data directory had (from a backup, or from the copy \
    it was made from), or start from a backup (`walrus serve --data-dir BACKUP`); to give up \
    what this directory holds and start over, move the data directory aside";

/// The table of the module's doc.
fn decide(p: &Parts) -> Result<Verdict, String> {
    let (jm, cm) = (
        p.journal_manifest.display(),
        p.checkpoint_manifest.display(),
    );
    let checkpoint = p.checkpoints.as_ref().and_then(|c| c.checkpoint.as_ref());
    let unnamed = || {
        p.rdbs
            .iter()
            .filter(|r| checkpoint.is_none_or(|c| &c.file != *r))
            .cloned()
            .collect::<Vec<_>>()
    };
    let Some(j) = &p.journal else {
        if let Some(c) = checkpoint {
            return Err(format!(
                "{cm} records the checkpoint {}, but there is no journal ({jm} is missing): the \
                 entries after the checkpoint are lost with it, and a restore would lack them. \
                 {WAY_OUT}",
                c.file
            ));
        }
        if p.checkpoints.is_none() && !p.rdbs.is_empty() {
            return Err(format!(
                "{} holds {}, but there is neither {jm} nor {cm}: an incomplete copy, which \
                 walrus would start empty from. {WAY_OUT}",
                p.checkpoint_manifest
                    .parent()
                    .unwrap_or(Path::new("."))
                    .display(),
                p.rdbs.join(", ")
            ));
        }
        return Ok(Verdict {
            adopt: false,
            leftovers: unnamed(),
        });
    };
    let ids = (
        j.id.as_ref(),
        p.checkpoints.as_ref().and_then(|c| c.data_dir_id.as_ref()),
    );
    if checkpoint.is_some() {
        match ids {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "{jm} and {cm} belong to different data directories ({a} and {b}): one was \
                     copied in from another, and walrus will not guess which holds the data. \
                     {WAY_OUT}"
                ))
            }
            (None, Some(b)) => {
                return Err(format!(
                    "{jm} has no identity, but {cm} has this data directory's ({b}): the \
                     journal's manifest is not this data directory's (one written before \
                     identities, copied in?), and the two belong to different data \
                     directories. {WAY_OUT}"
                ))
            }
            _ => {}
        }
    }
    match checkpoint {
        Some(c) if j.released_through >= c.from_lsn => Err(format!(
            "{jm} says the journal released its entries through LSN {}, but the checkpoint {cm} \
             records ({}) needs them from LSN {}: the two manifests are not of one data \
             directory at one moment (one was put back from an older copy, or copied in from \
             another data directory), and a restore would lack those entries. {WAY_OUT}",
            j.released_through, c.file, c.from_lsn
        )),
        Some(_) => Ok(Verdict {
            adopt: ids.0.is_none() || ids.1.is_none(),
            leftovers: unnamed(),
        }),
        None => {
            let lost = match &p.checkpoints {
                None => format!("{cm} is missing"),
                Some(_) => format!("{cm} records no checkpoint"),
            };
            if j.written_through > 0 {
                return Err(format!(
                    "{lost}, but {jm} says the journal released its entries through LSN {} \
                     to a checkpoint: without it they are gone, and walrus would start without \
                     them. {WAY_OUT}",
                    j.written_through
                ));
            }
            if let Some(n) = j.entries.filter(|n| *n > 0) {
                return Err(format!(
                    "{lost}, but the journal holds {n} entries, which follow a checkpoint: \
                     without it walrus would start without what came before them. {WAY_OUT}"
                ));
            }
            if p.checkpoints.is_none() && !p.rdbs.is_empty() {
                return Err(format!(
                    "{lost}, and {} holds {} that no manifest names: an incomplete copy, or a \
                     lost manifest, which walrus would start empty from. {WAY_OUT}",
                    p.checkpoint_manifest
                        .parent()
                        .unwrap_or(Path::new("."))
                        .display(),
                    p.rdbs.join(", ")
                ));
            }
            Ok(Verdict {
                adopt: ids.0.is_none() || ids.1.is_none(),
                leftovers: unnamed(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: char) -> DataDirId {
        DataDirId::try_from(c.to_string().repeat(32)).unwrap()
    }

    fn journal(id: Option<DataDirId>, released: u64, entries: u64) -> Option<JournalSide> {
        Some(JournalSide {
            id,
            released_through: released,
            written_through: released,
            entries: Some(entries),
        })
    }

    fn checkpoints(id: Option<DataDirId>, from_lsn: Option<u64>) -> Option<Recorded> {
        Some(Recorded {
            data_dir_id: id,
            checkpoint: from_lsn.map(|from_lsn| crate::checkpoint::manifest::Checkpoint {
                file: "c.rdb".into(),
                replid: "a".repeat(40),
                offset: 1,
                size: 1,
                crc64: 0,
                from_lsn,
                rdb_version: None,
                written_by: None,
                newest_server: None,
                time_ms: None,
            }),
        })
    }

    fn decided(
        journal: Option<JournalSide>,
        checkpoints: Option<Recorded>,
        rdbs: &[&str],
    ) -> Result<Verdict, String> {
        decide(&Parts {
            journal_manifest: "d/journal/MANIFEST".into(),
            checkpoint_manifest: "d/checkpoints/CHECKPOINT".into(),
            journal,
            checkpoints,
            rdbs: rdbs.iter().map(|r| r.to_string()).collect(),
        })
    }

    fn refused(r: Result<Verdict, String>, why: &str) {
        let e = r.expect_err(why);
        assert!(
            e.contains(why) && e.contains(WAY_OUT),
            "{why:?} missing: {e}"
        );
    }

    #[test]
    fn the_table_of_what_a_data_directory_holds() {
        let (a, b) = (Some(id('a')), Some(id('b')));
        let ok = |adopt, leftovers: &[&str]| {
            Ok(Verdict {
                adopt,
                leftovers: leftovers.iter().map(|r| r.to_string()).collect(),
            })
        };
        // No journal.
        assert_eq!(decided(None, None, &[]), ok(false, &[]));
        refused(decided(None, None, &["x.rdb"]), "an incomplete copy");
        refused(
            decided(None, checkpoints(a.clone(), Some(5)), &["c.rdb"]),
            "but there is no journal (d/journal/MANIFEST is missing)",
        );
        assert_eq!(
            decided(None, checkpoints(a.clone(), None), &["x.rdb"]),
            ok(false, &["x.rdb"])
        );
        // Parts of two data directories, or of two moments.
        refused(
            decided(
                journal(b.clone(), 4, 9),
                checkpoints(a.clone(), Some(5)),
                &[],
            ),
            "belong to different data directories",
        );
        refused(
            decided(journal(None, 4, 9), checkpoints(a.clone(), Some(5)), &[]),
            "has no identity",
        );
        refused(
            decided(
                journal(a.clone(), 5, 9),
                checkpoints(a.clone(), Some(5)),
                &[],
            ),
            "released its entries through LSN 5, but the checkpoint",
        );
        // The checkpoint lost.
        refused(
            decided(journal(a.clone(), 4, 0), None, &[]),
            "d/checkpoints/CHECKPOINT is missing, but d/journal/MANIFEST says the journal released its entries through LSN 4",
        );
        refused(
            decided(journal(a.clone(), 4, 0), checkpoints(a.clone(), None), &[]),
            "records no checkpoint, but",
        );
        refused(
            decided(journal(a.clone(), 0, 3), None, &[]),
            "the journal holds 3 entries",
        );
        refused(
            decided(journal(a.clone(), 0, 0), None, &["x.rdb"]),
            "holds x.rdb that no manifest names",
        );
        // Nothing held: a new directory, or a first checkpoint interrupted.
        assert_eq!(decided(journal(a.clone(), 0, 0), None, &[]), ok(true, &[]));
        assert_eq!(
            decided(
                journal(a.clone(), 0, 0),
                checkpoints(b.clone(), None),
                &["x.rdb"]
            ),
            ok(false, &["x.rdb"])
        );
        // Consistent: adopted where a manifest lacks the identity.
        let consistent = |j, c| {
            decided(
                journal(j, 4, 9),
                checkpoints(c, Some(5)),
                &["c.rdb", "y.rdb"],
            )
        };
        assert_eq!(consistent(a.clone(), a.clone()), ok(false, &["y.rdb"]));
        assert_eq!(consistent(None, None), ok(true, &["y.rdb"]));
        assert_eq!(consistent(a.clone(), None), ok(true, &["y.rdb"]));
    }
}
