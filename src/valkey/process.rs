//! Which Valkey process answers at walrus's address, watched: whoever follows one process
//! (the replica link, a restore) notices when another one answers there (Valkey restarted,
//! failed over, the managed child restarted), whether or not a connection of its own told.

use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::{server, Upstream};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// How often the process answering is asked.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Resolves with the `run_id` of the process that answers at `up` once it is another than
/// `run_id`. Asked every [`PROBE_INTERVAL`], at once when the managed child is replaced
/// ([`Upstream::process`]), and when `nudge` resolves (a connection doubts the process). An
/// unreachable or busy Valkey is not a replaced one (a full `maxclients`, a script running):
/// only another `run_id` counts.
pub async fn replaced<F>(up: &Upstream, run_id: &str, mut nudge: impl FnMut() -> F) -> String
where
    F: Future<Output = ()>,
{
    let mut probe: Option<Conn> = None;
    let mut child = up.process.clone();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(PROBE_INTERVAL) => {}
            _ = nudge() => {}
            _ = next_child(&mut child) => {}
        }
        // A broken connection reached a process that is gone: asked again at once on a new
        // one. Not after no reply (a stopped Valkey does not answer a new one either), nor
        // after a refusal (a busy Valkey refuses INFO on any connection).
        for _ in 0..2 {
            if probe.is_none() {
                probe = Conn::control(up).await.ok();
            }
            let Some(conn) = probe.as_mut() else { break };
            match server::run_id(conn).await {
                Ok(now) if now != run_id => return now,
                Ok(_) | Err(UpstreamError::Refused(_)) => break,
                Err(UpstreamError::NoReply(_)) => {
                    probe = None;
                    break;
                }
                Err(_) => probe = None,
            }
        }
    }
}

/// Returns once another managed child serves the address; never without one (external
/// mode), nor once walrus stops (the channel closed).
async fn next_child(child: &mut Option<watch::Receiver<u64>>) {
    let changed = match child {
        Some(c) => c.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}
