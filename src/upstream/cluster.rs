//! Valkey as one primary of a Valkey Cluster behind walrus ([`crate::config::ClusterConfig`]):
//! the settings that make every address a client is given a walrus's, started with in
//! managed mode ([`ClusterNode::args`]) and checked in external mode ([`ClusterNode::check`]).
//!
//! A Valkey without `cluster-announce-client-port` (before 9.0) is refused rather than
//! worked around by rewriting its replies: CLUSTER SLOTS, SHARDS and NODES, MOVED and ASK
//! errors, and the replies of scripts and transactions that carry them would all need
//! rewriting, and one missed form sends a client around walrus for good.

use super::client::{frame_str, Conn, UpstreamError};
use super::server::ServerVersion;
use super::Upstream;
use crate::config::Announce;
use crate::metrics::{CLUSTER_NODE_INFO, CLUSTER_SLOTS, CLUSTER_STATE_OK};
use redis_protocol::resp2::types::OwnedFrame;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ClusterNode {
    /// Where clients are sent for this shard: walrus.
    pub announce: Announce,
    /// Managed mode: Valkey's cluster bus port (0: its port plus 10000, or a free one).
    pub bus_port: u16,
}

impl ClusterNode {
    /// valkey-server's arguments for a node whose bus is on `bus_port`. Valkey
    /// listens on loopback (walrus's connections) and on the announced address (the bus,
    /// which other nodes reach there; Valkey's `bind` serves its client port there too).
    pub fn args(&self, bus_port: u16) -> Vec<String> {
        let ip = self.announce.ip.to_string();
        let mut bind = "127.0.0.1".to_string();
        if !self.announce.ip.is_loopback() {
            bind = format!("{bind} {ip}");
        }
        let pairs = [
            ("--bind".to_string(), bind),
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
            // fall back to the node's own port for a moment (tests/cluster.rs,
            // `a_shard_is_restored_in_place_...`), which would send clients to Valkey.
            // Besides clients, only a replica of this node and the source of an atomic slot
            // migration into it connect there, and walrus refuses both (README, "Valkey
            // Cluster"); the bus has its own port, and walrus connects on loopback.
            (
                "--cluster-announce-port".into(),
                self.announce.port.to_string(),
            ),
            ("--cluster-announce-bus-port".into(), bus_port.to_string()),
        ];
        pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()
    }

    /// The bus port for a Valkey on `port`: as configured, else Valkey's default (`port` +
    /// 10000) when that is a port, else one `pick` finds free.
    pub fn bus_port_for(
        &self,
        port: u16,
        pick: impl FnOnce() -> std::io::Result<u16>,
    ) -> std::io::Result<u16> {
        match self.bus_port {
            0 => match port.checked_add(10000) {
                Some(p) => Ok(p),
                None => pick(),
            },
            p => Ok(p),
        }
    }

    /// External mode: the Valkey walrus connects to must be a cluster node of a version
    /// that announces client addresses, announcing this walrus. The error says what to
    /// change, with the commands.
    pub async fn check(&self, conn: &mut Conn, version: &ServerVersion) -> Result<(), String> {
        supports_client_announce(version)?;
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
pub fn supports_client_announce(version: &ServerVersion) -> Result<(), String> {
    if version.valkey && version.major >= 9 {
        return Ok(());
    }
    Err(format!(
        "{version} cannot announce walrus's port to cluster clients (cluster-announce-client-port came in Valkey 9.0), so every cluster-aware client would be sent around walrus: cluster mode needs Valkey 9.0 or later"
    ))
}

/// Whether the Valkey behind `conn` runs in cluster mode.
pub async fn enabled(conn: &mut Conn) -> Result<bool, String> {
    Ok(config_get(conn, "cluster-enabled").await? == "yes")
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

/// What Valkey says of its own node.
#[derive(Debug, PartialEq, Eq)]
struct NodeStatus {
    id: String,
    shard: String,
    slots: i64,
    ok: bool,
}

impl NodeStatus {
    async fn query(up: &Upstream) -> Result<NodeStatus, String> {
        let mut conn = Conn::control(up).await.map_err(|e| e.to_string())?;
        let mut text = async |args: &[&str]| -> Result<String, String> {
            let reply = conn.call(args).await.map_err(|e| e.to_string())?;
            frame_str(&reply).ok_or_else(|| format!("{args:?}: unexpected reply {reply:?}"))
        };
        let id = text(&["CLUSTER", "MYID"]).await?;
        let shard = text(&["CLUSTER", "MYSHARDID"]).await?;
        let ok = text(&["CLUSTER", "INFO"])
            .await?
            .lines()
            .any(|l| l.trim_end() == "cluster_state:ok");
        let slots = own_slots(&text(&["CLUSTER", "NODES"]).await?);
        Ok(NodeStatus {
            id,
            shard,
            slots,
            ok,
        })
    }
}

/// The slots of the `myself` line of CLUSTER NODES: `0-5460`, `7000`; the `[slot->-node]`
/// entries of a migration are not owned slots.
fn own_slots(nodes: &str) -> i64 {
    let Some(me) = nodes.lines().find(|l| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|f| f == "myself"))
    }) else {
        return 0;
    };
    me.split_whitespace()
        .skip(8)
        .filter(|r| !r.starts_with('['))
        .map(|r| match r.split_once('-') {
            Some((a, b)) => match (a.parse::<i64>(), b.parse::<i64>()) {
                (Ok(a), Ok(b)) => b - a + 1,
                _ => 0,
            },
            None => i64::from(r.parse::<u16>().is_ok()),
        })
        .sum()
}

/// Keeps `walrus_cluster_*` current: every `interval`, what Valkey says of its node. A
/// Valkey that cannot be asked counts as a cluster not ok; the node's labels stay as last
/// seen.
pub async fn watch(up: Upstream, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut labels: Option<(String, String)> = None;
    loop {
        tick.tick().await;
        // Bounded: a Valkey that accepts but never answers must read as not ok.
        let status = tokio::time::timeout(up.connect_timeout, NodeStatus::query(&up))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", up.connect_timeout)));
        match status {
            Ok(s) => {
                let now = (s.id, s.shard);
                if labels.as_ref() != Some(&now) {
                    if let Some((id, shard)) = labels.take() {
                        let _ = CLUSTER_NODE_INFO.remove_label_values(&[&id, &shard]);
                    }
                    CLUSTER_NODE_INFO
                        .with_label_values(&[&now.0, &now.1])
                        .set(1);
                    labels = Some(now);
                }
                CLUSTER_SLOTS.set(s.slots);
                CLUSTER_STATE_OK.set(i64::from(s.ok));
            }
            Err(e) => {
                CLUSTER_STATE_OK.set(0);
                tracing::warn!("cannot read the cluster node's state from Valkey: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_slots_counts_the_myself_line_only() {
        let nodes = "a 127.0.0.1:7001@17001 master - 0 0 1 connected 0-5460\n\
                     b 127.0.0.1:7002@17002 myself,master - 0 0 2 connected 5461-10922 12000 [13000->-c] [14000-<-c]\n\
                     c 127.0.0.1:7003@17003 master - 0 0 3 connected 10923-11999 12001-16383\n";
        assert_eq!(super::own_slots(nodes), 5462 + 1);
        assert_eq!(
            super::own_slots("x 1:2@3 myself,master - 0 0 1 connected\n"),
            0
        );
        assert_eq!(super::own_slots(""), 0);
    }
}
