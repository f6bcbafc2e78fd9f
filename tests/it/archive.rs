//! The archive with real processes: walrus (managed mode) archiving to SeaweedFS (S3) or a
//! directory; its data directory deleted (a lost node) and a new walrus bootstrapped from the
//! archive with every write acknowledged more than `archive.max_lag_ms` before (every one,
//! with `durability.ack = "archive"`); the store killed, paused, restarted; the drill.
use crate::common;
use common::seaweed::Seaweed;
use common::*;

use std::time::{Duration, Instant};

const OK: &[u8] = b"+OK\r\n";

/// `/status` as JSON.
fn status(metrics: &str) -> serde_json::Value {
    let (code, body) = http_get(metrics, "/status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits (bounded) until `/status` satisfies `ok`; fails with the last status and the log.
fn await_status(w: &Walrus, metrics: &str, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
    await_status_within(w, metrics, what, START_TIMEOUT, ok)
}

fn await_status_within(
    w: &Walrus,
    metrics: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&serde_json::Value) -> bool,
) {
    common::state::await_read(&w.proc, what, within, || status(metrics), ok);
}

/// Waits until the archive holds everything the journal does.
fn await_archived(w: &Walrus, metrics: &str) {
    await_status(w, metrics, "the archive caught up", |s| {
        s["archive_lag_bytes"] == 0 && s["archive_lag_seconds"] == 0.0
    });
}

fn write_keys(addr: &str, prefix: &str, n: usize) {
    let mut c = Raw::connect(addr);
    for i in 0..n {
        assert_eq!(
            c.cmd(&["SET", &format!("{prefix}:{i}"), &format!("v{i}")]),
            OK
        );
    }
}

fn assert_keys(addr: &str, prefix: &str, n: usize) {
    let mut c = Raw::connect(addr);
    for i in 0..n {
        assert_eq!(
            c.cmd(&["GET", &format!("{prefix}:{i}")]),
            bulk(format!("v{i}")),
            "{prefix}:{i}"
        );
    }
}

fn metrics_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A lost node: walrus and Valkey killed under writes, the data directory gone. A new walrus
/// with `archive.bootstrap` restores from the archive before it serves, has every write
/// acknowledged more than `archive.max_lag_ms` before the loss, and takes the archive over on
/// a timeline of its own.
#[test]
fn a_lost_data_directory_is_replaced_from_the_archive() {
    let store = Seaweed::start();
    store.bucket("walrus");
    let max_lag = Duration::from_millis(500);
    let archive = format!(
        "{}max_lag_ms = {}\n",
        store.archive_toml("walrus", "node"),
        max_lag.as_millis()
    );
    let metrics = metrics_addr();
    let mut w = Walrus::build()
        .config(&archive)
        .env(&Seaweed::env())
        .args(&["--metrics-listen", &metrics])
        .start();
    write_keys(&w.addr, "k", 300);
    await_archived(&w, &metrics);
    // Writes go on while the node is lost: each acknowledged one is noted with its time.
    let valkey = valkey_pid(&w.addr);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let writer = {
        let (addr, stop, first) = (w.addr.clone(), stop.clone(), first.clone());
        std::thread::spawn(move || {
            let mut c = Raw::connect(&addr);
            let mut acked = Vec::new();
            for i in 0.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                match c.try_cmd(&["SET", &format!("live:{i}"), &format!("v{i}")]) {
                    Some(r) if r == OK => {
                        first.lock().unwrap().get_or_insert_with(Instant::now);
                        acked.push((i, Instant::now()))
                    }
                    _ => break,
                }
            }
            acked
        })
    };
    // The node is lost once writes have gone on for twice max_lag, at a moment the archive
    // keeps up (half of max_lag behind at most): what was acknowledged more than max_lag
    // before is in the archive.
    let under_way = |s: &serde_json::Value| {
        let long = first
            .lock()
            .unwrap()
            .is_some_and(|t| t.elapsed() > 2 * max_lag);
        long && s["archive_lag_seconds"].as_f64() < Some(max_lag.as_secs_f64() / 2.0)
    };
    await_status(
        &w,
        &metrics,
        "writes under way, the archive keeping up",
        under_way,
    );
    w.proc.signal(libc::SIGKILL);
    let lost_at = Instant::now();
    w.proc.wait_exit(START_TIMEOUT).unwrap();
    wait_dead(valkey);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let acked = writer.join().unwrap();
    std::fs::remove_dir_all(w.data.path().join("data")).unwrap();

    let metrics2 = metrics_addr();
    let bootstrap = format!("{archive}bootstrap = true\n");
    let w2 = Walrus::build()
        .config(&bootstrap)
        .env(&Seaweed::env())
        .args(&["--metrics-listen", &metrics2])
        .start();
    assert!(
        w2.proc.log_text().contains("archive.bootstrap: done"),
        "{}",
        w2.proc.log_text()
    );
    assert_keys(&w2.addr, "k", 300);
    let mut c = Raw::connect(&w2.addr);
    let mut recent_lost = 0;
    for (i, at) in &acked {
        let got = c.cmd(&["GET", &format!("live:{i}")]);
        if got != bulk(format!("v{i}")) {
            assert!(
                lost_at.duration_since(*at) <= max_lag,
                "live:{i}, acknowledged {:?} before the loss, is missing",
                lost_at.duration_since(*at)
            );
            recent_lost += 1;
        }
    }
    eprintln!(
        "{} writes acknowledged under way, {recent_lost} of the last {} ms lost",
        acked.len(),
        max_lag.as_millis()
    );
    assert!(
        acked.len() > 10,
        "too few writes under way: {}",
        acked.len()
    );
    // It writes the archive from here on, on timeline 2.
    write_keys(&w2.addr, "after", 10);
    await_archived(&w2, &metrics2);
    let cfg = w2.data.path().join("walrus.toml");
    let out = std::process::Command::new(walrus_bin())
        .args(["archive", "list", "--config", cfg.to_str().unwrap()])
        .envs(Seaweed::env())
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().any(|l| l.starts_with("2 ")), "{text}");
    // Each restore point says how far in time its journal reaches: after its checkpoint was
    // recorded, and not after now.
    for line in text.lines().filter(|l| l.starts_with("2 ")) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let recorded = walrus::units::time::parse_time(cols[1]).expect("recorded");
        let until =
            walrus::units::time::parse_time(cols[2]).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(
            until >= recorded && until <= walrus::units::time::now_ms(),
            "{text}"
        );
    }
    assert!(
        text.contains(&w2.data.path().join("data").display().to_string()),
        "{text}"
    );
}

/// `durability.ack = "archive"`: a reply leaves once the archive holds the write, so the
/// node may be lost at once after the last reply and nothing acknowledged is missing.
#[test]
fn with_ack_archive_every_acknowledged_write_survives_the_loss_of_the_node() {
    let bucket = tempfile::tempdir().unwrap();
    let archive = format!(
        "[durability]\nack = \"archive\"\n[archive]\nurl = \"file://{}\"\n",
        bucket.path().display()
    );
    let mut w = Walrus::build().config(&archive).start();
    let read_before = storage_reads(w.proc.child.id());
    write_keys(&w.addr, "k", 200);
    // The uploads ran on the archive's own thread (docs/archive.md), not the proxy's
    // workers: woken for each of the 200 group commits, where an idle thread sleeps on.
    let wakes = archive_thread_switches(w.proc.child.id());
    assert!(wakes >= 100, "the walrus-archive thread woke {wakes} times");
    // And they took the entries from memory (`archive.memory_bytes`), not from the disk the
    // journal had just written them to: 200 reads of at least a 4 KiB block each otherwise.
    let read = storage_reads(w.proc.child.id()) - read_before;
    assert!(
        read < 100 * 4096,
        "walrus read {read} bytes from its disk while archiving"
    );
    w.kill_with_valkey();
    std::fs::remove_dir_all(w.data.path().join("data")).unwrap();
    let w2 = Walrus::build()
        .config(&format!("{archive}bootstrap = true\n"))
        .start();
    assert_keys(&w2.addr, "k", 200);
}

/// Bytes a process has read from storage (`read_bytes` in /proc/PID/io: O_DIRECT reads
/// included, the page cache's hits not).
fn storage_reads(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.parse().ok())
        .expect("read_bytes in /proc/PID/io")
}

/// Context switches of walrus's `walrus-archive` threads (the runtime's and its blocking
/// pool's), from /proc.
fn archive_thread_switches(pid: u32) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap_or_default();
        if status.lines().next() != Some("Name:\twalrus-archive") {
            continue;
        }
        n += status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    n
}

/// A store that stops answering: walrus serves on (ack local), `/status` says why the
/// archive lags; `archive.enforce_max_lag` refuses writes with the reason meanwhile. Once the
/// store answers again the archive catches up and writes are accepted.
#[test]
fn a_store_that_hangs_is_reported_and_with_enforce_max_lag_refuses_writes() {
    let store = Seaweed::start();
    store.bucket("walrus");
    let archive = format!(
        "{}max_lag_ms = 300\nenforce_max_lag = true\nrequest_timeout_ms = 500\nmax_backoff_ms = 200\n",
        store.archive_toml("walrus", "hang")
    );
    let metrics = metrics_addr();
    let w = Walrus::build()
        .config(&archive)
        .env(&Seaweed::env())
        .args(&["--metrics-listen", &metrics])
        .start();
    write_keys(&w.addr, "k", 20);
    await_archived(&w, &metrics);
    store.pause(true);
    let mut c = Raw::connect(&w.addr);
    w.await_status("writes refused", |s| s.writes_refused.is_some());
    let refused = c.cmd(&["SET", "during", "2"]);
    let text = show(&refused);
    assert!(
        text.starts_with("-MISCONF walrus: writes are refused: the archive is")
            && text.contains("archive.max_lag_ms (300 ms)"),
        "{text}"
    );
    // Reads go on.
    assert_eq!(c.cmd(&["GET", "k:3"]), bulk("v3"));
    store.pause(false);
    await_archived(&w, &metrics);
    w.await_status("writes accepted again", |s| s.writes_refused.is_none());
    assert_eq!(c.cmd(&["SET", "after", "1"]), OK);
}

/// The store killed for a while and started again: nothing is refused (ack local), the
/// archive catches up, and the restore drill passes on what it holds.
#[test]
fn a_store_killed_and_restarted_is_caught_up_with_and_the_drill_passes() {
    let mut store = Seaweed::start();
    store.bucket("walrus");
    let archive = format!(
        // A store just started again may take a moment per request on a busy machine.
        "{}max_lag_ms = 200\nrequest_timeout_ms = 3000\nmax_backoff_ms = 200\n",
        store.archive_toml("walrus", "restart")
    );
    let metrics = metrics_addr();
    let w = Walrus::build()
        .config(&archive)
        .env(&Seaweed::env())
        .args(&["--metrics-listen", &metrics])
        .start();
    write_keys(&w.addr, "a", 50);
    await_archived(&w, &metrics);
    store.kill();
    write_keys(&w.addr, "b", 50);
    await_status(&w, &metrics, "the failure reported", |s| {
        s["archive_error"].is_string() && s["archive_lag_bytes"].as_u64() > Some(0)
    });
    store.restart();
    // A store started again on a busy machine may take a while to take writes.
    await_status_within(
        &w,
        &metrics,
        "the archive caught up",
        3 * START_TIMEOUT,
        |s| s["archive_lag_bytes"] == 0 && s["archive_lag_seconds"] == 0.0,
    );
    w.proc
        .wait_line("the archive is reachable again", START_TIMEOUT);
    let cfg = w.data.path().join("walrus.toml");
    let out = std::process::Command::new(walrus_bin())
        .args(["archive", "verify", "--config", cfg.to_str().unwrap()])
        .envs(Seaweed::env())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(output_text(&out).contains("OK: the latest restore point"));
}

/// A second walrus given the same archive is refused at start, naming the first.
#[test]
fn a_second_walrus_on_one_archive_is_refused_naming_the_first() {
    let bucket = tempfile::tempdir().unwrap();
    let archive = format!("[archive]\nurl = \"file://{}\"\n", bucket.path().display());
    let first = Walrus::build().config(&archive).start();
    let (mut second, _dir) = Walrus::build().config(&archive).spawn();
    let status = second
        .wait_exit(START_TIMEOUT)
        .expect("the second walrus exits");
    assert_eq!(status.code(), Some(2), "{}", second.log_text());
    let log = second.log_text();
    assert!(
        log.contains("is written by another walrus")
            && log.contains(&first.data.path().join("data").display().to_string()),
        "{log}"
    );
}

/// The journal objects of timeline `t` in a directory archive: (start, end) of each.
fn object_ranges(bucket: &std::path::Path, t: u64) -> Vec<(u64, u64)> {
    let dir = bucket.join(format!("journal/{t:08}"));
    let mut out: Vec<(u64, u64)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let range = name.split('.').next()?;
            let (a, b) = range.split_once('-')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    out.sort();
    out
}

/// walrus killed at each step of an upload: a checkpoint's RDB uploaded and the manifest not
/// updated; a journal object uploaded and the position not moved; a merged object uploaded
/// and its parts not deleted. Started again on its data directory, it goes on without a gap
/// or a leftover object, and a node bootstrapped from the archive has every write it
/// acknowledged.
#[test]
fn walrus_killed_during_an_upload_loses_and_leaves_nothing() {
    for (point, pass, value_bytes) in [
        ("archive::checkpoint_uploaded", 1, 64 << 10),
        ("archive::journal_uploaded", 3, 16),
        ("archive::merged", 1, 16),
    ] {
        let bucket = tempfile::tempdir().unwrap();
        let archive = format!(
            "[archive]\nurl = \"file://{}\"\nmax_lag_ms = 50\nmerge_objects = 2\ncheckpoint_after_bytes = 65536\n",
            bucket.path().display()
        );
        let data = tempfile::tempdir().unwrap();
        let w = Walrus::build()
            .config(&archive)
            .data(data.path())
            .failpoint(point, &format!("{pass}*off->return(kill)"))
            .start();
        let mut acked = Vec::new();
        let mut c = Raw::connect(&w.addr);
        let value = "v".repeat(value_bytes);
        let deadline = Instant::now() + START_TIMEOUT;
        for i in 0.. {
            assert!(
                Instant::now() < deadline,
                "{point}: not reached:\n{}",
                w.proc.log_text()
            );
            match c.try_cmd(&["SET", &format!("k{i}"), &value]) {
                Some(r) if r == OK => acked.push(i),
                Some(r) => panic!("{point}: SET k{i}: {}", show(&r)),
                None => break,
            }
        }
        let mut w = w;
        let status = w.proc.wait_exit(START_TIMEOUT).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "{point}: {}",
            w.proc.log_text()
        );

        let metrics = metrics_addr();
        let mut again = Walrus::build()
            .config(&archive)
            .data(data.path())
            .args(&["--metrics-listen", &metrics])
            .start();
        await_archived(&again, &metrics);
        // No object inside another: what a merge cut short left is deleted at the start, and
        // a merge made since deletes its parts right after it (the upload that made it due
        // was counted first, hence the wait).
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ranges = object_ranges(bucket.path(), status_timeline(&metrics));
            let left_over = ranges.iter().enumerate().find(|(i, a)| {
                ranges
                    .iter()
                    .enumerate()
                    .any(|(j, b)| *i != j && b.0 <= a.0 && a.1 <= b.1)
            });
            let Some((_, a)) = left_over else { break };
            assert!(
                Instant::now() < deadline,
                "{point}: {a:?} is left over in {ranges:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        again.kill_with_valkey();
        drop(again);
        let fresh = Walrus::build()
            .config(&format!("{archive}bootstrap = true\n"))
            .start();
        let mut c = Raw::connect(&fresh.addr);
        for i in &acked {
            assert_eq!(
                c.cmd(&["GET", &format!("k{i}")]),
                bulk(&value),
                "{point}: k{i}"
            );
        }
        eprintln!("{point}: {} acknowledged writes, all there", acked.len());
    }
}

fn status_timeline(metrics: &str) -> u64 {
    status(metrics)["archive_timeline"].as_u64().unwrap()
}

/// A store answering errors (503 to every request): the uploads fail and are counted,
/// `/status` has the store's answer, writes are acknowledged all along (ack local); once it
/// answers again the archive catches up, and the drill passes.
#[test]
fn a_store_answering_errors_is_retried_and_caught_up_with() {
    let store = Seaweed::start();
    store.bucket("walrus");
    let proxy = common::seaweed::ErrorProxy::start(&store.endpoint());
    let archive = format!(
        "[archive]\nurl = \"s3://walrus/errors\"\nendpoint = \"{}\"\nmax_lag_ms = 200\nrequest_timeout_ms = 1000\nmax_backoff_ms = 200\n",
        proxy.endpoint()
    );
    let metrics = metrics_addr();
    let w = Walrus::build()
        .config(&archive)
        .env(&Seaweed::env())
        .args(&["--metrics-listen", &metrics])
        .start();
    write_keys(&w.addr, "a", 20);
    await_archived(&w, &metrics);
    proxy.fail(true);
    write_keys(&w.addr, "b", 20);
    await_status(&w, &metrics, "the store's answer reported", |s| {
        s["archive_error"]
            .as_str()
            .is_some_and(|e| e.contains("503"))
    });
    assert!(
        metric(
            &metrics,
            "walrus_archive_uploads_total{kind=\"journal\",result=\"error\"}"
        ) > 0.0
    );
    proxy.fail(false);
    await_archived(&w, &metrics);
    assert!(status(&metrics)["archive_error"].is_null());
    let out = std::process::Command::new(walrus_bin())
        .args([
            "archive",
            "verify",
            "--config",
            w.data.path().join("walrus.toml").to_str().unwrap(),
        ])
        .envs(Seaweed::env())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
}
