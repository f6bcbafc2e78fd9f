//! The durability rule's corners, against a real Valkey with a slowed journal: scripts'
//! undeclared keys, data shown by keyless commands, the replication stream, write marks
//! that must not leak when connections break, and WAIT / WAITAOF counting walrus.
use crate::common;
use common::*;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The journal and the gate still take writes: one is acknowledged and read back.
fn writes_still_work(c: &mut Raw) {
    assert_eq!(c.cmd(&["SET", "after", "1"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["GET", "after"]), b"$1\r\n1\r\n");
}

#[test]
fn a_scripts_undeclared_keys_are_dirty_for_every_reader() {
    let v = Valkey::start();
    let w = Walrus::slow(&v, JOURNAL_DELAY_MS);
    let mut writer = Raw::connect(&w.addr);
    let mut direct = Raw::connect(&v.addr());
    run_unjournaled(
        &mut writer,
        &[
            "EVAL",
            "redis.call('set', KEYS[1], 1); redis.call('select', 5); redis.call('set', 'x', 'new'); return 1",
            "1",
            "a",
        ],
        &mut direct,
        &["GET", "a"],
        b"$1\r\n1\r\n",
    );
    // The script wrote `x` in database 5 without declaring it.
    let reads: [&[&str]; 2] = [
        &["GET", "x"],
        &["EVAL_RO", "return redis.call('get', 'x')", "0"],
    ];
    let mut readers = Vec::new();
    for read in reads {
        let mut reader = Raw::connect(&w.addr);
        assert_eq!(reader.cmd(&["SELECT", "5"]), b"+OK\r\n");
        send(&mut reader, read);
        readers.push((read, reader));
    }
    for (read, reader) in &readers {
        assert!(
            !replied_within(reader, EARLY),
            "{read:?} answered before the script's write was durable"
        );
    }
    for (_, mut reader) in readers {
        assert_eq!(reader.read_frame(), b"$3\r\nnew\r\n");
    }
    assert_eq!(writer.read_frame(), b":1\r\n");
}

/// Data shown by a keyless command waits for every pending write; so do counts and sizes of
/// the writes Valkey ran (INFO stats, memory, commandstats, replication offsets, CLIENT LIST's
/// buffers): a crash can still lose what they count.
#[test]
fn keyless_commands_that_show_data_wait_and_the_others_do_not() {
    let v = Valkey::start_with(&["--enable-debug-command", "yes"]);
    let w = Walrus::slow(&v, JOURNAL_DELAY_MS);
    let mut writer = Raw::connect(&w.addr);
    let mut direct = Raw::connect(&v.addr());
    run_unjournaled(
        &mut writer,
        &["SET", "k", "v"],
        &mut direct,
        &["EXISTS", "k"],
        b":1\r\n",
    );
    let mut free = Raw::connect(&w.addr);
    for cmd in [
        &["INFO", "server"][..],
        &["INFO", "clients", "cpu"],
        &["PING"],
        &["CONFIG", "GET", "maxmemory"],
        &["TIME"],
        &["ECHO", "e"],
        &["COMMAND", "COUNT"],
        &["CLIENT", "ID"],
        &["PUBLISH", "ch", "m"],
        &["SLOWLOG", "LEN"],
        &["CLUSTER", "INFO"],
        &["CLUSTER", "KEYSLOT", "k"],
    ] {
        send(&mut free, cmd);
        assert!(replied_within(&free, Duration::from_secs(10)), "{cmd:?}");
        free.read_frame();
        // Answered while the write still waits: not held behind it.
        assert!(
            !replied_within(&writer, Duration::from_millis(1)),
            "{cmd:?} waited for the write to be durable"
        );
    }
    // COMMANDLOG (Valkey 8.1) shows a large write's arguments; MEMORY STATS counts keys;
    // the others count or size the writes Valkey ran.
    let mut shows: Vec<&[&str]> = vec![
        &["INFO", "keyspace"],
        &["INFO"],
        &["INFO", "server", "stats"],
        &["INFO", "memory"],
        &["INFO", "persistence"],
        &["INFO", "commandstats"],
        &["INFO", "replication"],
        &["ROLE"],
        &["CLIENT", "LIST"],
        &["CLIENT", "INFO"],
        &["MEMORY", "MALLOC-STATS"],
        &["LATENCY", "HISTOGRAM", "set"],
        &["SLOWLOG", "GET"],
        &["DEBUG", "DIGEST"],
        &["MEMORY", "STATS"],
        &["CLUSTER", "COUNTKEYSINSLOT", "7629"],
        &["CLUSTER", "GETKEYSINSLOT", "7629", "1"],
    ];
    if server::under_test().since((8, 0), None) {
        shows.push(&["CLUSTER", "SLOT-STATS", "SLOTSRANGE", "7629", "7629"]);
    }
    if server::under_test().since((8, 1), None) {
        shows.push(&["COMMANDLOG", "GET", "10", "large-request"]);
    }
    let mut readers: Vec<_> = shows
        .iter()
        .map(|cmd| {
            let mut reader = Raw::connect(&w.addr);
            send(&mut reader, cmd);
            (cmd, reader)
        })
        .collect();
    // One window for all of them: checked one after another, a later one would otherwise be
    // looked at after the journal write had completed.
    let window = std::time::Instant::now() + EARLY;
    for (cmd, reader) in readers.iter_mut() {
        let left = window
            .saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_millis(1));
        if replied_within(reader, left) {
            panic!(
                "{cmd:?} answered before the write was durable: {:.200}",
                show(&reader.read_frame())
            );
        }
    }
    for (_, mut reader) in readers {
        reader.read_frame();
    }
    assert_eq!(writer.read_frame(), b"+OK\r\n");
}

#[test]
fn clients_cannot_open_a_replication_stream() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    for cmd in [
        &["SYNC"][..],
        &["PSYNC", "?", "-1"],
        &["REPLCONF", "listening-port", "1"],
    ] {
        let r = c.cmd(cmd);
        assert!(
            r.starts_with(b"-ERR walrus: SYNC, PSYNC and REPLCONF are refused"),
            "{cmd:?}: {}",
            show(&r)
        );
    }
    assert_eq!(
        c.cmd(&["PING"]),
        b"+PONG\r\n",
        "the connection stays usable"
    );
}

#[test]
fn connections_killed_under_load_leave_no_write_pending_forever() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).with_metrics().start();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|t| {
            let (addr, stop) = (w.addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c = Raw::connect(&addr);
                let mut batch = Vec::new();
                for i in 0..50 {
                    batch.extend_from_slice(&walrus::resp::write::command([
                        "SET".to_string(),
                        format!("k:{t}:{i}"),
                        "v".repeat(100),
                    ]));
                }
                while !stop.load(Ordering::Relaxed) {
                    c.send_raw(&batch);
                    for _ in 0..50 {
                        // Errors are expected while connections are killed.
                        if c.try_read_frame().is_err() {
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    let mut direct = Raw::connect(&v.addr());
    for _ in 0..30 {
        direct.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        // Chaos pacing, not synchronization: let the load reconnect between kills.
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    // Every write walrus ever marked settles: keyspace-wide reads answer.
    let mut c = Raw::connect(&w.addr);
    let r = c.cmd(&["DBSIZE"]);
    assert!(r.starts_with(b":"), "{}", show(&r));
    // The kills may have taken checkpoint connections too (they are ordinary clients until
    // their PSYNC), and the load may have filled the ring meanwhile: once a checkpoint
    // releases it, writes are accepted again.
    w.await_writable();
    writes_still_work(&mut c);
}

#[test]
fn wait_counts_walrus_once_it_has_a_write_and_waitaof_once_it_is_on_disk() {
    let v = Valkey::start();
    let w = Walrus::slow(&v, JOURNAL_DELAY_MS);
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(direct.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    // walrus has received the write (ACK) long before its journal write completes.
    assert_eq!(direct.cmd(&["WAIT", "1", "10000"]), b":1\r\n");
    if !server::has(server::under_test().redis_7_2(), "WAITAOF") {
        return;
    }
    assert_eq!(
        direct.cmd(&["WAITAOF", "0", "1", "1"]),
        b"*2\r\n:0\r\n:0\r\n",
        "WAITAOF counted walrus before its journal had the write"
    );
    // Once durable (FACK), WAITAOF counts it.
    assert_eq!(
        direct.cmd(&["WAITAOF", "0", "1", "10000"]),
        b"*2\r\n:0\r\n:1\r\n"
    );
    // Through walrus, the reply itself already waits for the journal.
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k2", "v"]), b"+OK\r\n");
    assert_eq!(
        c.cmd(&["WAITAOF", "0", "1", "10000"]),
        b"*2\r\n:0\r\n:1\r\n"
    );
}

/// Valkey hears walrus's offsets every second and when it asks (GETACK, for a client in
/// WAIT or WAITAOF), not at every group commit: an ACK per durable advance cost a send and
/// a Valkey command per write under light load.
#[test]
fn walrus_acknowledges_valkey_when_asked_not_at_every_write() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut direct = Raw::connect(&v.addr());
    let replconf_calls = |direct: &mut Raw| -> u64 {
        let info = String::from_utf8(direct.cmd(&["INFO", "commandstats"])).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_replconf:calls="))
            .map_or(0, |l| l.split(',').next().unwrap().parse().unwrap())
    };
    let before = replconf_calls(&mut direct);
    let mut c = Raw::connect(&w.addr);
    // One at a time: each is its own durable advance.
    let writes = 500;
    let started = std::time::Instant::now();
    for i in 0..writes {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), "v"]), b"+OK\r\n");
    }
    let acks = replconf_calls(&mut direct) - before;
    // One a second, plus the one sent as the link settles.
    let allowed = started.elapsed().as_secs() + 3;
    assert!(
        acks <= allowed,
        "{acks} REPLCONF ACKs for {writes} writes in {:?}",
        started.elapsed()
    );
    // Asked, walrus answers at once: WAIT and WAITAOF count it.
    assert_eq!(direct.cmd(&["WAIT", "1", "10000"]), b":1\r\n");
    if !server::has(server::under_test().redis_7_2(), "WAITAOF") {
        return;
    }
    assert_eq!(
        direct.cmd(&["WAITAOF", "0", "1", "10000"]),
        b"*2\r\n:0\r\n:1\r\n"
    );
}

#[test]
fn no_single_write_can_stop_the_journal() {
    // The test journal takes entries of at most 8 MiB (TEST_JOURNAL).
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    let big = "x".repeat(9 << 20);
    // Known up front: refused before it reaches Valkey.
    let r = c.cmd(&["SET", "big", &big]);
    assert!(
        r.starts_with(b"-ERR walrus: this write is")
            && show(&r).contains("journal.max_entry_bytes"),
        "{}",
        show(&r)
    );
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(
        direct.cmd(&["EXISTS", "big"]),
        b":0\r\n",
        "Valkey never saw it"
    );
    // Known only from its effects: a script writing 9 MiB. A full resync's RDB covers it,
    // and the journal goes on.
    let r = c.cmd(&[
        "EVAL",
        "redis.call('set', KEYS[1], string.rep('y', 9 * 1024 * 1024)); return 1",
        "1",
        "made",
    ]);
    assert_eq!(r, b":1\r\n");
    w.proc.wait_line("taking a full resync", START_TIMEOUT);
    assert_eq!(c.cmd(&["STRLEN", "made"]), b":9437184\r\n");
    writes_still_work(&mut c);
}

#[test]
fn a_script_declaring_no_writes_does_not_hold_up_clean_reads() {
    let v = Valkey::start();
    let w = Walrus::slow(&v, JOURNAL_DELAY_MS);
    let mut writer = Raw::connect(&w.addr);
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(writer.cmd(&["SET", "clean", "c"]), b"+OK\r\n");
    run_unjournaled(
        &mut writer,
        &["SET", "k", "v"],
        &mut direct,
        &["EXISTS", "k"],
        b":1\r\n",
    );
    // The script may read anything, so it waits for the pending write; it cannot write, so
    // it dirties nothing: a read of a clean key sent after it is answered at once.
    let calls = |d: &mut Raw| {
        let info = String::from_utf8(d.cmd(&["INFO", "commandstats"])).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_eval:calls="))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = calls(&mut direct);
    let mut script = Raw::connect(&w.addr);
    send(
        &mut script,
        &[
            "EVAL",
            "#!lua flags=no-writes\nreturn redis.call('get', KEYS[1])",
            "1",
            "k",
        ],
    );
    while calls(&mut direct) == before {}
    let mut reader = Raw::connect(&w.addr);
    send(&mut reader, &["GET", "clean"]);
    assert!(
        replied_within(&reader, Duration::from_secs(1)),
        "a clean read waited behind a script that cannot write"
    );
    assert_eq!(reader.read_frame(), b"$1\r\nc\r\n");
    assert!(
        !replied_within(&script, EARLY),
        "the script read k before it was durable"
    );
    assert_eq!(script.read_frame(), b"$1\r\nv\r\n");
    assert_eq!(writer.read_frame(), b"+OK\r\n");
}

/// Valkey's count of `CLIENT KILL` calls.
fn client_kills(direct: &mut Raw) -> u64 {
    let info = String::from_utf8(direct.cmd(&["INFO", "commandstats"])).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_client|kill:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// walrus gives up an upstream connection that owes replies and hears nothing from Valkey
/// for `upstream.reply_timeout_ms` (here its least, 2 s) while a script keeps Valkey busy
/// (for 10 s of CPU); it asks Valkey to close the connection until Valkey can.
const STALL: &str = "[upstream]\nreply_timeout_ms = 2000\n";
/// Valkey answers nothing but `-BUSY` once a script has run this long: not in these tests.
const NOT_BUSY: [&str; 2] = ["--busy-reply-threshold", "60000"];

/// [`STALL`] for a managed Valkey.
fn managed_stall() -> String {
    format!("{STALL}extra_args = {NOT_BUSY:?}\n")
}

/// When walrus drops an upstream socket itself (here: Valkey stopped answering on it),
/// Valkey may still hold commands of it, read but not run. The offset that settles the
/// connection's writes must be asked only once Valkey has closed that client, or those
/// commands run after it and their effects are read before the journal has them. Whether
/// they do is a race inside Valkey's event loop, so the test checks the step that closes
/// the race: walrus has Valkey kill the dropped client before it asks the offset.
#[test]
fn a_socket_walrus_drops_itself_is_closed_in_valkey_before_its_writes_settle() {
    let v = Valkey::start_with(&NOT_BUSY);
    let w = Walrus::build().upstream(&v.addr()).config(STALL).start();
    let mut direct = Raw::connect(&v.addr());
    let kills = client_kills(&mut direct);
    let mut c = Raw::connect(&w.addr);
    stall_between_writes(&mut c);
    await_settled(&mut c);
    assert_eq!(
        client_kills(&mut direct),
        kills + 1,
        "walrus did not close the dropped connection on Valkey's side: {}",
        w.proc.log_text()
    );
    writes_still_work(&mut c);
}

/// The same on a Unix socket (the managed Valkey's only listener), where every client has
/// the same address, so `CLIENT KILL ADDR` would close all of walrus's connections or none:
/// walrus names the dropped connection by its `CLIENT ID`, and Valkey closes that one only.
/// Another identity's pooled connection (a RESP3 client's) and the replica link stay.
#[test]
fn on_a_unix_socket_the_dropped_socket_alone_is_closed_in_valkey_by_its_id() {
    let w = Walrus::build().config(&managed_stall()).start();
    let mut direct = Raw::connect(&managed_valkey_addr(&w.addr));
    let mut resp3 = Raw::connect(&w.addr);
    assert!(resp3.cmd(&["HELLO", "3"]).starts_with(b"%"));
    assert_eq!(resp3.cmd(&["SET", "r3", "1"]), b"+OK\r\n");
    let others = resp3_clients(&mut direct);
    assert_eq!(others.len(), 1, "one RESP3 pooled connection: {others:?}");
    let links = w.proc.log_text().matches("replica link attached").count();
    let kills = client_kills(&mut direct);
    let mut c = Raw::connect(&w.addr);
    stall_between_writes(&mut c);
    await_settled(&mut c);
    assert_eq!(
        client_kills(&mut direct),
        kills + 1,
        "walrus did not close the dropped connection on Valkey's side: {}",
        w.proc.log_text()
    );
    assert_eq!(
        resp3_clients(&mut direct),
        others,
        "the other identity's pooled connection was closed too"
    );
    assert_eq!(resp3.cmd(&["GET", "r3"]), b"$1\r\n1\r\n");
    assert_eq!(
        w.proc.log_text().matches("replica link attached").count(),
        links,
        "the replica link was closed too: {}",
        w.proc.log_text()
    );
    writes_still_work(&mut c);
}

/// The same for a client whose ACL user may not run `CLIENT ID`: walrus asks it as its own
/// user, before the client's AUTH (issue 25's review: the guard was missing for such users).
#[test]
fn a_client_user_without_client_id_is_still_closed_in_valkey_by_its_id() {
    let w = Walrus::build().config(&managed_stall()).start();
    let mut direct = Raw::connect(&managed_valkey_addr(&w.addr));
    let r = direct.cmd(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-client|id",
    ]);
    assert_eq!(r, b"+OK\r\n");
    let kills = client_kills(&mut direct);
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["AUTH", "app", "pw"]), b"+OK\r\n");
    stall_between_writes(&mut c);
    await_settled(&mut c);
    assert_eq!(
        client_kills(&mut direct),
        kills + 1,
        "walrus did not close the dropped connection on Valkey's side: {}",
        w.proc.log_text()
    );
    // The connection acts as the client's user, not walrus's.
    let r = c.cmd(&["ACL", "WHOAMI"]);
    assert_eq!(r, b"$3\r\napp\r\n", "{}", show(&r));
    writes_still_work(&mut c);
}

/// Sends `SET before`, a script that keeps Valkey busy ([`STALL`]), and `SET after` in one
/// write: walrus gives the connection up while the script and `SET after` are owed, and
/// they get its error.
fn stall_between_writes(c: &mut Raw) {
    // (TIME inside a script is the time the script started.)
    let busy = "local s = os.clock() while os.clock() - s < 10 do end return 1";
    let pipeline: Vec<u8> = [
        &["SET", "before", "1"][..],
        &["EVAL", busy, "0"],
        &["SET", "after", "1"],
    ]
    .iter()
    .flat_map(|a| walrus::resp::write::command(a.iter()).to_vec())
    .collect();
    c.send_raw(&pipeline);
    let replies: Vec<String> = (0..3).map(|_| show(&c.read_frame())).collect();
    assert!(
        replies[1..].iter().all(|r| r.starts_with("-ERR walrus:")),
        "{replies:?}"
    );
}

/// Returns once a keyspace-wide read answers, which it does once the writes of the
/// connection walrus dropped have settled, after Valkey closed it. Until the script ends,
/// the pool's new connection cannot be set up: requests get that error meanwhile.
fn await_settled(c: &mut Raw) {
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    loop {
        let r = c.cmd(&["DBSIZE"]);
        if r.starts_with(b":") {
            return;
        }
        assert!(
            r.starts_with(b"-ERR walrus: Valkey is unavailable")
                && std::time::Instant::now() < deadline,
            "{}",
            show(&r)
        );
    }
}

/// A reply that had arrived when its connection broke is a real outcome. A session with its
/// own connection sends a write and `BLPOP q 0` in one write (the ROLE walrus sends behind
/// them waits for the BLPOP); Valkey answers the write and blocks; someone kills the
/// connection in Valkey. The write is acknowledged once the journal covers Valkey's offset
/// asked afterwards, of the same Valkey; the BLPOP, unanswered, gets the error of a lost
/// connection. (Both got that error: the write's `+OK` had arrived, and was dropped.)
#[test]
fn a_reply_that_arrived_before_its_connection_broke_is_acknowledged() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    // A command that may block gives the session its own connection.
    assert_eq!(c.cmd(&["BLPOP", "q", "0.01"]), b"*-1\r\n");
    let batch: Vec<u8> = [&["SET", "before", "1"][..], &["BLPOP", "q", "0"]]
        .iter()
        .flat_map(|a| walrus::resp::write::command(a.iter()).to_vec())
        .collect();
    c.send_raw(&batch);
    let mut direct = Raw::connect(&v.addr());
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    let id = loop {
        let list = String::from_utf8(direct.cmd(&["CLIENT", "LIST"])).unwrap();
        let blocked = list
            .lines()
            .find(|l| l.split(' ').any(|f| f == "cmd=blpop"));
        if let Some(id) = blocked.and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id="))) {
            break id.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the BLPOP never blocked: {list}"
        );
    };
    assert_eq!(direct.cmd(&["CLIENT", "KILL", "ID", &id]), b":1\r\n");
    assert_eq!(show(&c.read_frame()), "+OK⏎");
    let lost = show(&c.read_frame());
    assert!(
        lost.contains("connection to Valkey lost before the reply"),
        "{lost}"
    );
    assert_eq!(
        Raw::connect(&w.addr).cmd(&["GET", "before"]),
        b"$1\r\n1\r\n"
    );
}

/// The ids of Valkey's RESP3 clients (`CLIENT LIST`).
fn resp3_clients(direct: &mut Raw) -> Vec<String> {
    let list = String::from_utf8(direct.cmd(&["CLIENT", "LIST"])).unwrap();
    list.lines()
        .filter(|l| l.split(' ').any(|f| f == "resp=3"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// After a diskless full sync Valkey puts its replica online only once it reaps the child
/// that sent the RDB (on an ACK, or at its next cron tick). Until then
/// `min-replicas-to-write` refuses writes with `-NOREPLICAS`: walrus must not take clients
/// before Valkey counts it. The window is widest when walrus stores the RDB at once (a
/// tmpfs) and the machine is busy (several walruses starting together).
#[test]
fn the_first_write_after_a_full_sync_is_acknowledged() {
    let Some(fs) = Tmpfs::mount(256, false) else {
        return;
    };
    for round in 0..3 {
        let starts: Vec<_> = (0..4)
            .map(|i| {
                let data = fs.path().join(format!("data-{round}-{i}"));
                std::thread::spawn(move || {
                    let w = Walrus::build().data(&data).start();
                    let mut c = Raw::connect(&w.addr);
                    show(&c.cmd(&["SET", "first", "1"]))
                })
            })
            .collect();
        for s in starts {
            assert_eq!(s.join().unwrap(), "+OK⏎");
        }
    }
}

/// A write walrus refuses while a transaction queues (here: larger than one journal entry)
/// aborts the transaction as Valkey's own queue-time errors do: EXEC answers `-EXECABORT`
/// and nothing runs. Valkey never saw the refused write, so before this EXEC ran the rest.
#[test]
fn a_refusal_while_queueing_aborts_the_transaction_as_valkey_does() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    let big = "x".repeat(9 << 20); // over the tests' 8 MiB journal entries
    assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["SET", "a", "1"]), b"+QUEUED\r\n");
    let r = c.cmd(&["SET", "b", &big]);
    assert!(r.starts_with(b"-ERR walrus: this write is"), "{}", show(&r));
    assert_eq!(c.cmd(&["INCR", "n"]), b"+QUEUED\r\n");
    let aborted = c.cmd(&["EXEC"]);
    // Valkey's own answer after a queue-time error.
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(direct.cmd(&["MULTI"]), b"+OK\r\n");
    assert!(direct
        .cmd(&["NOSUCHCOMMAND"])
        .starts_with(b"-ERR unknown command"));
    assert_eq!(show(&aborted), show(&direct.cmd(&["EXEC"])));
    assert_eq!(c.cmd(&["EXISTS", "a", "b", "n"]), b":0\r\n");
    // Out of the transaction, upstream too: the next one commits.
    assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["SET", "a", "2"]), b"+QUEUED\r\n");
    assert_eq!(c.cmd(&["EXEC"]), b"*1\r\n+OK\r\n");
    assert_eq!(c.cmd(&["GET", "a"]), b"$1\r\n2\r\n");
    // walrus's own refusals of SYNC and CLIENT REPLY OFF abort it too, as Valkey's do.
    for refused in [&["SYNC"][..], &["CLIENT", "REPLY", "OFF"]] {
        assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
        assert_eq!(c.cmd(&["SET", "c", "1"]), b"+QUEUED\r\n");
        assert!(c.cmd(refused).starts_with(b"-ERR"), "{refused:?}");
        assert!(c.cmd(&["EXEC"]).starts_with(b"-EXECABORT"), "{refused:?}");
        assert_eq!(c.cmd(&["EXISTS", "c"]), b":0\r\n", "{refused:?}");
    }
    // DISCARD after a refusal is a plain DISCARD.
    assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
    assert!(c.cmd(&["SET", "b", &big]).starts_with(b"-ERR walrus"));
    assert_eq!(c.cmd(&["DISCARD"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["SET", "after", "1"]), b"+OK\r\n");
}

/// A worker waiting in `BLPOP jobs 0` holds up no one: a read of its key and a keyspace-wide
/// read from other clients answer at once, as Valkey's do. (A blocking write used to be a
/// pending write until it was served: both waited for the producer, here for ever.) When a
/// producer pushes, the worker gets the job, once the journal covers the pop.
#[test]
fn a_client_waiting_in_a_blocking_pop_holds_up_no_one_elses_reads() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut worker = Raw::connect(&w.addr);
    send(&mut worker, &["BLPOP", "jobs", "0"]);
    let mut direct = Raw::connect(&v.addr());
    // Blocked in Valkey: INFO clients counts it.
    await_state("the BLPOP blocked in Valkey", || {
        String::from_utf8_lossy(&direct.cmd(&["INFO", "clients"])).contains("blocked_clients:1")
    });
    let mut other = Raw::connect(&w.addr);
    assert_eq!(other.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    for (cmd, want) in [
        (&["LLEN", "jobs"][..], &b":0\r\n"[..]),
        (&["DBSIZE"], b":1\r\n"),
        (&["GET", "k"], b"$1\r\nv\r\n"),
        (&["EXISTS", "jobs"], b":0\r\n"),
    ] {
        send(&mut other, cmd);
        assert!(
            replied_within(&other, Duration::from_secs(10)),
            "{cmd:?} waited for the blocked BLPOP"
        );
        assert_eq!(show(&other.read_frame()), show(want), "{cmd:?}");
    }
    let mut producer = Raw::connect(&w.addr);
    assert_eq!(producer.cmd(&["RPUSH", "jobs", "j1"]), b":1\r\n");
    assert_eq!(
        show(&worker.read_frame()),
        show(b"*2\r\n$4\r\njobs\r\n$2\r\nj1\r\n")
    );
    assert_eq!(other.cmd(&["LLEN", "jobs"]), b":0\r\n");
    writes_still_work(&mut other);
}

/// External mode, walrus restarted while Valkey ran a write the journal did not have yet:
/// the new walrus continues Valkey's stream, and until the journal holds that write no read
/// shows it (a crash then would lose it). Before, `GET k` answered the new value at once.
#[test]
fn after_a_restart_behind_valkey_reads_wait_for_the_journal_to_catch_up() {
    let v = Valkey::start();
    let data = tempfile::tempdir().unwrap();
    let start = || {
        Walrus::build()
            .upstream(&v.addr())
            .data(data.path())
            .slow_journal(JOURNAL_DELAY_MS)
            .start()
    };
    let mut w = start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v1"]), b"+OK\r\n");
    let mut direct = Raw::connect(&v.addr());
    // v2 runs in Valkey; walrus dies before its journal write completes.
    run_unjournaled(
        &mut c,
        &["SET", "k", "v2"],
        &mut direct,
        &["GET", "k"],
        b"$2\r\nv2\r\n",
    );
    w.proc.signal(libc::SIGKILL);
    w.proc.wait_exit(Duration::from_secs(10)).unwrap();
    let w = start();
    let mut reader = Raw::connect(&w.addr);
    send(&mut reader, &["GET", "k"]);
    assert!(
        !replied_within(&reader, EARLY),
        "GET k answered before the journal held v2"
    );
    assert_eq!(reader.read_frame(), b"$2\r\nv2\r\n");
    writes_still_work(&mut reader);
}

/// A write sent on the same connection after a blocking pop runs only once the pop is
/// served: it must hold up no other client's reads either (it used to take a generation
/// that could not settle until then, and every read held behind a later write waited).
#[test]
fn a_write_queued_behind_a_blocking_pop_holds_up_no_one_elses_reads() {
    let v = Valkey::start();
    let w = Walrus::slow(&v, 300);
    let mut worker = Raw::connect(&w.addr);
    // A pipelining client: a blocking pop, then a write behind it on its connection.
    let mut out = walrus::resp::write::command(["BLPOP", "q", "0"]).to_vec();
    out.extend_from_slice(&walrus::resp::write::command(["SET", "after-pop", "1"]));
    worker.send_raw(&out);
    let mut direct = Raw::connect(&v.addr());
    await_state("the BLPOP blocked in Valkey", || {
        String::from_utf8_lossy(&direct.cmd(&["INFO", "clients"])).contains("blocked_clients:1")
    });
    // Another client's write, then its read of another key held while that write is pending.
    let mut other = Raw::connect(&w.addr);
    assert_eq!(other.cmd(&["SET", "b", "1"]), b"+OK\r\n");
    let mut writer = Raw::connect(&w.addr);
    send(&mut writer, &["SET", "b", "2"]);
    send(&mut other, &["GET", "b"]);
    assert!(
        replied_within(&other, Duration::from_secs(10)),
        "GET b waited for the write queued behind the blocked pop"
    );
    other.read_frame();
    assert_eq!(writer.read_frame(), b"+OK\r\n");
    assert_eq!(Raw::connect(&w.addr).cmd(&["RPUSH", "q", "x"]), b":1\r\n");
    assert_eq!(worker.read_frame(), b"*2\r\n$1\r\nq\r\n$1\r\nx\r\n");
    assert_eq!(worker.read_frame(), b"+OK\r\n");
}

/// walrus never hangs: a reply held longer than `durability.max_hold_ms` (here a journal
/// device that takes 2 s a write, past a bound of 300 ms) gets an error saying its outcome
/// is unknown, and the write's key is shown only once it is durable after all.
#[test]
fn a_reply_held_past_max_hold_gets_an_error_and_the_key_waits_for_the_journal() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[durability]\nmax_hold_ms = 300\n")
        .slow_journal(2000)
        .start();
    let mut c = Raw::connect(&w.addr);
    let r = show(&c.cmd(&["SET", "k", "v"]));
    assert!(
        r.starts_with(
            "-ERR walrus: this write was not journaled within 300 ms (durability.max_hold_ms)"
        ),
        "{r}"
    );
    // The write ran: once the journal has it, reads show it; before, they wait (and past the
    // bound get the error too).
    loop {
        let r = c.cmd(&["GET", "k"]);
        if r == b"$1\r\nv\r\n" {
            break;
        }
        assert!(
            show(&r).starts_with("-ERR walrus: a write this read depends on was not journaled"),
            "{}",
            show(&r)
        );
    }
}
