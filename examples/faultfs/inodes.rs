//! Inode numbers of the mount and the backing paths they stand for.
//!
//! faultfs hands out its own inode numbers (never reused while it runs) instead of the
//! backing file system's: pending writes are keyed by them, and a backing inode number can
//! be reused by a new file once the old one is unlinked. Each inode remembers the identity
//! (device, inode) of the backing file it was found as, so a path whose file was replaced
//! behind our back gets a new inode rather than the old one's pending writes.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::Errno;

use crate::names::Names;

pub const ROOT: u64 = 1;

pub struct Inode {
    /// Relative to the backing directory ("" for the root); None once unlinked.
    pub path: Option<PathBuf>,
    /// (st_dev, st_ino) of the backing file.
    pub id: (u64, u64),
    /// The kernel's references (lookups not yet forgotten).
    pub lookups: u64,
    /// Open file handles.
    pub opens: u32,
    /// A writable descriptor of the backing file, to make pending writes durable after the
    /// handle that wrote them is closed (a page cache outlives the descriptor too). Dropped
    /// once the file has neither open handles nor pending writes.
    pub writer: Option<Arc<File>>,
}

pub struct Inodes {
    by_ino: HashMap<u64, Inode>,
    by_path: HashMap<PathBuf, u64>,
    next: u64,
}

impl Inodes {
    pub fn new(root_id: (u64, u64)) -> Inodes {
        let root = Inode {
            path: Some(PathBuf::new()),
            id: root_id,
            lookups: 1,
            opens: 0,
            writer: None,
        };
        Inodes {
            by_ino: HashMap::from([(ROOT, root)]),
            by_path: HashMap::from([(PathBuf::new(), ROOT)]),
            next: ROOT + 1,
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Inode> {
        self.by_ino.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        self.by_ino.get_mut(&ino)
    }

    /// The backing-relative path of a linked inode.
    pub fn path(&self, ino: u64) -> Result<&Path, Errno> {
        match self.by_ino.get(&ino) {
            Some(Inode {
                path: Some(path), ..
            }) => Ok(path),
            Some(_) => Err(Errno::ENOENT),
            None => Err(Errno::ESTALE),
        }
    }

    /// The inode mapped at `path`, if the kernel has looked it up.
    pub fn ino_of(&self, path: &Path) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The path `name` in directory `parent`; none for the graveyard (names.rs), which
    /// the mount does not show.
    pub fn child(&self, parent: u64, name: &std::ffi::OsStr) -> Result<PathBuf, Errno> {
        if Names::hidden(parent == ROOT, name) {
            return Err(Errno::ENOENT);
        }
        Ok(self.path(parent)?.join(name))
    }

    /// The path as `fail ... path` matches it: from the mount's root, starting with `/`
    /// (empty for an unlinked file).
    pub fn display(&self, ino: u64) -> String {
        match self.path(ino) {
            Ok(p) => format!("/{}", p.display()),
            Err(_) => String::new(),
        }
    }

    /// The inode for the file just found (or created) at `path`, counting one more
    /// kernel reference.
    pub fn found(&mut self, path: PathBuf, id: (u64, u64)) -> u64 {
        if let Some(&ino) = self.by_path.get(&path) {
            let inode = self.by_ino.get_mut(&ino).expect("mapped inode");
            if inode.id == id {
                inode.lookups += 1;
                return ino;
            }
            // Replaced behind our back: the old inode lives on, unlinked.
            inode.path = None;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(
            ino,
            Inode {
                path: Some(path.clone()),
                id,
                lookups: 1,
                opens: 0,
                writer: None,
            },
        );
        self.by_path.insert(path, ino);
        ino
    }

    /// The kernel dropped `n` references. The inode goes once unreferenced, unopened and
    /// without pending writes (`pending` tells).
    pub fn forget(&mut self, ino: u64, n: u64, pending: bool) {
        let Some(inode) = self.by_ino.get_mut(&ino) else {
            return;
        };
        inode.lookups = inode.lookups.saturating_sub(n);
        self.tidy(ino, pending);
    }

    /// Drops what an inode no longer needs: its writer once neither open nor pending, the
    /// inode itself once also forgotten by the kernel.
    pub fn tidy(&mut self, ino: u64, pending: bool) {
        let Some(inode) = self.by_ino.get_mut(&ino) else {
            return;
        };
        if inode.opens == 0 && !pending {
            inode.writer = None;
            if inode.lookups == 0 && ino != ROOT {
                if let Some(path) = self.by_ino.remove(&ino).and_then(|i| i.path) {
                    if self.by_path.get(&path) == Some(&ino) {
                        self.by_path.remove(&path);
                    }
                }
            }
        }
    }

    /// `tidy` for every inode.
    pub fn tidy_all(&mut self, pending: impl Fn(u64) -> bool) {
        let inos: Vec<u64> = self.by_ino.keys().copied().collect();
        for ino in inos {
            self.tidy(ino, pending(ino));
        }
    }

    /// `path` was unlinked (or replaced by a rename onto it).
    pub fn unlinked(&mut self, path: &Path) {
        if let Some(ino) = self.by_path.remove(path) {
            if let Some(inode) = self.by_ino.get_mut(&ino) {
                inode.path = None;
            }
        }
    }

    /// `from` was renamed to `to` (replacing whatever was there): the inode at `from`
    /// and, for a directory, everything below it move along.
    pub fn renamed(&mut self, from: &Path, to: &Path) {
        self.unlinked(to);
        self.move_tree(from, to);
    }

    /// `a` and `b` swapped places (RENAME_EXCHANGE).
    pub fn exchanged(&mut self, a: &Path, b: &Path) {
        // Both trees leave the map before either comes back, or one would overwrite the other.
        let a_tree = self.take_tree(a);
        let b_tree = self.take_tree(b);
        self.put_tree(a_tree, a, b);
        self.put_tree(b_tree, b, a);
    }

    /// Moves the inodes at or below `from` to `to`.
    fn move_tree(&mut self, from: &Path, to: &Path) {
        let tree = self.take_tree(from);
        self.put_tree(tree, from, to);
    }

    /// Removes and returns the path mappings at or below `root`.
    fn take_tree(&mut self, root: &Path) -> Vec<(PathBuf, u64)> {
        let paths: Vec<PathBuf> = self
            .by_path
            .keys()
            .filter(|p| p.starts_with(root))
            .cloned()
            .collect();
        paths
            .into_iter()
            .filter_map(|p| self.by_path.remove(&p).map(|ino| (p, ino)))
            .collect()
    }

    /// Maps the inodes of `tree` (taken from under `from`) under `to`.
    fn put_tree(&mut self, tree: Vec<(PathBuf, u64)>, from: &Path, to: &Path) {
        for (old, ino) in tree {
            let below = old.strip_prefix(from).expect("taken from under `from`");
            // Not `to.join("")`: that appends a slash, and "file/" does not name a file.
            let new = if below.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(below)
            };
            if let Some(inode) = self.by_ino.get_mut(&ino) {
                inode.path = Some(new.clone());
            }
            self.by_path.insert(new, ino);
        }
    }
}
