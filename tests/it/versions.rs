//! The version matrix inside `cargo test`: every server deploy/setup.sh installed besides
//! the default one (`<cache>/walrus/servers/`: Valkey 9.0.0 and 8.1.8, Redis OSS 7.0.15)
//! runs walrus's core path in managed mode: replies equal to the same server's own, a
//! checkpoint in that server's RDB format (recorded with its writer), SIGKILL and back,
//! `journal export-aof` loaded by a stock server of that version. Across versions: an
//! upgrade under walrus (8.1 to 9.0 to 9.1) restores; a downgrade below the checkpoint's
//! format, or below a server whose commands the journal holds (9.1 to 9.0, or back to 8.1
//! after an upgrade), is refused before anything is sent, naming both versions, in managed
//! mode at start and in external mode with Valkey swapped under a running walrus; a server
//! walrus cannot serve (Redis OSS 6.2) is refused at start, naming what it lacks.
//!
//! The whole suite against one version: `deploy/matrix.sh VERSION` (docs/versions.md).
use crate::common;
use common::server::{matrix, under_test, Version};
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const OK: &[u8] = b"+OK\r\n";

/// Valkey (every version) and Redis OSS from 7.0.
fn supported(v: &Version) -> bool {
    v.since((0, 0), Some((7, 0)))
}

fn installed(pick: impl Fn(&Version) -> bool) -> Vec<(Version, PathBuf)> {
    matrix().into_iter().filter(|(v, _)| pick(v)).collect()
}

/// The installed Valkey `major.minor` (deploy/setup.sh installs 9.0 and 8.1).
fn valkey(major: u32, minor: u32) -> PathBuf {
    installed(|v| v.valkey && (v.v.0, v.v.1) == (major, minor))
        .pop()
        .unwrap_or_else(|| panic!("no Valkey {major}.{minor}: run deploy/setup.sh"))
        .1
}

fn managed_with(binary: &Path) -> String {
    format!(
        "[upstream]\nvalkey_server = {:?}\n",
        binary.to_str().unwrap()
    )
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
        put(
            &key,
            &["GET", &key],
            format!("${}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
        );
    }
    let h = k("h");
    assert_eq!(c.cmd(&["HSET", &h, "f", "1", "g", "2"]), b":2\r\n");
    put(&h, &["HGET", &h, "g"], b"$1\r\n2\r\n");
    let l = k("l");
    assert_eq!(c.cmd(&["RPUSH", &l, "a", "b", "c"]), b":3\r\n");
    put(
        &l,
        &["LRANGE", &l, "0", "-1"],
        b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n",
    );
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
        put(
            &key,
            &["STRLEN", &key],
            format!(":{}\r\n", big.len()).as_bytes(),
        );
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

#[test]
fn each_installed_version_checkpoints_restores_and_exports() {
    for (v, binary) in installed(supported) {
        eprintln!("{v}: {}", binary.display());
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let mut model = Model::new();

        // Replies equal to the same server's own.
        let w = Walrus::build()
            .config(&managed_with(&binary))
            .data(&data)
            .with_metrics()
            .start();
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
        let rdb = std::fs::read(
            data.join("checkpoints").join(
                m.lines()
                    .find_map(|l| l.strip_prefix("file = "))
                    .unwrap()
                    .trim_matches('"'),
            ),
        )
        .unwrap();
        let format = walrus::valkey::rdb::format_version(&rdb).unwrap();
        assert!(m.contains(&format!("rdb_version = {format}")), "{m}");
        assert!(m.contains(&format!("written_by = \"{v}\"")), "{m}");

        // SIGKILL: walrus and its Valkey die; both come back with everything.
        let mut w = w;
        w.kill_with_valkey();
        let mut w = Walrus::build()
            .config(&managed_with(&binary))
            .data(&data)
            .start();
        check(&w.addr, &model);
        w.stop();

        // The export loads into a stock server of the same version.
        let out = tempfile::tempdir().unwrap();
        let aof = out.path().join("appendonly.aof");
        let export = export_aof(&data, &aof);
        assert!(export.status.success(), "{v}: {export:?}");
        let dir = out.path().to_str().unwrap();
        let stock = Valkey::start_bin(&binary, &["--appendonly", "yes", "--dir", dir]);
        check(&stock.addr(), &model);
    }
}

#[test]
fn an_upgrade_under_walrus_restores_from_the_older_format() {
    let (v8, v90) = (valkey(8, 1), valkey(9, 0));
    let now = under_test();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut model = Model::new();
    let mut last = None;
    for (step, binary) in [v8, v90, valkey_server_bin()].iter().enumerate() {
        let v = server::version_of(binary);
        let mut w = Walrus::build()
            .config(&managed_with(binary))
            .data(&data)
            .with_metrics()
            .start();
        check(&w.addr, &model);
        if let Some(prev) = last {
            assert!(
                w.proc.log_text().contains("restore: Valkey continued"),
                "{prev} to {v}: no restore\n{}",
                w.proc.log_text()
            );
        }
        write(&w, &v, &step.to_string(), &mut model);
        w.stop();
        last = Some(v);
    }
    eprintln!("Valkey 8.1 to 9.0 to {now}: every write restored");
}

/// Starts walrus (managed) on `data` with `binary` and expects the restore to be refused,
/// naming every part; the checkpoint's manifest stays as it was.
fn refused(data: &Path, binary: &Path, config: &str, parts: &[String]) {
    let before = manifest(data);
    let cfg = format!("{}{config}", managed_with(binary));
    let line = refuses_to_start(None, &cfg, data, "refusing to restore");
    for part in parts {
        assert!(line.contains(part.as_str()), "{part:?} missing: {line}");
    }
    assert_eq!(manifest(data), before, "the refusal changed the checkpoint");
}

#[test]
fn a_downgrade_below_the_checkpoints_format_is_refused_before_anything_is_sent() {
    let now = under_test();
    if !server::has(now.hash_field_ttls(), "a checkpoint in Valkey 9's format") {
        return;
    }
    let v8 = valkey(8, 1);
    let old = server::version_of(&v8);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut w = Walrus::build().data(&data).start();
    let mut c = Raw::connect(&w.addr);
    let r = c.cmd(&["HSETEX", "h", "EX", "100000", "FIELDS", "1", "f", "v"]);
    assert_eq!(r, b":1\r\n");
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    w.stop();

    let parts = [
        format!("RDB format 80 written by {now}"),
        format!("{old} cannot load that format"),
        "export-aof".into(),
        "data directory aside".into(),
    ];
    refused(&data, &v8, "", &parts);
    // restore.on_conflict is about whose data wins, not about a load that cannot work.
    refused(
        &data,
        &v8,
        "[restore]\non_conflict = \"valkey-wins\"\n",
        &parts,
    );

    // The same data directory still restores into the version that wrote it.
    let w = Walrus::build().data(&data).start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["GET", "k"]), b"$1\r\nv\r\n");
}

#[test]
fn a_downgrade_below_a_server_whose_commands_the_journal_holds_is_refused() {
    let (v8, v90) = (valkey(8, 1), valkey(9, 0));
    let (old8, old90, now) = (
        server::version_of(&v8),
        server::version_of(&v90),
        under_test(),
    );
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");

    // Checkpointed by 8.1, upgraded to the default (a restore), then writes only the newer
    // server has go to the journal: back to 8.1 is refused, although it reads the format.
    let mut w = Walrus::build()
        .config(&managed_with(&v8))
        .data(&data)
        .start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["SET", "k", "8"]), OK);
    w.stop();
    let mut w = Walrus::build().data(&data).start();
    assert!(manifest(&data).contains(&format!("newest_server = \"{now}\"")));
    if now.hash_field_ttls() {
        let r = Raw::connect(&w.addr).cmd(&["HSETEX", "h", "EX", "1000", "FIELDS", "1", "f", "v"]);
        assert_eq!(r, b":1\r\n");
    }
    w.stop();
    refused(
        &data,
        &v8,
        "",
        &[
            "RDB format 11 written by Valkey 8.1.8, and its journal holds writes of".into(),
            format!("{old8} may lack commands of {now}"),
        ],
    );

    // A checkpoint in the default's own format, then 9.0: same format, fewer commands.
    let w = Walrus::build().data(&data).with_metrics().start();
    let big = "x".repeat(256 << 10);
    let taken = w.checkpoints();
    let mut c = Raw::connect(&w.addr);
    let sets: Vec<Vec<String>> = (0..40)
        .map(|i| vec!["SET".into(), format!("big:{}", i % 4), big.clone()])
        .collect();
    pipeline(&mut c, &sets, OK, Some(&w));
    w.await_checkpoint(taken);
    let mut w = w;
    w.stop();
    if now.valkey && (now.v.0, now.v.1) > (9, 0) {
        refused(
            &data,
            &v90,
            "",
            &[format!("{old90} may lack commands of {now}")],
        );
    }
}

#[test]
fn valkey_swapped_for_an_older_one_under_a_running_walrus_is_refused_not_fed() {
    // External mode: Valkey 8.1 on a port, walrus in front; Valkey replaced by the default
    // (walrus restores into it), a checkpoint in the default's format; then 8.1 again.
    let v8 = valkey(8, 1);
    let port = free_port().to_string();
    let on_port = |binary: &Path| Valkey::start_bin(binary, &["--port", &port]);
    let addr = format!("127.0.0.1:{port}");
    let first = on_port(&v8);
    let w = Walrus::build().upstream(&addr).with_metrics().start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["SET", "k", "v"]), OK);
    drop(first);
    let newer = on_port(&valkey_server_bin());
    w.proc
        .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
    w.await_attached();
    let big = "x".repeat(256 << 10);
    let taken = w.checkpoints();
    let sets: Vec<Vec<String>> = (0..40)
        .map(|i| vec!["SET".into(), format!("big:{}", i % 4), big.clone()])
        .collect();
    pipeline(&mut Raw::connect(&w.addr), &sets, OK, Some(&w));
    w.await_checkpoint(taken);
    drop(newer);
    let older = on_port(&v8);
    let line = w.proc.wait_line("refusing to restore", START_TIMEOUT);
    assert!(line.contains("Valkey 8.1.8"), "{line}");
    // Clients wait with Valkey's own -LOADING; nothing was sent to the older Valkey.
    let r = Raw::connect(&w.addr).cmd(&["GET", "k"]);
    assert!(r.starts_with(b"-LOADING"), "{}", show(&r));
    assert!(
        !older.proc.log_text().contains("MASTER <-> REPLICA sync")
            && !older.proc.log_text().contains("RDB format"),
        "{}",
        older.proc.log_text()
    );
}

#[test]
fn a_server_walrus_cannot_serve_is_refused_at_start_naming_what_it_lacks() {
    for (v, binary) in installed(|v| !supported(v)) {
        let old = Valkey::start_bin(&binary, &[]);
        let tmp = tempfile::tempdir().unwrap();
        let line = refuses_to_start(Some(&old.addr()), "", tmp.path(), "walrus needs");
        assert!(
            line.contains(&v.to_string()) && line.contains("key specifications"),
            "{line}"
        );
    }
}
