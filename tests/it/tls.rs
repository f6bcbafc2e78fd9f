//! TLS for clients (issue 25): a TLS port beside the plaintext one or alone, serving what
//! the plaintext port serves (durable writes, pipelines, large values both ways, slow
//! readers, clients that leave mid-stream), refusing what Valkey's TLS port refuses
//! (plaintext, an untrusted or missing client certificate), and refusing to start on a
//! certificate that cannot be served, naming the file. Reloads: tests/it/tls_reload.rs; client
//! certificates as ACL users: tests/it/tls_users.rs.

use crate::common;
use common::certs::{write, Ca, Leaf};
use common::tls::{tls_addr, TlsFiles, TlsRaw};
use common::*;
use std::io::{Read, Write};

const LOCALHOST: &str = "localhost";

#[test]
fn tls_clients_get_what_plaintext_clients_get_durable_writes_included() {
    let files = TlsFiles::new();
    let alice = files.client_cert(&Leaf::client("alice"));
    let client = files.client(Some(&alice));
    let mut w = Walrus::build().config(&files.toml("")).start();
    let tls = tls_addr(&w.proc);
    let mut c = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert_eq!(c.server_cert(), files.served);
    assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
    assert_eq!(c.cmd(&["SET", "k", "over tls"]), b"+OK\r\n");
    // The same data on the plaintext port.
    let mut plain = Raw::connect(&w.addr);
    assert_eq!(plain.cmd(&["GET", "k"]), bulk("over tls"));

    // A pipeline sent whole, its replies read after: walrus reads and writes through
    // rustls's buffers while the socket is full both ways.
    let n = 20_000;
    let mut burst = Vec::new();
    for _ in 0..n {
        burst.extend_from_slice(&walrus::resp::write::command(["INCR", "counter"]));
    }
    c.send_raw(&burst);
    for i in 1..=n {
        assert_eq!(c.read_frame(), format!(":{i}\r\n").into_bytes());
    }

    // Large values both ways: 4 MiB in one request, and back in one reply.
    let big: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    assert_eq!(c.cmd(&[&b"SET"[..], b"big", &big]), b"+OK\r\n");
    assert_eq!(c.cmd(&["GET", "big"]), bulk(&big));
    assert_eq!(plain.cmd(&["STRLEN", "big"]), b":4194304\r\n");

    // A transaction (a dedicated connection) and RESP2 Pub/Sub (the byte relay) over TLS.
    assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["INCR", "counter"]), b"+QUEUED\r\n");
    assert_eq!(
        c.cmd(&["EXEC"]),
        format!("*1\r\n:{}\r\n", n + 1).into_bytes()
    );
    let mut sub = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert_pubsub(&mut sub, &mut plain, "news", "hi");

    // An acknowledged write survives SIGKILL, and is read back over TLS.
    assert_eq!(c.cmd(&["SET", "durable", "yes"]), b"+OK\r\n");
    w.kill_with_valkey();
    let w2 = Walrus::build()
        .config(&files.toml(""))
        .data(&w.data.path().join("data"))
        .start();
    let mut c = TlsRaw::connect(&tls_addr(&w2.proc), &client, LOCALHOST).unwrap();
    assert_eq!(c.cmd(&["GET", "durable"]), bulk("yes"));
    assert_eq!(c.cmd(&["GET", "counter"]), bulk((n + 1).to_string()));
    // QUIT ends the session with a close_notify: the client sees a clean end, not a cut.
    assert_eq!(c.cmd(&["QUIT"]), b"+OK\r\n");
    assert_eq!(c.read_to_end(), Ok(Vec::new()));
}

#[test]
fn slow_readers_and_clients_that_leave_mid_stream_over_tls() {
    let files = TlsFiles::new();
    let cert = files.client_cert(&Leaf::client("reader"));
    let client = files.client(Some(&cert));
    let w = Walrus::build().config(&files.toml("")).start();
    let tls = tls_addr(&w.proc);
    // A receive buffer of 4 KiB: walrus's socket fills at once, its replies wait in rustls's
    // buffer, and the last of them must still be pushed out as the client reads.
    let mut c = TlsRaw::connect_small(&tls, &client, LOCALHOST, 4096).unwrap();
    let value = vec![b'v'; 256 << 10];
    assert_eq!(c.cmd(&[&b"SET"[..], b"v", &value]), b"+OK\r\n");

    // 64 reads of 256 KiB sent at once, read a little at a time: walrus's output waits
    // in rustls and the socket, paused, and resumes as the client reads.
    let gets = 64;
    let mut burst = Vec::new();
    for _ in 0..gets {
        burst.extend_from_slice(&walrus::resp::write::command(["GET", "v"]));
    }
    c.send_raw(&burst);
    let want = bulk(&value);
    let mut got = Vec::new();
    let mut chunk = [0u8; 512];
    while got.len() < want.len() * gets {
        let n = c.stream.read(&mut chunk).unwrap();
        assert!(n > 0, "walrus closed a slow reader");
        got.extend_from_slice(&chunk[..n]);
        // Slow, on purpose: walrus's writes outpace the reads, so that its socket stays full
        // and its last reply waits in rustls's buffer. (Nothing waits for this pause: the
        // replies are read whatever the pace.)
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    for reply in got.chunks(want.len()) {
        assert!(reply == want, "a reply to a slow reader was garbled");
    }

    // A client that leaves in the middle of a pipeline, half a command sent, without a
    // close_notify; and one that leaves while a 256 KiB reply is on its way.
    let mut gone = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    let mut half = Vec::new();
    for i in 0..1000 {
        half.extend_from_slice(&walrus::resp::write::command([
            "SET",
            &format!("k{i}"),
            "x",
        ]));
    }
    half.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$1\r\n");
    gone.send_raw(&half);
    gone.stream.sock.shutdown(std::net::Shutdown::Both).unwrap();
    let mut gone = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    gone.send_raw(&walrus::resp::write::command(["GET", "v"]));
    drop(gone);

    // Everyone else is served as before.
    assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
    let mut fresh = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert_eq!(fresh.cmd(&["STRLEN", "v"]), b":262144\r\n");
    assert!(
        !w.proc.log_text().contains("panicked"),
        "{}",
        w.proc.log_text()
    );
}

/// The count of connections to the TLS port closed before their session, for `reason`.
fn rejected_total(reason: &str) -> String {
    format!("walrus_clients_rejected_total{{reason=\"{reason}\"}}")
}

/// walrus's debug lines about TLS clients: the events these tests await where no state
/// shows them.
const DEBUG_TLS: (&str, &str) = ("RUST_LOG", "info,walrus::proxy=debug");

#[test]
fn the_tls_port_closes_plaintext_and_stalled_clients_and_shares_max_clients() {
    let files = TlsFiles::new();
    let cert = files.client_cert(&Leaf::client("c"));
    let client = files.client(Some(&cert));
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .config("[proxy]\nmax_clients = 1\n")
        // Long enough that a loaded machine still connects the second client inside it.
        .config(&files.toml("handshake_timeout_ms = 2000"))
        .args(&["--metrics-listen", &metrics])
        .env(&[DEBUG_TLS])
        .start();
    let tls = tls_addr(&w.proc);
    let rejected = |reason: &str| metric(&metrics, &rejected_total(reason));
    assert_eq!(rejected("tls_plaintext"), 0.0);

    // A plaintext client on the TLS port: closed, unanswered, counted.
    let mut plain = Raw::connect(&tls);
    // Its "client connected" line, taken here: the wait for the stalled client's below
    // must not find this one.
    w.proc.wait_line("client connected", START_TIMEOUT);
    plain.send_raw(&walrus::resp::write::command(["PING"]));
    let mut rest = Vec::new();
    let _ = plain.stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", show(&rest));
    w.await_metric(&rejected_total("tls_plaintext"), |n| n >= 1.0);
    assert_eq!(rejected("tls_plaintext"), 1.0);

    // A client that connects and never starts its handshake holds its slot (the only one)
    // for tls.handshake_timeout_ms, no longer: then it is closed and counted.
    let started = std::time::Instant::now();
    let mut stalled = std::net::TcpStream::connect(&tls).unwrap();
    // A walrus that never closes it fails the test, not hangs it.
    stalled
        .set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .unwrap();
    w.proc.wait_line("client connected", START_TIMEOUT);
    let mut other = Raw::connect(&w.addr);
    assert_eq!(
        other.read_frame(),
        b"-ERR max number of clients reached\r\n"
    );
    let mut rest = Vec::new();
    let end = stalled.read_to_end(&mut rest);
    assert!(end.is_ok() && rest.is_empty(), "{end:?}");
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(2000) && took < std::time::Duration::from_secs(10),
        "{took:?}"
    );
    w.await_metric(&rejected_total("tls_handshake_timeout"), |n| n >= 1.0);
    assert_eq!(rejected("tls_handshake_timeout"), 1.0);

    // Both ports share proxy.max_clients: with a TLS client in, a plaintext one is refused,
    // and a TLS one is closed before its handshake.
    let mut c = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
    let mut other = Raw::connect(&w.addr);
    assert_eq!(
        other.read_frame(),
        b"-ERR max number of clients reached\r\n"
    );
    assert!(TlsRaw::connect(&tls, &client, LOCALHOST).is_err());
    drop(c);
    w.proc.wait_line("client session ended", START_TIMEOUT);
    // And the other way round.
    let mut p = Raw::connect(&w.addr);
    assert_eq!(p.cmd(&["PING"]), b"+PONG\r\n");
    assert!(TlsRaw::connect(&tls, &client, LOCALHOST).is_err());
    assert_eq!(
        metric(
            &metrics,
            "walrus_clients_rejected_total{reason=\"max_clients\"}"
        ),
        4.0
    );
}

#[test]
fn clients_check_walrus_and_walrus_checks_clients() {
    let files = TlsFiles::new();
    let cert = files.client_cert(&Leaf::client("c"));
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .config(&files.toml(""))
        .args(&["--metrics-listen", &metrics])
        .env(&[DEBUG_TLS])
        .start();
    let tls = tls_addr(&w.proc);
    let failed_total = rejected_total("tls_handshake_failed");
    let failed = || metric(&metrics, &failed_total);
    let await_failed = |n: f64| w.await_metric(&failed_total, |f| f >= n);

    // A client that does not trust walrus's CA, and one that expects another name: each
    // ends the handshake, which walrus sees fail.
    let stranger = Ca::new("another CA");
    let e = TlsRaw::connect(
        &tls,
        &common::tls::client_config(&stranger.pem, Some(&cert)),
        LOCALHOST,
    )
    .err()
    .expect("a client that does not trust walrus's CA connected");
    assert!(e.contains("UnknownIssuer"), "{e}");
    await_failed(1.0);
    let e = TlsRaw::connect(&tls, &files.client(Some(&cert)), "walrus.example")
        .err()
        .expect("a certificate for another name was accepted");
    assert!(e.contains("not valid for name"), "{e}");
    await_failed(2.0);
    assert_eq!(failed(), 2.0);

    // auth_clients = yes (the default): no certificate, or one of another CA, is refused.
    let refused = |r: Result<TlsRaw, String>| match r {
        Err(_) => {}
        // TLS 1.3: the client's side of the handshake ends before walrus has checked
        // its certificate; walrus's refusal arrives as the first read.
        Ok(mut c) => assert!(
            c.try_cmd(&["PING"]).is_none(),
            "served without a good certificate"
        ),
    };
    refused(TlsRaw::connect(&tls, &files.client(None), LOCALHOST));
    await_failed(3.0);
    // The log says why: its third failure (the count goes up just before the line).
    let line = common::state::await_read(
        &w.proc,
        "the third handshake failure logged",
        START_TIMEOUT,
        || {
            let log = w.proc.log_text();
            let line = log
                .lines()
                .filter(|l| l.contains("TLS handshake failed"))
                .nth(2);
            line.map(str::to_string)
        },
        Option::is_some,
    )
    .unwrap();
    assert!(line.contains("certificate"), "{line}");
    let foreign = stranger.sign(&Leaf::client("c"));
    refused(TlsRaw::connect(
        &tls,
        &files.client(Some(&foreign)),
        LOCALHOST,
    ));
    await_failed(4.0);
    assert_eq!(failed(), 4.0);
    let mut ok = TlsRaw::connect(&tls, &files.client(Some(&cert)), LOCALHOST).unwrap();
    assert_eq!(ok.cmd(&["PING"]), b"+PONG\r\n");

    // auth_clients = optional: without a certificate too; and TLS clients only.
    let (proc, _dir) = Walrus::build()
        .listen("")
        .config(&files.toml("auth_clients = \"optional\""))
        .spawn();
    proc.wait_line("walrus serves TLS clients only", START_TIMEOUT);
    let tls = tls_addr(&proc);
    let mut anon = TlsRaw::connect(&tls, &files.client(None), LOCALHOST).unwrap();
    assert_eq!(anon.cmd(&["SET", "a", "1"]), b"+OK\r\n");
    let mut signed = TlsRaw::connect(&tls, &files.client(Some(&cert)), LOCALHOST).unwrap();
    assert_eq!(signed.cmd(&["GET", "a"]), bulk("1"));
    // Even optional, a certificate that is sent must be good.
    refused(TlsRaw::connect(
        &tls,
        &files.client(Some(&foreign)),
        LOCALHOST,
    ));
}

/// `walrus serve` and `walrus config check` refuse a certificate that cannot be served,
/// naming the file and the problem: 2 for a mistake, 1 for a file not there yet.
#[test]
fn a_certificate_that_cannot_be_served_stops_walrus_naming_the_file() {
    let mut files = TlsFiles::new();
    // Both name `needle`'s file and problem, and exit with `code`.
    let refused = |files: &TlsFiles, needle: &str, code: i32| {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "walrus.toml", &files.toml(""));
        let out = run_walrus(&["config", "check", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "config check: {stderr}");
        assert_eq!(out.status.code(), Some(code), "config check: {stderr}");
        let (mut p, _dir) = Walrus::build().config(&files.toml("")).spawn();
        p.wait_line(needle, START_TIMEOUT);
        let status = p
            .wait_exit(START_TIMEOUT)
            .expect("walrus must refuse to start");
        assert_eq!(status.code(), Some(code), "serve: {}", p.log_text());
    };

    files.serve(&Leaf::server(2).years(2020, 2021));
    let crt = files.path("tls.crt");
    refused(
        &files,
        &format!("tls.cert_file = {crt}: the certificate expired on"),
        2,
    );

    files.serve(&Leaf::server(3));
    let other = files.ca.sign(&Leaf::server(4));
    write(files.dir.path(), "tls.key", &other.key);
    let key = files.path("tls.key");
    refused(
        &files,
        &format!("tls.key_file = {key}: is not the key of the certificate in {crt}"),
        2,
    );

    // A missing file may yet be written (a Secret mounted late): worth a retry.
    std::fs::remove_file(&crt).unwrap();
    refused(&files, &format!("tls.cert_file = {crt}: No such file"), 1);
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "walrus.toml",
        "[tls]\nlisten = \"127.0.0.1:0\"\n",
    );
    let out = run_walrus(&["config", "check", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tls.cert_file must be set"));
}

/// redis-py, as deploy/setup.sh installs it, over TLS through walrus.
#[test]
fn a_python_client_speaks_tls_through_walrus() {
    let files = TlsFiles::new();
    let cert = files.client_cert(&Leaf::client("py"));
    write(files.dir.path(), "client.crt", &cert.cert);
    write(files.dir.path(), "client.key", &cert.key);
    let w = Walrus::build().config(&files.toml("")).start();
    let port = tls_addr(&w.proc).rsplit(':').next().unwrap().to_string();
    let script = format!(
        r#"
import redis
r = redis.Redis(host="localhost", port={port}, ssl=True, ssl_ca_certs={ca:?},
                ssl_certfile={crt:?}, ssl_keyfile={key:?})
big = b"x" * 1000000
assert r.set("py", big)
assert r.get("py") == big
p = r.pipeline(transaction=False)
for _ in range(1000):
    p.incr("pyc")
assert p.execute()[-1] == 1000
with r.pipeline() as t:
    t.set("a", "1").incr("a")
    assert t.execute() == [True, 2]
print("ok")
"#,
        ca = files.path("ca.crt"),
        crt = files.path("client.crt"),
        key = files.path("client.key"),
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "{}\nwalrus:\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.proc.log_text()
    );
}

/// SIGHUP reads the TLS files again; without a TLS listener it has nothing to do, and must
/// not end walrus (its default action would).
#[test]
fn sighup_without_tls_does_not_stop_walrus() {
    let w = Walrus::build().start();
    w.proc.signal(libc::SIGHUP);
    w.proc
        .wait_line("SIGHUP received: nothing to reload", START_TIMEOUT);
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
    let _ = std::io::stdout().flush();
}

/// docs/security.md, "TLS", as a user follows it: its openssl commands make the certificates, its
/// `[tls]` table serves them, its ACL user is created, and its client command (redis-cli
/// for valkey-cli: the same flags) writes through walrus as alice.
#[test]
fn the_security_guides_tls_example_works_as_written() {
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let section = &guide[guide
        .find("\n## TLS\n")
        .expect("docs/security.md has a TLS section")..];
    let block = |lang: &str, nth: usize| -> String {
        let open = format!("```{lang}\n");
        let start = section
            .match_indices(&open)
            .nth(nth)
            .expect("a code block")
            .0
            + open.len();
        section[start..start + section[start..].find("```").unwrap()].to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().to_str().unwrap();
    let make = block("sh", 0).replace("/etc/walrus/tls", here);
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &make])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let toml = block("toml", 0)
        .replace("/etc/walrus/tls", here)
        .replace("0.0.0.0:6390", "127.0.0.1:0");
    let w = Walrus::build().config(&toml).start();
    let port = tls_addr(&w.proc).rsplit(':').next().unwrap().to_string();
    // The user, as the guide creates it.
    let acl = &section[section.find("`ACL SETUSER alice").expect("the ACL user") + 1..];
    let acl: Vec<&str> = acl[..acl.find('`').unwrap()].split(' ').collect();
    let mut direct = Raw::connect(&managed_valkey_addr(&w.addr));
    assert_eq!(direct.cmd(&acl), b"+OK\r\n");
    let client = block("sh", 1)
        .replace("valkey-cli", "redis-cli")
        .replace("6390", &port);
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &client])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        said.trim(),
        "OK",
        "{client}: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // alice's key, written as alice (her user may touch nothing else).
    assert_eq!(direct.cmd(&["GET", "alice:k"]), b"$1\r\nv\r\n");
}
