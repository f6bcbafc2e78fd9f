//! Disk watermarks on a real small file system (a size-limited tmpfs the test mounts; it
//! skips, saying so, where mounting is not allowed): filled with other data, and with the
//! journal and checkpoints themselves. Writes are refused before the disk is full, reads go
//! on, no acknowledged write is lost, walrus never exits, and writes resume by themselves
//! once space is freed.
use crate::common;
use common::*;

use std::collections::BTreeMap;
use std::path::Path;

pub(crate) const OK: &[u8] = b"+OK\r\n";
/// The watcher reads the disk every 50 ms.
pub(crate) const CONFIG: &str = "[disk]\ncheck_interval_ms = 50\n";

fn check(c: &mut Raw, model: &BTreeMap<String, String>) {
    for (k, v) in model {
        assert_eq!(c.cmd(&["GET", k]), bulk(v), "{k}");
    }
}

/// Writes a file of zeros that brings the file system under `dir` to `ratio` in use.
fn fill_to(dir: &Path, ratio: f64) -> std::path::PathBuf {
    let u = walrus::disk::Usage::of(dir).unwrap();
    let total = u.used_bytes + u.avail_bytes;
    let want = (ratio * total as f64) as u64;
    let more = want.saturating_sub(u.used_bytes);
    let path = dir.join("filler");
    let f = std::fs::File::create(&path).unwrap();
    // Written, not sparse: tmpfs counts only pages that hold data.
    let chunk = vec![0u8; 1 << 20];
    let mut left = more;
    use std::io::Write;
    let mut w = std::io::BufWriter::new(f);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        w.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    w.into_inner().unwrap().sync_all().unwrap();
    path
}

fn text(seed: u64, len: usize) -> String {
    let mut rng = Rng(seed | 1);
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        s.push_str(&format!("{:016x}", rng.next()));
    }
    s.truncate(len);
    s
}

#[test]
fn a_disk_filled_by_other_data_refuses_writes_then_resumes() {
    let Some(fs) = Tmpfs::mount(64, false) else {
        return;
    };
    let data = fs.path().join("data");
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut w = Walrus::build()
        .config(CONFIG)
        .args(&["--metrics-listen", &metrics])
        .data(&data)
        .start();
    let mut c = Raw::connect(&w.addr);
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(body.contains("walrus_disk_watermark_reached 0"), "{body}");
    let mut model = BTreeMap::new();
    for i in 0..200 {
        let (k, v) = (format!("k:{i}"), format!("v:{i}"));
        let r = c.cmd(&["SET", &k, &v]);
        assert_eq!(show(&r), show(OK), "{}", w.proc.log_text());
        model.insert(k, v);
    }
    let filler = fill_to(fs.path(), 0.95);
    w.await_status("the disk watermark reached", |s| s.disk_watermark_reached);
    for write in [
        vec!["SET", "refused", "1"],
        vec!["INCR", "k:1"],
        vec![
            "EVAL",
            "return redis.call('set', KEYS[1], 1)",
            "1",
            "refused",
        ],
    ] {
        let r = show(&c.cmd(&write));
        assert!(
            r.starts_with("-MISCONF walrus: writes are refused: the journal's file system")
                && r.contains("disk.low_watermark"),
            "{write:?}: {r}"
        );
    }
    check(&mut c, &model);
    let mut direct = Raw::connect(&managed_valkey_addr(&w.addr));
    assert_eq!(
        direct.cmd(&["EXISTS", "refused"]),
        b":0\r\n",
        "Valkey never saw it"
    );
    assert!(w.proc.child.try_wait().unwrap().is_none());
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(body.contains("walrus_disk_watermark_reached 1"), "{body}");
    assert!(
        body.contains("walrus_writes_refused_total{reason=\"disk_watermark\"} 3"),
        "{body}"
    );
    let used: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("walrus_disk_used_ratio{volume=\"journal\"} "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(used >= 0.9, "{body}");
    assert_eq!(
        http_get(&metrics, "/readyz").0,
        200,
        "reads are served: still ready"
    );
    // /status and `walrus status` say that writes are refused, and why.
    let status = |c: &[&str]| {
        let out = std::process::Command::new(walrus_bin())
            .args(c)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (_, json) = http_get(&metrics, "/status");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        json["writes_refused"].as_str().is_some_and(
            |w| w.starts_with("MISCONF walrus: writes are refused: the journal's file system")
        ),
        "{json}"
    );
    let text = status(&["status", "--metrics", &metrics]);
    assert!(
        text.lines()
            .any(|l| l.contains("writes") && l.contains("refused: MISCONF")),
        "{text}"
    );
    // Sizes as a person reads them: the test ring is 16 segments of 1 MiB.
    assert!(
        text.lines()
            .any(|l| l.contains("ring") && l.ends_with("of 16.0 MiB")),
        "{text}"
    );
    // So does INFO persistence, in Valkey's field and walrus's own.
    let refused = |c: &mut Raw, field| info_field(c, "persistence", field).unwrap();
    assert_eq!(refused(&mut c, "aof_last_write_status"), "err");
    assert_eq!(refused(&mut c, "walrus_writes_refused"), "1");
    assert!(refused(&mut c, "walrus_writes_refused_reason")
        .starts_with("MISCONF walrus: writes are refused: the journal's file system"),);

    std::fs::remove_file(filler).unwrap();
    w.await_status("the disk watermark cleared", |s| !s.disk_watermark_reached);
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(body.contains("walrus_disk_watermark_reached 0"), "{body}");
    let (_, json) = http_get(&metrics, "/status");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(json["writes_refused"].is_null(), "{json}");
    assert!(status(&["status", "--metrics", &metrics])
        .lines()
        .any(|l| l.contains("writes") && l.ends_with("accepted")),);
    assert_eq!(refused(&mut c, "aof_last_write_status"), "ok");
    assert_eq!(refused(&mut c, "walrus_writes_refused_reason"), "");
    assert_eq!(c.cmd(&["SET", "after", "1"]), OK);
    check(&mut c, &model);
}

/// The journal and checkpoints fill the disk: with room for the journal but not for a new
/// RDB below the high mark, no checkpoint is taken (the log says why), so the ring fills and
/// writes are refused, naming the ring; once space is freed a checkpoint releases the ring
/// and writes resume.
#[test]
fn a_checkpoint_without_room_is_not_taken_and_the_full_ring_refuses_writes() {
    let Some(fs) = Tmpfs::mount(64, false) else {
        return;
    };
    let data = fs.path().join("data");
    let mut w = Walrus::build()
        .config(CONFIG)
        .data(&data)
        .with_metrics()
        .start();
    let mut c = Raw::connect(&w.addr);
    let mut model = BTreeMap::new();
    // About 6 MiB of data that does not compress: its RDB cannot fit in what is left.
    for i in 0..96 {
        let (k, v) = (format!("big:{i}"), text(i, 64 << 10));
        let r = c.cmd(&["SET", &k, &v]);
        assert_eq!(show(&r), show(OK), "{}", w.proc.log_text());
        model.insert(k, v);
    }
    // Below the low mark, with less than 6 MiB left before the high one.
    let filler = fill_to(fs.path(), 0.84);
    let mut refused = None;
    for i in 0..1000u64 {
        let (k, v) = (format!("big:{}", i % 96), text(1000 + i, 64 << 10));
        let r = c.cmd(&["SET", &k, &v]);
        if r != OK {
            refused = Some(show(&r));
            break;
        }
        model.insert(k, v);
    }
    let refused = refused.expect("the ring never filled");
    assert!(
        refused.starts_with("-MISCONF walrus: writes are refused: the journal ring"),
        "{refused}"
    );
    let line = w
        .proc
        .wait_line("not enough room for a checkpoint", START_TIMEOUT);
    assert!(line.contains("disk.high_watermark"), "{line}");
    // None until there is room for one.
    let taken = w.checkpoints();
    check(&mut c, &model);
    assert!(w.proc.child.try_wait().unwrap().is_none());

    std::fs::remove_file(filler).unwrap();
    w.await_checkpoint(taken);
    w.await_status("the disk watermark cleared", |s| !s.disk_watermark_reached);
    assert_eq!(c.cmd(&["SET", "after", "1"]), OK);
    check(&mut c, &model);
}

/// A ring that alone keeps its file system above the low watermark would refuse writes
/// forever: walrus refuses to start instead, saying what to change.
#[test]
fn a_ring_too_large_for_its_file_system_is_refused_at_start() {
    let Some(fs) = Tmpfs::mount(18, false) else {
        return;
    };
    let line = refuses_to_start(None, CONFIG, &fs.path().join("data"), "alone takes");
    assert!(
        line.contains("disk.low_watermark") && line.contains("Shrink the ring"),
        "{line}"
    );
}
