//! Open files and directories: what a FUSE file handle (`fh`) stands for.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::sync::Arc;

use fuser::FileType;

pub struct OpenFile {
    /// The backing file, opened without O_DIRECT, O_SYNC, O_DSYNC or O_APPEND: the cache
    /// decides durability, and the kernel has already turned appends into offsets.
    pub file: Arc<File>,
    /// Opened O_SYNC or O_DSYNC: every write through it is durable when it returns.
    pub sync: bool,
    pub writable: bool,
}

/// One directory entry as `readdir` returns it.
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileType,
    pub name: OsString,
}

#[derive(Default)]
pub struct Handles {
    files: HashMap<u64, OpenFile>,
    /// A directory's entries, listed once at opendir: readdir's offsets index into it.
    dirs: HashMap<u64, Vec<DirEntry>>,
    next: u64,
}

impl Handles {
    pub fn open_file(&mut self, f: OpenFile) -> u64 {
        let fh = self.fresh();
        self.files.insert(fh, f);
        fh
    }

    pub fn file(&self, fh: u64) -> Option<&OpenFile> {
        self.files.get(&fh)
    }

    pub fn close_file(&mut self, fh: u64) -> Option<OpenFile> {
        self.files.remove(&fh)
    }

    pub fn open_dir(&mut self, entries: Vec<DirEntry>) -> u64 {
        let fh = self.fresh();
        self.dirs.insert(fh, entries);
        fh
    }

    pub fn dir(&self, fh: u64) -> Option<&[DirEntry]> {
        self.dirs.get(&fh).map(Vec::as_slice)
    }

    pub fn close_dir(&mut self, fh: u64) {
        self.dirs.remove(&fh);
    }

    fn fresh(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}
