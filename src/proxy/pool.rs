//! The shared upstream pool: a few pipelined connections that carry the stateless traffic
//! of every client.
//!
//! There is one [`Pool`] per client identity, that is per (authenticated user, protocol):
//! a client's commands run on connections authenticated as that client's own Valkey user, so
//! ACLs apply as if it were connected directly, and in its RESP version, so replies are
//! Valkey's own bytes. Unauthenticated clients share connections that never sent AUTH: if
//! Valkey requires a password, they get exactly Valkey's `-NOAUTH`.
//!
//! Each slot has a supervisor task that connects, runs the [`pipeline`](super::pipeline)
//! until it breaks, and reconnects with exponential backoff. While it connects (bounded by
//! `upstream.connect_timeout_ms`), requests for the slot wait: a connection that broke once
//! (killed, or given up by walrus when Valkey stopped answering) costs its clients nothing
//! more. Once an attempt has failed, requests fail at once with its error instead of
//! hanging while Valkey is down.
//!
//! Each pool also keeps a connection aside ([`Pool::aside`]), opened on first use, for the
//! commands Valkey serves while a script keeps it busy (flagged `allow_busy`: SCRIPT KILL,
//! FUNCTION KILL, FUNCTION STATS): on a shared connection they would queue behind the very
//! script they are sent to end.

use super::pipeline::{self, PipelineCtx, PipelinedRequest};
use crate::config::Credentials;
use crate::task::backoff::Backoff;
use crate::upstream::client::Conn;
use crate::upstream::Upstream;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Requests queued for one upstream connection before senders wait (backpressure, never an
/// error): bounds walrus's memory per connection while Valkey is slow. Each client has at
/// most `proxy.max_pipeline_requests` pending anyway; this bounds the sum over the clients
/// sharing a connection.
const QUEUE_REQUESTS_MAX: usize = 4096;

/// Who a pool's connections act for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// `None`: not authenticated.
    pub user: Option<String>,
    pub resp3: bool,
}

/// Where a slot stands.
#[derive(Clone)]
enum SlotState {
    /// The live connection's queue, and the managed child it reaches
    /// ([`Upstream::process`]).
    Live(mpsc::Sender<PipelinedRequest>, u64),
    /// Connecting: requests wait for the outcome.
    Connecting,
    /// The last attempt failed, for this reason; the next one is under way with backoff.
    /// With the managed child the attempt was made for: a later child is tried at once.
    Down(String, u64),
}

struct Slot {
    state: watch::Sender<SlotState>,
}

/// Why no connection can take a request now; a session answers with it as an error reply
/// ([`pipeline::unavailable`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

pub struct Pool {
    /// The shared slots, then the one kept aside ([`Pool::aside`]).
    slots: Vec<Slot>,
    /// How long a request waits for its slot to (re)connect.
    connect_timeout: Duration,
    next: AtomicUsize,
    /// Set by each slot's supervisor after its first connection attempt.
    first_attempts: Vec<watch::Receiver<bool>>,
    /// Which managed child serves Valkey's address ([`Upstream::process`]).
    process: Option<watch::Receiver<u64>>,
    /// What a slot's supervisor needs, for the slot kept aside, started on first use.
    launch: Launch,
    aside_started: std::sync::Once,
}

/// Who a pool's connections act for, and how they reconnect.
struct Launch {
    ctx: Arc<PipelineCtx>,
    key: PoolKey,
    creds: Option<Credentials>,
    backoff_max: Duration,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            state: watch::Sender::new(SlotState::Connecting),
        }
    }
}

impl Slot {
    fn set(&self, state: SlotState) {
        self.state.send_replace(state);
    }
}

impl Pool {
    /// Creates the pool; its slots start connecting (see [`Pool::ready`]).
    fn start(
        ctx: Arc<PipelineCtx>,
        key: PoolKey,
        creds: Option<Credentials>,
        size: usize,
        backoff_max: Duration,
    ) -> Arc<Pool> {
        let (senders, first_attempts): (Vec<_>, Vec<_>) =
            (0..size).map(|_| watch::channel(false)).unzip();
        let pool = Arc::new(Pool {
            slots: (0..=size).map(|_| Slot::default()).collect(),
            connect_timeout: ctx.upstream.connect_timeout,
            next: AtomicUsize::new(0),
            first_attempts,
            process: ctx.upstream.process.clone(),
            launch: Launch {
                ctx,
                key,
                creds,
                backoff_max,
            },
            aside_started: std::sync::Once::new(),
        });
        for (i, tx) in senders.into_iter().enumerate() {
            pool.supervise(i, tx);
        }
        pool
    }

    /// Starts the supervisor of slot `i`.
    fn supervise(self: &Arc<Self>, i: usize, first_attempt: watch::Sender<bool>) {
        let l = &self.launch;
        tokio::spawn(supervise(
            Arc::downgrade(self),
            i,
            l.ctx.clone(),
            l.key.clone(),
            l.creds.clone(),
            l.backoff_max,
            first_attempt,
        ));
    }

    /// Waits for each slot's first connection attempt, so that the first requests do not
    /// fail merely because connecting takes a moment.
    pub async fn ready(&self) {
        for mut rx in self.first_attempts.clone() {
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    /// Picks a slot for a new client. A client keeps its slot: its commands then reach
    /// Valkey in the order it sent them.
    pub fn pick(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % (self.slots.len() - 1)
    }

    /// The queue of the connection kept aside for the commands Valkey serves while a script
    /// keeps it busy, or why there is none; connects it on first use.
    pub async fn aside(self: &Arc<Self>) -> Result<mpsc::Sender<PipelinedRequest>, Unavailable> {
        let slot = self.slots.len() - 1;
        self.aside_started
            .call_once(|| self.supervise(slot, watch::channel(false).0));
        self.sender(slot).await
    }

    /// The queue of the slot's live connection, or why there is none; waits while the slot
    /// connects.
    pub async fn sender(&self, slot: usize) -> Result<mpsc::Sender<PipelinedRequest>, Unavailable> {
        let mut rx = self.slots[slot].state.subscribe();
        let current = |p: u64| self.process.as_ref().is_none_or(|c| *c.borrow() == p);
        // A live queue whose receiver is gone belongs to a connection that just broke, and one
        // to an earlier child than the current one is about to be dropped: the supervisor is
        // settling it and will connect again.
        let settled = async {
            rx.wait_for(|s| match s {
                SlotState::Live(tx, p) => !tx.is_closed() && current(*p),
                SlotState::Connecting => false,
                SlotState::Down(_, p) => current(*p),
            })
            .await
            .map(|s| s.clone())
        };
        match tokio::time::timeout(self.connect_timeout, settled).await {
            Ok(Ok(SlotState::Live(tx, _))) => Ok(tx),
            Ok(Ok(SlotState::Down(why, _))) => Err(Unavailable(why)),
            Ok(_) => Err(Unavailable("the connection pool is closed".into())),
            Err(_) => Err(Unavailable(format!(
                "no connection to Valkey within upstream.connect_timeout_ms ({} ms)",
                self.connect_timeout.as_millis()
            ))),
        }
    }

    /// Whether any slot has a live connection.
    pub fn is_connected(&self) -> bool {
        self.slots
            .iter()
            .any(|s| matches!(*s.state.borrow(), SlotState::Live(..)))
    }
}

async fn supervise(
    pool: std::sync::Weak<Pool>,
    slot: usize,
    ctx: Arc<PipelineCtx>,
    key: PoolKey,
    creds: Option<Credentials>,
    backoff_max: Duration,
    first_attempt: watch::Sender<bool>,
) {
    let mut backoff = Backoff::up_to(backoff_max);
    loop {
        // Bounded as a whole (AUTH and HELLO too): requests wait while the slot connects.
        let up = &ctx.upstream;
        let mut process = up.process.clone();
        let reached = process.as_mut().map_or(0, |p| *p.borrow_and_update());
        let conn = Conn::for_client(up, creds.as_ref(), key.resp3).await;
        let Some(p) = pool.upgrade() else { return };
        match conn {
            Ok(conn) => {
                if *first_attempt.borrow() {
                    crate::metrics::UPSTREAM_RECONNECTS.inc();
                }
                let (tx, rx) = mpsc::channel(QUEUE_REQUESTS_MAX);
                p.slots[slot].set(SlotState::Live(tx, reached));
                drop(p);
                let _ = first_attempt.send(true);
                let result = tokio::select! {
                    r = pipeline::run(conn, rx, ctx.clone(), None) => r,
                    () = replaced(process) => Ok(()),
                };
                let Some(p) = pool.upgrade() else { return };
                let reason = match result {
                    Ok(()) => "connection closed".to_string(),
                    Err(e @ crate::upstream::client::UpstreamError::Unverified) => {
                        // It connected but cannot serve: as a failed connect, with backoff.
                        tracing::warn!(user = ?key.user, slot, "{e}; retrying in {:?}", backoff.delay());
                        p.slots[slot].set(SlotState::Down(e.to_string(), reached));
                        drop(p);
                        tokio::time::sleep(backoff.advance()).await;
                        continue;
                    }
                    Err(e) => e.to_string(),
                };
                backoff.reset();
                tracing::warn!(user = ?key.user, slot, "upstream connection lost: {reason}; reconnecting");
                p.slots[slot].set(SlotState::Connecting);
            }
            Err(e) => {
                tracing::warn!(user = ?key.user, slot, "cannot connect to Valkey: {e}; retrying in {:?}", backoff.delay());
                p.slots[slot].set(SlotState::Down(e.to_string(), reached));
                drop(p);
                let _ = first_attempt.send(true);
                // A new child is tried at once: requests for it wait rather than fail.
                tokio::select! {
                    _ = tokio::time::sleep(backoff.advance()) => {}
                    () = replaced(process) => backoff.reset(),
                }
            }
        }
    }
}

/// Returns once another child than the one `process` showed serves the address; never
/// without one (external mode).
async fn replaced(process: Option<watch::Receiver<u64>>) {
    match process {
        Some(mut p) => {
            // A closed channel means walrus is stopping: nothing to replace.
            if p.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// All pools, created on first use.
pub struct Pools {
    ctx: Arc<PipelineCtx>,
    size: usize,
    backoff_max: Duration,
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
}

impl Pools {
    pub fn new(ctx: Arc<PipelineCtx>, size: usize, backoff_max: Duration) -> Pools {
        Pools {
            ctx,
            size,
            backoff_max,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// The pool for this identity; `creds` must already be verified with Valkey. The lock
    /// covers only the map: connecting happens outside it, so one slow connect never holds
    /// up the clients of other identities.
    pub async fn get(&self, key: PoolKey, creds: Option<&Credentials>) -> Arc<Pool> {
        let pool = {
            let mut pools = self.pools.lock().expect("pools lock");
            pools
                .entry(key)
                .or_insert_with_key(|key| {
                    Pool::start(
                        self.ctx.clone(),
                        key.clone(),
                        creds.cloned(),
                        self.size,
                        self.backoff_max,
                    )
                })
                .clone()
        };
        pool.ready().await;
        pool
    }

    pub fn upstream(&self) -> &Upstream {
        &self.ctx.upstream
    }

    pub fn ctx(&self) -> &Arc<PipelineCtx> {
        &self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::valkey::role::OffsetOracle;

    #[tokio::test]
    async fn one_identitys_stuck_connect_does_not_hold_up_another() {
        // A "Valkey" that answers each connection's first command (walrus's CLIENT ID) and
        // nothing after: a RESP3 pool's HELLO 3 waits forever, while an unauthenticated
        // RESP2 pool sends nothing more before serving.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = silent.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = silent.accept().await {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 64];
                    if s.read(&mut buf).await.unwrap_or(0) > 0 {
                        let _ = s.write_all(b":1\r\n").await;
                    }
                    std::future::pending::<()>().await;
                });
            }
        });
        let ctx = Arc::new(PipelineCtx {
            upstream: Upstream {
                address,
                credentials: None,
                connect_timeout: Duration::from_secs(5),
                reply_timeout: Duration::from_secs(30),
                limits: crate::resp::Limits::default(),
                process: None,
                tls: None,
            },
            durability: None,
            oracle: OffsetOracle::new(),
            max_in_flight: 64,
        });
        let pools = Arc::new(Pools::new(ctx, 1, Duration::from_millis(100)));
        let stuck = {
            let pools = pools.clone();
            tokio::spawn(async move {
                pools
                    .get(
                        PoolKey {
                            user: None,
                            resp3: true,
                        },
                        None,
                    )
                    .await
            })
        };
        tokio::task::yield_now().await;
        let other = tokio::time::timeout(
            Duration::from_secs(5),
            pools.get(
                PoolKey {
                    user: None,
                    resp3: false,
                },
                None,
            ),
        )
        .await;
        assert!(
            other.is_ok(),
            "a RESP2 client waited behind a RESP3 pool's connect"
        );
        assert!(!stuck.is_finished());
        stuck.abort();
    }
}
