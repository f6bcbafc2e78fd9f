//! Upstream failures and walrus's lifecycle: Valkey dying and coming back, graceful shutdown
//! with replies in flight, the managed valkey-server child, configuration errors, and the
//! command line's --version and --help.

use crate::common;
use common::*;

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

const OK: &[u8] = b"+OK\r\n";

fn command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    walrus::resp::write::command(args.iter().map(|a| a.as_ref())).to_vec()
}

/// Retries `args` until the reply is `want`; every other reply must be a walrus error (an
/// `-ERR walrus:` while Valkey is away, a `-MISCONF walrus:` while the journal is not yet
/// following the new Valkey, or `-LOADING` while walrus restores it). Each try waits for its reply; the short pause between tries is
/// the reconnection backoff.
fn retry_until(c: &mut Raw, args: &[&str], want: &[u8], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let r = c.cmd(args);
        if r == want {
            return;
        }
        assert!(
            r.starts_with(b"-ERR walrus:")
                || r.starts_with(b"-MISCONF walrus:")
                || r.starts_with(b"-LOADING "),
            "{args:?}: unexpected reply {}",
            show(&r)
        );
        assert!(
            Instant::now() < deadline,
            "{args:?}: still {} after {within:?}",
            show(&r)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn valkey_killed_gives_errors_at_once_and_walrus_reconnects_when_it_is_back() {
    let mut v = Valkey::start_with(&["--enable-debug-command", "yes"]);
    let port = v.port.to_string();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);

    // A request in flight when Valkey dies, and requests after: errors, quickly.
    c.send_raw(&command(&["DEBUG", "SLEEP", "10"]));
    let killed = Instant::now();
    v.proc.signal(libc::SIGKILL);
    assert!(v.proc.wait_exit(Duration::from_secs(10)).is_some());
    let r = c.read_frame();
    assert!(r.starts_with(b"-ERR walrus:"), "{}", show(&r));
    assert!(killed.elapsed() < Duration::from_secs(5));
    let r = c.cmd(&["GET", "k"]);
    assert!(r.starts_with(b"-ERR walrus:"), "{}", show(&r));
    let mut newcomer = Raw::connect(&w.addr);
    let r = newcomer.cmd(&["PING"]);
    assert!(r.starts_with(b"-ERR walrus:"), "{}", show(&r));
    assert!(killed.elapsed() < Duration::from_secs(8));

    // A new Valkey on the same port: walrus finds it by itself.
    let v2 = Valkey::start_with(&["--port", &port]);
    retry_until(&mut c, &["SET", "k", "v2"], OK, Duration::from_secs(15));
    assert_eq!(c.cmd(&["GET", "k"]), b"$2\r\nv2\r\n");
    retry_until(
        &mut newcomer,
        &["PING"],
        b"+PONG\r\n",
        Duration::from_secs(15),
    );
    let mut fresh = Raw::connect(&w.addr);
    assert_eq!(fresh.cmd(&["GET", "k"]), b"$2\r\nv2\r\n");
    let mut direct = Raw::connect(&format!("127.0.0.1:{port}"));
    assert_eq!(direct.cmd(&["GET", "k"]), b"$2\r\nv2\r\n");
    drop(v2);
}

#[test]
fn sigterm_delivers_every_pipelined_reply_then_closes_and_exits_zero() {
    let v = Valkey::start_with(&["--enable-debug-command", "yes"]);
    let mut w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "n", "0"]), OK);
    // The slow command first: the other 999 replies are all still pending at SIGTERM.
    let mut p = command(&["DEBUG", "SLEEP", "0.3"]);
    for _ in 0..999 {
        p.extend_from_slice(&command(&["INCR", "n"]));
    }
    c.send_raw(&p);
    c.await_delivered();
    w.proc.signal(libc::SIGTERM);
    w.proc.wait_line("shutting down", Duration::from_secs(10));
    assert!(
        TcpStream::connect(&w.addr).is_err(),
        "walrus still accepts connections after SIGTERM"
    );
    let first = c.try_read_frame().unwrap_or_else(|e| {
        panic!(
            "DEBUG SLEEP's reply after SIGTERM: {e}\n{}",
            w.proc.log_text()
        )
    });
    assert_eq!(first, OK);
    for i in 1..=999 {
        let r = c.try_read_frame().unwrap_or_else(|e| {
            panic!("reply {i} of 999 after SIGTERM: {e}\n{}", w.proc.log_text())
        });
        assert_eq!(show(&r), format!(":{i}⏎"));
    }
    assert!(c.closed(), "connection not closed after the last reply");
    let status = w
        .proc
        .wait_exit(Duration::from_secs(15))
        .expect("walrus did not exit");
    assert!(status.success(), "{status:?}\n{}", w.proc.log_text());
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(direct.cmd(&["GET", "n"]), b"$3\r\n999\r\n");
}

/// A stop that cannot finish (the runtime's thread held where the drain begins) is cut at
/// twice `proxy.shutdown_timeout_ms`, with status 1 and a line that says so, and the next
/// start serves what was acknowledged.
#[test]
fn a_stop_that_cannot_finish_is_cut_at_twice_the_shutdown_timeout() {
    let v = Valkey::start();
    let data = tempfile::tempdir().unwrap();
    let mut w = Walrus::build()
        .upstream(&v.addr())
        .data(data.path())
        .config("[proxy]\nshutdown_timeout_ms = 1000\n")
        .failpoint("stop::drain", "sleep(600000)")
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    w.proc.signal(libc::SIGTERM);
    let status = w.proc.wait_exit(START_TIMEOUT).unwrap_or_else(|| {
        panic!(
            "walrus still running {START_TIMEOUT:?} after SIGTERM:\n{}",
            w.proc.log_text()
        )
    });
    assert_eq!(status.code(), Some(1), "{}", w.proc.log_text());
    w.proc
        .wait_line("the stop did not finish within 2000 ms", START_TIMEOUT);
    let w = Walrus::build()
        .upstream(&v.addr())
        .data(data.path())
        .start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["GET", "k"]), b"$1\r\nv\r\n");
}

fn info_pid(c: &mut Raw) -> i32 {
    let info = c.cmd(&["INFO", "server"]);
    let text = String::from_utf8_lossy(&info);
    text.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap_or_else(|| panic!("no process_id in {text}"))
        .trim()
        .parse()
        .unwrap()
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[test]
fn managed_valkey_is_restarted_when_it_dies_and_stopped_with_walrus() {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(walrus_bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", ""])
        .arg("--data-dir")
        .arg(data.path())
        .env("VALKEY_SERVER", valkey_server_bin())
        .env("RUST_LOG", "info");
    let mut w = Proc::spawn(cmd, true);
    let addr = listening_addr(&w);
    let walrus_pid = w.child.id() as i32;
    // walrus listens once its journal follows the managed Valkey's stream.
    assert!(w.log_text().contains("replica link attached"));

    let mut c = Raw::connect(&addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    assert_eq!(c.cmd(&["GET", "k"]), b"$1\r\nv\r\n");
    let first = info_pid(&mut c);
    assert_eq!(parent_of(first), Some(walrus_pid), "not walrus's child");

    unsafe { libc::kill(first, libc::SIGKILL) };
    w.wait_line("managed valkey-server restarted", Duration::from_secs(30));
    // The pool reconnects with its own backoff.
    retry_until(&mut c, &["SET", "k", "again"], OK, Duration::from_secs(15));
    assert_eq!(c.cmd(&["GET", "k"]), b"$5\r\nagain\r\n");
    let second = info_pid(&mut c);
    assert_ne!(second, first);
    assert_eq!(parent_of(second), Some(walrus_pid), "not walrus's child");

    w.signal(libc::SIGTERM);
    let status = w
        .wait_exit(Duration::from_secs(20))
        .expect("walrus did not exit");
    assert!(status.success(), "{status:?}\n{}", w.log_text());
    // walrus waits for its child before exiting: it is gone, or goes at once.
    wait_dead(second);
}

/// Runs `walrus serve --config` with `text`; it must fail, and its stderr must contain every
/// one of `needles`.
fn config_error(text: &str, needles: &[&str]) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(walrus_bin());
    cmd.args(["serve", "--config"])
        .arg(f.path())
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", ""])
        .arg("--data-dir")
        .arg(data.path());
    let mut p = Proc::spawn(cmd, true);
    let status = p
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("walrus started with config {text:?}"));
    assert!(!status.success(), "config {text:?}: {status:?}");
    let line = p.wait_line(needles[0], Duration::from_secs(5));
    for n in needles {
        assert!(line.contains(n), "config {text:?}: {line:?} lacks {n:?}");
    }
}

#[test]
fn config_errors_name_the_key_and_the_value() {
    config_error("[proxy]\nmax_clientz = 3\n", &["max_clientz"]);
    config_error(
        "[proxy]\nmax_clients = \"many\"\n",
        &["max_clients", "many"],
    );
    config_error("[upstream]\npool_size = 0\n", &["upstream.pool_size", "0"]);
    config_error("[upstream]\nmode = \"embedded\"\n", &["mode", "embedded"]);
    config_error("[nonsense]\nx = 1\n", &["nonsense"]);
}

#[test]
fn version_and_help() {
    let out = Command::new(walrus_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("walrus {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let out = Command::new(walrus_bin()).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("serve") && text.contains("Usage"), "{text}");
    let out = Command::new(walrus_bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--config") && text.contains("--upstream"),
        "{text}"
    );
}

/// A RESP3 subscription is confirmed by pushes, not by a reply, yet a dedicated connection
/// that cannot serve yet (the replica link is down, here because walrus's user may no
/// longer PSYNC) answers it in band with `-LOADING`: that error reaches the client instead
/// of leaving it waiting for a confirmation that never comes.
#[test]
fn a_resp3_subscription_while_the_link_is_down_gets_loading() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).with_metrics().start();
    let mut c = Raw::connect(&w.addr);
    assert!(c.cmd(&["HELLO", "3"]).starts_with(b"%"));
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(
        direct.cmd(&["ACL", "SETUSER", "default", "-psync", "-sync"]),
        b"+OK\r\n"
    );
    direct.cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
    w.await_status("the replica link down", |s| !s.attached);
    c.stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    c.send_raw(&walrus::resp::write::command(["SUBSCRIBE", "news"]));
    let r = c.try_read_frame().map(|f| show(&f));
    assert_eq!(
        r,
        Ok(show(
            b"-LOADING Valkey is loading the dataset in memory\r\n"
        ))
    );
    // Once the link is back, the subscription goes through.
    assert_eq!(
        direct.cmd(&["ACL", "SETUSER", "default", "+@all"]),
        b"+OK\r\n"
    );
    w.await_attached();
    c.send_raw(&walrus::resp::write::command(["SUBSCRIBE", "news"]));
    let r = c.try_read_frame().map(|f| show(&f));
    assert_eq!(
        r,
        Ok(show(b">3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"))
    );
}

/// A Valkey that stops answering (SIGSTOP here; a partition does the same) does not hang
/// walrus's clients: a pooled connection that owes replies with no byte from Valkey for
/// `upstream.reply_timeout_ms` is given up, and its requests get an error. Once Valkey
/// answers again, so does walrus.
#[test]
fn a_valkey_that_stops_answering_gets_requests_an_error_not_a_hang() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[upstream]\nreply_timeout_ms = 2000\n")
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    // A dedicated connection (WATCH), and one that waits in a blocking pop, which Valkey's
    // silence must not cut.
    let mut watching = Raw::connect(&w.addr);
    assert_eq!(watching.cmd(&["WATCH", "k"]), b"+OK\r\n");
    let mut popping = Raw::connect(&w.addr);
    popping.send_raw(&walrus::resp::write::command(["BLPOP", "jobs", "0"]));
    // It waits in Valkey before Valkey stops (opening its connection then would fail).
    let mut direct = Raw::connect(&v.addr());
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    while info_field(&mut direct, "clients", "blocked_clients").as_deref() != Some("1") {
        assert!(
            std::time::Instant::now() < deadline,
            "the BLPOP never blocked"
        );
    }
    let pid = v.proc.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let r = show(&c.cmd(&["GET", "k"]));
    let watched = show(&watching.cmd(&["GET", "k"]));
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(r.starts_with("-ERR walrus: "), "{r}");
    assert!(watched.starts_with("-ERR walrus: "), "{watched}");
    // The pooled connection was given up: the first request after may find it reconnecting.
    await_state("RPUSH through a reconnected pool", || {
        c.cmd(&["RPUSH", "jobs", "j1"]).starts_with(b":")
    });
    assert_eq!(
        show(&popping.read_frame()),
        show(b"*2\r\n$4\r\njobs\r\n$2\r\nj1\r\n")
    );
    await_state("GET k answered again", || {
        let r = c.cmd(&["GET", "k"]);
        assert!(
            r == b"$1\r\nv\r\n" || r.starts_with(b"-ERR walrus: "),
            "{}",
            show(&r)
        );
        r == b"$1\r\nv\r\n"
    });
}

/// A client's dedicated connection ends with the Valkey it reached: its subscriptions (or
/// WATCH, or MULTI) are gone, so walrus closes the client's connection, as Valkey's own
/// restart would, instead of leaving a RESP3 subscriber listening to nothing.
#[test]
fn a_dedicated_session_is_closed_when_its_valkey_dies() {
    let w = Walrus::build().with_metrics().start();
    let mut sub = Raw::connect(&w.addr);
    assert!(sub.cmd(&["HELLO", "3"]).starts_with(b"%"));
    assert_eq!(
        show(&sub.cmd(&["SUBSCRIBE", "news"])),
        show(b">3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n")
    );
    let mut watcher = Raw::connect(&w.addr);
    assert_eq!(watcher.cmd(&["WATCH", "k"]), b"+OK\r\n");
    w.kill_valkey_and_await_restore();
    assert_eq!(sub.try_read_frame(), Err("connection closed".to_string()));
    assert_eq!(
        watcher.try_read_frame(),
        Err("connection closed".to_string())
    );
}

/// walrus's own user must keep the commands walrus runs. Without INFO, a new upstream
/// connection cannot be checked against the Valkey process the link follows: it does not
/// serve, its clients get an error naming the reason, and it is retried with backoff until
/// the permission is back.
#[test]
fn without_info_new_upstream_connections_are_refused_naming_the_reason() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(
        direct.cmd(&["ACL", "SETUSER", "default", "-info"]),
        b"+OK\r\n"
    );
    // A RESP3 client needs connections of its own: new ones, which cannot be checked.
    let mut c = Raw::connect(&w.addr);
    let r = show(&c.cmd(&["HELLO", "3"]));
    assert!(
        r.starts_with("-ERR walrus: ") && r.contains("is walrus's own user allowed INFO?"),
        "{r}"
    );
    assert_eq!(
        direct.cmd(&["ACL", "SETUSER", "default", "+info"]),
        b"+OK\r\n"
    );
    await_state("HELLO 3 answered once INFO is allowed", || {
        c.cmd(&["HELLO", "3"]).starts_with(b"%")
    });
}
