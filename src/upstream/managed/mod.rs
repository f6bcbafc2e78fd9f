//! Managed mode: walrus runs its own valkey-server child, persistence off, on a Unix socket.
//!
//! The child is started with the settings walrus needs ([`super::settings`]: persistence off,
//! since walrus is the durability layer; a large backlog; diskless sync and load), with no
//! TCP port (`--port 0`) and a Unix socket in a directory only walrus's user may open
//! ([`super::socket_dir`]): nothing else on the host reaches it, so nothing reads data that
//! is not durable yet or writes around the journal. Its working directory is under the data
//! dir. Its log goes to walrus's log (target `valkey`). If it dies, it is
//! restarted with backoff; on shutdown it gets SIGTERM, then SIGKILL after a grace period.
//! `PR_SET_PDEATHSIG` makes the kernel kill it if walrus itself is killed, so no orphan ever
//! holds the socket (or, in cluster mode, the bus port).

use super::client::UpstreamError;
use super::cluster::ClusterNode;
use crate::task::backoff::Backoff;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// How long a fresh valkey-server may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Grace period between SIGTERM and SIGKILL, unless the stop names one
/// ([`ManagedValkey::stop_within`]).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Called when the child dies, before it is restarted.
pub type OnDeath = Arc<dyn Fn() + Send + Sync>;

pub struct ManagedValkey {
    pub address: String,
    /// Run by the supervisor when the child dies, before the new child exists: the child
    /// comes back empty, and nothing may read from it before walrus restores it.
    on_death: Arc<Mutex<Option<OnDeath>>>,
    /// Set once, to the grace the child gets between SIGTERM and SIGKILL.
    stop: watch::Sender<Option<Duration>>,
    task: JoinHandle<()>,
    reload: mpsc::Sender<Reload>,
    process: watch::Receiver<u64>,
}

/// A restart of the child that loads an RDB file ([`Reloader::reload`]).
struct Reload {
    rdb: PathBuf,
    /// How long the load may take.
    timeout: Duration,
    done: oneshot::Sender<Result<(), String>>,
}

/// Restarts the managed child from an RDB file: how a restore reaches a cluster node, which
/// refuses to be anyone's replica ([`crate::restore`]). Cheap to clone.
#[derive(Clone)]
pub struct Reloader(mpsc::Sender<Reload>);

impl Reloader {
    /// Stops the child, moves `rdb` into its directory as the file it loads at start
    /// (`dump.rdb`), starts it again on the same socket and returns once it is ready, having
    /// loaded it; the file is then removed, so that no later start loads it again. The
    /// child's death hook does not run: the stop is walrus's own.
    pub async fn reload(&self, rdb: PathBuf, timeout: Duration) -> Result<(), UpstreamError> {
        let stopping = || UpstreamError::Start("the managed valkey-server is stopping".into());
        let (done, result) = oneshot::channel();
        self.0
            .send(Reload { rdb, timeout, done })
            .await
            .map_err(|_| stopping())?;
        result
            .await
            .map_err(|_| stopping())?
            .map_err(UpstreamError::Start)
    }
}

impl ManagedValkey {
    /// Starts valkey-server, working in `dir` and listening on the Unix socket `socket`
    /// only, and returns once it accepts connections. `cluster`: as a cluster node announcing
    /// walrus (its bus is the one TCP port it listens on).
    pub async fn start(
        binary: PathBuf,
        dir: &Path,
        socket: PathBuf,
        extra_args: Vec<String>,
        cluster: Option<ClusterNode>,
    ) -> Result<ManagedValkey, UpstreamError> {
        Self::spawn_ready(binary, dir, socket, extra_args, cluster, free_port)
            .await
            .map_err(UpstreamError::Start)
    }

    /// Starts the child. A cluster node's bus port is the configured one, or its announced
    /// port plus 10000, or one `pick` finds free when that is no port or is taken: a port
    /// picked free is free only until someone else binds it (another process starting beside
    /// walrus binds port 0 too), so when Valkey then cannot listen on it, walrus picks
    /// another, a few times. A configured port that is taken is an error.
    async fn spawn_ready(
        binary: PathBuf,
        dir: &Path,
        socket: PathBuf,
        extra_args: Vec<String>,
        cluster: Option<ClusterNode>,
        mut pick: impl FnMut() -> std::io::Result<u16>,
    ) -> Result<ManagedValkey, String> {
        /// Tries with ports walrus picked; each failure is another process's race, and a few
        /// in a row mean something else.
        const PICKS: usize = 5;
        let dir = dir.to_path_buf();
        let socket_dir = socket
            .parent()
            .ok_or_else(|| format!("{} names no directory", socket.display()))?
            .to_path_buf();
        // Off the worker: a restore starts a second server while walrus serves.
        let prepared = dir.clone();
        crate::task::off_worker(move || {
            // Durably: in cluster mode it holds the node's identity (nodes.conf).
            crate::journal::manifest::create_dir_durably(&prepared).map_err(|e| {
                std::io::Error::other(format!("cannot create {}: {e}", prepared.display()))
            })?;
            super::socket_dir::prepare(&socket_dir).map_err(std::io::Error::other)?;
            // A reload that walrus did not see through leaves its RDB behind; walrus holds
            // everything in it and restores Valkey itself, which an old file would only get
            // in the way of (Valkey would come back with data behind the journal's end).
            let _ = std::fs::remove_file(prepared.join(RELOAD_FILE));
            Ok(())
        })
        .await
        .map_err(|e| e.to_string())?;
        let mut attempt = 0;
        // The default bus port (walrus's plus 10000) was taken: free ones from then on.
        let mut default_taken = false;
        let (spec, child) = loop {
            attempt += 1;
            let mut extra_args = extra_args.clone();
            // Whether the bus port is walrus's choice (not cluster.bus_port): another is
            // tried when it is taken.
            let mut chosen = false;
            if let Some(c) = &cluster {
                chosen = c.bus_port == 0;
                let bus = match c.bus_port().filter(|_| !default_taken) {
                    Some(p) => p,
                    None => pick().map_err(|e| format!("cannot pick a free port: {e}"))?,
                };
                extra_args.extend(c.args(bus));
            }
            let spec = ChildSpec {
                binary: binary.clone(),
                dir: dir.clone(),
                socket: socket.clone(),
                extra_args,
            };
            let (child, ready) = spec
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", spec.binary.display()))?;
            match wait_ready(ready, START_TIMEOUT).await {
                Ok(()) => break (spec, child),
                Err(e) if chosen && attempt < PICKS && e.contains("Failed listening on port") => {
                    tracing::warn!("valkey-server could not listen on the cluster bus port walrus chose (taken by another process); picking a free one (cluster.bus_port sets one)");
                    default_taken = true;
                }
                Err(e) if e.contains("Unix socket") => {
                    return Err(format!("valkey-server did not start: {e} (its socket, {}: a file system that cannot hold a Unix socket, FUSE or some network ones, needs upstream.socket_dir on a local one)", socket.display()))
                }
                Err(e) if e.contains("(cluster)") => {
                    return Err(format!(
                        "valkey-server did not start: {e} (its cluster bus port: cluster.bus_port)"
                    ))
                }
                Err(e) => return Err(format!("valkey-server did not start: {e}")),
            }
        };
        tracing::info!(socket = %spec.socket.display(), binary = %spec.binary.display(), "managed valkey-server is ready");
        let (stop, stop_rx) = watch::channel(None);
        let (reload, reload_rx) = mpsc::channel(1);
        let (started, process) = watch::channel(0);
        let on_death = Arc::new(Mutex::new(None));
        let address = format!("unix:{}", spec.socket.display());
        let task = tokio::spawn(supervise(
            spec,
            child,
            Control {
                stop: stop_rx,
                reload: reload_rx,
                started,
            },
            on_death.clone(),
        ));
        Ok(ManagedValkey {
            address,
            on_death,
            stop,
            task,
            reload,
            process,
        })
    }

    /// Which child serves the address: counted up each time another one is ready (after a
    /// death, or a reload).
    pub fn process(&self) -> watch::Receiver<u64> {
        self.process.clone()
    }

    /// What restarts the child from an RDB file.
    pub fn reloader(&self) -> Reloader {
        Reloader(self.reload.clone())
    }

    /// Sets what to run when the child dies (before it is restarted).
    pub fn on_death(&self, f: OnDeath) {
        *self.on_death.lock().expect("on_death lock") = Some(f);
    }

    /// Stops the child: SIGTERM, then SIGKILL after the grace period.
    pub async fn stop(self) {
        self.stop_within(STOP_TIMEOUT).await;
    }

    /// Stops the child: SIGTERM, then SIGKILL once `grace` has passed. A child that does not
    /// run (stopped by a signal, a hung host) never acts on the SIGTERM: `grace` is what the
    /// caller's own bound leaves for it.
    pub async fn stop_within(self, grace: Duration) {
        let _ = self.stop.send(Some(grace));
        let _ = self.task.await;
    }
}

struct ChildSpec {
    binary: PathBuf,
    dir: PathBuf,
    /// The Unix socket, Valkey's only listener for clients.
    socket: PathBuf,
    extra_args: Vec<String>,
}

/// The file Valkey loads at start (its default `dbfilename`), where a reload puts its RDB.
const RELOAD_FILE: &str = "dump.rdb";

impl ChildSpec {
    /// Starts the (stopped) child again loading `rdb`, which is moved into its directory
    /// and removed once loaded. On failure, the child started, if any.
    async fn reload(
        &self,
        rdb: &Path,
        timeout: Duration,
    ) -> Result<Child, (Option<Child>, String)> {
        let file = self.dir.join(RELOAD_FILE);
        // File-system calls off the worker: a reload runs while walrus serves.
        let (from, to) = (rdb.to_path_buf(), file.clone());
        crate::task::off_worker(move || std::fs::rename(from, to))
            .await
            .map_err(|e| {
                (
                    None,
                    format!("cannot move {} to {}: {e}", rdb.display(), file.display()),
                )
            })?;
        let started = match self.spawn() {
            Ok((child, ready)) => match wait_ready(ready, timeout).await {
                Ok(()) => Ok(child),
                Err(e) => Err((
                    Some(child),
                    format!("valkey-server did not load {}: {e}", file.display()),
                )),
            },
            Err(e) => Err((None, format!("cannot start {}: {e}", self.binary.display()))),
        };
        // Loaded or not, the file must not be loaded by a later start.
        let _ = crate::task::off_worker(move || std::fs::remove_file(file)).await;
        started
    }

    fn spawn(&self) -> std::io::Result<(Child, oneshot::Receiver<Result<(), String>>)> {
        let mut cmd = Command::new(&self.binary);
        cmd.args(super::settings::args())
            .args(["--daemonize", "no", "--logfile", "", "--dir"])
            .arg(&self.dir)
            .args(&self.extra_args)
            // No TCP port: the socket, mode 0700 in a directory of mode 0700, is the only way
            // in. (A cluster node's bus still listens on TCP, its own port:
            // [`ClusterNode::args`].) Last, because Valkey takes a setting's last value:
            // nothing in `extra_args` overrides them (config's `check_managed` refuses what
            // would try, this is the second wall).
            .args(["--port", "0", "--tls-port", "0", "--unixsocket"])
            .arg(&self.socket)
            .args(["--unixsocketperm", "700"])
            // walrus alone speaks to systemd for the unit (`crate::supervisor`).
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let (ready_tx, ready_rx) = oneshot::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        tokio::spawn(forward_log(stdout, Some(ready_tx)));
        tokio::spawn(forward_log(stderr, None));
        Ok((child, ready_rx))
    }
}

/// Copies the child's log lines into walrus's log and reports readiness, an event rather
/// than a polling loop: the server prints [`READY_LINES`] once listening.
async fn forward_log(
    out: impl tokio::io::AsyncRead + Unpin,
    mut ready: Option<oneshot::Sender<Result<(), String>>>,
) {
    let mut lines = BufReader::new(out).lines();
    let mut last = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        match valkey_level(&line) {
            tracing::Level::WARN => tracing::warn!(target: "valkey", "{line}"),
            tracing::Level::DEBUG => tracing::debug!(target: "valkey", "{line}"),
            _ => tracing::info!(target: "valkey", "{line}"),
        }
        if READY_LINES.iter().any(|r| line.contains(r)) {
            if let Some(tx) = ready.take() {
                let _ = tx.send(Ok(()));
            }
        }
        last = line;
    }
    if let Some(tx) = ready.take() {
        let _ = tx.send(Err(format!("it exited; its last log line: {last:?}")));
    }
}

/// What a server logs once it listens: Valkey and Redis from 7.2 "Ready to accept
/// connections unix" (or tcp); Redis 7.0 and older, listening on a Unix socket only, "The
/// server is now ready to accept connections at <path>" and nothing else.
const READY_LINES: &[&str] = &[
    "Ready to accept connections",
    "ready to accept connections at ",
];

/// The level of one of Valkey's log lines, from the mark after its timestamp
/// (`1234:M 25 Nov 2026 04:51:34.916 # ...`): `#` warning, `*` notice, `-` verbose and `.`
/// debug, read as `log.level` reads Valkey's names. Valkey's warnings (memory overcommit, a
/// failed fork, a full disk) then reach an operator who filters on WARN. A line of another
/// form (a crash report's body) keeps INFO.
fn valkey_level(line: &str) -> tracing::Level {
    match line.split_whitespace().nth(5) {
        Some("#") => tracing::Level::WARN,
        Some("-" | ".") => tracing::Level::DEBUG,
        _ => tracing::Level::INFO,
    }
}

async fn wait_ready(
    ready: oneshot::Receiver<Result<(), String>>,
    timeout: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(timeout, ready).await {
        Err(_) => Err(format!("not ready after {timeout:?}")),
        Ok(Err(_)) => Err("its log closed".into()),
        Ok(Ok(r)) => r,
    }
}

/// What the supervisor is told, and tells.
struct Control {
    stop: watch::Receiver<Option<Duration>>,
    reload: mpsc::Receiver<Reload>,
    /// Counted up once each child after the first is ready: connections opened before
    /// reached an earlier one, or found none.
    started: watch::Sender<u64>,
}

async fn supervise(
    spec: ChildSpec,
    mut child: Child,
    control: Control,
    on_death: Arc<Mutex<Option<OnDeath>>>,
) {
    let Control {
        mut stop,
        mut reload,
        started,
    } = control;
    let mut backoff = Backoff::default();
    loop {
        tokio::select! {
            Some(r) = reload.recv() => {
                terminate(&mut child, STOP_TIMEOUT).await;
                // On failure the child started, if any, is kept (a dead one is restarted
                // below as after any death); the restore fails and is retried.
                let result = match spec.reload(&r.rdb, r.timeout).await {
                    Ok(c) => {
                        child = c;
                        Ok(())
                    }
                    Err((c, e)) => {
                        if let Some(c) = c {
                            child = c;
                        }
                        Err(e)
                    }
                };
                started.send_modify(|n| *n += 1);
                let _ = r.done.send(result);
            }
            status = child.wait() => {
                let hook = on_death.lock().expect("on_death lock").clone();
                if let Some(f) = hook {
                    f();
                }
                tracing::error!(?status, "managed valkey-server exited; restarting it in {:?}", backoff.delay());
                tokio::select! {
                    _ = tokio::time::sleep(backoff.advance()) => {}
                    _ = stop.changed() => return,
                }
                match spec.spawn() {
                    Ok((c, ready)) => {
                        child = c;
                        match wait_ready(ready, START_TIMEOUT).await {
                            Ok(()) => {
                                tracing::info!(socket = %spec.socket.display(), "managed valkey-server restarted");
                                started.send_modify(|n| *n += 1);
                                backoff.reset();
                            }
                            Err(e) => tracing::error!("restarted valkey-server is not ready: {e}"),
                        }
                    }
                    Err(e) => tracing::error!("cannot restart valkey-server: {e}"),
                }
            }
            _ = stop.changed() => {
                let grace = stop.borrow().unwrap_or(STOP_TIMEOUT);
                terminate(&mut child, grace).await;
                return;
            }
        }
    }
}

async fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        // SAFETY: plain syscall on our own child's pid.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!("valkey-server did not exit within {grace:?} of SIGTERM; killing it");
        let _ = child.kill().await;
    }
}

/// A port that was free a moment ago (a cluster node's bus port when its default is no
/// port). Valkey binds it right after; the window is small and a collision is retried.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests;
