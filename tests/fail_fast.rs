//! Mistakes are reported at once, with the exit code of the one rule (src/cli/mod.rs): 2
//! when a person must fix something (systemd does not restart on it), 1 when trying again
//! may succeed. A busy port is found before Valkey starts or the ring is allocated; `journal
//! init` and `serve` read one configuration and refuse the same things.

mod common;

use common::{valkey_server_bin, walrus_bin};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

/// A managed-mode configuration (the default users run) with a small ring.
fn config(dir: &Path, journal: &str) -> std::path::PathBuf {
    let path = dir.join("walrus.toml");
    let text = format!(
        "[upstream]\nvalkey_server = {:?}\n[data]\ndir = {:?}\n[metrics]\nlisten = \"\"\n[journal]\n{journal}",
        valkey_server_bin(),
        dir.join("data"),
    );
    std::fs::write(&path, text).unwrap();
    path
}

const SMALL_RING: &str = "segments = 4\nsegment_size_bytes = \"1mb\"\nmax_write_bytes = \"64kb\"\n";

/// Runs walrus to its exit. Every run here ends by itself, at once when the fix works.
fn walrus(args: &[&str]) -> Output {
    Command::new(walrus_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_busy_client_port_is_reported_before_valkey_starts_or_the_ring_is_allocated() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = walrus(&["serve", "-c", cfg.to_str().unwrap(), "--listen", &addr]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("cannot listen on proxy.listen {addr}")),
        "{}",
        text(&out)
    );
    assert!(
        !text(&out).contains("valkey-server"),
        "Valkey was started first: {}",
        text(&out)
    );
    assert!(
        !tmp.path().join("data").exists(),
        "the data directory was made before the port was tried"
    );
}

#[test]
fn a_busy_metrics_port_is_reported_before_valkey_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = walrus(&[
        "serve",
        "-c",
        cfg.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        &addr,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("cannot listen on metrics.listen {addr}")),
        "{}",
        text(&out)
    );
    assert!(!tmp.path().join("data").exists());
}

#[test]
fn journal_init_takes_the_serve_configuration_and_refuses_what_serve_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    let cfg = cfg.to_str().unwrap();

    // The configuration's geometry and data directory.
    let out = walrus(&["journal", "init", "-c", cfg, "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("4 segments of 1048576 bytes"),
        "{}",
        text(&out)
    );
    assert!(tmp.path().join("data/journal/MANIFEST").exists());

    // A ring serve would refuse is refused by init too, before anything is written.
    let fresh = tmp.path().join("fresh");
    let out = walrus(&[
        "journal",
        "init",
        "-c",
        cfg,
        "--dir",
        fresh.to_str().unwrap(),
        "--segments",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("journal.segments = 2"),
        "{}",
        text(&out)
    );
    assert!(!fresh.exists());

    // Another geometry over the existing journal: a mistake to fix, named with its keys.
    let out = walrus(&["journal", "init", "-c", cfg, "--segments", "5"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("segments = 4") && text(&out).contains("journal.segments"),
        "{}",
        text(&out)
    );
}

#[test]
fn serve_exits_2_on_a_journal_of_another_geometry() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    let out = walrus(&["journal", "init", "-c", cfg.to_str().unwrap(), "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let other = config(
        tmp.path(),
        "segments = 5\nsegment_size_bytes = \"1mb\"\nmax_write_bytes = \"64kb\"\n",
    );
    let out = walrus(&[
        "serve",
        "-c",
        other.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("set journal.segment_size_bytes and journal.segments to the journal's"),
        "{}",
        text(&out)
    );
}

#[test]
fn configuration_errors_exit_2_from_every_command_that_reads_one() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "segment_size_bytes = \"64 parsecs\"\n");
    let cfg = cfg.to_str().unwrap();
    for args in [
        &["serve", "-c", cfg][..],
        &["config", "check", cfg][..],
        &["journal", "init", "-c", cfg][..],
    ] {
        let out = walrus(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("\"64 parsecs\" is not a size") && text(&out).contains("64mb"),
            "{args:?}: {}",
            text(&out)
        );
    }
    let good = config(tmp.path(), SMALL_RING);
    let out = walrus(&["config", "check", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // A file that is not there yet may be written by an agent starting beside walrus (a
    // secret rendered at boot): worth a retry. One that is there but unreadable is not.
    let missing = tmp.path().join("not-yet.toml");
    let out = walrus(&["serve", "-c", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = walrus(&["serve", "-c", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "a directory: {}", text(&out));
    let secret = tmp.path().join("secret.toml");
    std::fs::write(
        &secret,
        format!(
            "[upstream]\npassword_file = {:?}\n",
            tmp.path().join("password-not-yet")
        ),
    )
    .unwrap();
    let out = walrus(&[
        "serve",
        "-c",
        secret.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("password_file"), "{}", text(&out));
}
