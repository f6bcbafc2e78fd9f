//! The version matrix inside `cargo test`: every server deploy/setup.sh installed besides
//! the default one (`<cache>/walrus/servers/`: Valkey 9.0.0 and 8.1.8, Redis OSS 7.0.15)
//! runs walrus's core path in managed mode: replies equal to the same server's own, a
//! checkpoint in that server's RDB format (recorded with its writer), SIGKILL and back,
//! `journal export-aof` loaded by a stock server of that version. Across versions: an
//! upgrade under walrus (8.1 to 9.0 to 9.1) restores; a downgrade below the checkpoint's
//! format is refused before anything is sent, naming both versions; a server walrus
//! cannot serve (Redis OSS 6.2) is refused at start, naming what it lacks.
//!
//! The whole suite against one version: `deploy/matrix.sh VERSION` (README, "Valkey
//! versions").
mod common;
use common::server::{matrix, under_test, Version};
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const OK: &[u8] = b"+OK\r\n";

/// Valkey (every version) and Redis OSS from 7.0.
fn supported(v: &Version) -> bool {
    v.since((0, 0), Some((7, 0)))
}

fn installed(pick: impl Fn(&Version) -> bool) -> Vec<(Version, PathBuf)> {
    let found: Vec<_> = matrix().into_iter().filter(|(v, _)| pick(v)).collect();
    if found.is_empty() {
        eprintln!("skipped: no such server installed (deploy/setup.sh installs the matrix)");
    }
    found
}

fn managed_with(binary: &Path) -> String {
    format!("[upstream]\nvalkey_server = {:?}\n", binary.to_str().unwrap())
}

/// What the test wrote, key to the command that reads it back and the reply.
type Model = BTreeMap<String, (Vec<String>, Vec<u8>)>;

/// Strings, a hash, a list, a sorted set, a TTL, a transaction, a script, field TTLs where
/// the server has them; then 10 MiB of overwrites (past the checkpoint trigger of the
/// tests' 16 MiB ring), and the checkpoint they cause.
fn write(w: &Walrus, v: &Version, tag: &str, model: &mut Model) {
    let mut c = Raw::connect(&w.addr);
    let mut put = |key: &str, read: &[&str], want: &[u8]| {
        model.insert(
            key.into(),
            (read.iter().map(|s| s.to_string()).collect(), want.to_vec()),
        );
    };
    let k = |p: &str| format!("{p}:{tag}");
    for i in 0..200 {
        let key = format!("s:{tag}:{i}");
        assert_eq!(c.cmd(&["SET", &key, &i.to_string()]), OK);
        put(&key, &["GET", &key], format!("${}\r\n{i}\r\n", i.to_string().len()).as_bytes());
    }
    let h = k("h");
    assert_eq!(c.cmd(&["HSET", &h, "f", "1", "g", "2"]), b":2\r\n");
    put(&h, &["HGET", &h, "g"], b"$1\r\n2\r\n");
    let l = k("l");
    assert_eq!(c.cmd(&["RPUSH", &l, "a", "b", "c"]), b":3\r\n");
    put(&l, &["LRANGE", &l, "0", "-1"], b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n");
    let z = k("z");
    assert_eq!(c.cmd(&["ZADD", &z, "1", "x", "2", "y"]), b":2\r\n");
    put(&z, &["ZSCORE", &z, "y"], b"$1\r\n2\r\n");
    let t = k("t");
    assert_eq!(c.cmd(&["SET", &t, "v", "EX", "100000"]), OK);
    put(&t, &["GET", &t], b"$1\r\nv\r\n");
    let x = k("x");
    assert_eq!(c.cmd(&["MULTI"]), OK);
    c.cmd(&["SET", &x, "1"]);
    c.cmd(&["INCR", &x]);
    assert_eq!(c.cmd(&["EXEC"]), b"*2\r\n+OK\r\n:2\r\n");
    put(&x, &["GET", &x], b"$1\r\n2\r\n");
    let e = k("e");
    let r = c.cmd(&["EVAL", "return redis.call('set', KEYS[1], 'lua')", "1", &e]);
    assert_eq!(r, OK);
    put(&e, &["GET", &e], b"$3\r\nlua\r\n");
    if v.hash_field_ttls() {
        let f = k("ftl");
        let r = c.cmd(&["HSETEX", &f, "EX", "100000", "FIELDS", "1", "a", "1"]);
        assert_eq!(r, b":1\r\n");
        put(&f, &["HTTL", &f, "FIELDS", "1", "a"], b"*1\r\n:");
    }
    let big = "x".repeat(256 << 10);
    let taken = w.checkpoints();
    let mut out = Vec::new();
    for i in 0..40 {
        let cmd = ["SET".to_string(), format!("big:{}", i % 4), big.clone()];
        out.extend_from_slice(&walrus::resp::write::command(cmd.iter()));
    }
    c.send_raw(&out);
    for _ in 0..40 {
        assert_eq!(show(&c.read_frame()), show(OK));
    }
    for i in 0..4 {
        let key = format!("big:{i}");
        put(&key, &["STRLEN", &key], format!(":{}\r\n", big.len()).as_bytes());
    }
    w.await_checkpoint(taken);
}

/// Every key reads back as written (a reply that ends a prefix, for TTLs, starts with it),
/// and the server holds nothing else.
fn check(addr: &str, model: &Model) {
    let mut c = Raw::connect(addr);
    for (key, (read, want)) in model {
        let got = c.cmd(read);
        assert!(
            got.starts_with(want) && (want.ends_with(b"\r\n") == (got == *want)),
            "{key}: {} gives {}, want {}",
            show_args(read),
            show(&got),
            show(want)
        );
    }
    assert_eq!(show(&c.cmd(&["DBSIZE"])), format!(":{}⏎", model.len()));
}

fn manifest(data: &Path) -> String {
    std::fs::read_to_string(data.join("checkpoints/CHECKPOINT")).unwrap()
}

fn stop(w: &mut Walrus) {
    w.proc.signal(libc::SIGTERM);
    assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());
}

#[test]
fn each_installed_version_checkpoints_restores_and_exports() {
    for (v, binary) in installed(supported) {
        eprintln!("{v}: {}", binary.display());
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let mut model = Model::new();

        // Replies equal to the same server's own.
        let w = Walrus::start_managed(&managed_with(&binary), Some(&data));
        let direct = Valkey::start_bin(&binary, &[]);
        let mut p = Pair {
            a: Raw::connect(&direct.addr()),
            w: Raw::connect(&w.addr),
        };
        p.expect(&["SET", "cmp", "1"], OK);
        p.expect(&["INCRBY", "cmp", "41"], b":42\r\n");
        p.expect(&["HSET", "cmph", "f", "v"], b":1\r\n");
        p.ok(&["HGETALL", "cmph"]);
        p.ok(&["OBJECT", "ENCODING", "cmph"]);
        p.err(&["HGET", "cmph"]);
        p.err(&["NOSUCHCOMMAND"]);
        p.expect(&["DEL", "cmp", "cmph"], b":2\r\n");
        drop(p);

        write(&w, &v, "a", &mut model);
        check(&w.addr, &model);
        // The checkpoint is in this server's format, and says who wrote it.
        let m = manifest(&data);
        let rdb = std::fs::read(data.join("checkpoints").join(
            m.lines()
                .find_map(|l| l.strip_prefix("file = "))
                .unwrap()
                .trim_matches('"'),
        ))
        .unwrap();
        let format = walrus::replication::rdb::format_version(&rdb).unwrap();
        assert!(m.contains(&format!("rdb_version = {format}")), "{m}");
        assert!(m.contains(&format!("written_by = \"{v}\"")), "{m}");

        // SIGKILL: walrus and its Valkey die; both come back with everything.
        let pid = valkey_pid(&w.addr);
        let mut w = w;
        w.proc.signal(libc::SIGKILL);
        w.proc.wait_exit(Duration::from_secs(10)).unwrap();
        wait_dead(pid);
        let mut w = Walrus::start_managed(&managed_with(&binary), Some(&data));
        check(&w.addr, &model);
        stop(&mut w);

        // The export loads into a stock server of the same version.
        let out = tempfile::tempdir().unwrap();
        let aof = out.path().join("appendonly.aof");
        let export = std::process::Command::new(walrus_bin())
            .args(["journal", "export-aof", "--dir"])
            .arg(&data)
            .arg("--out")
            .arg(&aof)
            .output()
            .unwrap();
        assert!(export.status.success(), "{v}: {export:?}");
        let dir = out.path().to_str().unwrap();
        let stock = Valkey::start_bin(&binary, &["--appendonly", "yes", "--dir", dir]);
        check(&stock.addr(), &model);
    }
}

#[test]
fn an_upgrade_under_walrus_restores_from_the_older_format() {
    let path = |want: (u32, u32)| {
        installed(|v| v.valkey && (v.v.0, v.v.1) == want)
            .pop()
            .map(|(_, p)| p)
    };
    let (Some(v8), Some(v90)) = (path((8, 1)), path((9, 0))) else {
        return;
    };
    let now = under_test();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut model = Model::new();
    let mut last = None;
    for (step, binary) in [v8, v90, valkey_server_bin()].iter().enumerate() {
        let v = server::version_of(binary);
        let mut w = Walrus::start_managed(&managed_with(binary), Some(&data));
        check(&w.addr, &model);
        if let Some(prev) = last {
            assert!(
                w.proc.log_text().contains("restore: Valkey continued"),
                "{prev} to {v}: no restore\n{}",
                w.proc.log_text()
            );
        }
        write(&w, &v, &step.to_string(), &mut model);
        stop(&mut w);
        last = Some(v);
    }
    eprintln!("Valkey 8.1 to 9.0 to {now}: every write restored");
}

#[test]
fn a_downgrade_below_the_checkpoints_format_is_refused_before_anything_is_sent() {
    let now = under_test();
    let older = installed(|v| v.valkey && v.v.0 < 9);
    if !server::has(now.hash_field_ttls(), "a checkpoint in Valkey 9's format") {
        return;
    }
    let Some((old, binary)) = older.into_iter().next() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut w = Walrus::start_managed("", Some(&data));
    let mut c = Raw::connect(&w.addr);
    let r = c.cmd(&["HSETEX", "h", "EX", "100000", "FIELDS", "1", "f", "v"]);
    assert_eq!(r, b":1\r\n");
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    stop(&mut w);
    let before = manifest(&data);

    let line = refuses_to_start(None, &managed_with(&binary), &data, "cannot load");
    for part in [
        format!("RDB format 80 (written by {now})"),
        format!("{old} cannot load"),
        "export-aof".into(),
        "restore.on_conflict".into(),
    ] {
        assert!(line.contains(&part), "{part:?} missing: {line}");
    }
    assert_eq!(manifest(&data), before, "the refusal changed the checkpoint");

    // The same data dir still restores into the version that wrote it.
    let w = Walrus::start_managed("", Some(&data));
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["GET", "k"]), b"$1\r\nv\r\n");
    drop(c);
    let mut w = w;
    stop(&mut w);

    // valkey-wins: the operator drops walrus's data and starts over from Valkey's.
    let cfg = format!("{}[restore]\non_conflict = \"valkey-wins\"\n", managed_with(&binary));
    let w = Walrus::start_managed(&cfg, Some(&data));
    assert_eq!(Raw::connect(&w.addr).cmd(&["DBSIZE"]), b":0\r\n");
}

#[test]
fn a_server_walrus_cannot_serve_is_refused_at_start_naming_what_it_lacks() {
    for (v, binary) in installed(|v| !supported(v)) {
        let old = Valkey::start_bin(&binary, &[]);
        let tmp = tempfile::tempdir().unwrap();
        let line = refuses_to_start(Some(&old.addr()), "", tmp.path(), "walrus needs");
        assert!(
            line.contains(&v.to_string()) && line.contains("FUNCTION DUMP"),
            "{line}"
        );
    }
}
