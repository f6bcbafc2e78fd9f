//! The bare-metal flow of docs/install-systemd.md without systemd itself: walrus started with
//! the unit's exact command line (deploy/systemd/walrus.service) and config
//! (deploy/systemd/walrus.toml, with its paths and ports moved to the test's), a workload,
//! SIGTERM, a second start on the same data. A NOTIFY_SOCKET listener plays systemd: it must
//! hear STATUS= lines while Valkey is restored and READY=1 only once the data is back.
use crate::common;
use common::*;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const UNIT: &str = "deploy/systemd/walrus.service";
const CONFIG: &str = "deploy/systemd/walrus.toml";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The unit's ExecStart, split into words (it has no quoting).
fn unit_setting(key: &str) -> String {
    let unit = std::fs::read_to_string(repo(UNIT)).unwrap();
    unit.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("the unit sets {key}"))
        .to_string()
}

fn exec_start() -> Vec<String> {
    unit_setting("ExecStart")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The bare-metal config with the data directory and ports moved into the test's.
fn config(dir: &Path, port: u16, metrics: u16) -> PathBuf {
    let text = std::fs::read_to_string(repo(CONFIG)).unwrap();
    let mut t: toml::Table = toml::from_str(&text).unwrap();
    let mut set = |table: &str, key: &str, value: String| {
        t.entry(table)
            .or_insert_with(|| toml::Value::Table(Default::default()))
            .as_table_mut()
            .unwrap()
            .insert(key.into(), toml::Value::String(value));
    };
    set("data", "dir", dir.join("data").display().to_string());
    set("proxy", "listen", format!("127.0.0.1:{port}"));
    set("metrics", "listen", format!("127.0.0.1:{metrics}"));
    // The guide installs valkey-server in /usr/local/bin; the tests use the one setup.sh
    // installs (walrus's own search, with the setting empty).
    set("upstream", "valkey_server", String::new());
    let path = dir.join("walrus.toml");
    std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
    path
}

/// systemd's side of the notify protocol: collects datagrams.
struct Notify {
    sock: UnixDatagram,
    path: PathBuf,
    heard: Vec<String>,
}

impl Notify {
    fn new(dir: &Path, name: &str) -> Notify {
        let path = dir.join(name);
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(START_TIMEOUT)).unwrap();
        Notify {
            sock,
            path,
            heard: Vec::new(),
        }
    }

    /// Waits for a datagram with a line equal to `line`; returns every line heard before it.
    fn until(&mut self, line: &str) -> Vec<String> {
        let mut before = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = self
                .sock
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no {line} from walrus: {e}; heard {:?}", self.heard));
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            for l in text.lines() {
                self.heard.push(l.to_string());
                if l == line {
                    return before;
                }
                before.push(l.to_string());
            }
        }
    }
}

fn start(args: &[String], config: &Path, notify: &Notify) -> Proc {
    let mut cmd = Command::new(walrus_bin());
    // The unit's arguments, with its config path swapped for the test's copy.
    for a in &args[1..] {
        if a.ends_with("walrus.toml") {
            cmd.arg(config);
        } else {
            cmd.arg(a);
        }
    }
    // systemd's watchdog as the unit asks for it (WatchdogSec=), at a tenth of a second so
    // that the test hears it at once.
    assert!(!unit_setting("WatchdogSec").is_empty());
    cmd.env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "100000")
        .env("RUST_LOG", "info");
    Proc::spawn(cmd, true)
}

#[test]
fn the_units_command_line_restores_and_reports_ready_only_after() {
    let args = exec_start();
    assert!(args[0].ends_with("/walrus"), "{args:?}");
    let dir = tempfile::tempdir().unwrap();
    let (port, metrics) = (free_port(), free_port());
    let config = config(dir.path(), port, metrics);
    let addr = format!("127.0.0.1:{port}");

    // First start: READY once clients are served.
    let mut notify = Notify::new(dir.path(), "notify-1");
    let mut w = start(&args, &config, &notify);
    notify.until("READY=1");
    // The watchdog is fed from the event loop while walrus serves.
    notify.until("WATCHDOG=1");
    notify.until("WATCHDOG=1");
    let mut c = Raw::connect(&addr);
    let value = "v".repeat(64 << 10);
    for i in 0..200 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), &value]), b"+OK\r\n");
    }
    drop(c);
    w.signal(libc::SIGTERM);
    notify.until("STOPPING=1");
    let status = w.wait_exit(Duration::from_secs(30)).expect("walrus stops");
    assert!(status.success(), "{status:?}");
    // A clean stop closes the journal (nothing else still holds it).
    assert!(w.log_text().contains("journal closed"), "{}", w.log_text());

    // Second start: Valkey comes back empty and is restored before READY.
    let mut notify = Notify::new(dir.path(), "notify-2");
    let _w = start(&args, &config, &notify);
    let before_ready = notify.until("READY=1");
    assert!(
        before_ready
            .iter()
            .any(|l| l.starts_with("STATUS=restoring Valkey")),
        "{before_ready:?}"
    );
    // READY came after the data was back: every key is there at once.
    let mut c = Raw::connect(&addr);
    for i in 0..200 {
        assert_eq!(
            c.cmd(&["STRLEN", &format!("k{i}")]),
            format!(":{}\r\n", 64 << 10).as_bytes()
        );
    }
    let (code, _) = http_get(&format!("127.0.0.1:{metrics}"), "/readyz");
    assert_eq!(code, 200);
}
