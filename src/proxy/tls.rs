//! A client of the TLS port, from its first byte to its session: the handshake, in the
//! client's own task (the accept loop never waits for one), and the ACL user its
//! certificate names ([`cert_user`](super::cert_user)). All of it within
//! `tls.handshake_timeout_ms` of the connect: a client that connects and stalls holds its
//! `proxy.max_clients` slot no longer than that.

use super::cert_user::{self, Mapping};
use super::identity::Identity;
use super::Shared;
use crate::config::CertUser;
use crate::metrics::TlsRejected;
use crate::net::tls::reload::ServerTls;
use crate::net::Stream;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsAcceptor;

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How TLS clients are admitted.
pub struct TlsClients {
    /// The configuration new connections get (reloaded: [`crate::net::tls::reload`]).
    pub tls: Arc<ServerTls>,
    /// `tls.handshake_timeout_ms`.
    pub handshake_timeout: Duration,
    /// `tls.auth_clients_user`.
    pub cert_user: CertUser,
}

/// The session's stream and identity, or `None` when the connection ended first (counted
/// and logged here).
pub async fn admit(
    shared: &Shared,
    clients: &TlsClients,
    sock: TcpStream,
    peer: std::net::SocketAddr,
) -> Option<(Stream, Identity)> {
    let deadline = Instant::now() + clients.handshake_timeout;
    let timed_out = || {
        TlsRejected::HandshakeTimeout.count();
        tracing::debug!(%peer, "TLS client did not finish its handshake within tls.handshake_timeout_ms: closed");
    };
    // A plaintext client's first bytes are a RESP command: it is told nothing (it could not
    // read a TLS alert either) and closed, as Valkey's TLS port does.
    let mut first = [0u8; 1];
    match timeout_at(deadline, sock.peek(&mut first)).await {
        Err(_) => {
            timed_out();
            return None;
        }
        // Connected and closed (a TCP health check): nothing to count.
        Ok(Ok(0)) | Ok(Err(_)) => return None,
        Ok(Ok(_)) if first[0] != TLS_HANDSHAKE_RECORD => {
            TlsRejected::Plaintext.count();
            tracing::debug!(%peer, "a plaintext client on the TLS port: closed");
            return None;
        }
        Ok(Ok(_)) => {}
    }
    let acceptor = TlsAcceptor::from(clients.tls.config());
    let mut tls = match timeout_at(deadline, acceptor.accept(sock)).await {
        Err(_) => {
            timed_out();
            return None;
        }
        Ok(Err(e)) => {
            TlsRejected::HandshakeFailed.count();
            tracing::debug!(%peer, "TLS handshake failed: {e}");
            return None;
        }
        Ok(Ok(s)) => s,
    };
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned();
    let mut id = Identity::default();
    if let (Some(leaf), how) = (leaf, clients.cert_user) {
        if how != CertUser::Off {
            let up = shared.pools.upstream();
            match timeout_at(deadline, cert_user::map(up, how, &leaf)).await {
                Ok(Mapping::Default) => {}
                Ok(Mapping::User(creds)) => id.creds = Some(creds),
                Ok(Mapping::Refused(reply)) => {
                    // Its first command gets the reason; then it is closed.
                    let _ = timeout_at(deadline, async {
                        tls.write_all(&reply).await?;
                        tls.shutdown().await
                    })
                    .await;
                    return None;
                }
                Err(_) => {
                    timed_out();
                    return None;
                }
            }
        }
    }
    Some((Stream::Tls(Box::new(tls.into())), id))
}
