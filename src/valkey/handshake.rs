//! The replica handshake, as a current Valkey replica does it (replication.c,
//! `syncWithPrimary`): `PING`, `AUTH` (done by [`Conn::control`]), `REPLCONF listening-port`,
//! `REPLCONF ip-address`, `REPLCONF capa eof capa psync2`, `REPLCONF version`, then
//! `PSYNC <replid> <offset+1>` to continue from what the journal holds, or `PSYNC ? -1` for a
//! full resynchronization.
//!
//! - `version`: the primary's own version, so that it sends its own RDB format. Valkey 9
//!   picks the format per replica and serves one that announces nothing the format of 7.2
//!   (RDB 11), which cannot hold a hash with field TTLs: the save fails, and every
//!   checkpoint with it. walrus stores the RDB as it comes and only ever loads it into a
//!   server that reads that format (see [`crate::restore`]). A server that does not know the
//!   option (Redis OSS, Valkey before 8) answers with an error, which is ignored, as
//!   Valkey's own replicas do.
//! - `ip-address`: without it, every `ROLE` (walrus asks one per batch of writes) makes
//!   Valkey look up the replica's peer address before anything else.
//! - Capabilities: `eof` (a diskless RDB may come as `$EOF:<mark>`) and `psync2` (`+CONTINUE
//!   <new id>`), and nothing else. Capabilities are opt-in: a primary serves a replica that
//!   lacks one the way it served replicas before it existed. So walrus does not announce
//!   `dual-channel` (the RDB and the stream then arrive on one connection, in order, which
//!   keeps the offset accounting one byte count), nor newer ones (RDB compression, skipped
//!   checksums) that would change the bytes it stores and verifies.
//! - A checkpoint's connection also sends `REPLCONF rdb-only 1`: it wants the RDB and not
//!   the stream after it, so Valkey keeps no replica buffer for it while it transfers.

use crate::resp::write;
use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::server::ServerVersion;
use bytes::BytesMut;

/// A Valkey replication id: 40 hex characters.
pub const REPLID_LEN: usize = 40;

/// What the primary answered to PSYNC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncStart {
    /// An RDB follows; the stream after it starts at `offset + 1`.
    Full { replid: String, offset: u64 },
    /// The stream continues right after the offset the replica asked for; `replid` is the
    /// primary's current replication id (it may have changed).
    Continue { replid: String },
}

/// Where a replica wants to continue from: the last replication id and offset it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub replid: String,
    pub offset: u64,
}

/// What the replication connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The replica link: the RDB or a continuation, then the stream for as long as it lasts.
    Link,
    /// A checkpoint: one RDB, then the connection is closed.
    Checkpoint,
}

/// Runs the handshake on an authenticated connection to the server of `version` (as
/// [`ServerVersion::query`] found it on this connection or another one just before).
pub async fn handshake(
    conn: &mut Conn,
    version: &ServerVersion,
    purpose: Purpose,
    from: Option<&Position>,
) -> Result<SyncStart, UpstreamError> {
    conn.expect_ok(write::command(["PING"])).await?;
    // Sent at once and answered in order, as Valkey's replicas send theirs: one round trip
    // while the connection is still an ordinary client's (a `CLIENT KILL TYPE normal`
    // takes it then). Whether the server knows `version` is its own business.
    // Over a Unix socket there is no address to name (Valkey shows the socket's path).
    let ip = conn.stream.local_addr().map(|a| a.ip().to_string());
    let version = version.number();
    // walrus serves no replicas of its own: port 0, as a replica without one would say.
    let mut replconf: Vec<(Vec<&str>, bool)> = vec![(vec!["listening-port", "0"], true)];
    if let Some(ip) = &ip {
        replconf.push((vec!["ip-address", ip], true));
    }
    replconf.extend([
        (vec!["capa", "eof", "capa", "psync2"], true),
        (vec!["version", &version], false),
    ]);
    if purpose == Purpose::Checkpoint {
        replconf.push((vec!["rdb-only", "1"], true));
    }
    let mut out = Vec::new();
    for (args, _) in &replconf {
        out.extend_from_slice(&write::command(
            std::iter::once("REPLCONF").chain(args.iter().copied()),
        ));
    }
    conn.stream_write(&out).await?;
    for (_, required) in &replconf {
        let reply = conn.read_frame().await?;
        if *required && reply.first() == Some(&b'-') {
            return Err(UpstreamError::Refused(reply));
        }
    }
    let psync = match from {
        Some(p) => write::command([
            b"PSYNC".as_slice(),
            p.replid.as_bytes(),
            (p.offset + 1).to_string().as_bytes(),
        ]),
        None => write::command(["PSYNC", "?", "-1"]),
    };
    conn.stream_write(&psync).await?;
    let line = read_line(conn).await?;
    parse_psync_reply(&line, from)
}

/// What the line answering PSYNC says; `from`: where the replica asked to continue.
pub fn parse_psync_reply(line: &str, from: Option<&Position>) -> Result<SyncStart, UpstreamError> {
    let bad = || UpstreamError::Decode(format!("unexpected PSYNC reply: {line:?}"));
    if let Some(rest) = line.strip_prefix("+FULLRESYNC ") {
        let (replid, offset) = rest.split_once(' ').ok_or_else(bad)?;
        if replid.len() != REPLID_LEN {
            return Err(bad());
        }
        let offset = offset.trim().parse().map_err(|_| bad())?;
        return Ok(SyncStart::Full {
            replid: replid.to_string(),
            offset,
        });
    }
    if let Some(rest) = line.strip_prefix("+CONTINUE") {
        let replid = rest.trim();
        let replid = if replid.is_empty() {
            from.map(|p| p.replid.clone()).ok_or_else(bad)?
        } else {
            replid.to_string()
        };
        if replid.len() != REPLID_LEN {
            return Err(bad());
        }
        return Ok(SyncStart::Continue { replid });
    }
    if line.starts_with('-') {
        return Err(UpstreamError::Refused(bytes::Bytes::from(format!(
            "{line}\r\n"
        ))));
    }
    Err(bad())
}

/// Sends `REPLCONF ACK <offset>`. The primary does not answer it. After an RDB it also
/// starts the command stream: Valkey holds the stream back until the replica's first ACK.
pub async fn ack(conn: &mut Conn, offset: u64) -> Result<(), UpstreamError> {
    conn.stream_write(&write::command([
        b"REPLCONF".as_slice(),
        b"ACK",
        offset.to_string().as_bytes(),
    ]))
    .await
}

/// Reads one `\r\n`-terminated line, skipping the bare `\n` keepalives a primary sends
/// while it prepares a reply or an RDB. Bytes after the line stay in the buffer.
pub async fn read_line(conn: &mut Conn) -> Result<String, UpstreamError> {
    loop {
        if let Some(line) = take_line(&mut conn.buf)? {
            return Ok(line);
        }
        conn.read_more().await?;
    }
}

/// [`read_line`] on the bytes read so far: the line, once `buf` holds all of it. A line
/// longer than a status line can be is refused, whether it came whole or not yet.
pub fn take_line(buf: &mut BytesMut) -> Result<Option<String>, UpstreamError> {
    /// A status line longer than this, its end included, is not one.
    const MAX_STATUS_LINE_BYTES: usize = 4096;
    while buf.first() == Some(&b'\n') {
        let _ = buf.split_to(1);
    }
    let end = buf.iter().position(|&b| b == b'\n');
    if end.unwrap_or(buf.len()) >= MAX_STATUS_LINE_BYTES {
        return Err(UpstreamError::Decode("status line too long".into()));
    }
    let Some(p) = end else {
        return Ok(None);
    };
    let line = buf.split_to(p + 1);
    let text = String::from_utf8_lossy(&line[..p])
        .trim_end_matches('\r')
        .to_string();
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn psync_replies() {
        assert_eq!(
            parse_psync_reply(&format!("+FULLRESYNC {ID} 1234"), None).unwrap(),
            SyncStart::Full {
                replid: ID.into(),
                offset: 1234
            }
        );
        let from = Position {
            replid: ID.into(),
            offset: 9,
        };
        assert_eq!(
            parse_psync_reply("+CONTINUE", Some(&from)).unwrap(),
            SyncStart::Continue { replid: ID.into() }
        );
        let other = "f".repeat(40);
        assert_eq!(
            parse_psync_reply(&format!("+CONTINUE {other}"), Some(&from)).unwrap(),
            SyncStart::Continue { replid: other }
        );
        assert!(parse_psync_reply("+FULLRESYNC abc 1", None).is_err());
        assert!(matches!(
            parse_psync_reply("-NOMASTERLINK Can't SYNC", None),
            Err(UpstreamError::Refused(_))
        ));
    }

    /// Found with the valkey_info target (fuzz/regressions/valkey_info/long-status-line): a
    /// long line was refused in parts but taken whole.
    #[test]
    fn status_lines_keep_to_their_limit_however_they_arrive() {
        let mut line = b"\n\n+FULLRESYNC ".to_vec();
        line.resize(2 + 4096, b'x');
        line.extend_from_slice(b"\r\n");
        for cut in [0, 100, 4095, 4096, line.len()] {
            let mut buf = BytesMut::from(&line[..cut]);
            let first = take_line(&mut buf);
            buf.extend_from_slice(&line[cut..]);
            let outcome = first.and_then(|_| take_line(&mut buf));
            assert!(outcome.is_err(), "cut at {cut}: {outcome:?}");
        }
        let mut buf = BytesMut::from(&b"\n+CONTINUE\r\nrest"[..]);
        assert_eq!(take_line(&mut buf).unwrap().as_deref(), Some("+CONTINUE"));
        assert_eq!(&buf[..], b"rest");
    }
}
