//! The RDB of a full resynchronization stored durably: it becomes a checkpoint, from which a
//! restore can start. Valkey's protocol delivers it ([`rdb::receive`]); here it is written
//! under a temporary name, fsynced, renamed into place, and the directory fsynced: a crash
//! leaves either no file or the whole file.

use crate::upstream::client::{Conn, UpstreamError};
use crate::valkey::rdb::{self, RdbDigest, RdbSink, RdbSum};
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

/// A stored RDB.
#[derive(Debug, Clone)]
pub struct StoredRdb {
    pub path: PathBuf,
    pub bytes: u64,
    /// Valkey's CRC-64 of the RDB, checked against its trailer on arrival.
    pub crc64: u64,
    /// Its format version, from its header.
    pub version: u16,
    /// Sent in the diskless `$EOF:<mark>` form rather than with its length up front.
    pub eof_mark: bool,
}

/// Reads the RDB payload from `conn` into `dest`, through `dest`'s `.rdb.tmp` (which may
/// exist already, reserving the name), durably. On failure neither is left behind.
pub async fn receive(
    conn: &mut Conn,
    dest: &Path,
    max_bytes: u64,
) -> Result<StoredRdb, UpstreamError> {
    let tmp = dest.with_extension("rdb.tmp");
    let stored = store(conn, &tmp, dest, max_bytes).await;
    if stored.is_err() {
        // Refused, out of space or cut off: neither the partial file nor the reserved name
        // may keep the space they took.
        let _ = tokio::fs::remove_file(&tmp).await;
        let _ = tokio::fs::remove_file(dest).await;
    }
    stored
}

/// The body of [`receive`]: the payload into `tmp`, renamed to `dest`.
async fn store(
    conn: &mut Conn,
    tmp: &Path,
    dest: &Path,
    max_bytes: u64,
) -> Result<StoredRdb, UpstreamError> {
    let mut sink = Sink {
        file: tokio::fs::File::create(tmp).await?,
        written: 0,
    };
    let received = rdb::receive(conn, &mut sink, max_bytes).await?;
    crate::fault::fail_point!("rdb::written");
    sink.file.sync_all().await?;
    drop(sink);
    crate::fault::fail_point!("rdb::synced");
    tokio::fs::rename(tmp, dest).await?;
    crate::fault::fail_point!("rdb::renamed");
    if let Some(dir) = dest.parent() {
        tokio::fs::File::open(dir).await?.sync_all().await?;
    }
    Ok(StoredRdb {
        path: dest.to_path_buf(),
        bytes: received.sum.bytes,
        crc64: received.sum.crc64,
        version: received.sum.version,
        eof_mark: received.eof_mark,
    })
}

/// The file being written.
struct Sink {
    file: tokio::fs::File,
    written: u64,
}

impl RdbSink for Sink {
    async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        crate::fault::io_point!("rdb::write", self.written >= 64 << 10)?;
        self.file.write_all(data).await?;
        self.written += data.len() as u64;
        Ok(())
    }
}

/// Reads a stored RDB whole and checks its trailer (blocking).
pub fn sum_file(path: &Path) -> std::io::Result<RdbSum> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut d = RdbDigest::default();
    let mut buf = vec![0u8; crate::net::read_chunk::BULK];
    loop {
        match f.read(&mut buf)? {
            0 => break,
            n => d.update(&buf[..n]),
        }
    }
    d.finish()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
