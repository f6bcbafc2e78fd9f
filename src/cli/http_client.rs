//! The one HTTP client of the admin commands (`walrus checkpoint`, `status`, `backup`):
//! a request to walrus's metrics endpoint (`metrics.listen`) and its answer.
//!
//! Connecting is bounded by [`CONNECT_TIMEOUT`]: a walrus that is not there must be said at
//! once, not after the command's own wait. Waiting for the answer is bounded per command
//! (a status answers at once, a checkpoint or a backup may take minutes). Every failure
//! names the address and what to check.

use super::Fatal;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long connecting may take: on loopback or in a pod, a listening walrus accepts in
/// microseconds; a dropped SYN (a firewall, a wrong host) would otherwise wait minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest answer read: a status or a summary is a few KiB.
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// An answer: the HTTP status code and the body.
#[derive(Debug)]
pub struct Answer {
    pub code: u16,
    pub body: String,
}

impl Answer {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// What to check when walrus does not answer at `addr`.
fn hint(addr: &str) -> String {
    format!(
        "is walrus running, and is {addr} its metrics endpoint (metrics.listen, \
         --metrics-listen; not its client port)? Pass --metrics ADDR"
    )
}

/// Whether `addr` answers a RESP `PING` (within [`PROBE_TIMEOUT`]).
fn answers_resp(addr: &str) -> bool {
    let Some(target) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let Ok(mut s) = TcpStream::connect_timeout(&target, PROBE_TIMEOUT) else {
        return false;
    };
    let mut reply = [0u8; 64];
    s.set_read_timeout(Some(PROBE_TIMEOUT)).is_ok()
        && s.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
        && s.read(&mut reply).is_ok_and(|n| {
            let r = &reply[..n];
            r.starts_with(b"+PONG") || r.starts_with(b"-")
        })
}

/// How long walrus takes to answer `/healthz`: it answers from memory at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `method path` with `body` to `addr` and reads the answer, waiting at most
/// `answer_timeout` for it. A request that may wait long (a checkpoint, a backup) is
/// preceded by `GET /healthz`: what listens at `addr` must answer it as walrus does within
/// [`PROBE_TIMEOUT`], or the wrong address is said at once, not after the long wait (a
/// client port or another service that accepts and stays silent).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
    answer_timeout: Duration,
) -> Result<Answer, Fatal> {
    if answer_timeout > PROBE_TIMEOUT {
        let probe = send(addr, "GET", "/healthz", "", None, PROBE_TIMEOUT)?;
        if probe.code != 200 || probe.body.trim() != "ok" {
            return Err(Fatal::from(format!(
                "{addr} answered GET /healthz with {} {:?}, not walrus's \"ok\"; {}",
                probe.code,
                probe.body.chars().take(40).collect::<String>(),
                hint(addr)
            )));
        }
    }
    Ok(send(addr, method, path, body, token, answer_timeout)?)
}

fn send(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
    answer_timeout: Duration,
) -> Result<Answer, String> {
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr:?}: {e} (expected host:port)"))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for t in &targets {
        match TcpStream::connect_timeout(t, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut s = stream.ok_or_else(|| {
        let why = match last {
            Some(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                format!("no connection within {CONNECT_TIMEOUT:?}")
            }
            Some(e) => e.to_string(),
            None => "the address resolves to nothing".into(),
        };
        format!("cannot reach walrus at {addr}: {why}; {}", hint(addr))
    })?;
    let io = |what: &str, e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            format!(
                "{addr} accepted the connection but gave no answer within {answer_timeout:?}; {}",
                hint(addr)
            )
        } else {
            format!("{what} {addr}: {e}")
        }
    };
    s.set_read_timeout(Some(answer_timeout))
        .and_then(|()| s.set_write_timeout(Some(CONNECT_TIMEOUT)))
        .map_err(|e| io("configuring the connection to", e))?;
    // One write: the endpoint reads the request as it arrives, bounded.
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())
        .map_err(|e| io("sending to", e))?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| io("reading the answer of", e))?;
    if raw.is_empty() {
        // A RESP port (walrus's client port, Valkey) closes an HTTP request unanswered, as
        // Valkey does: say so rather than suspect walrus.
        if answers_resp(addr) {
            return Err(format!(
                "{addr} speaks RESP, not HTTP: it is a client port (walrus's proxy.listen, or Valkey's), not walrus's metrics endpoint; pass --metrics with its metrics.listen, or --config with its configuration file"
            ));
        }
        // What a walrus that stops (or is killed) during a long request leaves the caller.
        return Err(format!(
            "{addr} closed the connection without an answer: walrus may be stopping or have died (see its log)"
        ));
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            format!(
                "{addr} answered, but not with HTTP ({:?}); {}",
                head.chars().take(40).collect::<String>(),
                hint(addr)
            )
        })?;
    Ok(Answer {
        code,
        body: body.to_string(),
    })
}
