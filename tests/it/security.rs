//! Security (docs/security.md, "Security"): the admin endpoint refuses anyone without its token; the
//! managed Valkey is reachable by walrus's user alone, on a Unix socket; the restore listener
//! serves only the Valkey walrus restores.

use crate::common;
use common::*;
use std::io::{Read, Write};

/// With `metrics.admin_token_file`, `POST /checkpoint` and `/backup` need the token, from
/// loopback too; replacing the file rotates it; metrics, health, readiness and status stay
/// open; every admin request is logged with its caller. Remote admin access needs a token.
#[test]
fn the_admin_endpoint_refuses_anyone_without_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "first-token\n").unwrap();
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "first-tokex").unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "[metrics]\nadmin_token_file = {:?}\n",
        token.to_str().unwrap()
    );
    let w = Walrus::build()
        .config(&config)
        .args(&["--metrics-listen", &metrics])
        .start();
    w.await_writable();

    let checkpoint = |token_file: Option<&std::path::Path>| {
        let mut args = vec!["checkpoint", "--metrics", &metrics];
        if let Some(f) = token_file {
            args.extend(["--token-file", f.to_str().unwrap()]);
        }
        run_walrus(&args)
    };
    let out = checkpoint(None);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("(401)")
            && output_text(&out).contains("metrics.admin_token_file"),
        "{}",
        output_text(&out)
    );
    let out = checkpoint(Some(&wrong));
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("wrong admin token"),
        "{}",
        output_text(&out)
    );
    let out = checkpoint(Some(&token));
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("checkpoint taken"),
        "{}",
        output_text(&out)
    );

    // Rotated: the old token is refused, the new one accepted, without a restart.
    let old = dir.path().join("old-token");
    std::fs::copy(&token, &old).unwrap();
    std::fs::write(&token, "second-token").unwrap();
    assert_eq!(checkpoint(Some(&old)).status.code(), Some(2));
    assert!(checkpoint(Some(&token)).status.success());

    // Everything else stays open.
    for path in ["/metrics", "/healthz", "/readyz", "/status"] {
        assert_eq!(http_get(&metrics, path).0, 200, "{path}");
    }
    // Each admin request in the log, with its caller.
    let log = w.proc.log_text();
    let refused = log
        .lines()
        .filter(|l| l.contains("admin request refused") && l.contains("peer=127.0.0.1:"))
        .count();
    let accepted = log
        .lines()
        .filter(|l| l.contains("admin request") && !l.contains("refused"))
        .filter(|l| l.contains("peer=127.0.0.1:"))
        .count();
    assert_eq!((refused, accepted), (3, 2), "{log}");

    // A token that cannot be read is refused at start, naming the file; remote admin
    // access without a token is refused too.
    let missing = dir.path().join("missing");
    let config = format!(
        "[metrics]\nadmin_token_file = {:?}\n",
        missing.to_str().unwrap()
    );
    let data = tempfile::tempdir().unwrap();
    let line = refuses_to_start(None, &config, data.path(), "admin_token_file");
    assert!(
        line.contains("cannot read") && line.contains("missing"),
        "{line}"
    );
    let config = "[metrics]\nadmin_allow_remote = true\n";
    let line = refuses_to_start(None, config, data.path(), "admin_allow_remote");
    assert!(line.contains("needs metrics.admin_token_file"), "{line}");
}

/// The TCP sockets process `pid` listens on (from /proc/net/tcp and tcp6, matched by the
/// socket inodes among its open files): "address:port" in the kernel's hex.
fn tcp_listeners(pid: i32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().to_string();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut listening = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode; 0A is LISTEN.
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                listening.push(f[1].to_string());
            }
        }
    }
    listening
}

/// Issue 25: in managed mode nothing on the host reaches Valkey around walrus. Valkey
/// listens on no TCP port at all, only on a Unix socket in a directory of mode 0700 that
/// walrus's user owns; walrus's user connects there, another user is refused by the kernel.
#[test]
fn the_managed_valkey_is_reachable_by_walruss_user_alone() {
    let w = Walrus::build().start();
    let pid = valkey_pid(&w.addr);
    let listening = tcp_listeners(pid);
    assert!(
        listening.is_empty(),
        "the managed Valkey (pid {pid}) listens on TCP: {listening:?}"
    );
    let port = Raw::connect(&w.addr).cmd(&["CONFIG", "GET", "port"]);
    assert_eq!(show(&port), "*2⏎$4⏎port⏎$1⏎0⏎");

    let addr = managed_valkey_addr(&w.addr);
    let socket = std::path::PathBuf::from(addr.strip_prefix("unix:").unwrap());
    let dir = socket.parent().unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(dir).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "{}",
        dir.display()
    );
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert_eq!(meta.uid(), me, "{}", dir.display());
    assert_eq!(Raw::connect(&addr).cmd(&["PING"]), b"+PONG\r\n");

    if me != 0 {
        eprintln!("SKIPPED: connecting as another user needs root to switch to it");
        return;
    }
    use std::os::unix::process::CommandExt;
    // nobody: std drops root's supplementary groups before it switches.
    let out = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(&socket)
        .arg("PING")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(
        !text.contains("PONG") && text.contains("Permission denied"),
        "another user reached the managed Valkey: {text}"
    );
}

/// A socket directory that others may enter (someone else made it, or loosened it) is
/// refused at start, naming it: walrus does not put Valkey's socket where others reach it.
#[test]
fn a_socket_directory_open_to_others_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let run = data.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let line = refuses_to_start(None, "", &data, "has mode 0755");
    assert!(
        line.contains(&run.display().to_string()) && line.contains("chmod 700"),
        "{line}"
    );
}

/// A TCP relay in front of a Valkey, for walrus's connections: when walrus tells Valkey
/// `REPLICAOF 127.0.0.1 <port>` (a restore), the relay first has `rogue` connect to that
/// port, so that the rogue is there before Valkey, then passes the command on.
fn relay(upstream: String, rogue: impl Fn(u16) + Send + Sync + 'static) -> String {
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rogue = std::sync::Arc::new(rogue);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let server = TcpStream::connect(&upstream).unwrap();
            let (mut c_rd, mut s_wr) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut s_rd, mut c_wr) = (server, client);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 65536];
                while let Ok(n @ 1..) = s_rd.read(&mut chunk) {
                    if c_wr.write_all(&chunk[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_wr.shutdown(Shutdown::Write);
            });
            let rogue = rogue.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 65536];
                while let Ok(n @ 1..) = c_rd.read(&mut chunk) {
                    if let Some(port) = replicaof_port(&chunk[..n]) {
                        rogue(port);
                    }
                    if s_wr.write_all(&chunk[..n]).is_err() {
                        break;
                    }
                }
                let _ = s_wr.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

/// The port of a `REPLICAOF 127.0.0.1 <port>` command among `bytes`.
fn replicaof_port(bytes: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(bytes);
    let words: Vec<&str> = text.split("\r\n").collect();
    let i = words
        .iter()
        .position(|w| w.eq_ignore_ascii_case("REPLICAOF"))?;
    (words.get(i + 2) == Some(&"127.0.0.1")).then(|| words.get(i + 4)?.parse().ok())?
}

/// Issue 25: during a restore Valkey connects to walrus's loopback listener as its replica,
/// and so may any local process. One that connects first, without the one-time password
/// walrus gave Valkey (`masterauth`), or with a wrong one, is dropped having been sent
/// nothing; Valkey's own connection is served and the restore succeeds. Valkey's previous
/// `masterauth` is put back afterwards.
#[test]
fn a_rogue_connection_to_the_restore_listener_gets_nothing_and_the_restore_succeeds() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().join("data");
    {
        let v = Valkey::start();
        let w = Walrus::build().upstream(&v.addr()).data(&data).start();
        let mut c = Raw::connect(&w.addr);
        for i in 0..100 {
            assert_eq!(c.cmd(&["SET", &format!("k{i}"), "v"]), b"+OK\r\n");
        }
    }
    // A new, empty Valkey: walrus restores it at start.
    let v = Valkey::start();
    assert_eq!(
        Raw::connect(&v.addr()).cmd(&["CONFIG", "SET", "masterauth", "theirs"]),
        b"+OK\r\n"
    );
    type Rogues = std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>;
    let rogues: Rogues = Default::default();
    let kept = rogues.clone();
    let upstream = relay(v.addr(), move |port| {
        let big = "x".repeat(1 << 20);
        let handshakes: [&[&[&str]]; 3] = [
            // A replica's handshake without AUTH, ...
            &[
                &["PING"],
                &["REPLCONF", "listening-port", "0"],
                &["REPLCONF", "capa", "eof", "capa", "psync2"],
                &["PSYNC", "?", "-1"],
            ],
            // ... with a guessed password, ...
            &[&["AUTH", "walrus"], &["PSYNC", "?", "-1"]],
            // ... and a frame walrus must not buffer before AUTH (1 MiB).
            &[&["PING", &big]],
        ];
        for commands in handshakes {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            for c in commands {
                // walrus may close on the rogue mid-write: a rogue does not mind.
                let _ = s.write_all(&walrus::resp::write::command(c.iter()));
            }
            kept.lock().unwrap().push(s);
        }
    });
    let w = Walrus::build()
        .upstream(&upstream)
        .data(&data)
        .config("[restore]\ntimeout_ms = 5000\n")
        .start();
    let rogues = std::mem::take(&mut *rogues.lock().unwrap());
    assert_eq!(rogues.len(), 3, "no restore went through the relay");
    for mut s in rogues {
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut got = Vec::new();
        // Closed (a reset when it closed with the rogue's commands unread), not left open.
        let end = s.read_to_end(&mut got);
        let closed = match &end {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        let got = String::from_utf8_lossy(&got);
        assert!(
            closed && !got.contains("FULLRESYNC"),
            "a rogue connection to the restore listener got {got:?} ({end:?})"
        );
    }
    let mut c = Raw::connect(&w.addr);
    for i in 0..100 {
        assert_eq!(c.cmd(&["GET", &format!("k{i}")]), b"$1\r\nv\r\n");
    }
    let r = Raw::connect(&v.addr()).cmd(&["CONFIG", "GET", "masterauth"]);
    assert_eq!(show(&r), "*2⏎$10⏎masterauth⏎$6⏎theirs⏎");
    assert!(
        w.proc
            .log_text()
            .contains("dropped a connection to the restore listener"),
        "{}",
        w.proc.log_text()
    );
}

/// A data directory on a file system that cannot hold a Unix socket (faultfs, a FUSE file
/// system without mknod, as some network ones are): walrus does not start, and says to put
/// `upstream.socket_dir` on a local one; with it there, walrus starts on the same data.
#[test]
fn a_socket_directory_that_cannot_hold_a_socket_is_named_with_the_fix() {
    let Some(fs) = common::faultfs::FaultFs::mount() else {
        return;
    };
    let data = fs.path("data");
    let line = refuses_to_start(None, "", &data, "valkey-server did not start");
    assert!(
        line.contains("Unix socket") && line.contains("upstream.socket_dir"),
        "{line}"
    );
    let run = tempfile::tempdir().unwrap();
    let config = format!(
        "[upstream]\nsocket_dir = {:?}\n",
        run.path().join("run").display().to_string()
    );
    let w = Walrus::build().config(&config).data(&data).start();
    assert_eq!(Raw::connect(&w.addr).cmd(&["SET", "k", "v"]), b"+OK\r\n");
}

/// What walrus writes holds the dataset, and is its user's alone whatever the umask it was
/// started with: the data directory (closed if an older walrus left it open), the journal,
/// the checkpoints, a backup. Another user reads none of it (issue 25's review: with umask
/// 022 anyone could read the journal's segments).
#[test]
fn the_journal_checkpoints_and_backups_are_walruss_users_alone() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: umask has no preconditions; 022 is what a shell usually gives.
    unsafe { libc::umask(0o022) };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .data(&data)
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "secret", "hunter2"]), b"+OK\r\n");
    let backup = tmp.path().join("backup");
    let out = run_walrus(&[
        "backup",
        "--metrics",
        &metrics,
        "--to",
        backup.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", output_text(&out));
    let mut open = Vec::new();
    let mut files = 0;
    for root in [&data, &backup] {
        let mode = std::fs::metadata(root).unwrap().permissions().mode();
        if mode & 0o077 != 0 {
            open.push(format!("{} {:o}", root.display(), mode & 0o777));
        }
        for sub in ["journal", "checkpoints"] {
            for entry in std::fs::read_dir(root.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                let mode = std::fs::metadata(&path).unwrap().permissions().mode();
                files += 1;
                if mode & 0o077 != 0 {
                    open.push(format!("{} {:o}", path.display(), mode & 0o777));
                }
            }
        }
    }
    assert!(files > 2, "no journal or checkpoint files found");
    assert!(open.is_empty(), "open to other users: {open:#?}");

    // Files an older walrus left open (journal segments are made once and reused) are
    // closed at the next start.
    drop(w);
    let segments: Vec<_> = std::fs::read_dir(data.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for path in &segments {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let _w = Walrus::build().data(&data).start();
    for path in &segments {
        let mode = std::fs::metadata(path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} {:o}", path.display(), mode & 0o777);
    }
}
