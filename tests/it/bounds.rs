//! walrus never hangs on a frozen or busy Valkey: every exchange with Valkey has a bound
//! (`upstream.connect_timeout_ms` to open a connection, `upstream.reply_timeout_ms` for each
//! reply), a restore starts over when the Valkey it loads is gone, and what Valkey serves
//! while a script keeps it busy (SCRIPT KILL, FUNCTION KILL, FUNCTION STATS) reaches it
//! through walrus.
use crate::common;
use common::*;

use std::time::{Duration, Instant};

const CONNECT_TIMEOUT_MS: u64 = 1000;
const REPLY_TIMEOUT_MS: u64 = 2000;
/// The longest a request may wait for its error while Valkey is stopped: a pooled
/// connection is given up within two reply-timeout periods of a request that gets no byte
/// from Valkey (docs/failure-modes.md row 22), every other exchange within one bound; and a
/// margin for a busy machine's timers. A liveness bound, not a performance one.
const LIVENESS: Duration = Duration::from_millis(2 * REPLY_TIMEOUT_MS + 500);

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

/// A pooled request sent right after its connection read a reply (in the same period of its
/// silence timer) gets its error within twice `upstream.reply_timeout_ms` all the same: the
/// reply heard before says nothing of the request owed after it.
#[test]
fn a_request_right_after_a_reply_gets_its_error_within_twice_the_reply_timeout() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config(&format!(
            "[upstream]\nreply_timeout_ms = {REPLY_TIMEOUT_MS}\n"
        ))
        .start();
    let mut c = client(&w);
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    let pid = v.proc.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    error_in_time(&mut c, &["GET", "k"], &w);
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

/// SIGTERM to walrus in managed mode while its Valkey is stopped (SIGSTOP: it never acts on
/// a SIGTERM): the stop ends cleanly, status 0, within its bound (twice
/// `proxy.shutdown_timeout_ms`), Valkey killed once its share of that has passed.
#[test]
fn a_stop_with_a_stopped_managed_valkey_ends_cleanly_within_its_bound() {
    let mut w = Walrus::build()
        .config("[proxy]\nshutdown_timeout_ms = 3000\n")
        .start();
    let pid = valkey_pid(&w.addr);
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    w.proc.signal(libc::SIGTERM);
    let status = w.proc.wait_exit(START_TIMEOUT).expect("walrus exits");
    assert!(status.success(), "{status:?}\n{}", w.proc.log_text());
    wait_dead(pid);
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
        .with_metrics()
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
    w.await_attached();
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

/// How many CLIENT KILL commands Valkey ran (refused ones do not count), once the script
/// that keeps it busy (if any) ended.
fn client_kills(direct: &mut Raw) -> u64 {
    let deadline = Instant::now() + START_TIMEOUT;
    let stats = loop {
        let r = direct.cmd(&["INFO", "commandstats"]);
        if !r.starts_with(b"-BUSY ") {
            break String::from_utf8(r).unwrap();
        }
        assert!(Instant::now() < deadline, "Valkey stays busy");
    };
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_client|kill:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Sends PING on Valkey's own socket until Valkey answers `-BUSY`: a script runs.
fn await_busy(direct: &mut Raw) -> Vec<u8> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let r = direct.cmd(&["PING"]);
        if r.starts_with(b"-BUSY ") {
            return r;
        }
        assert_eq!(r, b"+PONG\r\n");
        assert!(Instant::now() < deadline, "Valkey never got busy");
    }
}

/// A read-only script or function that loops makes Valkey answer `-BUSY`. SCRIPT KILL and
/// FUNCTION KILL sent through walrus reach it at once (they do not queue behind the script
/// on the shared connection, and nothing that a busy Valkey refuses is asked first), and so
/// does FUNCTION STATS; a client meanwhile gets Valkey's own `-BUSY`, not an error of
/// walrus's. When the reply timeout gives up the connection the script runs on, the next
/// connection serves Valkey's `-BUSY` too.
#[test]
fn a_runaway_script_is_killed_through_walrus_and_clients_meanwhile_get_busy() {
    let v = Valkey::start_with(&["--busy-reply-threshold", "100"]);
    let w = Walrus::build()
        .upstream(&v.addr())
        .config(&format!(
            "[upstream]\nreply_timeout_ms = {REPLY_TIMEOUT_MS}\n"
        ))
        .start();
    let mut direct = Raw::connect(&v.addr());
    let mut c = client(&w);
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    let library = "#!lua name=spin\n\
        server.register_function{function_name='spin', callback=function() while true do end end, flags={'no-writes'}}";
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", library]), b"$4\r\nspin\r\n");
    let mut runner = client(&w);
    let mut killer = client(&w);
    killer
        .stream
        .set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
        .unwrap();

    // A script, killed with SCRIPT KILL; meanwhile a RESP3 client, whose connections are
    // new ones, gets Valkey's -BUSY.
    runner.send_raw(&walrus::resp::write::command([
        "EVAL_RO",
        "while true do end",
        "0",
    ]));
    let busy = await_busy(&mut direct);
    let mut resp3 = client(&w);
    assert!(resp3.cmd(&["HELLO", "3"]).starts_with(b"%"));
    assert_eq!(show(&resp3.cmd(&["GET", "k"])), show(&busy));
    // A write: Valkey refuses it, but walrus cannot learn so (ROLE is refused as well).
    let write = show(&resp3.cmd(&["SET", "k", "x"]));
    assert!(
        write.starts_with("-ERR walrus: cannot confirm durability"),
        "{write}"
    );
    assert_eq!(show(&killer.cmd(&["SCRIPT", "KILL"])), "+OK⏎");
    let killed = show(&runner.read_frame());
    assert!(
        killed.starts_with("-ERR") && killed.contains("Script killed by user"),
        "{killed}"
    );
    assert_eq!(c.cmd(&["GET", "k"]), b"$1\r\nv\r\n");

    // A function, killed with FUNCTION KILL; FUNCTION STATS shows it running.
    runner.send_raw(&walrus::resp::write::command(["FCALL_RO", "spin", "0"]));
    await_busy(&mut direct);
    let stats = show(&killer.cmd(&["FUNCTION", "STATS"]));
    assert!(
        stats.contains("running_script") && stats.contains("spin"),
        "{stats}"
    );
    assert_eq!(show(&killer.cmd(&["FUNCTION", "KILL"])), "+OK⏎");
    let killed = show(&runner.read_frame());
    assert!(
        killed.starts_with("-ERR") && killed.contains("killed by user"),
        "{killed}"
    );

    // A script outlasting the reply timeout: its connection is given up, with the write
    // behind it; the next connection is checked while Valkey is busy and serves its -BUSY.
    // Valkey runs what the given-up connection sent once the script ends: walrus has it
    // close that connection (CLIENT KILL, which a busy Valkey refuses, asked again until it
    // is answered) before it learns the offset that settles the write.
    let kills = || client_kills(&mut Raw::connect(&v.addr()));
    let before = kills();
    runner.send_raw(&walrus::resp::write::command([
        "EVAL_RO",
        "while true do end",
        "0",
    ]));
    let busy = await_busy(&mut direct);
    let lost = show(&c.cmd(&["SET", "k2", "behind"]));
    assert!(lost.starts_with("-ERR walrus: "), "{lost}");
    assert!(show(&runner.read_frame()).starts_with("-ERR walrus: "));
    assert_eq!(show(&c.cmd(&["GET", "k"])), show(&busy));
    assert_eq!(show(&killer.cmd(&["SCRIPT", "KILL"])), "+OK⏎");
    let deadline = Instant::now() + Duration::from_secs(10);
    while kills() == before {
        assert!(
            Instant::now() < deadline,
            "walrus never had Valkey close the given-up connection"
        );
    }
    until(&mut c, &["GET", "k"], |r| r == b"$1\r\nv\r\n");
}
