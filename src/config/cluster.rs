//! `[cluster]`: walrus in front of one primary of a Valkey Cluster (README, "Valkey
//! Cluster"). Every address a cluster-aware client is given must be a walrus: Valkey
//! announces walrus's address to clients (`cluster-announce-client-ipv4|ipv6` and
//! `cluster-announce-client-port`, Valkey 9.0 and later) while its cluster bus and
//! replication keep Valkey's own.

use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Valkey is a cluster node: managed mode starts it with cluster mode on; external
    /// mode checks that it announces walrus to clients.
    pub enabled: bool,
    /// The IP address clients are told for this shard (CLUSTER SLOTS, SHARDS, NODES, MOVED
    /// and ASK): walrus's, as the other shards' clients reach it. Empty: the address
    /// `proxy.listen` binds, which must then name one. In managed mode Valkey's cluster bus
    /// is announced and listens there too, since Valkey runs beside walrus.
    pub announce_ip: String,
    /// The port clients are told. 0: `proxy.listen`'s.
    pub announce_port: u16,
    /// Managed mode: the cluster bus port of Valkey (other nodes connect to it, on
    /// `announce_ip`). 0: Valkey's port plus 10000, as Valkey's own default.
    pub bus_port: u16,
    /// How often walrus reads the node's id, shard, slots and cluster state from Valkey for
    /// its metrics (`walrus_cluster_*`), in milliseconds.
    pub poll_interval_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            announce_ip: String::new(),
            announce_port: 0,
            bus_port: 0,
            poll_interval_ms: 5000,
        }
    }
}

/// Where clients are sent for this shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    pub ip: IpAddr,
    pub port: u16,
}

impl Announce {
    /// Valkey's setting for this address family.
    pub fn ip_setting(&self) -> &'static str {
        match self.ip {
            IpAddr::V4(_) => "cluster-announce-client-ipv4",
            IpAddr::V6(_) => "cluster-announce-client-ipv6",
        }
    }
}

impl ClusterConfig {
    /// What is wrong with the settings, naming the key; `listen`: `proxy.listen`.
    pub fn check(&self, listen: SocketAddr) -> Result<(), String> {
        if self.poll_interval_ms == 0 {
            return Err(
                "invalid value for cluster.poll_interval_ms: 0 (expected at least 1)".into(),
            );
        }
        self.announce(listen).map(drop)
    }

    /// The address clients are told, from `announce_*` or `proxy.listen`; the error names
    /// the key to set.
    pub fn announce(&self, listen: SocketAddr) -> Result<Announce, String> {
        let ip = if self.announce_ip.is_empty() {
            if listen.ip().is_unspecified() {
                return Err(format!(
                    "cluster.announce_ip is needed: proxy.listen ({listen}) binds every address, so it does not say which one other hosts reach walrus at"
                ));
            }
            listen.ip()
        } else {
            self.announce_ip.parse().map_err(|_| {
                format!(
                    "invalid value for cluster.announce_ip: {:?} (expected an IPv4 or IPv6 address; Valkey announces no host names to clients in place of one)",
                    self.announce_ip
                )
            })?
        };
        if ip.is_unspecified() {
            return Err(format!(
                "invalid value for cluster.announce_ip: {ip} (clients cannot connect to it)"
            ));
        }
        let port = match self.announce_port {
            0 => listen.port(),
            p => p,
        };
        Ok(Announce { ip, port })
    }
}
