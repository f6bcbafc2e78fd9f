//! The managed valkey-server: bus ports picked again when taken, its log levels.

use super::valkey_level;
use crate::upstream::cluster::ClusterNode;
use tracing::Level;

/// The managed Valkey in `dir` (its socket in `dir/run`), started as `ManagedValkey::start`
/// would, with `pick` for the free ports it needs.
async fn spawn(
    binary: std::path::PathBuf,
    dir: &std::path::Path,
    extra_args: Vec<String>,
    cluster: Option<ClusterNode>,
    pick: impl FnMut() -> std::io::Result<u16>,
) -> super::ManagedValkey {
    let socket = dir.join("run/valkey.sock");
    super::ManagedValkey::spawn_ready(
        binary,
        &dir.join("valkey"),
        socket,
        extra_args,
        cluster,
        pick,
    )
    .await
    .unwrap()
}

/// A cluster node on 127.0.0.1 announcing `port`, its bus port walrus's choice.
fn node(port: u16) -> ClusterNode {
    ClusterNode {
        announce: crate::config::Announce {
            ip: std::net::Ipv4Addr::LOCALHOST.into(),
            port,
        },
        bus_port: 0,
    }
}

/// A cluster node whose bus port is picked free (its announced port plus 10000 is no
/// port) finds it taken before Valkey binds it: walrus picks another.
#[tokio::test]
async fn a_picked_bus_port_taken_meanwhile_is_picked_again() {
    let Ok(binary) = crate::upstream::binary::find("") else {
        return; // no valkey-server here: deploy/setup.sh installs it
    };
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let mut picks = vec![super::free_port().unwrap(), taken_port];
    let valkey = spawn(binary, tmp.path(), vec![], Some(node(60000)), || {
        Ok(picks.pop().expect("two picks at most"))
    })
    .await;
    assert!(picks.is_empty(), "the taken port was not picked again");
    assert_eq!(
        valkey.address,
        format!("unix:{}", tmp.path().join("run/valkey.sock").display())
    );
    valkey.stop().await;
}

/// The default bus port (the announced port plus 10000) is taken by another process:
/// walrus picks a free one instead of failing.
#[tokio::test]
async fn a_taken_default_bus_port_is_replaced_by_a_free_one() {
    let Ok(binary) = crate::upstream::binary::find("") else {
        return; // no valkey-server here: deploy/setup.sh installs it
    };
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let mut picks = vec![super::free_port().unwrap()];
    let valkey = spawn(
        binary,
        tmp.path(),
        vec![],
        Some(node(taken_port - 10000)),
        || Ok(picks.pop().expect("one pick")),
    )
    .await;
    assert!(picks.is_empty(), "no free port was picked");
    valkey.stop().await;
}

/// walrus's listener arguments come after `upstream.extra_args`, so that Valkey, which
/// takes a setting's last value, keeps its TCP port closed even when an argument gets past
/// the config's check (as `"--port 16399"`, a setting and its value in one argument, could).
#[tokio::test]
async fn extra_args_cannot_reopen_the_tcp_port_that_walrus_closes() {
    use std::io::{Read, Write};
    let Ok(binary) = crate::upstream::binary::find("") else {
        return; // no valkey-server here: deploy/setup.sh installs it
    };
    let tmp = tempfile::tempdir().unwrap();
    let port = super::free_port().unwrap().to_string();
    let socket = tmp.path().join("run/valkey.sock");
    let valkey = spawn(
        binary,
        tmp.path(),
        vec!["--port".into(), port.clone(), format!("--tls-port {port}")],
        None,
        || unreachable!("no cluster bus"),
    )
    .await;
    let mut conn = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    conn.write_all(b"CONFIG GET port\r\n").unwrap();
    let mut reply = [0u8; 64];
    let n = conn.read(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply[..n]);
    assert!(reply.ends_with("$4\r\nport\r\n$1\r\n0\r\n"), "{reply:?}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_err());
    valkey.stop().await;
}

#[test]
fn valkeys_warnings_are_logged_as_warnings() {
    for (line, level) in [
        (
            "123:M 25 Nov 2026 04:51:34.916 # WARNING Memory overcommit must be enabled!",
            Level::WARN,
        ),
        (
            "123:C 25 Nov 2026 04:51:34.916 * oO0OoO0OoO0Oo Valkey is starting oO0OoO0OoO0Oo",
            Level::INFO,
        ),
        (
            "123:M 25 Nov 2026 04:51:34.916 - Accepted 127.0.0.1:5000",
            Level::DEBUG,
        ),
        (
            "123:S 25 Nov 2026 04:51:34.916 . Client closed connection",
            Level::DEBUG,
        ),
        (
            "=== VALKEY BUG REPORT START: Cut & paste starting from here ===",
            Level::INFO,
        ),
        ("", Level::INFO),
    ] {
        assert_eq!(valkey_level(line), level, "{line}");
    }
}
