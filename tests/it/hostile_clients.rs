//! Slow and hostile clients: many idle connections, clients that never read their replies,
//! requests trickled byte by byte, clients that vanish mid-pipeline. Each must cost walrus
//! no more than its settings say, and nobody else may see a wrong reply or a hang. (How
//! much the others' latency moves is measured by `deploy/bench.py --suite hostile`, not
//! asserted here: timing belongs in benchmarks.)

use crate::common;
use common::*;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

const OK: &[u8] = b"+OK\r\n";

/// Returns once Valkey has a client blocked (the BLPOP a test sent through walrus).
fn await_blocked_client(valkey: &mut Raw) {
    let deadline = Instant::now() + START_TIMEOUT;
    while info_field(valkey, "clients", "blocked_clients").as_deref() == Some("0") {
        assert!(Instant::now() < deadline, "the BLPOP never blocked");
    }
}

/// The replies to INCRs of a fresh counter, `n` of them.
fn incr_replies(n: u64) -> Vec<u8> {
    (1..=n)
        .flat_map(|i| format!(":{i}\r\n").into_bytes())
        .collect()
}

/// This process's soft open-files limit, raised to its hard one.
fn open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        lim.rlim_cur = lim.rlim_max;
    }
    lim.rlim_cur
}

/// 10,000 idle clients, walrus's default `proxy.max_clients`: every one is served, one more
/// gets Valkey's refusal, and an idle client costs walrus its task and socket only (no
/// buffers held while it sends nothing).
#[test]
fn ten_thousand_idle_clients_are_served_cheaply_and_one_more_is_refused() {
    const CLIENTS: usize = 10_000;
    // The test's own 10,000 sockets (walrus raises its own soft limit as far as its hard one
    // allows, src/daemon/fds.rs).
    if open_files() < CLIENTS as u64 + 1_000 {
        eprintln!("skipped: the open files limit is below {}", CLIENTS + 1_000);
        return;
    }
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut probe = Raw::connect(&w.addr);
    assert_eq!(probe.cmd(&["SET", "k", "v"]), OK);
    let before = memory(&w, "VmRSS");
    let mut clients: Vec<TcpStream> = (0..CLIENTS - 1)
        .map(|_| TcpStream::connect(&w.addr).unwrap())
        .collect();
    // Each is served: a PING from every one, then every reply.
    for c in &mut clients {
        c.write_all(b"PING\r\n").unwrap();
    }
    for c in &mut clients {
        c.set_read_timeout(Some(START_TIMEOUT)).unwrap();
        let mut reply = [0u8; 7];
        c.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+PONG\r\n");
    }
    let per_client = memory(&w, "VmRSS").saturating_sub(before) / (CLIENTS as u64 - 1);
    // The session's read and write buffers alone were 32 KiB when they were held.
    assert!(
        per_client < 16 << 10,
        "an idle client costs walrus {per_client} bytes"
    );
    let mut refused = Raw::connect(&w.addr);
    assert_eq!(
        refused.read_frame(),
        b"-ERR max number of clients reached\r\n"
    );
    assert_eq!(probe.cmd(&["GET", "k"]), b"$1\r\nv\r\n");
    drop(clients);
}

/// With too few file descriptors for `proxy.max_clients`, walrus serves as many clients as
/// they cover and refuses the next with Valkey's error, as Valkey lowers `maxclients`:
/// never a client left unanswered in the accept queue.
#[test]
fn too_few_file_descriptors_lower_the_client_limit_instead_of_hanging_clients() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).open_files(256).start();
    let line = w.proc.wait_line("covers ", START_TIMEOUT);
    let covered: usize = line
        .split("covers ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no client count in {line:?}"));
    assert!(covered > 10 && covered < 256, "{line}");
    let mut clients: Vec<Raw> = (0..covered).map(|_| Raw::connect(&w.addr)).collect();
    for c in &mut clients {
        assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
    }
    let mut refused = Raw::connect(&w.addr);
    assert_eq!(
        refused.read_frame(),
        b"-ERR max number of clients reached\r\n"
    );
    drop(clients.pop());
    // A place freed is taken again (the session's end returns its permit).
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let mut c = Raw::connect(&w.addr);
        if c.try_cmd(&["PING"]).as_deref() == Some(b"+PONG\r\n".as_slice()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed place is never taken again"
        );
    }
}

/// walrus's `VmRSS` (resident memory now) or `VmHWM` (its peak so far), in bytes.
fn memory(w: &Walrus, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", w.proc.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field}"));
    kb << 10
}

/// walrus with a 4 MiB output limit in front of its own Valkey, a 1 MiB value at `big`, and
/// a client that reads its replies.
struct LargeValue {
    valkey: Valkey,
    w: Walrus,
    metrics: String,
    c: Raw,
    /// The reply to `GET big`.
    reply: Vec<u8>,
}

impl LargeValue {
    fn start() -> LargeValue {
        let valkey = Valkey::start();
        let metrics = format!("127.0.0.1:{}", free_port());
        let w = Walrus::build()
            .upstream(&valkey.addr())
            .config("[proxy]\nmax_output_bytes = 4194304\n")
            .args(&["--metrics-listen", &metrics])
            .start();
        let mut c = Raw::connect(&w.addr);
        let big = "x".repeat(1 << 20);
        assert_eq!(c.cmd(&["SET", "big", &big]), OK);
        LargeValue {
            valkey,
            w,
            metrics,
            c,
            reply: bulk(&big),
        }
    }

    /// Valkey's count of `GETRANGE` (what the non-readers here send; the other client
    /// sends no GETRANGE).
    fn getranges(&self) -> u64 {
        info_field(
            &mut Raw::connect(&self.valkey.addr()),
            "commandstats",
            "cmdstat_getrange",
        )
        .and_then(|s| s.strip_prefix("calls=")?.split(',').next()?.parse().ok())
        .unwrap_or(0)
    }

    /// Until walrus has disconnected the non-reader `hostile` for its output, or paused it
    /// within its limit (Valkey's count of its GETRANGEs stands still across the other
    /// client's round trip on the shared upstream connection), the other client writes and
    /// reads `n` (each reply checked). Then `hostile` reads its first 8 replies, or to the
    /// end if it was closed: `GETRANGE big 0 -1`'s in order (the last may be cut by the
    /// disconnection, as Valkey cuts it); and goes away. Returns how much walrus's memory grew over
    /// `before` at most (`VmRSS` sampled meanwhile, or `VmHWM`, by `field`) and how many of
    /// the reads Valkey ran.
    fn until_closed_or_paused(
        &mut self,
        mut hostile: TcpStream,
        field: &str,
        before: u64,
    ) -> (u64, u64) {
        let deadline = Instant::now() + START_TIMEOUT;
        let (mut n, mut peak, mut last) = (0u64, 0, u64::MAX);
        while metric(&self.metrics, "walrus_clients_output_closed_total") < 1.0 {
            assert!(
                Instant::now() < deadline,
                "the client that does not read is neither closed nor paused; walrus grew by {} bytes",
                memory(&self.w, field).saturating_sub(before)
            );
            n += 1;
            assert_eq!(self.c.cmd(&["SET", "n", &n.to_string()]), OK);
            assert_eq!(self.c.cmd(&["GET", "n"]), bulk(n.to_string()));
            peak = peak.max(memory(&self.w, field));
            let now = self.getranges();
            if now == last && now > 0 {
                break;
            }
            last = now;
        }
        let ran = self.getranges();
        hostile.set_read_timeout(Some(START_TIMEOUT)).unwrap();
        let mut sink = vec![0; 8 * self.reply.len()];
        let mut got = 0;
        while got < sink.len() {
            match hostile.read(&mut sink[got..]) {
                Ok(k) if k > 0 => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    panic!("a client reading again is neither written to nor closed")
                }
                _ => break, // closed (a reset, when it had sent more)
            }
        }
        sink.truncate(got);
        for (i, chunk) in sink.chunks(self.reply.len()).enumerate() {
            assert!(self.reply.starts_with(chunk), "reply {i} is not the value");
        }
        assert_eq!(self.c.cmd(&["GET", "n"]), bulk(n.to_string()));
        (peak.max(memory(&self.w, field)).saturating_sub(before), ran)
    }
}

/// A client that pipelines reads of a large value and never reads a reply: walrus stops
/// reading its requests and keeps it paused within `proxy.max_output_bytes`, or disconnects
/// it at the limit, and its memory never holds more than that; another client is served
/// correctly all along.
#[test]
fn a_client_that_never_reads_is_held_to_its_output_limit() {
    let mut t = LargeValue::start();
    let before = memory(&t.w, "VmRSS");
    // 300 MiB of replies asked for, none read.
    let hostile = TcpStream::connect(&t.w.addr).unwrap();
    let get = walrus::resp::write::command(["GETRANGE", "big", "0", "-1"]);
    let writer = {
        let mut hostile = hostile.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..300 {
                if hostile.write_all(&get).is_err() {
                    return; // disconnected, or no longer read: either is the point
                }
            }
        })
    };
    let (grew, _) = t.until_closed_or_paused(hostile, "VmRSS", before);
    writer.join().unwrap();
    // Bounded by the limit, the replies in flight on the pool's connection and the
    // allocator's slack: far below the 300 MiB asked for.
    assert!(grew < 64 << 20, "walrus grew by {grew} bytes");
}

/// A client that sends hundreds of reads of a large value in one burst, then MULTI (a
/// barrier: every earlier reply is written before it runs), and reads nothing. The replies
/// the barrier gathers count against the output limit like any others (it is paused within
/// it, or closed at it). (They did not: the
/// barrier gathered them all and waited for the client to read them, 440 MB here and the
/// client never disconnected; 20 such clients took walrus to 24 GB and the OOM killer.
/// Without the count of replies not yet taken by the session, walrus still grew by 76 MB.)
#[test]
fn replies_gathered_before_a_barrier_count_against_the_output_limit() {
    let mut t = LargeValue::start();
    let before = memory(&t.w, "VmHWM");
    // 400 MiB of replies asked for in one write of 12 KiB (one read), then MULTI; nothing
    // read.
    let mut burst = walrus::resp::write::command(["GETRANGE", "big", "0", "-1"]).repeat(400);
    burst.extend_from_slice(&walrus::resp::write::command(["MULTI"]));
    let mut hostile = TcpStream::connect(&t.w.addr).unwrap();
    hostile.write_all(&burst).unwrap();
    let (grew, _) = t.until_closed_or_paused(hostile, "VmHWM", before);
    // Bounded by the limit twice over (the replies taken and those waiting for the
    // session), a reply in flight and the allocator's slack.
    assert!(grew < 64 << 20, "walrus's peak grew by {grew} bytes");
}

/// A client that sends 400 reads of a large value in one write and never reads costs
/// Valkey a few of them, not the whole burst: a new client may have 4 replies pending until
/// it shows it reads them, then no more in flight than half its output limit holds at the
/// size of its recent replies; it then waits, paused within its limit (or is closed at
/// it). (The whole burst ran: 20 such clients, reconnecting each time walrus closed them,
/// kept the shared upstream connection busy with gigabytes of replies nobody wanted, every
/// other client's requests waited behind them, and sessions piled up to
/// `proxy.max_clients`.)
#[test]
fn a_client_that_never_reads_costs_valkey_a_few_replies_not_its_burst() {
    let mut t = LargeValue::start();
    let burst = walrus::resp::write::command(["GETRANGE", "big", "0", "-1"]).repeat(400);
    let hostile = connect_slow(&t.w.addr, 4096).unwrap();
    // walrus may stop reading it before the whole burst is in (paused): the rest may never
    // be taken, and need not be.
    hostile.set_write_timeout(Some(START_TIMEOUT)).unwrap();
    let _ = (&hostile).write_all(&burst);
    // (Its first 4 replies may already take it past this fixture's 4 MiB limit, when they
    // arrive before walrus writes any: then it is closed, and the rest never runs either.)
    let (_, ran) = t.until_closed_or_paused(hostile, "VmRSS", 0);
    assert!(ran <= 16, "Valkey ran {ran} of the 400 reads");
}

/// A client that pipelines `BLPOP q 0` and more (a new client's window is 4 pending
/// replies, so its session pauses behind the BLPOP) and then goes away: walrus notices while
/// paused and closes its connection to Valkey, which ends the BLPOP, as Valkey alone would.
/// (Its session stopped watching the socket while paused: the BLPOP stayed blocked and took
/// the next job pushed to `q` for a client that was gone.)
#[test]
fn a_client_gone_while_paused_behind_a_blocked_command_leaves_no_blocked_command() {
    gone_while_paused_behind_blpop(false);
}

/// The same, when the client sent more after its session paused: those requests waited in
/// the socket, the watch saw them and not the client's leaving behind them (the BLPOP stayed
/// blocked). Valkey reads on a blocked client's requests (unhandled) and so sees it go;
/// walrus does too.
#[test]
fn a_client_gone_after_sending_more_behind_a_blocked_command_leaves_no_blocked_command() {
    gone_while_paused_behind_blpop(true);
}

fn gone_while_paused_behind_blpop(send_more: bool) {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut blocked = TcpStream::connect(&w.addr).unwrap();
    let get = walrus::resp::write::command(["GET", "a"]);
    let mut pipeline = walrus::resp::write::command(["BLPOP", "q", "0"]).to_vec();
    for _ in 0..8 {
        pipeline.extend_from_slice(&get);
    }
    blocked.write_all(&pipeline).unwrap();
    let mut valkey = Raw::connect(&v.addr());
    await_blocked_client(&mut valkey);
    if send_more {
        blocked.write_all(&get.repeat(8)).unwrap();
    }
    drop(blocked);
    let deadline = Instant::now() + START_TIMEOUT;
    while info_field(&mut valkey, "clients", "blocked_clients").as_deref() != Some("0") {
        assert!(
            Instant::now() < deadline,
            "the BLPOP of a client that is gone is still blocked in Valkey"
        );
    }
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["LPUSH", "q", "job"]), b":1\r\n");
    assert_eq!(c.cmd(&["LLEN", "q"]), b":1\r\n");
}

/// A client that pipelines more writes than a new client's window (4 pending replies) and
/// closes its sending side at once (`nc -N`, a mass insert) has every one of them run and
/// gets every reply, as from Valkey, which runs and answers every command it read before the
/// client left. (walrus saw the client close while its session was paused at the window and
/// dropped the requests it had not handled yet: 4 of the 10 ran; then it ran them all but
/// dropped the replies still owed when it saw the end.)
#[test]
fn a_client_that_closes_after_its_pipeline_has_all_of_it_run_and_answered() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut client = TcpStream::connect(&w.addr).unwrap();
    client
        .write_all(&walrus::resp::write::command(["INCR", "n"]).repeat(10))
        .unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    client.set_read_timeout(Some(START_TIMEOUT)).unwrap();
    let mut replies = Vec::new();
    client.read_to_end(&mut replies).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&replies),
        String::from_utf8_lossy(&incr_replies(10))
    );
}

/// SIGTERM while a session is paused behind `BLPOP q 1`, holding requests it read and has
/// not handled: they are handled and answered before walrus exits, as every request a client
/// sent before the signal is. (While paused behind a command that may block, the session
/// reads on without handling; at shutdown it stopped reading and never handled them: 3 of
/// the 8 INCRs ran.)
#[test]
fn sigterm_while_paused_behind_a_blocked_command_answers_every_request_read() {
    let v = Valkey::start();
    let mut w = Walrus::build().upstream(&v.addr()).start();
    let mut client = TcpStream::connect(&w.addr).unwrap();
    let mut pipeline = walrus::resp::write::command(["BLPOP", "q", "1"]).to_vec();
    pipeline.extend_from_slice(&walrus::resp::write::command(["INCR", "n"]).repeat(8));
    client.write_all(&pipeline).unwrap();
    await_blocked_client(&mut Raw::connect(&v.addr()));
    w.proc.signal(libc::SIGTERM);
    client.set_read_timeout(Some(START_TIMEOUT)).unwrap();
    let mut replies = Vec::new();
    let _ = client.read_to_end(&mut replies);
    let all = [b"*-1\r\n".as_slice(), &incr_replies(8)].concat();
    assert_eq!(
        String::from_utf8_lossy(&replies),
        String::from_utf8_lossy(&all)
    );
    assert!(w.proc.wait_exit(START_TIMEOUT).is_some_and(|s| s.success()));
}

/// Replies walrus gives itself count against the output limit too: a client names itself
/// with 4 MiB, asks for its name 100 times in one write and reads nothing for a while. walrus
/// stops handling its requests once its replies pile up, instead of building all 400 MiB of
/// them (it did: each `CLIENT GETNAME` reply was queued outside any limit); then the client
/// reads, and gets every reply, in order.
#[test]
fn replies_walrus_gives_itself_count_against_the_output_limit() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[proxy]\nmax_output_bytes = 16777216\n")
        .start();
    let mut c = Raw::connect(&w.addr);
    let name = "n".repeat(4 << 20);
    assert_eq!(c.cmd(&["CLIENT", "SETNAME", &name]), OK);
    let before = memory(&w, "VmHWM");
    let getname = walrus::resp::write::command(["CLIENT", "GETNAME"]).repeat(100);
    let raw = &mut c.stream;
    raw.write_all(&getname).unwrap();
    // Every reply, in order, as the client reads them.
    let reply = bulk(&name);
    let mut got = vec![0; reply.len()];
    for i in 0..100 {
        raw.read_exact(&mut got).unwrap();
        assert!(got == reply, "reply {i} is not the name");
    }
    let grew = memory(&w, "VmHWM").saturating_sub(before);
    assert!(grew < 64 << 20, "walrus's peak grew by {grew} bytes");
}

/// 100 clients trickle a SET one byte at a time while another client works: the slow
/// requests complete correctly once whole, and the other client's replies are all right.
#[test]
fn requests_trickled_byte_by_byte_complete_and_hold_nobody_up() {
    const SLOW: usize = 100;
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let slow: Vec<_> = (0..SLOW)
        .map(|i| {
            let addr = w.addr.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                s.set_nodelay(true).unwrap();
                let req = walrus::resp::write::command([
                    "SET".to_string(),
                    format!("slow:{i}"),
                    format!("value-{i}"),
                ]);
                for b in req.iter() {
                    s.write_all(&[*b]).unwrap();
                    // Pacing the attack, not synchronization.
                    std::thread::sleep(Duration::from_millis(2));
                }
                s.set_read_timeout(Some(START_TIMEOUT)).unwrap();
                let mut reply = [0u8; 5];
                s.read_exact(&mut reply).unwrap();
                assert_eq!(&reply, OK);
            })
        })
        .collect();
    let mut c = Raw::connect(&w.addr);
    let mut n = 0u64;
    while slow.iter().any(|t| !t.is_finished()) {
        n += 1;
        assert_eq!(c.cmd(&["INCR", "fast"]), format!(":{n}\r\n").into_bytes());
    }
    for t in slow {
        t.join().unwrap();
    }
    for i in 0..SLOW {
        assert_eq!(
            c.cmd(&["GET", &format!("slow:{i}")]),
            bulk(format!("value-{i}"))
        );
    }
}

/// 50 clients each write a pipeline of increments and vanish in the middle of it, some
/// with a request cut in half, some with a reset. Nothing they leave behind stays: every
/// key they touched can be read (no write left marked dirty), no reply stays held, and
/// each counter holds at most what its client sent.
#[test]
fn clients_that_vanish_mid_pipeline_leave_nothing_behind() {
    const CLIENTS: usize = 50;
    const INCRS: usize = 2_000;
    let v = Valkey::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .upstream(&v.addr())
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut rng = Rng(0x5eed_cafe);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let addr = w.addr.clone();
            let cut = 1 + rng.below(INCRS as u64 * 20) as usize;
            let reset = rng.below(2) == 0;
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for _ in 0..INCRS {
                    out.extend_from_slice(&walrus::resp::write::command([
                        "INCR".to_string(),
                        format!("vanish:{i}"),
                    ]));
                }
                let cut = cut.min(out.len() - 1);
                let mut s = TcpStream::connect(&addr).unwrap();
                s.write_all(&out[..cut]).unwrap();
                if reset {
                    // SO_LINGER 0: close sends a reset, dropping what was not read.
                    let linger = libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    };
                    use std::os::fd::AsRawFd;
                    unsafe {
                        libc::setsockopt(
                            s.as_raw_fd(),
                            libc::SOL_SOCKET,
                            libc::SO_LINGER,
                            &linger as *const _ as *const libc::c_void,
                            std::mem::size_of::<libc::linger>() as u32,
                        )
                    };
                }
                drop(s);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = Raw::connect(&w.addr);
    for i in 0..CLIENTS {
        let r = c.cmd(&["GET", &format!("vanish:{i}")]);
        let value = match r.as_slice() {
            b"$-1\r\n" => 0,
            r => String::from_utf8_lossy(r)
                .lines()
                .nth(1)
                .and_then(|l| l.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("GET vanish:{i}: {}", show(r))),
        };
        assert!(value <= INCRS, "vanish:{i} = {value}");
    }
    // A keyspace-wide read waits for every write still in flight: it answers.
    assert!(c.cmd(&["DBSIZE"]).starts_with(b":"));
    let deadline = Instant::now() + START_TIMEOUT;
    while metric(&metrics, "walrus_held_replies") != 0.0
        || metric(&metrics, "walrus_dirty_keys") != 0.0
    {
        assert!(Instant::now() < deadline, "replies or marks left behind");
        // The gauges are set at each scrape: poll them.
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(&metrics, "walrus_clients_connected"), 1.0);
}

/// One client's reply over walrus's limits (nested deeper than `proxy.max_reply_depth`, or
/// larger than `proxy.max_reply_bytes`; Valkey answers both) costs that client alone: it
/// gets an error naming the limit, and another client's 20 INCRs, in flight behind it on the
/// pooled connection they share, all get their own replies; the connection stays. (walrus
/// dropped the connection: the INCRs in flight were answered "the command may or may not
/// have run", although every one of them ran, and a client that retried counted twice.)
#[test]
fn a_reply_over_the_limits_costs_its_client_alone() {
    let v = Valkey::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[proxy]\nmax_reply_bytes = 1048576\n")
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(direct.cmd(&["SET", "big", &"b".repeat(2 << 20)]), OK);
    let deep = "local r = 1 for i = 1, 200 do r = {r} end return r";
    let large = "return redis.call('GET', 'big')";
    for (round, (script, limit)) in [(deep, "max_reply_depth"), (large, "max_reply_bytes")]
        .into_iter()
        .enumerate()
    {
        // Valkey holds what may write (EVAL, INCR) until CLIENT UNPAUSE: the INCRs reach it
        // behind the script, on the connection both clients share.
        assert_eq!(direct.cmd(&["CLIENT", "PAUSE", "60000", "WRITE"]), OK);
        let mut refused = Raw::connect(&w.addr);
        refused.send_raw(&walrus::resp::write::command(["EVAL", script, "0"]));
        await_blocked_client(&mut direct);
        let incr = walrus::resp::write::command(["INCR", &format!("n{round}")]);
        let mut other = Raw::connect(&w.addr);
        other.send_raw(&incr.repeat(20));
        // A new client's first 4 requests go at once (its window).
        await_query_buffer(&mut direct, 4 * incr.len());
        assert_eq!(direct.cmd(&["CLIENT", "UNPAUSE"]), OK);
        let r = show(&refused.read_frame());
        assert!(
            r.starts_with("-ERR walrus: upstream reply") && r.contains(limit),
            "{r}"
        );
        assert_eq!(
            String::from_utf8_lossy(&(0..20).flat_map(|_| other.read_frame()).collect::<Vec<_>>()),
            String::from_utf8_lossy(&incr_replies(20))
        );
        assert_eq!(refused.cmd(&["EVAL", "return 1", "0"]), b":1\r\n");
    }
    assert_eq!(metric(&metrics, "walrus_upstream_reconnects_total"), 0.0);
}

/// Returns once a client of Valkey has `bytes` or more read and not yet run (CLIENT LIST's
/// `qbuf`).
fn await_query_buffer(valkey: &mut Raw, bytes: usize) {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let list = String::from_utf8_lossy(&valkey.cmd(&["CLIENT", "LIST"])).to_string();
        let most = list
            .split(' ')
            .filter_map(|f| f.strip_prefix("qbuf=")?.parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        if most >= bytes {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no client of Valkey has {bytes} bytes waiting: {list}"
        );
    }
}

/// A client that sends its whole pipeline before it reads a reply (redis-py's
/// `Pipeline.execute()`, bulk loads and batch reads): 400,000 GETs of a 40-byte value, 8 MB
/// of requests, then every reply. walrus reads on while the replies pile up, as Valkey
/// does, and the client gets every one. (walrus stopped reading it once 1 MiB of its replies
/// was unwritten, while the client read nothing until its send was done: neither side moved
/// again, and no limit ended it.)
#[test]
fn a_pipeline_sent_whole_before_its_replies_are_read_is_served() {
    const GETS: usize = 400_000;
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    let value = "v".repeat(40);
    assert_eq!(c.cmd(&["SET", "k", &value]), OK);
    let pipeline = walrus::resp::write::command(["GET", "k"]).repeat(GETS);
    c.stream.set_write_timeout(Some(START_TIMEOUT)).unwrap();
    c.stream
        .write_all(&pipeline)
        .expect("walrus stopped reading the pipeline");
    let reply = bulk(&value);
    let mut replies = vec![0; reply.len() * GETS];
    c.stream.read_exact(&mut replies).unwrap();
    for (i, r) in replies.chunks(reply.len()).enumerate() {
        assert!(r == reply, "reply {i}: {}", show(r));
    }
}

/// The same with transactions in it (MULTI is a barrier: every earlier reply must have
/// arrived before it runs): 8 of them, each behind a read of a 2 MiB value (more than the
/// sockets between walrus and the client hold), then 400,000 reads of a small one. A
/// barrier waits for Valkey, never for the client to read, which it does only once its send
/// is done. (It waited for the client once the replies before it filled the sockets:
/// neither side moved again.)
#[test]
fn a_pipeline_with_transactions_sent_whole_before_its_replies_are_read_is_served() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    let big = "b".repeat(2 << 20);
    assert_eq!(c.cmd(&["SET", "big", &big]), OK);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    let block = [&["GET", "big"][..], &["MULTI"], &["INCR", "n"], &["EXEC"]]
        .iter()
        .flat_map(|a| walrus::resp::write::command(a.iter()).to_vec())
        .collect::<Vec<u8>>();
    let pipeline = [
        block.repeat(8),
        walrus::resp::write::command(["GET", "k"]).repeat(400_000),
    ]
    .concat();
    let mut want: Vec<u8> = (1..=8)
        .flat_map(|i| {
            [
                bulk(&big),
                format!("+OK\r\n+QUEUED\r\n*1\r\n:{i}\r\n").into_bytes(),
            ]
            .concat()
        })
        .collect();
    want.extend_from_slice(&bulk("v").repeat(400_000));
    c.stream.set_write_timeout(Some(START_TIMEOUT)).unwrap();
    c.stream
        .write_all(&pipeline)
        .expect("walrus stopped reading the pipeline");
    let mut replies = vec![0; want.len()];
    c.stream.read_exact(&mut replies).unwrap();
    assert!(replies == want, "the replies differ");
}

/// A client that never reads and keeps sending is read on, and closed once what walrus holds
/// for it (its unwritten replies and the requests it sent meanwhile) reaches
/// `proxy.max_output_bytes`, with its reason: a log line and
/// `walrus_clients_output_closed_total`. Another client is served all along. (walrus stopped
/// reading it and kept it paused for good: its sends blocked, and nothing said why.)
#[test]
fn a_client_that_never_reads_and_keeps_sending_is_closed_at_its_output_limit() {
    let v = Valkey::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[proxy]\nmax_output_bytes = 4194304\n")
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut c = Raw::connect(&w.addr);
    let value = "v".repeat(1 << 10);
    assert_eq!(c.cmd(&["SET", "k", &value]), OK);
    let hostile = connect_slow(&w.addr, 4096).unwrap();
    let writer = std::thread::spawn(move || {
        let gets = walrus::resp::write::command(["GET", "k"]).repeat(64);
        while (&hostile).write_all(&gets).is_ok() {}
    });
    let line = w.proc.wait_line(
        "closed a client that does not read its replies",
        START_TIMEOUT,
    );
    assert!(line.contains("proxy.max_output_bytes"), "{line}");
    writer.join().unwrap();
    assert_eq!(metric(&metrics, "walrus_clients_output_closed_total"), 1.0);
    assert_eq!(c.cmd(&["GET", "k"]), bulk(&value));
}
