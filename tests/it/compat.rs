//! Compatibility: a client cannot tell walrus from Valkey.
//!
//! Every test starts two Valkeys alike: `A`, which a raw client talks to directly, and `B`,
//! behind walrus. The same commands go to A directly and to walrus, and the raw reply bytes
//! must be equal. Replies whose content legitimately differs between two servers (connection
//! ids, clocks, random picks, hash-order iteration) are compared by shape, or after removing
//! exactly the differing field; nothing else is relaxed.

use crate::common;
use common::*;
use redis_protocol::resp2::types::OwnedFrame;
use std::time::{Duration, Instant};

/// Starts walrus in front of `upstream` with `config` (TOML) added to its configuration.
pub fn start_walrus(upstream: &str, config: &str) -> Walrus {
    Walrus::build().upstream(upstream).config(config).start()
}

/// Reference Valkey `a`, Valkey `b` and walrus in front of `b`.
struct Compat {
    a: Valkey,
    b: Valkey,
    w: Walrus,
}

impl Compat {
    fn start() -> Compat {
        let a = Valkey::start();
        let b = Valkey::start();
        let w = start_walrus(&b.addr(), "");
        Compat { a, b, w }
    }

    /// A client of A and a client of walrus, to be driven in lockstep.
    fn pair(&self) -> Pair {
        Pair {
            a: Raw::connect(&self.a.addr()),
            w: Raw::connect(&self.w.addr),
        }
    }

    /// Direct connections to A and B, for checks and admin commands walrus must not see.
    fn admins(&self) -> (Raw, Raw) {
        (Raw::connect(&self.a.addr()), Raw::connect(&self.b.addr()))
    }
}

/// Waits until `admin`'s server has a client named `name` blocked in `cmd`.
fn wait_blocked(admin: &mut Raw, name: &str, cmd: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = admin.cmd(&["CLIENT", "LIST"]);
        let text = String::from_utf8_lossy(&list);
        let blocked = text.lines().any(|line| {
            let field = |k: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(k).and_then(|f| f.strip_prefix('=')))
            };
            field("name") == Some(name)
                && field("cmd") == Some(cmd)
                && field("flags").is_some_and(|f| f.contains('b'))
        });
        if blocked {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no client {name} blocked in {cmd}; CLIENT LIST:\n{text}"
        );
        std::thread::yield_now();
    }
}

#[test]
fn strings() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["SET", "s", "hello"], b"+OK\r\n");
    p.expect(&["GET", "s"], b"$5\r\nhello\r\n");
    p.expect(&["SET", "s", "x", "NX"], b"$-1\r\n");
    p.expect(&["SET", "s", "world", "XX", "GET"], b"$5\r\nhello\r\n");
    p.expect(&["SET", "t", "1", "EX", "100"], b"+OK\r\n");
    p.expect(&["TTL", "t"], b":100\r\n");
    p.ok(&["SET", "t", "2", "KEEPTTL", "GET"]);
    p.ok(&["SET", "t", "3", "PX", "100000", "NX"]);
    p.err(&["SET", "t", "3", "EX", "0"]);
    p.err(&["SET", "t", "3", "EX", "abc"]);
    p.expect(&["GETEX", "s", "EX", "50"], b"$5\r\nworld\r\n");
    p.expect(&["TTL", "s"], b":50\r\n");
    p.ok(&["GETEX", "s", "PERSIST"]);
    p.expect(&["TTL", "s"], b":-1\r\n");
    p.expect(&["GETDEL", "s"], b"$5\r\nworld\r\n");
    p.expect(&["GETDEL", "s"], b"$-1\r\n");
    p.expect(&["APPEND", "a", "foo"], b":3\r\n");
    p.expect(&["APPEND", "a", "bar"], b":6\r\n");
    p.expect(&["STRLEN", "a"], b":6\r\n");
    p.expect(&["SETRANGE", "a", "10", "zz"], b":12\r\n");
    p.ok(&["GET", "a"]);
    p.expect(&["GETRANGE", "a", "1", "4"], b"$4\r\nooba\r\n");
    p.ok(&["GETRANGE", "a", "-3", "-1"]);
    p.expect(&["INCR", "n"], b":1\r\n");
    p.expect(&["INCRBY", "n", "41"], b":42\r\n");
    p.expect(&["DECRBY", "n", "50"], b":-8\r\n");
    p.expect(&["DECR", "n"], b":-9\r\n");
    p.ok(&["INCRBYFLOAT", "f", "10.5"]);
    p.ok(&["INCRBYFLOAT", "f", "0.1"]);
    p.ok(&["INCRBYFLOAT", "f", "-5e3"]);
    p.err(&["INCR", "a"]);
    p.err(&["INCRBYFLOAT", "n", "x"]);
    p.err(&["INCRBY", "n", "99999999999999999999"]);
    p.expect(&["SET", "big", "9223372036854775807"], b"+OK\r\n");
    p.err(&["INCR", "big"]);
    p.expect(&["MSET", "m1", "a", "m2", "b", "m3", "c"], b"+OK\r\n");
    p.expect(
        &["MGET", "m1", "nope", "m3"],
        b"*3\r\n$1\r\na\r\n$-1\r\n$1\r\nc\r\n",
    );
    p.expect(&["MSETNX", "m1", "z", "m4", "d"], b":0\r\n");
    p.expect(&["MSETNX", "m4", "d", "m5", "e"], b":1\r\n");
    p.expect(&["SETNX", "m5", "f"], b":0\r\n");
    p.ok(&["SETEX", "se", "100", "v"]);
    p.ok(&["PSETEX", "pse", "100000", "v"]);
    p.ok(&["LCS", "m1", "m2"]);
    p.ok(&["SET", "l1", "ohmytext"]);
    p.ok(&["SET", "l2", "mynewtext"]);
    p.ok(&["LCS", "l1", "l2"]);
    p.ok(&["LCS", "l1", "l2", "IDX", "MINMATCHLEN", "2", "WITHMATCHLEN"]);
    p.expect(&["OBJECT", "ENCODING", "n"], b"$3\r\nint\r\n");
    p.expect(&["OBJECT", "ENCODING", "m1"], b"$6\r\nembstr\r\n");
    p.expect(&["OBJECT", "ENCODING", "a"], b"$3\r\nraw\r\n");
    p.expect(&["DBSIZE"], b":14\r\n");
}

#[test]
fn binary_keys_and_values() {
    let c = Compat::start();
    let mut p = c.pair();
    let key: &[u8] = b"k\r\n\0ey\xff";
    let value: &[u8] = b"\0\r\n$3\r\n*1\r\n\xfe\xff\r";
    p.expect(&[&b"SET"[..], key, value], b"+OK\r\n");
    let expected = [format!("${}\r\n", value.len()).as_bytes(), value, b"\r\n"].concat();
    p.expect(&[&b"GET"[..], key], &expected);
    p.ok(&[&b"APPEND"[..], key, b"\r\n\0"]);
    p.ok(&[&b"GET"[..], key]);
    p.ok(&[&b"STRLEN"[..], key]);
    p.expect(&[&b"EXISTS"[..], key], b":1\r\n");
    p.ok(&[&b"KEYS"[..], b"k*"]);
    p.ok(&[&b"RPUSH"[..], b"\0list", value, b"", b"\r\n"]);
    p.ok(&[&b"LRANGE"[..], b"\0list", b"0", b"-1"]);
    p.ok(&[&b"HSET"[..], b"h\n", b"\r", value, b"", b""]);
    p.ok(&[&b"HGETALL"[..], b"h\n"]);
    p.expect(&[&b"SET"[..], b"", b""], b"+OK\r\n");
    p.expect(&[&b"GET"[..], b""], b"$0\r\n\r\n");
    // A larger value, arriving at walrus and from Valkey in many reads.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    p.expect(&[&b"SET"[..], b"big", &big], b"+OK\r\n");
    p.ok(&[&b"GET"[..], b"big"]);
    p.ok(&[&b"GETRANGE"[..], b"big", b"1000", b"1100"]);
    p.ok(&[&b"DUMP"[..], key]);
}

#[test]
fn keys() {
    let c = Compat::start();
    let mut p = c.pair();
    p.run(&[
        &["SET", "k1", "v1"],
        &["SET", "k2", "v2"],
        &["RPUSH", "list", "a"],
        &["SADD", "set", "a"],
    ]);
    p.expect(&["EXISTS", "k1", "k2", "nope", "k1"], b":3\r\n");
    p.expect(&["TYPE", "k1"], b"+string\r\n");
    p.expect(&["TYPE", "list"], b"+list\r\n");
    p.expect(&["TYPE", "set"], b"+set\r\n");
    p.expect(&["TYPE", "nope"], b"+none\r\n");
    p.expect(&["EXPIRE", "k1", "100"], b":1\r\n");
    p.expect(&["TTL", "k1"], b":100\r\n");
    p.expect(&["EXPIRE", "k1", "200", "XX"], b":1\r\n");
    p.expect(&["EXPIRE", "k1", "50", "GT"], b":0\r\n");
    p.expect(&["EXPIRE", "nope", "100"], b":0\r\n");
    p.expect(&["TTL", "nope"], b":-2\r\n");
    p.expect(&["PERSIST", "k1"], b":1\r\n");
    p.expect(&["TTL", "k1"], b":-1\r\n");
    p.expect(&["PERSIST", "k1"], b":0\r\n");
    p.expect(&["RENAME", "k1", "k3"], b"+OK\r\n");
    p.err(&["RENAME", "k1", "k4"]);
    p.expect(&["RENAMENX", "k3", "k2"], b":0\r\n");
    p.expect(&["COPY", "k3", "k2"], b":0\r\n");
    p.expect(&["COPY", "k3", "k2", "REPLACE"], b":1\r\n");
    p.expect(&["COPY", "list", "list2"], b":1\r\n");
    p.ok(&["LRANGE", "list2", "0", "-1"]);
    p.expect(&["COPY", "k3", "k9", "DB", "3"], b":1\r\n");
    p.expect(&["MOVE", "k2", "4"], b":1\r\n");
    if server::under_test().redis_7_2() {
        p.expect(&["OBJECT", "ENCODING", "list"], b"$8\r\nlistpack\r\n");
    } else {
        p.ok(&["OBJECT", "ENCODING", "list"]);
    }
    p.expect(&["OBJECT", "ENCODING", "nope"], b"$-1\r\n");
    p.err(&["OBJECT", "NOSUCH"]);
    p.ok(&["OBJECT", "REFCOUNT", "list"]);
    p.expect(&["DEL", "k3", "nope", "list"], b":2\r\n");
    p.expect(&["UNLINK", "list2"], b":1\r\n");
    p.expect(&["TOUCH", "set", "nope"], b":1\r\n");
    p.expect(&["DBSIZE"], b":1\r\n");
    let dump = p.ok(&["DUMP", "set"]);
    let payload = match decode(&dump) {
        OwnedFrame::BulkString(b) => b,
        other => panic!("DUMP: {other:?}"),
    };
    p.expect(
        &[b"RESTORE".as_slice(), b"set2", b"0", &payload],
        b"+OK\r\n",
    );
    p.err(&[b"RESTORE".as_slice(), b"set2", b"0", &payload]);
    p.err(&[b"RESTORE".as_slice(), b"set3", b"0", b"garbage"]);
    p.ok(&["SMEMBERS", "set2"]);
}

#[test]
fn scan_and_keys_compare_as_sets() {
    let c = Compat::start();
    let mut p = c.pair();
    for i in 0..20 {
        p.ok(&["SET", &format!("user:{i}"), "x"]);
    }
    p.ok(&["RPUSH", "user:list", "x"]);
    p.ok(&["SET", "other", "x"]);
    // Keyspace order follows each server's random hash seed: compare cursors and sets.
    for args in [
        &["SCAN", "0", "COUNT", "1000"][..],
        &["SCAN", "0", "MATCH", "user:1*", "COUNT", "1000"],
        &["SCAN", "0", "TYPE", "list", "COUNT", "1000"],
        &["KEYS", "*"],
        &["KEYS", "user:?"],
    ] {
        let f = p.same_unordered(args);
        if args[0] == "SCAN" {
            let OwnedFrame::Array(parts) = &f else {
                panic!("{f:?}")
            };
            assert_eq!(parts[0], OwnedFrame::BulkString(b"0".to_vec()));
        }
    }
    // Small collections keep insertion order: byte-exact.
    p.ok(&["HSET", "h", "a", "1", "b", "2", "c", "3"]);
    p.ok(&["HSCAN", "h", "0"]);
    if server::has(server::under_test().hscan_novalues(), "HSCAN NOVALUES") {
        p.ok(&["HSCAN", "h", "0", "MATCH", "b*", "NOVALUES"]);
    }
    p.ok(&["SADD", "ints", "5", "3", "9"]);
    p.ok(&["SSCAN", "ints", "0"]);
    p.ok(&["ZADD", "z", "1", "a", "2", "b"]);
    p.ok(&["ZSCAN", "z", "0"]);
    p.err(&["SCAN", "x"]);
}

#[test]
fn lists() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["LPUSH", "l", "c", "b", "a"], b":3\r\n");
    p.expect(&["RPUSH", "l", "d", "e", "b"], b":6\r\n");
    p.ok(&["LRANGE", "l", "0", "-1"]);
    p.ok(&["LRANGE", "l", "-2", "100"]);
    p.expect(&["LLEN", "l"], b":6\r\n");
    p.expect(&["LINDEX", "l", "1"], b"$1\r\nb\r\n");
    p.expect(&["LPOS", "l", "b"], b":1\r\n");
    p.ok(&["LPOS", "l", "b", "RANK", "2"]);
    p.ok(&["LPOS", "l", "b", "COUNT", "0"]);
    p.expect(&["LPOS", "l", "zz"], b"$-1\r\n");
    p.expect(&["LINSERT", "l", "BEFORE", "d", "c2"], b":7\r\n");
    p.expect(&["LINSERT", "l", "AFTER", "nope", "x"], b":-1\r\n");
    p.ok(&["LSET", "l", "0", "A"]);
    p.err(&["LSET", "l", "100", "A"]);
    p.expect(&["LPOP", "l"], b"$1\r\nA\r\n");
    p.ok(&["LPOP", "l", "2"]);
    p.ok(&["RPOP", "l", "2"]);
    p.expect(&["LPOP", "nope"], b"$-1\r\n");
    p.expect(&["LPOP", "nope", "2"], b"*-1\r\n");
    p.ok(&["RPUSH", "src", "1", "2", "3"]);
    p.expect(&["LMOVE", "src", "dst", "LEFT", "RIGHT"], b"$1\r\n1\r\n");
    p.expect(&["LMOVE", "src", "dst", "RIGHT", "LEFT"], b"$1\r\n3\r\n");
    p.ok(&["LRANGE", "dst", "0", "-1"]);
    p.ok(&["RPOPLPUSH", "src", "dst"]);
    p.ok(&["LMPOP", "2", "nope", "dst", "LEFT", "COUNT", "2"]);
    p.expect(&["LREM", "l", "0", "b"], b":0\r\n");
    p.ok(&["LTRIM", "l", "0", "0"]);
    p.ok(&["LRANGE", "l", "0", "-1"]);
    p.expect(&["LPUSHX", "nope", "x"], b":0\r\n");
    p.err(&["LPUSH", "l"]);
    p.err(&["LPOS", "l", "b", "RANK", "0"]);
    for i in 0..1000 {
        p.ok(&["RPUSH", "long", &format!("element-{i}")]);
    }
    p.expect(&["OBJECT", "ENCODING", "long"], b"$9\r\nquicklist\r\n");
    p.ok(&["LRANGE", "long", "0", "-1"]);
    p.ok(&["SORT", "long", "ALPHA", "LIMIT", "0", "5", "DESC"]);
}

#[test]
fn hashes() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["HSET", "h", "f1", "v1", "f2", "v2"], b":2\r\n");
    p.expect(&["HSET", "h", "f1", "v1b", "f3", "3"], b":1\r\n");
    p.ok(&["HGETALL", "h"]);
    p.expect(&["HGET", "h", "f1"], b"$3\r\nv1b\r\n");
    p.expect(&["HGET", "h", "nope"], b"$-1\r\n");
    p.ok(&["HMGET", "h", "f1", "nope", "f3"]);
    p.expect(&["HINCRBY", "h", "f3", "10"], b":13\r\n");
    p.err(&["HINCRBY", "h", "f1", "1"]);
    p.ok(&["HINCRBYFLOAT", "h", "f3", "0.25"]);
    p.expect(&["HEXISTS", "h", "f2"], b":1\r\n");
    p.expect(&["HDEL", "h", "f2", "nope"], b":1\r\n");
    p.expect(&["HLEN", "h"], b":2\r\n");
    p.ok(&["HKEYS", "h"]);
    p.ok(&["HVALS", "h"]);
    p.ok(&["HSTRLEN", "h", "f1"]);
    p.expect(&["HSETNX", "h", "f1", "x"], b":0\r\n");
    p.ok(&["HSCAN", "h", "0", "COUNT", "10"]);
    p.expect(&["OBJECT", "ENCODING", "h"], b"$8\r\nlistpack\r\n");
    if server::has(server::under_test().hash_field_ttls(), "hash-field TTLs") {
        p.ok(&["HEXPIRE", "h", "100", "FIELDS", "1", "f1"]);
        p.ok(&["HTTL", "h", "FIELDS", "2", "f1", "f3"]);
        p.ok(&["HPERSIST", "h", "FIELDS", "1", "f1"]);
        p.ok(&["OBJECT", "ENCODING", "h"]);
    }
    p.err(&["HSET", "h", "f1"]);
    p.err(&["HGET", "h"]);
    p.expect(&["HGETALL", "nope"], b"*0\r\n");
}

#[test]
fn sets() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["SADD", "s1", "a", "b", "c", "d"], b":4\r\n");
    p.expect(&["SADD", "s1", "a"], b":0\r\n");
    p.expect(&["SADD", "s2", "c", "d", "e"], b":3\r\n");
    p.ok(&["SORT", "s1", "ALPHA"]);
    p.expect(&["SCARD", "s1"], b":4\r\n");
    p.expect(&["SISMEMBER", "s1", "a"], b":1\r\n");
    p.expect(
        &["SMISMEMBER", "s1", "a", "z", "d"],
        b"*3\r\n:1\r\n:0\r\n:1\r\n",
    );
    p.expect(&["SINTERSTORE", "i", "s1", "s2"], b":2\r\n");
    p.expect(&["SORT", "i", "ALPHA"], b"*2\r\n$1\r\nc\r\n$1\r\nd\r\n");
    p.expect(&["SUNIONSTORE", "u", "s1", "s2"], b":5\r\n");
    p.ok(&["SORT", "u", "ALPHA", "DESC"]);
    p.expect(&["SDIFFSTORE", "d", "s1", "s2"], b":2\r\n");
    p.ok(&["SORT", "d", "ALPHA"]);
    p.expect(&["SINTERCARD", "2", "s1", "s2"], b":2\r\n");
    p.expect(&["SMOVE", "s1", "s2", "a"], b":1\r\n");
    p.expect(&["SREM", "s1", "b", "zz"], b":1\r\n");
    p.ok(&["SORT", "s1", "ALPHA"]);
    p.ok(&["SADD", "nums", "10", "2", "33"]);
    p.expect(&["OBJECT", "ENCODING", "nums"], b"$6\r\nintset\r\n");
    p.ok(&["SMEMBERS", "nums"]);
    p.ok(&["SORT", "nums"]);
    p.err(&["SORT", "s1"]);
    p.err(&["SADD", "s1"]);
    // Random picks: only the shape can match.
    let (a, w) = p.both(&["SRANDMEMBER", "nums"]);
    for r in [&a, &w] {
        assert!(
            [&b"$2\r\n10\r\n"[..], b"$1\r\n2\r\n", b"$2\r\n33\r\n"].contains(&r.as_slice()),
            "{}",
            show(r)
        );
    }
    let (a, w) = p.both(&["SRANDMEMBER", "nums", "5"]);
    assert!(a.starts_with(b"*3\r\n") && w.starts_with(b"*3\r\n"));
    p.expect(&["SRANDMEMBER", "nope"], b"$-1\r\n");
}

#[test]
fn sorted_sets() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["ZADD", "z", "1", "a", "2.5", "b", "3", "c"], b":3\r\n");
    p.expect(&["ZADD", "z", "NX", "10", "a", "4", "d"], b":1\r\n");
    p.ok(&["ZADD", "z", "XX", "CH", "1.5", "a"]);
    p.ok(&["ZADD", "z", "INCR", "1", "a"]);
    p.ok(&["ZRANGE", "z", "0", "-1", "WITHSCORES"]);
    p.ok(&["ZRANGE", "z", "(1", "+inf", "BYSCORE", "LIMIT", "1", "2"]);
    p.ok(&["ZRANGE", "z", "[a", "[c", "BYLEX"]);
    p.ok(&["ZRANGEBYSCORE", "z", "-inf", "3", "WITHSCORES"]);
    p.ok(&["ZREVRANGEBYSCORE", "z", "+inf", "(2.5"]);
    p.ok(&["ZINCRBY", "z", "0.1", "b"]);
    p.ok(&["ZSCORE", "z", "b"]);
    p.ok(&["ZMSCORE", "z", "a", "nope", "c"]);
    p.expect(&["ZRANK", "z", "c"], b":2\r\n");
    if server::has(server::under_test().redis_7_2(), "ZRANK WITHSCORE") {
        p.ok(&["ZRANK", "z", "c", "WITHSCORE"]);
    }
    p.expect(&["ZCARD", "z"], b":4\r\n");
    p.expect(&["ZCOUNT", "z", "2", "3"], b":3\r\n");
    p.ok(&["ZADD", "y", "1", "b", "5", "e"]);
    p.expect(
        &["ZUNIONSTORE", "u", "2", "z", "y", "WEIGHTS", "2", "3"],
        b":5\r\n",
    );
    p.ok(&["ZRANGE", "u", "0", "-1", "WITHSCORES"]);
    p.ok(&["ZINTERSTORE", "i", "2", "z", "y", "AGGREGATE", "MAX"]);
    p.ok(&["ZRANGE", "i", "0", "-1", "WITHSCORES"]);
    p.ok(&["ZDIFF", "2", "z", "y", "WITHSCORES"]);
    p.ok(&["ZPOPMIN", "z"]);
    p.ok(&["ZPOPMAX", "z", "2"]);
    p.ok(&["ZMPOP", "2", "nope", "u", "MIN", "COUNT", "2"]);
    p.expect(&["ZPOPMIN", "nope"], b"*0\r\n");
    p.ok(&["ZADD", "lex", "0", "a", "0", "b", "0", "c"]);
    p.expect(&["ZLEXCOUNT", "lex", "-", "+"], b":3\r\n");
    p.ok(&["ZREMRANGEBYLEX", "lex", "[a", "[b"]);
    p.err(&["ZADD", "z", "x", "a"]);
    p.err(&["ZADD", "z", "NX", "XX", "1", "a"]);
    p.err(&["ZADD", "z", "nan", "a"]);
    p.ok(&["ZADD", "z", "inf", "big", "-inf", "small"]);
    p.ok(&["ZRANGE", "z", "0", "-1", "WITHSCORES"]);
}

#[test]
fn streams() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["XADD", "s", "1-1", "f", "v"], b"$3\r\n1-1\r\n");
    p.expect(
        &["XADD", "s", "2-1", "f2", "v2", "g", "w"],
        b"$3\r\n2-1\r\n",
    );
    p.expect(&["XADD", "s", "3-*", "a", "b"], b"$3\r\n3-0\r\n");
    p.err(&["XADD", "s", "1-0", "a", "b"]);
    p.err(&["XADD", "s", "0-0", "a", "b"]);
    p.expect(&["XLEN", "s"], b":3\r\n");
    p.ok(&["XRANGE", "s", "-", "+"]);
    p.ok(&["XRANGE", "s", "(1-1", "+", "COUNT", "1"]);
    p.ok(&["XREVRANGE", "s", "+", "-", "COUNT", "2"]);
    p.ok(&["XREAD", "COUNT", "2", "STREAMS", "s", "0"]);
    p.expect(&["XREAD", "STREAMS", "s", "3-0"], b"*-1\r\n");
    p.expect(&["XGROUP", "CREATE", "s", "g", "0"], b"+OK\r\n");
    p.err(&["XGROUP", "CREATE", "s", "g", "0"]);
    p.err(&["XGROUP", "CREATE", "nope", "g", "0"]);
    p.ok(&["XGROUP", "CREATE", "nope", "g", "$", "MKSTREAM"]);
    p.ok(&[
        "XREADGROUP",
        "GROUP",
        "g",
        "alice",
        "COUNT",
        "2",
        "STREAMS",
        "s",
        ">",
    ]);
    p.ok(&["XREADGROUP", "GROUP", "g", "bob", "STREAMS", "s", ">"]);
    p.expect(
        &["XREADGROUP", "GROUP", "g", "bob", "STREAMS", "s", ">"],
        b"*-1\r\n",
    );
    p.ok(&["XREADGROUP", "GROUP", "g", "alice", "STREAMS", "s", "0"]);
    p.err(&["XREADGROUP", "GROUP", "nogroup", "x", "STREAMS", "s", ">"]);
    p.ok(&["XPENDING", "s", "g"]);
    p.expect(&["XACK", "s", "g", "1-1", "9-9"], b":1\r\n");
    p.ok(&["XPENDING", "s", "g"]);
    p.ok(&["XINFO", "GROUPS", "s"]);
    p.ok(&["XCLAIM", "s", "g", "bob", "0", "2-1", "JUSTID"]);
    p.ok(&["XAUTOCLAIM", "s", "g", "alice", "0", "0-0", "JUSTID"]);
    p.expect(&["XDEL", "s", "2-1"], b":1\r\n");
    p.expect(&["XTRIM", "s", "MAXLEN", "1"], b":1\r\n");
    p.ok(&["XRANGE", "s", "-", "+"]);
    p.ok(&["XSETID", "s", "10-0"]);
    p.err(&["XADD", "s", "5-0", "a", "b"]);
    p.err(&["XRANGE", "s", "x", "+"]);
}

#[test]
fn hyperloglog_bitmaps_geo() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["PFADD", "h1", "a", "b", "c", "d"], b":1\r\n");
    p.expect(&["PFADD", "h1", "a"], b":0\r\n");
    p.ok(&["PFADD", "h2", "c", "d", "e"]);
    p.expect(&["PFCOUNT", "h1"], b":4\r\n");
    p.expect(&["PFCOUNT", "h1", "h2"], b":5\r\n");
    p.expect(&["PFMERGE", "h3", "h1", "h2"], b"+OK\r\n");
    p.ok(&["GET", "h3"]);
    p.ok(&["SET", "notahll", "x"]);
    p.err(&["PFADD", "notahll", "x"]);

    p.expect(&["SETBIT", "b", "7", "1"], b":0\r\n");
    p.expect(&["SETBIT", "b", "7", "1"], b":1\r\n");
    p.ok(&["SETBIT", "b", "100", "1"]);
    p.expect(&["GETBIT", "b", "100"], b":1\r\n");
    p.expect(&["BITCOUNT", "b"], b":2\r\n");
    p.ok(&["BITCOUNT", "b", "0", "0", "BIT"]);
    p.ok(&["SET", "c", "\u{f}\u{f0}"]);
    p.ok(&["BITOP", "AND", "and", "b", "c"]);
    p.ok(&["BITOP", "OR", "or", "b", "c"]);
    p.ok(&["BITOP", "XOR", "xor", "b", "c"]);
    p.ok(&["BITOP", "NOT", "not", "b"]);
    p.ok(&["GET", "or"]);
    p.ok(&["GET", "not"]);
    p.ok(&["BITPOS", "b", "1"]);
    p.ok(&[
        "BITFIELD", "bf", "SET", "u8", "0", "200", "INCRBY", "u8", "0", "100",
    ]);
    p.ok(&["BITFIELD_RO", "bf", "GET", "i8", "0"]);
    p.err(&["SETBIT", "b", "-1", "1"]);
    p.err(&["BITOP", "NOT", "x", "a", "b"]);

    p.expect(
        &[
            "GEOADD",
            "Sicily",
            "13.361389",
            "38.115556",
            "Palermo",
            "15.087269",
            "37.502669",
            "Catania",
        ],
        b":2\r\n",
    );
    p.ok(&["GEODIST", "Sicily", "Palermo", "Catania"]);
    p.ok(&["GEODIST", "Sicily", "Palermo", "Catania", "km"]);
    p.expect(&["GEODIST", "Sicily", "Palermo", "Nowhere"], b"$-1\r\n");
    p.ok(&["GEOPOS", "Sicily", "Palermo", "Nowhere"]);
    p.ok(&["GEOHASH", "Sicily", "Palermo", "Catania"]);
    p.ok(&[
        "GEOSEARCH",
        "Sicily",
        "FROMLONLAT",
        "15",
        "37",
        "BYRADIUS",
        "200",
        "km",
        "ASC",
        "WITHCOORD",
        "WITHDIST",
        "WITHHASH",
    ]);
    p.ok(&[
        "GEOSEARCH",
        "Sicily",
        "FROMMEMBER",
        "Palermo",
        "BYBOX",
        "400",
        "400",
        "km",
        "DESC",
        "COUNT",
        "1",
    ]);
    p.ok(&[
        "GEOSEARCHSTORE",
        "near",
        "Sicily",
        "FROMLONLAT",
        "15",
        "37",
        "BYRADIUS",
        "100",
        "km",
    ]);
    p.ok(&["ZRANGE", "near", "0", "-1", "WITHSCORES"]);
    p.err(&["GEOADD", "Sicily", "200", "100", "bad"]);
}

#[test]
fn transactions() {
    let c = Compat::start();
    let mut p = c.pair();
    p.err(&["EXEC"]);
    p.err(&["DISCARD"]);
    p.expect(&["MULTI"], b"+OK\r\n");
    p.expect(&["SET", "k", "1"], b"+QUEUED\r\n");
    p.expect(&["INCR", "k"], b"+QUEUED\r\n");
    p.expect(&["LPUSH", "k", "x"], b"+QUEUED\r\n");
    p.expect(&["GET", "k"], b"+QUEUED\r\n");
    p.expect(
        &["EXEC"],
        b"*4\r\n+OK\r\n:2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n$1\r\n2\r\n",
    );
    p.err(&["EXEC"]);
    p.ok(&["MULTI"]);
    p.ok(&["SET", "k", "discarded"]);
    p.expect(&["DISCARD"], b"+OK\r\n");
    p.expect(&["GET", "k"], b"$1\r\n2\r\n");
    // An error while queueing aborts the transaction.
    p.ok(&["MULTI"]);
    p.ok(&["SET", "k", "3"]);
    p.err(&["NOSUCHCOMMAND"]);
    p.err(&["GET"]);
    p.err(&["EXEC"]);
    p.expect(&["GET", "k"], b"$1\r\n2\r\n");
    // A nested MULTI or a WATCH inside MULTI aborts the transaction from Redis 7.2 on;
    // Redis OSS before it runs the transaction anyway.
    let aborts = server::under_test().redis_7_2();
    for inside in [&["MULTI"][..], &["WATCH", "k"]] {
        p.ok(&["MULTI"]);
        p.err(inside);
        if aborts {
            p.err(&["EXEC"]);
        } else {
            p.same(&["EXEC"]);
        }
    }
}

/// A SELECT queued in a transaction changes the client's database once EXEC runs it.
#[test]
fn select_inside_multi_persists_after_exec() {
    let c = Compat::start();
    let mut p = c.pair();
    p.ok(&["MULTI"]);
    p.ok(&["SELECT", "2"]);
    p.ok(&["SET", "indb2", "x"]);
    p.ok(&["EXEC"]);
    p.expect(&["GET", "indb2"], b"$1\r\nx\r\n");
    p.ok(&["SELECT", "0"]);
    p.expect(&["GET", "indb2"], b"$-1\r\n");
}

/// A transaction that did not run leaves its client in its database, as in Valkey: a SELECT
/// queued in it never ran. `p` opens a transaction, queues `SELECT 1`, and `end` ends it
/// (checking its reply); the client's next write must land in database 0, where another
/// client reads it. (walrus moved the client on any EXEC: the write landed in database 1.)
fn select_in_a_transaction_that_did_not_run(c: &Compat, mut p: Pair, end: impl Fn(&mut Pair)) {
    p.ok(&["MULTI"]);
    p.expect(&["SELECT", "1"], b"+QUEUED\r\n");
    end(&mut p);
    p.ok(&["SET", "x", "v"]);
    c.pair().expect(&["GET", "x"], b"$1\r\nv\r\n");
    p.expect(&["GET", "x"], b"$1\r\nv\r\n");
}

#[test]
fn select_in_a_transaction_aborted_by_a_queueing_error_does_not_move_the_client() {
    let c = Compat::start();
    select_in_a_transaction_that_did_not_run(&c, c.pair(), |p| {
        p.err(&["NO-SUCH-COMMAND"]);
        p.starts(&["EXEC"], "-EXECABORT");
    });
}

#[test]
fn select_in_a_transaction_aborted_by_watch_does_not_move_the_client() {
    let c = Compat::start();
    let mut p = c.pair();
    p.ok(&["WATCH", "w"]);
    c.pair().ok(&["SET", "w", "changed"]);
    select_in_a_transaction_that_did_not_run(&c, p, |p| p.expect(&["EXEC"], b"*-1\r\n"));
}

#[test]
fn select_in_a_discarded_transaction_does_not_move_the_client() {
    let c = Compat::start();
    select_in_a_transaction_that_did_not_run(&c, c.pair(), |p| {
        p.ok(&["DISCARD"]);
    });
}

#[test]
fn watch_aborts_on_concurrent_change() {
    let c = Compat::start();
    let mut p = c.pair();
    let mut other = c.pair();
    p.ok(&["SET", "w", "0"]);
    p.expect(&["WATCH", "w"], b"+OK\r\n");
    other.expect(&["SET", "w", "changed"], b"+OK\r\n");
    p.ok(&["MULTI"]);
    p.ok(&["SET", "w", "mine"]);
    p.expect(&["EXEC"], b"*-1\r\n");
    p.expect(&["GET", "w"], b"$7\r\nchanged\r\n");
    // Unmodified: the transaction runs.
    p.ok(&["WATCH", "w"]);
    p.ok(&["MULTI"]);
    p.ok(&["SET", "w", "mine"]);
    p.expect(&["EXEC"], b"*1\r\n+OK\r\n");
    other.expect(&["GET", "w"], b"$4\r\nmine\r\n");
    // UNWATCH forgets the watch.
    p.ok(&["WATCH", "w"]);
    other.ok(&["SET", "w", "again"]);
    p.ok(&["UNWATCH"]);
    p.ok(&["MULTI"]);
    p.ok(&["GET", "w"]);
    p.expect(&["EXEC"], b"*1\r\n$5\r\nagain\r\n");
}

#[test]
fn scripts() {
    let c = Compat::start();
    let mut p = c.pair();
    let body = "return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1]), 3.99, false, {'nested', 1}}";
    p.ok(&["EVAL", body, "1", "counter", "arg"]);
    p.ok(&["EVAL", body, "1", "counter", "arg"]);
    let sha = p.ok(&["SCRIPT", "LOAD", body]);
    let OwnedFrame::BulkString(sha) = decode(&sha) else {
        panic!()
    };
    let sha = String::from_utf8(sha).unwrap();
    p.ok(&["EVALSHA", &sha, "1", "counter", "again"]);
    p.expect(&["SCRIPT", "EXISTS", &sha, "0000"], b"*2\r\n:1\r\n:0\r\n");
    p.err(&["EVALSHA", "0000000000000000000000000000000000000000", "0"]);
    p.ok(&[
        "EVAL_RO",
        "return redis.call('GET', KEYS[1])",
        "1",
        "counter",
    ]);
    p.err(&[
        "EVAL_RO",
        "return redis.call('SET', KEYS[1], 'x')",
        "1",
        "k",
    ]);
    p.err(&["EVALSHA_RO", &sha.to_uppercase(), "1", "nope", "x"]);
    p.ok(&["EVAL", "return redis.status_reply('FINE')", "0"]);
    p.ok(&["EVAL", "return {1, 2, nil, 4}", "0"]);
    p.ok(&["EVAL", "return nil", "0"]);
    p.err(&[
        "EVAL",
        "return redis.pcall('LPUSH', KEYS[1], 'x')",
        "1",
        "counter",
    ]);
    // Script errors carry the script's sha: the same on both servers.
    p.err(&["EVAL", "return redis.error_reply('MYERR boom')", "0"]);
    p.err(&[
        "EVAL",
        "return redis.call('LPUSH', KEYS[1], 'x')",
        "1",
        "counter",
    ]);
    p.err(&["EVAL", "return nosuchglobal.x", "0"]);
    p.err(&["EVAL", "return +", "0"]);
    p.err(&["EVAL", "return 1", "2", "onlyone"]);
    p.err(&["EVAL", "return 1", "x"]);
    p.err(&["EVAL", "return redis.call('NOSUCH')", "0"]);
    p.ok(&["SCRIPT", "FLUSH"]);
    p.err(&["EVALSHA", &sha, "1", "counter", "x"]);
}

#[test]
fn functions() {
    let c = Compat::start();
    let mut p = c.pair();
    let lib = "#!lua name=mylib\n\
        redis.register_function('echo_first', function(keys, args) return args[1] end)\n\
        redis.register_function('incr_key', function(keys, args) return redis.call('INCRBY', keys[1], args[1]) end)\n\
        redis.register_function{function_name='get_ro', callback=function(keys, args) return redis.call('GET', keys[1]) end, flags={'no-writes'}}\n";
    p.expect(&["FUNCTION", "LOAD", lib], b"$5\r\nmylib\r\n");
    p.err(&["FUNCTION", "LOAD", lib]);
    p.expect(&["FCALL", "echo_first", "0", "hi"], b"$2\r\nhi\r\n");
    p.expect(&["FCALL", "incr_key", "1", "n", "5"], b":5\r\n");
    p.expect(&["FCALL", "incr_key", "1", "n", "5"], b":10\r\n");
    p.expect(&["FCALL_RO", "get_ro", "1", "n"], b"$2\r\n10\r\n");
    p.err(&["FCALL_RO", "incr_key", "1", "n", "1"]);
    p.err(&["FCALL", "nosuch", "0"]);
    p.err(&["FCALL", "incr_key", "1", "n", "notanumber"]);
    // Functions are listed in hash order.
    p.same_unordered(&["FUNCTION", "LIST"]);
    p.same_unordered(&["FUNCTION", "LIST", "LIBRARYNAME", "my", "WITHCODE"]);
    p.err(&["FUNCTION", "LOAD", "#!lua name=bad\nreturn 1"]);
    p.err(&["FUNCTION", "LOAD", "no shebang"]);
    p.expect(&["FUNCTION", "DELETE", "mylib"], b"+OK\r\n");
    p.err(&["FUNCTION", "DELETE", "mylib"]);
    p.err(&["FCALL", "echo_first", "0", "hi"]);
    p.expect(&["FUNCTION", "LIST"], b"*0\r\n");
}

#[test]
fn pubsub_resp2() {
    let c = Compat::start();
    let mut sub = c.pair();
    let mut publ = c.pair();
    sub.expect(
        &["SUBSCRIBE", "news", "sport"],
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n",
    );
    sub.read_same(); // sport, 2
    publ.expect(&["PUBLISH", "news", "hi\r\n\0there"], b":1\r\n");
    let msg = sub.read_same();
    assert_eq!(
        msg,
        b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$10\r\nhi\r\n\0there\r\n"
    );
    publ.expect(&["PUBLISH", "nobody", "x"], b":0\r\n");
    publ.expect(
        &["PUBSUB", "NUMSUB", "news", "nobody"],
        b"*4\r\n$4\r\nnews\r\n:1\r\n$6\r\nnobody\r\n:0\r\n",
    );
    sub.same(&["PING"]);
    sub.same(&["PING", "payload"]);
    sub.expect(
        &["PSUBSCRIBE", "n*"],
        b"*3\r\n$10\r\npsubscribe\r\n$2\r\nn*\r\n:3\r\n",
    );
    publ.expect(&["PUBSUB", "NUMPAT"], b":1\r\n");
    publ.expect(&["PUBLISH", "news", "both"], b":2\r\n");
    sub.read_same(); // message
    let pmsg = sub.read_same();
    assert!(pmsg.starts_with(b"*4\r\n$8\r\npmessage\r\n$2\r\nn*\r\n"));
    publ.expect(&["PUBLISH", "nothing", "p"], b":1\r\n");
    sub.read_same();
    // Unsubscribing from everything at once lists channels in hash order: one at a time.
    sub.expect(
        &["UNSUBSCRIBE", "news"],
        b"*3\r\n$11\r\nunsubscribe\r\n$4\r\nnews\r\n:2\r\n",
    );
    sub.ok(&["UNSUBSCRIBE", "sport"]);
    sub.expect(
        &["PUNSUBSCRIBE", "n*"],
        b"*3\r\n$12\r\npunsubscribe\r\n$2\r\nn*\r\n:0\r\n",
    );
    publ.expect(&["PUBLISH", "news", "gone"], b":0\r\n");
    sub.expect(
        &["SSUBSCRIBE", "shard"],
        b"*3\r\n$10\r\nssubscribe\r\n$5\r\nshard\r\n:1\r\n",
    );
    publ.expect(&["SPUBLISH", "shard", "s-msg"], b":1\r\n");
    assert_eq!(
        sub.read_same(),
        b"*3\r\n$8\r\nsmessage\r\n$5\r\nshard\r\n$5\r\ns-msg\r\n"
    );
    sub.ok(&["SUNSUBSCRIBE", "shard"]);
    sub.expect(&["PING"], b"+PONG\r\n");
}

/// Valkey answers a RESP2 subscriber's other commands with an error and keeps the
/// connection. walrus relays a RESP2 subscriber byte for byte and does not follow it out of
/// subscribed mode, so another command gets an error and the connection is closed (docs/design.md,
/// "Stateful sessions"); a new connection is an ordinary client.
#[test]
fn a_resp2_subscribers_other_command_closes_its_connection() {
    let v = Valkey::start();
    let w = start_walrus(&v.addr(), "");
    let mut sub = Raw::connect(&w.addr);
    assert_eq!(
        sub.cmd(&["SUBSCRIBE", "ch"]),
        b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
    );
    let r = sub.cmd(&["GET", "k"]);
    assert!(
        r.starts_with(b"-ERR walrus: 'GET' is not allowed on a connection in Pub/Sub, MONITOR or replica mode"),
        "{}",
        show(&r)
    );
    assert!(sub.try_read_frame().is_err(), "the connection is closed");
    assert_eq!(Raw::connect(&w.addr).cmd(&["PING"]), b"+PONG\r\n");
}

#[test]
fn pubsub_resp3() {
    let c = Compat::start();
    let mut sub = c.pair();
    let mut publ = c.pair();
    let (a, w) = sub.both(&["HELLO", "3"]);
    assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
    sub.expect(
        &["SUBSCRIBE", "ch"],
        b">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n",
    );
    publ.expect(&["PUBLISH", "ch", "m\r\n1"], b":1\r\n");
    assert_eq!(
        sub.read_same(),
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$4\r\nm\r\n1\r\n"
    );
    // In RESP3 a subscribed client may run any command.
    publ.ok(&["HSET", "h", "f", "v"]);
    sub.expect(&["HGETALL", "h"], b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n");
    sub.expect(&["GET", "nope"], b"_\r\n");
    sub.same(&["PING"]);
    sub.expect(
        &["PSUBSCRIBE", "c*"],
        b">3\r\n$10\r\npsubscribe\r\n$2\r\nc*\r\n:2\r\n",
    );
    publ.expect(&["PUBLISH", "ch", "two"], b":2\r\n");
    sub.read_same();
    assert_eq!(
        sub.read_same(),
        b">4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$2\r\nch\r\n$3\r\ntwo\r\n"
    );
    sub.ok(&["UNSUBSCRIBE", "ch"]);
    sub.ok(&["PUNSUBSCRIBE", "c*"]);
    publ.expect(&["PUBLISH", "ch", "none"], b":0\r\n");
    sub.expect(&["GET", "nope"], b"_\r\n");
}

/// Client-side caching in OPTIN mode: `CLIENT CACHING yes` has the next command's keys
/// tracked, and only the next one's. `between` is sent with it, in one write behind a write
/// of another key; then the read of `k`. Another client overwrites `k`: the reader gets its
/// invalidation, as from Valkey. (walrus's ROLE after the write went between CLIENT CACHING
/// and the read, which was then not tracked: no invalidation ever came, and a client-side
/// cache served the old value for good.)
fn optin_read_is_tracked(between: &[&[&str]]) {
    let c = Compat::start();
    let mut p = c.pair();
    p.hello(&["HELLO", "3"]);
    p.ok(&["CLIENT", "TRACKING", "ON", "OPTIN"]);
    c.pair().ok(&["SET", "k", "old"]);
    let mut batch = walrus::resp::write::command(["SET", "w", "1"]).to_vec();
    batch.extend_from_slice(&walrus::resp::write::command(["CLIENT", "CACHING", "YES"]));
    for cmd in between {
        batch.extend_from_slice(&walrus::resp::write::command(cmd.iter()));
    }
    p.send_both(&batch);
    for _ in 0..2 + between.len() {
        p.read_same();
    }
    p.expect(&["GET", "k"], b"$3\r\nold\r\n");
    c.pair().ok(&["SET", "k", "new"]);
    assert_eq!(
        show(&p.read_same()),
        show(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n")
    );
}

#[test]
fn client_caching_yes_after_a_write_has_the_next_read_tracked() {
    optin_read_is_tracked(&[]);
}

/// The same with `CLIENT GETNAME` between CLIENT CACHING and the read: Valkey keeps the flag
/// across CLIENT commands. walrus answers GETNAME itself, and asks nothing of Valkey on the
/// client's connection to do so. (It sent a PING there, to learn whether the client needs
/// to authenticate, which cleared the flag.)
#[test]
fn client_caching_yes_lasts_across_a_client_command_walrus_answers() {
    optin_read_is_tracked(&[&["CLIENT", "GETNAME"]]);
}

#[test]
fn blocking_commands_time_out() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["BLPOP", "empty", "0.1"], b"*-1\r\n");
    p.expect(&["BRPOP", "empty", "e2", "0.05"], b"*-1\r\n");
    p.expect(
        &["BLMOVE", "empty", "dst", "LEFT", "RIGHT", "0.05"],
        b"*-1\r\n",
    );
    p.expect(&["BZPOPMIN", "empty", "0.05"], b"*-1\r\n");
    p.expect(&["BLMPOP", "0.05", "1", "empty", "LEFT"], b"*-1\r\n");
    p.err(&["BLPOP", "empty", "-1"]);
    p.err(&["BLPOP", "empty", "x"]);
    // Data already there: no wait.
    p.ok(&["RPUSH", "l", "a", "b"]);
    p.expect(
        &["BLPOP", "empty", "l", "0"],
        b"*2\r\n$1\r\nl\r\n$1\r\na\r\n",
    );
    p.expect(
        &["BLMOVE", "l", "dst", "LEFT", "RIGHT", "0"],
        b"$1\r\nb\r\n",
    );
    p.ok(&["ZADD", "z", "1", "m"]);
    p.expect(
        &["BZPOPMIN", "z", "0"],
        b"*3\r\n$1\r\nz\r\n$1\r\nm\r\n$1\r\n1\r\n",
    );
    p.ok(&["XADD", "s", "1-0", "f", "v"]);
    p.ok(&["XREAD", "BLOCK", "0", "STREAMS", "s", "0"]);
    p.expect(&["XREAD", "BLOCK", "50", "STREAMS", "s", "$"], b"*-1\r\n");
    // The session goes on, on its dedicated connection, in RESP3 too.
    p.hello(&["HELLO", "3"]);
    p.expect(&["BLPOP", "empty", "0.05"], b"_\r\n");
    p.expect(&["BZPOPMIN", "empty", "0.05"], b"_\r\n");
    p.expect(&["LRANGE", "dst", "0", "-1"], b"*1\r\n$1\r\nb\r\n");
}

/// A client blocks (confirmed by the server's CLIENT LIST), another one wakes it.
fn woken<B: AsRef<[u8]>, W: AsRef<[u8]>>(
    c: &Compat,
    block: &[B],
    blocked_cmd: &str,
    wake: &[W],
) -> Vec<u8> {
    let (mut admin_a, mut admin_b) = c.admins();
    let mut blocked = c.pair();
    let mut waker = c.pair();
    blocked.ok(&["CLIENT", "SETNAME", "blocker"]);
    blocked.send_both(&walrus::resp::write::command(
        block.iter().map(|a| a.as_ref()),
    ));
    // walrus passed the client's name on to its dedicated connection: B lists it.
    wait_blocked(&mut admin_a, "blocker", blocked_cmd);
    wait_blocked(&mut admin_b, "blocker", blocked_cmd);
    waker.ok(wake);
    let r = blocked.read_same();
    blocked.ok(&["CLIENT", "SETNAME", "done"]);
    r
}

#[test]
fn blocking_commands_are_woken() {
    let c = Compat::start();
    let r = woken(&c, &["BLPOP", "q", "0"], "blpop", &["RPUSH", "q", "job"]);
    assert_eq!(r, b"*2\r\n$1\r\nq\r\n$3\r\njob\r\n");
    let r = woken(
        &c,
        &["BLMOVE", "src", "dst", "RIGHT", "LEFT", "0"],
        "blmove",
        &["LPUSH", "src", "x\r\n"],
    );
    assert_eq!(r, b"$3\r\nx\r\n\r\n");
    let r = woken(
        &c,
        &["BZPOPMIN", "z1", "z2", "5"],
        "bzpopmin",
        &["ZADD", "z2", "2.5", "m"],
    );
    assert_eq!(r, b"*3\r\n$2\r\nz2\r\n$1\r\nm\r\n$3\r\n2.5\r\n");
    let mut p = c.pair();
    p.ok(&["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"]);
    let r = woken(
        &c,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c",
            "BLOCK",
            "0",
            "STREAMS",
            "s",
            ">",
        ],
        "xreadgroup",
        &["XADD", "s", "5-0", "f", "v"],
    );
    assert!(r.starts_with(b"*1\r\n*2\r\n$1\r\ns\r\n"), "{}", show(&r));
    p.expect(&["LRANGE", "dst", "0", "-1"], b"*1\r\n$3\r\nx\r\n\r\n");
}

#[test]
fn hello_3_switches_to_resp3() {
    let c = Compat::start();
    let mut p = c.pair();
    p.run(&[
        &["HSET", "h", "f1", "1", "f2", "2"],
        &["SADD", "s", "a", "b", "c"],
        &["ZADD", "z", "1.5", "m", "2", "n"],
        &["SET", "str", "v"],
        &["RPUSH", "l", "x"],
    ]);
    let (a, w) = p.both(&["HELLO"]);
    assert!(a.starts_with(b"*14\r\n$6\r\nserver\r\n"), "{}", show(&a));
    assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
    let (a, w) = p.both(&["HELLO", "3"]);
    assert!(a.starts_with(b"%7\r\n$6\r\nserver\r\n"), "{}", show(&a));
    assert!(show(&a).contains("$5⏎proto⏎:3⏎"));
    assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
    p.expect(
        &["HGETALL", "h"],
        b"%2\r\n$2\r\nf1\r\n$1\r\n1\r\n$2\r\nf2\r\n$1\r\n2\r\n",
    );
    // Small sets keep insertion order from Redis 7.2 (listpacks); before, two servers
    // iterate a hash table each with its own seed.
    if server::under_test().redis_7_2() {
        p.expect(
            &["SMEMBERS", "s"],
            b"~3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n",
        );
    } else {
        let (a, w) = p.both(&["SMEMBERS", "s"]);
        let members = |r: &[u8]| {
            let mut lines: Vec<Vec<u8>> = r.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
            lines.sort();
            lines
        };
        assert_eq!(members(&a), members(&w), "SMEMBERS s as a set");
    }
    p.expect(&["GET", "nope"], b"_\r\n");
    p.expect(&["ZSCORE", "z", "m"], b",1.5\r\n");
    p.expect(
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        b"*2\r\n*2\r\n$1\r\nm\r\n,1.5\r\n*2\r\n$1\r\nn\r\n,2\r\n",
    );
    p.expect(&["ZADD", "z", "INCR", "1", "m"], b",2.5\r\n");
    p.expect(&["INCRBYFLOAT", "f", "1.5"], b"$3\r\n1.5\r\n");
    p.expect(&["LPOP", "nope", "2"], b"_\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"_\r\n");
    p.ok(&["CONFIG", "GET", "maxmemory-policy"]);
    p.ok(&["HRANDFIELD", "nope", "2", "WITHVALUES"]);
    p.ok(&["XADD", "st", "1-0", "a", "b"]);
    p.ok(&["XRANGE", "st", "-", "+"]);
    p.ok(&["XREAD", "STREAMS", "st", "0"]);
    p.ok(&[
        "EVAL",
        "redis.setresp(3); return redis.call('HGETALL', KEYS[1])",
        "1",
        "h",
    ]);
    p.ok(&[
        "EVAL",
        "redis.setresp(3); return redis.call('ZSCORE', KEYS[1], 'm')",
        "1",
        "z",
    ]);
    p.ok(&["EVAL", "return {double=3.5}", "0"]);
    p.ok(&["EVAL", "return redis.call('GET', 'nope')", "0"]);
    p.err(&["GET"]);
    let (a, w) = p.both(&["HELLO", "3", "SETNAME", "conn-x"]);
    assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
    p.expect(&["CLIENT", "GETNAME"], b"$6\r\nconn-x\r\n");
    p.err(&["HELLO", "4"]);
    p.err(&["HELLO", "x"]);
    p.err(&["HELLO", "3", "FOO"]);
    p.err(&["HELLO", "3", "AUTH", "default"]);
    p.err(&["HELLO", "3", "SETNAME", "has space"]);
    // Failed HELLOs changed nothing.
    p.expect(&["GET", "nope"], b"_\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$6\r\nconn-x\r\n");
    let (a, w) = p.both(&["HELLO", "2"]);
    assert!(a.starts_with(b"*14\r\n"), "{}", show(&a));
    assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
    p.expect(
        &["HGETALL", "h"],
        b"*4\r\n$2\r\nf1\r\n$1\r\n1\r\n$2\r\nf2\r\n$1\r\n2\r\n",
    );
    p.expect(&["GET", "nope"], b"$-1\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$6\r\nconn-x\r\n");
    // Back to RESP3, then a stateful command: the dedicated connection speaks RESP3 too.
    let (a, w) = p.both(&["HELLO", "3"]);
    assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
    p.ok(&["MULTI"]);
    p.ok(&["HGETALL", "h"]);
    p.ok(&["ZSCORE", "z", "m"]);
    p.expect(
        &["EXEC"],
        b"*2\r\n%2\r\n$2\r\nf1\r\n$1\r\n1\r\n$2\r\nf2\r\n$1\r\n2\r\n,2.5\r\n",
    );
    p.expect(&["CLIENT", "GETNAME"], b"$6\r\nconn-x\r\n");
}

#[test]
fn select_moves_the_client_to_another_database() {
    let c = Compat::start();
    let (_, mut direct_b) = c.admins();
    let mut p = c.pair();
    p.expect(&["SELECT", "5"], b"+OK\r\n");
    p.expect(&["SET", "k", "in5"], b"+OK\r\n");
    p.expect(&["GET", "k"], b"$3\r\nin5\r\n");
    p.expect(&["DBSIZE"], b":1\r\n");
    // The write landed in B's database 5, not 0.
    assert_eq!(direct_b.cmd(&["GET", "k"]), b"$-1\r\n");
    assert_eq!(direct_b.cmd(&["SELECT", "5"]), b"+OK\r\n");
    assert_eq!(direct_b.cmd(&["GET", "k"]), b"$3\r\nin5\r\n");
    // Another client on the same pooled connections stays in database 0.
    let mut q = c.pair();
    q.expect(&["GET", "k"], b"$-1\r\n");
    q.expect(&["SET", "k", "in0"], b"+OK\r\n");
    p.expect(&["GET", "k"], b"$3\r\nin5\r\n");
    p.err(&["SELECT", "99"]);
    p.expect(&["SELECT", "16"], b"-ERR DB index is out of range\r\n");
    p.err(&["SELECT", "-1"]);
    p.expect(
        &["SELECT", "x"],
        b"-ERR value is not an integer or out of range\r\n",
    );
    p.err(&["SELECT", "+1"]);
    p.err(&["SELECT", " 1"]);
    p.err(&["SELECT", "1.0"]);
    p.err(&["SELECT"]);
    p.err(&["SELECT", "1", "2"]);
    // Failed SELECTs left the client in database 5.
    p.expect(&["GET", "k"], b"$3\r\nin5\r\n");
    p.ok(&["SWAPDB", "5", "6"]);
    p.expect(&["GET", "k"], b"$-1\r\n");
    p.expect(&["MOVE", "nope", "6"], b":0\r\n");
    p.ok(&["SELECT", "6"]);
    p.expect(&["GET", "k"], b"$3\r\nin5\r\n");
    p.expect(&["MOVE", "k", "7"], b":1\r\n");
    // A dedicated connection starts in the client's database.
    p.ok(&["SELECT", "7"]);
    p.ok(&["MULTI"]);
    p.ok(&["GET", "k"]);
    p.ok(&["SET", "tx", "in7"]);
    p.expect(&["EXEC"], b"*2\r\n$3\r\nin5\r\n+OK\r\n");
    assert_eq!(direct_b.cmd(&["SELECT", "7"]), b"+OK\r\n");
    assert_eq!(direct_b.cmd(&["GET", "tx"]), b"$3\r\nin7\r\n");
    p.ok(&["SELECT", "0"]);
    p.expect(&["GET", "k"], b"$3\r\nin0\r\n");
}

#[test]
fn inline_commands() {
    let c = Compat::start();
    let mut p = c.pair();
    p.send_both(b"SET foo bar\r\nGET foo\r\n");
    assert_eq!(p.read_same(), b"+OK\r\n");
    assert_eq!(p.read_same(), b"$3\r\nbar\r\n");
    p.send_both(b"PING\n");
    assert_eq!(p.read_same(), b"+PONG\r\n");
    // Blank lines are skipped; quotes and escapes follow Valkey's sdssplitargs.
    p.send_both(b"\r\n\n   \r\nSET \"a b\" \"x\\r\\n\\x41\\\"\"\r\n");
    assert_eq!(p.read_same(), b"+OK\r\n");
    p.expect(&["GET", "a b"], b"$5\r\nx\r\nA\"\r\n");
    p.send_both(b"set 'it\\'s' 'single'\r\nget \"it's\"\r\n");
    assert_eq!(p.read_same(), b"+OK\r\n");
    assert_eq!(p.read_same(), b"$6\r\nsingle\r\n");
    // Inline and RESP requests mixed in one write, and errors to inline commands.
    p.send_both(b"PING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nPING x\r\nNOSUCH a b\r\nGET\r\n");
    assert_eq!(p.read_same(), b"+PONG\r\n");
    assert_eq!(p.read_same(), b"$2\r\nhi\r\n");
    assert_eq!(p.read_same(), b"$1\r\nx\r\n");
    assert!(p.read_same().starts_with(b"-ERR unknown command"));
    assert!(p.read_same().starts_with(b"-ERR wrong number of arguments"));
    // One inline command in pieces.
    p.send_both(b"ECH");
    p.send_both(b"O pieces\r");
    p.send_both(b"\n");
    assert_eq!(p.read_same(), b"$6\r\npieces\r\n");
    // Inline commands on a dedicated connection.
    p.send_both(b"MULTI\r\nINCR n\r\nEXEC\r\n");
    assert_eq!(p.read_same(), b"+OK\r\n");
    assert_eq!(p.read_same(), b"+QUEUED\r\n");
    assert_eq!(p.read_same(), b"*1\r\n:1\r\n");
    p.send_both(b"GET n\n");
    assert_eq!(p.read_same(), b"$1\r\n1\r\n");
}

#[test]
fn protocol_errors_close_the_connection() {
    let c = Compat::start();
    for bad in [
        &b"*1\r\n$x\r\nPING\r\n"[..],
        b"*1\r\n$-1\r\n",
        b"*1\r\nfoo\r\n",
        b"*x\r\n",
        b"*3000000000\r\n",
        b"SET \"unbalanced\r\n",
        b"SET 'a\r\n",
    ] {
        let mut p = c.pair();
        // A good command first: its reply still arrives, in order.
        p.send_both(&[b"PING\r\n", bad].concat());
        assert_eq!(p.read_same(), b"+PONG\r\n");
        let e = p.read_same();
        assert!(
            e.starts_with(b"-ERR Protocol error: "),
            "{} after {}",
            show(&e),
            show(bad)
        );
        assert!(
            p.a.closed(),
            "valkey kept the connection open after {}",
            show(bad)
        );
        assert!(
            p.w.closed(),
            "walrus kept the connection open after {}",
            show(bad)
        );
    }
    // Not errors: empty arrays are skipped. Valkey 9.0.0 itself crashes on this input (an
    // assertion in networking.c, fixed later); walrus parses it alone and never forwards it.
    let v = server::under_test();
    let mut p = c.pair();
    if v.valkey && (v.v.0, v.v.1) == (9, 0) {
        p.w.send_raw(b"*0\r\n*-1\r\nPING\r\n");
        assert_eq!(p.w.read_frame(), b"+PONG\r\n");
        assert_eq!(Raw::connect(&c.w.addr).cmd(&["PING"]), b"+PONG\r\n");
        return;
    }
    p.send_both(b"*0\r\n*-1\r\nPING\r\n");
    assert_eq!(p.read_same(), b"+PONG\r\n");
}

#[test]
fn error_replies() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(
        &["NOSUCH", "a", "b"],
        b"-ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' \r\n",
    );
    p.err(&["nosuch"]);
    p.err(&[&"x".repeat(200)]);
    p.err(&[""]);
    p.err(&["GET"]);
    p.err(&["SET", "k"]);
    p.err(&["get", "a", "b"]);
    p.ok(&["gEt", "k"]);
    p.ok(&["SET", "str", "v"]);
    p.expect(
        &["LPUSH", "str", "x"],
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    );
    p.expect(&["SET", "k", "v", "NX", "XX"], b"-ERR syntax error\r\n");
    p.err(&["INCR", "str"]);
    p.err(&["CLIENT", "NOSUCH"]);
    p.err(&["CLIENT"]);
    p.err(&["CONFIG", "GET"]);
    p.err(&["OBJECT"]);
    p.err(&["CLIENT", "SETNAME"]);
    p.err(&["CLIENT", "GETNAME", "extra"]);
    p.err(&["CLIENT", "SETINFO", "lib-name"]);
    p.err(&["AUTH"]);
    p.err(&["AUTH", "a", "b", "c"]);
    p.err(&["AUTH", "nopassword"]);
    p.err(&["RESET", "extra"]);
    p.err(&["EXPIRE", "str", "x"]);
    p.err(&["ZADD", "z"]);
    p.err(&["CONFIG", "SET", "nosuch-param", "1"]);
    // None of these changed the client's state.
    p.expect(&["GET", "str"], b"$1\r\nv\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$-1\r\n");
}

#[test]
fn client_name_and_info() {
    let c = Compat::start();
    let mut p = c.pair();
    p.expect(&["CLIENT", "GETNAME"], b"$-1\r\n");
    p.expect(&["CLIENT", "SETNAME", "app-1"], b"+OK\r\n");
    p.expect(&["client", "getname"], b"$5\r\napp-1\r\n");
    p.err(&["CLIENT", "SETNAME", "has space"]);
    p.err(&["CLIENT", "SETNAME", "new\nline"]);
    p.err(&["CLIENT", "SETNAME", "caf\u{e9}"]);
    p.expect(&["CLIENT", "GETNAME"], b"$5\r\napp-1\r\n");
    p.expect(&["CLIENT", "SETNAME", ""], b"+OK\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$-1\r\n");
    if server::has(server::under_test().redis_7_2(), "CLIENT SETINFO") {
        p.expect(&["CLIENT", "SETINFO", "lib-name", "mylib"], b"+OK\r\n");
        p.expect(&["CLIENT", "SETINFO", "LIB-VER", "1.2.3"], b"+OK\r\n");
        p.err(&["CLIENT", "SETINFO", "lib-name", "bad name"]);
        p.err(&["CLIENT", "SETINFO", "LIB-NAME", "bad name"]);
        p.err(&["CLIENT", "SETINFO", "lib-ver", "bad\nver"]);
        p.err(&["CLIENT", "SETINFO", "color", "blue"]);
        p.err(&["CLIENT", "SETINFO", "lib-name", "a", "b"]);
    }
    p.ok(&["CLIENT", "SETNAME", "kept"]);
    // Connection ids and addresses differ between servers: shape only.
    let (a, w) = p.both(&["CLIENT", "ID"]);
    for r in [&a, &w] {
        assert!(r.starts_with(b":") && r.ends_with(b"\r\n"), "{}", show(r));
    }
    let (a, w) = p.both(&["CLIENT", "INFO"]);
    for r in [&a, &w] {
        assert!(
            r.starts_with(b"$") && show(r).contains("id="),
            "{}",
            show(r)
        );
    }
    // On its dedicated connection the client is known by its name.
    p.ok(&["WATCH", "x"]);
    p.expect(&["CLIENT", "GETNAME"], b"$4\r\nkept\r\n");
    let (a, w) = p.both(&["CLIENT", "INFO"]);
    for r in [&a, &w] {
        assert!(show(r).contains(" name=kept "), "{}", show(r));
    }
    p.ok(&["CLIENT", "SETNAME", "renamed"]);
    p.expect(&["CLIENT", "GETNAME"], b"$7\r\nrenamed\r\n");
}

#[test]
fn quit_replies_ok_then_closes() {
    let c = Compat::start();
    let mut p = c.pair();
    p.ok(&["SET", "k", "v"]);
    p.expect(&["QUIT"], b"+OK\r\n");
    assert!(p.a.closed() && p.w.closed());
    // Pipelined: replies before QUIT arrive, nothing after it runs.
    let mut p = c.pair();
    p.send_both(b"PING\r\nQUIT\r\nSET after quit\r\n");
    assert_eq!(p.read_same(), b"+PONG\r\n");
    assert_eq!(p.read_same(), b"+OK\r\n");
    assert!(p.a.closed() && p.w.closed());
    let mut p = c.pair();
    p.expect(&["GET", "after"], b"$-1\r\n");
    // With arguments, and on a dedicated connection (subscribed).
    p.expect(&["QUIT", "now"], b"+OK\r\n");
    assert!(p.a.closed() && p.w.closed());
    let mut p = c.pair();
    p.ok(&["SUBSCRIBE", "ch"]);
    p.expect(&["QUIT"], b"+OK\r\n");
    assert!(p.a.closed() && p.w.closed());
}

#[test]
fn reset_restores_a_fresh_connection() {
    let c = Compat::start();
    let mut p = c.pair();
    p.ok(&["SET", "k", "in0"]);
    p.ok(&["SELECT", "3"]);
    p.ok(&["SET", "k", "in3"]);
    p.ok(&["CLIENT", "SETNAME", "before-reset"]);
    let (a, w) = p.both(&["HELLO", "3"]);
    assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
    p.expect(&["GET", "nope"], b"_\r\n");
    p.expect(&["RESET"], b"+RESET\r\n");
    p.expect(&["GET", "nope"], b"$-1\r\n");
    p.expect(&["GET", "k"], b"$3\r\nin0\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$-1\r\n");
    // On a dedicated connection: in a transaction, subscribed.
    p.ok(&["SELECT", "3"]);
    p.ok(&["MULTI"]);
    p.ok(&["SET", "k", "never"]);
    p.expect(&["RESET"], b"+RESET\r\n");
    p.err(&["EXEC"]);
    p.expect(&["GET", "k"], b"$3\r\nin0\r\n");
    p.ok(&["SELECT", "3"]);
    p.expect(&["GET", "k"], b"$3\r\nin3\r\n");
}

/// In RESP3, (P|S)SUBSCRIBE and (P|S)UNSUBSCRIBE are answered by pushes only: a client
/// that then sends a command walrus answers itself, or RESET, must get its reply.
#[test]
fn resp3_subscriber_gets_every_reply() {
    let c = Compat::start();
    let mut p = c.pair();
    p.hello(&["HELLO", "3"]);
    p.ok(&["SUBSCRIBE", "ch"]);
    p.expect(&["CLIENT", "GETNAME"], b"_\r\n");
    p.expect(&["SELECT", "3"], b"+OK\r\n");
    p.ok(&["UNSUBSCRIBE", "ch"]);
    p.ok(&["SUBSCRIBE", "a", "b"]);
    p.read_same();
    p.expect(&["RESET"], b"+RESET\r\n");
    p.expect(&["PING"], b"+PONG\r\n");
}

#[test]
fn server_specific_replies_compare_by_shape() {
    let c = Compat::start();
    let mut p = c.pair();
    p.ok(&["SET", "only", "1"]);
    p.expect(&["RANDOMKEY"], b"$4\r\nonly\r\n");
    p.expect(&["ECHO", "e"], b"$1\r\ne\r\n");
    p.ok(&["COMMAND", "COUNT"]);
    p.ok(&["COMMAND", "INFO", "get", "blpop"]);
    p.ok(&["COMMAND", "GETKEYS", "SET", "a", "b"]);
    p.expect(&["DBSIZE"], b":1\r\n");
    let (a, w) = p.both(&["TIME"]);
    for r in [&a, &w] {
        let OwnedFrame::Array(parts) = decode(r) else {
            panic!("{}", show(r))
        };
        assert_eq!(parts.len(), 2);
    }
    let (a, w) = p.both(&["INFO"]);
    for r in [&a, &w] {
        assert!(show(r).contains("# Server") && show(r).contains("# Keyspace"));
    }
    let (a, w) = p.both(&["INFO", "keyspace"]);
    assert_eq!(show(&a), show(&w));
    let (a, w) = p.both(&["LASTSAVE"]);
    assert!(a.starts_with(b":") && w.starts_with(b":"));
    let (a, w) = p.both(&["OBJECT", "IDLETIME", "only"]);
    assert!(a.starts_with(b":") && w.starts_with(b":"));
    let (a, w) = p.both(&["CONFIG", "GET", "port"]);
    assert!(a.starts_with(b"*2\r\n$4\r\nport\r\n") && w.starts_with(b"*2\r\n$4\r\nport\r\n"));
    p.ok(&["FLUSHALL"]);
    p.expect(&["RANDOMKEY"], b"$-1\r\n");
}

/// Valkey lets a client that ran a blocking command subscribe. walrus relays RESP2 Pub/Sub
/// on a connection of its own, so a session that already holds a dedicated connection
/// (blocking, transaction or tracking state) gets an error and keeps its connection (docs/design.md,
/// "Stateful sessions").
#[test]
fn resp2_subscribe_after_a_blocking_command_is_refused() {
    let v = Valkey::start();
    let w = start_walrus(&v.addr(), "");
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["BLPOP", "empty", "0.01"]), b"*-1\r\n");
    let r = c.cmd(&["SUBSCRIBE", "ch"]);
    assert!(
        r.starts_with(
            b"-ERR walrus: this connection already has a transaction, blocking or tracking state"
        ),
        "{}",
        show(&r)
    );
    assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
}
