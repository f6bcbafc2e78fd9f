//! What `walrus serve` learns of its Valkey before it serves: the server and its command
//! table, its settings (external mode), and whether it is a cluster node as configured.

use super::Fatal;
use crate::commands::CommandTable;
use crate::config::Config;
use crate::task::backoff::Backoff;
use crate::upstream::client::{frame_int, Conn, UpstreamError};
use crate::upstream::cluster::{self, ClusterNode};
use crate::upstream::server::ServerVersion;
use crate::upstream::{settings, Upstream};
use redis_protocol::resp2::types::OwnedFrame;
use std::time::Duration;

/// Valkey as a cluster node announcing this walrus, listening on `listen` (its port as
/// bound, which `--listen :0` leaves to the kernel), when `cluster.enabled`.
pub(super) fn cluster_node(
    config: &Config,
    listen: std::net::SocketAddr,
) -> Result<Option<ClusterNode>, Fatal> {
    if !config.cluster.enabled {
        return Ok(None);
    }
    Ok(Some(ClusterNode {
        announce: config.cluster.announce(listen)?,
        bus_port: config.cluster.bus_port,
    }))
}

/// A cluster node must announce walrus to clients, and a Valkey in cluster mode must not
/// be run without `cluster.enabled`: its clients would be sent to Valkey's own address.
pub(super) async fn check_cluster(
    node: Option<&ClusterNode>,
    up: &Upstream,
    server: &ServerVersion,
) -> Result<(), Fatal> {
    let mut conn = Conn::control(up).await?;
    match node {
        Some(node) => node.check(&mut conn, server).await?,
        None if cluster::enabled(&mut conn).await? => {
            return Err(format!(
                "Valkey at {} runs in cluster mode, and cluster.enabled is off: CLUSTER SLOTS, MOVED and ASK would send cluster clients to Valkey's own address, around walrus; set cluster.enabled (docs/cluster.md, \"Valkey Cluster\")",
                up.address
            )
            .into())
        }
        None => {}
    }
    Ok(())
}

/// External mode: compares Valkey's settings with those walrus needs, once.
pub(super) async fn check_settings(up: &Upstream, strict: bool) -> Result<(), Fatal> {
    let mut conn = Conn::control(up).await?;
    let diffs = match settings::check(&mut conn).await {
        Ok(d) => d,
        Err(e) => {
            // An ACL user without +config cannot read them: say so, do not guess.
            let msg = format!("cannot read Valkey's settings with CONFIG GET: {e}");
            return if strict {
                Err(msg.into())
            } else {
                tracing::warn!("{msg}");
                Ok(())
            };
        }
    };
    for d in &diffs {
        tracing::warn!("{d}");
    }
    if strict && !diffs.is_empty() {
        return Err(format!(
            "upstream.strict_settings is set and {} of Valkey's settings differ from what walrus needs (see the log); first: {}",
            diffs.len(),
            diffs[0]
        )
        .into());
    }
    Ok(())
}

/// Connects with walrus's own credentials and reads the command table and the number of
/// databases, retrying until Valkey answers (in Kubernetes it may start after walrus).
pub(super) async fn learn_upstream(
    up: &Upstream,
    backoff_max: Duration,
) -> Result<(CommandTable, u32, ServerVersion), Fatal> {
    let mut backoff = Backoff::up_to(backoff_max);
    loop {
        match try_learn(up).await {
            Ok(r) => return Ok(r),
            // Not a server walrus can serve: waiting will not change that.
            Err(e @ UpstreamError::Unsupported(_)) => return Err(e.into()),
            Err(e) => {
                tracing::warn!(
                    "cannot read Valkey's command table yet: {e}; retrying in {:?}",
                    backoff.delay()
                );
                tokio::time::sleep(backoff.advance()).await;
            }
        }
    }
}

/// Which server Valkey is (refused if walrus cannot serve it), its command table and its
/// number of databases.
async fn try_learn(up: &Upstream) -> Result<(CommandTable, u32, ServerVersion), UpstreamError> {
    let mut conn = Conn::control(up).await?;
    let server = ServerVersion::query(&mut conn).await?;
    server.check_supported()?;
    let table = CommandTable::fetch(&mut conn)
        .await
        .map_err(|e| UpstreamError::Decode(e.to_string()))?;
    let reply = conn.call(["CONFIG", "GET", "databases"]).await?;
    let databases = match &reply {
        OwnedFrame::Array(kv) => kv.get(1).and_then(frame_int),
        _ => None,
    }
    .filter(|&n| n > 0 && n <= u32::MAX as i64)
    .ok_or_else(|| {
        UpstreamError::Decode(format!("unexpected CONFIG GET databases reply: {reply:?}"))
    })?;
    Ok((table, databases as u32, server))
}
