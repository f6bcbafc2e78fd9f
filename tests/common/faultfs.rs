//! faultfs (examples/faultfs, docs/faultfs.md) for tests: [`FaultFs::mount`] mounts one
//! over a fresh backing directory, its methods talk to the control socket, and dropping it
//! unmounts. Where FUSE cannot be mounted (no /dev/fuse, neither root nor fusermount3, a
//! sandbox that refuses the mount), `mount` prints why and returns `None`, once per test,
//! and the test returns early: it is skipped, not failed.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{Proc, START_TIMEOUT};

/// A mounted faultfs: `root()` is the mount point, `backing()` the directory behind it
/// (the "disk": what is there is durable).
pub struct FaultFs {
    pub proc: Proc,
    dir: tempfile::TempDir,
}

impl FaultFs {
    /// Mounts a faultfs, or returns `None` after printing why FUSE is unavailable here.
    pub fn mount() -> Option<FaultFs> {
        if let Err(why) = available() {
            eprintln!("SKIPPED: FUSE cannot be mounted here ({why})");
            return None;
        }
        Some(FaultFs::start().unwrap_or_else(|log| panic!("faultfs did not mount:\n{log}")))
    }

    /// Spawns faultfs and waits for its ready line; on failure, its log.
    fn start() -> Result<FaultFs, String> {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["backing", "mnt"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let mut cmd = Command::new(faultfs_bin());
        cmd.arg(dir.path().join("backing"))
            .arg(dir.path().join("mnt"))
            .arg("--control")
            .arg(dir.path().join("control.sock"));
        let proc = Proc::spawn(cmd, false);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match proc.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("faultfs ready") => return Ok(FaultFs { proc, dir }),
                Ok(_) => {}
                // Exited (its output closed) or never ready.
                Err(_) => return Err(proc.log_text()),
            }
        }
    }

    /// The mount point.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// `rel` under the mount point.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// The backing directory: what a crash leaves.
    pub fn backing(&self) -> PathBuf {
        self.dir.path().join("backing")
    }

    /// Sends one control command; returns the reply line.
    /// `resume`, ignoring any failure: for a guard's `Drop`, which may run while a test
    /// unwinds (a process with a thread in a held FUSE request cannot exit until then).
    pub fn resume_quietly(&self) {
        let sock = self.dir.path().join("control.sock");
        if let Ok(mut s) = UnixStream::connect(sock) {
            let _ = s.set_read_timeout(Some(START_TIMEOUT));
            if writeln!(s, "resume").is_ok() {
                let _ = BufReader::new(s).read_line(&mut String::new());
            }
        }
    }

    pub fn cmd(&self, line: &str) -> String {
        let sock = self.dir.path().join("control.sock");
        let mut s = UnixStream::connect(&sock)
            .unwrap_or_else(|e| panic!("faultfs control {}: {e}", sock.display()));
        s.set_read_timeout(Some(START_TIMEOUT)).unwrap();
        writeln!(s, "{line}").unwrap();
        let mut reply = String::new();
        BufReader::new(s).read_line(&mut reply).unwrap();
        reply.trim_end().to_string()
    }

    /// Sends a command that must succeed; returns its reply.
    pub fn ok(&self, line: &str) -> String {
        let reply = self.cmd(line);
        assert!(reply.starts_with("ok"), "faultfs {line:?}: {reply}");
        reply
    }

    /// `status` as a map of its counters.
    pub fn status(&self) -> HashMap<String, u64> {
        fields(&self.ok("status"))
    }

    /// Waits until status counter `key` satisfies `cond`, polling (the counters have no
    /// event to await) within START_TIMEOUT.
    pub fn await_status(&self, key: &str, cond: impl Fn(u64) -> bool) -> u64 {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let v = self.status()[key];
            if cond(v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "faultfs status {key}={v} never met the condition"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The `key=value` fields of a reply line whose values are numbers.
pub fn fields(reply: &str) -> HashMap<String, u64> {
    reply
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        // SIGTERM unmounts (lazily if files are still open); a faultfs that does not exit
        // is killed and its mount detached, so that no test leaves a dead mount behind.
        self.proc.signal(libc::SIGTERM);
        if self.proc.wait_exit(Duration::from_secs(10)).is_none() {
            let _ = self.proc.child.kill();
            let _ = Command::new("umount").arg("-l").arg(self.root()).status();
        }
    }
}

/// Whether FUSE can be mounted here, decided once per test binary: Err says why not.
fn available() -> Result<(), String> {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    AVAILABLE
        .get_or_init(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/fuse")
                .map_err(|e| format!("/dev/fuse: {e}"))?;
            // SAFETY: a plain getter.
            let root = unsafe { libc::geteuid() } == 0;
            if !root && !on_path("fusermount3") {
                return Err("not root and no fusermount3 (deploy/setup.sh installs fuse3)".into());
            }
            // A probe mount: a sandbox may still refuse mount(2) to root.
            match FaultFs::start() {
                Ok(fs) => {
                    drop(fs);
                    Ok(())
                }
                Err(log) if refused(&log) => Err(format!("the mount was refused: {log}")),
                Err(log) => panic!("faultfs failed to mount:\n{log}"),
            }
        })
        .clone()
}

/// A mount refused by the environment (as opposed to a faultfs bug, which fails the test).
fn refused(log: &str) -> bool {
    ["Operation not permitted", "Permission denied", "fusermount"]
        .iter()
        .any(|s| log.contains(s))
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// The faultfs binary: `<target>/<profile>/examples/faultfs`, which `cargo test` builds
/// (examples are built with the tests). A run of one test target (`cargo test --test
/// faultfs`) builds no example, so it is built here when missing or older than its
/// sources.
pub fn faultfs_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // <target>/<profile>/deps/<test binary>
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let bin = profile_dir.join("examples/faultfs");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/faultfs");
        if stale(&bin, &src) {
            let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
            cargo
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .args(["build", "--example", "faultfs"]);
            match profile_dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") | None => {}
                Some("release") => {
                    cargo.arg("--release");
                }
                Some(other) => {
                    cargo.args(["--profile", other]);
                }
            }
            let status = cargo.status().expect("run cargo build --example faultfs");
            assert!(status.success(), "cargo build --example faultfs: {status}");
        }
        bin
    })
    .clone()
}

/// True when `bin` is missing or older than a file of `src`.
fn stale(bin: &Path, src: &Path) -> bool {
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return true;
    };
    std::fs::read_dir(src)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > built)
        })
}
