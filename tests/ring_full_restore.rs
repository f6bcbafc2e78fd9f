//! A journal ring full to its last byte, then a restore (docs/failure-modes.md, row 19),
//! found by the power-loss generator (docs/power-loss.md, seed 20261124): checkpoints
//! failed until the ring was full, walrus restored a new Valkey (which starts a new
//! replication history), and the checkpoint fault cleared. A checkpoint of the restored
//! Valkey must then cover the whole journal and free the ring, although nothing of the new
//! history could be journaled (there is no room for even a PING); otherwise no checkpoint
//! ever succeeds, the ring never frees, and walrus refuses writes and holds reads for ever.
//! Before the fix (`src/checkpoint/attached.rs`) every checkpoint failed with "checkpoint
//! at <new history>:<offset> does not cover journal entry <lsn> at <old history>:<offset>".

mod common;
use common::*;

use std::path::Path;
use std::process::Command;

const OK: &[u8] = b"+OK\r\n";
const SEGMENT: u64 = 1 << 20;
const SEGMENTS: u64 = 16;
/// A record's header (src/journal/format.rs, HEADER_BYTES).
const HEADER: u64 = 96;
/// The sync backend, a fast disk watcher, and no PING from Valkey to its replicas (each
/// would be an entry of its own, in the way of filling the ring to an exact byte).
const CONFIG: &str = "io_backend = \"sync\"\n[disk]\ncheck_interval_ms = 50\n[upstream]\n\
                      extra_args = [\"--repl-ping-replica-period\", \"3600\"]\n";

fn random_text(len: usize) -> String {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ len as u64);
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        s.push_str(&format!("{:016x}", rng.next()));
    }
    s.truncate(len);
    s
}

/// The journal's durable end and the first position it may not write (the head's segment,
/// one lap on), from `walrus journal inspect`.
fn end_and_limit(journal: &Path) -> (u64, u64) {
    let out = Command::new(walrus_bin())
        .args(["journal", "inspect", "--dir"])
        .arg(journal)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let number_after = |prefix: &str, word: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(prefix)).unwrap();
        let rest = &line[line.find(word).unwrap() + word.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let end = number_after("durable end:", "at position ");
    let start = number_after("checkpoint:", "log starts at position ");
    (end, (start / SEGMENT + SEGMENTS) * SEGMENT)
}

/// `SET key <value>` straight into Valkey, whose replicated form, journaled alone, is a
/// record of exactly `record` bytes; returns once walrus has journaled it (WAIT: walrus
/// acknowledges what is durable).
fn set_record(direct: &mut Raw, key: &str, record: u64) {
    let payload = |v: u64| {
        let k = key.len() as u64;
        13 + format!("${k}\r\n").len() as u64 + k + 2 + format!("${v}\r\n").len() as u64 + v + 2
    };
    let mut v = record - HEADER - payload(0);
    while payload(v) + HEADER > record {
        v -= 1;
    }
    assert_eq!(
        payload(v) + HEADER,
        record,
        "no value makes a {record}-byte record"
    );
    let value = random_text(v as usize);
    assert_eq!(direct.cmd(&["SET", key, &value]), OK);
    assert_eq!(direct.cmd(&["WAIT", "1", "10000"]), b":1\r\n");
}

#[test]
fn a_ring_full_to_its_last_byte_then_a_restore_frees_it_once_checkpoints_work() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flag = dir.path().join("fault-on");
    let spec = format!("ENOSPC@{}", flag.display());
    let w = Walrus::build()
        .config(CONFIG)
        .data(&data)
        .env(&[("WALRUS_FAULT_CHECKPOINT", spec.as_str())])
        .start();
    let mut c = Raw::connect(&w.addr);
    for i in 0..20 {
        assert_eq!(c.cmd(&["SET", &format!("ack:{i}"), "v"]), OK);
    }
    let valkey = format!("127.0.0.1:{}", {
        let info = String::from_utf8(c.cmd(&["INFO", "server"])).unwrap();
        let port = info.lines().find_map(|l| l.strip_prefix("tcp_port:"));
        port.unwrap().trim().to_string()
    });
    let mut direct = Raw::connect(&valkey);
    // Checkpoints fail (random values: the RDB passes the fault's 64 KiB threshold) while
    // values written around walrus fill the ring to its last two segments, each journaled
    // before the next (the ring never overflows: no entry waits for room).
    std::fs::write(&flag, b"").unwrap();
    let journal = data.join("journal");
    let large = random_text(64 << 10);
    for i in 0.. {
        if i % 16 == 0 {
            let (end, limit) = end_and_limit(&journal);
            if limit - end <= 2 * SEGMENT {
                break;
            }
        }
        assert_eq!(
            direct.cmd(&["SET", &format!("around:{}", i % 16), &large]),
            OK
        );
        assert_eq!(direct.cmd(&["WAIT", "1", "10000"]), b":1\r\n");
    }
    // Then records to the limit: the rest of this segment, then whole segments, each one
    // record (a write buffer and a segment are both 1 MiB).
    loop {
        let (end, limit) = end_and_limit(&journal);
        if end == limit {
            break;
        }
        let record = SEGMENT - end % SEGMENT;
        assert!(
            record > HEADER + 64,
            "{record} bytes left in the segment: too few"
        );
        set_record(&mut direct, &format!("fill:{end}"), record);
    }
    // Full: the last WAIT's REPLCONF GETACK, in the stream too, waits for room.
    w.proc.wait_line("journal ring full", START_TIMEOUT);

    // Valkey dies: walrus restores a new one (a new history), and the checkpoint fault is
    // gone.
    let pid = valkey_pid(&valkey);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_dead(pid);
    std::fs::remove_file(&flag).unwrap();
    w.proc.wait_line("restore: Valkey continued", START_TIMEOUT);
    w.proc.wait_line("replica link attached", START_TIMEOUT);
    // A checkpoint frees the ring; writes resume; nothing acknowledged is lost.
    w.await_writable();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "after", "restore"]), OK);
    for i in 0..20 {
        assert_eq!(c.cmd(&["GET", &format!("ack:{i}")]), bulk("v"), "ack:{i}");
    }
}
