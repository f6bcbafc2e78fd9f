//! Which server walrus is talking to: its name and version (`INFO server`), and the RDB
//! format it writes and loads (the version stamped in a `FUNCTION DUMP` payload).
//!
//! walrus needs both on every path that moves an RDB. As a replica it announces the
//! primary's own version (`REPLCONF version`), because Valkey 9 picks the RDB format per
//! replica: to one that announces nothing it sends the format of Valkey 7.2 (RDB 11), which
//! cannot hold a hash with field TTLs, and the save fails. As a primary during a restore it
//! must know, before it sends a byte, that the Valkey it loads reads the checkpoint's format
//! and runs every command the journal after it holds ([`ServerVersion::runs_all_of`]).
//!
//! The RDB format is asked of the server rather than looked up in a table of versions:
//! `FUNCTION DUMP` (Redis OSS 7.0 and every Valkey) ends with a two-byte RDB version, the one
//! the server writes, which is also the newest it loads.

use super::client::{Conn, UpstreamError};
use super::info;
use redis_protocol::resp2::types::OwnedFrame;
use std::fmt;

/// What walrus needs of a server, named in the refusal of one that lacks it.
pub const SUPPORTED: &str = "walrus needs Valkey, or Redis OSS 7.0 or later: it reads the key \
     specifications of COMMAND, which came with Redis 7.0";

/// A server's name and version, as `INFO server` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    /// Valkey (`true`) or Redis OSS.
    pub valkey: bool,
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl ServerVersion {
    /// Asks the server on `conn`.
    pub async fn query(conn: &mut Conn) -> Result<ServerVersion, UpstreamError> {
        ServerVersion::parse(&info::section(conn, "server").await?)
    }

    /// From `INFO server`: `valkey_version` where the server has one (Valkey also reports a
    /// `redis_version` of 7.2.4 for compatibility), `redis_version` otherwise.
    pub fn parse(info_server: &str) -> Result<ServerVersion, UpstreamError> {
        match info::field(info_server, "valkey_version") {
            Some(v) => ServerVersion::from_number(true, v),
            None => ServerVersion::from_number(
                false,
                info::field(info_server, "redis_version")
                    .ok_or_else(|| UpstreamError::Decode("INFO server names no version".into()))?,
            ),
        }
        .map_err(UpstreamError::Decode)
    }

    fn from_number(valkey: bool, text: &str) -> Result<ServerVersion, String> {
        let bad = || format!("cannot read the server version {text:?}");
        let mut parts = text.split('.').map(|p| p.parse::<u32>().map_err(|_| bad()));
        let mut next = || parts.next().unwrap_or_else(|| Err(bad()));
        Ok(ServerVersion {
            valkey,
            major: next()?,
            minor: next()?,
            patch: next()?,
        })
    }

    /// `x.y.z`, the form `REPLCONF version` takes.
    pub fn number(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch)
    }

    /// Refuses a server walrus cannot serve, naming what it lacks.
    pub fn check_supported(&self) -> Result<(), UpstreamError> {
        if !self.valkey && self.major < 7 {
            return Err(UpstreamError::Unsupported(format!("{self}: {SUPPORTED}")));
        }
        Ok(())
    }

    /// Whether this server runs every command `other` may have written into a journal (its
    /// own and older versions' commands): a later minor version of the same server, or a
    /// Valkey after Redis OSS up to 7.2, where Valkey forked. A patch release adds no
    /// commands.
    pub fn runs_all_of(&self, other: &ServerVersion) -> bool {
        let (mine, theirs) = ((self.major, self.minor), (other.major, other.minor));
        match (self.valkey, other.valkey) {
            (a, b) if a == b => mine >= theirs,
            (true, false) => theirs <= (7, 2),
            _ => false,
        }
    }
}

impl std::str::FromStr for ServerVersion {
    type Err = String;

    /// The displayed form, `Valkey 9.1.2` or `Redis 7.0.15`, as manifests record it.
    fn from_str(s: &str) -> Result<ServerVersion, String> {
        match s.split_once(' ') {
            Some(("Valkey", n)) => ServerVersion::from_number(true, n),
            Some(("Redis", n)) => ServerVersion::from_number(false, n),
            _ => Err(format!("not a server version: {s:?}")),
        }
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.valkey { "Valkey" } else { "Redis" };
        write!(f, "{name} {}", self.number())
    }
}

/// The RDB format the server on `conn` writes (and the newest it loads), from `FUNCTION
/// DUMP`. Error replies (`-LOADING`, an ACL refusal) come back as `Refused`, to be retried or
/// shown.
pub async fn rdb_format(conn: &mut Conn) -> Result<u16, UpstreamError> {
    let dump = conn.call(["FUNCTION", "DUMP"]).await?;
    match &dump {
        OwnedFrame::BulkString(b) => dump_rdb_version(b),
        _ => None,
    }
    .ok_or_else(|| UpstreamError::Decode(format!("unexpected FUNCTION DUMP reply {dump:?}")))
}

/// The RDB version in a DUMP or FUNCTION DUMP payload: the two bytes before its 8-byte CRC,
/// little-endian (`createDumpPayload` in Valkey's cluster.c, `functionDumpCommand`).
pub fn dump_rdb_version(payload: &[u8]) -> Option<u16> {
    let n = payload.len().checked_sub(10)?;
    Some(u16::from_le_bytes([payload[n], payload[n + 1]]))
}

/// The Valkey process on `conn` (`run_id`, new at every start): a connection that reaches
/// another process than the one the journal follows must not serve in its name.
pub async fn run_id(conn: &mut Conn) -> Result<String, UpstreamError> {
    run_id_of(&info::section(conn, "server").await?)
}

pub fn run_id_of(info_server: &str) -> Result<String, UpstreamError> {
    info::required(info_server, "server", "run_id").map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_info_server() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        let v = ServerVersion::parse(valkey).unwrap();
        assert_eq!((v.valkey, v.number()), (true, "9.1.2".into()));
        assert_eq!(v.to_string(), "Valkey 9.1.2");
        assert_eq!("Valkey 9.1.2".parse::<ServerVersion>().unwrap(), v);
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(
            ServerVersion::parse(redis).unwrap().to_string(),
            "Redis 7.0.15"
        );
        assert!(ServerVersion::parse("redis_version:7.x\r\n").is_err());
        assert!(ServerVersion::parse("# Server\r\n").is_err());
        assert!("Redis 6.2.14"
            .parse::<ServerVersion>()
            .unwrap()
            .check_supported()
            .is_err());
        assert!("Redis 7.0.15"
            .parse::<ServerVersion>()
            .unwrap()
            .check_supported()
            .is_ok());
    }

    #[test]
    fn which_server_runs_what_another_wrote() {
        let v = |s: &str| s.parse::<ServerVersion>().unwrap();
        assert!(v("Valkey 9.1.2").runs_all_of(&v("Valkey 9.1.0")));
        assert!(
            v("Valkey 9.1.0").runs_all_of(&v("Valkey 9.1.2")),
            "patch releases"
        );
        assert!(v("Valkey 9.1.2").runs_all_of(&v("Valkey 8.1.8")));
        assert!(
            !v("Valkey 9.0.0").runs_all_of(&v("Valkey 9.1.2")),
            "9.1 added commands"
        );
        assert!(!v("Valkey 8.1.8").runs_all_of(&v("Valkey 9.0.0")));
        assert!(v("Valkey 8.1.8").runs_all_of(&v("Redis 7.2.4")));
        assert!(!v("Valkey 8.1.8").runs_all_of(&v("Redis 7.4.0")));
        assert!(!v("Redis 7.2.4").runs_all_of(&v("Valkey 8.0.0")));
        assert!(v("Redis 7.2.4").runs_all_of(&v("Redis 7.0.15")));
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
