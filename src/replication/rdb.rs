//! Receiving the RDB of a full resynchronization and storing it durably: it is walrus's first
//! checkpoint, from which a restore can start.
//!
//! The primary announces the payload as `$<len>\r\n` followed by exactly `len` bytes (no
//! trailing CRLF), or, for a diskless transfer of unknown size, as `$EOF:<40-byte mark>\r\n`
//! followed by the payload and then the mark itself. Either way, bytes that follow the
//! payload in the same read already belong to the command stream and stay in the
//! connection's buffer. The file is written under a temporary name, fsynced, renamed into
//! place, and the directory fsynced: a crash leaves either no file or the whole file.

use super::handshake::read_line;
use crate::upstream::client::{Conn, UpstreamError};
use bytes::Buf;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const EOF_MARK_LEN: usize = 40;
const READ_CHUNK_BYTES: usize = 256 << 10;

/// A stored RDB.
#[derive(Debug, Clone)]
pub struct StoredRdb {
    pub path: PathBuf,
    pub bytes: u64,
    /// Sent in the diskless `$EOF:<mark>` form rather than with its length up front.
    pub eof_mark: bool,
}

/// Reads the RDB payload from `conn` into `dest`, durably.
pub async fn receive(
    conn: &mut Conn,
    dest: &Path,
    max_bytes: u64,
) -> Result<StoredRdb, UpstreamError> {
    let header = read_line(conn).await?;
    if header.starts_with('-') {
        return Err(UpstreamError::Refused(bytes::Bytes::from(format!(
            "{header}\r\n"
        ))));
    }
    let tmp = dest.with_extension("rdb.tmp");
    let mut file = tokio::fs::File::create(&tmp).await?;
    let eof_mark = header.starts_with("$EOF:");
    let bytes = if let Some(mark) = header.strip_prefix("$EOF:") {
        let mark = mark.as_bytes();
        if mark.len() != EOF_MARK_LEN {
            return Err(UpstreamError::Decode(format!(
                "bad RDB EOF mark in {header:?}"
            )));
        }
        copy_until_mark(conn, &mut file, mark, max_bytes).await?
    } else {
        let len: u64 = header
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| UpstreamError::Decode(format!("bad RDB header {header:?}")))?;
        if len > max_bytes {
            return Err(UpstreamError::Decode(format!(
                "RDB of {len} bytes exceeds the limit of {max_bytes}"
            )));
        }
        copy_exact(conn, &mut file, len).await?;
        len
    };
    file.sync_all().await?;
    drop(file);
    tokio::fs::rename(&tmp, dest).await?;
    if let Some(dir) = dest.parent() {
        tokio::fs::File::open(dir).await?.sync_all().await?;
    }
    Ok(StoredRdb {
        path: dest.to_path_buf(),
        bytes,
        eof_mark,
    })
}

async fn copy_exact(
    conn: &mut Conn,
    file: &mut tokio::fs::File,
    len: u64,
) -> Result<(), UpstreamError> {
    let mut left = len;
    loop {
        let take = (conn.buf.len() as u64).min(left) as usize;
        file.write_all(&conn.buf[..take]).await?;
        conn.buf.advance(take);
        left -= take as u64;
        if left == 0 {
            return Ok(());
        }
        conn.buf.reserve(READ_CHUNK_BYTES);
        if conn.stream.read_buf(&mut conn.buf).await? == 0 {
            return Err(UpstreamError::Closed);
        }
    }
}

async fn copy_until_mark(
    conn: &mut Conn,
    file: &mut tokio::fs::File,
    mark: &[u8],
    max_bytes: u64,
) -> Result<u64, UpstreamError> {
    let mut written = 0u64;
    loop {
        if let Some(at) = find(&conn.buf, mark) {
            file.write_all(&conn.buf[..at]).await?;
            conn.buf.advance(at + mark.len());
            return Ok(written + at as u64);
        }
        // Everything but a possible start of the mark is payload.
        let safe = conn.buf.len().saturating_sub(mark.len() - 1);
        file.write_all(&conn.buf[..safe]).await?;
        conn.buf.advance(safe);
        written += safe as u64;
        if written > max_bytes {
            return Err(UpstreamError::Decode(format!(
                "RDB exceeds the limit of {max_bytes} bytes"
            )));
        }
        conn.buf.reserve(READ_CHUNK_BYTES);
        if conn.stream.read_buf(&mut conn.buf).await? == 0 {
            return Err(UpstreamError::Closed);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .find(|&i| hay[i] == needle[0] && &hay[i..i + needle.len()] == needle)
}
