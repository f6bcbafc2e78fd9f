//! walrus never hangs on a frozen Valkey: every exchange with Valkey has a bound
//! (`upstream.connect_timeout_ms` to open a connection, `upstream.reply_timeout_ms` for each
//! reply), and a restore starts over when the Valkey it loads is gone.
mod common;
use common::*;

use std::time::{Duration, Instant};

const CONNECT_TIMEOUT_MS: u64 = 1000;
const REPLY_TIMEOUT_MS: u64 = 2000;
/// The longest a request may wait for its error while Valkey is stopped: a pooled
/// connection is given up after two reply-timeout periods without a byte from Valkey, and
/// every other exchange within one bound. A liveness bound, not a performance one.
const LIVENESS: Duration = Duration::from_millis(3 * REPLY_TIMEOUT_MS);

/// A client of `w` that waits at most `LIVENESS` and a margin for any reply.
fn client(w: &Walrus) -> Raw {
    let c = Raw::connect(&w.addr);
    c.stream
        .set_read_timeout(Some(LIVENESS + Duration::from_secs(5)))
        .unwrap();
    c
}

/// Sends `args` and returns the reply, which must be an error that came within
/// [`LIVENESS`].
fn error_in_time(c: &mut Raw, args: &[&str], w: &Walrus) -> String {
    let sent = Instant::now();
    let r = c.try_cmd(args).map(|r| show(&r)).unwrap_or_else(|| {
        panic!(
            "{args:?}: no reply while Valkey is stopped; walrus's log:\n{}",
            w.proc.log_text()
        )
    });
    let took = sent.elapsed();
    assert!(r.starts_with('-'), "{args:?} while Valkey is stopped: {r}");
    assert!(took < LIVENESS, "{args:?}: {r} after {took:?}");
    r
}

/// Sends `args` until the reply is `want` (walrus reconnects to a Valkey that answers
/// again); every other reply must be an error. Within a bound.
fn until(c: &mut Raw, args: &[&str], want: impl Fn(&[u8]) -> bool) {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let r = c.cmd(args);
        if want(&r) {
            return;
        }
        assert!(r.starts_with(b"-"), "{args:?}: {}", show(&r));
        assert!(Instant::now() < deadline, "{args:?}: still {}", show(&r));
    }
}

/// While Valkey is stopped (SIGSTOP; a partitioned Valkey behaves alike), the first command
/// of a session that needs a connection of its own (MULTI, WATCH, BLPOP, SUBSCRIBE in
/// either protocol), AUTH and HELLO AUTH (checked with Valkey on a connection of their
/// own), and a plain SET on the shared pool each get an error within a small multiple of
/// the configured bounds; once Valkey runs again, each session works.
#[test]
fn a_stopped_valkey_gets_every_first_command_an_error_in_time_then_each_session_works() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config(&format!(
            "[upstream]\nconnect_timeout_ms = {CONNECT_TIMEOUT_MS}\nreply_timeout_ms = {REPLY_TIMEOUT_MS}\n"
        ))
        .start();
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(
        direct.cmd(&["ACL", "SETUSER", "alice", "on", ">pw", "+@all", "~*", "&*"]),
        b"+OK\r\n"
    );
    let mut set = client(&w);
    assert_eq!(set.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    let firsts: &[&[&str]] = &[
        &["MULTI"],
        &["WATCH", "k"],
        &["BLPOP", "q", "0"],
        &["SUBSCRIBE", "news"],
        &["AUTH", "alice", "pw"],
        &["HELLO", "3", "AUTH", "alice", "pw"],
    ];
    let mut sessions: Vec<Raw> = firsts.iter().map(|_| client(&w)).collect();
    let mut resp3 = client(&w);
    assert!(resp3.cmd(&["HELLO", "3"]).starts_with(b"%"));

    let pid = v.proc.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    for (c, first) in sessions.iter_mut().zip(firsts) {
        error_in_time(c, first, &w);
    }
    error_in_time(&mut resp3, &["SUBSCRIBE", "news"], &w);
    error_in_time(&mut set, &["SET", "k", "v2"], &w);
    unsafe { libc::kill(pid, libc::SIGCONT) };

    until(&mut set, &["SET", "k", "v2"], |r| r == b"+OK\r\n");
    let [multi, watch, blpop, subscribe, auth, hello] = &mut sessions[..] else {
        unreachable!()
    };
    until(multi, &["MULTI"], |r| r == b"+OK\r\n");
    assert_eq!(multi.cmd(&["EXEC"]), b"*0\r\n");
    until(watch, &["WATCH", "k"], |r| r == b"+OK\r\n");
    assert_eq!(set.cmd(&["RPUSH", "q", "j"]), b":1\r\n");
    until(blpop, &["BLPOP", "q", "0"], |r| {
        r == b"*2\r\n$1\r\nq\r\n$1\r\nj\r\n"
    });
    until(subscribe, &["SUBSCRIBE", "news"], |r| {
        r == b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"
    });
    until(&mut resp3, &["SUBSCRIBE", "news"], |r| {
        r == b">3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"
    });
    until(auth, &["AUTH", "alice", "pw"], |r| r == b"+OK\r\n");
    until(hello, &["HELLO", "3", "AUTH", "alice", "pw"], |r| {
        r.starts_with(b"%")
    });
}

/// The managed Valkey dies, and so does the next one, as its restore starts (as soon as it
/// connects to walrus's restore listener, before its handshake is through): the restore
/// does not wait for the dead process until `restore.timeout_ms` (set far above this test's
/// wait), it starts over with the Valkey the supervisor starts next, and completes.
#[test]
fn a_valkey_that_dies_as_its_restore_starts_is_replaced_and_the_restore_starts_over() {
    let w = Walrus::build()
        .config("[restore]\ntimeout_ms = 600000\n")
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    let first = valkey_pid(&w.addr);
    unsafe { libc::kill(first, libc::SIGKILL) };
    w.proc
        .wait_line("managed valkey-server exited", START_TIMEOUT);
    // The next Valkey's own log line, forwarded by walrus: `<pid>:S <date> * PRIMARY <-> ...`.
    let line = w
        .proc
        .wait_line("PRIMARY <-> REPLICA sync started", START_TIMEOUT);
    let second: i32 = line
        .split_whitespace()
        .find_map(|t| t.strip_suffix(":S")?.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"));
    assert_ne!(second, first);
    unsafe { libc::kill(second, libc::SIGKILL) };
    w.proc
        .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
    w.proc.wait_line("replica link attached", START_TIMEOUT);
    assert_ne!(valkey_pid(&w.addr), second);
    assert_eq!(c.cmd(&["GET", "k"]), b"$1\r\nv\r\n");
}

/// The same with an external Valkey that whoever runs it restarts: while walrus restores
/// one, it checks every second which process answers, and starts over with the next.
#[test]
fn an_external_valkey_that_dies_as_its_restore_starts_is_replaced_and_the_restore_starts_over() {
    let first = Valkey::start();
    let port = first.port.to_string();
    let w = Walrus::build()
        .upstream(&first.addr())
        .config("[restore]\ntimeout_ms = 600000\n")
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    drop(first);
    let second = Valkey::start_with(&["--port", &port]);
    // Its connection to the restore listener is open: its handshake follows.
    second.proc.wait_line(
        "Non blocking connect for SYNC fired the event",
        START_TIMEOUT,
    );
    drop(second);
    let _third = Valkey::start_with(&["--port", &port]);
    w.proc
        .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
    until(&mut c, &["GET", "k"], |r| r == b"$1\r\nv\r\n");
}
