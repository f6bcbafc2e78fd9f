//! Valkey's `INFO` text, read here alone: `name:value` lines under `# Section` headers (and
//! `CLUSTER INFO`'s, which has the same form). What walrus reads of it: the server's version
//! and process ([`super::server`]), its replication state and dataset
//! ([`crate::valkey::view`]), its memory (checkpoints) and a cluster's state
//! ([`super::cluster`]).

use super::client::{frame_str, Conn, UpstreamError};
use std::str::FromStr;

/// One section of the server's INFO, as text.
pub async fn section(conn: &mut Conn, name: &str) -> Result<String, UpstreamError> {
    let reply = conn.call(["INFO", name]).await?;
    frame_str(&reply)
        .ok_or_else(|| UpstreamError::Decode(format!("unexpected INFO reply: {reply:?}")))
}

/// The value of `name` in an `INFO` section's text (`name:value` lines).
pub fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
}

/// The value of `name` in the text of `INFO section`, which must list it.
pub fn required<'a>(info: &'a str, section: &str, name: &str) -> Result<&'a str, UpstreamError> {
    field(info, name).ok_or_else(|| UpstreamError::Decode(format!("INFO {section} has no {name}")))
}

/// [`required`], read as a number.
pub fn number<T: FromStr>(info: &str, section: &str, name: &str) -> Result<T, UpstreamError> {
    required(info, section, name)?
        .parse()
        .map_err(|_| UpstreamError::Decode(format!("INFO {section}: bad {name}")))
}

/// The keys of every database, from `INFO keyspace` (a line each:
/// `db0:keys=12,expires=0,avg_ttl=0`). A count that cannot be read counts as more keys than
/// any: a Valkey is never taken for empty on a line walrus does not understand.
pub fn keys(keyspace: &str) -> u64 {
    keyspace
        .lines()
        .filter(|l| l.starts_with("db"))
        .filter_map(|l| {
            l.split(':')
                .nth(1)?
                .split(',')
                .next()?
                .strip_prefix("keys=")
        })
        .map(|n| n.trim().parse::<u64>().unwrap_or(u64::MAX))
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_numbers_and_keys_of_info_text() {
        let memory = "# Memory\r\nused_memory:1024\r\nused_memory_human:1.00K\r\nbad:x\r\n";
        assert_eq!(field(memory, "used_memory"), Some("1024"));
        assert_eq!(field(memory, "used_memory_human"), Some("1.00K"));
        assert_eq!(field(memory, "used"), None, "a whole name, not a prefix");
        assert_eq!(
            number::<u64>(memory, "memory", "used_memory").unwrap(),
            1024
        );
        let err = |r: Result<u64, UpstreamError>| r.unwrap_err().to_string();
        assert!(err(number(memory, "memory", "bad")).contains("INFO memory: bad bad"));
        assert!(err(number(memory, "memory", "none")).contains("INFO memory has no none"));
        assert_eq!(keys("# Keyspace\r\n"), 0);
        assert_eq!(
            keys("db0:keys=3,expires=1,avg_ttl=5\r\ndb5:keys=4,expires=0,avg_ttl=0\r\n"),
            7
        );
        assert_eq!(keys("db0:keys=many,expires=0\r\n"), u64::MAX);
    }
}
