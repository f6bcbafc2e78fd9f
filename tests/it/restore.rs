//! Restore after any restart, with real processes: walrus (managed mode, the README's way)
//! stopped, killed, or losing its Valkey, comes back with every acknowledged write; the
//! decision table refuses a conflict; a damaged checkpoint is caught; the managed Valkey runs
//! with the settings walrus needs.
use crate::common;
use common::*;

use std::collections::BTreeMap;
use std::time::Duration;

const OK: &[u8] = b"+OK\r\n";

/// What the test wrote and walrus acknowledged: (database, key) -> value as Valkey renders
/// it (a bulk string, or a sorted dump for hashes and lists).
type Model = BTreeMap<(u32, String), Vec<u8>>;

/// A dataset covering several databases, a TTL, a hash, a list, a script that writes a key
/// it does not declare, a transaction, and 48 MiB of overwrites that wrap the test's 16 MiB
/// ring three times (so checkpoints are taken and the journal spans them).
fn write_dataset(addr: &str, round: usize, model: &mut Model) {
    let mut c = Raw::connect(addr);
    let sets: Vec<Vec<String>> = (0..2000)
        .map(|i| vec!["SET".into(), format!("k:{i}"), format!("v:{round}:{i}")])
        .collect();
    pipeline(&mut c, &sets, OK, None);
    for i in 0..2000 {
        model.insert((0, format!("k:{i}")), bulk(format!("v:{round}:{i}")));
    }
    let big = "x".repeat(256 << 10);
    let bigs: Vec<Vec<String>> = (0..192)
        .map(|i| {
            let v = format!("{round}:{i}:{big}");
            vec!["SET".into(), format!("big:{}", i % 8), v]
        })
        .collect();
    pipeline(&mut c, &bigs, OK, None);
    for i in 184..192 {
        model.insert(
            (0, format!("big:{}", i % 8)),
            bulk(format!("{round}:{i}:{big}")),
        );
    }
    assert_eq!(c.cmd(&["SELECT", "3"]), OK);
    assert_eq!(c.cmd(&["SET", "other", &format!("o{round}")]), OK);
    model.insert((3, "other".into()), bulk(format!("o{round}")));
    assert_eq!(c.cmd(&["SET", "ttl", "t", "EX", "1000"]), OK);
    model.insert((3, "ttl".into()), bulk("t"));
    assert_eq!(c.cmd(&["HSET", "h", &format!("f{round}"), "1"]), b":1\r\n");
    assert_eq!(c.cmd(&["RPUSH", "l", &format!("e{round}")])[0], b':');
    // The script's undeclared key ("counter") reaches the journal as Valkey's effects.
    let r = c.cmd(&[
        "EVAL",
        "redis.call('set', KEYS[1], ARGV[1]); return redis.call('incr', 'counter')",
        "1",
        "s",
        &format!("s{round}"),
    ]);
    assert_eq!(show(&r), format!(":{}⏎", round + 1));
    model.insert((3, "s".into()), bulk(format!("s{round}")));
    model.insert((3, "counter".into()), bulk((round + 1).to_string()));
    assert_eq!(c.cmd(&["MULTI"]), OK);
    c.cmd(&["SET", "tx", &format!("t{round}")]);
    c.cmd(&["INCR", "txn"]);
    let r = c.cmd(&["EXEC"]);
    assert!(r.starts_with(b"*2\r\n+OK\r\n:"), "{}", show(&r));
    model.insert((3, "tx".into()), bulk(format!("t{round}")));
    model.insert((3, "txn".into()), bulk((round + 1).to_string()));
    let mut fields = Vec::new();
    let mut elems = Vec::new();
    for r in 0..=round {
        fields.push(format!("f{r}"));
        elems.push(format!("e{r}"));
    }
    model.insert((3, "h".into()), fields.join(",").into_bytes());
    model.insert((3, "l".into()), elems.join(",").into_bytes());
}

/// Every key of the model has its value, TTLs are absolute, and no database holds a key
/// the model does not know.
fn check(addr: &str, model: &Model) {
    let mut c = Raw::connect(addr);
    let mut db = u32::MAX;
    let mut per_db: BTreeMap<u32, usize> = BTreeMap::new();
    for ((d, key), want) in model {
        if *d != db {
            assert_eq!(c.cmd(&["SELECT", &d.to_string()]), OK);
            db = *d;
        }
        *per_db.entry(*d).or_default() += 1;
        let got = match key.as_str() {
            "h" => sorted_words(&c.cmd(&["HKEYS", key])),
            "l" => sorted_words(&c.cmd(&["LRANGE", key, "0", "-1"])),
            _ => c.cmd(&["GET", key]),
        };
        assert!(
            got == *want,
            "db {d} key {key}: got {:.80}, want {:.80}",
            show(&got),
            show(want)
        );
    }
    assert_eq!(c.cmd(&["SELECT", "3"]), OK);
    let ttl = String::from_utf8(c.cmd(&["PTTL", "ttl"])).unwrap();
    let ms: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
    assert!(ms > 0 && ms <= 1_000_000, "the TTL is absolute: PTTL {ms}");
    for (d, n) in per_db {
        assert_eq!(c.cmd(&["SELECT", &d.to_string()]), OK);
        assert_eq!(
            show(&c.cmd(&["DBSIZE"])),
            format!(":{n}⏎"),
            "keys in db {d}"
        );
    }
}

/// The elements of an array reply, sorted and joined by commas.
fn sorted_words(reply: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(reply);
    let mut words: Vec<&str> = text
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.starts_with('$') && !l.is_empty())
        .collect();
    words.sort_by_key(|w| (w.len(), w.to_string()));
    words.join(",").into_bytes()
}

/// `CONFIG GET name` on the server at `addr`: its value.
fn config_get(addr: &str, name: &str) -> String {
    let mut c = Raw::connect(addr);
    let r = String::from_utf8(c.cmd(&["CONFIG", "GET", name])).unwrap();
    // *2 $n name $m value
    r.split("\r\n").nth(4).unwrap_or_default().to_string()
}

#[test]
fn managed_valkey_runs_with_the_settings_walrus_needs() {
    let w = Walrus::build().start();
    let direct = managed_valkey_addr(&w.addr);
    for s in walrus::upstream::settings::SETTINGS {
        let got = config_get(&direct, s.name);
        let got = if s.name == "client-output-buffer-limit" {
            let words: Vec<&str> = got.split_whitespace().collect();
            let i = words
                .iter()
                .position(|w| *w == "replica" || *w == "slave")
                .unwrap_or_else(|| panic!("no replica class in {got:?}"));
            format!("replica {}", words[i + 1..i + 4].join(" "))
        } else {
            got
        };
        assert_eq!(got, s.shown, "managed Valkey's {}", s.name);
    }
    drop(w);
}

#[test]
fn managed_walrus_brings_everything_back_after_sigterm_sigkill_and_a_dead_valkey() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().join("data");
    let mut model = Model::new();

    // 1. Write, SIGTERM, start again.
    let mut w = Walrus::build().data(&data).with_metrics().start();
    let taken = w.checkpoints();
    write_dataset(&w.addr, 0, &mut model);
    w.await_checkpoint(taken);
    check(&w.addr, &model);
    w.proc.signal(libc::SIGTERM);
    assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());
    // A clean stop says nothing alarming: walrus stops its Valkey after its last session,
    // and nothing tries to reach it then.
    let stop = w.proc.log_text();
    let stop = &stop[stop.find("SIGTERM received").expect("the SIGTERM logged")..];
    let warned: Vec<&str> = stop
        .lines()
        .filter(|l| l.contains(" WARN walrus"))
        .collect();
    assert!(warned.is_empty(), "a clean stop warned: {warned:#?}");
    let mut w = Walrus::build().data(&data).start();
    assert!(
        w.proc.log_text().contains("no second full sync"),
        "{}",
        w.proc.log_text()
    );
    check(&w.addr, &model);

    // 2. More writes over the restored data, then SIGKILL: the managed Valkey dies with it.
    write_dataset(&w.addr, 1, &mut model);
    w.kill_with_valkey();
    let w = Walrus::build().data(&data).with_metrics().start();
    check(&w.addr, &model);

    // 3. Only the managed Valkey dies: walrus restores it while it keeps running.
    write_dataset(&w.addr, 2, &mut model);
    let pid = w.kill_valkey_and_await_restore();
    check(&w.addr, &model);
    assert_ne!(valkey_pid(&w.addr), pid);
}

/// An external walrus whose data directory outlives it (in the returned temporary
/// directory), its Valkey, and that Valkey's port.
fn external_walrus() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Valkey,
    String,
    Walrus,
) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let v = Valkey::start();
    let port = v.port.to_string();
    let w = Walrus::build().upstream(&v.addr()).data(&data).start();
    (dir, data, v, port, w)
}

#[test]
fn a_valkey_holding_another_history_is_refused_unless_configured() {
    let (_dir, data, v, port, mut w) = external_walrus();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "ours", "1"]), OK);
    w.proc.signal(libc::SIGTERM);
    assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());
    drop(v);

    // Valkey comes back with data of its own.
    let _v = Valkey::start_with(&["--port", &port]);
    let addr = format!("127.0.0.1:{port}");
    let mut direct = Raw::connect(&addr);
    assert_eq!(direct.cmd(&["SET", "theirs", "2"]), OK);
    let line = refuses_to_start(Some(&addr), "", &data, "(primary) holds");
    assert!(
        line.contains("holds 1 keys of history") && line.contains("on_conflict"),
        "{line}"
    );
    assert_eq!(
        direct.cmd(&["GET", "theirs"]),
        bulk("2"),
        "Valkey untouched"
    );

    // journal-wins: walrus's data replaces Valkey's.
    let w = Walrus::build()
        .upstream(&addr)
        .config("[restore]\non_conflict = \"journal-wins\"\n")
        .data(&data)
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["GET", "ours"]), bulk("1"));
    assert_eq!(c.cmd(&["GET", "theirs"]), b"$-1\r\n");
}

#[test]
fn a_damaged_checkpoint_stops_walrus_naming_the_file() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().join("data");
    let v = Valkey::start();
    let mut w = Walrus::build().upstream(&v.addr()).data(&data).start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    w.proc.signal(libc::SIGTERM);
    assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());
    let rdb = std::fs::read_dir(data.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "rdb"))
        .unwrap();
    let mut bytes = std::fs::read(&rdb).unwrap();
    bytes[12] ^= 0x40;
    std::fs::write(&rdb, &bytes).unwrap();
    let line = refuses_to_start(Some(&v.addr()), "", &data, "fails verification");
    let name = rdb.file_name().unwrap().to_str().unwrap();
    assert!(line.contains(name), "{line}");
}

#[test]
fn walrus_checkpoint_takes_one_now() {
    let v = Valkey::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .upstream(&v.addr())
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    let out = std::process::Command::new(walrus_bin())
        .args(["checkpoint", "--metrics", &metrics])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("checkpoint taken"), "{text}");
    let manifest =
        std::fs::read_to_string(w.data.path().join("data/checkpoints/CHECKPOINT")).unwrap();
    assert!(!manifest.contains("offset = 0\n"), "{manifest}");
}

#[test]
fn external_settings_that_differ_are_logged_or_refused() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let log = w.proc.log_text();
    assert!(log.contains("Valkey's repl-backlog-size is"), "{log}");
    let data = tempfile::tempdir().unwrap();
    refuses_to_start(
        Some(&v.addr()),
        "[upstream]\nstrict_settings = true\n",
        data.path(),
        "walrus: upstream.strict_settings is set",
    );
}

#[test]
fn valkey_ahead_beyond_its_backlog_becomes_the_new_checkpoint() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().join("data");
    let v = Valkey::start_with(&["--repl-backlog-size", "16kb"]);
    let mut w = Walrus::build().upstream(&v.addr()).data(&data).start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "a", "1"]), OK);
    w.proc.signal(libc::SIGTERM);
    assert!(w.proc.wait_exit(Duration::from_secs(30)).unwrap().success());
    // Valkey goes on without walrus, well past what its backlog keeps.
    let mut direct = Raw::connect(&v.addr());
    let value = "d".repeat(1024);
    for i in 0..100 {
        assert_eq!(direct.cmd(&["SET", &format!("d:{i}"), &value]), OK);
    }
    let w = Walrus::build().upstream(&v.addr()).data(&data).start();
    let log = w.proc.log_text();
    assert!(log.contains("decision=Continue"), "{log}");
    assert!(log.contains("full resync: RDB stored durably"), "{log}");
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["GET", "a"]), bulk("1"));
    assert_eq!(c.cmd(&["GET", "d:99"]), bulk(&value));
    let manifest = std::fs::read_to_string(data.join("checkpoints/CHECKPOINT")).unwrap();
    assert!(
        !manifest.contains("offset = 0\n"),
        "the new RDB is the checkpoint: {manifest}"
    );
}

/// A full resync records its RDB as the checkpoint only once every entry journaled before
/// it is durable: its `from_lsn` (the first entry a restore replays) is where the journal's
/// durable end will be after any crash. Recorded earlier, a crash dropped the entries still in
/// flight, the next run numbered its entries from the durable end, below `from_lsn`, and a
/// restore skipped them: acknowledged writes lost.
#[test]
fn a_full_resync_records_its_checkpoint_only_after_the_journal_before_it_is_durable() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().join("data");
    let v = Valkey::start_with(&["--enable-debug-command", "yes"]);
    let port = v.port.to_string();
    let mut w = Walrus::build()
        .upstream(&v.addr())
        .data(&data)
        // Valkey's new history is then adopted with a full resync.
        .config("[restore]\non_conflict = \"valkey-wins\"\n")
        .slow_journal(3000)
        .start();
    // A write journaled, not yet durable (its reply waits for the slow device)...
    let mut c = Raw::connect(&w.addr);
    send(&mut c, &["SET", "in-flight", "1"]);
    let mut direct = Raw::connect(&v.addr());
    while direct.cmd(&["EXISTS", "in-flight"]) != b":1\r\n" {}
    // ... when Valkey changes its history: the link adopts it with a full resync.
    assert_eq!(direct.cmd(&["DEBUG", "CHANGE-REPL-ID"]), OK);
    assert!(direct
        .cmd(&["CLIENT", "KILL", "TYPE", "replica"])
        .starts_with(b":"));
    w.proc.wait_line(
        "full resync: RDB stored durably and recorded",
        START_TIMEOUT,
    );
    w.proc.signal(libc::SIGKILL);
    w.proc
        .wait_exit(std::time::Duration::from_secs(10))
        .unwrap();
    // The next run acknowledges a write, and Valkey is then lost: the restore must bring it.
    let w = Walrus::build()
        .upstream(&v.addr())
        .data(&data)
        .config("[restore]\non_conflict = \"valkey-wins\"\n")
        .with_metrics()
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "acknowledged", "1"]), OK);
    drop(direct);
    drop(v);
    let _v = Valkey::start_with(&["--port", &port]);
    w.proc
        .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
    w.await_attached();
    let mut c = Raw::connect(&w.addr);
    let got = show(&c.cmd(&["GET", "acknowledged"]));
    assert_eq!(got, show(&bulk("1")), "{}", w.proc.log_text());
}

#[test]
fn a_live_restore_is_counted_and_a_conflict_while_running_keeps_clients_out() {
    let v = Valkey::start();
    let port = v.port.to_string();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .upstream(&v.addr())
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "ours", "1"]), OK);
    assert_eq!(http_get(&metrics, "/readyz").0, 200);

    // Valkey restarts empty: restored live, counted in the metrics.
    drop(v);
    let _v = Valkey::start_with(&["--port", &port]);
    w.proc
        .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(body.contains("walrus_restores_total 1"), "{body}");
    assert!(body.contains("walrus_restore_in_progress 0"), "{body}");
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["GET", "ours"]), bulk("1"));
    assert_eq!(http_get(&metrics, "/readyz").0, 200);

    // Valkey comes back with somebody else's data (an RDB it loads at start): walrus keeps
    // clients out (-LOADING), says why, and is not ready.
    let foreign = tempfile::tempdir().unwrap();
    let other = Valkey::start_with(&["--dir", foreign.path().to_str().unwrap()]);
    let mut o = Raw::connect(&other.addr());
    assert_eq!(o.cmd(&["SET", "theirs", "2"]), OK);
    assert_eq!(o.cmd(&["SAVE"]), OK);
    drop(other);
    drop(_v);
    let _v = Valkey::start_with(&["--port", &port, "--dir", foreign.path().to_str().unwrap()]);
    w.proc
        .wait_line("clients get -LOADING until this is resolved", START_TIMEOUT);
    assert_eq!(
        c.cmd(&["GET", "theirs"]),
        b"-LOADING Valkey is loading the dataset in memory\r\n"
    );
    assert_eq!(
        c.cmd(&["SET", "x", "1"]),
        b"-LOADING Valkey is loading the dataset in memory\r\n"
    );
    assert_eq!(http_get(&metrics, "/readyz").0, 503);
}

/// A restore sends Valkey data, not messages: the journal holds every PUBLISH (Valkey
/// propagates them to its replicas), and a subscriber of the Valkey being restored gets none
/// of them, while the data published around them comes back, and the stream keeps its
/// length (the link continues at the journal's end with a partial resync).
#[test]
fn a_restore_replays_no_published_message() {
    let (_dir, data, v, port, mut w) = external_walrus();
    let mut c = Raw::connect(&w.addr);
    for i in 0..20 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), "v"]), OK);
        assert_eq!(c.cmd(&["PUBLISH", "news", &format!("old-{i}")]), b":0\r\n");
        assert_eq!(
            c.cmd(&["SPUBLISH", "shard", &format!("old-{i}")]),
            b":0\r\n"
        );
    }
    let script =
        "redis.call('SET', KEYS[1], 'v') return redis.call('PUBLISH', 'news', 'old-script')";
    assert_eq!(c.cmd(&["EVAL", script, "1", "in-script"]), b":0\r\n");
    w.proc.signal(libc::SIGKILL);
    w.proc.wait_exit(Duration::from_secs(10)).unwrap();
    drop(v);

    // An empty Valkey with subscribers of every kind, then walrus restores it.
    let _v = Valkey::start_with(&["--port", &port]);
    let addr = format!("127.0.0.1:{port}");
    let mut sub = Raw::connect(&addr);
    sub.cmd(&["SUBSCRIBE", "news"]);
    let mut psub = Raw::connect(&addr);
    psub.cmd(&["PSUBSCRIBE", "*"]);
    let mut ssub = Raw::connect(&addr);
    ssub.cmd(&["SSUBSCRIBE", "shard"]);
    // walrus listens once the restore is over.
    let w = Walrus::build().upstream(&addr).data(&data).start();
    let log = w.proc.log_text();
    assert!(
        log.contains("Valkey continued with a partial resync"),
        "{log}"
    );
    assert!(
        log.contains("published messages left out of the replay messages=41"),
        "{log}"
    );
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["GET", "k19"]), bulk("v"));
    assert_eq!(c.cmd(&["GET", "in-script"]), bulk("v"));
    // The first message each subscriber gets is the one published now.
    assert_eq!(c.cmd(&["PUBLISH", "news", "fresh"]), b":2\r\n");
    assert_eq!(c.cmd(&["SPUBLISH", "shard", "fresh"]), b":1\r\n");
    for (s, want) in [
        (
            &mut sub,
            "*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nfresh\r\n",
        ),
        (
            &mut psub,
            "*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$4\r\nnews\r\n$5\r\nfresh\r\n",
        ),
        (
            &mut ssub,
            "*3\r\n$8\r\nsmessage\r\n$5\r\nshard\r\n$5\r\nfresh\r\n",
        ),
    ] {
        assert_eq!(show(&s.read_frame()), show(want.as_bytes()));
    }
}
