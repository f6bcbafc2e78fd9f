//! Test harness: real valkey-server and walrus processes on free ports, a raw RESP client
//! for byte-exact comparisons, and faultfs mounts (faultfs.rs). Every wait is on an event
//! (a log line, a reply) or on a state walrus exposes (`/status`, a metric: state.rs),
//! bounded by a timeout that fails the test with the process's log.
#![allow(dead_code)]

pub mod certs;
pub mod faultfs;
pub mod pair;
pub mod seaweed;
pub mod seccomp;
pub mod server;
pub mod state;
pub mod tls;
#[allow(unused_imports)] // each test binary uses a different part
pub use pair::{decode, hello_without_id, show_args, sorted, Pair};

use bytes::BytesMut;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use walrus::resp::{Limits, ReplyScanner};

pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Polls `holds` until it is true, for state no event announces (Valkey's INFO, a pool
/// reconnecting); after `START_TIMEOUT` the test fails naming `what` instead of spinning on.
pub fn await_state(what: &str, mut holds: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    while !holds() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {START_TIMEOUT:?}: {what}"
        );
    }
}

pub fn valkey_server_bin() -> PathBuf {
    walrus::upstream::binary::find("").expect("a valkey-server binary (run deploy/setup.sh)")
}

pub fn walrus_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_walrus"))
}

/// A child process whose output lines are collected and can be awaited.
pub struct Proc {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Notified as each line is added to `log` ([`Proc::await_output`]) and as each pipe
    /// ends.
    logged: Arc<Condvar>,
    /// How many of the two pipes have ended (the process and whatever inherited them closed
    /// them): [`Proc::wait_exit`] returns the whole log.
    ended: Arc<std::sync::atomic::AtomicUsize>,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(mut cmd: Command, from_stderr: bool) -> Proc {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let log = Arc::new(Mutex::new(Vec::new()));
        let logged = Arc::new(Condvar::new());
        let (tx, lines) = mpsc::channel();
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
        let (watched, other) = if from_stderr { (err, out) } else { (out, err) };
        for (stream, tx) in [(watched, Some(tx)), (other, None)] {
            let (log, logged, ended) = (log.clone(), logged.clone(), ended.clone());
            // Drains the pipe for the process's whole life, so it never blocks on a full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line.clone());
                    logged.notify_all();
                    if let Some(tx) = &tx {
                        let _ = tx.send(line);
                    }
                }
                let _log = log.lock().unwrap();
                ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                logged.notify_all();
            });
        }
        Proc {
            child,
            log,
            logged,
            ended,
            lines,
        }
    }

    /// How many lines the process has written so far.
    pub fn lines_logged(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Returns once the process has written more than `seen` lines, or `at_most` has passed.
    pub fn await_output(&self, seen: usize, at_most: Duration) {
        let log = self.log.lock().unwrap();
        let _ = self
            .logged
            .wait_timeout_while(log, at_most, |l| l.len() <= seen)
            .unwrap();
    }

    /// Waits for a line containing `needle`; returns it.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> String {
        self.try_wait_line(needle, timeout).unwrap_or_else(|| {
            panic!(
                "no line containing {needle:?} within {timeout:?}; log:\n{}",
                self.log_text()
            )
        })
    }

    /// Waits for a line containing `needle`; `None` when the process's output ends (it
    /// exited) or `timeout` passes first.
    pub fn try_wait_line(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Its last lines may still be in the pipes: the log is whole once both end.
                // A child it started may hold them open (a Valkey outliving a SIGKILLed
                // walrus): then no longer than a pipe takes to drain.
                let left = deadline
                    .saturating_duration_since(std::time::Instant::now())
                    .min(Duration::from_secs(2));
                let log = self.log.lock().unwrap();
                let _ = self.logged.wait_timeout_while(log, left, |_| {
                    self.ended.load(std::sync::atomic::Ordering::SeqCst) < 2
                });
                return Some(s);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            // Polling a child's exit status has no event to await from std; keep it short.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `walrus ARGS...`, run to its end.
pub fn run_walrus(args: &[&str]) -> std::process::Output {
    Command::new(walrus_bin()).args(args).output().unwrap()
}

/// A finished command's exit code and output, for assertion messages.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits for walrus's "listening on" log line and returns the address in it.
pub fn listening_addr(walrus: &Proc) -> String {
    addr_in(&walrus.wait_line(LISTENING, START_TIMEOUT))
}

/// What walrus logs once it listens, before its address.
pub const LISTENING: &str = "walrus listening on ";

/// The address in walrus's "listening on" line.
pub fn addr_in(line: &str) -> String {
    let rest = line.split(LISTENING).nth(1).unwrap();
    rest.split(|c: char| c == ',' || c.is_whitespace())
        .next()
        .unwrap()
        .to_string()
}

pub fn free_port() -> u16 {
    walrus::upstream::managed::free_port().unwrap()
}

/// A valkey-server with persistence off on a free port.
pub struct Valkey {
    pub proc: Proc,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Valkey {
    pub fn start() -> Valkey {
        Valkey::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> Valkey {
        Valkey::start_bin(&valkey_server_bin(), args)
    }

    /// The same, from another server binary (a version of the matrix).
    pub fn start_bin(binary: &std::path::Path, args: &[&str]) -> Valkey {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let mut cmd = Command::new(binary);
            cmd.args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            // walrus attaches as a replica: send it the RDB at once, not after Valkey's
            // default 5 s wait for more replicas.
            .args(["--repl-diskless-sync-delay", "0", "--logfile", ""])
            .arg("--dir")
            .arg(dir.path())
            .args(args);
            let mut proc = Proc::spawn(cmd, false);
            let deadline = std::time::Instant::now() + START_TIMEOUT;
            loop {
                match proc
                    .lines
                    .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                {
                    Ok(l) if l.contains("Ready to accept connections") => {
                        return Valkey { proc, port, dir }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // Port taken between probe and bind, most likely: try another.
            let _ = proc.child.kill();
            eprintln!("valkey-server did not start; log:\n{}", proc.log_text());
        }
        panic!("valkey-server failed to start five times");
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// The journal every test walrus uses: small, so that it initializes in milliseconds.
pub const TEST_JOURNAL: &str =
    "[journal]\nsegment_size = 1048576\nsegments = 16\nmax_entry_bytes = 8388608\n";

/// The checkpoint trigger every test walrus uses: the suites that write until a checkpoint
/// are sized for one at half the test ring (8 MiB), the default before checkpoints waited
/// for the ring's room or the restore budget (0.8 of the ring at the latest now). A test
/// adds keys of its own to this table with [`WalrusBuilder::checkpoint`] (its own trigger
/// replaces this one).
pub const TEST_CHECKPOINT: &str = "[checkpoint]\nring_fill_trigger = 0.5\n";

/// A walrus in external mode in front of `upstream`, listening on a free port (which, with
/// durability on, it does once its journal is attached to Valkey's replication stream).
pub struct Walrus {
    pub proc: Proc,
    pub addr: String,
    pub data: tempfile::TempDir,
    /// Its metrics endpoint (`/status`, `/metrics`), when it has one: started with
    /// [`WalrusBuilder::with_metrics`] or `--metrics-listen ADDR`.
    pub metrics: Option<String>,
}

/// How a test starts a walrus: `Walrus::build()`, then what differs from the default, then
/// `start()` (waits until it listens) or `spawn()` (for starts that must fail). Managed mode
/// (the default a user gets: walrus runs its own valkey-server) unless `upstream` is set.
/// `WALRUS_TEST_NO_DURABILITY=1` turns the journal off, to check the proxy on its own.
#[derive(Default)]
pub struct WalrusBuilder<'a> {
    upstream: Option<&'a str>,
    config: String,
    checkpoint: String,
    args: Vec<&'a str>,
    data: Option<&'a std::path::Path>,
    env: Vec<(&'a str, &'a str)>,
    failpoints: Vec<String>,
    open_files: Option<u64>,
    journal: Option<String>,
    listen: Option<String>,
    metrics: Option<String>,
    refuse_io_uring: bool,
}

impl<'a> WalrusBuilder<'a> {
    /// External mode, in front of the Valkey at `addr`.
    pub fn upstream(mut self, addr: &'a str) -> Self {
        self.upstream = Some(addr);
        self
    }

    /// TOML added to the test journal settings (no `[journal]` table).
    pub fn config(mut self, toml: &str) -> Self {
        self.config.push_str(toml);
        self
    }

    /// A `[journal]` table replacing [`TEST_JOURNAL`] (another ring geometry).
    pub fn journal(mut self, toml: &str) -> Self {
        self.journal = Some(toml.to_string());
        self
    }

    /// Keys added to the test's `[checkpoint]` table ([`TEST_CHECKPOINT`]).
    pub fn checkpoint(mut self, toml: &str) -> Self {
        self.checkpoint.push_str(toml);
        self
    }

    /// Further `serve` flags (a `--config FILE` among them is merged into the configuration).
    pub fn args(mut self, args: &[&'a str]) -> Self {
        self.args.extend_from_slice(args);
        self
    }

    /// A data directory to reuse (a restart); otherwise a fresh one.
    pub fn data(mut self, dir: &'a std::path::Path) -> Self {
        self.data = Some(dir);
        self
    }

    /// Extra environment variables.
    pub fn env(mut self, env: &[(&'a str, &'a str)]) -> Self {
        self.env.extend_from_slice(env);
        self
    }

    /// A fail point of this walrus (src/fault/points.rs): `name` configured with `actions`.
    pub fn failpoint(mut self, name: &str, actions: &str) -> Self {
        self.failpoints.push(format!("{name}={actions}"));
        self
    }

    /// A journal device that takes `delay_ms` for every write: the sync backend, whose
    /// writes the fail point `journal::write` then delays.
    pub fn slow_journal(mut self, delay_ms: u64) -> Self {
        // Before whatever tables the test adds: a key of the `[journal]` table.
        self.config.insert_str(0, "io_backend = \"sync\"\n");
        self.failpoint("journal::write", &format!("sleep({delay_ms})"))
    }

    /// The client address to listen on (a restart that must keep its port); otherwise a
    /// free port.
    pub fn listen(mut self, addr: &str) -> Self {
        self.listen = Some(addr.to_string());
        self
    }

    /// A metrics endpoint on a free port, for the waits on walrus's state
    /// ([`Walrus::await_status`], [`Walrus::await_metric`]).
    pub fn with_metrics(mut self) -> Self {
        self.metrics = Some(format!("127.0.0.1:{}", free_port()));
        self
    }

    /// Starts walrus with this open-files limit (soft and hard).
    pub fn open_files(mut self, n: u64) -> Self {
        self.open_files = Some(n);
        self
    }

    /// Starts walrus (and so its managed Valkey) under a seccomp filter that refuses io_uring
    /// with EPERM, as containerd's and Docker's RuntimeDefault profiles do ([`seccomp`]).
    pub fn refuse_io_uring(mut self) -> Self {
        self.refuse_io_uring = true;
        self
    }

    /// Starts walrus and waits until it listens.
    pub fn start(self) -> Walrus {
        let (cmd, dir, metrics) = self.command();
        let proc = Proc::spawn(cmd, true);
        let addr = listening_addr(&proc);
        Walrus {
            proc,
            addr,
            data: dir,
            metrics,
        }
    }

    /// Starts walrus without waiting for it to listen. The returned directory holds its
    /// configuration file.
    pub fn spawn(self) -> (Proc, tempfile::TempDir) {
        let (cmd, dir, _) = self.command();
        (Proc::spawn(cmd, true), dir)
    }

    /// The `walrus serve` command, the temporary directory with its configuration (and,
    /// unless `data` is given, its data directory `data/`), and its metrics endpoint.
    fn command(self) -> (Command, tempfile::TempDir, Option<String>) {
        let WalrusBuilder {
            upstream,
            config,
            checkpoint,
            args: extra,
            data,
            env,
            failpoints,
            open_files,
            journal,
            listen,
            metrics,
            refuse_io_uring,
        } = self;
        let dir = tempfile::tempdir().unwrap();
        let data_dir = data
            .map(|d| d.to_path_buf())
            .unwrap_or_else(|| dir.path().join("data"));
        // A test that sets its own trigger replaces the pinned one.
        let pinned = if checkpoint.contains("ring_fill_trigger") {
            "[checkpoint]\n"
        } else {
            TEST_CHECKPOINT
        };
        let journal = journal.as_deref().unwrap_or(TEST_JOURNAL);
        let mut text = format!("{pinned}{checkpoint}\n{journal}{config}\n");
        // A `--config FILE` among the flags is merged into the test configuration.
        let mut args: Vec<&str> = Vec::new();
        let mut it = extra.iter();
        while let Some(a) = it.next() {
            if *a == "--config" {
                let file = it.next().expect("--config takes a file");
                text.push_str(&std::fs::read_to_string(file).unwrap());
                text.push('\n');
            } else {
                args.push(a);
            }
        }
        if std::env::var_os("WALRUS_TEST_NO_DURABILITY").is_some_and(|v| v == "1") {
            text.push_str("[durability]\nenabled = false\n");
        }
        let path = dir.path().join("walrus.toml");
        std::fs::write(&path, text).unwrap();
        let mut cmd = Command::new(walrus_bin());
        cmd.args(["serve", "--config", path.to_str().unwrap()])
            .args([
                "--listen",
                listen.as_deref().unwrap_or("127.0.0.1:0"),
                "--data-dir",
            ])
            .arg(&data_dir)
            .args(&args)
            // A test's own RUST_LOG (debug lines to await) wins.
            .env("RUST_LOG", "info")
            .envs(env.iter().copied());
        if !failpoints.is_empty() {
            cmd.env("FAILPOINTS", with_inherited_failpoints(&failpoints));
        }
        if let Some(u) = upstream {
            cmd.args(["--upstream", u]);
        }
        if let Some(n) = open_files {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe and touches only `lim`, a copy.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if refuse_io_uring {
            use std::os::unix::process::CommandExt;
            // SAFETY: the filter's installation allocates nothing and calls only prctl.
            unsafe { cmd.pre_exec(seccomp::refuse_io_uring) };
        }
        let given = args
            .iter()
            .position(|a| *a == "--metrics-listen")
            .map(|i| args[i + 1].to_string());
        let metrics = match (metrics, given) {
            (Some(m), None) => {
                cmd.args(["--metrics-listen", &m]);
                Some(m)
            }
            (None, None) => {
                cmd.args(["--metrics-listen", ""]);
                None
            }
            (None, Some(m)) => Some(m).filter(|m| !m.is_empty()),
            (Some(_), Some(_)) => panic!("with_metrics() and --metrics-listen: one or the other"),
        };
        (cmd, dir, metrics)
    }
}

/// `points` after the `FAILPOINTS` this test runs with, if any: a walrus a test gives fail
/// points of its own still gets those of the run (`FAILPOINTS=journal::no_sync=return`, the
/// power-loss tests' negative control), which a walrus started without any inherits anyway.
pub fn with_inherited_failpoints(points: &[String]) -> String {
    let inherited = std::env::var("FAILPOINTS").unwrap_or_default();
    std::iter::once(inherited.as_str())
        .chain(points.iter().map(String::as_str))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(";")
}

impl Walrus {
    pub fn build<'a>() -> WalrusBuilder<'a> {
        WalrusBuilder::default()
    }

    /// Stops walrus with SIGTERM and awaits its clean exit (status 0).
    pub fn stop(&mut self) {
        self.proc.signal(libc::SIGTERM);
        let status = self
            .proc
            .wait_exit(START_TIMEOUT)
            .unwrap_or_else(|| panic!("walrus did not exit; log:\n{}", self.proc.log_text()));
        assert!(status.success(), "{status:?}\n{}", self.proc.log_text());
    }

    /// SIGKILLs a managed walrus and returns once its Valkey, which dies with it, is gone.
    pub fn kill_with_valkey(&mut self) {
        let pid = valkey_pid(&self.addr);
        self.proc.signal(libc::SIGKILL);
        self.proc.wait_exit(Duration::from_secs(10)).unwrap();
        wait_dead(pid);
    }

    /// SIGKILLs only the managed Valkey and returns once walrus has restored a new one (with
    /// a partial resync after it) and serves it. Returns the dead Valkey's pid. Needs the
    /// metrics endpoint.
    pub fn kill_valkey_and_await_restore(&self) -> i32 {
        let pid = valkey_pid(&self.addr);
        unsafe { libc::kill(pid, libc::SIGKILL) };
        self.proc
            .wait_line("managed valkey-server exited", START_TIMEOUT);
        // Only the log tells a partial resync from a full one.
        self.proc
            .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
        self.await_attached();
        pid
    }

    /// Returns once the replica link is attached, after a restore or a break (clients get
    /// -LOADING until then). Needs the metrics endpoint.
    pub fn await_attached(&self) {
        self.await_status("the replica link attached", |s| s.link == "attached");
    }

    /// Returns once writes are accepted (it sets the key `probe` to 1): walrus refuses them
    /// (`-MISCONF`) while its ring is above the high watermark, until a checkpoint releases
    /// it. Each refusal waits for the next checkpoint (or finds one already taken). Needs the
    /// metrics endpoint.
    pub fn await_writable(&self) {
        let mut c = Raw::connect(&self.addr);
        loop {
            let r = c.cmd(&["SET", "probe", "1"]);
            if r == b"+OK\r\n" {
                return;
            }
            assert!(r.starts_with(b"-MISCONF"), "{}", show(&r));
            self.await_checkpoint(self.checkpoints());
        }
    }

    /// How many checkpoints this walrus has taken (`walrus_checkpoints_total`). Needs the
    /// metrics endpoint.
    pub fn checkpoints(&self) -> usize {
        self.sample(CHECKPOINTS).unwrap_or(0.0) as usize
    }

    /// Returns once this walrus has taken more than `before` checkpoints.
    pub fn await_checkpoint(&self, before: usize) {
        self.await_metric(CHECKPOINTS, |n| n > before as f64);
    }

    /// A walrus in front of `v` whose journal device takes `delay_ms` for every write (the
    /// sync backend's fail point `journal::write`).
    pub fn slow(v: &Valkey, delay_ms: u64) -> Walrus {
        Walrus::build()
            .upstream(&v.addr())
            .slow_journal(delay_ms)
            .start()
    }
}

/// The counter of checkpoints taken.
pub const CHECKPOINTS: &str = "walrus_checkpoints_total";

/// `v` as a RESP bulk string, the way a reply carries it.
pub fn bulk(v: impl AsRef<[u8]>) -> Vec<u8> {
    let v = v.as_ref();
    let mut out = format!("${}\r\n", v.len()).into_bytes();
    out.extend_from_slice(v);
    out.extend_from_slice(b"\r\n");
    out
}

/// A client's socket: TCP, or a Unix socket (the managed Valkey's only listener).
pub enum Sock {
    Tcp(TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Sock {
    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(t),
            Sock::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_write_timeout(t),
            Sock::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_nonblocking(on),
            Sock::Unix(s) => s.set_nonblocking(on),
        }
    }

    /// Reads without consuming (std has no peek on a Unix socket yet: recv with MSG_PEEK).
    pub fn peek(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        match self {
            Sock::Tcp(s) => s.peek(buf),
            Sock::Unix(s) => {
                // SAFETY: recv writes at most buf.len() bytes into buf.
                let n = unsafe {
                    libc::recv(
                        s.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_PEEK,
                    )
                };
                if n < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(n as usize)
            }
        }
    }
}

impl std::os::fd::AsRawFd for Sock {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(buf),
            Sock::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(buf),
            Sock::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sock::Tcp(s) => s.flush(),
            Sock::Unix(s) => s.flush(),
        }
    }
}

/// A blocking RESP client that returns replies as raw bytes, over any stream: [`Raw`] over
/// TCP or a Unix socket, `tls::TlsRaw` over TLS.
pub struct RespClient<S> {
    pub stream: S,
    buf: BytesMut,
    scanner: ReplyScanner,
}

/// [`RespClient`] over TCP or a Unix socket.
pub type Raw = RespClient<Sock>;

impl<S: Read + Write> RespClient<S> {
    pub fn over(stream: S) -> RespClient<S> {
        RespClient {
            stream,
            buf: BytesMut::new(),
            scanner: ReplyScanner::new(Limits::default()),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
        self.stream.flush().unwrap();
    }

    /// Sends a command and returns its reply's bytes.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Vec<u8> {
        self.send_raw(&walrus::resp::write::command(
            args.iter().map(|a| a.as_ref()),
        ));
        self.read_frame()
    }

    /// Reads one whole reply frame; panics on timeout or EOF.
    pub fn read_frame(&mut self) -> Vec<u8> {
        self.try_read_frame()
            .unwrap_or_else(|e| panic!("no reply: {e}"))
    }

    /// A command whose connection may be gone (walrus killed, restarting, or refusing it):
    /// `None` instead of a failure when it cannot be sent or answered.
    pub fn try_cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Option<Vec<u8>> {
        let cmd = walrus::resp::write::command(args.iter().map(|a| a.as_ref()));
        self.stream.write_all(&cmd).ok()?;
        self.stream.flush().ok()?;
        self.try_read_frame().ok()
    }

    pub fn try_read_frame(&mut self) -> Result<Vec<u8>, String> {
        loop {
            if let Some(n) = self.scanner.scan(&self.buf).map_err(|e| e.to_string())? {
                return Ok(self.buf.split_to(n).to_vec());
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// True when the server closed the connection (after any bytes still unread).
    pub fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Reads until the end of the stream, what was buffered first: on TLS, `Ok` for a
    /// close_notify, `Err` for a cut.
    pub fn read_to_end(&mut self) -> Result<Vec<u8>, String> {
        let mut rest = self.buf.split().to_vec();
        self.stream
            .read_to_end(&mut rest)
            .map_err(|e| e.to_string())?;
        Ok(rest)
    }
}

impl Raw {
    /// Connects to `host:port`, or to a Unix socket named `unix:/path`.
    pub fn connect(addr: &str) -> Raw {
        Raw::try_connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
    }

    /// A connection, or why there is none (the server is restarting).
    pub fn try_connect(addr: &str) -> std::io::Result<Raw> {
        let stream = match addr.strip_prefix("unix:") {
            Some(path) => Sock::Unix(std::os::unix::net::UnixStream::connect(path)?),
            None => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                Sock::Tcp(s)
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Raw::over(stream))
    }

    /// Returns once the server's socket holds everything sent (the kernel's unacknowledged
    /// count is zero): on a loaded machine, loopback delivery may lag the `write`, and a test
    /// that signals the server right after sending must not race it.
    pub fn await_delivered(&self) {
        use std::os::fd::AsRawFd;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut unacked: libc::c_int = 0;
            let r = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::TIOCOUTQ, &mut unacked) };
            assert_eq!(r, 0, "ioctl(TIOCOUTQ): {}", std::io::Error::last_os_error());
            if unacked == 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{unacked} bytes never delivered"
            );
            std::thread::yield_now();
        }
    }
}

/// A slowed journal's delay (`Walrus::slow`) for the durability rule's tests: a reply that
/// comes much sooner than this after its write ran cannot be covered by the journal.
pub const JOURNAL_DELAY_MS: u64 = 1500;
/// A reply within this time of its request, while a write it depends on waits for the
/// journal, is a dirty read.
pub const EARLY: Duration = Duration::from_millis(300);

/// Sends a command without reading its reply.
pub fn send(c: &mut Raw, args: &[&str]) {
    c.send_raw(&walrus::resp::write::command(
        args.iter().map(|a| a.as_bytes()),
    ));
}

/// Whether a reply (or any message) arrives within `within`.
pub fn replied_within(c: &Raw, within: Duration) -> bool {
    c.stream.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1];
    let r = c.stream.peek(&mut b);
    c.stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    matches!(r, Ok(n) if n > 0)
}

/// Sends `write` on `writer` and waits until Valkey has run it (`probe` on Valkey directly
/// returns `ran`): from then on its effects are dirty until the journal covers them.
pub fn run_unjournaled(
    writer: &mut Raw,
    write: &[&str],
    direct: &mut Raw,
    probe: &[&str],
    ran: &[u8],
) {
    send(writer, write);
    while direct.cmd(probe) != ran {}
}

/// `sub` subscribes to `channel` (RESP2) and receives `message` as `publisher` publishes it
/// there, through Valkey.
pub fn assert_pubsub<S: Read + Write, P: Read + Write>(
    sub: &mut RespClient<S>,
    publisher: &mut RespClient<P>,
    channel: &str,
    message: &str,
) {
    let bulk = |s: &str| format!("${}\r\n{s}\r\n", s.len());
    assert_eq!(
        show(&sub.cmd(&["SUBSCRIBE", channel])),
        show(format!("*3\r\n$9\r\nsubscribe\r\n{}:1\r\n", bulk(channel)).as_bytes())
    );
    assert_eq!(publisher.cmd(&["PUBLISH", channel, message]), b":1\r\n");
    assert_eq!(
        show(&sub.read_frame()),
        show(format!("*3\r\n$7\r\nmessage\r\n{}{}", bulk(channel), bulk(message)).as_bytes())
    );
}

/// A counter or gauge from walrus's /metrics at `metrics` (`name` with its labels).
pub fn metric(metrics: &str, name: &str) -> f64 {
    let (_, body) = http_get(metrics, "/metrics");
    state::sample(&body, name).unwrap_or_else(|| panic!("{name} is not exported:\n{body}"))
}

/// Connects as a slow client: with a small receive buffer. (Set before connecting, so TCP
/// sizes its window and segments to it: shrunk after, loopback TCP sends by zero-window
/// probes whose backoff grows to minutes, and reading the replies hung a test.)
pub fn connect_slow(addr: &str, receive_buffer: usize) -> std::io::Result<TcpStream> {
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    s.set_recv_buffer_size(receive_buffer)?;
    s.connect(&addr.into())?;
    Ok(s.into())
}

/// Shows a reply readably in assertion messages.
pub fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).replace("\r\n", "⏎")
}

/// xorshift: reproducible randomness from a printed seed, without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Sends every command at once, then checks every reply is `want`; on a mismatch the
/// message shows `walrus`'s log, if given.
pub fn pipeline(c: &mut Raw, cmds: &[Vec<String>], want: &[u8], walrus: Option<&Walrus>) {
    let mut out = Vec::new();
    for cmd in cmds {
        out.extend_from_slice(&walrus::resp::write::command(
            cmd.iter().map(|a| a.as_bytes()),
        ));
    }
    c.send_raw(&out);
    for cmd in cmds {
        let r = c.read_frame();
        assert!(
            r == want,
            "{:.60}: {}\nwalrus's log:\n{}",
            format!("{cmd:?}"),
            show(&r),
            walrus.map(|w| w.proc.log_text()).unwrap_or_default()
        );
    }
}

/// `walrus journal export-aof --dir DIR --out FILE` (walrus stopped).
pub fn export_aof(dir: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    Command::new(walrus_bin())
        .args(["journal", "export-aof", "--dir"])
        .arg(dir)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run walrus journal export-aof")
}

/// Valkey `a` (the reference), Valkey `b`, and walrus in front of `b`: a [`Pair`] of their
/// clients must get the same bytes.
pub struct Twins {
    pub a: Valkey,
    pub b: Valkey,
    pub w: Walrus,
}

impl Twins {
    pub fn start() -> Twins {
        let a = Valkey::start();
        let b = Valkey::start();
        let w = Walrus::build().upstream(&b.addr()).start();
        Twins { a, b, w }
    }

    pub fn pair(&self) -> Pair {
        Pair {
            a: Raw::connect(&self.a.addr()),
            w: Raw::connect(&self.w.addr),
        }
    }
}

/// A field of `INFO <section>` asked on `c` (walrus forwards INFO); `None` when the
/// section does not list it.
pub fn info_field(c: &mut Raw, section: &str, field: &str) -> Option<String> {
    let text = String::from_utf8(c.cmd(&["INFO", section])).unwrap();
    walrus::upstream::info::field(&text, field).map(str::to_string)
}

/// The managed Valkey behind the walrus at `addr`, as [`Raw::connect`] names it: its Unix
/// socket (`unix:/path`, from `CONFIG GET unixsocket` through walrus), its only listener.
/// Only walrus's user (the tests') can open it.
pub fn managed_valkey_addr(addr: &str) -> String {
    let mut c = Raw::connect(addr);
    let r = String::from_utf8(c.cmd(&["CONFIG", "GET", "unixsocket"])).unwrap();
    // *2 $10 unixsocket $n path
    let path = r.split("\r\n").nth(4).unwrap_or_default();
    assert!(
        path.starts_with('/'),
        "the managed Valkey has no Unix socket: {r:?}"
    );
    format!("unix:{path}")
}

/// The pid of the Valkey behind `addr`.
pub fn valkey_pid(addr: &str) -> i32 {
    info_field(&mut Raw::connect(addr), "server", "process_id")
        .unwrap()
        .parse()
        .unwrap()
}

/// Starts walrus, expecting it to exit non-zero after a log line containing `needle`,
/// which it returns.
pub fn refuses_to_start(
    upstream: Option<&str>,
    config: &str,
    data: &std::path::Path,
    needle: &str,
) -> String {
    let (mut w, _cfg) = WalrusBuilder {
        upstream,
        ..Default::default()
    }
    .config(config)
    .data(data)
    .spawn();
    let line = w.wait_line(needle, START_TIMEOUT);
    let status = w
        .wait_exit(START_TIMEOUT)
        .expect("walrus must refuse to start");
    assert!(!status.success(), "{status:?}");
    line
}

/// PDEATHSIG kills the managed Valkey when walrus dies: wait for its exit, as an event (a
/// pidfd becomes readable when the process exits).
pub fn wait_dead(pid: i32) {
    // SAFETY: plain syscalls on a descriptor this function owns.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return; // already gone
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ready = unsafe { libc::poll(&mut p, 1, START_TIMEOUT.as_millis() as i32) };
    unsafe { libc::close(fd) };
    assert_eq!(ready, 1, "valkey {pid} outlived walrus");
}

/// A size-limited tmpfs mounted for one test: a real small file system to fill. Mounting
/// needs root or CAP_SYS_ADMIN; where it is refused, `mount` returns `None` after printing
/// that the part of the test needing it is skipped, and why.
pub struct Tmpfs {
    path: std::path::PathBuf,
    /// The directory it is mounted on, when the test did not name one.
    _dir: Option<tempfile::TempDir>,
}

impl Tmpfs {
    pub fn mount(size_mib: u64, read_only: bool) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let opts = format!("size={size_mib}m{}", if read_only { ",ro" } else { "" });
        let mut fs = Tmpfs::mount_with(dir.path(), &opts)?;
        fs._dir = Some(dir);
        Some(fs)
    }

    /// A tmpfs on `dir`, which exists: inside another mount, say a faultfs one whose path
    /// lookups can be held.
    pub fn mount_on(dir: &std::path::Path, size_mib: u64) -> Option<Tmpfs> {
        Tmpfs::mount_with(dir, &format!("size={size_mib}m,mode=0700"))
    }

    fn mount_with(dir: &std::path::Path, opts: &str) -> Option<Tmpfs> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "walrus-test"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                path: dir.to_path_buf(),
                _dir: None,
            }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs here ({}); this check needs root or CAP_SYS_ADMIN",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount ({e}); this check needs a tmpfs");
                None
            }
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process of the test may still hold a file open in it.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// `GET path` on walrus's metrics endpoint: (status code, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_request(addr, "GET", path)
}

/// `METHOD path`, without a body, over HTTP/1.1 to `addr`, the connection closed after the
/// answer: (status code, body).
pub fn http_request(addr: &str, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, text.split_once("\r\n\r\n").unwrap().1.to_string())
}

/// Copies the tree `from` into `to` (created).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// tests/fixtures/data-dir-0.1.0: the data directory of walrus 0.1.0 (commit 99b17f7),
/// before data directories had an identity, in managed mode with the ring
/// [`FIXTURE_RING`]: `SET key:N value-N` for N in 0..50, `walrus checkpoint` (which
/// released the journal through LSN 51), N in 50..100, then SIGTERM.
pub const FIXTURE_RING: &str =
    "[journal]\nsegment_size = 65536\nsegments = 4\nmax_write_bytes = 16384\n";

/// A copy of tests/fixtures/data-dir-0.1.0 to work on: the temporary directory (kept for
/// the copy's life) and the data directory in it.
pub fn fixture_data_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    copy_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data-dir-0.1.0"),
        &data,
    );
    (tmp, data)
}

/// Appends 40 entries of 1000 bytes to `j` (`[i; 1000]` for LSN i), one write each, so that
/// later records carry durable hints covering earlier ones; returns the write position
/// after each.
pub async fn append_numbered_entries(j: &walrus::journal::Journal) -> Vec<u64> {
    let mut positions = Vec::new();
    for i in 1..=40u64 {
        let t = j
            .try_append(&walrus::journal::Entry {
                repl_id: [b'r'; 40],
                repl_offset_end: i * 1000,
                payload: bytes::Bytes::from(vec![i as u8; 1000]),
            })
            .unwrap();
        t.wait().await.unwrap();
        positions.push(j.status().write_pos);
    }
    positions
}

/// Flips one bit of the journal's first segment at `pos`: damage inside a record.
pub fn flip_journal_byte(dir: &std::path::Path, pos: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join("seg-00000.wal"))
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], pos).unwrap();
}
