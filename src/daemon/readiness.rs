//! What `/readyz` answers, from the parts of walrus that start one after another: the gate
//! (durable mode), the cluster watch (cluster mode) and the shared pool.

use super::Fatal;
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
    pub(super) fn check(&self) -> Result<(), Fatal> {
        if self.durable {
            match self.gate.get().map(|g| g.status()) {
                None => return Err(Fatal::from("starting: opening the journal")),
                Some(LinkState::Attached) => {}
                Some(LinkState::Detached) => {
                    return Err(Fatal::from("the replica link is not attached to Valkey"))
                }
                Some(LinkState::Restoring) => {
                    return Err(Fatal::from(
                        "restoring Valkey from the checkpoint and journal",
                    ))
                }
                Some(LinkState::Failed(why)) => {
                    return Err(Fatal::from(format!("the journal failed: {why}")));
                }
            }
        }
        if let Some(why) = &*self.cluster.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(Fatal::from(why.clone()));
        }
        match self.pool.get().map(|p| p.upgrade()) {
            None => Err(Fatal::from("starting: connecting to Valkey")),
            Some(None) => Err(Fatal::from("stopping")),
            Some(Some(p)) if !p.is_connected() => Err(Fatal::from("no connection to Valkey")),
            Some(Some(_)) => Ok(()),
        }
    }
}
