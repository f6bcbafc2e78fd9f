//! A journal ring full to its last byte, then a restore (docs/failure-modes.md, row 19),
//! found by the power-loss generator (docs/power-loss.md, seed 20261124): checkpoints
//! failed until the ring was full, walrus restored a new Valkey (which starts a new
//! replication history), and the checkpoint fault cleared. A checkpoint of the restored
//! Valkey must then cover the whole journal and free the ring, although nothing of the new
//! history could be journaled (there is no room for even a PING); otherwise no checkpoint
//! ever succeeds, the ring never frees, and walrus refuses writes and holds reads for ever.
//! Before the fix (`src/checkpoint/attached.rs`) every checkpoint failed with "checkpoint
//! at <new history>:<offset> does not cover journal entry <lsn> at <old history>:<offset>".

use crate::common;
use common::*;

use std::path::Path;
use std::process::Command;

const OK: &[u8] = b"+OK\r\n";
const SEGMENT: u64 = 1 << 20;
const SEGMENTS: u64 = 16;
/// A record's header and its entry's time (src/journal/format.rs, HEADER_BYTES and
/// ENTRY_TIME_BYTES): what a whole entry costs besides its stream bytes.
const HEADER: u64 = 96 + 8;
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

/// Where the journal stands, from `walrus journal inspect`.
struct Ring {
    /// The durable end's position in the ring.
    end: u64,
    /// The first position it may not write (the head's segment, one lap on).
    limit: u64,
    /// The durable end's replication offset.
    offset: u64,
}

fn inspect(journal: &Path) -> Ring {
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
    let start = number_after("checkpoint:", "log starts at position ");
    Ring {
        end: number_after("durable end:", "at position "),
        limit: (start / SEGMENT + SEGMENTS) * SEGMENT,
        offset: number_after("durable end:", "repl offset "),
    }
}

/// The journal once it holds all of Valkey's stream, `direct` a connection to Valkey. Not
/// WAIT: walrus acknowledges what it received, and WAIT's REPLCONF GETACK would be in the
/// stream too, joining the next write's record when walrus reads both at once.
fn settled(journal: &Path, direct: &mut Raw) -> Ring {
    let info = String::from_utf8(direct.cmd(&["INFO", "replication"])).unwrap();
    let offset: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for _ in 0..1000 {
        let ring = inspect(journal);
        if ring.offset >= offset {
            return ring;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let ring = inspect(journal);
    panic!(
        "the journal did not reach Valkey's offset {offset}: durable end at offset {}, position {} of limit {}",
        ring.offset, ring.end, ring.limit
    );
}

/// `SET key <value>` straight into Valkey, whose replicated form, journaled alone, is a
/// record of exactly `record` bytes; returns the journal once it holds it.
fn set_record(direct: &mut Raw, journal: &Path, key: &str, record: u64) -> Ring {
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
    settled(journal, direct)
}

#[test]
fn a_ring_full_to_its_last_byte_then_a_restore_frees_it_once_checkpoints_work() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flag = dir.path().join("fault-on");
    let spec = format!("return(ENOSPC@{})", flag.display());
    let w = Walrus::build()
        .config(CONFIG)
        .data(&data)
        .failpoint("rdb::write", &spec)
        .with_metrics()
        .start();
    let mut c = Raw::connect(&w.addr);
    for i in 0..20 {
        assert_eq!(c.cmd(&["SET", &format!("ack:{i}"), "v"]), OK);
    }
    let valkey = managed_valkey_addr(&w.addr);
    let mut direct = Raw::connect(&valkey);
    // Checkpoints fail (random values: the RDB passes the fault's 64 KiB threshold) while
    // values written around walrus fill the ring to its last two segments, each journaled
    // before the next (the ring never overflows: no entry waits for room).
    std::fs::write(&flag, b"").unwrap();
    let journal = data.join("journal");
    let large = random_text(64 << 10);
    for i in 0.. {
        if i % 16 == 0 {
            let ring = settled(&journal, &mut direct);
            if ring.limit - ring.end <= 2 * SEGMENT {
                break;
            }
        }
        assert_eq!(
            direct.cmd(&["SET", &format!("around:{}", i % 16), &large]),
            OK
        );
        // One segment at most between checks: the ring never overflows.
        assert_eq!(direct.cmd(&["WAIT", "1", "10000"]), b":1\r\n");
    }
    // Then records to the limit, each SET sent once the journal holds all before it (so
    // that its write continues the last one's block): in each segment a large one that
    // leaves `TAIL` bytes or so, then a small one sized to the byte. Valkey puts a SELECT
    // before a write now and then (after a replica attaches, as a checkpoint's does); a large
    // value reaches walrus in several reads, so that SELECT can be journaled in a write of its
    // own, which the SET's then follows at the next block. So every SET goes to the other
    // database than the one before: the SELECT is always there, and the small one's, in the
    // same read as its SET, is in the same record.
    const TAIL: u64 = 8192;
    let select = "*2\r\n$6\r\nSELECT\r\n$1\r\n0\r\n".len() as u64;
    let mut ring = settled(&journal, &mut direct);
    for db in [1, 0].into_iter().cycle() {
        if ring.end == ring.limit {
            break;
        }
        let room = SEGMENT - ring.end % SEGMENT;
        assert!(
            room > HEADER + select + 64,
            "{room} bytes left in the segment: too few"
        );
        assert_eq!(direct.cmd(&["SELECT", db.to_string().as_str()]), OK);
        if room > 2 * TAIL {
            ring = set_record(&mut direct, &journal, "fill", room - TAIL);
        } else {
            let end = ring.end + room;
            ring = set_record(&mut direct, &journal, "fill", room - select);
            assert_eq!(
                ring.end, end,
                "the SELECT and the SET, in one record, end the segment"
            );
        }
    }
    // Full: the next write waits for room (never acknowledged: Valkey dies with it).
    assert_eq!(direct.cmd(&["SET", "unjournaled", "1"]), OK);
    w.proc.wait_line("journal ring full", START_TIMEOUT);

    // Valkey dies: walrus restores a new one (a new history), and the checkpoint fault is
    // gone.
    let pid = valkey_pid(&valkey);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_dead(pid);
    std::fs::remove_file(&flag).unwrap();
    w.proc.wait_line("restore: Valkey continued", START_TIMEOUT);
    w.await_attached();
    // A checkpoint frees the ring; writes resume; nothing acknowledged is lost.
    w.await_writable();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "after", "restore"]), OK);
    for i in 0..20 {
        assert_eq!(c.cmd(&["GET", &format!("ack:{i}")]), bulk("v"), "ack:{i}");
    }
}
