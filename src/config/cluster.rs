//! `[cluster]`: walrus in front of one primary of a Valkey Cluster (docs/cluster.md,
//! "Valkey Cluster"). Every address a cluster-aware client is given must be a walrus: Valkey
//! announces walrus's address to clients (`cluster-announce-client-ipv4|ipv6` and
//! `cluster-announce-client-port`, Valkey 9.0 and later) while its cluster bus and
//! replication keep Valkey's own.

use super::ConfigError;
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
    /// `announce_ip`; Valkey's only TCP port). 0: the announced port plus 10000, Valkey's
    /// convention, or a free port at each start when that is above 65535.
    pub bus_port: u16,
    /// How often walrus reads the node's id, shard, slots and cluster state from Valkey for
    /// its metrics (`walrus_cluster_*`), in milliseconds; it also reintroduces `peers` then.
    pub poll_interval_ms: u64,
    /// The other primaries' walruses, `host:port` or `host:port@busport` (bus port default:
    /// this node's), by names that always resolve to their current address (a StatefulSet's
    /// pod names). Once Valkey has not heard from a peer for `cluster-node-timeout` (`fail?`),
    /// walrus resolves each name and sends Valkey `CLUSTER MEET` for any whose address Valkey
    /// knows no node at: a cluster whose every node came back at a new IP (all pods
    /// restarted) cannot find its peers from nodes.conf alone. Forming a cluster is left to
    /// `valkey-cli --cluster create`.
    pub peers: Vec<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            announce_ip: String::new(),
            announce_port: 0,
            bus_port: 0,
            poll_interval_ms: 5000,
            peers: Vec::new(),
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

/// Another primary's walrus, as `cluster.peers` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub host: String,
    /// The port its walrus listens on: the one its node announces.
    pub port: u16,
    /// Its Valkey's cluster bus port; `None`: the same as this node's.
    pub bus_port: Option<u16>,
}

impl std::str::FromStr for Peer {
    type Err = String;

    fn from_str(s: &str) -> Result<Peer, String> {
        let bad = |why: &str| {
            format!("invalid entry in cluster.peers: {s:?} ({why}; expected host:port or host:port@busport)")
        };
        let (addr, bus) = match s.split_once('@') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        // An IPv6 literal in brackets, as in a URL.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port_of = |p: &str| match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(bad(&format!("{p:?} is not a port"))),
            Ok(p) => Ok(p),
        };
        Ok(Peer {
            host: host.to_string(),
            port: port_of(port)?,
            bus_port: bus.map(port_of).transpose()?,
        })
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)?;
        match self.bus_port {
            Some(b) => write!(f, "@{b}"),
            None => Ok(()),
        }
    }
}

impl ClusterConfig {
    /// What is wrong with the settings, naming the key; `listen`: `proxy.listen`.
    pub fn check(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        if self.poll_interval_ms == 0 {
            return Err(ConfigError::Invalid(
                "invalid value for cluster.poll_interval_ms: 0 (expected at least 1)".into(),
            ));
        }
        self.peers()?;
        self.announce(listen).map(drop)
    }

    /// `peers`, parsed; the error names the entry.
    pub fn peers(&self) -> Result<Vec<Peer>, ConfigError> {
        Ok(self
            .peers
            .iter()
            .map(|p| p.parse())
            .collect::<Result<_, String>>()?)
    }

    /// The address clients are told, from `announce_*` or `proxy.listen`; the error names
    /// the key to set.
    pub fn announce(&self, listen: SocketAddr) -> Result<Announce, ConfigError> {
        let ip = if self.announce_ip.is_empty() {
            if listen.ip().is_unspecified() {
                return Err(ConfigError::Invalid(format!(
                    "cluster.announce_ip is needed: proxy.listen ({listen}) binds every address, so it does not say which one other hosts reach walrus at"
                )));
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
            return Err(ConfigError::Invalid(format!(
                "invalid value for cluster.announce_ip: {ip} (clients cannot connect to it)"
            )));
        }
        let port = match self.announce_port {
            0 => listen.port(),
            p => p,
        };
        Ok(Announce { ip, port })
    }
}
