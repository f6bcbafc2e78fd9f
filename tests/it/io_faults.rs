//! Every row of docs/failure-modes.md that an injected fault reproduces, against a managed
//! walrus (the default a user runs): what clients see, that walrus keeps running, and that
//! no acknowledged write is lost across the restart that recovers.
use crate::common;
use common::*;

use std::path::Path;
use std::time::Duration;

const OK: &[u8] = b"+OK\r\n";
/// The sync backend (where the journal faults are injected) and a fast disk watcher.
const CONFIG: &str = "io_backend = \"sync\"\n[disk]\ncheck_interval_ms = 50\n";

/// Writes `n` acknowledged keys `ack:<i>`.
fn acknowledged(c: &mut Raw, n: usize) {
    for i in 0..n {
        assert_eq!(c.cmd(&["SET", &format!("ack:{i}"), &format!("v{i}")]), OK);
    }
}

fn check_acknowledged(c: &mut Raw, n: usize) {
    for i in 0..n {
        assert_eq!(
            c.cmd(&["GET", &format!("ack:{i}")]),
            bulk(format!("v{i}")),
            "ack:{i}"
        );
    }
}

fn random_text(len: usize) -> String {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        s.push_str(&format!("{:016x}", rng.next()));
    }
    s.truncate(len);
    s
}

fn alive(w: &mut Walrus) {
    assert!(
        w.proc.child.try_wait().unwrap().is_none(),
        "walrus exited: {}",
        w.proc.log_text()
    );
}

/// Kills walrus (its managed Valkey dies with it) and starts it again on the same data.
fn crash_and_restart(mut w: Walrus, data: &Path) -> Walrus {
    w.kill_with_valkey();
    Walrus::build().config(CONFIG).data(data).start()
}

/// ENOSPC, EIO and EINVAL (O_DIRECT's misalignment error) on a journal write: the write that
/// hit it is not acknowledged, the journal is fenced (no retry), writes get -MISCONF naming
/// the error, reads go on, and a restart brings back every acknowledged write.
#[test]
fn a_failed_journal_write_fences_the_journal_and_loses_nothing_acknowledged() {
    for (errno, text) in [
        ("ENOSPC", "No space left on device"),
        ("EIO", "Input/output error"),
        ("EINVAL", "Invalid argument"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let fault = format!("return(write:{errno}@poison)");
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut w = Walrus::build()
            .config(CONFIG)
            .args(&["--metrics-listen", &metrics])
            .data(&data)
            .failpoint("journal::write", &fault)
            .start();
        let mut c = Raw::connect(&w.addr);
        assert_eq!(http_get(&metrics, "/readyz").0, 200);
        acknowledged(&mut c, 20);
        let r = show(&c.cmd(&["SET", "p", "poison"]));
        assert!(
            r.starts_with("-MISCONF walrus: journal failed") && r.contains(text),
            "{errno}: {r}"
        );
        let r = show(&c.cmd(&["SET", "later", "1"]));
        assert!(
            r.starts_with("-MISCONF walrus: journal failed") && r.contains(text),
            "{errno}: {r}"
        );
        check_acknowledged(&mut c, 20);
        alive(&mut w);
        let (_, body) = http_get(&metrics, "/metrics");
        assert!(body.contains("walrus_journal_failed 1"), "{body}");
        assert_eq!(http_get(&metrics, "/readyz").0, 503);
        let w = crash_and_restart(w, &data);
        let mut c = Raw::connect(&w.addr);
        check_acknowledged(&mut c, 20);
        assert_eq!(c.cmd(&["EXISTS", "p", "later"]), b":0\r\n", "{errno}");
        assert_eq!(c.cmd(&["SET", "after", "1"]), OK);
    }
}

/// A failed fsync: the page cache may have dropped the data (here it does), so the write is
/// never acknowledged and the fsync never retried: the journal is fenced on the first one.
#[test]
fn a_failed_fsync_is_never_retried_and_its_write_never_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut w = Walrus::build()
        .config(CONFIG)
        .data(&data)
        .failpoint("journal::write", "return(fsync:EIO@poison)")
        .start();
    let mut c = Raw::connect(&w.addr);
    acknowledged(&mut c, 20);
    let r = show(&c.cmd(&["SET", "p", "poison"]));
    assert!(r.starts_with("-MISCONF walrus: journal failed"), "{r}");
    assert!(c.cmd(&["SET", "later", "1"]).starts_with(b"-MISCONF"));
    check_acknowledged(&mut c, 20);
    alive(&mut w);
    let failures = w.proc.log_text().matches("segment write failed").count();
    assert_eq!(failures, 1, "{}", w.proc.log_text());
    let w = crash_and_restart(w, &data);
    let mut c = Raw::connect(&w.addr);
    check_acknowledged(&mut c, 20);
    assert_eq!(c.cmd(&["EXISTS", "p", "later"]), b":0\r\n");
}

/// A power cut in the middle of a journal write: recovery cuts the torn entry, and every
/// acknowledged write is back.
#[test]
fn a_write_torn_by_a_power_cut_is_cut_at_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut w = Walrus::build()
        .config(CONFIG)
        .data(&data)
        .failpoint("journal::write", "return(tear@poison)")
        .start();
    let mut c = Raw::connect(&w.addr);
    acknowledged(&mut c, 20);
    let pid = valkey_pid(&w.addr);
    c.send_raw(&walrus::resp::write::command([
        "SET",
        "p",
        &"poison".repeat(2000),
    ]));
    assert!(c.closed(), "the torn write was acknowledged");
    w.proc.wait_exit(Duration::from_secs(10)).unwrap();
    wait_dead(pid);
    let w = Walrus::build().config(CONFIG).data(&data).start();
    let mut c = Raw::connect(&w.addr);
    check_acknowledged(&mut c, 20);
    assert_eq!(c.cmd(&["EXISTS", "p"]), b":0\r\n");
    assert_eq!(c.cmd(&["SET", "after", "1"]), OK);
}

/// A segment file deleted, or truncated, under a running walrus: writes into it would be
/// lost at the next start, so the journal is fenced; reads go on. At the next start the
/// missing segment is refused, naming it and the repair.
#[test]
fn a_segment_deleted_or_truncated_under_walrus_fences_the_journal() {
    for damage in ["delete", "truncate"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut w = Walrus::build().config(CONFIG).data(&data).start();
        let mut c = Raw::connect(&w.addr);
        acknowledged(&mut c, 20);
        let seg = std::fs::read_dir(data.join("journal"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "wal"))
            .max()
            .unwrap();
        match damage {
            "delete" => std::fs::remove_file(&seg).unwrap(),
            _ => std::fs::OpenOptions::new()
                .write(true)
                .open(&seg)
                .unwrap()
                .set_len(4096)
                .unwrap(),
        }
        let line = w.proc.wait_line("the journal is fenced", START_TIMEOUT);
        let expected = if damage == "delete" {
            "is gone"
        } else {
            "was truncated"
        };
        assert!(line.contains(expected), "{line}");
        let r = show(&c.cmd(&["SET", "later", "1"]));
        assert!(
            r.starts_with("-MISCONF walrus: journal failed") && r.contains(expected),
            "{r}"
        );
        check_acknowledged(&mut c, 20);
        alive(&mut w);
        if damage == "delete" {
            w.proc.signal(libc::SIGTERM);
            w.proc.wait_exit(Duration::from_secs(30)).unwrap();
            let line = refuses_to_start(None, CONFIG, &data, "lacks segment files");
            assert!(line.contains("--accept-data-loss"), "{line}");
        }
    }
}

/// A checkpoint that keeps failing (its RDB, or the manifest that records it, cannot be
/// written: ENOSPC) lets the ring fill: writes are then refused, naming the ring, reads go
/// on, nothing half-written is left behind, and once the fault clears a checkpoint frees
/// the ring and writes resume without a restart.
#[test]
fn a_checkpoint_that_keeps_failing_fills_the_ring_then_writes_resume() {
    for fault in ["rdb::write", "manifest::write"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let flag = dir.path().join("fault-on");
        let spec = format!("return(ENOSPC@{})", flag.display());
        let mut w = Walrus::build()
            .config(CONFIG)
            .data(&data)
            .failpoint(fault, &spec)
            .with_metrics()
            .start();
        let mut c = Raw::connect(&w.addr);
        // A dataset whose RDB is larger than the fault's 64 KiB threshold, so writing it
        // reaches the fault: random text, which the RDB's compression cannot shrink away.
        let value = random_text(64 << 10);
        for i in 0..16 {
            assert_eq!(c.cmd(&["SET", &format!("big:{i}"), &value]), OK);
        }
        std::fs::write(&flag, b"").unwrap();
        // Overwrites grow the journal, not the dataset, until the ring is over the mark.
        let mut refused = None;
        for i in 0..2000 {
            let r = c.cmd(&["SET", &format!("big:{}", i % 16), &value]);
            if r != OK {
                refused = Some(show(&r));
                break;
            }
        }
        let refused = refused.expect("the ring never filled");
        assert!(
            refused.starts_with("-MISCONF walrus: writes are refused: the journal ring"),
            "{fault}: {refused}"
        );
        let line = w.proc.wait_line("checkpoint failed", START_TIMEOUT);
        assert!(line.contains("No space left on device"), "{line}");
        assert_eq!(c.cmd(&["STRLEN", "big:0"]), b":65536\r\n", "reads go on");
        let leftovers: Vec<_> = std::fs::read_dir(data.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        alive(&mut w);
        std::fs::remove_file(&flag).unwrap();
        w.await_status("the ring's watermark cleared", |s| {
            !s.disk_watermark_reached
        });
        let r = c.cmd(&["SET", "after", "1"]);
        assert_eq!(show(&r), show(OK), "{}", w.proc.log_text());
    }
}

/// `walrus checkpoint` against the admin endpoint at `metrics`: its output.
fn checkpoint_now(metrics: &str) -> std::process::Output {
    std::process::Command::new(walrus_bin())
        .args(["checkpoint", "--metrics", metrics])
        .output()
        .unwrap()
}

/// Two checkpoints with no write between them share an offset. The second one's RDB never
/// replaces the recorded one: when the manifest that would name it cannot be written, the
/// first stays whole, and a restart after a crash restores from it.
#[test]
fn a_failed_second_checkpoint_at_the_same_offset_leaves_the_first_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flag = dir.path().join("fault-on");
    let spec = format!("return(ENOSPC@{})", flag.display());
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut w = Walrus::build()
        .config(CONFIG)
        .args(&["--metrics-listen", &metrics])
        .data(&data)
        .failpoint("manifest::write", &spec)
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    let first = checkpoint_now(&metrics);
    assert!(first.status.success(), "{first:?}");
    std::fs::write(&flag, b"").unwrap();
    let second = checkpoint_now(&metrics);
    assert!(!second.status.success(), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("No space left on device"),
        "{second:?}"
    );
    std::fs::remove_file(&flag).unwrap();
    w.kill_with_valkey();
    let w = Walrus::build().config(CONFIG).data(&data).start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["GET", "k"]), bulk("v"));
}

/// A journal directory on a read-only file system, or one that cannot be created, at start:
/// walrus refuses to start with the path and the OS error, and does not panic.
#[test]
fn an_unwritable_journal_directory_at_start_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // Root ignores permission bits, so an unwritable directory is made another way: its
    // parent is a regular file.
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let line = refuses_to_start(None, CONFIG, &file.join("data"), "Not a directory");
    assert!(line.contains("file/data"), "{line}");
    let Some(ro) = Tmpfs::mount(8, true) else {
        return;
    };
    let line = refuses_to_start(
        None,
        CONFIG,
        &ro.path().join("data"),
        "Read-only file system",
    );
    assert!(!line.contains("panicked"), "{line}");
}

/// A corrupted manifest, the journal's or the checkpoints', stops the start with the file's
/// name: walrus never guesses where the log starts or which RDB is current.
#[test]
fn a_corrupted_manifest_stops_the_start_naming_the_file() {
    for (file, name) in [
        ("journal/MANIFEST", "MANIFEST"),
        ("checkpoints/CHECKPOINT", "CHECKPOINT"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut w = Walrus::build().config(CONFIG).data(&data).start();
        let mut c = Raw::connect(&w.addr);
        acknowledged(&mut c, 5);
        w.proc.signal(libc::SIGTERM);
        assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());
        let path = data.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x20;
        std::fs::write(&path, bytes).unwrap();
        let line = refuses_to_start(None, CONFIG, &data, name);
        assert!(line.contains(&path.display().to_string()), "{line}");
    }
}

/// A checkpoint that keeps failing lets the ring fill to its last byte (writes that reach
/// Valkey around walrus, or its own expirations, carry the stream past the watermark, which
/// stops only walrus's clients), and then Valkey dies. The link, waiting for room, reads
/// nothing, yet it notices: in managed mode walrus restores the new Valkey by itself once the
/// fault clears; in external mode, where Valkey is restarted behind walrus's back, no client
/// ever reads the restarted, empty Valkey. Every acknowledged write is there after.
#[test]
fn a_full_ring_then_a_valkey_crash_is_noticed_and_restored() {
    for managed in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let flag = dir.path().join("fault-on");
        let spec = format!("return(ENOSPC@{})", flag.display());
        let external = (!managed).then(Valkey::start);
        let w = match &external {
            None => Walrus::build()
                .config(CONFIG)
                .data(&data)
                .failpoint("rdb::write", &spec)
                .start(),
            Some(v) => Walrus::build()
                .upstream(&v.addr())
                .config(CONFIG)
                .data(&data)
                .failpoint("rdb::write", &spec)
                .start(),
        };
        let mut c = Raw::connect(&w.addr);
        acknowledged(&mut c, 20);
        // Around walrus: the managed Valkey's socket, or the external one's port.
        let valkey = match &external {
            None => managed_valkey_addr(&w.addr),
            Some(v) => v.addr(),
        };
        std::fs::write(&flag, b"").unwrap();
        // Random text larger than the fault's 64 KiB threshold, so every checkpoint fails.
        let value = random_text(64 << 10);
        let mut direct = Raw::connect(&valkey);
        let mut i = 0;
        while !w.proc.log_text().contains("journal ring full") {
            assert_eq!(
                direct.cmd(&["SET", &format!("around:{}", i % 16), &value]),
                OK
            );
            i += 1;
            assert!(i < 10_000, "the ring never filled");
        }
        let pid = valkey_pid(&valkey);
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_dead(pid);
        std::fs::remove_file(&flag).unwrap();
        let _restarted = external
            .as_ref()
            .map(|v| Valkey::start_with(&["--port", &v.port.to_string()]));
        // Until walrus has restored it, the new Valkey is empty: a client may get -LOADING
        // or a lost connection meanwhile, never the empty Valkey's nil.
        let attached = |w: &Walrus| w.proc.log_text().matches("replica link attached").count();
        let before = attached(&w);
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        while attached(&w) == before {
            let r = Raw::connect(&w.addr).cmd(&["GET", "ack:0"]);
            assert!(
                r == bulk("v0") || r.starts_with(b"-"),
                "managed {managed}: GET ack:0 answered {}",
                show(&r)
            );
            assert!(
                std::time::Instant::now() < deadline,
                "managed {managed}: Valkey was not restored; log:\n{}",
                w.proc.log_text()
            );
        }
        let mut c = Raw::connect(&w.addr);
        check_acknowledged(&mut c, 20);
    }
}
