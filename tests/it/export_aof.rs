//! `walrus journal export-aof`: the checkpoint plus the journal after it, written as one AOF
//! with an RDB preamble, loads into a stock valkey-server (`--appendonly yes`) as exactly
//! the dataset walrus's Valkey held.

use crate::common;
use common::*;

use std::path::PathBuf;

const OK: &[u8] = b"+OK\r\n";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The integer in a `:N` reply.
fn int(reply: &[u8]) -> i64 {
    let s = text(reply);
    s.strip_prefix(':')
        .and_then(|s| s.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("not an integer reply: {}", show(reply)))
}

/// The number after `label` in the export's report, e.g. `commands kept`.
fn reported(stdout: &str, label: &str) -> u64 {
    let at = stdout
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in:\n{stdout}"));
    stdout[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number before {label:?} in:\n{stdout}"))
}

/// The keys checked value by value on both servers: (database, key, command reading it).
fn probes() -> Vec<(u32, String, Vec<String>)> {
    let mut p: Vec<(u32, String, Vec<String>)> = Vec::new();
    let mut add = |db: u32, key: &str, cmd: &[&str]| {
        let mut c: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        c.insert(1, key.to_string());
        p.push((db, key.to_string(), c));
    };
    for db in [0, 3, 7] {
        add(db, "plain", &["GET"]);
        add(db, "after", &["GET"]);
        add(db, "h", &["HGETALL"]);
        add(db, "l", &["LRANGE", "0", "-1"]);
    }
    add(0, "ttl", &["GET"]);
    add(0, "scripted", &["GET"]);
    add(0, "tx:a", &["GET"]);
    add(0, "tx:n", &["GET"]);
    add(0, "tx:h", &["HGETALL"]);
    add(0, "late:script", &["GET"]);
    add(3, "late:tx", &["GET"]);
    add(3, "gone", &["GET"]);
    add(1, "big:0", &["STRLEN"]);
    add(1, "big:299", &["GET"]);
    add(1, "late:big", &["GET"]);
    p
}

fn select(c: &mut Raw, db: u32) {
    assert_eq!(c.cmd(&["SELECT", &db.to_string()]), OK);
}

/// What one server holds: the digest of all databases, the size of each, and every probe's
/// type and reply (labelled).
struct Snapshot {
    digest: Vec<u8>,
    sizes: Vec<i64>,
    values: Vec<(String, Vec<u8>, Vec<u8>)>,
}

fn snapshot(addr: &str) -> Snapshot {
    let mut c = Raw::connect(addr);
    let digest = c.cmd(&["DEBUG", "DIGEST"]);
    let sizes = (0..16)
        .map(|db| {
            select(&mut c, db);
            int(&c.cmd(&["DBSIZE"]))
        })
        .collect();
    let values = probes()
        .into_iter()
        .map(|(db, key, cmd)| {
            select(&mut c, db);
            let ty = c.cmd(&["TYPE", &key]);
            (format!("db {db}: {}", cmd.join(" ")), ty, c.cmd(&cmd))
        })
        .collect();
    Snapshot {
        digest,
        sizes,
        values,
    }
}

/// Writes through walrus: several databases, a TTL, a hash, a list, a script, transactions,
/// enough bulk that a checkpoint is taken, and more of everything after it.
fn write_dataset(w: &Walrus, v: &str) {
    let taken = w.checkpoints();
    let mut c = Raw::connect(&w.addr);
    for db in [0u32, 3, 7] {
        select(&mut c, db);
        let d = db.to_string();
        assert_eq!(c.cmd(&["SET", "plain", &format!("value in db {d}")]), OK);
        assert_eq!(
            int(&c.cmd(&["HSET", "h", "f1", &d, "f2", "two", "f3", "3"])),
            3
        );
        assert_eq!(int(&c.cmd(&["RPUSH", "l", "a", &d, "c"])), 3);
        assert_eq!(c.cmd(&["SET", "gone", "deleted after the checkpoint"]), OK);
    }
    select(&mut c, 0);
    assert_eq!(c.cmd(&["SET", "ttl", "expires", "EX", "1000"]), OK);
    let script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCRBY', KEYS[2], 5)";
    assert_eq!(
        int(&c.cmd(&["EVAL", script, "2", "scripted", "tx:n", "by a script"])),
        5
    );
    assert_eq!(c.cmd(&["MULTI"]), OK);
    assert_eq!(c.cmd(&["SET", "tx:a", "in a transaction"]), b"+QUEUED\r\n");
    assert_eq!(c.cmd(&["INCR", "tx:n"]), b"+QUEUED\r\n");
    assert_eq!(c.cmd(&["HSET", "tx:h", "k", "v"]), b"+QUEUED\r\n");
    assert_eq!(show(&c.cmd(&["EXEC"])), "*3⏎+OK⏎:6⏎:1⏎");

    // Bulk in database 1: the test ring is 16 MiB and a checkpoint starts at half full.
    select(&mut c, 1);
    for i in 0..300 {
        let value = format!("{i:08}").repeat(5 * 1024); // 40 KiB
        assert_eq!(c.cmd(&["SET", &format!("big:{i}"), &value]), OK);
    }
    w.await_checkpoint(taken);

    // After the checkpoint: new keys, overwrites, a delete, a script and a transaction, in
    // several databases, and a WAIT, which makes Valkey ask its replicas for an
    // acknowledgement (REPLCONF GETACK) in the stream.
    assert_eq!(c.cmd(&["SET", "late:big", "after the checkpoint"]), OK);
    for db in [0u32, 3, 7] {
        select(&mut c, db);
        assert_eq!(c.cmd(&["SET", "after", &format!("late in db {db}")]), OK);
        assert_eq!(int(&c.cmd(&["HSET", "h", "f2", "changed late"])), 0);
        assert_eq!(int(&c.cmd(&["LPUSH", "l", "late"])), 4);
    }
    select(&mut c, 3);
    assert_eq!(int(&c.cmd(&["DEL", "gone"])), 1);
    assert_eq!(c.cmd(&["MULTI"]), OK);
    assert_eq!(c.cmd(&["SET", "late:tx", "x"]), b"+QUEUED\r\n");
    assert_eq!(c.cmd(&["APPEND", "late:tx", "y"]), b"+QUEUED\r\n");
    assert_eq!(show(&c.cmd(&["EXEC"])), "*2⏎+OK⏎:2⏎");
    select(&mut c, 0);
    let late = "return redis.call('SET', KEYS[1], 'late script')";
    assert_eq!(c.cmd(&["EVAL", late, "1", "late:script"]), OK);
    // Two replicas asked for, one there: Valkey sends GETACK, then times out.
    c.cmd(&["WAIT", "2", "200"]);
    assert_eq!(c.cmd(&["SET", "last", "after the WAIT"]), OK);

    // Every write above had its reply, so it is in walrus's journal; Valkey holds the same.
    let mut direct = Raw::connect(v);
    assert_eq!(direct.cmd(&["GET", "last"]), b"$14\r\nafter the WAIT\r\n");
}

#[test]
fn exported_aof_loads_into_stock_valkey_with_the_same_data() {
    let v = Valkey::start_with(&["--enable-debug-command", "yes"]);
    let mut w = Walrus::build().upstream(&v.addr()).with_metrics().start();
    let data: PathBuf = w.data.path().join("data");
    write_dataset(&w, &v.addr());
    let original = snapshot(&v.addr());

    // While walrus runs, its data directory is locked: the export refuses, naming it.
    let out_dir = tempfile::tempdir().unwrap();
    let aof = out_dir.path().join("appendonly.aof");
    let busy = export_aof(&data, &aof);
    assert_eq!(busy.status.code(), Some(1), "{busy:?}");
    let err = text(&busy.stderr);
    let owner = format!("is in use by pid {} on ", w.proc.child.id());
    assert!(
        err.starts_with("walrus: ") && err.contains(&owner) && err.contains("stop that one first"),
        "{err}"
    );
    assert!(!aof.exists());

    w.stop();
    let exported = export_aof(&data, &aof);
    let stdout = text(&exported.stdout);
    assert!(
        exported.status.success(),
        "{exported:?}\n{}",
        text(&exported.stderr)
    );
    eprintln!("{stdout}");
    assert!(reported(&stdout, "commands kept") > 10, "{stdout}");
    assert!(
        reported(&stdout, "replication-only commands dropped") >= 1,
        "the WAIT's GETACK was not dropped:\n{stdout}"
    );
    let bytes = std::fs::read(&aof).unwrap();
    assert!(
        bytes.starts_with(b"REDIS") || bytes.starts_with(b"VALKEY"),
        "the AOF does not start with an RDB: {:?}",
        &bytes[..16.min(bytes.len())]
    );
    assert_eq!(reported(&stdout, "bytes\n"), bytes.len() as u64, "{stdout}");
    let leftovers: Vec<_> = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["appendonly.aof"], "temporary files left behind");
    // The same, given the journal directory itself.
    let again = out_dir.path().join("again.aof");
    let second = export_aof(&data.join("journal"), &again);
    assert!(second.status.success(), "{second:?}");
    assert!(std::fs::read(&again).unwrap() == bytes, "exports differ");
    std::fs::remove_file(&again).unwrap();

    // A stock valkey-server with only that file in its directory.
    let dir = out_dir.path().to_str().unwrap();
    let loaded = Valkey::start_with(&[
        "--appendonly",
        "yes",
        "--enable-debug-command",
        "yes",
        "--dir",
        dir,
    ]);
    let mut c = Raw::connect(&loaded.addr());
    let got_dir = c.cmd(&["CONFIG", "GET", "dir"]);
    let want_dir = std::fs::canonicalize(out_dir.path()).unwrap();
    assert!(
        text(&got_dir).contains(want_dir.to_str().unwrap()),
        "the later --dir did not win: {}",
        show(&got_dir)
    );
    let log = loaded.proc.log_text();
    // Valkey 7+ moves the single old-style file into appendonlydir/ as its base, and
    // reads the RDB at its start before the commands.
    assert!(
        log.contains("RDB preamble") && log.contains("DB loaded from append only file"),
        "{log}"
    );
    let copy = snapshot(&loaded.addr());
    assert_eq!(
        show(&copy.digest),
        show(&original.digest),
        "DEBUG DIGEST differs; log:\n{log}"
    );
    assert_eq!(copy.sizes, original.sizes, "DBSIZE of databases 0..15");
    assert!(
        original.sizes[1] >= 301 && original.sizes[0] >= 9,
        "{:?}",
        original.sizes
    );
    for ((what, ty_a, a), (_, ty_b, b)) in original.values.iter().zip(&copy.values) {
        assert_eq!(show(ty_b), show(ty_a), "{what}: type");
        assert_eq!(show(b), show(a), "{what}");
    }

    // Concrete values, not only equal ones.
    select(&mut c, 0);
    assert_eq!(c.cmd(&["GET", "scripted"]), b"$11\r\nby a script\r\n");
    assert_eq!(c.cmd(&["GET", "tx:n"]), b"$1\r\n6\r\n");
    assert_eq!(c.cmd(&["GET", "late:script"]), b"$11\r\nlate script\r\n");
    assert_eq!(c.cmd(&["GET", "last"]), b"$14\r\nafter the WAIT\r\n");
    let pttl = int(&c.cmd(&["PTTL", "ttl"]));
    assert!(pttl > 0 && pttl <= 1_000_000, "PTTL ttl = {pttl}");
    select(&mut c, 3);
    assert_eq!(c.cmd(&["GET", "plain"]), b"$13\r\nvalue in db 3\r\n");
    assert_eq!(c.cmd(&["GET", "after"]), b"$12\r\nlate in db 3\r\n");
    assert_eq!(c.cmd(&["GET", "late:tx"]), b"$2\r\nxy\r\n");
    assert_eq!(c.cmd(&["EXISTS", "gone"]), b":0\r\n");
    assert_eq!(
        show(&c.cmd(&["HGETALL", "h"])),
        "*6⏎$2⏎f1⏎$1⏎3⏎$2⏎f2⏎$12⏎changed late⏎$2⏎f3⏎$1⏎3⏎"
    );
    assert_eq!(
        show(&c.cmd(&["LRANGE", "l", "0", "-1"])),
        "*4⏎$4⏎late⏎$1⏎a⏎$1⏎3⏎$1⏎c⏎"
    );
    select(&mut c, 7);
    assert_eq!(c.cmd(&["TYPE", "h"]), b"+hash\r\n");
    assert_eq!(c.cmd(&["TYPE", "l"]), b"+list\r\n");
    select(&mut c, 1);
    assert_eq!(c.cmd(&["STRLEN", "big:123"]), b":40960\r\n");
    assert_eq!(
        c.cmd(&["GET", "late:big"]),
        b"$20\r\nafter the checkpoint\r\n"
    );
}

#[test]
fn damaged_checkpoint_fails_the_export_naming_the_file() {
    let v = Valkey::start();
    let mut w = Walrus::build().upstream(&v.addr()).start();
    let data = w.data.path().join("data");
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    w.stop();

    let cp_dir = data.join("checkpoints");
    let rdbs: Vec<PathBuf> = std::fs::read_dir(&cp_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rdb"))
        .collect();
    assert_eq!(rdbs.len(), 1, "{rdbs:?}");
    let rdb = &rdbs[0];
    let mut bytes = std::fs::read(rdb).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(rdb, &bytes).unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let aof = out_dir.path().join("appendonly.aof");
    let r = export_aof(&data, &aof);
    assert_eq!(r.status.code(), Some(1), "{r:?}");
    let err = text(&r.stderr);
    let name = rdb.file_name().unwrap().to_str().unwrap();
    assert!(err.starts_with("walrus: ") && err.contains(name), "{err}");
    assert!(err.contains("fails verification"), "{err}");
    assert_eq!(
        std::fs::read_dir(out_dir.path()).unwrap().count(),
        0,
        "the failed export left a file"
    );
}

/// `--out` inside walrus's own `journal/` or `checkpoints/` (however it is named) is
/// refused with exit 2 before anything is read or written, as `backup --to` is: the export,
/// renamed over a segment, replaced it.
#[test]
fn an_export_into_walruss_own_directories_is_refused() {
    let (tmp, data) = fixture_data_dir();
    std::os::unix::fs::symlink(data.join("journal"), tmp.path().join("link")).unwrap();
    let segment = data.join("journal/seg-00002.wal");
    let before = std::fs::read(&segment).unwrap();
    for (out, inside) in [
        (segment.clone(), "journal"),
        (tmp.path().join("link/seg-00002.wal"), "journal"),
        (data.join("checkpoints/dump.rdb"), "checkpoints"),
    ] {
        let o = export_aof(&data, &out);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", out.display());
        let live = data.join(inside).canonicalize().unwrap();
        assert!(
            err.contains(&format!("is inside walrus's own {}", live.display())),
            "{err}"
        );
    }
    assert_eq!(std::fs::read(&segment).unwrap(), before);
    assert!(!data.join("checkpoints/dump.rdb").exists());
}
