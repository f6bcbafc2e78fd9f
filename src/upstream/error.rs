//! Why a connection to Valkey failed or broke: the upstream layer's one error type, shared
//! by the connection ([`super::client`]), its TLS ([`super::tls`]) and everything that
//! speaks to Valkey through them.

use bytes::Bytes;

/// Why a connection to Valkey failed or broke.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to Valkey at {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    /// The connect, its TLS handshake or the commands that set the connection up did not
    /// finish in time.
    #[error("no connection to Valkey at {0} within upstream.connect_timeout_ms (connecting, or setting it up)")]
    ConnectTimeout(String),
    /// The TLS handshake failed; the text says what (certificate not trusted, name mismatch).
    #[error("TLS handshake with Valkey at {addr} failed: {problem}")]
    Tls { addr: String, problem: String },
    /// `[upstream.tls]` cannot be used; the text names the key and the file.
    #[error("{0}")]
    TlsConfig(#[from] crate::net::tls::TlsError),
    #[error("Valkey connection I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("Valkey closed the connection")]
    Closed,
    #[error("{0}")]
    Scan(#[from] crate::resp::ScanError),
    #[error("cannot decode Valkey reply: {0}")]
    Decode(String),
    /// Valkey answered with an error reply; the text is Valkey's own.
    #[error("Valkey replied: {}", String::from_utf8_lossy(.0).trim_end())]
    Refused(Bytes),
    /// The server lacks something walrus needs; the text names it.
    #[error("{0}")]
    Unsupported(String),
    /// Managed mode cannot find or start valkey-server; the text says what to fix.
    #[error("{0}")]
    Start(String),
    /// Valkey's cluster settings do not fit walrus's, or cannot be read; the text says what
    /// to change, with the commands.
    #[error("{0}")]
    Cluster(String),
    /// A reply walrus cannot use (a key spec of `COMMAND`'s it cannot read); the text says
    /// which.
    #[error("{0}")]
    Invalid(String),
    #[error("Valkey did not answer within {0:?} (upstream.reply_timeout_ms)")]
    NoReply(std::time::Duration),
    /// walrus's control connection cannot tell which Valkey process a new connection reached
    /// (Valkey unreachable, or walrus's own user may not run INFO).
    #[error("cannot check which Valkey process this connection reached: walrus's control connection cannot run INFO server (is walrus's own user allowed INFO?)")]
    Unverified,
}
