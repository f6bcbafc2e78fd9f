//! TLS in tests: walrus's certificate files and its `[tls]` table, and a blocking RESP client
//! over TLS (rustls, as walrus uses) that returns replies as raw bytes and tells which
//! certificate walrus served.
#![allow(dead_code)]

use super::certs::{write, Ca, Leaf, Pair};
use super::{Proc, RespClient, START_TIMEOUT};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls::{self, pki_types::pem::PemObject, ClientConnection, StreamOwned};

/// A CA, and walrus's certificate and key signed by it, in a directory of their own.
pub struct TlsFiles {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
    /// The certificate walrus's files hold now, DER: what a client should be served.
    pub served: Vec<u8>,
}

impl TlsFiles {
    pub fn new() -> TlsFiles {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("walrus test CA");
        write(dir.path(), "ca.crt", &ca.pem);
        let mut f = TlsFiles {
            dir,
            ca,
            served: Vec::new(),
        };
        f.serve(&Leaf::server(1));
        f
    }

    /// Replaces walrus's certificate and key with a new pair the CA signs.
    pub fn serve(&mut self, leaf: &Leaf) {
        let (pair, der) = self.ca.sign_der(leaf);
        write(self.dir.path(), "tls.crt", &pair.cert);
        write(self.dir.path(), "tls.key", &pair.key);
        self.served = der;
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    /// A `[tls]` table listening on a free port with these files, and `extra` keys.
    pub fn toml(&self, extra: &str) -> String {
        format!(
            "[tls]\nlisten = \"127.0.0.1:0\"\ncert_file = {:?}\nkey_file = {:?}\nca_cert_file = {:?}\n{extra}\n",
            self.path("tls.crt"),
            self.path("tls.key"),
            self.path("ca.crt"),
        )
    }

    /// A client that trusts this CA, presenting `cert` if given.
    pub fn client(&self, cert: Option<&Pair>) -> Arc<rustls::ClientConfig> {
        client_config(&self.ca.pem, cert)
    }

    /// A client certificate this CA signs, for `cn`.
    pub fn client_cert(&self, leaf: &Leaf) -> Pair {
        self.ca.sign(leaf)
    }
}

/// The address walrus listens on for TLS clients (its log says it, before it serves).
pub fn tls_addr(walrus: &Proc) -> String {
    const LINE: &str = "walrus listening for TLS clients on ";
    let line = walrus
        .log_text()
        .lines()
        .find(|l| l.contains(LINE))
        .map(str::to_string)
        .unwrap_or_else(|| walrus.wait_line(LINE, START_TIMEOUT));
    let rest = line.split(LINE).nth(1).unwrap();
    rest.split(|c: char| c == ',' || c.is_whitespace())
        .next()
        .unwrap()
        .to_string()
}

/// A client configuration that trusts `ca_pem` and presents `cert`, if given.
pub fn client_config(ca_pem: &str, cert: Option<&Pair>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match cert {
        None => builder.with_no_client_auth(),
        Some(p) => {
            let chain = rustls::pki_types::CertificateDer::pem_slice_iter(p.cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(p.key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    Arc::new(config)
}

/// [`RespClient`] over TLS.
pub type TlsRaw = RespClient<StreamOwned<ClientConnection, TcpStream>>;

impl TlsRaw {
    /// Connects to `addr`, checking walrus's certificate for `name`, and completes the
    /// handshake; `Err` says why it failed.
    pub fn connect(
        addr: &str,
        config: &Arc<rustls::ClientConfig>,
        name: &str,
    ) -> Result<TlsRaw, String> {
        let sock = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        TlsRaw::handshake(sock, config, name)
    }

    /// The same, with a receive buffer of `bytes` set before it connects (a slow reader whose
    /// socket fills at once).
    pub fn connect_small(
        addr: &str,
        config: &Arc<rustls::ClientConfig>,
        name: &str,
        bytes: usize,
    ) -> Result<TlsRaw, String> {
        let sock = super::connect_slow(addr, bytes).map_err(|e| e.to_string())?;
        TlsRaw::handshake(sock, config, name)
    }

    fn handshake(
        sock: TcpStream,
        config: &Arc<rustls::ClientConfig>,
        name: &str,
    ) -> Result<TlsRaw, String> {
        sock.set_nodelay(true).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let conn = ClientConnection::new(config.clone(), server_name).map_err(|e| e.to_string())?;
        let mut stream = StreamOwned::new(conn, sock);
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .map_err(|e| e.to_string())?;
        }
        Ok(RespClient::over(stream))
    }

    /// The leaf certificate walrus presented, DER.
    pub fn server_cert(&self) -> Vec<u8> {
        self.stream.conn.peer_certificates().unwrap()[0].to_vec()
    }
}
