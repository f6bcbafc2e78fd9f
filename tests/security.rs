//! Security (README, "Security"): the admin endpoint refuses anyone without its token; the
//! managed Valkey is reachable by walrus's user alone, on a Unix socket; the restore listener
//! serves only the Valkey walrus restores.

mod common;
use common::*;

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
    assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{}", dir.display());
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
