//! TLS certificates replaced while walrus runs (issue 25): on SIGHUP and on the timer, new
//! connections get the new certificate, open ones keep theirs and are never dropped, and a
//! reload that fails keeps the certificate in use, says why naming the file, and counts it.

use crate::common;
use common::certs::{write, Leaf};
use common::tls::{tls_addr, TlsFiles, TlsRaw};
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

const LOCALHOST: &str = "localhost";

#[test]
fn a_certificate_replaced_under_load_drops_no_connection() {
    let mut files = TlsFiles::new();
    let cert = files.client_cert(&Leaf::client("load"));
    let client = files.client(Some(&cert));
    // SIGHUP only: the reload comes when the test says.
    let w = Walrus::build()
        .config(&files.toml("reload_interval_ms = 0"))
        .start();
    let tls = tls_addr(&w.proc);
    let old = files.served.clone();

    // Clients that keep running pipelines of INCRs, each on one connection, and say after
    // each round how many they have done.
    let stop = Arc::new(AtomicBool::new(false));
    let (rounds_tx, rounds) = mpsc::channel::<(usize, usize)>();
    let workers: Vec<_> = (0..4)
        .map(|id| {
            let (tls, client, stop, rounds_tx) =
                (tls.clone(), client.clone(), stop.clone(), rounds_tx.clone());
            std::thread::spawn(move || -> Result<Vec<u8>, String> {
                let mut c = TlsRaw::connect(&tls, &client, LOCALHOST)?;
                let key = format!("counter{id}");
                let mut done = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let mut burst = Vec::new();
                    for _ in 0..100 {
                        burst.extend_from_slice(&walrus::resp::write::command(["INCR", &key]));
                    }
                    c.send_raw(&burst);
                    for _ in 0..100 {
                        done += 1;
                        let r = c.try_read_frame()?;
                        if r != format!(":{done}\r\n").into_bytes() {
                            return Err(format!("{key}: {}", show(&r)));
                        }
                    }
                    let _ = rounds_tx.send((id, done));
                }
                Ok(c.server_cert())
            })
        })
        .collect();
    let mut seen = [0usize; 4];
    let await_rounds = |seen: &mut [usize; 4]| {
        // Every worker finishes a round after this point.
        let floor = *seen;
        while seen.iter().zip(floor).any(|(s, f)| *s <= f) {
            let (id, done) = rounds
                .recv_timeout(START_TIMEOUT)
                .expect("a worker stopped reporting");
            seen[id] = done;
        }
    };
    await_rounds(&mut seen);

    files.serve(&Leaf::server(2));
    assert_ne!(files.served, old);
    w.proc.signal(libc::SIGHUP);
    let line = w
        .proc
        .wait_line("TLS certificate and key reloaded (SIGHUP)", START_TIMEOUT);
    assert!(line.contains("serial="), "{line}");
    let mut fresh = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert!(
        fresh.server_cert() == files.served,
        "a new connection got the old certificate"
    );
    assert_eq!(fresh.cmd(&["PING"]), b"+PONG\r\n");

    // The open connections carry on, twice over, then stop.
    await_rounds(&mut seen);
    await_rounds(&mut seen);
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let served = worker
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("a client failed: {e}"));
        assert!(served == old, "an open connection's certificate changed");
    }
}

#[test]
fn the_timer_picks_up_a_renewed_certificate_and_a_bad_reload_keeps_the_old() {
    let mut files = TlsFiles::new();
    let cert = files.client_cert(&Leaf::client("c"));
    let client = files.client(Some(&cert));
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .config(&files.toml("reload_interval_ms = 100"))
        .args(&["--metrics-listen", &metrics])
        .start();
    let tls = tls_addr(&w.proc);
    let reloads = |result: &str| {
        metric(
            &metrics,
            &format!("walrus_tls_reloads_total{{result=\"{result}\"}}"),
        )
    };
    let expiry = || metric(&metrics, "walrus_tls_certificate_expiry_timestamp_seconds");
    assert_eq!(expiry(), 3_786_912_000.0); // 2090-01-01
    assert_eq!(reloads("failed"), 0.0);

    // Renewed: valid until 2080. The timer finds it.
    files.serve(&Leaf::server(2).years(2020, 2080));
    w.await_metric("walrus_tls_reloads_total{result=\"loaded\"}", |n| n >= 1.0);
    let mut c = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert!(c.server_cert() == files.served);
    assert_eq!(expiry(), 3_471_292_800.0); // 2080-01-01
    assert_eq!(reloads("loaded"), 1.0);
    let good = files.served.clone();

    // An expired certificate: kept out, the file named, counted; on SIGHUP too.
    files.serve(&Leaf::server(3).years(2020, 2021));
    let crt = files.path("tls.crt");
    let line = w.proc.wait_line("TLS reload (timer) failed", START_TIMEOUT);
    assert!(
        line.contains(&format!(
            "tls.cert_file = {crt}: the certificate expired on"
        )),
        "{line}"
    );
    w.proc.signal(libc::SIGHUP);
    w.proc
        .wait_line("TLS reload (SIGHUP) failed", START_TIMEOUT);
    let mut c2 = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert!(
        c2.server_cert() == good,
        "a failed reload changed the certificate"
    );
    assert_eq!(c2.cmd(&["PING"]), b"+PONG\r\n");
    assert!(reloads("failed") >= 2.0);
    assert_eq!(
        expiry(),
        3_471_292_800.0,
        "the gauge follows the certificate in use"
    );

    // A key that is not the certificate's: kept out too.
    let valid = files.ca.sign(&Leaf::server(4));
    let other = files.ca.sign(&Leaf::server(5));
    write(files.dir.path(), "tls.crt", &valid.cert);
    write(files.dir.path(), "tls.key", &other.key);
    let line = w
        .proc
        .wait_line("is not the key of the certificate", START_TIMEOUT);
    assert!(line.contains(&files.path("tls.key")), "{line}");
    let mut c3 = TlsRaw::connect(&tls, &client, LOCALHOST).unwrap();
    assert!(c3.server_cert() == good);
    // The first connection, made before all this, is served throughout.
    assert_eq!(c.cmd(&["PING"]), b"+PONG\r\n");
    assert_eq!(c3.cmd(&["PING"]), b"+PONG\r\n");
}
