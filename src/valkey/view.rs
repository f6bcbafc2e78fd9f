//! What walrus learns about a Valkey from `INFO`: its version, its process, its place in
//! replication and how many keys it holds. Every attach decides from this view what to do
//! with the Valkey it finds ([`crate::restore::decide`]).

use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::info;
use crate::upstream::server::{run_id_of, ServerVersion};

/// Valkey's version, replication state and dataset size, from `INFO server`, `INFO
/// replication` and `INFO keyspace`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValkeyView {
    pub version: ServerVersion,
    /// The process (`run_id`): a restarted Valkey has another.
    pub run_id: String,
    pub primary: bool,
    /// A primary's own id; a replica's is its primary's.
    pub replid: String,
    pub replid2: String,
    /// `second_repl_offset`: `replid2` is valid for offsets below it (-1: none).
    pub second_offset: i64,
    pub offset: u64,
    pub keys: u64,
}

impl ValkeyView {
    pub async fn query(conn: &mut Conn) -> Result<ValkeyView, UpstreamError> {
        let server = info::section(conn, "server").await?;
        let repl = info::section(conn, "replication").await?;
        let keyspace = info::section(conn, "keyspace").await?;
        ValkeyView::parse(&server, &repl, &keyspace)
    }

    pub fn parse(
        server: &str,
        replication: &str,
        keyspace: &str,
    ) -> Result<ValkeyView, UpstreamError> {
        let field = |name: &str| info::required(replication, "replication", name);
        let num = |name: &str| info::number::<i64>(replication, "replication", name);
        Ok(ValkeyView {
            version: ServerVersion::parse(server)?,
            run_id: run_id_of(server)?,
            primary: field("role")? == "master",
            replid: field("master_replid")?.to_string(),
            replid2: field("master_replid2")?.to_string(),
            second_offset: num("second_repl_offset")?,
            offset: num("master_repl_offset")?.max(0) as u64,
            keys: info::keys(keyspace),
        })
    }

    /// Names Valkey's state in log lines and errors.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}) holds {} keys of history {} at offset {}",
            self.version,
            if self.primary { "primary" } else { "replica" },
            self.keys,
            self.replid,
            self.offset
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_info() {
        let repl = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:3c1d\r\nmaster_replid2:0000\r\nmaster_repl_offset:1234\r\nsecond_repl_offset:-1\r\n";
        let ks =
            "# Keyspace\r\ndb0:keys=3,expires=1,avg_ttl=5\r\ndb5:keys=4,expires=0,avg_ttl=0\r\n";
        let server = "valkey_version:9.1.2\r\nrun_id:9d2e\r\n";
        let v = ValkeyView::parse(server, repl, ks).unwrap();
        assert_eq!(
            v,
            ValkeyView {
                version: "Valkey 9.1.2".parse().unwrap(),
                run_id: "9d2e".into(),
                primary: true,
                replid: "3c1d".into(),
                replid2: "0000".into(),
                second_offset: -1,
                offset: 1234,
                keys: 7,
            }
        );
        assert!(ValkeyView::parse(server, "role:master\r\n", "").is_err());
        assert!(ValkeyView::parse("valkey_version:9.1.2\r\n", repl, ks).is_err());
    }
}
