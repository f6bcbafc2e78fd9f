//! Valkey 9's data types end to end, on the path users run (managed mode): hash-field
//! expiration (HSETEX, HGETEX, HEXPIRE, HPEXPIRE, HPEXPIREAT, HPERSIST, HTTL and friends) and
//! conditional writes (SET ... IFEQ, DELIFEQ).
//!
//! A hash with field TTLs fits only Valkey 9's own RDB format (80): walrus must ask for it
//! (`REPLCONF version`), or every checkpoint fails and the ring fills. Here such keys are
//! checkpointed while the ring wraps many times, and come back with their absolute field
//! expiry times after SIGTERM, SIGKILL (walrus and its Valkey with it) and a live restore
//! of a Valkey killed alone; fields expire while walrus is attached and while it is down;
//! `journal export-aof` loads them into a stock Valkey of the same version. Through walrus
//! every one of these commands answers as Valkey does.
//!
//! On a server without these commands (a run of the version matrix) the tests say so and
//! pass.
//!
//! After a restart the ring may still be above its high watermark (it was full when walrus
//! stopped), and writes get `-MISCONF` until the first checkpoint releases it: the test
//! awaits that checkpoint before it writes again (`Walrus::await_writable`).
use crate::common;
use common::*;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const OK: &[u8] = b"+OK\r\n";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What walrus acknowledged: hashes as field -> (value, absolute expiry in ms, -1: none),
/// strings as their value.
#[derive(Default)]
struct Model {
    hashes: BTreeMap<String, BTreeMap<String, (String, i64)>>,
    strings: BTreeMap<String, String>,
}

/// Round `r` of the dataset: every Valkey 9 form of a field TTL, conditional writes, a
/// field that expires at once (Valkey deletes it and its stream says so), then 50 MiB of
/// overwrites that wrap the test's 16 MiB ring three times: only checkpoints let that
/// through. The overwrites come in pieces of 10 MiB, each past the checkpoint trigger (half
/// the ring) and below the high watermark, and the next waits for the checkpoint.
fn write_round(w: &Walrus, r: usize, model: &mut Model) {
    let mut c = Raw::connect(&w.addr);
    let far = (now_ms() + 1_000_000_000) as i64;
    let key = |p: &str| format!("{p}:{r}");
    let mut field = |k: String, f: &str, v: &str, at: i64| {
        model
            .hashes
            .entry(k)
            .or_default()
            .insert(f.to_string(), (v.to_string(), at));
    };

    let hx = key("hx");
    let at = far.to_string();
    assert_eq!(
        c.cmd(&["HSETEX", &hx, "PXAT", &at, "FIELDS", "2", "a", "1", "b", "2"]),
        b":1\r\n"
    );
    field(hx.clone(), "a", "1", far);
    field(hx, "b", "2", far);

    let hm = key("hm");
    assert_eq!(
        c.cmd(&["HSET", &hm, "keep", "k", "ttl", "t", "gone", "g"]),
        b":3\r\n"
    );
    let at2 = (far + 7).to_string();
    assert_eq!(
        c.cmd(&["HPEXPIREAT", &hm, &at2, "FIELDS", "1", "ttl"]),
        b"*1\r\n:1\r\n"
    );
    assert_eq!(
        c.cmd(&["HEXPIRE", &hm, "100000", "FIELDS", "1", "keep"]),
        b"*1\r\n:1\r\n"
    );
    assert_eq!(
        c.cmd(&["HPERSIST", &hm, "FIELDS", "1", "keep"]),
        b"*1\r\n:1\r\n"
    );
    // Expires while walrus is attached: Valkey deletes the field and streams the deletion.
    assert_eq!(
        c.cmd(&["HPEXPIRE", &hm, "1", "FIELDS", "1", "gone"]),
        b"*1\r\n:1\r\n"
    );
    field(hm.clone(), "keep", "k", -1);
    field(hm, "ttl", "t", far + 7);

    let hg = key("hg");
    assert_eq!(c.cmd(&["HSET", &hg, "f", "v"]), b":1\r\n");
    let at3 = (far + 11).to_string();
    assert_eq!(
        c.cmd(&["HGETEX", &hg, "PXAT", &at3, "FIELDS", "1", "f"]),
        b"*1\r\n$1\r\nv\r\n"
    );
    field(hg, "f", "v", far + 11);

    let s = key("s");
    assert_eq!(c.cmd(&["SET", &s, "v0"]), OK);
    assert_eq!(c.cmd(&["SET", &s, "v1", "IFEQ", "v0"]), OK);
    assert_eq!(c.cmd(&["SET", &s, "bad", "IFEQ", "v0"]), b"$-1\r\n");
    model.strings.insert(s, "v1".into());
    let d = key("d");
    assert_eq!(c.cmd(&["SET", &d, "x"]), OK);
    assert_eq!(c.cmd(&["DELIFEQ", &d, "y"]), b":0\r\n");
    assert_eq!(c.cmd(&["DELIFEQ", &d, "x"]), b":1\r\n");

    let big = "x".repeat(256 << 10);
    for piece in 0..5 {
        let taken = w.checkpoints();
        let bigs: Vec<Vec<String>> = (piece * 40..(piece + 1) * 40)
            .map(|i| {
                vec![
                    "SET".into(),
                    format!("big:{}", i % 8),
                    format!("{r}:{i}:{big}"),
                ]
            })
            .collect();
        pipeline(&mut c, &bigs, OK, Some(w));
        w.await_checkpoint(taken);
    }
    for i in 192..200 {
        model
            .strings
            .insert(format!("big:{}", i % 8), format!("{r}:{i}:{big}"));
    }
}

/// Every hash has exactly its fields with their values and absolute expiry times, every
/// string its value, and nothing else is there.
fn check(addr: &str, model: &Model) {
    let mut c = Raw::connect(addr);
    for (key, fields) in &model.hashes {
        let mut want = Vec::new();
        for (f, (v, _)) in fields {
            want.push(f.as_str());
            want.push(v.as_str());
        }
        let got = c.cmd(&["HGETALL", key]);
        let mut got_pairs: Vec<(String, String)> = decode_strings(&got)
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect();
        got_pairs.sort();
        let want_pairs: Vec<(String, String)> = fields
            .iter()
            .map(|(f, (v, _))| (f.clone(), v.clone()))
            .collect();
        assert_eq!(got_pairs, want_pairs, "HGETALL {key}");
        for (f, (_, at)) in fields {
            let got = c.cmd(&["HPEXPIRETIME", key, "FIELDS", "1", f]);
            assert_eq!(
                show(&got),
                format!("*1⏎:{at}⏎"),
                "HPEXPIRETIME {key} {f}: the expiry is absolute and kept"
            );
        }
    }
    for (key, v) in &model.strings {
        assert!(c.cmd(&["GET", key]) == bulk(v), "GET {key}");
    }
    let keys = model.hashes.len() + model.strings.len();
    assert_eq!(show(&c.cmd(&["DBSIZE"])), format!(":{keys}⏎"), "DBSIZE");
}

/// The strings of a flat array reply.
fn decode_strings(reply: &[u8]) -> Vec<String> {
    match decode(reply) {
        redis_protocol::resp2::types::OwnedFrame::Array(items) => items
            .into_iter()
            .map(|f| match f {
                redis_protocol::resp2::types::OwnedFrame::BulkString(b) => {
                    String::from_utf8(b).unwrap()
                }
                other => panic!("not a bulk string: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

#[test]
fn field_ttls_checkpoint_wrap_the_ring_and_survive_every_restart() {
    if !server::has(server::under_test().hash_field_ttls(), "hash-field TTLs") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut model = Model::default();

    // 1. Field TTLs while the ring wraps three times: checkpoints must succeed.
    let mut w = Walrus::build().data(&data).with_metrics().start();
    write_round(&w, 0, &mut model);
    check(&w.addr, &model);
    // A field whose expiry passes while walrus is down.
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["HSET", "down", "f", "v", "stays", "s"]), b":2\r\n");
    let soon = now_ms() + 300;
    assert_eq!(
        c.cmd(&["HPEXPIREAT", "down", &soon.to_string(), "FIELDS", "1", "f"]),
        b"*1\r\n:1\r\n"
    );
    drop(c);
    w.proc.signal(libc::SIGTERM);
    assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());

    // 2. After SIGTERM: everything back, from the checkpoint in Valkey 9's format.
    let mut w = Walrus::build().data(&data).with_metrics().start();
    // The field's time is the clock's, not an event walrus could signal.
    std::thread::sleep(Duration::from_millis(soon.saturating_sub(now_ms())));
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["HEXISTS", "down", "f"]), b":0\r\n");
    assert_eq!(
        c.cmd(&["HGETALL", "down"]),
        b"*2\r\n$5\r\nstays\r\n$1\r\ns\r\n"
    );
    model
        .hashes
        .insert("down".into(), [("stays".into(), ("s".into(), -1))].into());
    check(&w.addr, &model);
    assert!(
        w.proc.log_text().contains("no second full sync"),
        "{}",
        w.proc.log_text()
    );

    // 3. SIGKILL: walrus and its managed Valkey die together.
    w.await_writable();
    model.strings.insert("probe".into(), "1".into());
    write_round(&w, 1, &mut model);
    w.kill_with_valkey();
    let mut w = Walrus::build().data(&data).with_metrics().start();
    check(&w.addr, &model);

    // 4. Only Valkey dies: walrus restores it live.
    w.await_writable();
    model.strings.insert("probe".into(), "1".into());
    write_round(&w, 2, &mut model);
    w.kill_valkey_and_await_restore();
    check(&w.addr, &model);

    // 5. The export loads into a stock Valkey of the same version, field TTLs and all.
    w.await_writable();
    model.strings.insert("probe".into(), "1".into());
    write_round(&w, 3, &mut model);
    w.proc.signal(libc::SIGTERM);
    assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());
    let out = tempfile::tempdir().unwrap();
    let aof = out.path().join("appendonly.aof");
    let export = export_aof(&data, &aof);
    assert!(export.status.success(), "{export:?}");
    assert!(std::fs::read(&aof).unwrap().starts_with(b"VALKEY080"));
    let stock = Valkey::start_with(&["--appendonly", "yes", "--dir", out.path().to_str().unwrap()]);
    check(&stock.addr(), &model);
}

#[test]
fn valkey_9_commands_answer_through_walrus_as_valkey_does() {
    let v = server::under_test();
    if !server::has(v.hash_field_ttls() && v.set_ifeq(), "Valkey 9 commands") {
        return;
    }
    let twins = Twins::start();
    let mut p = twins.pair();
    let far = (now_ms() + 1_000_000_000).to_string();
    p.expect(
        &[
            "HSETEX", "h", "FNX", "PXAT", &far, "FIELDS", "2", "a", "1", "b", "2",
        ],
        b":1\r\n",
    );
    p.expect(
        &["HSETEX", "h", "FNX", "EX", "10", "FIELDS", "1", "a", "x"],
        b":0\r\n",
    );
    p.expect(
        &["HSETEX", "h", "FXX", "KEEPTTL", "FIELDS", "1", "a", "3"],
        b":1\r\n",
    );
    p.same(&["HSETEX", "h", "EX", "0", "FIELDS", "1", "zero", "1"]);
    p.err(&["HSETEX", "h", "EX", "-1", "FIELDS", "1", "a", "1"]);
    p.err(&["HSETEX", "h", "FIELDS", "2", "a", "1"]);
    p.ok(&["HPEXPIRETIME", "h", "FIELDS", "3", "a", "b", "nope"]);
    p.ok(&["HGETEX", "h", "PERSIST", "FIELDS", "1", "b"]);
    p.ok(&["HGETEX", "h", "PXAT", &far, "FIELDS", "2", "b", "nope"]);
    p.ok(&["HEXPIRETIME", "h", "FIELDS", "1", "b"]);
    p.ok(&["HEXPIRE", "h", "100000", "NX", "FIELDS", "2", "a", "b"]);
    p.ok(&["HEXPIRE", "h", "100000", "GT", "FIELDS", "1", "a"]);
    p.ok(&["HPEXPIREAT", "h", &far, "XX", "FIELDS", "1", "a"]);
    p.ok(&["HTTL", "h", "FIELDS", "2", "a", "nope"]);
    p.ok(&["HPERSIST", "h", "FIELDS", "2", "a", "nope"]);
    p.ok(&["HPTTL", "nokey", "FIELDS", "1", "a"]);
    p.err(&["HEXPIRE", "h", "10", "FIELDS", "3", "a"]);
    p.expect(&["HPEXPIRE", "h", "0", "FIELDS", "1", "b"], b"*1\r\n:2\r\n");
    p.expect(&["HEXISTS", "h", "b"], b":0\r\n");
    p.ok(&["HGETALL", "h"]);
    p.expect(&["HSET", "s", "f", "v"], b":1\r\n");
    p.err(&["SET", "s", "v", "IFEQ", "x"]);
    p.expect(&["SET", "k", "v0"], OK);
    p.expect(&["SET", "k", "v1", "IFEQ", "v0"], OK);
    p.expect(&["SET", "k", "v2", "IFEQ", "v0"], b"$-1\r\n");
    p.expect(&["SET", "k", "v3", "IFEQ", "v1", "GET"], b"$2\r\nv1\r\n");
    p.expect(&["SET", "nokey", "v", "IFEQ", "v"], b"$-1\r\n");
    p.expect(&["DELIFEQ", "k", "nope"], b":0\r\n");
    p.expect(&["DELIFEQ", "k", "v3"], b":1\r\n");
    p.err(&["DELIFEQ", "s", "v"]);
    p.err(&["DELIFEQ", "k"]);
}
