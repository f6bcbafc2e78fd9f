//! A data directory whose file system stops answering altogether (faultfs `freeze`: every
//! request, metadata included, waits until `resume`), as a network volume does whose server
//! went away. Whatever waits on it, clean reads, `/healthz`, `/metrics` and a stop do not:
//! every file-system call walrus makes while it serves runs off the proxy's worker, which
//! is one on two cores and would stop every client with it.
use crate::common;
use crate::disk::{CONFIG, OK};
use common::*;

/// Resumes a frozen faultfs when dropped: declared after the walrus it froze, it is dropped
/// first, so that a failing test unwinds instead of waiting forever for a walrus whose thread
/// is in a held FUSE request.
struct Thaw<'a>(&'a common::faultfs::FaultFs);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.resume_quietly();
    }
}

/// Walrus on faultfs, with `clean` written and, with `checkpoint`, a checkpoint recorded;
/// then the file system frozen: every write, sync and metadata request waits until
/// `resume`, as on a network volume whose server went away. The watcher's next reading
/// (every 50 ms) is the first request held. Keep a [`Thaw`] after it.
fn frozen(fs: &common::faultfs::FaultFs, v: &Valkey, checkpoint: bool) -> Walrus {
    let w = Walrus::build()
        .upstream(&v.addr())
        .config(CONFIG)
        .data(&fs.path("data"))
        .with_metrics()
        .start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["SET", "clean", "1"]), OK);
    if checkpoint {
        let (code, body) = http_request(w.metrics.as_ref().unwrap(), "POST", "/checkpoint");
        assert_eq!(code, 200, "{body}");
    }
    fs.ok("freeze");
    fs.await_status("held", |n| n >= 1);
    w
}

/// Whether reads of the clean key are answered (within 5 s each) over half a second: several
/// of the watcher's intervals. A new connection, so that none is held by an earlier request.
fn clean_reads_answer(w: &Walrus) -> bool {
    let mut c = Raw::connect(&w.addr);
    c.stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let window = std::time::Instant::now();
    while window.elapsed() < std::time::Duration::from_millis(500) {
        if c.try_cmd(&["GET", "clean"]).as_deref() != Some(b"$1\r\n1\r\n".as_slice()) {
            return false;
        }
    }
    true
}

/// `GET path` on the metrics endpoint, if answered within 5 s (from a thread of its own,
/// which a request held for good leaves behind).
fn answer_within(w: &Walrus, path: &str) -> Option<(u16, String)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (addr, path) = (w.metrics.clone().unwrap(), path.to_string());
    std::thread::spawn(move || tx.send(http_get(&addr, &path)));
    rx.recv_timeout(std::time::Duration::from_secs(5)).ok()
}

fn healthz_answers(w: &Walrus) -> bool {
    answer_within(w, "/healthz").is_some_and(|(code, _)| code == 200)
}

/// Sends `POST path` with `body` to the metrics endpoint from a thread of its own, and
/// returns once faultfs holds a request more than before: the one the admin request reached
/// the file system with. Its answer waits for `resume`.
fn admin_request_held(fs: &common::faultfs::FaultFs, w: &Walrus, path: &str, body: &str) {
    use std::io::{Read, Write};
    let before = fs.status()["held"];
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = std::net::TcpStream::connect(w.metrics.as_ref().unwrap()).unwrap();
    std::thread::spawn(move || {
        s.write_all(request.as_bytes()).unwrap();
        let _ = s.read_to_string(&mut String::new());
    });
    fs.await_status("held", |n| n > before);
}

/// A file system that stops answering altogether (a network volume whose server went away:
/// even `stat` and `statfs` wait) does not stop the reads of clean keys: the
/// watcher reads the disk's figures off the proxy's threads (walrus runs one worker on two
/// cores, and a `statfs` there would have stopped every client with it).
#[test]
fn a_file_system_that_stops_answering_does_not_stop_reads_of_clean_keys() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let v = Valkey::start();
    let w = frozen(&fs, &v, false);
    let _thaw = Thaw(&fs);
    let reads = clean_reads_answer(&w);
    fs.ok("resume");
    assert!(
        reads,
        "a read of a clean key waited on the frozen file system: {}",
        w.proc.log_text()
    );
    assert_eq!(Raw::connect(&w.addr).cmd(&["SET", "after", "1"]), OK);
}

/// INFO (its persistence section: when the checkpoint was written) and `GET /status` (its
/// age) are answered from memory while the file system is frozen: a `stat` of the RDB there
/// would have stopped every client with them.
#[test]
fn info_and_status_answer_while_the_file_system_stops_answering() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let v = Valkey::start();
    let w = frozen(&fs, &v, true);
    let _thaw = Thaw(&fs);
    let mut c = Raw::connect(&w.addr);
    c.stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let info = c.try_cmd(&["INFO", "persistence"]).map(|r| show(&r));
    let status = answer_within(&w, "/status");
    let reads = clean_reads_answer(&w);
    fs.ok("resume");
    let info = info.expect("INFO waited on the frozen file system");
    assert!(info.contains("rdb_last_save_time:1"), "{info}");
    let (code, body) = status.expect("/status waited on the frozen file system");
    let age = body.split("\"checkpoint_age_seconds\":").nth(1);
    assert!(
        code == 200 && age.is_some_and(|a| a.starts_with(|c: char| c.is_ascii_digit())),
        "{body}"
    );
    assert!(reads, "clean reads stopped");
}

/// A checkpoint, and a backup to another volume, wait on a frozen file system; clean reads
/// do not wait with them.
#[test]
fn a_checkpoint_or_a_backup_on_a_frozen_file_system_leaves_clean_reads_alone() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let v = Valkey::start();
    let elsewhere = tempfile::tempdir().unwrap();
    let to = elsewhere.path().join("backup");
    for (path, body) in [("/checkpoint", ""), ("/backup", to.to_str().unwrap())] {
        let w = frozen(&fs, &v, true);
        let thaw = Thaw(&fs);
        admin_request_held(&fs, &w, path, body);
        let reads = clean_reads_answer(&w);
        fs.ok("resume");
        assert!(reads, "clean reads stopped behind POST {path}");
        drop(thaw);
        drop(w);
        std::fs::remove_dir_all(fs.path("data")).unwrap();
    }
}

/// The admin token file, read at each admin request, on a volume that stops answering:
/// the request waits for it, the clients do not.
#[test]
fn an_admin_token_file_on_a_frozen_file_system_holds_only_the_admin_request() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let v = Valkey::start();
    let token = fs.path("admin-token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let config = format!("{CONFIG}[metrics]\nadmin_token_file = {token:?}\n");
    let w = Walrus::build()
        .upstream(&v.addr())
        .config(&config)
        .with_metrics()
        .start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["SET", "clean", "1"]), OK);
    fs.ok("freeze");
    let _thaw = Thaw(&fs);
    admin_request_held(&fs, &w, "/checkpoint", "");
    let reads = clean_reads_answer(&w);
    fs.ok("resume");
    assert!(reads, "clean reads stopped behind the admin token's read");
}

/// Managed mode keeps Valkey's Unix socket in `<data>/run`. On a data volume that can hold a
/// socket (NFS can; FUSE cannot, so here a tmpfs mounted inside the faultfs one, whose path
/// is still looked up through it) and stops answering, a client's AUTH, checked on a new
/// connection to Valkey, waits in connect(2) for the socket's path: that connection waits,
/// the proxy does not (pinned sessions, new pools, the link's probes and checkpoints connect
/// the same way).
#[test]
fn a_unix_socket_on_a_frozen_volume_holds_only_the_connection_to_it() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let data = fs.path("data");
    std::fs::create_dir_all(data.join("run")).unwrap();
    let Some(_run) = Tmpfs::mount_on(&data.join("run"), 4) else {
        return;
    };
    let w = Walrus::build()
        .config(CONFIG)
        .data(&data)
        .with_metrics()
        .start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["SET", "clean", "1"]), OK);
    fs.ok("freeze");
    let _thaw = Thaw(&fs);
    let before = fs.await_status("held", |n| n >= 1);
    let addr = w.addr.clone();
    std::thread::spawn(move || Raw::connect(&addr).try_cmd(&["AUTH", "someone", "secret"]));
    fs.await_status("held", |n| n > before);
    let reads = clean_reads_answer(&w);
    let health = healthz_answers(&w);
    w.proc.signal(libc::SIGTERM);
    // Taken by its task on the worker; the exit itself waits for `resume`: no process with a
    // thread in a held FUSE request can exit.
    let stopping = w
        .proc
        .try_wait_line("SIGTERM received", std::time::Duration::from_secs(5))
        .is_some();
    fs.ok("resume");
    assert!(
        reads && health && stopping,
        "while a connection to Valkey's socket waited on the frozen volume: clean reads {reads}, /healthz {health}, SIGTERM taken {stopping}"
    );
}

/// A cluster node, managed, restored in place (a second, plain valkey-server loads the
/// dataset, then the node restarts from its RDB) while the data volume holds its writes and
/// syncs: the restore waits for it, `/healthz` does not. (The restore cannot end here: its
/// RDB moves from the second server's directory, on faultfs, to the node's, on a tmpfs.)
#[test]
fn a_restore_on_a_volume_that_stops_answering_leaves_healthz_alone() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let data = fs.path("data");
    // The node's own directory on a tmpfs: a Valkey in a held FUSE request could not die.
    std::fs::create_dir_all(data.join("valkey")).unwrap();
    let Some(_node) = Tmpfs::mount_on(&data.join("valkey"), 16) else {
        return;
    };
    let sockets = tempfile::tempdir().unwrap();
    let config = format!(
        "{CONFIG}[cluster]\nenabled = true\n[upstream]\nsocket_dir = {:?}\n",
        sockets.path().join("s")
    );
    let w = Walrus::build()
        .config(&config)
        .data(&data)
        .listen(&format!("127.0.0.1:{}", free_port()))
        .with_metrics()
        .start();
    let pid = valkey_pid(&w.addr);
    // Writes and syncs held, not lookups: the node, restarted on its tmpfs, answers, and the
    // restore begins.
    fs.ok("stall");
    let thaw = Thaw(&fs);
    // SAFETY: a signal to the managed Valkey's process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // The restore's first sync on the volume, after it said so: the second server's
    // directory made durable.
    w.proc
        .wait_line("loading a second, plain valkey-server first", START_TIMEOUT);
    fs.await_status("held", |n| n >= 1);
    let health = healthz_answers(&w);
    drop(thaw);
    assert!(health, "/healthz waited on the restore's file system");
}
