//! The namespace and attributes: lookup, getattr/setattr, mkdir, unlink, rename, readdir,
//! statfs. These act on the backing directory at once. Attributes (sizes, modes, times) are
//! durable when they return; names only once their directory is synced: names.rs records
//! each name operation so that a crash can take it back (docs/faultfs.md).

use std::ffi::{CString, OsStr};
use std::fs::Metadata;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, RenameFlags, TimeOrNow};

use crate::handles::DirEntry;
use crate::inodes::ROOT;
use crate::names::Names;
use crate::state::{Shared, State};

/// How long the kernel may cache attributes and names: not at all. A crash changes sizes
/// behind the kernel's back, and a cached size would make the next O_APPEND write land
/// past the end of the surviving data.
pub const TTL: Duration = Duration::ZERO;

fn time(secs: i64, nanos: i64) -> SystemTime {
    let t = UNIX_EPOCH + Duration::from_nanos(nanos as u64);
    if secs >= 0 {
        t + Duration::from_secs(secs as u64)
    } else {
        t - Duration::from_secs(secs.unsigned_abs())
    }
}

pub fn kind(ft: std::fs::FileType) -> FileType {
    FileType::from_std(ft).unwrap_or(FileType::RegularFile)
}

/// The attributes of `ino` from its backing metadata; a regular file is as long as its
/// pending writes make it.
pub fn attr(st: &State, ino: u64, m: &Metadata) -> FileAttr {
    let size = if m.is_file() {
        m.len().max(st.cache.end(ino))
    } else {
        m.len()
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind(m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

pub fn cpath(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// The last OS error of a libc call that returned `r`.
pub fn check(r: libc::c_int) -> Result<(), Errno> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().into())
    }
}

/// Metadata of `ino`: through the open handle when there is one (an unlinked file has
/// no path), else by path.
fn metadata(sh: &Shared, st: &State, ino: u64, fh: Option<u64>) -> Result<Metadata, Errno> {
    if let Some(h) = fh.and_then(|fh| st.handles.file(fh)) {
        return Ok(h.file.metadata()?);
    }
    match st.inodes.path(ino) {
        Ok(rel) => Ok(std::fs::symlink_metadata(sh.real(rel))?),
        Err(e) => match st.inodes.get(ino).and_then(|i| i.writer.clone()) {
            Some(w) => Ok(w.metadata()?),
            None => Err(e),
        },
    }
}

/// Gives a new file to the caller (faultfs runs as root; a caller that is not would
/// otherwise find its new files owned by root).
fn own(real: &Path, uid: u32, gid: u32) -> Result<(), Errno> {
    // SAFETY: plain getters.
    if uid != unsafe { libc::geteuid() } || gid != unsafe { libc::getegid() } {
        std::os::unix::fs::lchown(real, Some(uid), Some(gid))?;
    }
    Ok(())
}

pub fn lookup(sh: &Shared, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
    let mut st = sh.live()?;
    let rel = st.inodes.child(parent, name)?;
    let m = std::fs::symlink_metadata(sh.real(&rel))?;
    let ino = st.inodes.found(rel, (m.dev(), m.ino()));
    Ok(attr(&st, ino, &m))
}

/// A new entry at `rel`, after the caller created it: its inode and attributes.
pub fn created(
    sh: &Shared,
    st: &mut State,
    rel: std::path::PathBuf,
    uid: u32,
    gid: u32,
) -> Result<FileAttr, Errno> {
    let real = sh.real(&rel);
    own(&real, uid, gid)?;
    let m = std::fs::symlink_metadata(&real)?;
    let ino = st.inodes.found(rel, (m.dev(), m.ino()));
    Ok(attr(st, ino, &m))
}

pub fn getattr(sh: &Shared, ino: u64, fh: Option<u64>) -> Result<FileAttr, Errno> {
    let st = sh.live()?;
    let m = metadata(sh, &st, ino, fh)?;
    Ok(attr(&st, ino, &m))
}

/// What a setattr asks to change.
pub struct Change {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, libc::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, libc::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            (
                d.as_secs() as libc::time_t,
                d.subsec_nanos() as libc::c_long,
            )
        }
    };
    libc::timespec { tv_sec, tv_nsec }
}

pub fn setattr(sh: &Shared, ino: u64, fh: Option<u64>, c: Change) -> Result<FileAttr, Errno> {
    let mut st = sh.live()?;
    let real = st.inodes.path(ino).map(|rel| sh.real(rel));
    let file = fh
        .and_then(|fh| st.handles.file(fh))
        .map(|h| h.file.clone())
        .or_else(|| st.inodes.get(ino).and_then(|i| i.writer.clone()));
    if let Some(size) = c.size {
        // A truncation is metadata: on the backing file at once. Pending bytes past the
        // new end go with it.
        match (&file, &real) {
            (Some(f), _) => f.set_len(size)?,
            (None, Ok(p)) => check(unsafe { libc::truncate(cpath(p)?.as_ptr(), size as i64) })?,
            (None, Err(e)) => return Err(*e),
        }
        st.cache.clip(ino, size);
    }
    if let Some(mode) = c.mode {
        let perm = std::fs::Permissions::from_mode(mode & 0o7777);
        match (&file, &real) {
            (Some(f), _) => f.set_permissions(perm)?,
            (None, Ok(p)) => std::fs::set_permissions(p, perm)?,
            (None, Err(e)) => return Err(*e),
        }
    }
    if c.uid.is_some() || c.gid.is_some() {
        match (&file, &real) {
            (Some(f), _) => std::os::unix::fs::fchown(f.as_ref(), c.uid, c.gid)?,
            (None, Ok(p)) => std::os::unix::fs::lchown(p, c.uid, c.gid)?,
            (None, Err(e)) => return Err(*e),
        }
    }
    if c.atime.is_some() || c.mtime.is_some() {
        let times = [timespec(c.atime), timespec(c.mtime)];
        let p = cpath(real.as_ref().map_err(|e| *e)?)?;
        // SAFETY: a valid C string and a two-element array, as utimensat wants.
        check(unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                p.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
    }
    let m = metadata(sh, &st, ino, fh)?;
    Ok(attr(&st, ino, &m))
}

pub fn mkdir(
    sh: &Shared,
    parent: u64,
    name: &OsStr,
    mode: u32,
    uid: u32,
    gid: u32,
) -> Result<FileAttr, Errno> {
    let mut st = sh.live()?;
    let rel = st.inodes.child(parent, name)?;
    // The kernel has applied the caller's umask already (faultfs's own is 0).
    std::fs::DirBuilder::new()
        .mode(mode & 0o7777)
        .create(sh.real(&rel))?;
    st.names.made(&rel, true)?;
    created(sh, &mut st, rel, uid, gid)
}

pub fn symlink(
    sh: &Shared,
    parent: u64,
    name: &OsStr,
    target: &Path,
    uid: u32,
    gid: u32,
) -> Result<FileAttr, Errno> {
    let mut st = sh.live()?;
    let rel = st.inodes.child(parent, name)?;
    std::os::unix::fs::symlink(target, sh.real(&rel))?;
    st.names.made(&rel, false)?;
    created(sh, &mut st, rel, uid, gid)
}

pub fn readlink(sh: &Shared, ino: u64) -> Result<Vec<u8>, Errno> {
    let st = sh.live()?;
    let target = std::fs::read_link(sh.real(st.inodes.path(ino)?))?;
    Ok(target.into_os_string().into_vec())
}

/// unlink (`dir` false) or rmdir.
pub fn remove(sh: &Shared, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
    let mut st = sh.live()?;
    let rel = st.inodes.child(parent, name)?;
    st.names.remove(&rel, dir)?;
    // An open unlinked file keeps its handles, writer and pending writes until closed.
    st.inodes.unlinked(&rel);
    Ok(())
}

pub fn rename(
    sh: &Shared,
    from: (u64, &OsStr),
    to: (u64, &OsStr),
    flags: RenameFlags,
) -> Result<(), Errno> {
    let mut st = sh.live()?;
    let a = st.inodes.child(from.0, from.1)?;
    let b = st.inodes.child(to.0, to.1)?;
    st.names.rename(&a, &b, flags)?;
    if flags.contains(RenameFlags::RENAME_EXCHANGE) {
        st.inodes.exchanged(&a, &b);
    } else {
        st.inodes.renamed(&a, &b);
    }
    Ok(())
}

/// The entries of directory `ino`, "." and ".." first, listed once at opendir.
pub fn list(sh: &Shared, ino: u64) -> Result<Vec<DirEntry>, Errno> {
    let st = sh.live()?;
    let rel = st.inodes.path(ino)?.to_path_buf();
    let mut out = vec![
        DirEntry {
            ino,
            kind: FileType::Directory,
            name: ".".into(),
        },
        DirEntry {
            ino,
            kind: FileType::Directory,
            name: "..".into(),
        },
    ];
    for e in std::fs::read_dir(sh.real(&rel))? {
        let e = e?;
        let name = e.file_name();
        if Names::hidden(ino == ROOT, &name) {
            continue;
        }
        // Only the numbers faultfs handed out mean anything to the kernel; an entry not
        // looked up yet shows its backing number, which is as good for d_ino.
        let ino = st
            .inodes
            .ino_of(&rel.join(&name))
            .unwrap_or_else(|| e.ino());
        out.push(DirEntry {
            ino,
            kind: kind(e.file_type()?),
            name,
        });
    }
    Ok(out)
}

/// The backing file system's figures: walrus's disk watermarks read free space here.
pub fn statfs(sh: &Shared) -> Result<libc::statvfs, Errno> {
    drop(sh.live()?);
    let p = cpath(&sh.backing)?;
    // SAFETY: statvfs fills the zeroed struct we own.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(p.as_ptr(), &mut s) })?;
    Ok(s)
}
