//! Who a client is, as Valkey must see it.

use super::pool::PoolKey;
use crate::config::Credentials;
use bytes::Bytes;

/// What a client is, as Valkey must see it: the state every upstream connection that acts
/// for this client must share.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// Verified credentials; `None` until the client authenticates.
    pub creds: Option<Credentials>,
    pub resp3: bool,
    pub db: u32,
    pub name: Option<Bytes>,
}

impl Identity {
    pub fn pool_key(&self) -> PoolKey {
        let user = self
            .creds
            .as_ref()
            .map(|c| c.username.clone().unwrap_or_else(|| "default".into()));
        PoolKey {
            user,
            resp3: self.resp3,
        }
    }
}
