//! docs/operations.md, procedure by procedure: each test runs the commands the guide shows
//! (`walrus status`, `verify`, `backup`, `checkpoint`, `journal export-aof`) against real
//! valkey-server and walrus processes, in managed mode (the default users run).

use crate::common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const OK: &[u8] = b"+OK\r\n";

/// A walrus (managed) with its metrics endpoint on a free port: (walrus, endpoint).
fn with_metrics(data: Option<&Path>) -> (Walrus, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut b = Walrus::build().args(&["--metrics-listen", &metrics]);
    if let Some(d) = data {
        b = b.data(d);
    }
    let w = b.start();
    (w, metrics)
}

/// Acknowledged writes k0..kn = v0..vn.
fn set_keys(c: &mut Raw, n: usize) {
    for i in 0..n {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), &format!("v{i}")]), OK);
    }
}

/// `walrus backup --to` against the running walrus at `metrics`.
fn backup_to(metrics: &str, to: &Path) -> Output {
    run_walrus(&["backup", "--metrics", metrics, "--to", to.to_str().unwrap()])
}

/// A managed walrus that acknowledged k0..kn, then stopped as the guide stops it; and its
/// data directory (which lives as long as the walrus value).
fn written_then_stopped(n: usize) -> (Walrus, std::path::PathBuf) {
    let (mut w, _) = with_metrics(None);
    let mut c = Raw::connect(&w.addr);
    set_keys(&mut c, n);
    w.stop();
    let data = w.data.path().join("data");
    (w, data)
}

/// The guide's resize: an offline backup of `from` into a ring of `segments` at `to`.
fn resize(from: &Path, to: &Path, segments: u32) -> Output {
    let out = run_walrus(&[
        "backup",
        "--data-dir",
        from.to_str().unwrap(),
        "--to",
        to.to_str().unwrap(),
        "--segments",
        &segments.to_string(),
    ]);
    assert!(out.status.success(), "{}", output_text(&out));
    out
}

/// A JSON field of `walrus status -o json`, as text.
fn field(json: &str, key: &str) -> String {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    let rest = &json[at + key.len() + 3..];
    rest[..rest.find([',', '}']).unwrap()]
        .trim_matches('"')
        .to_string()
}

/// The guide's "Status" and "Backup and restore from a backup": a backup taken while a
/// client writes holds every write acknowledged before it began; after walrus and Valkey
/// are killed, a walrus started on the backup serves them all.
#[test]
fn a_backup_taken_while_writing_restores_every_write_acknowledged_before_it() {
    let (mut w, metrics) = with_metrics(None);
    // Status, both forms.
    let out = run_walrus(&["status", "--metrics", &metrics]);
    assert!(out.status.success(), "{}", output_text(&out));
    let human = String::from_utf8_lossy(&out.stdout).to_string();
    for want in [
        "ready        yes",
        "link         attached",
        "of 16 segments",
    ] {
        assert!(human.contains(want), "{want:?} in\n{human}");
    }
    let out = run_walrus(&["status", "--metrics", &metrics, "-o", "json"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let json = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(field(&json, "attached"), "true", "{json}");
    assert_eq!(field(&json, "ready"), "true", "{json}");
    assert_eq!(field(&json, "ring_segments_total"), "16", "{json}");
    assert_ne!(field(&json, "checkpoint_offset"), "null", "{json}");

    // A client writes on through the backup; `acked` counts its acknowledged SETs.
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop, addr) = (acked.clone(), stop.clone(), w.addr.clone());
        std::thread::spawn(move || {
            let mut c = Raw::connect(&addr);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = c.cmd(&["SET", &format!("k{i}"), &format!("v{i}")]);
                assert_eq!(r, OK, "SET k{i}: {}", show(&r));
                i += 1;
                acked.store(i, Ordering::Release);
            }
        })
    };
    // Some writes first, so that the backup has a journal to copy.
    while acked.load(Ordering::Acquire) < 200 {
        std::thread::yield_now();
    }
    let backups = tempfile::tempdir().unwrap();
    let to = backups.path().join("b1");
    let before = acked.load(Ordering::Acquire);
    // Checkpoints asked for meanwhile: each records a new RDB (deleting the old one's name)
    // and would release the journal, which the backup's pin defers until its copy is done.
    let checkpoints = {
        let (stop, metrics) = (stop.clone(), metrics.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = run_walrus(&["checkpoint", "--metrics", &metrics]);
                assert!(out.status.success(), "{}", output_text(&out));
            }
        })
    };
    let out = backup_to(&metrics, &to);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    checkpoints.join().unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("backup written to"),
        "{}",
        output_text(&out)
    );
    // Inside walrus's own directories: refused.
    let inside = w.data.path().join("data/checkpoints/b");
    let out = backup_to(&metrics, &inside);
    assert!(
        output_text(&out).contains("inside walrus's own"),
        "{}",
        output_text(&out)
    );
    // Refused as asked: a person must act (2), a retry would not help.
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    // A web page on walrus's host cannot post to it: a request with Origin is refused.
    let from_page = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&metrics).unwrap();
        let body = backups.path().join("from-a-page");
        let body = body.to_str().unwrap();
        write!(
            s,
            "POST /backup HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    };
    assert!(from_page.starts_with("HTTP/1.1 403"), "{from_page}");
    assert!(!backups.path().join("from-a-page").exists());
    // A second backup into the same directory is refused: it is not empty.
    let out = backup_to(&metrics, &to);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("is not empty"),
        "{}",
        output_text(&out)
    );

    // Offline check of the copy.
    let out = run_walrus(&["verify", "--data-dir", to.to_str().unwrap()]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("OK: a restore from"),
        "{}",
        output_text(&out)
    );

    // Lose walrus and its Valkey; restore from the backup into a fresh walrus.
    w.kill_with_valkey();
    let (restored, _) = with_metrics(Some(&to));
    let mut c = Raw::connect(&restored.addr);
    for i in 0..before {
        assert_eq!(
            c.cmd(&["GET", &format!("k{i}")]),
            bulk(format!("v{i}")),
            "k{i} was acknowledged before the backup began ({before} were)"
        );
    }
    // The restored walrus takes writes, and its own backups.
    assert_eq!(c.cmd(&["SET", "after", "1"]), OK);
}

/// Bytes in the files of data directory `dir` but its locks, and in its journal's segment
/// files.
fn sizes(dir: &Path) -> (u64, u64) {
    let (mut all, mut segments) = (0, 0);
    for sub in ["journal", "checkpoints"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_name() == "LOCK" {
                continue;
            }
            let len = e.metadata().unwrap().len();
            all += len;
            if sub == "journal" && e.file_name().to_string_lossy().starts_with("seg-") {
                segments += len;
            }
        }
    }
    (all, segments)
}

/// A number printed after `before` in `text`.
fn number_after(text: &str, before: &str) -> u64 {
    let at = text
        .find(before)
        .unwrap_or_else(|| panic!("{before:?} in {text}"))
        + before.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A backup holds the checkpoint and the journal entries after it, not the ring's empty
/// segments: its journal's files hold its records and no more, `walrus verify` passes on it,
/// and walrus started on it restores every key with its ring whole again.
#[test]
fn a_small_datasets_backup_is_small_and_restores_exactly() {
    use walrus::journal::format::{entry_span_bound, BLOCK_BYTES};
    // Offline, so that the journal after the recorded checkpoint holds every write.
    let (_w, data) = written_then_stopped(200);
    let backups = tempfile::tempdir().unwrap();
    let to = backups.path().join("small");
    let out = run_walrus(&[
        "backup",
        "--data-dir",
        data.to_str().unwrap(),
        "--to",
        to.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", output_text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let rdb = number_after(&said[said.find("checkpoint: ").unwrap()..], " (");
    let entries = number_after(&said, "journal: ");
    let stream = number_after(&said, "entries, ");
    assert!(entries >= 200, "{said}");
    // The most ring the entries can take, by the journal's own rule (linear in an entry's
    // length, so summed over them from their count and their bytes), the log's last block
    // kept whole.
    let write = walrus::journal::JournalConfig::for_geometry(1 << 20, 16).max_write_bytes;
    let span = |len| entry_span_bound(len, write, 1 << 20);
    let most = span(stream) + (entries - 1) * (span(0) + 1) + BLOCK_BYTES as u64;
    let (all, segments) = sizes(&to);
    assert!(
        segments <= most,
        "{segments} bytes of segments, at most {most} for the entries: {said}"
    );
    // Besides: the RDB and the two manifests, each with its previous version, a block each.
    let listing = || {
        let out = Command::new("ls").args(["-lR"]).arg(&to).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        all - segments <= rdb + 4 * BLOCK_BYTES as u64,
        "{all}: {said}{}",
        listing()
    );
    let out = run_walrus(&["verify", "--data-dir", to.to_str().unwrap()]);
    assert!(out.status.success(), "{}", output_text(&out));

    let (_restored, metrics) = with_metrics(Some(&to));
    let mut c = Raw::connect(&_restored.addr);
    for i in 0..200 {
        assert_eq!(
            c.cmd(&["GET", &format!("k{i}")]),
            bulk(format!("v{i}")),
            "k{i}"
        );
    }
    // The ring as configured: 16 segments of 1 MiB, each file whole.
    let (_, segments) = sizes(&to);
    assert_eq!(segments, 16 << 20);
    let out = run_walrus(&["status", "--metrics", &metrics, "-o", "json"]);
    assert_eq!(
        field(&String::from_utf8_lossy(&out.stdout), "ring_segments_total"),
        "16"
    );
}

/// The guide's "Status": at an address where walrus is not, every admin command fails at
/// once, naming the address and what to check; before, `walrus checkpoint` waited 600 s
/// for a silent listener and said "os error 11".
#[test]
fn admin_commands_at_a_wrong_address_fail_at_once_naming_it() {
    // Accepts connections and never answers: a client port, another service.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let held = std::thread::spawn(move || {
        let conns: Vec<_> = silent.incoming().take(3).collect();
        conns
    });
    // Nothing listens here.
    let closed = format!("127.0.0.1:{}", free_port());
    for (cmd, addr) in [
        (vec!["checkpoint"], &silent_addr),
        (vec!["status"], &silent_addr),
        (vec!["backup", "--to", "/tmp/walrus-never"], &silent_addr),
        (vec!["checkpoint"], &closed),
        (vec!["status"], &closed),
    ] {
        let mut args = cmd.clone();
        args.extend(["--metrics", addr]);
        let mut c = Command::new(walrus_bin());
        c.args(&args);
        let mut p = Proc::spawn(c, true);
        // Its one line of error, then its exit; before, the line came after 600 s.
        let line = p
            .try_wait_line("metrics endpoint", Duration::from_secs(20))
            .unwrap_or_else(|| {
                panic!(
                    "walrus {} said nothing about its metrics endpoint within 20 s:\n{}",
                    args.join(" "),
                    p.log_text()
                )
            });
        assert!(line.contains(addr.as_str()), "{args:?}: {line}");
        let status = p.wait_exit(START_TIMEOUT).unwrap();
        assert!(!status.success(), "{args:?}: {line}");
    }
    assert!(!Path::new("/tmp/walrus-never").exists());
    drop(held);
}

/// The guide's "Verify": exit 0 for a good data directory, 1 naming the damaged file, 2
/// for a directory that is no data directory.
#[test]
fn verify_names_what_a_restore_would_fail_on() {
    let (mut w, metrics) = with_metrics(None);
    let mut c = Raw::connect(&w.addr);
    for i in 0..50 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), "v"]), OK);
    }
    let out = run_walrus(&["checkpoint", "--metrics", &metrics]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(c.cmd(&["SET", "after", "1"]), OK);
    w.kill_with_valkey();
    let data = w.data.path().join("data");
    let out = run_walrus(&["verify", "--data-dir", data.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let t = output_text(&out);
    assert!(
        t.contains("with no gap") && t.contains("default rates"),
        "{t}"
    );
    // Not a data directory: a usage error.
    let empty = tempfile::tempdir().unwrap();
    let out = run_walrus(&["verify", "--data-dir", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    // A flipped byte in the checkpoint: named, exit 1.
    let cp = std::fs::read_dir(data.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "rdb"))
        .unwrap();
    let mut bytes = std::fs::read(&cp).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&cp, &bytes).unwrap();
    let out = run_walrus(&["verify", "--data-dir", data.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    let t = output_text(&out);
    let name = cp.file_name().unwrap().to_str().unwrap();
    assert!(
        t.contains("FAILED") && t.contains(name) && t.contains("checksum mismatch"),
        "{t}"
    );
}

/// The guide's "Resizing the ring": the configured geometry is refused on a journal of
/// another; the offline backup into a ring of the new size, then walrus on it, keeps every
/// write; and back again.
#[test]
fn the_ring_is_resized_through_an_offline_backup_and_back() {
    let (_stopped, data) = written_then_stopped(300);
    let bigger = "[journal]\nsegment_size = 1048576\nsegments = 24\nmax_entry_bytes = 8388608\n";
    let line = refuses_to_start_with_journal(&data, bigger);
    assert!(
        line.contains("an existing ring is never resized in place")
            && line.contains("\"Resizing the ring\""),
        "{line}"
    );

    let dirs = tempfile::tempdir().unwrap();
    let resized = dirs.path().join("resized");
    let out = resize(&data, &resized, 24);
    // The writes are in the journal after the first checkpoint (empty, at offset 0): the
    // copy must carry them (a copy without its journal fails the GETs below).
    assert!(
        output_text(&out).contains("journal: 301 entries"),
        "{}",
        output_text(&out)
    );
    let out = run_walrus(&["verify", "--data-dir", resized.to_str().unwrap()]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("24 segments"),
        "{}",
        output_text(&out)
    );
    let mut w = Walrus::build().journal(bigger).data(&resized).start();
    let mut c = Raw::connect(&w.addr);
    for i in 0..300 {
        assert_eq!(c.cmd(&["GET", &format!("k{i}")]), bulk(format!("v{i}")));
    }
    assert_eq!(c.cmd(&["SET", "in-the-bigger-ring", "1"]), OK);
    w.stop();
    // Coming back: the same, into the original geometry.
    let back = dirs.path().join("back");
    resize(&resized, &back, 16);
    let w = Walrus::build().data(&back).start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["GET", "in-the-bigger-ring"]), bulk("1"));
    assert_eq!(c.cmd(&["GET", "k299"]), bulk("v299"));
}

/// Starts walrus on `data` with the `[journal]` table `journal`, expecting it to refuse;
/// returns the refusal's line.
fn refuses_to_start_with_journal(data: &Path, journal: &str) -> String {
    let (mut p, _cfg) = Walrus::build().journal(journal).data(data).spawn();
    let line = p.wait_line("never resized in place", START_TIMEOUT);
    // A mistake to fix, not to retry: systemd does not restart on 2.
    assert_eq!(p.wait_exit(START_TIMEOUT).unwrap().code(), Some(2));
    line
}

/// The guide's "Upgrading": `walrus checkpoint` first (the restart's restore is then
/// short), SIGTERM (held replies drain), the new binary on the same data directory.
#[test]
fn an_upgrade_is_a_checkpoint_a_sigterm_and_a_start_on_the_same_data() {
    let (mut w, metrics) = with_metrics(None);
    let mut c = Raw::connect(&w.addr);
    for i in 0..100 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), "v"]), OK);
    }
    let status = |metrics: &str| {
        let out = run_walrus(&["status", "--metrics", metrics, "-o", "json"]);
        assert!(out.status.success(), "{}", output_text(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let first = field(&status(&metrics), "checkpoint_offset");
    let out = run_walrus(&["checkpoint", "--metrics", &metrics]);
    assert!(out.status.success(), "{}", output_text(&out));
    // The checkpoint covers the writes: the restart's restore replays no journal of them.
    let taken = status(&metrics);
    assert!(
        field(&taken, "checkpoint_offset").parse::<u64>().unwrap() > first.parse().unwrap(),
        "{first} then {taken}"
    );
    w.stop();
    let data = w.data.path().join("data");
    let (w2, metrics) = with_metrics(Some(&data));
    let mut c = Raw::connect(&w2.addr);
    assert_eq!(c.cmd(&["GET", "k99"]), bulk("v"));
    let after = status(&metrics);
    assert_eq!(field(&after, "ready"), "true", "{after}");
    assert_eq!(
        field(&after, "checkpoint_offset"),
        field(&taken, "checkpoint_offset"),
        "{after}"
    );
    // After the restart the last checkpoint is the one taken before it, not "none": the
    // checkpoint alerts and the dashboard's age read this gauge.
    let (_, scrape) = common::http_get(&metrics, "/metrics");
    let last = scrape
        .lines()
        .find_map(|l| l.strip_prefix("walrus_checkpoint_last_success_timestamp_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("the gauge is exported");
    assert!(last > 1.7e9, "{last}");
}

/// The guide's "Leaving walrus": `walrus journal export-aof`, then a stock valkey-server
/// with appendonly loads every write.
#[test]
fn leaving_walrus_through_export_aof() {
    let (_stopped, data) = written_then_stopped(100);
    let out = run_walrus(&["verify", "--data-dir", data.to_str().unwrap()]);
    assert!(out.status.success(), "{}", output_text(&out));
    let aof_dir = tempfile::tempdir().unwrap();
    let out = export_aof(&data, &aof_dir.path().join("appendonly.aof"));
    assert!(out.status.success(), "{}", output_text(&out));
    let v = Valkey::start_with(&[
        "--appendonly",
        "yes",
        "--dir",
        aof_dir.path().to_str().unwrap(),
    ]);
    let mut c = Raw::connect(&v.addr());
    assert_eq!(c.cmd(&["GET", "k99"]), bulk("v99"));
    assert_eq!(c.cmd(&["DBSIZE"]), b":100\r\n");
}

/// The admin commands find walrus from its configuration file (`--config`), and one pointed
/// at a client port says it is one instead of suspecting walrus.
#[test]
fn admin_commands_take_the_configuration_and_name_a_client_port() {
    let (w, metrics) = with_metrics(None);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("walrus.toml");
    std::fs::write(&cfg, format!("[metrics]\nlisten = \"{metrics}\"\n")).unwrap();
    let out = run_walrus(&["status", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(output_text(&out).contains("ready"), "{}", output_text(&out));
    let out = run_walrus(&["status", "--metrics", &w.addr]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("speaks RESP, not HTTP: it is a client port"),
        "{}",
        output_text(&out)
    );
    std::fs::write(&cfg, "[metrics]\nlisten = \"\"\n").unwrap();
    let out = run_walrus(&["status", "-c", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("metrics.listen is empty"),
        "{}",
        output_text(&out)
    );
}
