//! Valkey as one primary of a Valkey Cluster behind walrus ([`crate::config::ClusterConfig`]):
//! the settings that make every address a client is given a walrus's, started with in
//! managed mode ([`ClusterNode::args`]) and checked in external mode ([`ClusterNode::check`]).
//!
//! A Valkey without `cluster-announce-client-port` (before 9.0) is refused rather than
//! worked around by rewriting its replies: CLUSTER SLOTS, SHARDS and NODES, MOVED and ASK
//! errors, and the replies of scripts and transactions that carry them would all need
//! rewriting, and one missed form sends a client around walrus for good.

mod nodes;
mod peers;
mod watch;

pub use watch::{watch, Watch};

use super::client::{self, frame_str, Conn, UpstreamError};
use super::server::ServerVersion;
use crate::config::Announce;
use redis_protocol::resp2::types::OwnedFrame;

#[derive(Debug, Clone)]
pub struct ClusterNode {
    /// Where clients are sent for this shard: walrus.
    pub announce: Announce,
    /// Managed mode: Valkey's cluster bus port (0: the announced port plus 10000, or a free
    /// one: [`ClusterNode::bus_port`]).
    pub bus_port: u16,
}

impl ClusterNode {
    /// valkey-server's arguments for a node whose bus is on `bus_port`. Valkey has no client
    /// port (walrus reaches it on its Unix socket, [`super::managed`]): Valkey 9 runs a
    /// cluster node with `port 0` once the bus port and the announced ports are given, so
    /// the bus, on the announced address where other nodes reach it, is its only TCP
    /// listener, and nothing on the pod's network reaches Valkey's clients' side.
    pub fn args(&self, bus_port: u16) -> Vec<String> {
        let ip = self.announce.ip.to_string();
        let pairs = [
            // Where the bus listens (with no client port, `bind` binds nothing else).
            ("--bind".to_string(), ip.clone()),
            ("--cluster-enabled".into(), "yes".into()),
            ("--cluster-config-file".into(), "nodes.conf".into()),
            ("--cluster-port".into(), bus_port.to_string()),
            // A primary that gives its last slot away must not become the taker's replica.
            ("--cluster-allow-replica-migration".into(), "no".into()),
            ("--cluster-announce-ip".into(), ip.clone()),
            (format!("--{}", self.announce.ip_setting()), ip),
            (
                "--cluster-announce-client-port".into(),
                self.announce.port.to_string(),
            ),
            // Walrus's port as the node's own too: a node that restarted sends its first
            // PINGs without the extension that carries the client port, and its peers then
            // fall back to the node's own port for a moment (tests/it/cluster.rs,
            // `a_shard_is_restored_in_place_...`), which must be walrus's. Valkey's own is
            // 0 (none): without this, peers would be told port 0.
            (
                "--cluster-announce-port".into(),
                self.announce.port.to_string(),
            ),
            ("--cluster-announce-bus-port".into(), bus_port.to_string()),
        ];
        pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()
    }

    /// The bus port: as configured, else the announced (walrus's) port plus 10000, Valkey's
    /// own convention for a node's bus, which `CLUSTER MEET <ip> <port>` without a bus port
    /// assumes, and the same across restarts; `None` when that is no port (above 65535):
    /// then one picked free at each start.
    pub fn bus_port(&self) -> Option<u16> {
        match self.bus_port {
            0 => self.announce.port.checked_add(10000),
            p => Some(p),
        }
    }

    /// External mode: the Valkey walrus connects to must be a cluster node of a version
    /// that announces client addresses, announcing this walrus. The error says what to
    /// change, with the commands.
    pub async fn check(
        &self,
        conn: &mut Conn,
        version: &ServerVersion,
    ) -> Result<(), UpstreamError> {
        supports_client_announce(version)?;
        self.check_settings(conn)
            .await
            .map_err(UpstreamError::Cluster)
    }

    /// [`check`](Self::check) but for the version: what in Valkey's settings is wrong.
    async fn check_settings(&self, conn: &mut Conn) -> Result<(), String> {
        let enabled = config_get(conn, "cluster-enabled").await?;
        if enabled != "yes" {
            return Err(
                "cluster.enabled is set, but Valkey does not run in cluster mode (cluster-enabled no)".into(),
            );
        }
        if config_get(conn, "cluster-allow-replica-migration").await? != "no" {
            return Err(
                "Valkey has cluster-allow-replica-migration yes: once it gives its last slot away it becomes another node's replica, loads that node's dataset and stops being the primary walrus journals; run CONFIG SET cluster-allow-replica-migration no on Valkey (and CONFIG REWRITE)".into(),
            );
        }
        let ip = config_get(conn, self.announce.ip_setting()).await?;
        let port = config_get(conn, "cluster-announce-client-port").await?;
        // The node's own announced port too: peers fall back to it for a moment after the
        // node restarts ([`ClusterNode::args`]).
        let own = config_get(conn, "cluster-announce-port").await?;
        // Valkey answers walrus's IPv4 connections with the node's own IP when the client
        // one is IPv6, and peers fall back to it as to the port.
        let own_ip = config_get(conn, "cluster-announce-ip").await?;
        let (want_ip, want_port) = (self.announce.ip.to_string(), self.announce.port.to_string());
        if ip != want_ip || port != want_port || own != want_port || own_ip != want_ip {
            return Err(format!(
                "Valkey tells cluster clients {} (its {}: {:?}, cluster-announce-client-port: {port}, cluster-announce-ip: {own_ip:?}, cluster-announce-port: {own}), not this walrus ({want_ip}:{want_port}), so clients would go around walrus: run CONFIG SET {} {want_ip} cluster-announce-client-port {want_port} cluster-announce-ip {want_ip} cluster-announce-port {want_port} on Valkey (and CONFIG REWRITE), or correct cluster.announce_ip and cluster.announce_port",
                if ip.is_empty() { "its own address".to_string() } else { format!("{ip}:{port}") },
                self.announce.ip_setting(),
                ip,
                self.announce.ip_setting(),
            ));
        }
        // Host names in place of IPs would send clients to hosts walrus never checked.
        let endpoint = config_get(conn, "cluster-preferred-endpoint-type").await?;
        if endpoint != "ip" {
            return Err(format!(
                "Valkey has cluster-preferred-endpoint-type {endpoint}: cluster clients would be told another address than this walrus's; run CONFIG SET cluster-preferred-endpoint-type ip on Valkey (and CONFIG REWRITE)"
            ));
        }
        Ok(())
    }
}

/// Valkey 9.0 added `cluster-announce-client-port`, without which clients are told
/// Valkey's own port.
pub fn supports_client_announce(version: &ServerVersion) -> Result<(), UpstreamError> {
    if version.valkey && version.major >= 9 {
        return Ok(());
    }
    Err(UpstreamError::Cluster(format!(
        "{version} cannot announce walrus's port to cluster clients (cluster-announce-client-port came in Valkey 9.0), so every cluster-aware client would be sent around walrus: cluster mode needs Valkey 9.0 or later"
    )))
}

/// Whether the Valkey behind `conn` runs in cluster mode.
pub async fn enabled(conn: &mut Conn) -> Result<bool, UpstreamError> {
    let enabled = config_get(conn, "cluster-enabled").await;
    Ok(enabled.map_err(UpstreamError::Cluster)? == "yes")
}

async fn config_get(conn: &mut Conn, name: &str) -> Result<String, String> {
    let reply = conn
        .call(["CONFIG", "GET", name])
        .await
        .map_err(|e: UpstreamError| format!("cannot read Valkey's {name}: {e}"))?;
    match reply {
        OwnedFrame::Array(items) if items.len() == 2 => {
            Ok(frame_str(&items[1]).unwrap_or_default())
        }
        // Not a setting of this server (older Valkey): as if unset.
        OwnedFrame::Array(_) => Ok(String::new()),
        other => Err(format!(
            "cannot read Valkey's {name}: unexpected reply {other:?}"
        )),
    }
}
