//! faultfs itself (examples/faultfs, docs/faultfs.md): the passthrough does what walrus and
//! Valkey need, and each fault does what it says. Skipped (passing, with the reason
//! printed) where FUSE cannot be mounted.

use crate::common;

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use common::faultfs::{fields, FaultFs};
use common::{Raw, Valkey, START_TIMEOUT};

/// Opens `path` read-write with extra open flags, creating it when `create`.
fn open(path: &Path, flags: i32, create: bool) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .custom_flags(flags)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("not an OS error: {e}"))
}

/// A file holding `len` bytes of `byte`, synced.
fn synced_file(path: &Path, byte: u8, len: usize) {
    let f = open(path, 0, true);
    f.set_len(0).unwrap();
    f.write_all_at(&vec![byte; len], 0).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn passthrough_serves_what_walrus_and_valkey_do_on_files() {
    let Some(fs) = FaultFs::mount() else { return };
    let (m, b) = (fs.root(), fs.backing());

    // mkdir, create, write, read, readdir.
    std::fs::create_dir(m.join("d")).unwrap();
    std::fs::write(m.join("d/a"), b"abc").unwrap();
    assert_eq!(std::fs::read(m.join("d/a")).unwrap(), b"abc");
    let names: Vec<String> = std::fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["a"]);

    // rename over an existing file (the manifest/checkpoint pattern): atomic, and
    // metadata reaches the backing directory at once.
    std::fs::write(m.join("d/tmp"), b"new").unwrap();
    std::fs::rename(m.join("d/tmp"), m.join("d/a")).unwrap();
    assert_eq!(std::fs::read(m.join("d/a")).unwrap(), b"new");
    assert!(!m.join("d/tmp").exists());
    assert!(b.join("d/a").exists() && !b.join("d/tmp").exists());

    // set_len both ways; fallocate (mode 0 grows the file, on the backing file at once).
    let f = open(&m.join("d/a"), 0, false);
    f.set_len(10).unwrap();
    assert_eq!(std::fs::read(m.join("d/a")).unwrap(), b"new\0\0\0\0\0\0\0");
    f.set_len(2).unwrap();
    assert_eq!(std::fs::read(m.join("d/a")).unwrap(), b"ne");
    // SAFETY: fallocate on an open descriptor.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) };
    assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    assert_eq!(std::fs::metadata(b.join("d/a")).unwrap().len(), 1 << 20);
    drop(f);

    // fsync of a directory (after a rename, as the journal does).
    File::open(m.join("d")).unwrap().sync_all().unwrap();

    // flock, as walrus takes its journal's LOCK file: exclusive between two descriptors.
    let l1 = open(&m.join("LOCK"), 0, true);
    let l2 = open(&m.join("LOCK"), 0, false);
    // SAFETY: flock on open descriptors.
    assert_eq!(
        unsafe { libc::flock(l1.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    assert_eq!(
        unsafe { libc::flock(l2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        -1
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EWOULDBLOCK)
    );
    drop(l1);
    assert_eq!(
        unsafe { libc::flock(l2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    drop(l2);

    // statfs passes the backing file system's figures through (walrus's disk watermarks).
    let statvfs = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs fills the zeroed struct.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
        s
    };
    let (sm, sb) = (statvfs(&m), statvfs(&b));
    assert_eq!((sm.f_blocks, sm.f_frsize), (sb.f_blocks, sb.f_frsize));

    // walrus's O_DIRECT probe passes (faultfs accepts O_DIRECT; docs/faultfs.md).
    assert!(walrus::journal::io::probe_direct_io(&m));

    // unlink, rmdir.
    std::fs::remove_file(m.join("d/a")).unwrap();
    std::fs::remove_dir(m.join("d")).unwrap();
    assert!(!b.join("d").exists());
}

#[test]
fn crash_drops_unsynced_writes_keeps_synced_ones_and_fences_until_recover() {
    let Some(fs) = FaultFs::mount() else { return };
    let (m, b) = (fs.root(), fs.backing());
    let a = open(&m.join("a"), 0, true);
    a.write_all_at(b"synced", 0).unwrap();
    a.sync_data().unwrap();
    a.write_all_at(b"-later", 6).unwrap();
    std::fs::write(m.join("b"), b"lost").unwrap();

    // Readers see the cache; the backing directory (the disk) has only what was synced.
    assert_eq!(std::fs::read(m.join("a")).unwrap(), b"synced-later");
    assert_eq!(std::fs::read(m.join("b")).unwrap(), b"lost");
    assert_eq!(std::fs::read(b.join("a")).unwrap(), b"synced");
    assert_eq!(std::fs::read(b.join("b")).unwrap(), b"");
    assert_eq!(fs.status()["pending_writes"], 2);

    let crash = fields(&fs.ok("crash"));
    assert_eq!((crash["writes"], crash["kept_writes"]), (2, 0));
    // Fenced: every operation fails with EIO until recover.
    assert_eq!(
        errno(std::fs::metadata(m.join("a")).unwrap_err()),
        libc::EIO
    );
    assert_eq!(errno(std::fs::read(m.join("b")).unwrap_err()), libc::EIO);
    assert_eq!(errno(a.write_all_at(b"x", 0).unwrap_err()), libc::EIO);
    assert_eq!(
        errno(std::fs::write(m.join("c"), b"").unwrap_err()),
        libc::EIO
    );
    assert_eq!(errno(std::fs::read_dir(&m).unwrap_err()), libc::EIO);
    assert_eq!(fs.status()["fenced"], 1);
    drop(a);

    fs.ok("recover");
    // a's fdatasync made its creation durable too (as ext4 does for a new file); b's
    // name was never synced, so it is gone with its data.
    assert_eq!(std::fs::read(m.join("a")).unwrap(), b"synced");
    assert_eq!(errno(std::fs::read(m.join("b")).unwrap_err()), libc::ENOENT);
    assert_eq!((crash["names"], crash["kept_names"]), (1, 0));
    // The mount works again.
    std::fs::write(m.join("c"), b"after").unwrap();
    assert_eq!(std::fs::read(m.join("c")).unwrap(), b"after");
}

#[test]
fn pending_writes_follow_renames_and_outlive_their_descriptor() {
    let Some(fs) = FaultFs::mount() else { return };
    let (m, b) = (fs.root(), fs.backing());
    // The checkpoint pattern: write a temporary file, rename it into place (here its
    // directory too), sync it later through another descriptor.
    std::fs::create_dir(m.join("dir")).unwrap();
    let f = open(&m.join("dir/tmp"), 0, true);
    f.write_all_at(b"checkpoint", 0).unwrap();
    drop(f);
    std::fs::rename(m.join("dir/tmp"), m.join("dir/final")).unwrap();
    std::fs::rename(m.join("dir"), m.join("moved")).unwrap();
    assert_eq!(std::fs::read(m.join("moved/final")).unwrap(), b"checkpoint");
    assert_eq!(std::fs::read(b.join("moved/final")).unwrap(), b"");
    File::open(m.join("moved/final"))
        .unwrap()
        .sync_all()
        .unwrap();
    assert_eq!(std::fs::read(b.join("moved/final")).unwrap(), b"checkpoint");
    assert_eq!(fs.status()["pending_writes"], 0);
}

/// The names in directory `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

/// renameat2(a, b, RENAME_EXCHANGE), as walrus replaces its manifests.
fn exchange(a: &Path, b: &Path) {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (ca, cb) = (c(a), c(b));
    // SAFETY: two valid C strings.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
}

#[test]
fn name_operations_are_durable_once_their_directory_is_synced() {
    let Some(fs) = FaultFs::mount() else { return };
    let m = fs.root();
    let d = m.join("d");
    std::fs::create_dir(&d).unwrap();
    for (name, byte) in [("old", b'o'), ("gone", b'g'), ("tmp", b'n'), ("x", b'x')] {
        synced_file(&d.join(name), byte, 4);
    }
    // A file's data and name synced apart: the directory's fsync covers the name.
    let y = open(&d.join("y"), 0, true);
    y.write_all_at(b"yyyy", 0).unwrap();
    // Only y's name is pending: the synced files made theirs durable, and d's with them.
    assert_eq!(fs.status()["pending_names"], 1);
    sync_dir(&d);
    y.sync_data().unwrap();
    drop(y);
    sync_dir(&m);
    assert_eq!(fs.status()["pending_names"], 0);

    // Not synced: a rename over a file, an exchange, an unlink, a file created and a
    // directory made.
    std::fs::rename(d.join("tmp"), d.join("old")).unwrap();
    exchange(&d.join("x"), &d.join("y"));
    std::fs::remove_file(d.join("gone")).unwrap();
    std::fs::write(d.join("new"), b"").unwrap();
    std::fs::create_dir(m.join("sub")).unwrap();
    assert_eq!(fs.status()["pending_names"], 5);
    // Where a removed file waits for its removal to be durable is not shown.
    assert_eq!(names(&d), ["new", "old", "x", "y"]);
    assert_eq!(names(&m), ["d", "sub"]);
    let crash = fields(&fs.ok("crash"));
    assert_eq!((crash["names"], crash["kept_names"]), (5, 0));
    fs.ok("recover");
    assert_eq!(names(&m), ["d"]);
    assert_eq!(names(&d), ["gone", "old", "tmp", "x", "y"]);
    for (name, data) in [
        ("old", b"oooo"),
        ("tmp", b"nnnn"),
        ("gone", b"gggg"),
        ("x", b"xxxx"),
        ("y", b"yyyy"),
    ] {
        assert_eq!(std::fs::read(d.join(name)).unwrap(), data, "{name}");
    }

    // The same, with the directory synced: they stay.
    std::fs::rename(d.join("tmp"), d.join("old")).unwrap();
    exchange(&d.join("x"), &d.join("y"));
    std::fs::remove_file(d.join("gone")).unwrap();
    sync_dir(&d);
    assert_eq!(fs.status()["pending_names"], 0);
    fs.ok("crash");
    fs.ok("recover");
    assert_eq!(names(&d), ["old", "x", "y"]);
    assert_eq!(std::fs::read(d.join("old")).unwrap(), b"nnnn");
    assert_eq!(std::fs::read(d.join("x")).unwrap(), b"yyyy");

    // A new directory whose file was synced: the file's entry is durable, and so is the
    // directory's it depends on (ext4 syncs new parents too); nothing else of the root is.
    std::fs::create_dir(m.join("made")).unwrap();
    std::fs::write(m.join("loose"), b"").unwrap();
    synced_file(&m.join("made/f"), b'f', 4);
    assert_eq!(fs.status()["pending_names"], 1);
    fs.ok("crash");
    fs.ok("recover");
    assert_eq!(names(&m), ["d", "made"]);
    assert_eq!(std::fs::read(m.join("made/f")).unwrap(), b"ffff");

    // A directory's fsync that fails makes nothing durable.
    std::fs::rename(d.join("old"), d.join("renamed")).unwrap();
    fs.ok("fail sync EIO count 1 path /d");
    assert_eq!(
        errno(File::open(&d).unwrap().sync_all().unwrap_err()),
        libc::EIO
    );
    fs.ok("crash");
    fs.ok("recover");
    assert_eq!(names(&d), ["old", "x", "y"]);
}

#[test]
fn crash_reorder_keeps_the_oldest_name_operations() {
    let Some(fs) = FaultFs::mount() else { return };
    let d = fs.path("r");
    std::fs::create_dir(&d).unwrap();
    sync_dir(&fs.root());
    const N: usize = 6;
    let mut between = false;
    for seed in 1..=20 {
        for i in 0..N {
            synced_file(&d.join(format!("f{i}")), b'f', 1);
        }
        sync_dir(&d);
        for i in 0..N {
            std::fs::rename(d.join(format!("f{i}")), d.join(format!("g{i}"))).unwrap();
        }
        fs.ok(&format!("seed {seed}"));
        let crash = fields(&fs.ok("crash reorder"));
        fs.ok("recover");
        let kept = crash["kept_names"] as usize;
        assert_eq!(crash["names"] as usize, N);
        // A prefix, in order: a journal commits in order.
        let want: Vec<String> = (0..N)
            .map(|i| format!("{}{i}", if i < kept { 'g' } else { 'f' }))
            .collect();
        let mut got = names(&d);
        got.sort_by_key(|n| n[1..].to_string());
        assert_eq!(got, want, "seed {seed}");
        between |= kept > 0 && kept < N;
        for name in names(&d) {
            std::fs::remove_file(d.join(name)).unwrap();
        }
    }
    assert!(between, "no seed kept some of the renames and not others");
}

#[test]
fn o_dsync_writes_survive_a_crash() {
    let Some(fs) = FaultFs::mount() else { return };
    let m = fs.root();
    // Opened O_DSYNC: durable when the write returns.
    open(&m.join("j"), libc::O_DSYNC, true)
        .write_all_at(b"durable", 0)
        .unwrap();
    // One write with RWF_DSYNC on a plain descriptor: the kernel passes it as O_DSYNC.
    let f = open(&m.join("k"), 0, true);
    let data = b"per-write";
    let iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: one iovec over a live buffer.
    let n = unsafe { libc::pwritev2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_DSYNC) };
    assert_eq!(
        n,
        data.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
    drop(f);
    assert_eq!(std::fs::read(fs.backing().join("j")).unwrap(), b"durable");

    fs.ok("crash");
    fs.ok("recover");
    assert_eq!(std::fs::read(m.join("j")).unwrap(), b"durable");
    assert_eq!(std::fs::read(m.join("k")).unwrap(), b"per-write");
}

/// One 4 KiB block of `byte` in an aligned buffer, as O_DIRECT wants.
fn block(byte: u8) -> walrus::journal::buf::IoBuf {
    let mut buf = walrus::journal::buf::IoBuf::new(4096);
    buf.as_full_mut().fill(byte);
    buf.set_len(4096);
    buf
}

#[test]
fn o_direct_writes_without_a_sync_are_lost() {
    let Some(fs) = FaultFs::mount() else { return };
    let m = fs.root();
    synced_file(&m.join("direct"), 0, 0);
    let f = open(&m.join("direct"), libc::O_DIRECT, false);
    f.write_all_at(block(b'd').as_slice(), 0).unwrap();
    assert_eq!(std::fs::read(m.join("direct")).unwrap(), [b'd'; 4096]);
    fs.ok("crash");
    drop(f);
    fs.ok("recover");
    assert_eq!(std::fs::read(m.join("direct")).unwrap(), b"");

    // The same write followed by fdatasync survives.
    let f = open(&m.join("direct"), libc::O_DIRECT, false);
    f.write_all_at(block(b'e').as_slice(), 0).unwrap();
    f.sync_data().unwrap();
    fs.ok("crash");
    drop(f);
    fs.ok("recover");
    assert_eq!(std::fs::read(m.join("direct")).unwrap(), [b'e'; 4096]);
}

/// Tears an O_DSYNC write held in flight (stalled); returns the cut `crash tear` reports.
fn torn_write(fs: &FaultFs, seed: u64) -> usize {
    const LEN: usize = 8192;
    let path = fs.path("torn");
    synced_file(&path, b'a', LEN);
    fs.ok(&format!("seed {seed}"));
    fs.ok("stall");
    let (tx, rx) = mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let f = open(&p, libc::O_DSYNC, false);
        tx.send(f.write_all_at(&[b'b'; LEN], 0)).unwrap();
    });
    // In flight: received by faultfs, its reply held.
    fs.await_status("held", |n| n == 1);
    let crash = fields(&fs.ok("crash tear"));
    let written = rx.recv_timeout(START_TIMEOUT).unwrap();
    assert_eq!(errno(written.unwrap_err()), libc::EIO);
    fs.ok("recover");

    let cut = crash["torn_at"] as usize;
    assert!(cut % 512 == 0 && cut > 0 && cut < LEN, "cut {cut}");
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data.len(), LEN);
    assert!(
        data[..cut].iter().all(|&c| c == b'b'),
        "prefix torn at {cut}"
    );
    assert!(
        data[cut..].iter().all(|&c| c == b'a'),
        "old data past {cut}"
    );
    assert_eq!(crash["kept_bytes"] as usize, cut);
    cut
}

#[test]
fn crash_tear_keeps_a_sector_aligned_prefix_of_the_last_write() {
    let Some(fs) = FaultFs::mount() else { return };
    let cut = torn_write(&fs, 42);
    // The seed reproduces the cut.
    assert_eq!(torn_write(&fs, 42), cut);
}

#[test]
fn crash_reorder_keeps_a_random_subset_in_a_random_order() {
    let Some(fs) = FaultFs::mount() else { return };
    const S: usize = 512;
    // Sectors 0..16: one write each. Sectors 16..19: x over 16..18, then y over 17..19.
    // y applied before x (both kept) leaves x in sector 17 and y in 18: only a reordering
    // can do that.
    let path = fs.path("reorder");
    let (mut non_prefix, mut reversed) = (false, false);
    for seed in 1..=64 {
        synced_file(&path, b'.', 19 * S);
        let f = open(&path, 0, false);
        for i in 0..16 {
            f.write_all_at(&[b'A' + i as u8; S], (i * S) as u64)
                .unwrap();
        }
        f.write_all_at(&[b'x'; 2 * S], (16 * S) as u64).unwrap();
        f.write_all_at(&[b'y'; 2 * S], (17 * S) as u64).unwrap();
        fs.ok(&format!("seed {seed}"));
        let crash = fields(&fs.ok("crash reorder"));
        assert_eq!(crash["writes"], 18);
        drop(f);
        fs.ok("recover");

        let data = std::fs::read(&path).unwrap();
        let sector = |i: usize| &data[i * S..(i + 1) * S];
        let mut kept = Vec::new();
        for i in 0..16 {
            let new = b'A' + i as u8;
            // Each write survives whole or not at all.
            assert!(
                sector(i).iter().all(|&c| c == new) || sector(i).iter().all(|&c| c == b'.'),
                "seed {seed}: sector {i} mixed"
            );
            kept.push(sector(i)[0] == new);
        }
        // Not a prefix: a write kept after one lost.
        non_prefix |= kept.windows(2).any(|w| !w[0] && w[1]);
        reversed |= sector(17).iter().all(|&c| c == b'x') && sector(18).iter().all(|&c| c == b'y');
        if non_prefix && reversed {
            return;
        }
    }
    panic!("64 seeds: a non-prefix subset {non_prefix}, a reordering {reversed}");
}

#[test]
fn fail_returns_the_errno_for_matching_writes_and_syncs() {
    let Some(fs) = FaultFs::mount() else { return };
    let m = fs.root();
    fs.ok("fail write ENOSPC count 1 path /full");
    let other = open(&m.join("other"), 0, true);
    other.write_all_at(b"fine", 0).unwrap();
    let f = open(&m.join("full"), 0, true);
    let e = f.write_all_at(b"x", 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StorageFull);
    assert_eq!(errno(e), libc::ENOSPC);
    // Used up: the next write goes through; the failed one had no effect.
    f.write_all_at(b"y", 1).unwrap();
    assert_eq!(std::fs::read(m.join("full")).unwrap(), b"\0y");

    fs.ok("fail sync EIO");
    assert_eq!(errno(f.sync_all().unwrap_err()), libc::EIO);
    assert_eq!(errno(other.sync_data().unwrap_err()), libc::EIO);
    // A failed sync made nothing durable.
    assert_eq!(std::fs::read(fs.backing().join("full")).unwrap(), b"");
    fs.ok("clear");
    fs.ok("fail sync ENOSPC count 2 path /other");
    f.sync_all().unwrap();
    assert_eq!(errno(other.sync_all().unwrap_err()), libc::ENOSPC);
    assert_eq!(std::fs::read(fs.backing().join("full")).unwrap(), b"\0y");
    fs.ok("clear");
    other.sync_all().unwrap();
    assert_eq!(fs.status()["faults"], 4);
    assert!(fs.cmd("fail write EWHAT").starts_with("err"));
}

#[test]
fn fail_sync_lose_drops_the_writes_it_covered_as_linux_does() {
    let Some(fs) = FaultFs::mount() else { return };
    let path = fs.path("gate");
    let f = open(&path, 0, true);
    f.write_all_at(b"doomed", 0).unwrap();
    fs.ok("fail sync EIO count 1 lose");
    assert_eq!(errno(f.sync_data().unwrap_err()), libc::EIO);
    // Still visible, and the next sync succeeds, yet the data never reaches the disk:
    // the fsync lesson walrus's fence (docs/failure-modes.md) is built on.
    f.sync_data().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"doomed");
    assert_eq!(std::fs::read(fs.backing().join("gate")).unwrap(), b"");
    // Writes after the failure are durable as usual.
    f.write_all_at(b"kept", 6).unwrap();
    f.sync_data().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"doomedkept");
    fs.ok("crash");
    drop(f);
    fs.ok("recover");
    assert_eq!(std::fs::read(&path).unwrap(), b"\0\0\0\0\0\0kept");
    assert!(fs.cmd("fail write EIO lose").starts_with("err"));
}

#[test]
fn latency_delays_durable_requests_without_serializing_them() {
    let Some(fs) = FaultFs::mount() else { return };
    const N: usize = 8;
    const L: Duration = Duration::from_millis(200);
    let path = fs.path("lat");
    synced_file(&path, 0, N * 4096);
    fs.ok(&format!("latency {}", L.as_micros()));

    // N concurrent O_DSYNC writes to one file, as walrus keeps several in flight.
    let start = Arc::new(Barrier::new(N + 1));
    let writers: Vec<_> = (0..N)
        .map(|i| {
            let f = open(&path, libc::O_DSYNC, false);
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let t = Instant::now();
                f.write_all_at(&[i as u8 + 1; 4096], (i * 4096) as u64)
                    .unwrap();
                t.elapsed()
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    let each: Vec<Duration> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let total = t.elapsed();
    assert!(
        each.iter().all(|&d| d >= L),
        "a write faster than {L:?}: {each:?}"
    );
    assert!(
        total < L * N as u32 / 2,
        "{N} concurrent writes of {L:?} took {total:?}: serialized"
    );

    // fsync waits too; a write that is not synchronous does not.
    let f = open(&path, 0, false);
    let t = Instant::now();
    f.write_all_at(b"quick", 0).unwrap();
    assert!(t.elapsed() < L, "a plain write took {:?}", t.elapsed());
    let t = Instant::now();
    f.sync_data().unwrap();
    assert!(t.elapsed() >= L, "fsync took {:?}", t.elapsed());
}

#[test]
fn stall_holds_writes_and_syncs_until_resume() {
    let Some(fs) = FaultFs::mount() else { return };
    // Two files: the kernel serializes an fsync behind a write of the same file (it
    // takes the inode lock), so one file would hold the fsync in the kernel, not here.
    for name in ["written", "synced"] {
        synced_file(&fs.path(name), b'-', 8);
    }
    fs.ok("stall");
    let (tx, rx) = mpsc::channel();
    for sync in [false, true] {
        let p = fs.path(if sync { "synced" } else { "written" });
        let tx = tx.clone();
        std::thread::spawn(move || {
            let f = open(&p, 0, false);
            let r = if sync {
                f.sync_all()
            } else {
                f.write_all_at(b"w", 0)
            };
            tx.send((sync, r.is_ok())).unwrap();
        });
    }
    // Both requests reached faultfs and are held: neither can have been answered.
    fs.await_status("held", |n| n == 2);
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    // Reads are not held.
    assert_eq!(std::fs::read(fs.path("written")).unwrap().len(), 8);

    assert_eq!(fs.ok("resume"), "ok resumed 2");
    let mut done: Vec<_> = (0..2)
        .map(|_| rx.recv_timeout(START_TIMEOUT).unwrap())
        .collect();
    done.sort();
    assert_eq!(done, [(false, true), (true, true)]);
}

#[test]
fn io_uring_o_direct_o_dsync_writes_go_through_and_overlap() {
    let Some(fs) = FaultFs::mount() else { return };
    const N: usize = 8;
    const L: Duration = Duration::from_millis(200);
    let path = fs.path("uring");
    synced_file(&path, 0, N * 4096);
    fs.ok(&format!("latency {}", L.as_micros()));
    let total = tokio_uring::start(async {
        let f = tokio_uring::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(&path)
            .await
            .unwrap();
        let f = std::rc::Rc::new(f);
        let t = Instant::now();
        let writes: Vec<_> = (0..N)
            .map(|i| {
                let f = f.clone();
                tokio_uring::spawn(async move {
                    let (r, _) = f
                        .write_all_at(block(b'0' + i as u8), (i * 4096) as u64)
                        .await;
                    r
                })
            })
            .collect();
        for w in writes {
            w.await.unwrap().unwrap();
        }
        let total = t.elapsed();
        // fdatasync through the ring too (walrus's startup probe).
        f.sync_data().await.unwrap();
        total
    });
    eprintln!("{N} io_uring O_DIRECT|O_DSYNC writes with {L:?} latency: {total:?}");
    assert!(total >= L, "{total:?}");
    assert!(
        total < L * N as u32 / 2,
        "{N} io_uring writes of {L:?} took {total:?}: serialized"
    );
    // Durable when completed.
    fs.ok("crash");
    fs.ok("recover");
    let data = std::fs::read(&path).unwrap();
    for i in 0..N {
        assert!(data[i * 4096..(i + 1) * 4096]
            .iter()
            .all(|&c| c == b'0' + i as u8));
    }
}

#[test]
fn valkey_with_an_always_fsynced_aof_runs_on_the_mount() {
    let Some(fs) = FaultFs::mount() else { return };
    let dir = fs.path("valkey");
    std::fs::create_dir(&dir).unwrap();
    let v = Valkey::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    let mut c = Raw::connect(&v.addr());
    assert_eq!(c.cmd(&["SET", "faultfs-key", "faultfs-value"]), b"+OK\r\n");
    // appendfsync always: synced before the reply, so on the backing directory (the disk).
    let aof_dir = fs.backing().join("valkey/appendonlydir");
    let incr = std::fs::read_dir(&aof_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .unwrap_or_else(|| panic!("no .incr.aof in {}", aof_dir.display()));
    let text = String::from_utf8_lossy(&std::fs::read(&incr).unwrap()).into_owned();
    assert!(text.contains("faultfs-value"), "{incr:?}: {text:?}");
    assert!(fs.status()["syncs"] > 0);
}

#[test]
fn sigterm_unmounts_even_with_files_open() {
    let Some(mut fs) = FaultFs::mount() else {
        return;
    };
    let root = fs.root();
    let open_file = open(&fs.path("held-open"), 0, true);
    fs.proc.signal(libc::SIGTERM);
    let status = fs.proc.wait_exit(START_TIMEOUT).expect("faultfs exits");
    assert!(status.success(), "{status:?}: {}", fs.proc.log_text());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(root.to_str().unwrap()), "{mounts}");
    drop(open_file);
}
