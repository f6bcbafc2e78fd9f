//! A client connection to walrus that never waits forever: every request gets its reply
//! within `HANG_BOUND`, or it is reported as a hang (walrus promises never to hang).

use crate::common::{decode, Raw};
use crate::shared::Ctx;
use redis_protocol::resp2::types::OwnedFrame;
use std::io::Write;
use std::time::{Duration, Instant};

/// Generous: a request may wait for a restore (it gets -LOADING), a checkpoint, a slow
/// journal; and walrus bounds every hold itself (durability.max_hold_ms, 30 s by default,
/// after which the request gets an error), which must win over this bound.
pub const HANG_BOUND: Duration = Duration::from_secs(40);

pub type Cmd = Vec<Vec<u8>>;

pub fn cmd<S: AsRef<[u8]>>(args: &[S]) -> Cmd {
    args.iter().map(|a| a.as_ref().to_vec()).collect()
}

/// A command as messages show it: long arguments cut.
pub fn describe(c: &Cmd) -> String {
    c.iter()
        .map(|a| {
            if a.len() > 48 {
                let head: String = String::from_utf8_lossy(&a[..24]).into_owned();
                format!("{head}…({} bytes)", a.len())
            } else {
                String::from_utf8_lossy(a).into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What came back for one request.
#[derive(Debug)]
pub enum Reply {
    Frame(OwnedFrame),
    /// An error reply, without its `-`.
    Error(String),
    /// No reply: the connection broke, or the request hung (already reported).
    Lost,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Wait {
    TimedOut,
    Closed,
}

pub struct Conn {
    raw: Raw,
    /// Speaks RESP3 (`HELLO 3` when it connected): its replies are read as RESP3 and given
    /// to the checks in their RESP2 shapes (`from_resp3`).
    resp3: bool,
}

impl Conn {
    pub fn connect(addr: &str) -> Option<Conn> {
        Conn::connect_as(addr, false)
    }

    /// A connection that speaks RESP3 if `resp3` (its `HELLO 3` answered, or no connection).
    pub fn connect_as(addr: &str, resp3: bool) -> Option<Conn> {
        let raw = Raw::try_connect(addr).ok()?;
        let mut conn = Conn { raw, resp3 };
        if resp3 {
            conn.send(&[cmd(&["HELLO", "3"])]).ok()?;
            match conn.reply(Instant::now() + HANG_BOUND) {
                Ok(Reply::Frame(_)) => {}
                _ => return None,
            }
        }
        Some(conn)
    }

    /// The next reply, in the protocol this connection speaks, waiting until `deadline` at
    /// most; RESP3 pushes (none come unless the client asked for them) are passed over.
    pub fn reply(&mut self, deadline: Instant) -> Result<Reply, Wait> {
        loop {
            let bytes = self.read(deadline)?;
            if !self.resp3 {
                return Ok(parse(&bytes));
            }
            if let Ok(reply) = parse3(&bytes) {
                return Ok(reply);
            }
        }
    }

    /// A connection to the current walrus, waiting while there is none (it is restarting);
    /// `None` once the run stops.
    pub fn open(ctx: &Ctx) -> Option<Conn> {
        loop {
            if ctx.stopping() {
                return None;
            }
            let addr = ctx.target.get();
            match Conn::connect(&addr) {
                Some(c) => return Some(c),
                None => ctx.target.wait_change(&addr, Duration::from_millis(100)),
            }
        }
    }

    /// Sends every command in one write. `Err(Wait::TimedOut)`: walrus did not take them
    /// all within `HANG_BOUND` (a long pipeline too: not only a write that makes no
    /// progress).
    pub fn send(&mut self, cmds: &[Cmd]) -> Result<(), Wait> {
        self.send_within(cmds, HANG_BOUND)
    }

    /// The same, and `Err(Wait::TimedOut)` too once walrus took none of it for `stall`.
    pub fn send_within(&mut self, cmds: &[Cmd], stall: Duration) -> Result<(), Wait> {
        let mut out = Vec::new();
        for c in cmds {
            out.extend_from_slice(&walrus::resp::write::command(c));
        }
        let deadline = Instant::now() + HANG_BOUND;
        let mut sent = 0;
        while sent < out.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Wait::TimedOut);
            }
            self.raw
                .stream
                .set_write_timeout(Some(left.min(stall)))
                .map_err(|_| Wait::Closed)?;
            match self.raw.stream.write(&out[sent..]) {
                Ok(0) => return Err(Wait::Closed),
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(match e.kind() {
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                            Wait::TimedOut
                        }
                        _ => Wait::Closed,
                    })
                }
            }
        }
        Ok(())
    }

    /// Reads one reply, waiting until `deadline` at most. A partial reply stays buffered
    /// for the next call.
    pub fn read(&mut self, deadline: Instant) -> Result<Vec<u8>, Wait> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Wait::TimedOut);
        }
        self.raw
            .stream
            .set_read_timeout(Some(left))
            .map_err(|_| Wait::Closed)?;
        self.raw.try_read_frame().map_err(|e| {
            // std reports a read timeout as EAGAIN (or ETIMEDOUT).
            if e.contains("os error 11") || e.contains("timed out") {
                Wait::TimedOut
            } else {
                Wait::Closed
            }
        })
    }

    /// Sends `cmds` at once (a pipeline) and reads their replies. A request without a reply
    /// within `HANG_BOUND` is reported as a hang; after a lost reply the rest are lost too.
    pub fn call(&mut self, ctx: &Ctx, cmds: &[Cmd]) -> Vec<Reply> {
        let sent = Instant::now();
        let deadline = sent + HANG_BOUND;
        let mut out = Vec::with_capacity(cmds.len());
        let hung = match self.send(cmds) {
            Err(w) => (w == Wait::TimedOut)
                .then(|| format!("walrus did not read `{}`", describe(&cmds[0]))),
            Ok(()) => cmds
                .iter()
                .find_map(|c| match self.reply(deadline) {
                    Ok(reply) => {
                        out.push(reply);
                        None
                    }
                    Err(w) => Some(
                        (w == Wait::TimedOut).then(|| format!("no reply to `{}`", describe(c))),
                    ),
                })
                .flatten(),
        };
        if let Some(what) = hung {
            ctx.h()
                .violation(format!("hang: {what} within {HANG_BOUND:?}"));
        } else if !blocking(&cmds[0]) && ctx.freeze_hang(sent, Instant::now()) {
            ctx.h().violation(format!(
                "hang: `{}`, sent while Valkey was frozen, got no reply within {:?} \
                 (upstream.reply_timeout_ms is {} ms)",
                describe(&cmds[0]),
                crate::freeze::FREEZE_BOUND,
                crate::node::REPLY_TIMEOUT_MS
            ));
        }
        out.resize_with(cmds.len(), || Reply::Lost);
        out
    }

    /// The same for commands that may wait as long as they like (`BLPOP ... 0`): no hang
    /// bound applies. Replies stop (the rest are lost) when the connection breaks or the run
    /// stops.
    pub fn call_until_stop(&mut self, ctx: &Ctx, cmds: &[Cmd]) -> Vec<Reply> {
        let mut out = Vec::with_capacity(cmds.len());
        if self.send(cmds).is_ok() {
            'replies: while out.len() < cmds.len() {
                // Waits in short slices, so that it notices the end of the run.
                loop {
                    match self.reply(Instant::now() + Duration::from_millis(250)) {
                        Ok(reply) => break out.push(reply),
                        Err(Wait::TimedOut) if !ctx.stopping() => {}
                        Err(_) => break 'replies,
                    }
                }
            }
        }
        out.resize_with(cmds.len(), || Reply::Lost);
        out
    }
}

pub fn parse(bytes: &[u8]) -> Reply {
    match decode(bytes) {
        OwnedFrame::Error(e) => Reply::Error(e),
        f => Reply::Frame(f),
    }
}

/// A RESP3 frame in its RESP2 shape (what the checks read): maps and sets as arrays, numbers
/// as integers, every string as a bulk string, errors as errors. `Err`: a push, as an
/// array.
pub fn parse3(bytes: &[u8]) -> Result<Reply, Vec<OwnedFrame>> {
    use redis_protocol::resp3::types::OwnedFrame as F3;
    let Ok(Some((f, _))) = redis_protocol::resp3::decode::complete::decode(bytes) else {
        let text = String::from_utf8_lossy(bytes);
        return Ok(Reply::Error(format!("not RESP3: {text}")));
    };
    fn two(f: F3) -> OwnedFrame {
        match f {
            F3::BlobString { data, .. }
            | F3::SimpleString { data, .. }
            | F3::VerbatimString { data, .. }
            | F3::BigNumber { data, .. } => OwnedFrame::BulkString(data),
            F3::Number { data, .. } => OwnedFrame::Integer(data),
            F3::Boolean { data, .. } => OwnedFrame::Integer(data as i64),
            F3::Double { data, .. } => OwnedFrame::BulkString(data.to_string().into_bytes()),
            F3::Null => OwnedFrame::Null,
            F3::Array { data, .. } | F3::Push { data, .. } => {
                OwnedFrame::Array(data.into_iter().map(two).collect())
            }
            F3::Set { data, .. } => OwnedFrame::Array(data.into_iter().map(two).collect()),
            F3::Map { data, .. } => OwnedFrame::Array(
                data.into_iter()
                    .flat_map(|(k, v)| [two(k), two(v)])
                    .collect(),
            ),
            F3::SimpleError { data, .. } => OwnedFrame::Error(data),
            F3::BlobError { data, .. } => {
                OwnedFrame::Error(String::from_utf8_lossy(&data).into_owned())
            }
            other => OwnedFrame::Error(format!("an unexpected RESP3 frame: {other:?}")),
        }
    }
    Ok(match f {
        F3::SimpleError { data, .. } => Reply::Error(data),
        F3::BlobError { data, .. } => Reply::Error(String::from_utf8_lossy(&data).into_owned()),
        // `+OK` stays a simple string, as in RESP2.
        F3::SimpleString { data, .. } => Reply::Frame(OwnedFrame::SimpleString(data)),
        F3::Push { data, .. } => return Err(data.into_iter().map(two).collect()),
        f => match two(f) {
            OwnedFrame::Error(e) => Reply::Error(e),
            f => Reply::Frame(f),
        },
    })
}

/// A command Valkey may keep unanswered by design (BLPOP, BLMOVE, ...), which walrus's reply
/// timeout leaves alone.
fn blocking(c: &Cmd) -> bool {
    let name = c[0].to_ascii_uppercase();
    [b"BL".as_slice(), b"BR", b"BZ"]
        .iter()
        .any(|p| name.starts_with(p))
}
