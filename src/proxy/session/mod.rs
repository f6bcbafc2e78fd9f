//! One client connection.
//!
//! The session reads requests, routes each ([`route`](super::route)), and keeps a FIFO of
//! pending replies, one per request, so replies leave in request order whichever way each
//! was answered: by a pooled upstream connection, by the session's dedicated connection, by
//! walrus itself, or with an error; and however long the durability gate held each of them.
//! Replies that are ready together are written together.
//!
//! Before a write is sent upstream, the session registers its keys as dirty and waits for
//! room under the durability bounds ([`crate::durability`]); the upstream connection holds
//! its reply until the journal covers it.
//!
//! Backpressure never waits for a client that cannot move. While its window of pending
//! replies is full (at most `max_pipeline_requests`), the session stops reading the client:
//! the wait is for Valkey or the journal. While its replies pile up unwritten, the session
//! stops handling its requests but reads on: the client may be sending a whole pipeline
//! before it reads a reply (redis-py's `Pipeline.execute()`, bulk loads), as Valkey's
//! clients may. What it holds for the client then, replies and requests, is bounded by
//! `proxy.max_output_bytes`, past which the client is closed, saying why. A client that does
//! not read its replies costs only itself.

use super::identity::Identity;
use super::pinned;
use super::pipeline::{self, PipelinedRequest, Release, TxCmd};
use super::pushes::PushReceiver;
use super::route::{self, route, Local, Route};
use super::Shared;
use crate::durability::{self, dirty::Scope, Access, ClientOutput, ReplyTx};
use crate::metrics;
use crate::net::{read_chunk, ReadHalf, Stream, WriteHalf};
use crate::resp::{write, Request, RequestParser};
use crate::upstream::client::Conn;
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

mod admit;
mod forward;
mod local;
mod replies;
mod transaction;

use forward::Runs;
use transaction::Transaction;

use replies::{next_reply, Meter, Owed};

/// Reply bytes held for a client (unwritten, or waiting to be taken) past which walrus stops
/// handling its requests: a client that does not read its replies gets no more work done
/// for it, and what it sends meanwhile is read and held, unhandled, counted against
/// `proxy.max_output_bytes` with its replies.
const OUTPUT_PAUSE_BYTES: usize = 1 << 20;
/// Replies a new client may have pending before it has shown that it reads them: its
/// window then grows by one for each reply taken while its output keeps up (doubling every
/// round trip, as TCP's slow start), to `proxy.max_pipeline_requests`, and halves when its
/// output piles up. Whatever the window, what a client has in flight is kept to half its
/// output limit at the size of the largest reply it had lately: a client that pipelines
/// reads of a large value and never reads costs Valkey (and the clients whose replies
/// share its upstream connection) a few of them, then waits, paused, within its limit (or
/// is closed at it, if it keeps sending).
const INITIAL_WINDOW_REQUESTS: usize = 4;

enum Pending {
    Ready(Bytes),
    Wait(oneshot::Receiver<Bytes>),
}

/// What the read loop does after a request.
enum Flow {
    Continue,
    /// Stop reading; close once pending replies are written.
    Close,
    /// Close at once; replies still owed are dropped, as Valkey drops a client it takes for
    /// a cross-protocol attack before its output is written.
    Abort,
    /// Hand the connection to a byte relay, starting with this request.
    Relay(Request),
}

struct Session {
    shared: Arc<Shared>,
    id: Identity,
    upstream: Runs,
    tx: Option<mpsc::Sender<PipelinedRequest>>,
    /// RESP3 pushes from a dedicated connection.
    pushes: Option<PushReceiver>,
    /// The client's transaction, on the dedicated connection.
    transaction: Transaction,
    /// An unauthenticated client was found not to need authentication (see [`Session::noauth`]).
    needs_no_auth: bool,
    pending: VecDeque<Owed>,
    /// The metering of the request being handled: every reply it queues carries it.
    meter: Option<Meter>,
    /// The request being handled may block ([`route::may_block`]).
    blocking_request: bool,
    /// Replies this client may have pending now (see [`INITIAL_WINDOW_REQUESTS`]).
    window: usize,
    /// The largest reply it had lately (decaying by 1/64 with each reply).
    largest_reply: usize,
    /// Its replies piled up at the last look (the window halves once per pile-up).
    piled_up: bool,
    out: BytesMut,
    /// The reply bytes walrus holds for this client, handed over or unwritten, against
    /// `proxy.max_output_bytes`.
    output: Arc<ClientOutput>,
    wr: WriteHalf,
}

/// Serves one client, who starts as `id` (the default user, or the user its TLS
/// certificate names), until it leaves or `shutdown` fires and its replies are written.
pub async fn run(
    shared: Arc<Shared>,
    stream: Stream,
    id: Identity,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Some(tcp) = stream.tcp() {
        let _ = tcp.set_nodelay(true);
    }
    let (mut rd, wr) = stream.into_split();
    let pool = match &id.creds {
        None => shared.default_pool.clone(),
        Some(creds) => shared.pools.get(id.pool_key(), Some(creds)).await,
    };
    let slot = pool.pick();
    let tx = pool.sender(slot).await.ok();
    let mut s = Session {
        shared: shared.clone(),
        id,
        upstream: Runs::Pooled { pool, slot },
        tx,
        pushes: None,
        transaction: Transaction::new(shared.pools.ctx().durability.clone()),
        needs_no_auth: false,
        pending: VecDeque::new(),
        meter: None,
        blocking_request: false,
        window: INITIAL_WINDOW_REQUESTS.min(shared.max_pipeline_requests),
        largest_reply: 0,
        piled_up: false,
        // Both buffers are allocated when there is something to hold: an idle client costs
        // its task and socket only (10,000 of them are a normal day).
        out: BytesMut::new(),
        output: ClientOutput::new(shared.max_output_bytes),
        wr,
    };
    let mut rbuf = BytesMut::new();
    let mut parser = RequestParser::new(shared.limits);
    // The client is read until it closes its side, a protocol error, QUIT, or the end of a
    // shutdown's drain. Requests already read are handled either way.
    let mut reading = true;
    let mut draining = false;
    // Requests read and not yet handled: handling stopped while the session was paused.
    let mut unhandled = false;
    // While paused and not reading, the socket is watched for the client's going away (a
    // peek: nothing is consumed) once per change: `true` once the peek found requests
    // waiting.
    let mut peeked = false;
    let _report = OutputReport(s.output.clone());
    loop {
        if s.output.over() {
            // As Valkey drops a client past its output buffer limit: nothing more is written.
            return;
        }
        let paused = s.paused();
        if unhandled && !paused {
            unhandled = false;
            s.output.ahead(0);
            loop {
                // A long pipeline: replies are taken as they come, not left waiting against
                // the output limit until the whole read is handled; while they cannot be
                // written (or wait behind one the gate holds), the rest of the pipeline
                // waits too, as new reads do.
                if s.paused() {
                    if s.take_ready().is_err() {
                        return;
                    }
                    if s.paused() {
                        unhandled = true;
                        break;
                    }
                }
                let req = match parser.next(&mut rbuf) {
                    Ok(Some(req)) => req,
                    Ok(None) => break,
                    Err(e) => {
                        metrics::PROTOCOL_ERRORS.inc();
                        tracing::debug!("client protocol error: {e}");
                        s.queue(Pending::Ready(e.reply()), None, false);
                        reading = false;
                        break;
                    }
                };
                let info = shared.table.lookup(&req.args).cloned();
                s.blocking_request = info.as_ref().is_some_and(|i| route::may_block(i, &req));
                s.meter = Some(Meter::new(info));
                match s.handle(req).await {
                    Flow::Continue => {}
                    Flow::Close => {
                        reading = false;
                        break;
                    }
                    Flow::Abort => return,
                    Flow::Relay(req) => {
                        if s.drain().await.is_err() || s.flush().await.is_err() {
                            return;
                        }
                        match pinned::open(&s.shared, &s.id).await {
                            Ok(conn) => {
                                let Session { wr, .. } = s;
                                pinned::relay(shared, conn, req, rd, rbuf, parser, wr, shutdown)
                                    .await;
                                return;
                            }
                            Err(e) => s.owe(Pending::Ready(e)),
                        }
                    }
                }
            }
            continue;
        }
        if !reading && !unhandled && s.pending.is_empty() {
            break;
        }
        // A paused client is read on, its requests left unhandled, while its replies pile up
        // (it may be sending a whole pipeline before it reads a reply, as redis-py does:
        // waiting for it to read would wait for good), within proxy.max_output_bytes with
        // its replies; and behind a command that may block, as Valkey reads a blocked
        // client's into its query buffer (to proxy.max_query_buffer_bytes), so that its
        // leaving ends the command however much it sent. Otherwise (its window is full: the
        // wait is for Valkey or the journal) what it sends waits in the socket, and the
        // socket is watched. (Not when shutting down: then what is buffered is what is
        // handled.)
        let ahead = reading && paused && !draining && (s.piled_up || s.behind_blocking());
        let watch = reading && paused && !ahead && !peeked;
        let wanted = parser
            .bytes_wanted()
            .max(rbuf.len() + read_chunk::CLIENT / 4);
        tokio::select! {
            biased;
            reply = next_reply(&mut s.pending, &s.output), if !s.pending.is_empty() => {
                peeked = false;
                let reply = s.settled(reply);
                s.out.extend_from_slice(&reply);
                if s.take_ready().is_err() {
                    return;
                }
            }
            w = s.wr.writable(), if !s.out.is_empty() || s.wr.unflushed() => {
                if w.is_err() || s.write_ready().is_err() {
                    return;
                }
            }
            // Not while its replies are unwritten: pushes then queue up to proxy.max_push_bytes.
            push = next_push(&mut s.pushes), if s.pushes.is_some() && s.out.len() < OUTPUT_PAUSE_BYTES => {
                match push {
                    // Out of band, as Valkey sends it: pushes are not replies to any request.
                    // Behind the replies already queued: a partly written reply is never
                    // interrupted.
                    Some(Ok(p)) => {
                        s.out.extend_from_slice(&p);
                        if s.write_ready().is_err() {
                            return;
                        }
                    }
                    // A notice that will never be released: the client is told why, as far
                    // as its socket takes it now, and closed.
                    Some(Err(why)) => {
                        s.out.extend_from_slice(&why);
                        let _ = s.write_ready();
                        return;
                    }
                    None if s.pushes.as_ref().is_some_and(|p| p.overflowed()) => {
                        // Valkey disconnects a subscriber past its output buffer limit too.
                        tracing::warn!("closing a client that does not read its RESP3 pushes (over proxy.max_push_bytes)");
                        return;
                    }
                    None => {
                        // The dedicated connection ended (Valkey restarted, the connection
                        // broke): the client's state on it (subscriptions, WATCH, MULTI) is
                        // gone, as its connection to Valkey itself would be. Closed once what
                        // it is owed is written, so that it knows, and subscribes again.
                        s.pushes = None;
                        reading = false;
                    }
                }
            }
            r = read_more(&mut rd, &mut rbuf, wanted, draining, watch), if (reading && !paused) || ahead || watch => {
                match r {
                    // The client closed its side, or is gone. A command that may block ends
                    // with it, as Valkey frees a blocked client that leaves.
                    Read::Closed if s.behind_blocking() => return,
                    // What it sent is handled and what it is owed written (or fails to be,
                    // if it is gone), then it is closed, as Valkey answers what it read
                    // before a client left.
                    Read::Closed | Read::Drained => reading = false,
                    Read::Waiting => peeked = true,
                    Read::Data => {
                        if rbuf.len() > shared.max_query_buffer_bytes {
                            tracing::warn!("closing client that reached max query buffer length ({} bytes)", rbuf.len());
                            return;
                        }
                        // Past its output limit with its replies, it is closed for them.
                        if ahead && s.piled_up && !s.output.ahead(rbuf.len()) {
                            return;
                        }
                        unhandled = true;
                    }
                }
            }
            // Shutting down: take what the client already sent, then stop reading.
            _ = shutdown.changed(), if reading && !draining => draining = true,
        }
    }
    if s.flush().await.is_ok() {
        // A TLS client is told the session ends (close_notify), so that it can tell the
        // end from a cut connection.
        s.wr.close_notify();
    }
}

enum Read {
    Data,
    /// The client closed its side (or the socket failed).
    Closed,
    /// Draining for shutdown: nothing more is buffered.
    Drained,
    /// Watching a paused client: it has sent more, which waits in the socket.
    Waiting,
}

/// Reads from the client into `rbuf`, with room for `wanted` bytes; when `draining`, only
/// what is already buffered in the socket; when `watching` a paused client, nothing, but
/// whether it is gone. While it waits for a client with nothing buffered, `rbuf` holds no
/// memory.
async fn read_more(
    rd: &mut ReadHalf,
    rbuf: &mut BytesMut,
    wanted: usize,
    draining: bool,
    watching: bool,
) -> Read {
    if watching {
        return match rd.peek(&mut [0u8; 1]).await {
            Ok(0) | Err(_) => Read::Closed,
            Ok(_) => Read::Waiting,
        };
    }
    loop {
        if rbuf.capacity() < wanted {
            rbuf.reserve(wanted - rbuf.len());
        }
        match rd.try_read_buf(rbuf) {
            Ok(0) => return Read::Closed,
            Ok(_) => return Read::Data,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if draining {
                    return Read::Drained;
                }
                if rbuf.is_empty() {
                    *rbuf = BytesMut::new();
                }
                if rd.readable().await.is_err() {
                    return Read::Closed;
                }
            }
            Err(_) => return Read::Closed,
        }
    }
}

async fn next_push(pushes: &mut Option<PushReceiver>) -> Option<Result<Bytes, Bytes>> {
    pushes
        .as_mut()
        .expect("guarded by the select condition")
        .recv()
        .await
}

/// Says, when a session ends, that its client was closed for its output, whichever way the
/// session ended.
struct OutputReport(Arc<ClientOutput>);

impl Drop for OutputReport {
    fn drop(&mut self) {
        if self.0.over() {
            metrics::CLIENTS_OUTPUT_CLOSED.inc();
            tracing::warn!(
                "closed a client that does not read its replies ({} bytes of its replies, and of requests it sent meanwhile, held: over proxy.max_output_bytes)",
                self.0.held()
            );
        }
    }
}

impl Session {
    /// Replies pile up (unwritten, or waiting behind one not yet released: `piled_up`), or
    /// the client has its window's worth pending: handle no more of its requests until they
    /// drain. Each pile-up also halves the window.
    fn paused(&mut self) -> bool {
        let piled_up = self.out.len() + self.output.parked() >= OUTPUT_PAUSE_BYTES;
        if piled_up && !std::mem::replace(&mut self.piled_up, true) {
            self.window = (self.window / 2).max(INITIAL_WINDOW_REQUESTS);
        }
        self.piled_up = piled_up;
        if piled_up {
            return true;
        }
        let by_bytes = (self.shared.max_output_bytes / 2)
            .checked_div(self.largest_reply)
            .unwrap_or(usize::MAX)
            .max(1);
        self.pending.len()
            >= self
                .window
                .min(by_bytes)
                .min(self.shared.max_pipeline_requests)
    }

    /// A channel for one reply to this client, counted against its output limit.
    fn reply_channel(&self) -> (ReplyTx, oneshot::Receiver<Bytes>) {
        durability::reply_channel(&self.output)
    }

    fn dedicated(&self) -> bool {
        matches!(self.upstream, Runs::Dedicated)
    }

    /// The table entry of the request being handled.
    fn command(&self) -> Option<&Arc<crate::commands::CommandInfo>> {
        self.meter.as_ref().and_then(|m| m.command.as_ref())
    }

    async fn handle(&mut self, req: Request) -> Flow {
        match route(self.command().map(|c| &**c), &req) {
            Route::Pool => {
                self.forward(req).await;
                Flow::Continue
            }
            Route::Pin if route::is_relay_mode(&req, self.id.resp3) => {
                if req.name().eq_ignore_ascii_case(b"monitor") && !self.shared.allow_monitor {
                    let refusal = super::admin::MONITOR.error_unless("proxy.allow_monitor");
                    return self.ready(write::error(&refusal));
                }
                if self.dedicated() {
                    return self.ready(write::error(
                        "ERR walrus: this connection already has a transaction, blocking or tracking state; \
                         use a separate connection for RESP2 Pub/Sub or MONITOR",
                    ));
                }
                Flow::Relay(req)
            }
            Route::Pin => {
                if !self.dedicated() {
                    if let Err(e) = self.dedicate().await {
                        return self.ready(e);
                    }
                }
                self.forward(req).await;
                Flow::Continue
            }
            Route::Local(l) => self.local(l, req).await,
        }
    }

    /// A reply walrus gives itself. An error while a transaction queues aborts it, as
    /// Valkey's own queue-time errors do.
    fn ready(&mut self, reply: Bytes) -> Flow {
        if reply.first() == Some(&b'-') {
            self.transaction.refuse();
        }
        self.owe(Pending::Ready(reply));
        Flow::Continue
    }
}
