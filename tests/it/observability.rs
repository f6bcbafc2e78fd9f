//! What an operator scrapes: `/metrics` checked by Prometheus's own parser (promtool) and
//! read back after a workload, `/healthz`, `/readyz` telling the truth during a restore, and
//! `INFO persistence` through walrus saying what walrus persists. The figures must move as
//! the workload implies.
use crate::common;
use common::*;

use std::collections::BTreeMap;

const OK: &[u8] = b"+OK\r\n";

/// Samples by `name{labels}` (labels as Prometheus prints them, sorted by name).
type Samples = BTreeMap<String, f64>;

/// Scrapes `/metrics`, checks it with `promtool check metrics` (Prometheus's text parser
/// and linter; deploy/setup.sh installs it), and parses the samples.
fn scrape(metrics: &str) -> Samples {
    let (code, body) = http_get(metrics, "/metrics");
    assert_eq!(code, 200);
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool not found: run deploy/setup.sh");
    use std::io::Write;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

fn get(s: &Samples, key: &str) -> f64 {
    *s.get(key)
        .unwrap_or_else(|| panic!("no sample {key}; have {:?}", s.keys()))
}

#[test]
fn metrics_move_as_the_workload_implies() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .args(&["--metrics-listen", &metrics])
        .start();
    assert_eq!(http_get(&metrics, "/healthz").0, 200);
    assert_eq!(http_get(&metrics, "/readyz"), (200, "ready\n".into()));
    let before = scrape(&metrics);
    let build = before
        .keys()
        .find(|k| k.starts_with("walrus_build_info{"))
        .unwrap();
    assert!(build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))));
    assert_eq!(get(&before, build), 1.0);
    assert!(before
        .keys()
        .any(|k| k.starts_with("walrus_journal_info{backend=")));

    // Command counters are made as commands are answered (each result apart), not one
    // pair per command of Valkey's table before any traffic.
    let counters = |s: &Samples| {
        s.keys()
            .filter(|k| k.starts_with("walrus_commands_total{"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(counters(&before), Vec::<String>::new());
    let mut c = Raw::connect(&w.addr);
    for i in 0..200 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), "v"]), OK);
    }
    for i in 0..100 {
        assert_eq!(c.cmd(&["GET", &format!("k{i}")]), b"$1\r\nv\r\n");
    }
    for _ in 0..5 {
        assert!(c.cmd(&["INCR", "k1"]).starts_with(b"-ERR"));
    }
    assert!(c.cmd(&["NOSUCHCOMMAND"]).starts_with(b"-ERR"));
    // A blocking command waits as long as its client asks: its latency is kept apart.
    assert_eq!(c.cmd(&["BLPOP", "empty-list", "0.05"]), b"*-1\r\n");
    let after = scrape(&metrics);
    let moved = |key: &str| get(&after, key) - before.get(key).copied().unwrap_or(0.0);
    assert_eq!(
        moved("walrus_commands_total{cmd=\"set\",result=\"ok\"}"),
        200.0
    );
    assert_eq!(
        moved("walrus_commands_total{cmd=\"get\",result=\"ok\"}"),
        100.0
    );
    assert_eq!(
        moved("walrus_commands_total{cmd=\"incr\",result=\"error\"}"),
        5.0
    );
    assert_eq!(
        moved("walrus_commands_total{cmd=\"other\",result=\"error\"}"),
        1.0
    );
    assert_eq!(
        counters(&after),
        [
            "walrus_commands_total{cmd=\"blpop\",result=\"ok\"}",
            "walrus_commands_total{cmd=\"get\",result=\"ok\"}",
            "walrus_commands_total{cmd=\"incr\",result=\"error\"}",
            "walrus_commands_total{cmd=\"other\",result=\"error\"}",
            "walrus_commands_total{cmd=\"set\",result=\"ok\"}",
        ]
    );
    // The server behind walrus, as INFO through walrus gives it.
    let info = String::from_utf8(Raw::connect(&w.addr).cmd(&["INFO", "server"])).unwrap();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("valkey_version:"))
        .expect("valkey_version in INFO server");
    assert_eq!(
        get(
            &after,
            &format!("walrus_valkey_info{{server=\"valkey\",version=\"{version}\"}}")
        ),
        1.0
    );
    let class = |c: &str| {
        moved(&format!(
            "walrus_command_duration_seconds_count{{class=\"{c}\"}}"
        ))
    };
    assert_eq!(class("write"), 205.0);
    assert_eq!(class("read"), 100.0);
    assert_eq!(class("other"), 1.0);
    assert_eq!(class("blocking"), 1.0);
    // 30 s, durability.max_hold_ms's default, is a bucket: a stalled disk shows as such.
    assert!(after.contains_key("walrus_journal_fsync_duration_seconds_bucket{le=\"30\"}"));
    // The process's own figures, under their standard names.
    assert!(get(&after, "process_resident_memory_bytes") > 0.0);
    assert!(get(&after, "process_open_fds") > 0.0);
    assert!(moved("walrus_ack_hold_seconds_count") >= 200.0);
    assert!(moved("walrus_journal_entries_total") >= 200.0);
    assert!(moved("walrus_journal_written_bytes_total") >= 4096.0);
    assert!(moved("walrus_journal_fsync_duration_seconds_count") >= 1.0);
    assert!(moved("walrus_journal_write_duration_seconds_count") >= 1.0);
    assert!(get(&after, "walrus_clients_accepted_total") >= 1.0);
    assert_eq!(get(&after, "walrus_clients_connected"), 1.0);
    assert_eq!(get(&after, "walrus_replica_link_up"), 1.0);
    assert_eq!(get(&after, "walrus_upstream_connected"), 1.0);
    assert_eq!(get(&after, "walrus_journal_failed"), 0.0);
    // Every write was acknowledged, so the journal covers all Valkey ran: no lag, nothing
    // held.
    assert_eq!(get(&after, "walrus_durable_lag_bytes"), 0.0);
    assert_eq!(get(&after, "walrus_held_replies"), 0.0);
    assert_eq!(get(&after, "walrus_held_bytes"), 0.0);
    assert!(get(&after, "walrus_journal_free_segments") > 0.0);

    // A checkpoint asked for is counted, with its size, time and reason.
    let out = std::process::Command::new(walrus_bin())
        .args(["checkpoint", "--metrics", &metrics])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cp = scrape(&metrics);
    assert_eq!(
        get(&cp, "walrus_checkpoints_total"),
        get(&after, "walrus_checkpoints_total") + 1.0
    );
    assert!(get(&cp, "walrus_checkpoint_last_size_bytes") > 0.0);
    let request = "walrus_checkpoint_started_total{reason=\"request\"}";
    assert_eq!(get(&cp, request), get(&after, request) + 1.0);
    assert!(
        get(&cp, "walrus_checkpoint_written_bytes_total")
            >= get(&after, "walrus_checkpoint_written_bytes_total")
                + get(&cp, "walrus_checkpoint_last_size_bytes")
    );
    assert!(get(&cp, "walrus_checkpoint_last_success_timestamp_seconds") > 1.7e9);
}

/// While walrus restores Valkey after a restart, `/healthz` answers 200 (a liveness probe
/// must not kill it) and `/readyz` 503 with the reason; then 200.
#[test]
fn readiness_tells_the_truth_during_a_restore() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().join("data");
    let w = Walrus::build().data(&data).start();
    let mut c = Raw::connect(&w.addr);
    // About 200 MB, so that the restore lasts long enough to be seen.
    let value = "x".repeat(1 << 20);
    let mut batch = Vec::new();
    for i in 0..200 {
        batch.extend_from_slice(&walrus::resp::write::command([
            "SET",
            &format!("big:{i}"),
            &value,
        ]));
    }
    c.send_raw(&batch);
    for _ in 0..200 {
        assert_eq!(c.read_frame(), OK);
    }
    let mut w = w;
    w.kill_with_valkey();

    let metrics = format!("127.0.0.1:{}", free_port());
    let (proc, _cfg) = Walrus::build()
        .args(&["--metrics-listen", &metrics])
        .data(&data)
        .spawn();
    proc.wait_line("metrics on http://", START_TIMEOUT);
    // Each answer is an event; the loop ends at the first 200.
    let mut seen = Vec::new();
    loop {
        assert_eq!(http_get(&metrics, "/healthz").0, 200);
        let (code, body) = http_get(&metrics, "/readyz");
        if code == 200 {
            break;
        }
        assert_eq!(code, 503, "{body}");
        if seen.last() != Some(&body) {
            seen.push(body);
        }
    }
    assert!(
        seen.iter()
            .any(|b| b == "not ready: restoring Valkey from the checkpoint and journal\n"),
        "{seen:?}"
    );
    let addr = listening_addr(&proc);
    let mut c = Raw::connect(&addr);
    assert_eq!(c.cmd(&["STRLEN", "big:199"]), b":1048576\r\n");
    // The restore's RDB phase (about 200 MB) replaced the default load rate the
    // checkpoints' restore estimate starts from.
    let rate = get(
        &scrape(&metrics),
        "walrus_restore_rdb_load_bytes_per_second",
    );
    assert!(rate > 0.0 && rate != 50e6, "{rate}");
}

/// `log.format = "json"`: one JSON object per line, state changes included.
#[test]
fn json_logs_are_one_object_per_line() {
    let w = Walrus::build().config("[log]\nformat = \"json\"\n").start();
    let log = w.proc.log_text();
    let attached = log
        .lines()
        .find(|l| l.contains("replica link attached"))
        .expect("the attach is logged");
    assert!(
        attached.starts_with('{') && attached.ends_with('}'),
        "{attached}"
    );
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import json,sys; [json.loads(l) for l in sys.stdin if l.startswith('{')]",
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut p| {
            use std::io::Write;
            p.stdin.take().unwrap().write_all(log.as_bytes())?;
            p.wait()
        })
        .unwrap();
    assert!(out.success(), "{log}");
}

/// The Persistence section of an `INFO` reply: its `key:value` lines, checked to be laid
/// out as Valkey lays out a section (a header, CRLF lines, a blank line before the next).
fn persistence(reply: &[u8]) -> BTreeMap<String, String> {
    let text = String::from_utf8(reply.to_vec()).unwrap();
    let body = text
        .split_once("# Persistence\r\n")
        .unwrap_or_else(|| panic!("no Persistence section: {text}"))
        .1;
    let body = body.split("\r\n\r\n").next().unwrap();
    body.split("\r\n")
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l
                .split_once(':')
                .unwrap_or_else(|| panic!("{l:?} in {text}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// `INFO persistence` through walrus shows walrus's persistence (Valkey behind it runs
/// with none): the journal as `aof_enabled:1`, a checkpoint's time, count and status as
/// the RDB fields, walrus's own figures as `walrus_*`; in `INFO`, `INFO all` and a RESP3
/// reply as well, the other sections Valkey's. With durability off, Valkey's own.
#[test]
fn info_persistence_shows_the_journal_and_checkpoints() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut c = Raw::connect(&w.addr);
    for i in 0..10 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), "v"]), OK);
    }
    let before = persistence(&c.cmd(&["INFO", "persistence"]));
    for (k, v) in [
        ("aof_enabled", "1"),
        ("aof_last_write_status", "ok"),
        ("rdb_bgsave_in_progress", "0"),
        ("rdb_last_bgsave_status", "ok"),
        ("rdb_current_bgsave_time_sec", "-1"),
        ("walrus_writes_refused", "0"),
        ("walrus_writes_refused_reason", ""),
        // Valkey's own: the Valkey process's figures.
        ("current_cow_size", "0"),
    ] {
        assert_eq!(
            before.get(k).map(String::as_str),
            Some(v),
            "{k}: {before:?}"
        );
    }
    let number = |m: &BTreeMap<String, String>, k: &str| -> i64 {
        m.get(k)
            .unwrap_or_else(|| panic!("no {k}: {m:?}"))
            .parse()
            .unwrap()
    };
    assert!(
        number(&before, "rdb_changes_since_last_save") >= 10,
        "{before:?}"
    );
    assert!(number(&before, "walrus_durable_offset") > 0, "{before:?}");
    assert!(number(&before, "aof_current_size") > 0, "{before:?}");
    assert_eq!(number(&before, "walrus_ring_segments_total"), 16);

    let asked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let out = std::process::Command::new(walrus_bin())
        .args(["checkpoint", "--metrics", &metrics])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    let after = persistence(&c.cmd(&["INFO", "persistence"]));
    assert!(number(&after, "rdb_last_save_time") >= asked, "{after:?}");
    assert_eq!(
        number(&after, "rdb_saves"),
        number(&before, "rdb_saves") + 1
    );
    assert!(number(&after, "rdb_last_bgsave_time_sec") >= 0, "{after:?}");
    assert!(number(&after, "walrus_checkpoint_offset") > 0, "{after:?}");
    assert!(
        number(&after, "rdb_changes_since_last_save")
            < number(&before, "rdb_changes_since_last_save"),
        "{after:?}"
    );

    // The section within the default, `all` and several-section replies, and in RESP3's
    // verbatim string; the other sections stay Valkey's.
    for cmd in [
        &["INFO"][..],
        &["INFO", "all"],
        &["INFO", "everything"],
        &["INFO", "server", "PERSISTENCE"],
    ] {
        let reply = c.cmd(cmd);
        assert_eq!(persistence(&reply)["aof_enabled"], "1", "{cmd:?}");
        assert!(
            String::from_utf8_lossy(&reply).contains("# Server\r\nredis_version:"),
            "{cmd:?}"
        );
    }
    let mut resp3 = Raw::connect(&w.addr);
    assert!(resp3.cmd(&["HELLO", "3"]).starts_with(b"%"));
    let reply = resp3.cmd(&["INFO", "persistence"]);
    assert!(reply.starts_with(b"="), "{}", show(&reply));
    assert_eq!(persistence(&reply)["aof_enabled"], "1");

    // Without a journal there is nothing of walrus's to show.
    let off = Walrus::build()
        .config("[durability]\nenabled = false\n")
        .start();
    let section = persistence(&Raw::connect(&off.addr).cmd(&["INFO", "persistence"]));
    assert_eq!(section["aof_enabled"], "0", "{section:?}");
    assert!(
        !section.keys().any(|k| k.starts_with("walrus_")),
        "{section:?}"
    );
}
