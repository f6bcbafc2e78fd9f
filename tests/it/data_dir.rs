//! The data directory proves what it holds, with real processes: one walrus owns it (a
//! second `walrus serve` beside a running one exits, naming the first, having touched
//! nothing), and its parts belong together (a lost checkpoint manifest, or a journal
//! manifest copied in from another data directory, is refused by `serve` and `verify`
//! alike, naming the file and the way out, and nothing is deleted). A directory written
//! before walrus recorded identities is adopted when its parts agree.
use crate::common;
use common::*;

use std::path::{Path, PathBuf};

const OK: &[u8] = b"+OK\r\n";
const KEYS: usize = 100;

/// A stopped managed walrus's data directory holding `key:0..100`: those before
/// `checkpoint_at` in a checkpoint, which released the journal before it, the rest in the
/// journal after it. Returns the temporary directory (kept for the data's life) and the
/// data directory.
fn hundred_keys_with_a_checkpoint(checkpoint_at: usize) -> (tempfile::TempDir, PathBuf) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut c = Raw::connect(&w.addr);
    for i in 0..=KEYS {
        if i == checkpoint_at {
            // It answers once the checkpoint is taken and the journal released.
            let out = run_walrus(&["checkpoint", "--metrics", &metrics]);
            assert!(
                out.status.success() && output_text(&out).contains("journal released through"),
                "{}",
                output_text(&out)
            );
        }
        if i < KEYS {
            let r = c.cmd(&["SET", &format!("key:{i}"), &format!("value-{i}")]);
            assert_eq!(show(&r), show(OK));
        }
    }
    let Walrus { mut proc, data, .. } = w;
    proc.signal(libc::SIGTERM);
    let status = proc
        .wait_exit(START_TIMEOUT)
        .expect("walrus stops on SIGTERM");
    assert!(status.success(), "{status:?}\n{}", proc.log_text());
    let dir = data.path().join("data");
    (data, dir)
}

/// How many of `key:0..100` the walrus at `addr` serves with their values.
fn served(addr: &str) -> usize {
    let mut c = Raw::connect(addr);
    (0..KEYS)
        .filter(|i| c.cmd(&["GET", &format!("key:{i}")]) == bulk(format!("value-{i}")))
        .count()
}

/// Starts `walrus serve` on `data` and expects it to refuse: returns its exit code and
/// output. A walrus that starts instead fails the test, saying how many keys it serves.
fn serve_refused(data: &Path, journal: Option<&str>) -> (Option<i32>, String) {
    let mut b = Walrus::build().data(data);
    if let Some(j) = journal {
        b = b.journal(j);
    }
    let (mut w, _cfg) = b.spawn();
    if let Some(line) = w.try_wait_line(LISTENING, START_TIMEOUT) {
        panic!(
            "walrus started on {} instead of refusing, serving {} of {KEYS} acknowledged keys; log:\n{}",
            data.display(),
            served(&addr_in(&line)),
            w.log_text()
        );
    }
    let status = w.wait_exit(START_TIMEOUT).expect("walrus exits");
    (status.code(), w.log_text())
}

/// `walrus verify --data-dir DIR`: its exit code and output.
fn verify(data: &Path) -> (Option<i32>, String) {
    let out = run_walrus(&["verify", "--data-dir", data.to_str().unwrap()]);
    (out.status.code(), output_text(&out))
}

/// Every file under `dir` with its contents, but the locks (whose contents name the last
/// process that took them).
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else if p.is_file() && !p.ends_with("LOCK") {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

/// A person runs `walrus serve` by hand beside the one systemd runs (or two pods share a
/// volume): the second exits at once with 1 (trying again succeeds once the first stops),
/// naming the first's pid, before it starts a Valkey of its own. The first keeps serving,
/// and its Valkey's socket stays: a second valkey-server on it would have replaced it, and
/// unlinked it when stopped, leaving the first walrus unable to reach its Valkey again.
#[test]
fn a_second_serve_on_a_running_data_directory_exits_and_the_first_keeps_its_valkey() {
    let w = Walrus::build().start();
    let data = w.data.path().join("data");
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    let socket = data.join("run/valkey.sock");
    assert!(socket.exists(), "{}", socket.display());
    let journal = data.join("journal/MANIFEST");
    let before = std::fs::read(&journal).unwrap();

    let (mut second, _cfg) = Walrus::build().data(&data).spawn();
    let status = second
        .wait_exit(START_TIMEOUT)
        .expect("the second walrus exits");
    let log = second.log_text();
    // The first walrus's Valkey is still reachable on its socket, by a new connection.
    let mut v = Raw::try_connect(&format!("unix:{}", socket.display())).unwrap_or_else(|e| {
        panic!("the first walrus's Valkey socket is gone ({e}); the second walrus's log:\n{log}")
    });
    assert_eq!(v.cmd(&["GET", "k"]), bulk("v"));
    assert_eq!(status.code(), Some(1), "{log}");
    let first = w.proc.child.id();
    for part in [
        format!("{} is in use", data.display()),
        format!("pid {first}"),
        "walrus serve".to_string(),
    ] {
        assert!(log.contains(&part), "{part:?} missing:\n{log}");
    }
    assert!(
        !log.contains("valkey-server"),
        "the second walrus started a Valkey:\n{log}"
    );
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        before,
        "the journal was touched"
    );
    // The commands that read it are refused too: its files move under them.
    let journal_dir = data.join("journal");
    for args in [
        vec!["verify", "--data-dir", data.to_str().unwrap()],
        vec!["journal", "verify", "--dir", journal_dir.to_str().unwrap()],
    ] {
        let out = run_walrus(&args);
        let text = output_text(&out);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains(&format!("pid {first}")), "{text}");
    }
    // The first goes on serving, writes included.
    assert_eq!(c.cmd(&["SET", "k2", "v2"]), OK);
    assert_eq!(c.cmd(&["GET", "k"]), bulk("v"));
}

/// A directory's name lives in its parent, which syncing the files inside does not sync: a
/// power cut after a first start could take `journal/` away, with every manifest synced in
/// it since. So walrus fsyncs the data directory after making each directory in it
/// (`strace` shows the calls; the test is skipped where strace cannot run).
#[test]
fn the_data_directory_is_synced_after_each_directory_made_in_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let trace = tmp.path().join("trace");
    let config = tmp.path().join("walrus.toml");
    std::fs::write(&config, format!("{TEST_CHECKPOINT}\n{TEST_JOURNAL}")).unwrap();
    if !std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("SKIPPED: no strace here (deploy/setup.sh installs it)");
        return;
    }
    let mut cmd = std::process::Command::new("strace");
    cmd.args(["-f", "-y", "-qq", "-e", "trace=mkdir,mkdirat,fsync", "-o"])
        .arg(&trace)
        .arg(walrus_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", ""])
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .env("RUST_LOG", "info");
    let mut w = Proc::spawn(cmd, true);
    if w.try_wait_line(LISTENING, START_TIMEOUT).is_none() {
        eprintln!(
            "SKIPPED: walrus did not start under strace:\n{}",
            w.log_text()
        );
        return;
    }
    // walrus's own pid, from the lock it holds (strace is the child here).
    let lock = std::fs::read_to_string(data.join("LOCK")).unwrap();
    let pid: i32 = lock.split_whitespace().nth(1).unwrap().parse().unwrap();
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(w.wait_exit(START_TIMEOUT).is_some(), "{}", w.log_text());
    let lines: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // strace names a descriptor's file by its real path.
    let synced = format!("<{}>)", data.canonicalize().unwrap().display());
    for sub in ["journal", "checkpoints", "run", "valkey"] {
        let made = format!("\"{}\"", data.join(sub).display());
        let at = lines
            .iter()
            .position(|l| l.contains("mkdir") && l.contains(&made))
            .unwrap_or_else(|| panic!("no mkdir of {made}:\n{}", lines.join("\n")));
        assert!(
            lines[at..]
                .iter()
                .any(|l| l.contains("fsync(") && l.contains(&synced)),
            "{sub}/ was made, and {} never synced after it:\n{}",
            data.display(),
            lines.join("\n")
        );
    }
}

/// After a checkpoint released the journal, `checkpoints/CHECKPOINT` is lost (an incomplete
/// copy, a person's `rm`). walrus used to delete the RDB as a leftover and start empty,
/// recording that as its checkpoint: 0 of 100 acknowledged keys served (or, with entries
/// after the checkpoint, refuse with 1 only after deleting it). Now `serve` refuses (exit
/// 2: a person must act), naming the file and the way out, `verify` agrees, and the RDB is
/// still there.
#[test]
fn a_lost_checkpoint_manifest_is_refused_and_nothing_is_deleted() {
    let (_tmp, data) = hundred_keys_with_a_checkpoint(KEYS);
    std::fs::remove_file(data.join("checkpoints/CHECKPOINT")).unwrap();
    let before = files(&data.join("checkpoints"));
    assert!(before
        .iter()
        .any(|(p, _)| p.extension().is_some_and(|e| e == "rdb")));

    let (code, log) = serve_refused(&data, None);
    assert_eq!(code, Some(2), "{log}");
    let (vcode, vlog) = verify(&data);
    assert_eq!(vcode, Some(2), "{vlog}");
    for text in [&log, &vlog] {
        for part in [
            "checkpoints/CHECKPOINT is missing",
            "released",
            "from a backup",
            "move the data directory aside",
        ] {
            assert!(text.contains(part), "{part:?} missing:\n{text}");
        }
    }
    assert_eq!(
        files(&data.join("checkpoints")),
        before,
        "checkpoints/ changed"
    );
}

/// A `journal/MANIFEST` copied in from another data directory: its record key fails every
/// record of this journal, which recovery read as a clean end of the log (`verify` said OK,
/// `serve` served the 50 keys of the checkpoint). Now both refuse, naming the two files.
#[test]
fn a_journal_manifest_from_another_data_directory_is_refused() {
    let (_a, a) = hundred_keys_with_a_checkpoint(KEYS / 2);
    let (_b, b) = hundred_keys_with_a_checkpoint(KEYS / 2);
    std::fs::copy(b.join("journal/MANIFEST"), a.join("journal/MANIFEST")).unwrap();
    let before = files(&a);

    let (code, log) = serve_refused(&a, None);
    assert_eq!(code, Some(2), "{log}");
    let (vcode, vlog) = verify(&a);
    assert_eq!(vcode, Some(2), "{vlog}");
    for text in [&log, &vlog] {
        for part in [
            "journal/MANIFEST",
            "checkpoints/CHECKPOINT",
            "different data directories",
        ] {
            assert!(text.contains(part), "{part:?} missing:\n{text}");
        }
    }
    assert_eq!(files(&a), before, "the data directory changed");
}

/// The `data_dir_id` line of a manifest.
fn identity(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("data_dir_id = "))
        .map(str::to_string)
}

/// A data directory written before identities is adopted at its first start: its parts
/// agree (the journal released only entries before the checkpoint's first), so both
/// manifests get one identity, and every acknowledged key is served, then and after.
#[test]
fn a_data_directory_of_walrus_0_1_0_is_adopted() {
    let (_tmp, data) = fixture_data_dir();
    let (code, out) = verify(&data);
    assert_eq!(code, Some(0), "{out}");
    for _ in 0..2 {
        let w = Walrus::build().data(&data).journal(FIXTURE_RING).start();
        assert_eq!(served(&w.addr), KEYS, "{}", w.proc.log_text());
        let Walrus { mut proc, .. } = w;
        proc.signal(libc::SIGTERM);
        assert!(proc.wait_exit(START_TIMEOUT).unwrap().success());
        let journal = identity(&data.join("journal/MANIFEST"));
        assert!(journal.is_some(), "no identity in journal/MANIFEST");
        assert_eq!(identity(&data.join("checkpoints/CHECKPOINT")), journal);
    }
    let (code, out) = verify(&data);
    assert_eq!(code, Some(0), "{out}");
}

/// The reproduction on a directory of walrus 0.1.0: its checkpoint manifest lost,
/// the journal's says entries were released to a checkpoint. Refused, nothing deleted.
#[test]
fn a_data_directory_of_walrus_0_1_0_without_its_checkpoint_manifest_is_refused() {
    let (_tmp, data) = fixture_data_dir();
    std::fs::remove_file(data.join("checkpoints/CHECKPOINT")).unwrap();
    let before = files(&data);
    let (code, log) = serve_refused(&data, Some(FIXTURE_RING));
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("checkpoints/CHECKPOINT is missing"), "{log}");
    let (vcode, vlog) = verify(&data);
    assert_eq!(vcode, Some(2), "{vlog}");
    assert_eq!(files(&data), before, "the data directory changed");
}
