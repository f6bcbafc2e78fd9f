//! The restore listener against strangers: 16 connections that PING every 2 s must not hold
//! a restore up (were each PING to restart the AUTH timeout, the 17th connection, Valkey's,
//! would be dropped).

use super::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "walrus-restore-test";

fn auth(valkey_uid: Option<u32>) -> OneTimeAuth {
    OneTimeAuth {
        secret: Some(SECRET.into()),
        previous: String::new(),
        valkey_uid,
    }
}

fn me() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

async fn send(s: &mut TcpStream, args: &[&str]) {
    s.write_all(&crate::resp::write::command(args.iter()))
        .await
        .unwrap();
}

/// Reads one reply line.
async fn line(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    while !out.ends_with(b"\r\n") {
        let mut byte = [0u8];
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        out.push(byte[0]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn listen() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// A connection that sent its one PING before AUTH, as Valkey does first.
async fn pinged(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    send(&mut s, &["PING"]).await;
    assert!(line(&mut s).await.starts_with("-NOAUTH"));
    s
}

/// Valkey's side of the handshake (replication.c, `syncWithPrimary`), up to its PSYNC.
async fn replicate(port: u16) -> TcpStream {
    let mut s = pinged(port).await;
    send(&mut s, &["AUTH", SECRET]).await;
    assert_eq!(line(&mut s).await, "+OK\r\n");
    send(&mut s, &["PSYNC", "?", "-1"]).await;
    s
}

/// Waits until walrus closes the connection (its end, or a reset), returning what it sent
/// before; true when it closed.
async fn closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Closed at once: before half of AUTH_TIMEOUT (the clock is paused: it moves only when
/// every task waits).
async fn closed_at_once(s: &mut TcpStream) -> Vec<u8> {
    tokio::time::timeout(AUTH_TIMEOUT / 2, closed(s))
        .await
        .expect("walrus kept the connection open")
}

/// MAX_HANDSHAKES connections that PINGed once and then stay silent hold every slot, yet
/// Valkey's connection, the next, is served: the oldest silent one gives way.
#[tokio::test]
async fn silent_connections_holding_every_slot_do_not_keep_valkey_out() {
    let (listener, port) = listen().await;
    let auth = auth(None);
    let accept = accept_replica(&listener, &auth, None, Duration::from_secs(60));
    let attack = async {
        let mut holders = Vec::new();
        for _ in 0..MAX_HANDSHAKES {
            holders.push(pinged(port).await);
        }
        let valkey = replicate(port).await;
        // The first holder made room.
        closed(&mut holders[0]).await;
        (holders, valkey)
    };
    let (replica, _) = tokio::join!(accept, attack);
    replica.expect("Valkey's connection is served");
}

/// A second PING before AUTH closes the connection: PINGs cannot keep one open.
#[tokio::test(start_paused = true)]
async fn a_second_ping_before_auth_is_dropped() {
    let (listener, port) = listen().await;
    let auth = auth(None);
    let accept = accept_replica(&listener, &auth, None, Duration::from_secs(60));
    let attack = async {
        let mut s = pinged(port).await;
        send(&mut s, &["PING"]).await;
        closed_at_once(&mut s).await;
        replicate(port).await
    };
    let (replica, _valkey) = tokio::join!(accept, attack);
    replica.unwrap();
}

/// A connection that stays silent is dropped AUTH_TIMEOUT after its accept, however it
/// spreads its PING.
#[tokio::test(start_paused = true)]
async fn a_connection_has_auth_timeout_from_its_accept() {
    let (listener, port) = listen().await;
    let auth = auth(None);
    let accept = accept_replica(&listener, &auth, None, Duration::from_secs(60));
    let attack = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let start = tokio::time::Instant::now();
        tokio::time::sleep(AUTH_TIMEOUT / 2).await;
        send(&mut s, &["PING"]).await;
        assert!(line(&mut s).await.starts_with("-NOAUTH"));
        closed(&mut s).await;
        assert!(start.elapsed() <= AUTH_TIMEOUT + Duration::from_millis(100));
        replicate(port).await
    };
    let (replica, _valkey) = tokio::join!(accept, attack);
    replica.unwrap();
}

/// When walrus knows Valkey's user, a connection from another is dropped at once; one from
/// Valkey's is served.
#[tokio::test(start_paused = true)]
async fn a_connection_from_another_user_than_valkeys_is_dropped() {
    let (listener, port) = listen().await;
    let stranger = auth(Some(me().wrapping_add(1)));
    let accept = accept_replica(&listener, &stranger, None, Duration::from_secs(60));
    let attack = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        send(&mut s, &["PING"]).await;
        let got = closed_at_once(&mut s).await;
        assert!(got.is_empty(), "a stranger was answered: {got:?}");
    };
    tokio::select! {
        _ = accept => panic!("a stranger's connection was taken for Valkey's"),
        _ = attack => {}
    }
    let own = auth(Some(me()));
    let accept = accept_replica(&listener, &own, None, Duration::from_secs(60));
    let (replica, _valkey) = tokio::join!(accept, replicate(port));
    replica.unwrap();
}
