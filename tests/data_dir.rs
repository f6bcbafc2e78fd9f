//! The data directory proves what it holds, with real processes: one walrus owns it (a
//! second `walrus serve` beside a running one exits, naming the first, having touched
//! nothing), and its parts belong together (a lost checkpoint manifest, or a journal
//! manifest copied in from another data directory, is refused by `serve` and `verify`
//! alike, naming the file and the way out, and nothing is deleted). A directory written
//! before walrus recorded identities is adopted when its parts agree.
mod common;
use common::*;

const OK: &[u8] = b"+OK\r\n";
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
