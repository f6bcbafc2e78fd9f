//! The fuser `Filesystem`: each request handed to meta.rs (namespace, attributes) or
//! data.rs (file data), and its result turned into the reply.
//!
//! Not implemented, so the kernel's own handling applies: flock and POSIX locks (without
//! FUSE_FLOCK_LOCKS / FUSE_POSIX_LOCKS the kernel keeps them itself, which is right for
//! processes of one machine: walrus's LOCK file works), access (the kernel checks modes,
//! `default_permissions`), lseek's SEEK_DATA/SEEK_HOLE (generic), copy_file_range (the
//! caller falls back to reads and writes, which come here). Hard links, mknod and xattrs
//! are refused.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    BsdFileFlags, Errno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::data;
use crate::meta::{self, TTL};
use crate::state::Shared;

pub struct FaultFs {
    pub sh: Arc<Shared>,
}

fn entry(reply: ReplyEntry, r: Result<fuser::FileAttr, Errno>) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl FaultFs {
    /// Answers a metadata request now, or, while frozen, as a job the stall holds.
    fn meta(&self, answer: impl FnOnce(&Shared) + Send + 'static) {
        if self.sh.sched.frozen() {
            let sh = self.sh.clone();
            self.sh
                .sched
                .submit(std::time::Instant::now(), Box::new(move || answer(&sh)));
        } else {
            answer(&self.sh);
        }
    }
}

impl Filesystem for FaultFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Room for many requests in flight at once: background requests (async direct
        // I/O, which io_uring's O_DIRECT writes become) queue in the kernel past this.
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        // Async direct I/O: an io_uring (or AIO) O_DIRECT write is sent without blocking
        // the submitting io-wq worker, so several overlap as they do on a disk.
        if config.capabilities().contains(InitFlags::FUSE_ASYNC_DIO) {
            let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.to_owned();
        self.meta(move |sh| entry(reply, meta::lookup(sh, parent.0, &name)));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut st = self.sh.lock();
        let pending = st.cache.has(ino.0);
        st.inodes.forget(ino.0, nlookup, pending);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.meta(move |sh| match meta::getattr(sh, ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = meta::Change {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match meta::setattr(&self.sh, ino.0, fh.map(|f| f.0), change) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match meta::readlink(&self.sh, ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = meta::mkdir(&self.sh, parent.0, name, mode, req.uid(), req.gid());
        entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, meta::remove(&self.sh, parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, meta::remove(&self.sh, parent.0, name, true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = meta::symlink(&self.sh, parent.0, link_name, target, req.uid(), req.gid());
        entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = meta::rename(&self.sh, (parent.0, name), (newparent.0, newname), flags);
        empty(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match data::open(&self.sh, ino.0, flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), data::fopen_flags()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match data::read(&self.sh, ino.0, fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        data::write(&self.sh, ino.0, fh.0, offset, data, flags.0, reply);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() does not sync: nothing to do but report a crash.
        empty(reply, self.sh.live().map(drop));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        data::release(&self.sh, ino.0, fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        data::fsync(&self.sh, ino.0, false, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match meta::list(&self.sh, ino.0) {
            Ok(entries) => {
                let fh = self.sh.lock().handles.open_dir(entries);
                reply.opened(FileHandle(fh), fuser::FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let st = match self.sh.live() {
            Ok(st) => st,
            Err(e) => return reply.error(e),
        };
        let Some(entries) = st.handles.dir(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // The offset of an entry is its index plus one: where the next call resumes.
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(e.ino), i as u64 + 1, e.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.sh.lock().handles.close_dir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        data::fsync(&self.sh, ino.0, true, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.meta(move |sh| match meta::statfs(sh) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let owner = (req.uid(), req.gid());
        match data::create(&self.sh, parent.0, name, mode, flags, owner) {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                data::fopen_flags(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            data::fallocate(&self.sh, ino.0, fh.0, offset, length, mode),
        );
    }
}
