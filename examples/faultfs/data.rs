//! File data: open/create, read, write, fsync, fallocate, release. This is where the
//! durability model lives: writes go to the cache (cache.rs), syncs and synchronous writes
//! move them to the backing file, and every write and sync completes through the scheduler
//! (sched.rs) so that latency and stalls do not hold the request loop.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use fuser::{Errno, FileAttr, FopenFlags, ReplyEmpty, ReplyWrite};

use crate::faults::Op;
use crate::handles::OpenFile;
use crate::meta;
use crate::state::{Shared, State};

/// Every open bypasses the kernel's page cache (FOPEN_DIRECT_IO): the cache that can be
/// lost is ours, and the kernel's would keep showing dropped bytes after a crash. Direct
/// writes to one file may run in parallel (FOPEN_PARALLEL_DIRECT_WRITES), or the kernel
/// would serialize them on the inode lock and concurrent writes could never overlap.
pub fn fopen_flags() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
}

/// Opens the backing file for a caller's open `flags`. Without O_DIRECT (the kernel may
/// hand us unaligned buffers, and the backing file system may refuse it: tmpfs does),
/// without O_SYNC/O_DSYNC (durability is the cache's business) and without O_APPEND (the
/// kernel turns appends into offsets, which pwrite under O_APPEND would ignore).
fn open_backing(path: &Path, flags: i32, create: Option<u32>) -> Result<File, Errno> {
    let acc = flags & libc::O_ACCMODE;
    let mut o = std::fs::OpenOptions::new();
    o.read(acc != libc::O_WRONLY).write(acc != libc::O_RDONLY);
    if let Some(mode) = create {
        if flags & libc::O_EXCL != 0 {
            o.create_new(true);
        } else {
            o.create(true);
        }
        o.mode(mode & 0o7777);
    }
    o.custom_flags(flags & libc::O_NOFOLLOW);
    Ok(o.open(path)?)
}

/// Records an open handle of `ino`; a writable one also serves as the inode's writer.
fn register(st: &mut State, ino: u64, file: File, flags: i32) -> u64 {
    let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
    let file = Arc::new(file);
    if let Some(inode) = st.inodes.get_mut(ino) {
        inode.opens += 1;
        if writable && inode.writer.is_none() {
            inode.writer = Some(file.clone());
        }
    }
    st.handles.open_file(OpenFile {
        file,
        // O_SYNC is O_DSYNC plus a bit on Linux: either makes every write durable.
        sync: flags & libc::O_DSYNC != 0,
        writable,
    })
}

/// O_TRUNC at open: a truncation, applied like setattr's.
fn truncate_at_open(st: &mut State, ino: u64, fh: u64) -> Result<(), Errno> {
    if let Some(h) = st.handles.file(fh) {
        h.file.set_len(0)?;
    }
    st.cache.clip(ino, 0);
    Ok(())
}

pub fn open(sh: &Shared, ino: u64, flags: i32) -> Result<u64, Errno> {
    let mut st = sh.live()?;
    let real = sh.real(st.inodes.path(ino)?);
    let file = open_backing(&real, flags, None)?;
    let fh = register(&mut st, ino, file, flags);
    if flags & libc::O_TRUNC != 0 {
        truncate_at_open(&mut st, ino, fh)?;
    }
    Ok(fh)
}

pub fn create(
    sh: &Shared,
    parent: u64,
    name: &OsStr,
    mode: u32,
    flags: i32,
    owner: (u32, u32),
) -> Result<(FileAttr, u64), Errno> {
    let mut st = sh.live()?;
    let rel = st.inodes.child(parent, name)?;
    let real = sh.real(&rel);
    let existed = std::fs::symlink_metadata(&real).is_ok();
    let file = open_backing(&real, flags, Some(mode))?;
    if !existed {
        st.names.made(&rel, false)?;
    }
    let attr = meta::created(sh, &mut st, rel, owner.0, owner.1)?;
    let ino = attr.ino.0;
    let fh = register(&mut st, ino, file, flags);
    if flags & libc::O_TRUNC != 0 {
        truncate_at_open(&mut st, ino, fh)?;
    }
    Ok((attr, fh))
}

pub fn release(sh: &Shared, ino: u64, fh: u64) {
    // Not `live`: a crashed mount still has to let go of its handles.
    let mut st = sh.lock();
    if st.handles.close_file(fh).is_some() {
        if let Some(inode) = st.inodes.get_mut(ino) {
            inode.opens = inode.opens.saturating_sub(1);
        }
    }
    let pending = st.cache.has(ino);
    st.inodes.tidy(ino, pending);
}

/// The file's bytes as a reader sees them: the backing file with the pending writes
/// laid over it.
pub fn read(sh: &Shared, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
    let st = sh.live()?;
    let h = st.handles.file(fh).ok_or(Errno::EBADF)?;
    let len = h.file.metadata()?.len().max(st.cache.end(ino));
    if offset >= len {
        return Ok(Vec::new());
    }
    let mut buf = vec![0; (len - offset).min(u64::from(size)) as usize];
    let mut done = 0;
    while done < buf.len() {
        // Short of the logical length, the backing file ends early: zeros (the pending
        // writes that extend it are laid over them next).
        match h.file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    st.cache.overlay(ino, offset, &mut buf);
    Ok(buf)
}

/// A write: into the cache at once (readers see it), durable at its reply when the file
/// was opened O_SYNC/O_DSYNC or the write carries RWF_DSYNC (the kernel passes either
/// as `flags`), replied after the latency when synchronous, held while stalled.
pub fn write(
    sh: &Arc<Shared>,
    ino: u64,
    fh: u64,
    offset: u64,
    data: &[u8],
    flags: i32,
    reply: ReplyWrite,
) {
    let queued = (|| {
        let mut st = sh.live()?;
        let h = st.handles.file(fh).ok_or(Errno::EBADF)?;
        if !h.writable {
            return Err(Errno::EBADF);
        }
        let sync = h.sync || flags & libc::O_DSYNC != 0;
        let file = h.file.clone();
        st.stats.writes += 1;
        let path = st.inodes.display(ino);
        if let Some(fired) = st.faults.fire(Op::Write, &path) {
            st.stats.faults += 1;
            return Err(Errno::from_i32(fired.errno));
        }
        // The handle that wrote may be closed before a sync: keep a writer.
        if let Some(inode) = st.inodes.get_mut(ino) {
            inode.writer.get_or_insert(file);
        }
        let seq = st.cache.add(ino, offset, data.to_vec());
        let delay = if sync {
            st.faults.latency
        } else {
            Default::default()
        };
        let names = st.names.next_seq();
        Ok((sync, seq, names, st.epoch, Instant::now() + delay))
    })();
    let (sync, seq, names, epoch, deadline) = match queued {
        Ok(q) => q,
        Err(e) => return reply.error(e),
    };
    let len = data.len() as u32;
    let shared = sh.clone();
    sh.sched.submit(
        deadline,
        Box::new(move || {
            let done = {
                let mut st = shared.lock();
                if st.epoch != epoch {
                    // A crash came first: the write is lost (or torn), and says so.
                    Err(Errno::EIO)
                } else if sync {
                    // As an fsync of the file: its own creation is durable too.
                    let data = st.persist_write(ino, seq);
                    data.map(|()| st.persist_names(ino, false, names))
                } else {
                    Ok(())
                }
            };
            match done {
                Ok(()) => reply.written(len),
                Err(e) => reply.error(e),
            }
        }),
    );
}

/// fsync/fdatasync of a file or a directory (`dir`). Every write and every name operation
/// in the directory that arrived before it is durable at its reply, and so is the file's
/// or directory's own creation (names.rs); what arrives during its latency is not
/// covered.
pub fn fsync(sh: &Arc<Shared>, ino: u64, dir: bool, reply: ReplyEmpty) {
    let queued = (|| {
        let mut st = sh.live()?;
        st.stats.syncs += 1;
        let path = st.inodes.display(ino);
        if let Some(fired) = st.faults.fire(Op::Sync, &path) {
            st.stats.faults += 1;
            // By default the writes stay pending and a later sync may still make them
            // durable; with `lose`, as Linux after a writeback error, they never will.
            if fired.lose && !dir {
                let now = st.cache.next_seq();
                st.cache.lose_before(ino, now);
            }
            return Err(Errno::from_i32(fired.errno));
        }
        Ok((
            st.cache.next_seq(),
            st.names.next_seq(),
            st.epoch,
            Instant::now() + st.faults.latency,
        ))
    })();
    let (barrier, names, epoch, deadline) = match queued {
        Ok(q) => q,
        Err(e) => return reply.error(e),
    };
    let shared = sh.clone();
    sh.sched.submit(
        deadline,
        Box::new(move || {
            let done = {
                let mut st = shared.lock();
                if st.epoch != epoch {
                    Err(Errno::EIO)
                } else {
                    let data = if dir {
                        Ok(())
                    } else {
                        st.persist_before(ino, barrier)
                    };
                    data.map(|()| st.persist_names(ino, dir, names))
                }
            };
            match done {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        }),
    );
}

/// fallocate: metadata, on the backing file at once. Punching a hole or zeroing a range
/// also discards the pending bytes there (they are older than the zeros).
pub fn fallocate(
    sh: &Shared,
    ino: u64,
    fh: u64,
    offset: u64,
    length: u64,
    mode: i32,
) -> Result<(), Errno> {
    let mut st = sh.live()?;
    // Shifting ranges would move pending writes under their offsets: not modelled.
    if mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    let h = st.handles.file(fh).ok_or(Errno::EBADF)?;
    // SAFETY: fallocate on a descriptor the handle owns.
    meta::check(unsafe {
        libc::fallocate(h.file.as_raw_fd(), mode, offset as i64, length as i64)
    })?;
    if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
        let now = st.cache.next_seq();
        st.cache.supersede(ino, offset, offset + length, now);
    }
    Ok(())
}
