//! The sockets `walrus serve` listens on: the plaintext client port (`proxy.listen`), the TLS
//! client port (`tls.listen`) with its certificate, and the metrics port; claimed at start,
//! listened on once walrus serves.
//!
//! The client sockets are bound but not listening until then: a client is refused at once
//! instead of waiting in the backlog for a restore to end. The claim finds a server already
//! listening on a port (the mistake this is for); one that binds it with SO_REUSEADDR while
//! walrus starts can still take it first, and walrus then fails when it listens, as it did
//! before the claim.

use super::Fatal;
use crate::config::Config;
use crate::net::tls::reload::{self, ServerTls};
use crate::net::tls::{Material, TlsError};
use crate::proxy::server::Listener;
use crate::proxy::tls::TlsClients;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

/// The client socket's accept queue, as tokio's `TcpListener::bind` sets it (the kernel caps
/// it at net.core.somaxconn).
const LISTEN_BACKLOG: u32 = 1024;

pub struct Ports {
    /// `proxy.listen`; `None` when it is "" (TLS clients only).
    pub clients: Option<TcpSocket>,
    /// `tls.listen`, with the configuration its clients get.
    pub tls: Option<(TcpSocket, Arc<ServerTls>)>,
    pub metrics: Option<TcpListener>,
}

impl Ports {
    /// Binds every configured port; `tls` is the loaded TLS configuration (see [`load_tls`]).
    pub async fn claim(config: &Config, tls: Option<Arc<ServerTls>>) -> Result<Ports, Fatal> {
        let clients = match config.proxy.listen {
            Some(addr) => Some(bind(addr, "proxy.listen")?),
            None => None,
        };
        let tls = match tls {
            Some(t) => {
                // Validated as an address with the rest of the configuration.
                let addr: SocketAddr = config
                    .tls
                    .listen
                    .parse()
                    .map_err(|_| format!("invalid tls.listen {:?}", config.tls.listen))?;
                Some((bind(addr, "tls.listen")?, t))
            }
            None => None,
        };
        let metrics = match config.metrics.listen.as_str() {
            "" => None,
            listen => Some(
                TcpListener::bind(listen)
                    .await
                    .map_err(|e| format!("cannot listen on metrics.listen {listen}: {e}"))?,
            ),
        };
        Ok(Ports {
            clients,
            tls,
            metrics,
        })
    }

    /// The plaintext client port as bound (`--listen :0` leaves it to the kernel).
    pub fn clients_addr(&self) -> Result<Option<SocketAddr>, Fatal> {
        Ok(match &self.clients {
            Some(s) => Some(s.local_addr()?),
            None => None,
        })
    }

    /// Starts listening on the client ports, logging each; returns them and their addresses.
    pub fn listen(
        clients: Option<TcpSocket>,
        tls: Option<(TcpSocket, Arc<ServerTls>)>,
        config: &Config,
    ) -> Result<(Vec<Listener>, Vec<String>), Fatal> {
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        if let Some((sock, tls)) = tls {
            let tcp = sock
                .listen(LISTEN_BACKLOG)
                .map_err(|e| format!("cannot listen on tls.listen {}: {e}", config.tls.listen))?;
            let addr = tcp.local_addr()?;
            tracing::info!(
                serial = %tls.serial(),
                "walrus listening for TLS clients on {addr}"
            );
            addrs.push(format!("{addr} (TLS)"));
            listeners.push(Listener {
                tcp,
                tls: Some(Arc::new(TlsClients {
                    tls,
                    handshake_timeout: Duration::from_millis(config.tls.handshake_timeout_ms),
                    cert_user: config.tls.auth_clients_user,
                })),
            });
        }
        if let Some(sock) = clients {
            let tcp = sock.listen(LISTEN_BACKLOG).map_err(|e| {
                format!(
                    "cannot listen on proxy.listen {}: {e}",
                    config.proxy.listen.map_or(String::new(), |a| a.to_string())
                )
            })?;
            addrs.push(tcp.local_addr()?.to_string());
            listeners.push(Listener { tcp, tls: None });
        }
        Ok((listeners, addrs))
    }
}

fn bind(addr: SocketAddr, key: &str) -> Result<TcpSocket, Fatal> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .and_then(|s| {
        // As TcpListener::bind does: a restart may bind its port while old connections
        // linger. Not for a port the kernel picks (0): the socket is only bound until the
        // restore ends, and another socket with SO_REUSEADDR that binds port 0 meanwhile
        // (the restore's own listener) may be given the same port and listen on it first.
        s.set_reuseaddr(addr.port() != 0)?;
        s.bind(addr)?;
        Ok(s)
    })
    .map_err(|e| format!("cannot listen on {key} {addr}: {e}"))?;
    Ok(socket)
}

/// The TLS configuration, read and checked, when `tls.listen` is set: a certificate that is
/// missing, unreadable, expired or not yet valid, or a key that is not its own, stops walrus
/// here, before anything slow, with an error naming the file.
pub fn load_tls(config: &Config) -> Result<Option<Arc<ServerTls>>, TlsError> {
    if config.tls.listen.is_empty() {
        return Ok(None);
    }
    crate::metrics::register_tls();
    Ok(Some(Arc::new(ServerTls::load(&config.tls)?)))
}

/// `walrus config check`'s share: the same checks, without keeping anything.
pub fn check_tls(config: &Config) -> Result<(), TlsError> {
    if config.tls.listen.is_empty() {
        return Ok(());
    }
    Material::from(&config.tls)
        .served(config.tls.auth_clients)
        .map(|_| ())
}

/// Keeps `tls` fresh: every `tls.reload_interval_ms`, and on each SIGHUP (`hup`).
pub fn spawn_reloads(tls: Arc<ServerTls>, config: &Config, hup: watch::Receiver<u64>) {
    let every = Duration::from_millis(config.tls.reload_interval_ms);
    tokio::spawn(reload::keep_fresh(tls, every, hup));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port the kernel picked for walrus stays walrus's while it is bound and not yet
    /// listening: another socket cannot take it with SO_REUSEADDR and listen on it first.
    #[tokio::test]
    async fn a_picked_port_cannot_be_taken_before_walrus_listens() {
        let claimed = bind("127.0.0.1:0".parse().unwrap(), "proxy.listen").unwrap();
        let port = claimed.local_addr().unwrap();
        let thief = TcpSocket::new_v4().unwrap();
        thief.set_reuseaddr(true).unwrap();
        assert!(
            thief.bind(port).is_err(),
            "another socket bound {port} while walrus held it"
        );
        claimed.listen(LISTEN_BACKLOG).unwrap();
    }
}
