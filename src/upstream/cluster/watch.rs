//! The cluster node's poller: every `cluster.poll_interval_ms` it reads what Valkey says of
//! its node into the `walrus_cluster_*` metrics, reintroduces lost peers
//! ([`super::peers`]), and checks again that Valkey still announces this walrus.

use super::client::{frame_str, Conn};
use super::nodes::{self, Node};
use super::peers;
use super::ClusterNode;
use crate::config::Peer;
use crate::metrics::{CLUSTER_NODE_INFO, CLUSTER_SLOTS, CLUSTER_STATE_OK};
use crate::upstream::info;
use crate::upstream::server::ServerVersion;
use crate::upstream::Upstream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the poller needs.
pub struct Watch {
    pub up: Upstream,
    pub interval: Duration,
    pub node: ClusterNode,
    pub server: ServerVersion,
    pub peers: Vec<Peer>,
    /// Why Valkey does not announce this walrus any more (`None`: it does), for `/readyz`.
    /// The start refuses such a Valkey; later someone may `CONFIG SET` it on Valkey
    /// directly, or an external Valkey restart without the settings (no `CONFIG REWRITE`).
    pub problem: Arc<Mutex<Option<String>>>,
}

/// What Valkey says of its own node.
struct NodeStatus {
    id: String,
    shard: String,
    ok: bool,
    nodes: String,
}

impl NodeStatus {
    async fn query(conn: &mut Conn) -> Result<NodeStatus, String> {
        let mut text = async |args: &[&str]| -> Result<String, String> {
            let reply = conn.call(args).await.map_err(|e| e.to_string())?;
            frame_str(&reply).ok_or_else(|| format!("{args:?}: unexpected reply {reply:?}"))
        };
        Ok(NodeStatus {
            id: text(&["CLUSTER", "MYID"]).await?,
            shard: text(&["CLUSTER", "MYSHARDID"]).await?,
            ok: info::field(&text(&["CLUSTER", "INFO"]).await?, "cluster_state") == Some("ok"),
            nodes: text(&["CLUSTER", "NODES"]).await?,
        })
    }
}

/// Polls forever. A Valkey that cannot be asked counts as a cluster not ok; the node's
/// labels stay as last seen.
pub async fn watch(w: Watch) {
    let mut tick = tokio::time::interval(w.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut labels: Option<(String, String)> = None;
    loop {
        tick.tick().await;
        // Bounded: a Valkey that accepts but never answers must read as not ok.
        let timeout = w.up.connect_timeout;
        let polled = tokio::time::timeout(timeout, poll(&w, &mut labels))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")));
        let text = match polled {
            Ok(text) => text,
            Err(e) => {
                CLUSTER_STATE_OK.set(0);
                tracing::warn!("cannot read the cluster node's state from Valkey: {e}");
                continue;
            }
        };
        // After the checks, with a bound of its own: a peer's name that takes long to
        // resolve must not hold up the next poll's checks.
        let nodes = nodes::parse(&text);
        if !w.peers.is_empty() && peers::lost(&nodes) {
            let bound = timeout * (2 * w.peers.len() as u32 + 1);
            let met = tokio::time::timeout(bound, peers::reintroduce(&w.up, &w.peers, &nodes));
            match met.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("cluster.peers: {e}"),
                Err(_) => tracing::warn!("cluster.peers: not done within {bound:?}"),
            }
        }
    }
}

/// Updates the metrics and the announce check; returns CLUSTER NODES.
async fn poll(w: &Watch, labels: &mut Option<(String, String)>) -> Result<String, String> {
    let mut conn = Conn::control(&w.up).await.map_err(|e| e.to_string())?;
    let s = NodeStatus::query(&mut conn).await?;
    let now = (s.id, s.shard);
    if labels.as_ref() != Some(&now) {
        if let Some((id, shard)) = labels.take() {
            let _ = CLUSTER_NODE_INFO.remove_label_values(&[&id, &shard]);
        }
        CLUSTER_NODE_INFO
            .with_label_values(&[&now.0, &now.1])
            .set(1);
        *labels = Some(now);
    }
    let nodes = nodes::parse(&s.nodes);
    CLUSTER_SLOTS.set(
        nodes
            .iter()
            .filter(|n| n.myself())
            .map(Node::owned_slots)
            .sum(),
    );
    CLUSTER_STATE_OK.set(i64::from(s.ok));
    let problem = w
        .node
        .check(&mut conn, &w.server)
        .await
        .err()
        .map(|e| e.to_string());
    let mut last = w.problem.lock().unwrap_or_else(|p| p.into_inner());
    if *last != problem {
        match &problem {
            Some(p) => tracing::error!("not ready: {p}"),
            None => tracing::info!("Valkey announces this walrus to cluster clients again"),
        }
        *last = problem;
    }
    Ok(s.nodes)
}
