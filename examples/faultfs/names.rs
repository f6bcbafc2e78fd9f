//! Names not yet durable: what a crash rolls back of creations, removals and renames.
//!
//! POSIX makes a name operation durable only once its directory is fsynced: a file created,
//! unlinked or renamed, then the power cut, may come back as it was. ext4 adds one thing:
//! an fsync (or fdatasync, or O_DSYNC write) of a newly created file or directory makes its
//! own entry durable too (with a journal, the creation is in the transaction the fsync
//! waits for: the inode's sync transaction is set at creation, kernel commit f7ad6d2e9201;
//! without one, `ext4_sync_parent` syncs the directories of new entries, 14ece1028b3e). It
//! does not do that for a rename or an unlink, and neither does this model.
//!
//! The backing directory holds the namespace as the processes on the mount see it, and
//! every create, mkdir, symlink, unlink, rmdir and rename is recorded here, oldest first,
//! until it is durable. Nothing is deleted before then: an unlinked or rmdir'ed entry, or
//! one a rename replaced, is moved into the graveyard (a hidden directory at the backing
//! directory's root), from where a crash puts it back, newest operation first.
//!
//! What an fsync makes durable is in order, as a journal commits: besides the operations it
//! covers, every older one they depend on (one that changed the same entry, or made, moved
//! or removed a directory they live under), or rolling the older one back would undo part
//! of a durable one. So nothing durable depends on an operation left pending, and a crash
//! undoes the pending ones newest first.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use fuser::{Errno, RenameFlags};

use crate::inodes::Inodes;
use crate::meta::{check, cpath};

/// The graveyard's name at the backing directory's root, hidden from the mount.
pub const GRAVE: &str = ".faultfs-unlinked";

/// A backing object's identity, (st_dev, st_ino): stable across renames, and not reused
/// while the object lives (removed ones wait in the graveyard).
pub type Id = (u64, u64);

/// How to take an operation back.
enum Undo {
    /// A new entry (create, mkdir, symlink): removed.
    Made { path: PathBuf, dir: bool },
    /// An entry removed (unlink, rmdir): its object waits in the graveyard at `kept`.
    Removed { path: PathBuf, kept: PathBuf },
    /// `from` renamed to `to`; what `to` named before waits at `replaced`.
    Renamed {
        from: PathBuf,
        to: PathBuf,
        replaced: Option<PathBuf>,
    },
    /// `a` and `b` swapped (RENAME_EXCHANGE).
    Exchanged { a: PathBuf, b: PathBuf },
}

struct Op {
    seq: u64,
    undo: Undo,
    /// The entries it changed: (directory, name).
    entries: Vec<(Id, OsString)>,
    /// Every directory above those entries: a durable later move of one of them would
    /// change the paths `undo` names.
    needs: Vec<Id>,
    /// The directories it made, removed or moved.
    moves: Vec<Id>,
    /// What it created: an fsync of that makes this durable.
    created: Option<Id>,
    durable: bool,
}

/// What a crash did to the pending name operations.
pub struct Rolled {
    pub pending: usize,
    pub kept: usize,
    /// The first undo that failed (the rollback goes on with the others).
    pub error: Option<String>,
}

pub struct Names {
    backing: PathBuf,
    ops: Vec<Op>,
    next_seq: u64,
    next_grave: u64,
}

fn id_of(path: &Path) -> std::io::Result<Id> {
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.dev(), m.ino()))
}

fn rename2(from: &Path, to: &Path, flags: u32) -> Result<(), Errno> {
    let (a, b) = (cpath(from)?, cpath(to)?);
    // SAFETY: valid C strings; renameat2 is atomic on the backing file system, which is
    // what makes the mount's rename atomic.
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

impl Names {
    /// Starts with an empty graveyard: what a previous faultfs left there was removed (a
    /// faultfs stopped is not a power cut).
    pub fn new(backing: &Path) -> std::io::Result<Names> {
        let grave = backing.join(GRAVE);
        match std::fs::remove_dir_all(&grave) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir(&grave)?;
        Ok(Names {
            backing: backing.to_path_buf(),
            ops: Vec::new(),
            next_seq: 0,
            next_grave: 0,
        })
    }

    /// Whether `name` in the root is the graveyard, which the mount does not show.
    pub fn hidden(parent_is_root: bool, name: &OsStr) -> bool {
        parent_is_root && name.as_bytes() == GRAVE.as_bytes()
    }

    /// The number the next operation gets: an fsync arriving now covers those below it.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn pending(&self) -> usize {
        self.ops.len()
    }

    fn real(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    /// The entry `rel` names: (its directory's id, its name).
    fn entry(&self, rel: &Path) -> Result<(Id, OsString), Errno> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().ok_or(Errno::EINVAL)?;
        Ok((id_of(&self.real(parent))?, name.to_os_string()))
    }

    /// The ids of every directory above `rel`, the root included.
    fn ancestors(&self, rel: &Path) -> Result<Vec<Id>, Errno> {
        let mut out = Vec::new();
        let mut dir = rel.parent();
        while let Some(d) = dir {
            out.push(id_of(&self.real(d))?);
            dir = d.parent();
        }
        Ok(out)
    }

    fn op(&mut self, undo: Undo, rels: &[&Path]) -> Result<Op, Errno> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut entries = Vec::new();
        let mut needs = Vec::new();
        for rel in rels {
            entries.push(self.entry(rel)?);
            needs.extend(self.ancestors(rel)?);
        }
        Ok(Op {
            seq,
            undo,
            entries,
            needs,
            moves: Vec::new(),
            created: None,
            durable: false,
        })
    }

    /// A free path in the graveyard.
    fn grave_slot(&mut self) -> PathBuf {
        self.next_grave += 1;
        self.real(Path::new(GRAVE))
            .join(self.next_grave.to_string())
    }

    /// `rel` was just created (a file, a symlink, or a directory when `dir`).
    pub fn made(&mut self, rel: &Path, dir: bool) -> Result<(), Errno> {
        let id = id_of(&self.real(rel))?;
        let undo = Undo::Made {
            path: rel.to_path_buf(),
            dir,
        };
        let mut op = self.op(undo, &[rel])?;
        op.created = Some(id);
        if dir {
            op.moves.push(id);
        }
        self.ops.push(op);
        Ok(())
    }

    /// unlink (`dir` false) or rmdir of `rel`: the object goes to the graveyard.
    pub fn remove(&mut self, rel: &Path, dir: bool) -> Result<(), Errno> {
        let real = self.real(rel);
        let m = std::fs::symlink_metadata(&real)?;
        match (dir, m.is_dir()) {
            (false, true) => return Err(Errno::EISDIR),
            (true, false) => return Err(Errno::ENOTDIR),
            (true, true) if std::fs::read_dir(&real)?.next().is_some() => {
                return Err(Errno::ENOTEMPTY)
            }
            _ => {}
        }
        let kept = self.grave_slot();
        let undo = Undo::Removed {
            path: rel.to_path_buf(),
            kept: kept.clone(),
        };
        let mut op = self.op(undo, &[rel])?;
        if dir {
            op.moves.push((m.dev(), m.ino()));
        }
        rename2(&real, &kept, libc::RENAME_NOREPLACE)?;
        self.ops.push(op);
        Ok(())
    }

    /// rename(2) of `a` to `b` with `flags`; what `b` named goes to the graveyard.
    pub fn rename(&mut self, a: &Path, b: &Path, flags: RenameFlags) -> Result<(), Errno> {
        let (ra, rb) = (self.real(a), self.real(b));
        let from = std::fs::symlink_metadata(&ra)?;
        let mut moves = Vec::new();
        if from.is_dir() {
            moves.push((from.dev(), from.ino()));
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let to = std::fs::symlink_metadata(&rb)?;
            if to.is_dir() {
                moves.push((to.dev(), to.ino()));
            }
            let undo = Undo::Exchanged {
                a: a.to_path_buf(),
                b: b.to_path_buf(),
            };
            let mut op = self.op(undo, &[a, b])?;
            rename2(&ra, &rb, flags.bits())?;
            op.moves = moves;
            self.ops.push(op);
            return Ok(());
        }
        let replaced = match std::fs::symlink_metadata(&rb) {
            Ok(_) if flags.contains(RenameFlags::RENAME_NOREPLACE) => return Err(Errno::EEXIST),
            // Two names of one object: rename(2) does nothing.
            Ok(to) if (to.dev(), to.ino()) == (from.dev(), from.ino()) => return Ok(()),
            Ok(to) => {
                match (from.is_dir(), to.is_dir()) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if std::fs::read_dir(&rb)?.next().is_some() => {
                        return Err(Errno::ENOTEMPTY)
                    }
                    _ => {}
                }
                if to.is_dir() {
                    moves.push((to.dev(), to.ino()));
                }
                Some(self.grave_slot())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let undo = Undo::Renamed {
            from: a.to_path_buf(),
            to: b.to_path_buf(),
            replaced: replaced.clone(),
        };
        let mut op = self.op(undo, &[a, b])?;
        op.moves = moves;
        if let Some(kept) = &replaced {
            rename2(&rb, kept, libc::RENAME_NOREPLACE)?;
        }
        let bits = flags.bits() | libc::RENAME_NOREPLACE;
        if let Err(e) = rename2(&ra, &rb, bits) {
            if let Some(kept) = &replaced {
                // Put the target back: the rename did not happen.
                let _ = rename2(kept, &rb, libc::RENAME_NOREPLACE);
            }
            return Err(e);
        }
        self.ops.push(op);
        Ok(())
    }

    /// An fsync of `id` (a directory when `dir`) completed, covering the operations that
    /// arrived before `barrier`: those in that directory, and the object's own creation.
    pub fn synced(&mut self, id: Id, dir: bool, barrier: u64) {
        let mut any = false;
        for op in self.ops.iter_mut().filter(|op| op.seq < barrier) {
            if op.created == Some(id) || (dir && op.entries.iter().any(|(d, _)| *d == id)) {
                op.durable = true;
                any = true;
            }
        }
        if any {
            self.settle();
        }
    }

    /// Makes durable every operation a durable one depends on, then forgets the durable
    /// ones: what they removed is gone for good.
    fn settle(&mut self) {
        let mut entries: HashSet<(Id, OsString)> = HashSet::new();
        let mut needs: HashSet<Id> = HashSet::new();
        let mut moves: HashSet<Id> = HashSet::new();
        // Newest first: an operation's durability is final once every newer one is seen.
        for op in self.ops.iter_mut().rev() {
            op.durable = op.durable
                || op.entries.iter().any(|e| entries.contains(e))
                || op.moves.iter().any(|d| needs.contains(d))
                || op.needs.iter().any(|d| moves.contains(d));
            if op.durable {
                entries.extend(op.entries.iter().cloned());
                needs.extend(op.needs.iter().copied());
                moves.extend(op.moves.iter().copied());
            }
        }
        let (durable, pending) = std::mem::take(&mut self.ops)
            .into_iter()
            .partition(|op| op.durable);
        self.ops = pending;
        for op in durable {
            forget(op);
        }
    }

    /// The power cut: the oldest `keep` pending operations survive (a journal commits in
    /// order), the others are undone, newest first. `inodes` follows the paths back.
    pub fn rollback(&mut self, keep: usize, inodes: &mut Inodes) -> Rolled {
        let pending = self.ops.len();
        let keep = keep.min(pending);
        let undone = self.ops.split_off(keep);
        let mut error = None;
        for op in undone.into_iter().rev() {
            if let Err(e) = self.undo(op.undo, inodes) {
                error.get_or_insert(e);
            }
        }
        for op in std::mem::take(&mut self.ops) {
            forget(op);
        }
        Rolled {
            pending,
            kept: keep,
            error,
        }
    }

    fn undo(&self, undo: Undo, inodes: &mut Inodes) -> Result<(), String> {
        let fail = |what: &str, p: &Path, e: Errno| {
            let e = std::io::Error::from_raw_os_error(e.code());
            format!("{what} {}: {e}", p.display())
        };
        match undo {
            Undo::Made { path, dir } => {
                let real = self.real(&path);
                let r = if dir {
                    std::fs::remove_dir(&real)
                } else {
                    std::fs::remove_file(&real)
                };
                r.map_err(|e| fail("removing", &path, e.into()))?;
                inodes.unlinked(&path);
            }
            Undo::Removed { path, kept } => {
                rename2(&kept, &self.real(&path), libc::RENAME_NOREPLACE)
                    .map_err(|e| fail("restoring", &path, e))?;
            }
            Undo::Renamed { from, to, replaced } => {
                rename2(&self.real(&to), &self.real(&from), libc::RENAME_NOREPLACE)
                    .map_err(|e| fail("renaming back", &to, e))?;
                inodes.renamed(&to, &from);
                if let Some(kept) = replaced {
                    rename2(&kept, &self.real(&to), libc::RENAME_NOREPLACE)
                        .map_err(|e| fail("restoring", &to, e))?;
                }
            }
            Undo::Exchanged { a, b } => {
                rename2(&self.real(&a), &self.real(&b), libc::RENAME_EXCHANGE)
                    .map_err(|e| fail("exchanging back", &a, e))?;
                inodes.exchanged(&a, &b);
            }
        }
        Ok(())
    }
}

/// A durable operation: what it removed leaves the graveyard (an open file lives on in
/// its descriptors).
fn forget(op: Op) {
    let kept = match op.undo {
        Undo::Removed { kept, .. } => Some(kept),
        Undo::Renamed { replaced, .. } => replaced,
        _ => None,
    };
    if let Some(kept) = kept {
        let gone = match std::fs::symlink_metadata(&kept) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&kept),
            _ => std::fs::remove_file(&kept),
        };
        if let Err(e) = gone {
            eprintln!("faultfs: removing {}: {e}", kept.display());
        }
    }
}
