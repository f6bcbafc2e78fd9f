//! Reintroducing the other primaries to a node that lost them (`cluster.peers`).
//!
//! A node finds its peers at the addresses in its nodes.conf. A peer that comes back at a
//! new address is found again through the others' gossip, but when every node came back
//! at a new one (all pods of a StatefulSet restarted) none can reach another and the
//! cluster stays down. walrus knows its peers by names that follow them, and a `CLUSTER
//! MEET` of a node already known under another address only updates that address (Valkey
//! drops the handshake node once the peer's answer names a known node id), so meeting
//! each peer that is not known at its current address is safe to repeat. Only a peer that
//! answers as a node this one lost is met: see [`reintroduce`].

use super::client::{frame_str, Conn};
use super::nodes::Node;
use crate::config::Peer;
use crate::upstream::client::UpstreamError;
use crate::upstream::Upstream;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Whether Valkey lost peers: it has not heard from one for `cluster-node-timeout` (a
/// node whose every peer moved marks them all so). While nodes are being met (the cluster
/// is being created, or one joins) none is: forming a cluster is `valkey-cli --cluster
/// create`'s job, and a MEET then would only add a handshake beside its own.
pub fn lost(nodes: &[Node]) -> bool {
    nodes.iter().any(Node::unreachable)
}

/// Sends `CLUSTER MEET` for each peer whose name resolves to an address where Valkey knows
/// no node. Returns how many it introduced; a name that does not resolve (its pod
/// not yet scheduled) is skipped with a warning and tried at the next poll.
pub async fn reintroduce(
    up: &Upstream,
    peers: &[Peer],
    nodes: &[Node<'_>],
) -> Result<usize, UpstreamError> {
    let timeout = up.connect_timeout;
    let mut conn = Conn::control(up).await?;
    let Some(me) = nodes.iter().find(|n| n.myself()) else {
        return Err(UpstreamError::Cluster(
            "CLUSTER NODES has no myself line".into(),
        ));
    };
    let mut introduced = 0;
    for peer in peers {
        let ip = match resolve(peer, me.ip, timeout).await {
            Ok(ip) => ip,
            Err(e) => {
                tracing::warn!("cluster.peers: cannot resolve {peer}: {e}");
                continue;
            }
        };
        let bus = peer.bus_port.unwrap_or(me.bus_port);
        // Any node at that address, reachable or not, handshake included: the peer is
        // known there (or being met), so a MEET could only add a handshake beside it.
        // Only an address Valkey has never heard of means the peer moved.
        if nodes
            .iter()
            .any(|n| n.ip == Some(ip) && n.port == peer.port && n.bus_port == bus)
        {
            continue;
        }
        // Only a node this one knows and has lost: a walrus that answers there as another
        // node (a pod whose volume was lost starts a new one; another cluster's pod may
        // have the IP now) is not introduced, it would join as an empty primary or merge
        // two clusters.
        let id = match peer_id(up, SocketAddr::new(ip, peer.port)).await {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!("cluster.peers: {peer} at {ip}: {e}");
                continue;
            }
        };
        if !nodes.iter().any(|n| n.id == id && n.unreachable()) {
            tracing::warn!(
                "cluster.peers: {peer} at {ip} answers as node {id}, not one this node lost: not introduced (a new node joins with valkey-cli --cluster add-node)"
            );
            continue;
        }
        let (ip_text, port, bus) = (ip.to_string(), peer.port.to_string(), bus.to_string());
        let reply = conn
            .call([
                "CLUSTER",
                "MEET",
                ip_text.as_str(),
                port.as_str(),
                bus.as_str(),
            ])
            .await
            .map_err(|e| {
                UpstreamError::Cluster(format!("CLUSTER MEET {ip_text} {port} {bus}: {e}"))
            })?;
        match frame_str(&reply) {
            Some(ok) if ok == "OK" => {
                tracing::info!(
                    "cluster.peers: Valkey lost peers; introduced {peer} at {ip_text}:{port}@{bus}"
                );
                introduced += 1;
            }
            _ => tracing::warn!("cluster.peers: CLUSTER MEET {ip_text} {port} {bus}: {reply:?}"),
        }
    }
    Ok(introduced)
}

/// The node id of the Valkey behind the walrus at `addr` (`CLUSTER MYID` through it, with
/// this walrus's own credentials).
///
/// Without TLS: `addr` is the peer walrus's client port, not a Valkey. `[upstream.tls]` is
/// how this walrus reaches its own Valkey (that CA, that server name), and says nothing of
/// what a walrus serves its clients; walrus's client port is plaintext (`proxy.listen`).
async fn peer_id(up: &Upstream, addr: SocketAddr) -> Result<String, String> {
    let peer = Upstream {
        address: addr.to_string(),
        process: None,
        tls: None,
        ..up.clone()
    };
    let mut conn = Conn::control(&peer).await.map_err(|e| e.to_string())?;
    let reply = conn
        .call(["CLUSTER", "MYID"])
        .await
        .map_err(|e| format!("CLUSTER MYID: {e}"))?;
    frame_str(&reply).ok_or_else(|| format!("CLUSTER MYID: unexpected reply {reply:?}"))
}

/// The peer's current address, of the family this node announces when it has one.
async fn resolve(peer: &Peer, mine: Option<IpAddr>, timeout: Duration) -> Result<IpAddr, String> {
    let found: Vec<SocketAddr> = tokio::time::timeout(
        timeout,
        tokio::net::lookup_host((peer.host.as_str(), peer.port)),
    )
    .await
    .map_err(|_| format!("no answer within {timeout:?}"))?
    .map_err(|e| e.to_string())?
    .collect();
    let same_family = |a: &&SocketAddr| mine.is_none_or(|m| a.is_ipv4() == m.is_ipv4());
    found
        .iter()
        .find(same_family)
        .or(found.first())
        .map(SocketAddr::ip)
        .ok_or_else(|| "no address".into())
}

#[cfg(test)]
mod tests {
    use super::super::nodes::parse;
    use super::lost;

    #[test]
    fn only_a_peer_not_heard_from_is_lost() {
        let healthy = "a 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-8000\n\
                       b 127.0.0.2:7001@17001 master - 0 0 2 connected 8001-16383\n";
        assert!(!lost(&parse(healthy)));
        let meeting = healthy.replace("2 connected", "2 disconnected");
        assert!(!lost(&parse(&meeting)), "a link down for a moment");
        let failed = healthy.replace("master - 0 0 2", "master,fail? - 0 0 2");
        assert!(lost(&parse(&failed)));
    }
}
