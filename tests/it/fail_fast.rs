//! Mistakes are reported at once, with the exit code of the one rule (src/cli/mod.rs): 2
//! when a person must fix something (systemd does not restart on it), 1 when trying again
//! may succeed. A busy port is found before Valkey starts or the ring is allocated; `journal
//! init` and `serve` read one configuration and refuse the same things.

use crate::common;

use common::{valkey_server_bin, walrus_bin};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

/// A managed-mode configuration (the default users run) with a small ring.
fn config(dir: &Path, journal: &str) -> std::path::PathBuf {
    config_with_data(dir, &dir.join("data"), journal)
}

/// The same, its data directory at `data`.
fn config_with_data(dir: &Path, data: &Path, journal: &str) -> std::path::PathBuf {
    let path = dir.join("walrus.toml");
    let text = format!(
        "[upstream]\nvalkey_server = {:?}\n[data]\ndir = {data:?}\n[metrics]\nlisten = \"\"\n[journal]\n{journal}",
        valkey_server_bin(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

const SMALL_RING: &str = "segments = 4\nsegment_size_bytes = \"1mb\"\nmax_write_bytes = \"64kb\"\n";

/// Runs walrus to its exit (every run here ends by itself, at once when the fix works),
/// checks its exit code and that its output names each of `named`; returns the output.
fn exits(args: &[&str], code: i32, named: &[&str]) -> String {
    let out = Command::new(walrus_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
    for n in named {
        assert!(text.contains(n), "{args:?} does not say {n:?}: {text}");
    }
    text
}

#[test]
fn a_busy_client_port_is_reported_before_valkey_starts_or_the_ring_is_allocated() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = exits(
        &["serve", "-c", cfg.to_str().unwrap(), "--listen", &addr],
        1,
        &[&format!("cannot listen on proxy.listen {addr}")],
    );
    assert!(
        !out.contains("valkey-server"),
        "Valkey was started first: {out}"
    );
    // The data directory's lock comes first (one walrus per data directory), and nothing
    // in it after that before the port.
    assert!(
        !tmp.path().join("data/journal").exists(),
        "the journal was made before the port was tried"
    );
}

#[test]
fn a_busy_metrics_port_is_reported_before_valkey_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    exits(
        &[
            "serve",
            "-c",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            &addr,
        ],
        1,
        &[&format!("cannot listen on metrics.listen {addr}")],
    );
    assert!(!tmp.path().join("data/journal").exists());
}

#[test]
fn journal_init_takes_the_serve_configuration_and_refuses_what_serve_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    let cfg = cfg.to_str().unwrap();

    // The configuration's geometry and data directory.
    exits(
        &["journal", "init", "-c", cfg, "--quiet"],
        0,
        &["4 segments of 1048576 bytes"],
    );
    assert!(tmp.path().join("data/journal/MANIFEST").exists());

    // A ring serve would refuse is refused by init too, before anything is written.
    let fresh = tmp.path().join("fresh");
    let dir = fresh.to_str().unwrap();
    exits(
        &[
            "journal",
            "init",
            "-c",
            cfg,
            "--dir",
            dir,
            "--segments",
            "2",
        ],
        2,
        &["journal.segments = 2"],
    );
    assert!(!fresh.exists());

    // Another geometry over the existing journal: a mistake to fix, named with its keys.
    exits(
        &["journal", "init", "-c", cfg, "--segments", "5"],
        2,
        &["segments = 4", "journal.segments"],
    );
}

#[test]
fn serve_exits_2_on_a_journal_of_another_geometry() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    exits(
        &["journal", "init", "-c", cfg.to_str().unwrap(), "--quiet"],
        0,
        &[],
    );
    let other = config(
        tmp.path(),
        "segments = 5\nsegment_size_bytes = \"1mb\"\nmax_write_bytes = \"64kb\"\n",
    );
    exits(
        &[
            "serve",
            "-c",
            other.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        2,
        &["set journal.segment_size_bytes and journal.segments to the journal's"],
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
        exits(args, 2, &["\"64 parsecs\" is not a size", "64mb"]);
    }
    let good = config(tmp.path(), SMALL_RING);
    exits(&["config", "check", good.to_str().unwrap()], 0, &[]);
    // A file that is not there yet may be written by an agent starting beside walrus (a
    // secret rendered at boot): worth a retry. One that is there but unreadable is not.
    let missing = tmp.path().join("not-yet.toml");
    exits(&["serve", "-c", missing.to_str().unwrap()], 1, &[]);
    exits(&["serve", "-c", tmp.path().to_str().unwrap()], 2, &[]);
    let secret = tmp.path().join("secret.toml");
    std::fs::write(
        &secret,
        format!(
            "[upstream]\npassword_file = {:?}\n",
            tmp.path().join("password-not-yet")
        ),
    )
    .unwrap();
    exits(
        &[
            "serve",
            "-c",
            secret.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        1,
        &["password_file"],
    );
}

/// What waiting does not cure exits 2, so that systemd stops instead of restarting five
/// times: the data directory a file, a read-only file system, a ring larger than its volume.
#[test]
fn file_system_mistakes_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), SMALL_RING);
    std::fs::write(tmp.path().join("data"), "not a directory").unwrap();
    let serve = |cfg: &Path| {
        vec![
            "serve".to_string(),
            "-c".into(),
            cfg.to_str().unwrap().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ]
    };
    let args = serve(&cfg);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    exits(&args, 2, &["cannot create", "File exists"]);
    if let Some(ro) = common::Tmpfs::mount(1, true) {
        let cfg = config_with_data(tmp.path(), &ro.path().join("data"), SMALL_RING);
        let args = serve(&cfg);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        exits(&args, 2, &["Read-only file system"]);
    }
    if let Some(small) = common::Tmpfs::mount(8, false) {
        let ring = "segments = 4\nsegment_size_bytes = \"4mb\"\nmax_write_bytes = \"64kb\"\n";
        let cfg = config_with_data(tmp.path(), &small.path().join("data"), ring);
        let args = serve(&cfg);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        exits(&args, 2, &["Shrink the ring or grow the volume"]);
    }
}
