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
//! Backpressure: at most `max_pipeline_requests` replies may be pending; past that the
//! session stops reading the client until replies drain, and a client that does not read its
//! replies stalls only itself.

use super::pinned;
use super::pipeline::{self, Gate, PipelinedRequest, TxCmd};
use super::pool::{Pool, PoolKey};
use super::pushes::{self, PushReceiver};
use super::route::{self, route, Local, Route};
use super::Shared;
use crate::config::Credentials;
use crate::durability::{self, dirty::Scope, Access};
use crate::metrics;
use crate::resp::{write, Request, RequestParser};
use crate::upstream::client::Conn;
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

const READ_CHUNK_BYTES: usize = 16 << 10;
/// Requests queued for a pinned session's dedicated connection.
const DEDICATED_QUEUE_REQUESTS: usize = 1024;

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

enum Pending {
    Ready(Bytes),
    Wait(oneshot::Receiver<Bytes>),
}

/// What the read loop does after a request.
enum Flow {
    Continue,
    /// Stop reading; close once pending replies are written.
    Close,
    /// Hand the connection to a byte relay, starting with this request.
    Relay(Request),
}

/// Where the session's commands run.
enum Upstream {
    /// A slot of the shared pool of this identity.
    Pooled { pool: Arc<Pool>, slot: usize },
    /// The session's own connection (see [`route`]).
    Dedicated,
}

struct Session {
    shared: Arc<Shared>,
    id: Identity,
    upstream: Upstream,
    tx: Option<mpsc::Sender<PipelinedRequest>>,
    /// RESP3 pushes from a dedicated connection.
    pushes: Option<PushReceiver>,
    /// Inside MULTI (on the dedicated connection).
    in_multi: bool,
    /// The database a SELECT queued in the current transaction switches to: the keys of
    /// the transaction's writes may then be in any database.
    selected_in_multi: Option<u32>,
    /// Dirty-key marks of the writes queued in the current transaction; EXEC carries them.
    tx_marks: TxMarks,
    /// An unauthenticated client was found not to need authentication (see [`Session::noauth`]).
    needs_no_auth: bool,
    pending: VecDeque<Owed>,
    /// The metering of the request being handled: every reply it queues carries it.
    meter: Option<Meter>,
    out: BytesMut,
    wr: OwnedWriteHalf,
}

/// A reply owed to the client, in request order.
struct Owed {
    reply: Pending,
    meter: Option<Meter>,
}

/// Counts a command's reply in `walrus_commands_total` and its latency in
/// `walrus_command_duration_seconds`; atomics only.
#[derive(Clone)]
struct Meter {
    command: Option<Arc<crate::commands::CommandInfo>>,
    arrived: std::time::Instant,
}

impl Meter {
    fn new(command: Option<Arc<crate::commands::CommandInfo>>) -> Meter {
        Meter {
            command,
            arrived: std::time::Instant::now(),
        }
    }

    fn done(&self, reply: &[u8]) {
        match &self.command {
            Some(info) => info.counters.count(reply),
            None => metrics::OTHER_COMMANDS.count(reply),
        }
        metrics::COMMAND_DURATION.observe(self.arrived.elapsed().as_secs_f64());
    }
}

pub async fn run(shared: Arc<Shared>, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let (mut rd, wr) = stream.into_split();
    let pool = shared.default_pool.clone();
    let slot = pool.pick();
    let tx = pool.sender(slot).await.ok();
    let mut s = Session {
        shared: shared.clone(),
        id: Identity::default(),
        upstream: Upstream::Pooled { pool, slot },
        tx,
        pushes: None,
        in_multi: false,
        selected_in_multi: None,
        tx_marks: TxMarks {
            marks: Vec::new(),
            durability: shared.pools.ctx().durability.clone(),
        },
        needs_no_auth: false,
        pending: VecDeque::new(),
        meter: None,
        out: BytesMut::with_capacity(READ_CHUNK_BYTES),
        wr,
    };
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut parser = RequestParser::new(shared.limits);
    let mut reading = true;
    let mut draining = false;
    loop {
        if !reading && s.pending.is_empty() {
            break;
        }
        let can_read = reading && s.pending.len() < shared.max_pipeline_requests;
        let wanted = parser.bytes_wanted().max(rbuf.len() + READ_CHUNK_BYTES / 4);
        if rbuf.capacity() < wanted {
            rbuf.reserve(wanted - rbuf.len());
        }
        tokio::select! {
            biased;
            reply = next_reply(&mut s.pending), if !s.pending.is_empty() => {
                s.settled(&reply);
                s.out.extend_from_slice(&reply);
                while let Some(r) = s.ready_front() {
                    s.out.extend_from_slice(&r);
                }
                if s.flush().await.is_err() {
                    return;
                }
            }
            push = next_push(&mut s.pushes), if s.pushes.is_some() => {
                match push {
                    // Out of band, as Valkey sends it: pushes are not replies to any request.
                    Some(p) => if s.wr.write_all(&p).await.is_err() { return },
                    None if s.pushes.as_ref().is_some_and(|p| p.overflowed()) => {
                        // Valkey disconnects a subscriber past its output buffer limit too.
                        tracing::warn!("closing a client that does not read its RESP3 pushes (over proxy.max_push_bytes)");
                        return;
                    }
                    None => s.pushes = None,
                }
            }
            r = read_more(&mut rd, &mut rbuf, draining), if can_read => {
                match r {
                    Read::Closed => return, // the client is gone: its pending replies go nowhere
                    Read::Drained => {
                        reading = false;
                        continue;
                    }
                    Read::Data => {}
                }
                if rbuf.len() > shared.max_query_buffer_bytes {
                    tracing::warn!("closing client that reached max query buffer length ({} bytes)", rbuf.len());
                    return;
                }
                loop {
                    let req = match parser.next(&mut rbuf) {
                        Ok(Some(req)) => req,
                        Ok(None) => break,
                        Err(e) => {
                            metrics::PROTOCOL_ERRORS.inc();
                            tracing::debug!("client protocol error: {e}");
                            s.pending.push_back(Owed { reply: Pending::Ready(e.reply()), meter: None });
                            reading = false;
                            break;
                        }
                    };
                    s.meter = Some(Meter::new(shared.table.lookup(&req.args).cloned()));
                    match s.handle(req).await {
                        Flow::Continue => {}
                        Flow::Close => {
                            reading = false;
                            break;
                        }
                        Flow::Relay(req) => {
                            if s.drain().await.is_err() {
                                return;
                            }
                            match pinned::open(&s.shared, &s.id).await {
                                Ok(conn) => {
                                    let Session { wr, .. } = s;
                                    pinned::relay(shared, conn, req, rd, rbuf, parser, wr, shutdown).await;
                                    return;
                                }
                                Err(e) => s.owe(Pending::Ready(e)),
                            }
                        }
                    }
                }
            }
            // Shutting down: take what the client already sent, then stop reading.
            _ = shutdown.changed(), if reading && !draining => draining = true,
        }
    }
    let _ = s.flush().await;
}

enum Read {
    Data,
    /// The client closed its side (or the socket failed).
    Closed,
    /// Draining for shutdown: nothing more is buffered.
    Drained,
}

/// Reads from the client; when `draining`, only what is already buffered in the socket.
async fn read_more(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    rbuf: &mut BytesMut,
    draining: bool,
) -> Read {
    let r = if draining {
        match rd.try_read_buf(rbuf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Read::Drained,
            r => r,
        }
    } else {
        rd.read_buf(rbuf).await
    };
    match r {
        Ok(0) | Err(_) => Read::Closed,
        Ok(_) => Read::Data,
    }
}

async fn next_reply(pending: &mut VecDeque<Owed>) -> Bytes {
    match &mut pending
        .front_mut()
        .expect("guarded by the select condition")
        .reply
    {
        Pending::Ready(b) => b.clone(),
        Pending::Wait(rx) => rx.await.unwrap_or_else(|_| pipeline::lost_reply()),
    }
}

async fn next_push(pushes: &mut Option<PushReceiver>) -> Option<Bytes> {
    pushes
        .as_mut()
        .expect("guarded by the select condition")
        .recv()
        .await
}

fn unavailable(reason: &str) -> Bytes {
    metrics::UPSTREAM_ERRORS.inc();
    write::error(&format!(
        "ERR walrus: Valkey is unavailable: {}",
        reason.replace(['\r', '\n'], " ")
    ))
}

impl Session {
    /// Pops the front reply if it has already arrived.
    fn ready_front(&mut self) -> Option<Bytes> {
        let r = match &mut self.pending.front_mut()?.reply {
            Pending::Ready(b) => b.clone(),
            Pending::Wait(rx) => match rx.try_recv() {
                Ok(b) => b,
                Err(oneshot::error::TryRecvError::Empty) => return None,
                Err(oneshot::error::TryRecvError::Closed) => pipeline::lost_reply(),
            },
        };
        self.settled(&r);
        Some(r)
    }

    /// The front reply is ready: it leaves the queue, metered.
    fn settled(&mut self, reply: &[u8]) {
        if let Some(Owed {
            meter: Some(meter), ..
        }) = self.pending.pop_front()
        {
            meter.done(reply);
        }
    }

    /// Queues a reply for the request being handled.
    fn owe(&mut self, reply: Pending) {
        self.pending.push_back(Owed {
            reply,
            meter: self.meter.clone(),
        });
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.wr.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Waits for every pending reply and writes them: the barrier before anything that
    /// changes which upstream connection the client's next command runs on.
    async fn drain(&mut self) -> std::io::Result<()> {
        while let Some(owed) = self.pending.pop_front() {
            let reply = match owed.reply {
                Pending::Ready(b) => b,
                Pending::Wait(rx) => rx.await.unwrap_or_else(|_| pipeline::lost_reply()),
            };
            if let Some(meter) = owed.meter {
                meter.done(&reply);
            }
            self.out.extend_from_slice(&reply);
        }
        self.flush().await
    }

    fn dedicated(&self) -> bool {
        matches!(self.upstream, Upstream::Dedicated)
    }

    async fn handle(&mut self, req: Request) -> Flow {
        match route(&self.shared.table, &req) {
            Route::Pool => {
                self.forward(req).await;
                Flow::Continue
            }
            Route::Pin if route::is_relay_mode(&req, self.id.resp3) => {
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

    /// Moves the session to its own upstream connection, after its pending replies.
    async fn dedicate(&mut self) -> Result<(), Bytes> {
        self.drain()
            .await
            .map_err(|_| write::error("ERR walrus: client connection failed"))?;
        // Opened in database 0, where the pipeline's writer assumes a connection starts: each
        // request carries the client's database, and the writer selects it when needed.
        let start = Identity {
            db: 0,
            ..self.id.clone()
        };
        let conn = pinned::open(&self.shared, &start).await?;
        let (tx, rx) = mpsc::channel(DEDICATED_QUEUE_REQUESTS);
        let (push_tx, push_rx) = pushes::channel(self.shared.max_push_bytes);
        let ctx = self.shared.pools.ctx().clone();
        tokio::spawn(async move {
            if let Err(e) = pipeline::run(conn, rx, ctx, Some(push_tx)).await {
                tracing::debug!("dedicated upstream connection ended: {e}");
            }
        });
        metrics::PINNED_SESSIONS.inc();
        self.upstream = Upstream::Dedicated;
        self.tx = Some(tx);
        self.pushes = Some(push_rx);
        Ok(())
    }

    /// Back to the shared pool of the session's identity (after RESET, AUTH, HELLO).
    async fn pool_again(&mut self) {
        let pool = self
            .shared
            .pools
            .get(self.id.pool_key(), self.id.creds.as_ref())
            .await;
        let slot = pool.pick();
        self.tx = pool.sender(slot).await.ok();
        self.upstream = Upstream::Pooled { pool, slot };
        self.pushes = None;
        self.tx_marks.release();
        self.in_multi = false;
        self.selected_in_multi = None;
    }

    /// Sends a client command upstream, registering it with the durability gate.
    async fn forward(&mut self, req: Request) {
        let tx = self.tx_cmd(&req);
        if tx == TxCmd::Multi {
            return self.multi(req).await;
        }
        let gate = match self.gate(&req, tx).await {
            Ok(g) => g,
            Err(refused) => {
                self.owe(Pending::Ready(refused));
                return;
            }
        };
        match tx {
            TxCmd::End => {
                self.in_multi = false;
                // A SELECT queued in the transaction takes effect with EXEC (assumed to run:
                // an aborted transaction leaves walrus's idea of the database off).
                let selected = self.selected_in_multi.take();
                if req.name().eq_ignore_ascii_case(b"EXEC") {
                    self.id.db = selected.unwrap_or(self.id.db);
                }
            }
            TxCmd::SelectInMulti => {
                let db = req.args.get(1).and_then(|a| crate::resp::parse_i64(a));
                self.selected_in_multi = db
                    .filter(|&d| d >= 0 && d < self.shared.databases as i64)
                    .map(|d| d as u32);
            }
            TxCmd::Other | TxCmd::Multi => {}
        }
        let db = (!self.in_multi && tx != TxCmd::End).then_some(self.id.db);
        let answered_by_push =
            self.dedicated() && self.id.resp3 && route::is_subscription(&req) && !self.in_multi;
        if answered_by_push && self.drain().await.is_err() {
            // The confirmation push must not overtake replies still held for durability.
            return;
        }
        let (reply, rx) = oneshot::channel();
        let request = PipelinedRequest {
            db,
            cmd: req.raw,
            reply,
            gate,
            tx,
            in_multi: self.in_multi,
            answered_by_push,
        };
        let p = self.send(request, rx).await;
        match p {
            // Its confirmation arrives as a push; nothing to wait for in band.
            Pending::Wait(_) if answered_by_push => {}
            p => self.owe(p),
        }
    }

    /// MULTI is a barrier: whether the commands after it are queued depends on its reply
    /// (it fails before AUTH, for one), and the pipeline must know, since no ROLE may be
    /// queued inside a transaction. Earlier replies are settled first, so nothing before it
    /// still waits for a ROLE.
    async fn multi(&mut self, req: Request) {
        if self.drain().await.is_err() {
            return;
        }
        let (reply, rx) = oneshot::channel();
        let request = PipelinedRequest {
            db: Some(self.id.db),
            cmd: req.raw,
            reply,
            gate: Gate::Free,
            tx: TxCmd::Multi,
            in_multi: true,
            answered_by_push: false,
        };
        let reply = match self.send(request, rx).await {
            Pending::Ready(b) => b,
            Pending::Wait(rx) => rx.await.unwrap_or_else(|_| pipeline::lost_reply()),
        };
        self.in_multi = &reply[..] == write::OK;
        self.owe(Pending::Ready(reply));
    }

    fn tx_cmd(&self, req: &Request) -> TxCmd {
        if !self.dedicated() {
            return TxCmd::Other;
        }
        let n = req.name();
        if !self.in_multi && n.eq_ignore_ascii_case(b"MULTI") {
            TxCmd::Multi
        } else if self.in_multi
            && (n.eq_ignore_ascii_case(b"EXEC") || n.eq_ignore_ascii_case(b"DISCARD"))
        {
            TxCmd::End
        } else if self.in_multi && n.eq_ignore_ascii_case(b"SELECT") {
            TxCmd::SelectInMulti
        } else {
            TxCmd::Other
        }
    }

    /// How the reply will be released (see [`crate::durability`]); `Err` is the refusal.
    async fn gate(&mut self, req: &Request, tx: TxCmd) -> Result<Gate, Bytes> {
        let Some(d) = self.shared.pools.ctx().durability.clone() else {
            return Ok(Gate::Free);
        };
        if tx == TxCmd::End {
            // EXEC's reply shows what the transaction read and wrote: it waits for the
            // offset after it.
            d.admit_read()?;
            return Ok(Gate::Offset(std::mem::take(&mut self.tx_marks.marks)));
        }
        let class = self.shared.table.classify(&req.args);
        match durability::access(&class, &req.args, req.raw.len(), self.id.db) {
            Access::Free => Ok(Gate::Free),
            // Inside MULTI a read only answers +QUEUED; EXEC is gated.
            Access::Read(_) if self.in_multi => Ok(Gate::Free),
            Access::Read(scope) => {
                d.admit_read()?;
                Ok(Gate::Read(scope))
            }
            Access::Write(_) if req.raw.len() > self.shared.max_write_bytes => {
                metrics::Refusal::TooLarge.count();
                Err(write::error(&format!(
                    "ERR walrus: this write is {} bytes, more than the journal takes in one entry ({} bytes, journal.max_entry_bytes): it is refused before it reaches Valkey",
                    req.raw.len(),
                    self.shared.max_write_bytes
                )))
            }
            Access::Write(scope) => {
                let scope = if self.selected_in_multi.is_some() {
                    Scope::All
                } else {
                    scope
                };
                d.write_room().await?;
                let mark = d.begin_write(scope)?;
                if self.in_multi {
                    // +QUEUED reveals nothing and must not wait (the client may wait for
                    // it before sending EXEC): the mark rides with EXEC.
                    self.tx_marks.marks.push(mark);
                    return Ok(Gate::Free);
                }
                Ok(Gate::Offset(vec![mark]))
            }
        }
    }

    /// Queues `req` upstream; `rx` is the receiving end of `req.reply`.
    async fn send(&mut self, mut req: PipelinedRequest, rx: oneshot::Receiver<Bytes>) -> Pending {
        for _ in 0..2 {
            if let Some(sender) = &self.tx {
                match sender.send(req).await {
                    Ok(()) => return Pending::Wait(rx),
                    Err(mpsc::error::SendError(back)) => req = back,
                }
            }
            // The connection this client used is gone; take the slot's current one.
            let current = match &self.upstream {
                Upstream::Pooled { pool, slot } => pool.sender(*slot).await,
                Upstream::Dedicated => {
                    Err("the session's dedicated connection was lost".to_string())
                }
            };
            match current {
                Ok(s) => self.tx = Some(s),
                Err(reason) => return self.refuse(req, &reason),
            }
        }
        self.refuse(req, "connection lost")
    }

    /// A request that was never sent: its write mark is released at once.
    fn refuse(&self, req: PipelinedRequest, reason: &str) -> Pending {
        if let (Gate::Offset(marks), Some(d)) = (req.gate, &self.shared.pools.ctx().durability) {
            d.cancel_write(marks);
        }
        Pending::Ready(unavailable(reason))
    }

    fn ready(&mut self, reply: Bytes) -> Flow {
        self.owe(Pending::Ready(reply));
        Flow::Continue
    }

    /// Valkey refuses every command but AUTH, HELLO, QUIT and RESET before authentication;
    /// the connection-state commands walrus answers itself must be refused alike (and a
    /// SELECT accepted here would later fail on the shared connection, breaking it for every
    /// client on it). Whether this client needs to authenticate is asked once, with a PING
    /// on its own pooled connection: `Some` is Valkey's `-NOAUTH` reply.
    async fn noauth(&mut self) -> Option<Bytes> {
        if self.id.creds.is_some() || self.needs_no_auth || self.in_multi {
            return None;
        }
        let (reply, rx) = oneshot::channel();
        let probe = self
            .send(
                PipelinedRequest {
                    db: None,
                    cmd: write::command(["PING"]),
                    reply,
                    gate: Gate::Free,
                    tx: TxCmd::Other,
                    in_multi: false,
                    answered_by_push: false,
                },
                rx,
            )
            .await;
        let reply = match probe {
            Pending::Ready(b) => b,
            Pending::Wait(rx) => rx.await.unwrap_or_else(|_| pipeline::lost_reply()),
        };
        if reply.starts_with(b"-NOAUTH") {
            return Some(reply);
        }
        self.needs_no_auth = !reply.starts_with(b"-");
        None
    }

    async fn local(&mut self, cmd: Local, req: Request) -> Flow {
        // With a wrong number of arguments these go to Valkey, whose arity error comes first.
        let answered_here = match cmd {
            Local::Select | Local::ClientGetName => req.args.len() == 2,
            Local::ClientSetName => req.args.len() == 3,
            Local::ClientSetInfo => req.args.len() == 4,
            _ => false,
        };
        if answered_here {
            if let Some(noauth) = self.noauth().await {
                return self.ready(noauth);
            }
        }
        match cmd {
            Local::Select if self.in_multi => {
                // Queued with the transaction: Valkey answers it.
                self.forward(req).await;
                Flow::Continue
            }
            Local::Select => {
                if req.args.len() != 2 {
                    self.forward(req).await; // Valkey's own arity error
                    return Flow::Continue;
                }
                let reply = match crate::resp::parse_i64(&req.args[1]) {
                    None => write::error("ERR value is not an integer or out of range"),
                    Some(db) if db < 0 || db >= self.shared.databases as i64 => {
                        write::error("ERR DB index is out of range")
                    }
                    Some(db) => {
                        self.id.db = db as u32;
                        Bytes::from_static(write::OK)
                    }
                };
                self.ready(reply)
            }
            Local::Quit => {
                self.ready(Bytes::from_static(write::OK));
                Flow::Close
            }
            Local::Reset if req.args.len() != 1 => {
                self.forward(req).await; // Valkey's own arity error
                Flow::Continue
            }
            Local::Reset => {
                if self.drain().await.is_err() {
                    return Flow::Close;
                }
                // A dedicated connection is dropped with its state; the session is pooled again.
                self.id = Identity::default();
                self.needs_no_auth = false;
                self.pool_again().await;
                self.ready(write::simple("RESET"))
            }
            Local::Auth => {
                let creds = match req.args.len() {
                    2 => Credentials {
                        username: None,
                        password: String::from_utf8_lossy(&req.args[1]).into_owned(),
                    },
                    3 => Credentials {
                        username: Some(String::from_utf8_lossy(&req.args[1]).into_owned()),
                        password: String::from_utf8_lossy(&req.args[2]).into_owned(),
                    },
                    _ => {
                        self.forward(req).await; // Valkey's own syntax error
                        return Flow::Continue;
                    }
                };
                if self.drain().await.is_err() {
                    return Flow::Close;
                }
                match verify(&self.shared, &req.raw).await {
                    Ok(()) => {
                        self.id.creds = Some(creds);
                        if self.dedicated() {
                            // The dedicated connection switches user too; its +OK is the reply.
                            self.forward(req).await;
                            return Flow::Continue;
                        }
                        self.pool_again().await;
                        self.ready(Bytes::from_static(write::OK))
                    }
                    Err(reply) => self.ready(reply),
                }
            }
            Local::Hello if self.dedicated() => {
                // The connection is the client's own: Valkey handles HELLO on it.
                if let Some(v) = req.args.get(1).and_then(|v| crate::resp::parse_i64(v)) {
                    self.id.resp3 = v == 3;
                }
                self.forward(req).await;
                Flow::Continue
            }
            Local::Hello => self.hello(req).await,
            Local::ClientSetName => {
                if req.args.len() != 3 {
                    self.forward(req).await;
                    return Flow::Continue;
                }
                match valid_name(&req.args[2]) {
                    Ok(()) => {
                        self.id.name = (!req.args[2].is_empty()).then(|| req.args[2].clone());
                        self.ready(Bytes::from_static(write::OK))
                    }
                    Err(e) => self.ready(e),
                }
            }
            Local::ClientGetName => {
                if req.args.len() != 2 {
                    self.forward(req).await;
                    return Flow::Continue;
                }
                let reply = write::bulk_or_null(self.id.name.as_deref(), self.id.resp3);
                self.ready(reply)
            }
            Local::ClientSetInfo => {
                // Library name and version are per connection; pooled connections are shared,
                // so walrus validates and accepts them without passing them on.
                if req.args.len() != 4 {
                    self.forward(req).await;
                    return Flow::Continue;
                }
                if !(req.arg_is(2, "lib-name") || req.arg_is(2, "lib-ver")) {
                    let attr = String::from_utf8_lossy(&req.args[2]).into_owned();
                    return self.ready(write::error(&format!(
                        "ERR Unrecognized option '{}'",
                        attr.replace(['\r', '\n'], "")
                    )));
                }
                match valid_name(&req.args[3]) {
                    Ok(()) => self.ready(Bytes::from_static(write::OK)),
                    Err(_) => self.ready(write::error(&format!(
                        "ERR {} cannot contain spaces, newlines or special characters.",
                        // Valkey names the attribute as the client spelled it.
                        String::from_utf8_lossy(&req.args[2]).replace(['\r', '\n'], "")
                    ))),
                }
            }
            Local::Replication => self.ready(write::error(
                "ERR walrus: SYNC, PSYNC and REPLCONF are refused: the replication stream shows writes before they are durable; attach replicas to Valkey itself",
            )),
            Local::ClientReply => {
                if req.args.len() == 3 && req.arg_is(2, "ON") {
                    return self.ready(Bytes::from_static(write::OK));
                }
                if req.args.len() == 3 && (req.arg_is(2, "OFF") || req.arg_is(2, "SKIP")) {
                    return self.ready(write::error(
                        "ERR walrus: CLIENT REPLY OFF and SKIP are not supported: walrus holds each reply until it is durable",
                    ));
                }
                self.forward(req).await; // Valkey's own syntax error
                Flow::Continue
            }
        }
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`: authentication is verified with
    /// Valkey, the name is kept by walrus, and the reply is Valkey's own, from a connection
    /// of the identity the client switches to.
    async fn hello(&mut self, req: Request) -> Flow {
        let mut id = self.id.clone();
        let mut auth: Option<Credentials> = None;
        if let Some(v) = req.args.get(1) {
            match crate::resp::parse_i64(v) {
                None => {
                    return self.ready(write::error(
                        "ERR Protocol version is not an integer or out of range",
                    ))
                }
                Some(v) if !(2..=3).contains(&v) => {
                    return self.ready(write::error("NOPROTO unsupported protocol version"))
                }
                Some(v) => id.resp3 = v == 3,
            }
        }
        let mut i = 2;
        while i < req.args.len() {
            let more = req.args.len() - i - 1;
            if req.arg_is(i, "AUTH") && more >= 2 {
                auth = Some(Credentials {
                    username: Some(String::from_utf8_lossy(&req.args[i + 1]).into_owned()),
                    password: String::from_utf8_lossy(&req.args[i + 2]).into_owned(),
                });
                i += 3;
            } else if req.arg_is(i, "SETNAME") && more >= 1 {
                if let Err(e) = valid_name(&req.args[i + 1]) {
                    return self.ready(e);
                }
                id.name = (!req.args[i + 1].is_empty()).then(|| req.args[i + 1].clone());
                i += 2;
            } else {
                let opt = String::from_utf8_lossy(&req.args[i]).replace(['\r', '\n'], "");
                return self.ready(write::error(&format!(
                    "ERR Syntax error in HELLO option '{opt}'"
                )));
            }
        }
        if self.drain().await.is_err() {
            return Flow::Close;
        }
        if let Some(c) = auth {
            let user = c.username.clone().unwrap_or_default();
            let cmd = write::command([b"AUTH".as_slice(), user.as_bytes(), c.password.as_bytes()]);
            if let Err(reply) = verify(&self.shared, &cmd).await {
                return self.ready(reply);
            }
            id.creds = Some(c);
        }
        // Valkey's own HELLO reply, from a connection that already is what the client asked for.
        let pool = self
            .shared
            .pools
            .get(id.pool_key(), id.creds.as_ref())
            .await;
        let slot = pool.pick();
        let hello = match req.args.get(1) {
            Some(v) => write::command([b"HELLO".as_slice(), v]),
            None => write::command(["HELLO"]),
        };
        let (tx, rx) = oneshot::channel();
        let request = PipelinedRequest {
            db: Some(id.db),
            cmd: hello,
            reply: tx,
            gate: Gate::Free,
            tx: TxCmd::Other,
            in_multi: false,
            answered_by_push: false,
        };
        let reply = match pool.sender(slot).await {
            Err(reason) => unavailable(&reason),
            Ok(sender) => match sender.send(request).await {
                Err(_) => unavailable("connection lost"),
                Ok(()) => rx.await.unwrap_or_else(|_| pipeline::lost_reply()),
            },
        };
        if !reply.starts_with(b"-") {
            self.id = id;
            self.tx = pool.sender(slot).await.ok();
            self.upstream = Upstream::Pooled { pool, slot };
        }
        self.ready(reply)
    }
}

/// Dirty-key marks of the writes queued in an open transaction. A transaction the client
/// never finishes (it leaves, or sends RESET) runs nothing: dropping this cleans its keys.
#[derive(Default)]
struct TxMarks {
    marks: Vec<crate::durability::WriteMark>,
    durability: Option<Arc<crate::durability::Durability>>,
}

impl TxMarks {
    fn release(&mut self) {
        let marks = std::mem::take(&mut self.marks);
        if let Some(d) = &self.durability {
            d.cancel_write(marks);
        }
    }
}

impl Drop for TxMarks {
    fn drop(&mut self) {
        self.release();
    }
}

/// Checks credentials with Valkey on a fresh connection; `Err` carries Valkey's own reply
/// (`-WRONGPASS ...`) or walrus's error.
async fn verify(shared: &Shared, auth_cmd: &[u8]) -> Result<(), Bytes> {
    let mut conn = Conn::connect(shared.pools.upstream())
        .await
        .map_err(|e| unavailable(&e.to_string()))?;
    let reply = conn
        .call_raw(auth_cmd)
        .await
        .map_err(|e| unavailable(&e.to_string()))?;
    if reply.starts_with(b"-") {
        return Err(reply);
    }
    Ok(())
}

/// Valkey's rule for client names: printable ASCII without spaces.
fn valid_name(name: &[u8]) -> Result<(), Bytes> {
    if name.iter().all(|&c| (b'!'..=b'~').contains(&c)) {
        Ok(())
    } else {
        Err(write::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ))
    }
}
