//! The clients that wait for what others do: a subscriber that subscribes at random times
//! for a random while, and a consumer blocked in `BLPOP ... 0` on its own connection.

use crate::common::Rng;
use crate::conn::{cmd, parse, Conn, Reply, Wait, HANG_BOUND};
use crate::history::QUEUES;
use crate::keys::{queue_key, same_tag, CHANNEL, TAGS};
use crate::route::{Batch, Router};
use crate::shared::Ctx;
use crate::workers::settle_pop;
use redis_protocol::resp2::types::OwnedFrame;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Subscribes for 0.2 to 3 s at a time, on a new connection each time. The SUBSCRIBE's send
/// time is stamped before it is sent: no message whose PUBLISH was acknowledged before that
/// may arrive (a restore replaying the journal's PUBLISH would deliver one).
pub fn subscriber(ctx: Arc<Ctx>, seed: u64) {
    let mut rng = Rng(seed);
    while let Some(mut conn) = Conn::open(&ctx) {
        let session = Duration::from_millis(200 + rng.below(2800));
        let sub_ts = {
            let mut h = ctx.h();
            h.count("op: subscription");
            h.tick()
        };
        let Some((received, whole)) = subscribe(&ctx, &mut conn, session) else {
            // Refused (Valkey is away): retry soon, paced (workload, not synchronization).
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        ctx.h().subscription(sub_ts, &received);
        if whole {
            // Paces subscriptions (workload): some time unsubscribed, when messages are
            // missed. After a broken one, it subscribes again at once: walrus may be
            // restoring Valkey then, the moment a replayed PUBLISH would reach it.
            std::thread::sleep(Duration::from_millis(rng.below(300)));
        }
    }
}

/// One subscription: the messages received until `session` ends or the connection breaks,
/// and whether it lasted the whole session; `None` if the SUBSCRIBE was not confirmed.
fn subscribe(ctx: &Ctx, conn: &mut Conn, session: Duration) -> Option<(Vec<Vec<u8>>, bool)> {
    let c = cmd(&["SUBSCRIBE", CHANNEL]);
    conn.send(std::slice::from_ref(&c)).ok()?;
    match conn.read(Instant::now() + HANG_BOUND).map(|b| parse(&b)) {
        Ok(Reply::Frame(OwnedFrame::Array(confirm)))
            if confirm.first() == Some(&OwnedFrame::BulkString(b"subscribe".to_vec())) => {}
        Ok(Reply::Error(e)) => {
            ctx.h().error("SUBSCRIBE", &e);
            return None;
        }
        Ok(other) => {
            ctx.h().unexpected("SUBSCRIBE", &other);
            return None;
        }
        Err(Wait::TimedOut) => {
            ctx.h().violation(format!(
                "hang: no reply to `SUBSCRIBE {CHANNEL}` within {HANG_BOUND:?}"
            ));
            return None;
        }
        Err(Wait::Closed) => return None,
    }
    let end = Instant::now() + session;
    let mut received = Vec::new();
    loop {
        let bytes = match conn.read(end) {
            Ok(bytes) => bytes,
            Err(w) => return Some((received, w == Wait::TimedOut)),
        };
        match parse(&bytes) {
            Reply::Frame(OwnedFrame::Array(mut parts))
                if parts.len() == 3 && parts[0] == OwnedFrame::BulkString(b"message".to_vec()) =>
            {
                if let Some(OwnedFrame::BulkString(payload)) = parts.pop() {
                    received.push(payload);
                }
            }
            other => ctx.h().unexpected("a subscription's message", &other),
        }
    }
}

/// Pops with `BLPOP <every queue of one tag> 0`, the tags in turn, which may wait for as long
/// as those queues stay empty: no hang bound applies. A queue whose slot moves away redirects
/// it (`route.rs`). When the run stops, its connection is dropped while it waits, and that
/// pop's outcome is unknown.
pub fn blocked_consumer(ctx: Arc<Ctx>, seed: u64) {
    let mut router = Router::new(ctx.clone(), seed);
    for tag in (0..TAGS.len()).cycle() {
        if ctx.stopping() {
            break;
        }
        let mut c = cmd(&["BLPOP"]);
        c.extend(
            same_tag(tag, QUEUES)
                .iter()
                .map(|&q| queue_key(q).into_bytes()),
        );
        c.push(b"0".to_vec());
        let sent = {
            let mut h = ctx.h();
            h.count("op: queue pop, blocking");
            h.stamp()
        };
        let reply = router
            .exchange(std::slice::from_ref(&c), Batch::Blocking)
            .map_or(Reply::Lost, |mut r| r.remove(0));
        let lost = matches!(reply, Reply::Lost);
        if !settle_pop(&mut ctx.h(), &c, reply, &sent, None) && !lost {
            // Paces retries while walrus restores (workload, not synchronization).
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
