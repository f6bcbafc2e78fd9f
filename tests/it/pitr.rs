//! Point-in-time restore of a local data directory (`walrus restore --from-dir DIR
//! --data-dir NEW --until TIME | --until-offset N | --before-command CMD`) and
//! `walrus journal export-aof` with the same cut: each cut gives exactly the writes a model
//! kept up to that point, a FLUSHALL is undone to the command before it, and a journal
//! written before entries carried their time (tests/fixtures/data-dir-33285bf) is cut too.

use crate::common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use walrus::units::time::{format_time, now_ms};

const OK: &[u8] = b"+OK\r\n";
/// What a restore sends Valkey after the journal's stream (src/restore/primary.rs).
const GETACK: &[u8] = b"*3\r\n$8\r\nREPLCONF\r\n$6\r\nGETACK\r\n$1\r\n*\r\n";

type Dataset = BTreeMap<String, String>;

/// The dataset after a write, where its bytes end in Valkey's stream, and a time at or
/// after it was journaled and before the next write was.
struct Step {
    what: String,
    offset: u64,
    time_ms: u64,
    model: Dataset,
}

/// Every key and its value, through `addr`.
fn dataset(addr: &str) -> Dataset {
    let mut c = Raw::connect(addr);
    let keys = c.cmd(&["KEYS", "*"]);
    assert!(keys.starts_with(b"*"), "KEYS: {}", show(&keys));
    let text = String::from_utf8_lossy(&keys).into_owned();
    let names: Vec<String> = text
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.starts_with('$') && !l.is_empty())
        .map(str::to_string)
        .collect();
    names
        .into_iter()
        .map(|k| {
            let v = c.cmd(&["GET", &k]);
            let v = String::from_utf8_lossy(&v).into_owned();
            let v = v.split("\r\n").nth(1).unwrap_or_default().to_string();
            (k, v)
        })
        .collect()
}

/// Writes through walrus, one command or transaction at a time, recording the model after
/// each. Each write is sent only once the clock has passed the previous one's recorded
/// time, so that its journal entry is stamped later.
struct Writer<'a> {
    c: Raw,
    valkey: Raw,
    model: Dataset,
    steps: Vec<Step>,
    _w: &'a Walrus,
}

impl Writer<'_> {
    fn record(&mut self, what: &str) {
        let offset = info_field(&mut self.valkey, "replication", "master_repl_offset")
            .unwrap()
            .parse()
            .unwrap();
        let time_ms = now_ms();
        self.steps.push(Step {
            what: what.to_string(),
            offset,
            time_ms,
            model: self.model.clone(),
        });
        while now_ms() <= time_ms {
            std::thread::yield_now();
        }
    }

    fn set(&mut self, k: &str, v: &str) {
        assert_eq!(self.c.cmd(&["SET", k, v]), OK);
        self.model.insert(k.into(), v.into());
        self.record(&format!("SET {k} {v}"));
    }

    fn flushall_in_a_transaction(&mut self, k: &str) {
        assert_eq!(self.c.cmd(&["MULTI"]), OK);
        assert_eq!(
            self.c.cmd(&["SET", k, "in the transaction"]),
            b"+QUEUED\r\n"
        );
        assert_eq!(self.c.cmd(&["FLUSHALL"]), b"+QUEUED\r\n");
        assert_eq!(
            self.c.cmd(&["SET", k, "after its FLUSHALL"]),
            b"+QUEUED\r\n"
        );
        assert_eq!(show(&self.c.cmd(&["EXEC"])), "*3⏎+OK⏎+OK⏎+OK⏎");
        self.model.clear();
        self.model.insert(k.into(), "after its FLUSHALL".into());
        self.record("MULTI SET FLUSHALL SET EXEC");
    }
}

/// The offset a restore's report says its cut falls at.
fn cut_offset(report: &str) -> u64 {
    let at = report
        .find("): at offset ")
        .unwrap_or_else(|| panic!("no cut in:\n{report}"));
    report[at + "): at offset ".len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cut offset in:\n{report}"))
}

fn restore(from: &Path, to: &Path, cut: &[&str]) -> std::process::Output {
    let mut args = vec![
        "restore",
        "--from-dir",
        from.to_str().unwrap(),
        "--data-dir",
        to.to_str().unwrap(),
    ];
    args.extend_from_slice(cut);
    run_walrus(&args)
}

/// Restores `from` cut by `cut` into a new data directory, starts a walrus (managed) on it,
/// and returns what it serves and the report.
fn restored(from: &Path, cut: &[&str]) -> (Dataset, String) {
    let tmp = tempfile::tempdir().unwrap();
    let to = tmp.path().join("restored");
    let out = restore(from, &to, cut);
    let report = output_text(&out);
    assert!(out.status.success(), "restore {cut:?}: {report}");
    let mut w = Walrus::build().data(&to).start();
    let got = dataset(&w.addr);
    w.stop();
    (got, report)
}

#[test]
fn a_cut_restores_exactly_the_writes_up_to_it_and_undoes_a_flushall() {
    let v = Valkey::start();
    let mut w = Walrus::build().upstream(&v.addr()).start();
    let data: PathBuf = w.data.path().join("data");
    let mut wr = Writer {
        c: Raw::connect(&w.addr),
        valkey: Raw::connect(&v.addr()),
        model: Dataset::new(),
        steps: Vec::new(),
        _w: &w,
    };
    wr.record("nothing yet");
    for i in 0..6 {
        wr.set(&format!("a:{i}"), &format!("v{i}"));
    }
    wr.set("a:2", "overwritten");
    assert_eq!(wr.c.cmd(&["FLUSHALL"]), OK);
    wr.model.clear();
    wr.record("FLUSHALL");
    for i in 0..3 {
        wr.set(&format!("b:{i}"), &format!("w{i}"));
    }
    wr.flushall_in_a_transaction("c");
    wr.set("d", "last");
    let steps = std::mem::take(&mut wr.steps);
    let original_replid = info_field(&mut wr.valkey, "replication", "master_replid").unwrap();
    drop(wr);

    // A running walrus's data directory is refused: it holds the journal's lock.
    let tmp = tempfile::tempdir().unwrap();
    let out = restore(&data, &tmp.path().join("x"), &["--until-offset", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("is in use by pid"),
        "{}",
        output_text(&out)
    );
    w.stop();

    let step = |what: &str| steps.iter().position(|s| s.what == what).unwrap();
    let flush = step("FLUSHALL");
    let tx = step("MULTI SET FLUSHALL SET EXEC");

    // --until-offset: at the end of each write, and inside the transaction (left out whole).
    for i in [0, 3, flush, tx - 1, tx, steps.len() - 1] {
        let s = &steps[i];
        let (got, report) = restored(&data, &["--until-offset", &s.offset.to_string()]);
        assert_eq!(
            got, s.model,
            "--until-offset {} (after {}):\n{report}",
            s.offset, s.what
        );
    }
    let inside = steps[tx - 1].offset + 10;
    let (got, _) = restored(&data, &["--until-offset", &inside.to_string()]);
    assert_eq!(got, steps[tx - 1].model, "an offset inside the transaction");

    // --until TIME: each write journaled at or before it, none after.
    for i in [2, flush, tx, steps.len() - 1] {
        let s = &steps[i];
        let t = format_time(s.time_ms);
        let (got, report) = restored(&data, &["--until", &t]);
        assert_eq!(got, s.model, "--until {t} (after {}):\n{report}", s.what);
    }

    // --before-command FLUSHALL: the newest is the one in the transaction (before its
    // MULTI); --occurrence 2 undoes the first, to the SET before it.
    let (got, report) = restored(&data, &["--before-command", "FLUSHALL"]);
    assert_eq!(got, steps[tx - 1].model, "{report}");
    assert!(report.contains("<- the cut"), "{report}");
    let (got, report) = restored(
        &data,
        &["--before-command", "flushall", "--occurrence", "2"],
    );
    assert_eq!(got, steps[flush - 1].model, "{report}");
    assert!(
        got.contains_key("a:5") && got["a:2"] == "overwritten",
        "{got:?}"
    );
    // With arguments: before the SET of b:1.
    let (got, _) = restored(&data, &["--before-command", "SET b:1"]);
    assert_eq!(got, steps[step("SET b:0 w0")].model);

    // A cut that cannot be made is refused (exit 2), naming what the data holds; nothing is
    // written.
    let tmp = tempfile::tempdir().unwrap();
    let to = tmp.path().join("refused");
    for (cut, why) in [
        (vec!["--before-command", "FLUSHDB"], "holds 0 such commands"),
        (
            vec!["--before-command", "FLUSHALL", "--occurrence", "3"],
            "holds 2 such commands",
        ),
        (
            vec![
                "--until-offset",
                &(steps[steps.len() - 1].offset + 1).to_string(),
            ],
            "outside what the data holds",
        ),
        (
            vec!["--until", "2001-01-01T00:00:00Z"],
            "a restore cannot go back before its checkpoint",
        ),
        (vec!["--until", "yesterday"], "is not a time"),
    ]
    .iter()
    .map(|(c, w)| (c.iter().map(|s| s.to_string()).collect::<Vec<_>>(), *w))
    {
        let args: Vec<&str> = cut.iter().map(String::as_str).collect();
        let out = restore(&data, &to, &args);
        assert_eq!(out.status.code(), Some(2), "{cut:?}: {}", output_text(&out));
        assert!(
            output_text(&out).contains(why),
            "{cut:?}: {}",
            output_text(&out)
        );
        assert!(!to.exists(), "{cut:?} left {}", to.display());
    }

    // --dry-run says where the cut falls and writes nothing.
    let out = run_walrus(&[
        "restore",
        "--from-dir",
        data.to_str().unwrap(),
        "--before-command",
        "FLUSHALL",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", output_text(&out));
    let text = output_text(&out);
    assert!(
        text.contains("--occurrence 1:") && text.contains("--occurrence 2:"),
        "{text}"
    );

    // The restored Valkey goes on under a new history (its old one valid up to the cut), and
    // takes writes.
    let to = tmp.path().join("rewound");
    let out = restore(
        &data,
        &to,
        &["--before-command", "FLUSHALL", "--occurrence", "2"],
    );
    assert!(out.status.success(), "{}", output_text(&out));
    // The cut falls right before the FLUSHALL: after the last SET, and after what Valkey
    // sent between them (a REPLCONF GETACK).
    let cut = cut_offset(&output_text(&out));
    assert!(
        (steps[flush - 1].offset..steps[flush].offset).contains(&cut),
        "{cut}"
    );
    let mut rw = Walrus::build().data(&to).start();
    let mut direct = Raw::connect(&managed_valkey_addr(&rw.addr));
    let replid = info_field(&mut direct, "replication", "master_replid").unwrap();
    assert_ne!(replid, original_replid);
    assert_eq!(
        info_field(&mut direct, "replication", "master_replid2").unwrap(),
        original_replid
    );
    assert_eq!(
        info_field(&mut direct, "replication", "second_repl_offset").unwrap(),
        (cut + GETACK.len() as u64 + 1).to_string(),
        "the old history ends at the cut, and the GETACK that ends every restore's stream"
    );
    let mut c = Raw::connect(&rw.addr);
    assert_eq!(c.cmd(&["SET", "new", "history"]), OK);
    rw.stop();
    let again = Walrus::build().data(&to).start();
    let mut want = steps[flush - 1].model.clone();
    want.insert("new".into(), "history".into());
    assert_eq!(
        dataset(&again.addr),
        want,
        "after a restart of the rewound walrus"
    );

    // export-aof takes the same cut: a stock valkey-server loads the dataset before the
    // first FLUSHALL, and the one up to a time.
    let (exported, report, _dir) = export_aof(
        &data,
        &["--before-command", "FLUSHALL", "--occurrence", "2"],
    );
    assert!(report.contains("<- the cut"), "{report}");
    assert_eq!(dataset(&exported.addr()), steps[flush - 1].model);
    let s = &steps[3];
    let (exported, _, _dir) = export_aof(&data, &["--until", &format_time(s.time_ms)]);
    assert_eq!(dataset(&exported.addr()), s.model);
}

/// A stock valkey-server loading the AOF `walrus journal export-aof` writes of `data` with
/// `cut`, the export's report, and the AOF's directory.
fn export_aof(data: &Path, cut: &[&str]) -> (Valkey, String, tempfile::TempDir) {
    let out_dir = tempfile::tempdir().unwrap();
    let aof = out_dir.path().join("appendonly.aof");
    let mut args = vec![
        "journal",
        "export-aof",
        "--dir",
        data.to_str().unwrap(),
        "--out",
        aof.to_str().unwrap(),
    ];
    args.extend_from_slice(cut);
    let out = run_walrus(&args);
    assert!(out.status.success(), "{}", output_text(&out));
    let valkey = Valkey::start_with(&[
        "--appendonly",
        "yes",
        "--dir",
        out_dir.path().to_str().unwrap(),
    ]);
    (valkey, output_text(&out), out_dir)
}

/// tests/fixtures/data-dir-33285bf, written before entries carried their time: `SET key:N
/// value-N` for N in 0..30, a checkpoint, N in 30..60, FLUSHALL, `SET after:N v-N` for N in
/// 0..10. A FLUSHALL is undone in it; a time cannot be placed among its untimed entries.
#[test]
fn a_flushall_in_a_journal_without_times_is_undone() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data-dir-33285bf"),
        &data,
    );
    let to = tmp.path().join("refused");
    let out = restore(&data, &to, &["--until", "2026-12-03T21:00:00Z"]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("did not record times"),
        "{}",
        output_text(&out)
    );
    assert!(!to.exists());

    let to = tmp.path().join("restored");
    let out = restore(&data, &to, &["--before-command", "FLUSHALL"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let w = Walrus::build().data(&to).journal(FIXTURE_RING).start();
    let want: Dataset = (0..60)
        .map(|n| (format!("key:{n}"), format!("value-{n}")))
        .collect();
    assert_eq!(dataset(&w.addr), want);
    // The fixture itself is left as it was: read only.
    assert_eq!(
        walrus::journal::manifest::Manifest::load(&data.join("journal"))
            .unwrap()
            .unwrap()
            .layout_version,
        2
    );
}

/// `walrus archive restore` cuts as `walrus restore` does: a walrus archiving every write
/// before its reply (`durability.ack = "archive"`) to a directory, then restores from the
/// archive up to an offset, a time, and before a FLUSHALL, each compared with the model.
#[test]
fn the_archive_is_restored_to_a_point_in_time() {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let mut w = Walrus::build()
        .config(&format!(
            "[durability]\nack = \"archive\"\n[archive]\nurl = \"{url}\"\n"
        ))
        .start();
    let mut wr = Writer {
        c: Raw::connect(&w.addr),
        valkey: Raw::connect(&managed_valkey_addr(&w.addr)),
        model: Dataset::new(),
        steps: Vec::new(),
        _w: &w,
    };
    wr.record("nothing yet");
    for i in 0..4 {
        wr.set(&format!("a:{i}"), &format!("v{i}"));
    }
    assert_eq!(wr.c.cmd(&["FLUSHALL"]), OK);
    wr.model.clear();
    wr.record("FLUSHALL");
    for i in 0..3 {
        wr.set(&format!("b:{i}"), &format!("w{i}"));
    }
    let steps = std::mem::take(&mut wr.steps);
    drop(wr);
    w.stop();
    let flush = steps.iter().position(|s| s.what == "FLUSHALL").unwrap();

    // The restored data directory's ring: the test walrus's.
    let config = bucket.path().join("walrus.toml");
    std::fs::write(&config, TEST_JOURNAL).unwrap();
    let config = config.to_str().unwrap();
    let from_archive = |cut: &[&str]| {
        let tmp = tempfile::tempdir().unwrap();
        let to = tmp.path().join("restored");
        let mut args = vec![
            "archive",
            "restore",
            "--config",
            config,
            "--from",
            &url,
            "--data-dir",
            to.to_str().unwrap(),
        ];
        args.extend_from_slice(cut);
        let out = run_walrus(&args);
        let report = output_text(&out);
        assert!(out.status.success(), "archive restore {cut:?}: {report}");
        let mut w = Walrus::build().data(&to).start();
        let got = dataset(&w.addr);
        w.stop();
        (got, report)
    };
    let (got, report) = from_archive(&["--before-command", "FLUSHALL"]);
    assert_eq!(got, steps[flush - 1].model, "{report}");
    assert!(report.contains("<- the cut"), "{report}");
    let s = &steps[2];
    let (got, report) = from_archive(&["--until-offset", &s.offset.to_string()]);
    assert_eq!(got, s.model, "{report}");
    let s = &steps[flush + 2];
    let (got, report) = from_archive(&["--until", &format_time(s.time_ms)]);
    assert_eq!(got, s.model, "{report}");
    let (got, _) = from_archive(&[]);
    assert_eq!(got, steps[steps.len() - 1].model);
    // A cut no restore point reaches is refused (exit 2), naming why.
    let tmp = tempfile::tempdir().unwrap();
    let out = run_walrus(&[
        "archive",
        "restore",
        "--config",
        config,
        "--from",
        &url,
        "--data-dir",
        tmp.path().join("x").to_str().unwrap(),
        "--before-command",
        "FLUSHDB",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("no restore point of"),
        "{}",
        output_text(&out)
    );
}

/// In place: `walrus restore --keep-present DIR --before-command FLUSHALL --confirm` against
/// a running (managed) walrus undoes a FLUSHALL: the present is kept in DIR first, Valkey
/// goes back to the dataset before the FLUSHALL and on under a new replication id, writes
/// after it are acknowledged and survive a SIGKILL, and DIR brings the present back.
/// Without --confirm nothing changes (exit 2).
#[test]
fn a_flushall_is_undone_in_place_on_a_running_walrus() {
    let metrics = format!("127.0.0.1:{}", free_port());
    // Valkey loaded, not yet promoted: a while in which a client must get -LOADING.
    let mut w = Walrus::build()
        .args(&["--metrics-listen", &metrics])
        .failpoint("restore::before_promote", "sleep(1000)")
        .start();
    let data: PathBuf = w.data.path().join("data");
    let mut c = Raw::connect(&w.addr);
    let mut model = Dataset::new();
    for i in 0..5 {
        let (k, v) = (format!("a:{i}"), format!("v{i}"));
        assert_eq!(c.cmd(&["SET", &k, &v]), OK);
        model.insert(k, v);
    }
    assert_eq!(c.cmd(&["FLUSHALL"]), OK);
    assert_eq!(c.cmd(&["SET", "after-the-flush", "1"]), OK);
    let present = dataset(&w.addr);
    assert_eq!(present.len(), 1, "{present:?}");
    let replid = |addr: &str| info_field(&mut Raw::connect(addr), "replication", "master_replid");
    let old_replid = replid(&w.addr).unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let keep = tmp.path().join("present");
    let in_place = |confirm: bool| {
        let mut args = vec![
            "restore",
            "--metrics",
            &metrics,
            "--keep-present",
            keep.to_str().unwrap(),
            "--before-command",
            "FLUSHALL",
        ];
        if confirm {
            args.push("--confirm");
        }
        run_walrus(&args)
    };
    let out = in_place(false);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("Run again with --confirm"),
        "{}",
        output_text(&out)
    );
    assert!(!keep.exists());
    assert_eq!(dataset(&w.addr), present);

    // A cut the data cannot make is refused, and Valkey goes on untouched. The link, detached
    // for the rewind, attaches again.
    let nowhere = tmp.path().join("nowhere");
    let out = run_walrus(&[
        "restore",
        "--metrics",
        &metrics,
        "--keep-present",
        nowhere.to_str().unwrap(),
        "--before-command",
        "DEL never-written",
        "--confirm",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    w.await_attached();
    assert_eq!(dataset(&w.addr), present);
    assert_eq!(replid(&w.addr).unwrap(), old_replid);
    // A client of Valkey's own, beside walrus: the rewind closes it too.
    let socket = format!("unix:{}", data.join("run/valkey.sock").display());
    let mut direct = Raw::connect(&socket);
    assert_eq!(direct.cmd(&["PING"]), b"+PONG\r\n");
    let out = std::thread::scope(|s| {
        let rewind = s.spawn(|| in_place(true));
        w.await_status("the rewind began (clients get -LOADING)", |s| {
            s.link == "restoring"
        });
        assert!(
            c.cmd(&["GET", "a:0"]).starts_with(b"-LOADING"),
            "{}",
            w.proc.log_text()
        );
        rewind.join().unwrap()
    });
    let report = output_text(&out);
    assert!(out.status.success(), "{report}\n{}", w.proc.log_text());
    assert!(
        report.contains(&format!(
            "the present (before the rewind) kept in {}",
            keep.display()
        )),
        "{report}"
    );
    assert!(keep.join("journal").exists(), "{report}");
    assert!(
        direct.closed(),
        "a direct client of Valkey outlived the rewind"
    );
    // The link attaches again under the new history (clients get -LOADING until then).
    w.await_attached();
    assert_eq!(dataset(&w.addr), model, "{report}\n{}", w.proc.log_text());
    let new_replid = replid(&w.addr).unwrap();
    assert_ne!(
        new_replid, old_replid,
        "a rewind goes on under a new history"
    );
    assert_eq!(c.cmd(&["SET", "after-the-rewind", "1"]), OK);
    model.insert("after-the-rewind".into(), "1".into());
    assert_eq!(dataset(&w.addr), model);

    // The new history is walrus's own: a SIGKILL and a restart restore it.
    w.kill_with_valkey();
    let mut again = Walrus::build().data(&data).start();
    assert_eq!(dataset(&again.addr), model, "{}", again.proc.log_text());
    again.stop();

    // The way back: the kept present, served as a data directory.
    let mut back = Walrus::build().data(&keep).start();
    assert_eq!(dataset(&back.addr), present, "{}", back.proc.log_text());
    back.stop();
}
