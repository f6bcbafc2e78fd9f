//! Which server walrus is talking to: its name and version (`INFO server`) and the RDB format
//! it writes and loads (the version stamped in a `FUNCTION DUMP` payload).
//!
//! walrus needs both on every path that moves an RDB. As a replica it announces the
//! primary's own version (`REPLCONF version`), because Valkey 9 picks the RDB format per
//! replica: to one that announces nothing it sends the format of Valkey 7.2 (RDB 11), which
//! cannot hold a hash with field TTLs, and the save fails. As a primary during a restore it
//! must know that the Valkey it loads can read the checkpoint's format before it sends a byte.
//!
//! The RDB format is asked of the server rather than looked up in a table of versions:
//! `FUNCTION DUMP` (Redis OSS 7.0 and every Valkey) ends with a two-byte RDB version, the one
//! the server writes, which is also the newest it loads.

use super::client::{frame_str, Conn, UpstreamError};
use std::fmt;

/// What walrus needs of a server, named in the refusal of one that lacks it.
pub const SUPPORTED: &str = "walrus needs Valkey, or Redis OSS 7.0 or later";

/// A server's name and version, as `INFO server` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    /// `valkey` or `redis`.
    pub name: String,
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl ServerVersion {
    /// From `INFO server`: `valkey_version` where the server has one (Valkey also reports a
    /// `redis_version` of 7.2.4 for compatibility), `redis_version` otherwise.
    pub fn parse(info_server: &str) -> Result<ServerVersion, String> {
        let field = |name: &str| {
            info_server
                .lines()
                .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
        };
        let (name, text) = match field("valkey_version") {
            Some(v) => ("valkey", v),
            None => (
                "redis",
                field("redis_version").ok_or("INFO server names no version")?,
            ),
        };
        let bad = || format!("INFO server: cannot read the version {text:?}");
        let mut parts = text.split('.').map(|p| p.parse::<u32>().map_err(|_| bad()));
        let mut next = || parts.next().unwrap_or_else(|| Err(bad()));
        Ok(ServerVersion {
            name: name.into(),
            major: next()?,
            minor: next()?,
            patch: next()?,
        })
    }

    /// `x.y.z`, the form `REPLCONF version` takes.
    pub fn number(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name == "valkey" {
            "Valkey"
        } else {
            "Redis"
        };
        write!(f, "{name} {}", self.number())
    }
}

/// The server walrus is connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub version: ServerVersion,
    /// The RDB format version it writes (and the newest it loads).
    pub rdb_version: u16,
}

impl Server {
    /// Asks the server on `conn`. A server without `FUNCTION DUMP` (older than Redis 7.0)
    /// is one walrus cannot serve: the error says so.
    pub async fn query(conn: &mut Conn) -> Result<Server, UpstreamError> {
        let version = ServerVersion::parse(&info(conn, "server").await?)
            .map_err(UpstreamError::Decode)?;
        let dump = match conn.call(["FUNCTION", "DUMP"]).await {
            Ok(frame) => frame,
            Err(UpstreamError::Refused(e)) => {
                return Err(UpstreamError::Unsupported(format!(
                    "{version} answers FUNCTION DUMP with {:?}: {SUPPORTED}",
                    String::from_utf8_lossy(&e).trim_end()
                )))
            }
            Err(e) => return Err(e),
        };
        let rdb_version = match &dump {
            redis_protocol::resp2::types::OwnedFrame::BulkString(b) => dump_rdb_version(b),
            _ => None,
        }
        .ok_or_else(|| UpstreamError::Decode(format!("unexpected FUNCTION DUMP reply {dump:?}")))?;
        Ok(Server {
            version,
            rdb_version,
        })
    }
}

/// The RDB version in a DUMP or FUNCTION DUMP payload: the two bytes before its 8-byte CRC,
/// little-endian (`createDumpPayload` in Valkey's cluster.c, `functionDumpCommand`).
pub fn dump_rdb_version(payload: &[u8]) -> Option<u16> {
    let n = payload.len().checked_sub(10)?;
    Some(u16::from_le_bytes([payload[n], payload[n + 1]]))
}

/// One section of the server's INFO, as text.
pub async fn info(conn: &mut Conn, section: &str) -> Result<String, UpstreamError> {
    let reply = conn.call(["INFO", section]).await?;
    frame_str(&reply)
        .ok_or_else(|| UpstreamError::Decode(format!("unexpected INFO reply: {reply:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_info_server() {
        let valkey = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        let v = ServerVersion::parse(valkey).unwrap();
        assert_eq!((v.name.as_str(), v.number()), ("valkey", "9.1.2".into()));
        assert_eq!(v.to_string(), "Valkey 9.1.2");
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(ServerVersion::parse(redis).unwrap().to_string(), "Redis 7.0.15");
        assert!(ServerVersion::parse("redis_version:7.x\r\n").is_err());
        assert!(ServerVersion::parse("# Server\r\n").is_err());
    }

    #[test]
    fn rdb_version_from_function_dump() {
        // What Valkey 9.1.2, Valkey 8.1.8 and Redis 7.0.15 answer with no functions loaded.
        for (hex, v) in [
            ("500092b195d1912dc52e", 80),
            ("0b003444e133f2e04b53", 11),
            ("0a005d9b5c400f7fa2da", 10),
        ] {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            assert_eq!(dump_rdb_version(&bytes), Some(v));
        }
        assert_eq!(dump_rdb_version(b"short"), None);
    }
}
