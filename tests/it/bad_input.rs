//! Hostile and broken input: walrus answers as Valkey would (same reply bytes, connection
//! closed or kept alike), stays up, and other clients never notice. walrus differs from
//! Valkey only where one of its own, configured limits applies.

use crate::common;
use common::*;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// What a server did with some bytes: what it answered, and whether it then hung up.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    reply: String,
    closed: bool,
}

const PROBE: &[u8] = b"PING\r\n";
const PONG: &[u8] = b"+PONG\r\n";

/// Sends `bytes`, then, when the connection should stay usable, a PING. Reads until the
/// server closes the connection, or until PONG arrives: both are events, so no timing is
/// involved (the read timeout only bounds a failure).
fn exchange(addr: &str, bytes: &[u8], probe: bool, half_close: bool) -> Outcome {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may close before reading everything: a failed write is not an error here.
    let _ = s.write_all(bytes);
    if probe {
        let _ = s.write_all(PROBE);
    }
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    let closed = loop {
        if probe && got.ends_with(PONG) {
            break false;
        }
        match s.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => panic!(
                "{addr}: no close and no reply after {}: {e}; got {}",
                show(&bytes[..bytes.len().min(80)]),
                show(&got)
            ),
        }
    };
    Outcome {
        reply: show(&got),
        closed,
    }
}

/// walrus with a single pooled upstream connection, so any bad input that reached Valkey
/// and broke that connection would show as a new upstream client id.
fn single_connection_walrus(v: &Valkey) -> (Walrus, tempfile::NamedTempFile) {
    let mut cfg = tempfile::NamedTempFile::new().unwrap();
    writeln!(cfg, "[upstream]\npool_size = 1").unwrap();
    let path = cfg.path().to_str().unwrap().to_string();
    (
        Walrus::build()
            .upstream(&v.addr())
            .args(&["--config", &path])
            .start(),
        cfg,
    )
}

#[test]
fn malformed_requests_get_valkeys_reply_and_break_nothing() {
    let v = Valkey::start();
    let (w, _cfg) = single_connection_walrus(&v);
    let mut bystander = Raw::connect(&w.addr);
    let upstream_id = bystander.cmd(&["CLIENT", "ID"]);

    let too_big_inline = vec![b'x'; 70_000];
    let mut too_big_count = b"*".to_vec();
    too_big_count.extend(std::iter::repeat_n(b'1', 70_000));
    let mut too_big_bulk_count = b"*1\r\n$".to_vec();
    too_big_bulk_count.extend(std::iter::repeat_n(b'1', 70_000));
    // strchr stops at NUL: Valkey never finds this line's end, until it is too big.
    let mut nul_inline = b"GET a\x00b\r\n".to_vec();
    nul_inline.extend(std::iter::repeat_n(b'y', 70_000));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage count", b"*x\r\n".to_vec()),
        ("empty count", b"*\r\n".to_vec()),
        ("simple string in a request", b"*1\r\n+foo\r\n".to_vec()),
        ("negative bulk length", b"*1\r\n$-5\r\n".to_vec()),
        ("minus zero bulk length", b"*1\r\n$-0\r\n".to_vec()),
        ("huge bulk length", b"*1\r\n$99999999999\r\n".to_vec()),
        ("bulk just over 512 MiB", b"*1\r\n$536870913\r\n".to_vec()),
        ("huge multibulk count", b"*99999999999\r\n".to_vec()),
        ("multibulk count over INT_MAX", b"*2147483648\r\n".to_vec()),
        ("leading zero in count", b"*01\r\n$4\r\nPING\r\n".to_vec()),
        (
            "leading zero in bulk length",
            b"*1\r\n$04\r\nPING\r\n".to_vec(),
        ),
        (
            "plus sign in bulk length",
            b"*1\r\n$+4\r\nPING\r\n".to_vec(),
        ),
        ("nested array", b"*1\r\n*1\r\n$4\r\nPING\r\n".to_vec()),
        // The byte Valkey names in its error: CR and LF become spaces, others are sent as
        // they are (found by fuzzing: a CR broke walrus's reply line).
        ("CR for a bulk length", b"*1\r\n\r\n".to_vec()),
        ("LF for a bulk length", b"*1\r\n\n\r\n".to_vec()),
        ("byte 0xff for a bulk length", b"*1\r\n\xff\r\n".to_vec()),
        ("LF-only count line", b"*1\n$4\r\nPING\r\n".to_vec()),
        ("bulk not followed by CRLF", b"*1\r\n$4\r\nPINGxx".to_vec()),
        (
            "good command, then a bad one",
            b"*1\r\n$4\r\nPING\r\n*1\r\n$-5\r\n".to_vec(),
        ),
        ("unbalanced double quote", b"SET \"a\r\n".to_vec()),
        ("unbalanced single quote", b"SET 'a\r\n".to_vec()),
        ("too big inline request", too_big_inline),
        ("too big multibulk count string", too_big_count),
        ("too big bulk count string", too_big_bulk_count),
        ("NUL in an inline request", nul_inline),
        // An HTTP request (a misdirected health check, a browser): Valkey takes `POST` and
        // `Host:` for a cross-protocol attack and closes the connection. Forwarded on the
        // shared pool, they closed walrus's pooled connection instead.
        (
            "HTTP POST",
            b"POST /x HTTP/1.1\r\nHost: walrus\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ),
        (
            "HTTP GET",
            b"GET / HTTP/1.1\r\nHost: walrus\r\nUser-Agent: probe\r\n\r\n".to_vec(),
        ),
        (
            "Host: as a command",
            b"*2\r\n$5\r\nhost:\r\n$1\r\nx\r\n".to_vec(),
        ),
    ];
    for (name, bytes) in &cases {
        let direct = exchange(&v.addr(), bytes, false, false);
        let proxied = exchange(&w.addr, bytes, false, false);
        assert_eq!(proxied, direct, "case {name:?}");
        assert!(direct.closed, "case {name:?}: Valkey kept it open");
        assert_eq!(bystander.cmd(&["PING"]), PONG, "after case {name:?}");
    }

    // Input Valkey tolerates: the connection stays usable afterwards.
    let tolerated: Vec<(&str, Vec<u8>)> = vec![
        (
            "empty and negative counts",
            b"*0\r\n*-1\r\n*-5\r\n".to_vec(),
        ),
        ("blank lines", b"\r\n\n  \r\n".to_vec()),
        ("LF-only inline", b"ECHO lf\n".to_vec()),
        (
            "quotes and escapes",
            b"ECHO \"a\\x41\\n\\\"\" \r\n".to_vec(),
        ),
        ("quoted parts concatenate", b"ECHO \"a\"'b'c\r\n".to_vec()),
        ("unknown inline command", b"$5\r\nabcde\r\n".to_vec()),
        ("wrong arity", b"*1\r\n$3\r\nGET\r\n".to_vec()),
    ];
    for (name, bytes) in &tolerated {
        let direct = exchange(&v.addr(), bytes, true, false);
        let proxied = exchange(&w.addr, bytes, true, false);
        assert_eq!(proxied, direct, "case {name:?}");
        assert!(!direct.closed, "case {name:?}: Valkey closed it");
    }

    // An unterminated frame, then the client goes away: no reply, nothing runs.
    let partial = b"*3\r\n$3\r\nSET\r\n$7\r\npartial\r\n$5\r\nab".to_vec();
    let direct = exchange(&v.addr(), &partial, false, true);
    let proxied = exchange(&w.addr, &partial, false, true);
    assert_eq!(proxied, direct);
    assert_eq!(
        proxied,
        Outcome {
            reply: String::new(),
            closed: true
        }
    );
    assert_eq!(bystander.cmd(&["EXISTS", "partial"]), b":0\r\n");

    // None of it reached Valkey on the shared connection: it is the very same one.
    assert_eq!(bystander.cmd(&["CLIENT", "ID"]), upstream_id);
    assert!(
        !w.proc.log_text().contains("upstream connection lost"),
        "{}",
        w.proc.log_text()
    );
}

#[test]
fn a_stalled_half_command_does_not_block_other_clients() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut staller = Raw::connect(&w.addr);
    let value = vec![b'v'; 100_000];
    let full = walrus::resp::write::command([b"SET".as_slice(), b"stalled", &value]);
    let (head, tail) = full.split_at(full.len() / 2);
    staller.send_raw(head);
    // Others are served while the staller's command is incomplete.
    let mut other = Raw::connect(&w.addr);
    for i in 0..200 {
        let k = format!("other:{i}");
        assert_eq!(other.cmd(&["SET", &k, "x"]), b"+OK\r\n");
        assert_eq!(other.cmd(&["GET", &k]), b"$1\r\nx\r\n");
    }
    assert_eq!(other.cmd(&["EXISTS", "stalled"]), b":0\r\n");
    staller.send_raw(tail);
    assert_eq!(staller.read_frame(), b"+OK\r\n");
    let got = staller.cmd(&["STRLEN", "stalled"]);
    assert_eq!(got, b":100000\r\n");
}

#[test]
fn a_client_that_disconnects_mid_pipeline_harms_no_one() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut setup = Raw::connect(&w.addr);
    let big = vec![b'b'; 10_000];
    assert_eq!(setup.cmd(&[b"SET".as_slice(), b"big", &big]), b"+OK\r\n");
    let mut pipeline = Vec::new();
    for i in 0..10_000 {
        if i % 2 == 0 {
            pipeline.extend_from_slice(&walrus::resp::write::command(["GET", "big"]));
        } else {
            pipeline.extend_from_slice(&walrus::resp::write::command(["INCR", "quitter"]));
        }
    }
    let addr = w.addr.clone();
    let quitter = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&pipeline).unwrap();
        // Gone without reading a single reply.
        drop(s);
    });
    let mut other = Raw::connect(&w.addr);
    for i in 0..500 {
        assert_eq!(other.cmd(&["INCR", "other"]), int(i + 1));
    }
    quitter.join().unwrap();
    for i in 500..1000 {
        assert_eq!(other.cmd(&["INCR", "other"]), int(i + 1));
    }
    let mut fresh = Raw::connect(&w.addr);
    let mut want = b"$10000\r\n".to_vec();
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\n");
    assert_eq!(fresh.cmd(&["GET", "big"]), want);
    assert_eq!(fresh.cmd(&["PING"]), PONG);
    let mut w = w;
    assert!(w.proc.child.try_wait().unwrap().is_none(), "walrus exited");
}

fn int(n: i64) -> Vec<u8> {
    format!(":{n}\r\n").into_bytes()
}

fn config(text: &str) -> (tempfile::NamedTempFile, String) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    let path = f.path().to_str().unwrap().to_string();
    (f, path)
}

#[test]
fn configured_request_limits_give_valkeys_errors() {
    let v = Valkey::start();
    let (_f, path) = config(
        "[proxy]\nmax_bulk_bytes = 1024\nmax_inline_bytes = 1024\nmax_query_buffer_bytes = 8192\n",
    );
    let w = Walrus::build()
        .upstream(&v.addr())
        .args(&["--config", &path])
        .start();
    let mut bystander = Raw::connect(&w.addr);

    // At the limit: fine.
    let at = vec![b'a'; 1024];
    let mut c = Raw::connect(&w.addr);
    let mut want = b"$1024\r\n".to_vec();
    want.extend_from_slice(&at);
    want.extend_from_slice(b"\r\n");
    assert_eq!(c.cmd(&[b"ECHO".as_slice(), &at]), want);
    // One byte over: Valkey's error for a bulk over proto-max-bulk-len, then close.
    let over = b"*2\r\n$4\r\nECHO\r\n$1025\r\n";
    assert_eq!(
        exchange(&w.addr, over, false, false),
        Outcome {
            reply: show(b"-ERR Protocol error: invalid bulk length\r\n"),
            closed: true
        }
    );
    // Inline: a line over the limit.
    let long_line = format!("ECHO {}\r\n", "i".repeat(1100));
    assert_eq!(
        exchange(&w.addr, long_line.as_bytes(), false, false),
        Outcome {
            reply: show(b"-ERR Protocol error: too big inline request\r\n"),
            closed: true
        }
    );
    let no_newline = vec![b'j'; 1100];
    assert_eq!(
        exchange(&w.addr, &no_newline, false, false),
        Outcome {
            reply: show(b"-ERR Protocol error: too big inline request\r\n"),
            closed: true
        }
    );
    // A request that never completes but keeps growing past the query buffer limit: closed,
    // as Valkey closes a client over client-query-buffer-limit, without a reply.
    let mut growing = b"*100\r\n$4\r\nECHO\r\n".to_vec();
    for _ in 0..20 {
        growing.extend_from_slice(b"$1000\r\n");
        growing.extend(std::iter::repeat_n(b'q', 1000));
        growing.extend_from_slice(b"\r\n");
    }
    assert_eq!(
        exchange(&w.addr, &growing, false, false),
        Outcome {
            reply: String::new(),
            closed: true
        }
    );
    assert_eq!(bystander.cmd(&["PING"]), PONG);
}

#[test]
fn max_clients_gives_valkeys_error() {
    let v = Valkey::start();
    let (_f, path) = config("[proxy]\nmax_clients = 3\n");
    let w = Walrus::build()
        .upstream(&v.addr())
        .args(&["--config", &path])
        .start();
    let mut clients: Vec<Raw> = (0..3).map(|_| Raw::connect(&w.addr)).collect();
    for c in &mut clients {
        assert_eq!(c.cmd(&["PING"]), PONG);
    }
    assert_eq!(
        exchange(&w.addr, b"PING\r\n", false, false),
        Outcome {
            reply: show(b"-ERR max number of clients reached\r\n"),
            closed: true
        }
    );
    // The ones already in are unaffected.
    for c in &mut clients {
        assert_eq!(c.cmd(&["PING"]), PONG);
    }
    // One leaves (QUIT: its session has ended once the connection closes); a newcomer gets
    // in. The permit is released right after the close, so a bounded retry covers the gap.
    let mut leaving = clients.pop().unwrap();
    assert_eq!(leaving.cmd(&["QUIT"]), b"+OK\r\n");
    assert!(leaving.closed());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = exchange(&w.addr, b"PING\r\nQUIT\r\n", false, false);
        if o.reply == show(b"+PONG\r\n+OK\r\n") {
            break;
        }
        assert_eq!(o.reply, show(b"-ERR max number of clients reached\r\n"));
        assert!(Instant::now() < deadline, "no slot freed up");
        std::thread::yield_now();
    }
}

#[test]
fn reply_nested_deeper_than_the_limit_is_an_error_not_a_hang() {
    let v = Valkey::start();
    let (_f, path) = config("[proxy]\nmax_reply_depth = 8\n");
    let w = Walrus::build()
        .upstream(&v.addr())
        .args(&["--config", &path])
        .start();
    let mut bystander = Raw::connect(&w.addr);
    assert_eq!(bystander.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    let mut c = Raw::connect(&w.addr);
    let started = Instant::now();
    // Ten levels of arrays; walrus accepts eight.
    let reply = c.cmd(&["EVAL", "return {{{{{{{{{{1}}}}}}}}}}", "0"]);
    assert!(
        reply.starts_with(b"-ERR walrus:"),
        "expected a walrus error, got {}",
        show(&reply)
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // Within the limit is fine, on the same connection: the pool reconnects the slot and
    // requests wait for it rather than fail.
    assert_eq!(
        show(&c.cmd(&["EVAL", "return {{{{{{1}}}}}}", "0"])),
        show(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n")
    );
    // Other clients keep being served.
    assert_eq!(show(&bystander.cmd(&["GET", "k"])), show(b"$1\r\nv\r\n"));
    let mut fresh = Raw::connect(&w.addr);
    assert_eq!(fresh.cmd(&["GET", "k"]), b"$1\r\nv\r\n");
}

#[test]
fn a_resp3_subscriber_that_does_not_read_is_disconnected_not_buffered_forever() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[proxy]\nmax_push_bytes = 1048576\n")
        .start();
    let mut sub = Raw::connect(&w.addr);
    let hello = sub.cmd(&["HELLO", "3"]);
    assert!(hello.starts_with(b"%"), "{}", show(&hello));
    sub.send_raw(&walrus::resp::write::command(["SUBSCRIBE", "ch"]));
    let confirmed = sub.read_frame();
    assert!(confirmed.starts_with(b">3"), "{}", show(&confirmed));
    // The subscriber stops reading; 64 MiB of messages arrive for it.
    let mut publisher = Raw::connect(&v.addr());
    let message = "m".repeat(1 << 20);
    for _ in 0..64 {
        publisher.cmd(&["PUBLISH", "ch", &message]);
    }
    w.proc.wait_line(
        "closing a client that does not read its RESP3 pushes",
        START_TIMEOUT,
    );
    assert!(sub.closed(), "the subscriber is disconnected");
    let mut other = Raw::connect(&w.addr);
    assert_eq!(other.cmd(&["PING"]), b"+PONG\r\n");
}
