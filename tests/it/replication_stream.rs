//! walrus's replica link against a real Valkey: the handshake, the RDB in both transfer
//! forms, and stream framing whose offsets equal Valkey's replication offsets byte for byte.
use crate::common;
use common::*;

use bytes::Bytes;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use walrus::checkpoint::rdb_file;
use walrus::replication::stream::{StreamEntry, StreamFramer};
use walrus::resp::Limits;
use walrus::upstream::client::{frame_str, Conn};
use walrus::upstream::server::{rdb_format, ServerVersion};
use walrus::upstream::Upstream;
use walrus::valkey::handshake::{ack, handshake, Purpose, SyncStart};

fn upstream(addr: String) -> Upstream {
    Upstream {
        address: addr,
        credentials: None,
        connect_timeout: Duration::from_secs(5),
        reply_timeout: Duration::from_secs(5),
        limits: Limits::default(),
        process: None,
        tls: None,
    }
}

struct Link {
    conn: Conn,
    framer: StreamFramer,
    entries: Vec<StreamEntry>,
}

impl Link {
    async fn attach(up: &Upstream, dir: &std::path::Path) -> (Link, rdb_file::StoredRdb) {
        let mut conn = Conn::control(up).await.unwrap();
        let version = ServerVersion::query(&mut conn).await.unwrap();
        let format = rdb_format(&mut conn).await.unwrap();
        let SyncStart::Full { replid, offset } =
            handshake(&mut conn, &version, Purpose::Link, None)
                .await
                .unwrap()
        else {
            panic!("expected a full resync")
        };
        assert_eq!(replid.len(), 40);
        let stored = rdb_file::receive(&mut conn, &dir.join("first.rdb"), 1 << 30)
            .await
            .unwrap();
        // `REPLCONF version` makes Valkey 9 send its own format (80), not 7.2's (11).
        assert_eq!(
            stored.version, format,
            "the RDB of {version} comes in the server's own format"
        );
        ack(&mut conn, offset).await.unwrap();
        let framer = StreamFramer::new(offset, Limits::default(), 1 << 20, 1 << 30);
        (
            Link {
                conn,
                framer,
                entries: Vec::new(),
            },
            stored,
        )
    }

    /// Reads the stream until the framer has consumed exactly up to `offset`.
    async fn catch_up(&mut self, offset: u64) -> Vec<StreamEntry> {
        let mut got = Vec::new();
        while self.framer.offset() < offset {
            while let Some(e) = self.framer.next_entry(&mut self.conn.buf).unwrap() {
                got.push(e);
            }
            if self.framer.offset() >= offset {
                break;
            }
            // A replica acknowledges every second, as walrus's link does: Valkey starts the
            // stream after a diskless RDB only on an ACK that finds the transfer finished,
            // and one that arrives earlier is not repeated.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            let n = loop {
                match tokio::time::timeout(
                    Duration::from_secs(1),
                    self.conn.stream.read_buf(&mut self.conn.buf),
                )
                .await
                {
                    Ok(read) => break read.unwrap(),
                    Err(_) if tokio::time::Instant::now() < deadline => {
                        ack(&mut self.conn, self.framer.offset()).await.unwrap()
                    }
                    Err(_) => panic!(
                        "stream stalled at {} of {offset}; buffered {:?}",
                        self.framer.offset(),
                        show(&self.conn.buf)
                    ),
                }
            };
            assert!(n > 0, "primary closed the link");
        }
        assert_eq!(
            self.framer.offset(),
            offset,
            "framed offset must equal Valkey's offset exactly"
        );
        self.entries.extend(got.clone());
        got
    }
}

async fn master_offset(c: &mut Conn) -> u64 {
    let info = frame_str(&c.call(["INFO", "replication"]).await.unwrap()).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn joined(entries: &[StreamEntry]) -> Vec<u8> {
    entries.iter().flat_map(|e| e.payload.to_vec()).collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn run_scenarios(v: &Valkey, diskless: bool) {
    let up = upstream(v.addr());
    let dir = tempfile::tempdir().unwrap();
    let mut c = Conn::control(&up).await.unwrap();
    c.call(["SET", "before", "sync"]).await.unwrap();
    let (mut link, stored) = Link::attach(&up, dir.path()).await;
    let head = std::fs::read(&stored.path).unwrap();
    assert!(
        head.starts_with(b"REDIS") || head.starts_with(b"VALKEY"),
        "RDB magic: {:?}",
        &head[..8.min(head.len())]
    );
    assert_eq!(head.len() as u64, stored.bytes);
    assert_eq!(stored.eof_mark, diskless, "RDB transfer form");

    // SELECT travels in the stream before a write to another database.
    c.call(["SELECT", "3"]).await.unwrap();
    c.call(["SET", "k3", "v3"]).await.unwrap();
    let off = master_offset(&mut c).await;
    let e = joined(&link.catch_up(off).await);
    assert!(
        contains(&e, b"SELECT") && contains(&e, b"k3"),
        "{}",
        show(&e)
    );

    // A transaction is one entry, MULTI through EXEC.
    c.call(["MULTI"]).await.unwrap();
    c.call_raw(&walrus::resp::write::command(["SET", "a", "1"]))
        .await
        .unwrap();
    c.call_raw(&walrus::resp::write::command(["INCR", "n"]))
        .await
        .unwrap();
    c.call(["EXEC"]).await.unwrap();
    let off = master_offset(&mut c).await;
    let got = link.catch_up(off).await;
    let tx: Vec<_> = got
        .iter()
        .filter(|e| contains(&e.payload, b"MULTI"))
        .collect();
    assert_eq!(tx.len(), 1);
    assert!(contains(&tx[0].payload, b"EXEC") && contains(&tx[0].payload, b"INCR"));

    // Scripts replicate their effects; EXPIRE becomes PEXPIREAT.
    c.call([
        "EVAL",
        "redis.call('SET', KEYS[1], ARGV[1]); redis.call('SPOP', KEYS[2]); return 1",
        "2",
        "s1",
        "set1",
        "x",
    ])
    .await
    .unwrap();
    c.call(["SADD", "set1", "m1", "m2", "m3"]).await.unwrap();
    c.call(["SPOP", "set1"]).await.unwrap();
    c.call(["EXPIRE", "a", "1000"]).await.unwrap();
    let off = master_offset(&mut c).await;
    let e = joined(&link.catch_up(off).await);
    assert!(contains(&e, b"PEXPIREAT"), "{}", show(&e));
    assert!(
        contains(&e, b"SREM"),
        "SPOP must replicate as SREM: {}",
        show(&e)
    );
    assert!(
        !contains(&e, b"EVAL"),
        "scripts replicate effects, not the script"
    );

    // Functions, binary keys.
    c.call(["FUNCTION", "LOAD", "#!lua name=lib\nredis.register_function('f', function(keys, args) return redis.call('SET', keys[1], args[1]) end)"])
        .await
        .unwrap();
    let bin_key: &[u8] = b"bin\r\n\x00key";
    c.call([b"FCALL".as_slice(), b"f", b"1", bin_key, b"\x00\xff"])
        .await
        .unwrap();
    let off = master_offset(&mut c).await;
    let e = joined(&link.catch_up(off).await);
    assert!(contains(&e, bin_key), "{}", show(&e));

    // An expired key is deleted through the stream.
    c.call(["SET", "short", "lived", "PX", "1"]).await.unwrap();
    loop {
        // Accessing the key after its deadline makes the primary expire it and propagate that.
        if matches!(
            c.call(["GET", "short"]).await.unwrap(),
            redis_protocol::resp2::types::OwnedFrame::Null
        ) {
            break;
        }
        tokio::task::yield_now().await;
    }
    let off = master_offset(&mut c).await;
    let e = joined(&link.catch_up(off).await);
    assert!(
        contains(&e, b"DEL") || contains(&e, b"UNLINK"),
        "{}",
        show(&e)
    );

    // A 64 MiB value arrives whole, in one entry, at the right offset.
    let big = Bytes::from(vec![b'z'; 64 << 20]);
    c.call([b"SET".as_slice(), b"big", &big]).await.unwrap();
    let off = master_offset(&mut c).await;
    let got = link.catch_up(off).await;
    assert!(got.iter().any(|e| e.payload.len() > 64 << 20));
}

#[tokio::test]
async fn stream_framing_matches_replication_offsets_with_length_prefixed_rdb() {
    // A replica that does not announce `capa eof` gets the RDB as `$<len>`.
    let v = Valkey::start_with(&["--repl-diskless-sync", "no"]);
    run_scenarios(&v, false).await;
}

#[tokio::test]
async fn stream_framing_matches_replication_offsets_with_eof_marked_rdb() {
    let v = Valkey::start_with(&[
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ]);
    run_scenarios(&v, true).await;
}
