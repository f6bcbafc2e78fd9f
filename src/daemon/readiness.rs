//! What `/readyz` answers, from the parts of walrus that start one after another: the gate
//! (durable mode), the cluster watch (cluster mode) and the shared pool.

use crate::durability::{Durability, LinkState};
use std::sync::{Arc, OnceLock};

/// What `/readyz` answers: 200 only when walrus serves data durably.
#[derive(Default)]
pub(super) struct Readiness {
    pub(super) durable: bool,
    pub(super) gate: OnceLock<Arc<Durability>>,
    pub(super) pool: OnceLock<std::sync::Weak<crate::proxy::pool::Pool>>,
    /// Cluster mode: why Valkey does not announce this walrus ([`crate::upstream::cluster::Watch`]).
    pub(super) cluster: Arc<std::sync::Mutex<Option<String>>>,
}

impl Readiness {
    pub(super) fn check(&self) -> Result<(), String> {
        if self.durable {
            match self.gate.get().map(|g| g.status()) {
                None => return Err("starting: opening the journal".into()),
                Some(LinkState::Attached) => {}
                Some(LinkState::Detached) => {
                    return Err("the replica link is not attached to Valkey".into())
                }
                Some(LinkState::Restoring) => {
                    return Err("restoring Valkey from the checkpoint and journal".into())
                }
                Some(LinkState::Failed(why)) => {
                    return Err(format!("the journal failed: {why}"));
                }
            }
        }
        if let Some(why) = &*self.cluster.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(why.clone());
        }
        match self.pool.get().map(|p| p.upgrade()) {
            None => Err("starting: connecting to Valkey".into()),
            Some(None) => Err("stopping".into()),
            Some(Some(p)) if !p.is_connected() => Err("no connection to Valkey".into()),
            Some(Some(_)) => Ok(()),
        }
    }
}
