//! One walrus process of the system and what the fault loop does to it: its configuration
//! in managed mode, the wait until it listens, SIGKILL (with its Valkey), its managed Valkey,
//! the wait until it serves again. Shared by the shard under test (`system.rs`) and, in
//! cluster mode, the other primaries (`cluster.rs`).

use crate::common::{addr_in, wait_dead, Proc, Raw, Walrus, LISTENING, START_TIMEOUT};
use std::io::Write;
use std::time::{Duration, Instant};

pub const CLUSTER: &str = "[cluster]\nenabled = true\n";

/// `upstream.reply_timeout_ms` of the generator's walruses: short, so that a frozen Valkey
/// (`freeze.rs`) costs its clients seconds, not the default 30: the least walrus accepts (a
/// Valkey preparing an RDB sends a newline a second).
pub const REPLY_TIMEOUT_MS: u64 = 2000;

/// The configuration of a walrus running its own Valkey, whose Unix socket is in
/// `socket_dir` ([`valkey_socket`]): outside the data directory, which may be on faultfs, a
/// FUSE file system that cannot hold a socket. In cluster mode with its bus on `bus_port`: a
/// fixed port, so that a restarted walrus's new Valkey is where the last one was (the other
/// nodes know a node by its bus port).
pub fn managed_config(
    bus_port: u16,
    durable: bool,
    cluster: bool,
    socket_dir: &std::path::Path,
) -> String {
    let mut config = format!(
        "[upstream]\nsocket_dir = {:?}\nreply_timeout_ms = {REPLY_TIMEOUT_MS}\n",
        socket_dir.display().to_string()
    );
    if !durable {
        // Without a journal walrus is no replica: Valkey would refuse all writes.
        config.push_str("extra_args = [\"--min-replicas-to-write\", \"0\"]\n");
    }
    if cluster {
        config.push_str(&format!("{CLUSTER}bus_port = {bus_port}\n"));
    }
    config
}

/// The managed Valkey's Unix socket in `socket_dir` (`upstream.socket_dir`), as
/// [`Raw::connect`] names it: the way around walrus.
pub fn valkey_socket(socket_dir: &std::path::Path) -> String {
    format!("unix:{}", socket_dir.join("valkey.sock").display())
}

/// Waits until a walrus just spawned listens. `Err`: its log, and why it did not start
/// (it exited: what a power loss left may be what it refuses; its errors say why).
pub fn listening(proc: Proc, config_dir: tempfile::TempDir) -> Result<Walrus, (String, String)> {
    let Some(line) = proc.try_wait_line(LISTENING, START_TIMEOUT) else {
        let log = proc.log_text();
        // Logged errors, and what it printed before its log began (a configuration refused).
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.starts_with("walrus: "))
            .collect();
        let why = format!(
            "walrus did not start (it exited, or did not listen within {START_TIMEOUT:?}); \
             its errors: {}",
            errors.join(" | ")
        );
        return Err((log, why));
    };
    Ok(Walrus {
        addr: addr_in(&line),
        proc,
        data: config_dir,
        metrics: None,
    })
}

/// The managed Valkey's pid: walrus's child, if it has one now.
pub fn managed_valkey(w: &Walrus) -> Option<i32> {
    let tasks = format!("/proc/{}/task", w.proc.child.id());
    std::fs::read_dir(tasks)
        .ok()?
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find_map(|pid| pid.parse().ok())
}

/// SIGKILLs walrus and returns its log once it is gone, and its managed Valkey too (which
/// PDEATHSIG kills with it).
pub fn kill(mut w: Walrus) -> String {
    let valkey = managed_valkey(&w);
    w.proc.signal(libc::SIGKILL);
    w.proc
        .wait_exit(Duration::from_secs(10))
        .expect("SIGKILLed walrus exits");
    if let Some(pid) = valkey {
        wait_dead(pid);
    }
    w.proc.log_text()
}

/// SIGKILLs walrus's managed Valkey alone (walrus restores it by itself). False when it has
/// none to kill (walrus is restarting it).
pub fn kill_valkey(w: &Walrus) -> bool {
    let Some(pid) = managed_valkey(w) else {
        return false;
    };
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_dead(pid);
    true
}

/// Returns once the walrus at `addr` serves a read (retried while it answers -LOADING, is
/// away, or its cluster node has not rejoined: -CLUSTERDOWN), within `bound`. A cluster
/// node that sends the probe's key elsewhere (-MOVED, -ASK) serves too.
pub fn await_serving(addr: &str, bound: Duration) -> Result<(), String> {
    let deadline = Instant::now() + bound;
    let mut last = String::from("no connection");
    while Instant::now() < deadline {
        if let Ok(mut c) = Raw::try_connect(addr) {
            let probe = walrus::resp::write::command(["LLEN", "{gen}:l0"]);
            if c.stream.write_all(&probe).is_ok() {
                match c.try_read_frame() {
                    Ok(r) if r.starts_with(b":") => return Ok(()),
                    Ok(r) if r.starts_with(b"-MOVED ") || r.starts_with(b"-ASK ") => return Ok(()),
                    Ok(r) => last = String::from_utf8_lossy(&r).trim_end().to_string(),
                    Err(e) => last = e,
                }
            }
        }
        // Retry pacing while walrus restores.
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "walrus at {addr} did not serve a read within {bound:?}; last: {last}"
    ))
}
