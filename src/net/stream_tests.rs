//! The TLS halves' readiness calls, where they differ from TCP's: a write can be taken by
//! rustls while the socket is full (`unflushed`), and only `writable` pushes it out; reads
//! go through what rustls holds, to the peer's close_notify.

use super::{ReadHalf, Stream, WriteHalf};
use bytes::BytesMut;
use std::io::ErrorKind::WouldBlock;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::{self, pki_types::pem::PemObject};

use crate::net::test_certs as certs;

/// Sets a socket's send or receive buffer: small buffers fill at once, deterministically.
fn buffer(s: &TcpStream, option: libc::c_int, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt on a socket this test owns, with a c_int it reads.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            &bytes as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}

/// A TLS connection over loopback: walrus's end as a [`Stream`], the peer's as tokio-rustls's
/// client stream. Both sockets' buffers are small.
async fn pair() -> (Stream, tokio_rustls::client::TlsStream<TcpStream>) {
    let ca = certs::Ca::new("stream test CA");
    let server = ca.sign(&certs::Leaf::server(1));
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(server.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(server.key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connect = async {
        let s = TcpStream::connect(addr).await.unwrap();
        buffer(&s, libc::SO_RCVBUF, 4096);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, s)
            .await
            .unwrap()
    };
    let accept = async {
        let (s, _) = listener.accept().await.unwrap();
        buffer(&s, libc::SO_SNDBUF, 4096);
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(config))
            .accept(s)
            .await
            .unwrap();
        Stream::Tls(Box::new(tls.into()))
    };
    let (server, client) = tokio::join!(accept, connect);
    (server, client)
}

#[tokio::test]
async fn a_write_rustls_takes_while_the_socket_is_full_is_pushed_out_by_writable() {
    let (server, mut client) = pair().await;
    let (_rd, mut wr) = server.into_split();
    // The peer reads nothing yet. Small writes, each taken whole: at first the socket takes
    // them; once it is full, rustls keeps them (its buffer, 64 KiB, is far from full), and the
    // writer, whose own buffer is empty, learns it only from `unflushed`. The session's
    // writer then waits on `writable`, which pushes them out.
    let chunk = [b'a'; 1024];
    let mut sent = 0;
    while !wr.unflushed() {
        assert_eq!(
            wr.try_write(&chunk).unwrap(),
            chunk.len(),
            "a small write with rustls's buffer empty is taken whole"
        );
        sent += chunk.len();
        assert!(sent < 64 << 20, "the socket never filled");
    }
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        while got.len() < sent {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended {} bytes early", sent - got.len());
            got.extend_from_slice(&buf[..n]);
        }
        got
    });
    let pushed = async {
        while wr.unflushed() {
            wr.writable().await.unwrap();
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), pushed)
        .await
        .expect("writable never pushed out what rustls held");
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
        .await
        .expect("the peer never got what rustls held")
        .unwrap();
    assert_eq!(got.len(), sent);
    assert!(got.iter().all(|&b| b == b'a'));
}

#[tokio::test]
async fn reads_take_what_rustls_holds_and_end_at_close_notify() {
    let (server, mut client) = pair().await;
    let (mut rd, mut wr): (ReadHalf, WriteHalf) = server.into_split();
    use tokio::io::AsyncWriteExt;
    // Many records in one burst: a read may leave some decrypted in rustls, which the next
    // `try_read_buf` must return without the socket showing anything new.
    let burst: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    client.write_all(&burst).await.unwrap();
    client.flush().await.unwrap();
    let mut got = BytesMut::new();
    while got.len() < burst.len() {
        match rd.try_read_buf(&mut got) {
            Ok(0) => panic!("ended early"),
            Ok(_) => {}
            Err(e) if e.kind() == WouldBlock => rd.readable().await.unwrap(),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(&got[..], &burst[..]);
    // The peer's close_notify is the end, not an error; the writer answers with its own.
    client.shutdown().await.unwrap();
    let mut rest = BytesMut::new();
    let end = loop {
        match rd.try_read_buf(&mut rest) {
            Err(e) if e.kind() == WouldBlock => rd.readable().await.unwrap(),
            r => break r,
        }
    };
    assert_eq!(end.unwrap(), 0);
    wr.close_notify();
    let mut tail = Vec::new();
    assert_eq!(client.read_to_end(&mut tail).await.unwrap(), 0);
}

/// A read that leaves room in the buffer emptied the socket: the next one answers
/// `WouldBlock` at once, and `readable` waits for the peer's next bytes, instead of a `recv`
/// that finds nothing after every request.
#[tokio::test]
async fn a_short_read_leaves_the_socket_waiting_for_more() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut peer = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (rd, _) = listener.accept().await.unwrap();
    let (mut rd, _wr) = Stream::Tcp(rd).into_split();
    use tokio::io::AsyncWriteExt;
    peer.write_all(b"PING\r\n").await.unwrap();
    let mut got = BytesMut::with_capacity(1024);
    while got.is_empty() {
        match rd.try_read_buf(&mut got) {
            Ok(n) => assert!(n > 0, "the peer closed"),
            Err(e) if e.kind() == WouldBlock => rd.readable().await.unwrap(),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(&got[..], b"PING\r\n");
    {
        let mut readable = std::pin::pin!(rd.readable());
        assert!(
            std::future::Future::poll(
                readable.as_mut(),
                &mut std::task::Context::from_waker(std::task::Waker::noop())
            )
            .is_pending(),
            "the socket still counts as readable after a read emptied it"
        );
    }
    assert_eq!(rd.try_read_buf(&mut got).unwrap_err().kind(), WouldBlock);
    peer.write_all(b"PING\r\n").await.unwrap();
    rd.readable().await.unwrap();
    assert_eq!(rd.try_read_buf(&mut got).unwrap(), 6);
}
