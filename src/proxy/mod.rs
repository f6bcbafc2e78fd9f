//! The proxy: accept loop, client sessions, the shared pool and pinned connections.
//!
//! - [`server`]: listens, enforces `max_clients`, shuts down gracefully.
//! - [`tls`]: a TLS client's handshake, and [`cert_user`]: the ACL user its certificate
//!   names.
//! - [`session`]: one client: parse, route, keep reply order.
//! - [`identity`]: who a client is, as every connection acting for it must tell Valkey.
//! - [`route`]: the rule for where a command runs.
//! - [`pool`] and [`pipeline`]: the shared, pipelined upstream connections.
//! - [`pinned`]: dedicated connections for stateful sessions.
//! - [`pushes`]: messages Valkey sends unasked (RESP3 pushes, RESP2 Pub/Sub) on their way to a
//!   client, and [`notices`]: which of them report writes, held until those are durable.
//! - [`admin`]: the admin commands walrus refuses or answers itself.
//! - [`info`]: `INFO`'s Persistence section, walrus's own.

pub mod admin;
pub mod cert_user;
pub mod identity;
pub mod info;
pub mod notices;
pub mod pinned;
pub mod pipeline;
pub mod pool;
pub mod pushes;
pub mod route;
pub mod server;
pub mod session;
pub mod tls;

use crate::commands::CommandTable;
use crate::resp::Limits;
use pool::{Pool, Pools};
use std::sync::Arc;

/// What every session shares, read-only after start-up.
pub struct Shared {
    pub table: CommandTable,
    pub pools: Pools,
    /// The pool of unauthenticated RESP2 clients, which most clients use.
    pub default_pool: Arc<Pool>,
    pub limits: Limits,
    pub max_query_buffer_bytes: usize,
    pub max_pipeline_requests: usize,
    /// Valkey's `databases`: SELECT is answered by walrus, so it must know the range.
    pub databases: u32,
    /// Largest write request that can be journaled as one entry (`journal.max_entry_bytes`
    /// when durable): a larger one is refused before it reaches Valkey.
    pub max_write_bytes: usize,
    /// Messages Valkey sends unasked (RESP3 pushes, RESP2 Pub/Sub) queued for one client
    /// before it is disconnected.
    pub max_push_bytes: usize,
    /// Reply bytes a client has not read, and requests it sent meanwhile, before it is
    /// disconnected (`proxy.max_output_bytes`).
    pub max_output_bytes: usize,
    /// `proxy.allow_admin_commands`: pass on what [`admin`] refuses.
    pub allow_admin_commands: bool,
    /// `proxy.allow_monitor`: relay MONITOR, which shows writes before they are durable.
    pub allow_monitor: bool,
    /// `tls.auth_clients_user`: while certificates map to ACL users, AUTH naming a
    /// certificate user is refused ([`cert_user`]).
    pub cert_user: crate::config::CertUser,
    /// What `INFO`'s Persistence section shows ([`info`]); `None` with durability off.
    pub persistence: Option<Arc<info::Persistence>>,
}
