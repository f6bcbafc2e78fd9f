//! Valkey as walrus sees it: where it is ([`Upstream`]), how to open an authenticated
//! connection to it ([`client`]), and, in managed mode, the valkey-server child that walrus
//! runs itself ([`managed`], [`binary`]); which server and RDB format it is ([`server`]);
//! TLS to it ([`tls`]); what its `INFO` says ([`info`]).

pub mod binary;
pub mod client;
pub mod cluster;
pub mod error;
pub mod info;
pub mod managed;
pub mod server;
pub mod settings;
pub mod socket_dir;
pub mod tls;

use crate::config::Credentials;
use std::time::Duration;

/// How to reach Valkey. Cheap to clone; shared by the pool, pinned sessions and the control plane.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Where Valkey listens: `host:port`, or `unix:/path` ([`crate::net::Address`]); the
    /// managed Valkey's Unix socket in managed mode.
    pub address: String,
    /// walrus's own credentials, for control connections. Client traffic never uses them:
    /// it runs as the user each client authenticated as.
    pub credentials: Option<Credentials>,
    /// How long opening a connection may take: connect, TLS handshake and the commands
    /// that set it up (`upstream.connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// How long walrus waits for Valkey on an open connection, for each reply and each
    /// write, and between two pieces of a transfer (`upstream.reply_timeout_ms`).
    pub reply_timeout: Duration,
    pub limits: crate::resp::Limits,
    /// Managed mode: which child process serves the address, counted up at each start
    /// ([`managed::ManagedValkey::process`]). A connection opened to an earlier one is
    /// dropped, not used: a child restarted from an RDB ([`managed::Reloader`]) replaces
    /// one that pooled connections reached moments before.
    pub process: Option<tokio::sync::watch::Receiver<u64>>,
    /// `[upstream.tls]`, read once at start: every connection to Valkey is TLS when set.
    pub tls: Option<std::sync::Arc<tls::UpstreamTls>>,
}
