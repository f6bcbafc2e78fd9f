//! A real client library through walrus: the `redis` crate, sync and async, with pipelines,
//! transactions, Pub/Sub and scripts. The library sends what applications send (CLIENT
//! SETINFO on connect, SELECT from the URL, HELLO 3 for RESP3, WATCH/MULTI/EXEC, EVALSHA
//! then SCRIPT LOAD), and must not be able to tell walrus from Valkey.

use crate::common;
use common::*;
use redis::{AsyncCommands, Commands, RedisResult, Value};
use std::collections::HashMap;
use std::time::Duration;

fn start_walrus(upstream: &str) -> Walrus {
    Walrus::build().upstream(upstream).start()
}

struct Setup {
    valkey: Valkey,
    walrus: Walrus,
}

impl Setup {
    fn start() -> Setup {
        let valkey = Valkey::start();
        let walrus = start_walrus(&valkey.addr());
        Setup { valkey, walrus }
    }

    fn client(&self, path: &str) -> redis::Client {
        redis::Client::open(format!("redis://{}/{path}", self.walrus.addr)).unwrap()
    }

    fn sync(&self) -> redis::Connection {
        let con = self.client("").get_connection().unwrap();
        con.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        con
    }
}

#[test]
fn sync_connection_runs_basic_commands() {
    let s = Setup::start();
    let mut con = s.sync();
    let () = con.set("greeting", "hello").unwrap();
    let v: String = con.get("greeting").unwrap();
    assert_eq!(v, "hello");
    let missing: Option<String> = con.get("nope").unwrap();
    assert_eq!(missing, None);
    assert_eq!(con.incr::<_, _, i64>("n", 5).unwrap(), 5);
    assert_eq!(con.incr::<_, _, i64>("n", -7).unwrap(), -2);
    let binary: Vec<u8> = b"\0\r\n\xff".to_vec();
    let () = con.set(b"bin\r\nkey".as_slice(), &binary).unwrap();
    assert_eq!(
        con.get::<_, Vec<u8>>(b"bin\r\nkey".as_slice()).unwrap(),
        binary
    );
    let () = con.mset(&[("a", "1"), ("b", "2")]).unwrap();
    let got: Vec<Option<String>> = con.mget(&["a", "zz", "b"]).unwrap();
    assert_eq!(got, vec![Some("1".into()), None, Some("2".into())]);
    let _: i64 = con
        .hset_multiple("h", &[("f1", "v1"), ("f2", "v2")])
        .map(|()| 0)
        .unwrap();
    let h: HashMap<String, String> = con.hgetall("h").unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h["f2"], "v2");
    let _: i64 = con.rpush("l", &["x", "y", "z"]).unwrap();
    let l: Vec<String> = con.lrange("l", 0, -1).unwrap();
    assert_eq!(l, ["x", "y", "z"]);
    assert!(con.exists::<_, bool>("l").unwrap());
    assert_eq!(con.del::<_, i64>(&["a", "b", "zz"]).unwrap(), 2);
    // Valkey's errors come through as errors of the right kind.
    let err = con.incr::<_, _, i64>("greeting", 1).unwrap_err();
    assert!(err.to_string().contains("not an integer"), "{err}");
    let err = con.lpush::<_, _, i64>("greeting", "x").unwrap_err();
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
    // The library's CLIENT SETINFO on connect was accepted; the name is the client's own.
    let () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("lib-test")
        .query(&mut con)
        .unwrap();
    let name: String = redis::cmd("CLIENT").arg("GETNAME").query(&mut con).unwrap();
    assert_eq!(name, "lib-test");
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn database_from_the_url_is_selected() {
    let s = Setup::start();
    let mut con = s.client("4").get_connection().unwrap();
    let () = con.set("k", "in4").unwrap();
    let mut direct = Raw::connect(&s.valkey.addr());
    assert_eq!(direct.cmd(&["GET", "k"]), b"$-1\r\n");
    assert_eq!(direct.cmd(&["SELECT", "4"]), b"+OK\r\n");
    assert_eq!(direct.cmd(&["GET", "k"]), b"$3\r\nin4\r\n");
}

#[test]
fn sync_pipeline_and_transactions() {
    let s = Setup::start();
    let mut con = s.sync();
    let (a, b, len): (String, i64, i64) = redis::pipe()
        .set("a", "x")
        .ignore()
        .get("a")
        .incr("counter", 10)
        .rpush("list", &[1, 2, 3])
        .query(&mut con)
        .unwrap();
    assert_eq!((a.as_str(), b, len), ("x", 10, 3));
    // A long pipeline: every reply in order.
    let mut p = redis::pipe();
    for i in 0..500 {
        p.set(format!("k{i}"), i).ignore().get(format!("k{i}"));
    }
    let values: Vec<i64> = p.query(&mut con).unwrap();
    assert_eq!(values, (0..500).collect::<Vec<i64>>());
    // MULTI/EXEC.
    let (n, items): (i64, Vec<String>) = redis::pipe()
        .atomic()
        .incr("counter", 1)
        .lpush("list", "zero")
        .ignore()
        .lrange("list", 0, 1)
        .query(&mut con)
        .unwrap();
    assert_eq!(n, 11);
    assert_eq!(items, ["zero", "1"]);
    // WATCH/MULTI/EXEC with retry, as the library does it.
    let mut other = s.sync();
    let mut attempts = 0;
    let doubled: (i64,) = redis::transaction(&mut con, &["counter"], |con, pipe| {
        attempts += 1;
        let v: i64 = con.get("counter")?;
        if attempts == 1 {
            // A concurrent change: the first EXEC must fail and be retried.
            let () = other.set("counter", 100)?;
        }
        pipe.set("counter", v * 2)
            .ignore()
            .get("counter")
            .query(con)
    })
    .unwrap();
    assert_eq!(attempts, 2);
    assert_eq!(doubled, (200,));
    // An error inside the transaction.
    let r: RedisResult<(i64, i64)> = redis::pipe()
        .atomic()
        .incr("counter", 1)
        .incr("a", 1)
        .query(&mut con);
    assert!(r.is_err());
    assert_eq!(other.get::<_, i64>("counter").unwrap(), 201);
}

#[test]
fn sync_pubsub() {
    let s = Setup::start();
    let mut sub_con = s.sync();
    let mut publisher = s.sync();
    let mut pubsub = sub_con.as_pubsub();
    pubsub.subscribe("news").unwrap();
    pubsub.psubscribe("sport.*").unwrap();
    // Publish until the subscription is in place (the first PUBLISH reaching a subscriber
    // says so); earlier ones reached nobody, so the subscriber sees exactly one message.
    let publish_until_received = |con: &mut redis::Connection, ch: &str, msg: &str| {
        for _ in 0..10_000 {
            if con.publish::<_, _, i64>(ch, msg).unwrap() == 1 {
                return;
            }
        }
        panic!("no subscriber for {ch}");
    };
    publish_until_received(&mut publisher, "news", "first\r\nline\0");
    let m = pubsub.get_message().unwrap();
    assert_eq!(m.get_channel_name(), "news");
    assert_eq!(m.get_payload::<Vec<u8>>().unwrap(), b"first\r\nline\0");
    publish_until_received(&mut publisher, "sport.tennis", "ace");
    let m = pubsub.get_message().unwrap();
    assert_eq!(m.get_channel_name(), "sport.tennis");
    assert_eq!(m.get_pattern::<String>().unwrap(), "sport.*");
    assert_eq!(m.get_payload::<String>().unwrap(), "ace");
    pubsub.unsubscribe("news").unwrap();
    pubsub.punsubscribe("sport.*").unwrap();
    drop(pubsub);
    assert_eq!(publisher.publish::<_, _, i64>("news", "gone").unwrap(), 0);
}

#[test]
fn scripts() {
    let s = Setup::start();
    let mut con = s.sync();
    let script =
        redis::Script::new("local v = redis.call('INCRBY', KEYS[1], ARGV[1]) return {v, ARGV[2]}");
    // The first invocation gets NOSCRIPT from EVALSHA and loads the script.
    let (v, tag): (i64, String) = script.key("n").arg(5).arg("t1").invoke(&mut con).unwrap();
    assert_eq!((v, tag.as_str()), (5, "t1"));
    let (v, _): (i64, String) = script.key("n").arg(2).arg("t2").invoke(&mut con).unwrap();
    assert_eq!(v, 7);
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(script.get_hash())
        .query(&mut con)
        .unwrap();
    assert_eq!(exists, [true]);
    let failing = redis::Script::new("return redis.error_reply('MYERR custom failure')");
    let err = failing.invoke::<()>(&mut con).unwrap_err();
    assert_eq!(err.code(), Some("MYERR"), "{err}");
}

#[test]
fn resp3_connection() {
    let s = Setup::start();
    let client = redis::Client::open(format!("redis://{}/?protocol=resp3", s.walrus.addr)).unwrap();
    let mut con = client.get_connection().unwrap();
    let () = con.hset("h", "f", "v").unwrap();
    let raw: Value = redis::cmd("HGETALL").arg("h").query(&mut con).unwrap();
    assert!(matches!(raw, Value::Map(_)), "{raw:?}");
    let _: i64 = con.zadd("z", "m", 1.5).unwrap();
    let score: Value = redis::cmd("ZSCORE")
        .arg("z")
        .arg("m")
        .query(&mut con)
        .unwrap();
    assert_eq!(score, Value::Double(1.5));
    let nil: Value = redis::cmd("GET").arg("nope").query(&mut con).unwrap();
    assert_eq!(nil, Value::Nil);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_multiplexed_connection() {
    let s = Setup::start();
    let client = s.client("");
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let () = con.set("k", "v").await.unwrap();
    assert_eq!(con.get::<_, String>("k").await.unwrap(), "v");
    // Many tasks share the one multiplexed connection; every reply reaches its caller.
    let mut tasks = Vec::new();
    for t in 0..20 {
        let mut con = con.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let key = format!("t{t}:{i}");
                let () = con.set(&key, i).await.unwrap();
                let back: i64 = con.get(&key).await.unwrap();
                assert_eq!(back, i);
                let _: i64 = con.incr("shared", 1).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(con.get::<_, i64>("shared").await.unwrap(), 500);
    let (n, v): (i64, String) = redis::pipe()
        .atomic()
        .incr("shared", 1)
        .get("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((n, v.as_str()), (501, "v"));
    let script = redis::Script::new("return redis.call('GET', KEYS[1]) .. ARGV[1]");
    let out: String = script
        .key("k")
        .arg("!")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(out, "v!");
    let err = con.lpush::<_, _, i64>("k", "x").await.unwrap_err();
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
    // A blocking pop woken by another connection.
    let mut blocked = client.get_multiplexed_async_connection().await.unwrap();
    let waiter = tokio::spawn(async move {
        let r: (String, String) = blocked.blpop("queue", 0.0).await.unwrap();
        r
    });
    let mut admin = Raw::connect(&s.valkey.addr());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = admin.cmd(&["CLIENT", "LIST"]);
        if String::from_utf8_lossy(&list).contains("cmd=blpop") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "BLPOP never blocked");
        tokio::task::yield_now().await;
    }
    let _: i64 = con.rpush("queue", "job").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, ("queue".to_string(), "job".to_string()));
}
