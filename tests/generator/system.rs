//! The system under test: walrus in managed mode (its own Valkey) or in external mode (in
//! front of a Valkey this test runs), on one data directory that every restart reuses (on
//! a faultfs mount, for power losses), with the fault switches a run flips: SIGKILLs, a
//! failing checkpoint or manifest (flag files), a slow journal (chosen per walrus start),
//! dropped upstream connections. In cluster mode, the shard under test; the other primaries
//! are in `cluster.rs`.

use crate::cluster::Peer;
use crate::common::faultfs::FaultFs;
use crate::common::{free_port, Raw, Rng, Valkey, Walrus};
use crate::node;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Managed,
    External,
    /// Managed, the Valkey one primary of a three-primary Valkey Cluster (the other two
    /// each behind a walrus of their own, untouched by faults until the final restart),
    /// owning the slot of half the clients' keys (`{gen}`; the other half, `{gen2}`, is
    /// another primary's): restores are in place (docs/cluster.md, "Valkey Cluster").
    Cluster,
    /// The same cluster, with faults on several shards at once (`cluster.rs`) and slot moves
    /// with MIGRATE, some cut short by a kill (`reshard.rs`), among the faults.
    Shards,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Managed => "managed",
            Mode::External => "external",
            Mode::Cluster => "cluster",
            Mode::Shards => "shards",
        }
    }

    /// Walrus runs its own Valkey.
    pub fn managed(self) -> bool {
        self != Mode::External
    }

    /// Walrus fronts one primary of a Valkey Cluster.
    pub fn cluster(self) -> bool {
        matches!(self, Mode::Cluster | Mode::Shards)
    }
}

/// A fast disk watcher, so that a ring that a failing checkpoint lets fill refuses writes,
/// and accepts them again, promptly. The harness's test journal is small (16 x 1 MiB): a
/// checkpoint every 8 MiB written. Replies up to 8 MiB (`oversized.rs` sends one past
/// that), and a client's output limit above what a whole pipeline holds (`bulk.rs`). The
/// journal's backend comes first (`[journal]`).
fn config() -> String {
    format!(
        "[disk]\ncheck_interval_ms = 50\n[proxy]\nmax_reply_bytes = {}\nmax_output_bytes = {}\n",
        crate::oversized::MAX_REPLY_BYTES,
        64 << 20
    )
}

/// What managed mode gives its Valkey (docs/configuration.md, "Valkey settings"), for the external one;
/// but for the last two, which would refuse every write to a walrus without a journal.
const EXTERNAL_VALKEY: &[&str] = &[
    "--repl-diskless-sync",
    "yes",
    "--repl-diskless-load",
    "on-empty-db",
    "--repl-backlog-size",
    "256mb",
    "--repl-backlog-ttl",
    "0",
    "--client-output-buffer-limit",
    "replica 0 0 0",
    "--maxmemory-policy",
    "noeviction",
    "--min-replicas-max-lag",
    "10",
    "--min-replicas-to-write",
    "1",
];

/// Journal write delays a walrus start picks from: a slow device two starts in three, so
/// that the check that needs no crash (`release.rs`) sees most of a run.
const DELAYS_MS: &[u64] = &[0, 0, 10, 20, 50, 50];

/// The journal backends a walrus on faultfs starts with, one chosen per start: io_uring
/// (`auto`: O_DIRECT|O_DSYNC writes, what production runs) or `sync` (the same writes, pwrite
/// on threads).
/// On the test's own disk, always `sync`, where the journal's fault injection acts.
const FAULTFS_BACKENDS: &[&str] = &["auto", "sync"];

/// How long walrus may take to serve reads again after a fault.
pub const RECOVERY: Duration = Duration::from_secs(90);

/// Keys the writes around walrus use (outside the clients' `{gen}:*`).
pub const AROUND_KEYS: usize = 16;

pub struct System {
    pub mode: Mode,
    /// False under `WALRUS_TEST_NO_DURABILITY=1` (the harness turns the journal off): a
    /// negative control, in which the checks must find lost writes and dirty reads.
    pub durable: bool,
    walrus: Option<Walrus>,
    /// External mode's Valkey.
    valkey: Option<Valkey>,
    /// External mode: Valkey's port, fixed, so that a restarted Valkey is where the last one
    /// was. Cluster modes: the node's bus port, fixed for the same reason (the other nodes
    /// know it by it). Managed mode: unused (Valkey is on its socket in the data directory).
    valkey_port: u16,
    data: PathBuf,
    checkpoint_flag: PathBuf,
    manifest_flag: PathBuf,
    /// Logs of the processes already replaced, for the report.
    logs: Vec<(String, String)>,
    rng: Rng,
    /// The faultfs mount the data directory is on, if any (dropped after walrus).
    fs: Option<FaultFs>,
    /// The delay faultfs gives each synchronous write and sync, as this walrus's start
    /// chose (a power loss changes it for a moment).
    latency_us: u64,
    /// The journal delay the current walrus started with (`release.rs`).
    pub delay_ms: u64,
    /// Cluster mode: walrus's client port, which the cluster knows the shard by, the same
    /// across restarts; the other two shards; the node ids, this shard's first.
    listen: Option<u16>,
    pub peers: Vec<Peer>,
    pub ids: Vec<String>,
    /// Holds the data directory (unless on faultfs) and the flag files.
    _dir: tempfile::TempDir,
}

impl System {
    /// Starts the system, on `fs` if given (seeded with `seed` too: its tears and reorders
    /// replay).
    pub fn start(mode: Mode, seed: u64, fs: Option<FaultFs>) -> System {
        let dir = tempfile::tempdir().unwrap();
        let data = match &fs {
            Some(fs) => {
                fs.ok(&format!("seed {seed}"));
                fs.path("data")
            }
            None => dir.path().join("data"),
        };
        let mut sys = System {
            mode,
            durable: std::env::var_os("WALRUS_TEST_NO_DURABILITY").is_none_or(|v| v != "1"),
            walrus: None,
            valkey: None,
            valkey_port: 0,
            data,
            checkpoint_flag: dir.path().join("checkpoint-fails"),
            manifest_flag: dir.path().join("manifest-fails"),
            logs: Vec::new(),
            rng: Rng(seed),
            fs,
            latency_us: 0,
            delay_ms: 0,
            listen: mode.cluster().then(free_port),
            peers: Vec::new(),
            ids: Vec::new(),
            _dir: dir,
        };
        match mode {
            Mode::Managed | Mode::Cluster | Mode::Shards => sys.valkey_port = free_port(),
            Mode::External => {
                let v = Valkey::start_with(sys.external_valkey_args());
                sys.valkey_port = v.port;
                sys.valkey = Some(v);
            }
        }
        if let Err(e) = sys.launch() {
            panic!("{e}");
        }
        if mode.cluster() {
            sys.form_cluster();
        }
        sys
    }

    /// The current walrus, unless it is away (killed, restarting).
    pub fn walrus(&self) -> Option<&Walrus> {
        self.walrus.as_ref()
    }

    pub fn addr(&self) -> String {
        self.walrus
            .as_ref()
            .map_or_else(String::new, |w| w.addr.clone())
    }

    /// Starts walrus on the data directory and waits until it listens; returns the journal
    /// write delay it got and its journal backend, or why it did not start.
    pub fn launch(&mut self) -> Result<(u64, &'static str), String> {
        assert!(self.walrus.is_none(), "walrus already runs");
        // A manifest that cannot be written stops walrus at start (docs/failure-modes.md,
        // row 10): documented, so not a fault to look for here.
        self.set_flag(Flag::Manifest, false);
        // The first start always slows its journal: the check that needs no crash sees the
        // run from its start.
        let first = self.delay_ms == 0 && self.logs.is_empty();
        let delays = if first { &DELAYS_MS[2..] } else { DELAYS_MS };
        let delay = delays[self.rng.below(delays.len() as u64) as usize];
        let mut failpoints = vec![
            (
                "rdb::write",
                format!("return(ENOSPC@{})", self.checkpoint_flag.display()),
            ),
            (
                "manifest::write",
                format!("return(EIO@{})", self.manifest_flag.display()),
            ),
        ];
        let backend = match &self.fs {
            Some(fs) => {
                // The slow device is faultfs's: each synchronous write and sync waits, so a
                // power loss finds journal writes in flight, whatever the backend.
                self.latency_us = delay * 1000;
                fs.ok(&format!("latency {}", self.latency_us));
                FAULTFS_BACKENDS[self.rng.below(FAULTFS_BACKENDS.len() as u64) as usize]
            }
            None => {
                if delay > 0 {
                    failpoints.push(("journal::write", format!("sleep({delay})")));
                }
                "sync"
            }
        };
        let listen = self.listen.map(|p| format!("127.0.0.1:{p}"));
        let (proc, config_dir) = self.spawn_walrus(backend, &failpoints, listen.as_deref());
        self.delay_ms = delay;
        match node::listening(proc, config_dir) {
            Ok(w) => self.walrus = Some(w),
            Err((log, why)) => {
                // Kept for the report.
                self.logs.push(("walrus".into(), log));
                return Err(why);
            }
        }
        Ok((delay, backend))
    }

    /// Spawns a walrus on the data directory with journal backend `backend`, fail points
    /// `failpoints` (name, actions), listening on `listen` (else a free port).
    fn spawn_walrus(
        &self,
        backend: &str,
        failpoints: &[(&str, String)],
        listen: Option<&str>,
    ) -> (crate::common::Proc, tempfile::TempDir) {
        let config = format!("io_backend = \"{backend}\"\n{}", config());
        let upstream = self.valkey_addr();
        let build = match self.mode {
            Mode::External => Walrus::build().upstream(&upstream).config(&format!(
                "{config}[upstream]\nreply_timeout_ms = {}\n",
                node::REPLY_TIMEOUT_MS
            )),
            mode => {
                let managed = node::managed_config(
                    self.valkey_port,
                    self.durable,
                    mode.cluster(),
                    &self.socket_dir(),
                );
                Walrus::build().config(&format!("{config}{managed}"))
            }
        };
        let build = match listen {
            Some(l) => build.listen(l),
            None => build,
        };
        let build = failpoints
            .iter()
            .fold(build, |b, (name, actions)| b.failpoint(name, actions));
        build.data(&self.data).spawn()
    }

    /// Starts a second walrus on the running one's data directory (its configuration, but
    /// its own client port), without waiting for it.
    pub fn spawn_second(&self) -> (crate::common::Proc, tempfile::TempDir) {
        self.spawn_walrus("sync", &[], None)
    }

    /// Stops walrus with SIGTERM; returns how it exited, `None` if it did not within
    /// `bound` (it is SIGKILLed then). Its managed Valkey is gone too when this returns.
    pub fn stop_walrus(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        let mut w = self.walrus.take()?;
        let valkey = node::managed_valkey(&w);
        w.proc.signal(libc::SIGTERM);
        let status = w.proc.wait_exit(bound);
        if status.is_none() {
            w.proc.signal(libc::SIGKILL);
            w.proc.wait_exit(Duration::from_secs(10));
        }
        if let Some(pid) = valkey {
            // Walrus stops its Valkey as it stops; one left behind is killed.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            crate::common::wait_dead(pid);
        }
        self.logs.push(("walrus".into(), w.proc.log_text()));
        status
    }

    /// The pid of Valkey: the managed one's, or external mode's.
    pub fn valkey_pid(&self) -> Option<i32> {
        match self.mode {
            Mode::External => self.valkey.as_ref().map(|v| v.proc.child.id() as i32),
            _ => self.walrus.as_ref().and_then(node::managed_valkey),
        }
    }

    /// Sends a faultfs command (`crash`, `recover`...); returns its reply. Panics without
    /// faultfs, or when the command fails.
    pub fn power(&self, command: &str) -> String {
        self.fs
            .as_ref()
            .expect("power losses need walrus's data on faultfs")
            .ok(command)
    }

    /// faultfs's delay back to what this walrus's start chose.
    pub fn restore_latency(&self) {
        self.power(&format!("latency {}", self.latency_us));
    }

    /// Returns true once faultfs holds a synchronous write or a sync in its latency (a
    /// write in flight, for a power loss to catch), false if none came within `timeout`.
    pub fn await_in_flight(&self, timeout: Duration) -> bool {
        let fs = self.fs.as_ref().expect("on faultfs");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if fs.status()["delayed"] > 0 {
                return true;
            }
            // faultfs's counters have no event to await: a short poll.
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    pub fn on_faultfs(&self) -> bool {
        self.fs.is_some()
    }

    /// SIGKILLs walrus and returns once it is gone (in managed mode, its Valkey too, which
    /// PDEATHSIG kills with it).
    pub fn kill_walrus(&mut self) {
        if let Some(w) = self.walrus.take() {
            self.logs.push(("walrus".into(), node::kill(w)));
        }
    }

    /// SIGKILLs Valkey only. Managed: walrus restores the one it restarts by itself.
    /// External: a new, empty one is started on the same port, behind walrus's back.
    /// False when there was none to kill (walrus was restarting it).
    pub fn kill_valkey(&mut self) -> bool {
        if self.mode.managed() {
            return self.walrus.as_ref().is_some_and(node::kill_valkey);
        }
        self.stop_external_valkey();
        self.start_external_valkey();
        true
    }

    pub fn stop_external_valkey(&mut self) {
        if let Some(mut v) = self.valkey.take() {
            v.proc.signal(libc::SIGKILL);
            v.proc
                .wait_exit(Duration::from_secs(10))
                .expect("SIGKILLed valkey exits");
            self.logs.push(("valkey".into(), v.proc.log_text()));
        }
    }

    fn external_valkey_args(&self) -> &'static [&'static str] {
        let n = EXTERNAL_VALKEY.len();
        if self.durable {
            EXTERNAL_VALKEY
        } else {
            &EXTERNAL_VALKEY[..n - 4]
        }
    }

    pub fn start_external_valkey(&mut self) {
        let port = self.valkey_port.to_string();
        let mut args = self.external_valkey_args().to_vec();
        args.extend(["--port", &port]);
        self.valkey = Some(Valkey::start_with(&args));
    }

    /// How many lines of the current walrus's log contain `needle`.
    pub fn lines(&self, needle: &str) -> usize {
        self.walrus
            .as_ref()
            .map_or(0, |w| w.proc.log_text().matches(needle).count())
    }

    /// Returns once the current walrus has logged more than `before` lines with `needle`.
    pub fn await_lines(&self, needle: &str, before: usize, timeout: Duration) {
        let w = self.walrus.as_ref().expect("walrus runs");
        let deadline = Instant::now() + timeout;
        while self.lines(needle) <= before {
            // The harness's wait fails the run with walrus's log when the line never comes.
            w.proc
                .wait_line(needle, deadline.saturating_duration_since(Instant::now()));
        }
    }

    /// Returns once walrus serves a read (`node::await_serving`), within `bound`.
    pub fn await_serving(&self, bound: Duration) -> Result<(), String> {
        node::await_serving(&self.addr(), bound)
    }

    /// Sets a key outside the clients' histories (one of the keys written around walrus)
    /// through walrus: `Ok` once acknowledged, else walrus's error (or why there was none).
    pub fn try_write(&self) -> Result<(), String> {
        let mut c = Raw::try_connect(&self.addr()).map_err(|e| e.to_string())?;
        let set = walrus::resp::write::command(["SET", "around:0", "probe"]);
        c.stream.write_all(&set).map_err(|e| e.to_string())?;
        match c.try_read_frame()? {
            r if r.starts_with(b"+OK") => Ok(()),
            r => Err(String::from_utf8_lossy(&r).trim_end().to_string()),
        }
    }

    /// Turns a file-system fault on or off (it holds while its flag file exists).
    pub fn set_flag(&self, flag: Flag, on: bool) {
        let path = self.flag_path(flag);
        if on {
            std::fs::write(path, b"").unwrap();
        } else if path.exists() {
            std::fs::remove_file(path).unwrap();
        }
    }

    pub fn flag(&self, flag: Flag) -> bool {
        self.flag_path(flag).exists()
    }

    fn flag_path(&self, flag: Flag) -> &Path {
        match flag {
            Flag::Checkpoint => &self.checkpoint_flag,
            Flag::Manifest => &self.manifest_flag,
        }
    }

    /// Where Valkey itself listens: the managed one's Unix socket, the external one's port.
    fn valkey_addr(&self) -> String {
        match self.mode {
            Mode::External => format!("127.0.0.1:{}", self.valkey_port),
            _ => node::valkey_socket(&self.socket_dir()),
        }
    }

    /// The managed Valkey's socket directory: beside the flag files, off faultfs.
    fn socket_dir(&self) -> PathBuf {
        self._dir.path().join("run")
    }

    /// `CLIENT KILL TYPE <kind>` on Valkey itself: walrus's client connections (`normal`)
    /// or its replica link (`replica`) break under it.
    pub fn drop_connections(&self, kind: &str) -> bool {
        let Ok(mut c) = Raw::try_connect(&self.valkey_addr()) else {
            return false;
        };
        let kill = walrus::resp::write::command(["CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"]);
        c.stream.write_all(&kill).is_ok() && c.try_read_frame().is_ok()
    }

    /// Writes `n` values of 64 KiB straight into Valkey, around walrus (as an operator's
    /// script might), to keys walrus's clients never use: Valkey's stream grows while
    /// walrus refuses its own clients' writes, so a ring at its watermark fills to the end.
    pub fn write_around(&self, n: usize) -> bool {
        let Ok(mut c) = Raw::try_connect(&self.valkey_addr()) else {
            return false;
        };
        let value = vec![b'w'; 64 << 10];
        for i in 0..n {
            let key = format!("around:{}", i % AROUND_KEYS);
            let set = walrus::resp::write::command([b"SET".as_slice(), key.as_bytes(), &value]);
            // Valkey refuses them (-NOREPLICAS) while walrus's link lags: fine either way.
            if c.stream.write_all(&set).is_err() || c.try_read_frame().is_err() {
                return false;
            }
        }
        true
    }

    /// Keeps `text` among the run's logs (what a tool the faults ran said).
    pub fn keep_log(&mut self, name: &str, text: String) {
        self.logs.push((name.to_string(), text));
    }

    /// Every process log of the run, the current ones last; then the other shards'.
    pub fn logs(&self) -> Vec<(String, String)> {
        let mut logs = self.logs.clone();
        if let Some(w) = &self.walrus {
            logs.push(("walrus".into(), w.proc.log_text()));
        }
        if let Some(v) = &self.valkey {
            logs.push(("valkey".into(), v.proc.log_text()));
        }
        for p in &self.peers {
            logs.extend(p.logs());
        }
        logs
    }
}

#[derive(Clone, Copy)]
pub enum Flag {
    Checkpoint,
    Manifest,
}

impl Drop for System {
    /// Walrus and the external Valkey die with their `Proc`s; the managed Valkey is killed
    /// first rather than left to PDEATHSIG.
    fn drop(&mut self) {
        let managed = self.walrus.as_ref().filter(|_| self.mode.managed());
        if let Some(pid) = managed.and_then(node::managed_valkey) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
