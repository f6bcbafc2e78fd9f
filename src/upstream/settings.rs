//! The Valkey settings walrus needs, written once: managed mode starts valkey-server with
//! them; in external mode walrus reads them back with `CONFIG GET` at start-up and logs each
//! one that differs, with what it risks (or refuses to start, `upstream.strict_settings`).

use crate::upstream::client::{frame_str, Conn, UpstreamError};
use redis_protocol::resp2::types::OwnedFrame;

pub struct Setting {
    pub name: &'static str,
    /// The value, as given on valkey-server's command line.
    pub value: &'static str,
    /// The value as `CONFIG GET` shows it.
    pub shown: &'static str,
    /// What a different value risks.
    pub risk: &'static str,
}

pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "save",
        value: "",
        shown: "",
        risk: "Valkey forks and writes RDB snapshots walrus does not need (walrus is the persistence)",
    },
    Setting {
        name: "appendonly",
        value: "no",
        shown: "no",
        risk: "Valkey's own AOF makes its main thread wait for the disk, which walrus exists to avoid",
    },
    Setting {
        name: "repl-diskless-sync",
        value: "yes",
        shown: "yes",
        risk: "every attach and checkpoint writes an RDB to Valkey's disk first",
    },
    Setting {
        name: "repl-diskless-sync-delay",
        value: "0",
        shown: "0",
        risk: "every attach and checkpoint waits that many seconds for more replicas",
    },
    Setting {
        name: "repl-diskless-load",
        value: "on-empty-db",
        shown: "on-empty-db",
        risk: "a restore loads through a temporary file on Valkey's disk instead of straight from walrus",
    },
    Setting {
        name: "repl-backlog-size",
        value: "256mb",
        shown: "268435456",
        risk: "a short backlog turns any break of walrus's link into a full resynchronization",
    },
    Setting {
        name: "repl-backlog-ttl",
        value: "0",
        shown: "0",
        risk: "Valkey frees its backlog while walrus is away, forcing a full resynchronization",
    },
    Setting {
        name: "client-output-buffer-limit",
        value: "replica 0 0 0",
        shown: "replica 0 0 0",
        risk: "Valkey drops walrus's replica link under heavy writes (walrus bounds the lag itself)",
    },
    Setting {
        name: "min-replicas-to-write",
        value: "1",
        shown: "1",
        risk: "Valkey accepts writes while walrus's link is down (walrus refuses them too; this is the second line of defence)",
    },
    Setting {
        name: "min-replicas-max-lag",
        value: "10",
        shown: "10",
        risk: "Valkey's second line of defence uses another lag bound",
    },
    Setting {
        name: "maxmemory-policy",
        value: "noeviction",
        shown: "noeviction",
        risk: "Valkey evicts keys by itself, and a read may show a key gone before its eviction is durable",
    },
];

/// valkey-server arguments that apply every setting.
pub fn args() -> Vec<String> {
    SETTINGS
        .iter()
        .flat_map(|s| [format!("--{}", s.name), s.value.to_string()])
        .collect()
}

/// A setting that differs: its name, Valkey's value, walrus's and the risk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub name: &'static str,
    pub actual: String,
    pub wanted: &'static str,
    pub risk: &'static str,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Valkey's {} is {:?}, walrus needs {:?}: {}",
            self.name, self.actual, self.wanted, self.risk
        )
    }
}

/// Reads every setting with `CONFIG GET` and returns those that differ.
pub async fn check(conn: &mut Conn) -> Result<Vec<Difference>, UpstreamError> {
    let mut out = Vec::new();
    for s in SETTINGS {
        let reply = conn.call(["CONFIG", "GET", s.name]).await?;
        let actual = match &reply {
            OwnedFrame::Array(kv) => kv.get(1).and_then(frame_str),
            _ => None,
        }
        .ok_or_else(|| UpstreamError::Decode(format!("CONFIG GET {}: {reply:?}", s.name)))?;
        let shown = shown_value(s.name, &actual);
        if shown != s.shown {
            out.push(Difference {
                name: s.name,
                actual: shown,
                wanted: s.shown,
                risk: s.risk,
            });
        }
    }
    Ok(out)
}

/// The part of a value walrus cares about: for `client-output-buffer-limit`, the replica
/// class (Valkey shows all three classes, and older versions call it `slave`).
fn shown_value(name: &str, actual: &str) -> String {
    if name != "client-output-buffer-limit" {
        return actual.to_string();
    }
    let words: Vec<&str> = actual.split_whitespace().collect();
    words
        .chunks(4)
        .find(|c| c.len() == 4 && (c[0] == "replica" || c[0] == "slave"))
        .map(|c| format!("replica {} {} {}", c[1], c[2], c[3]))
        .unwrap_or_else(|| actual.to_string())
}

/// Whether Valkey connects to its primary with TLS (`tls-replication`): `None` when it
/// will not say (walrus's user may not run `CONFIG GET`). A server built without TLS has no
/// such setting, and answers with nothing: no.
pub async fn replicates_with_tls(conn: &mut Conn) -> Result<Option<bool>, UpstreamError> {
    match conn.call(["CONFIG", "GET", "tls-replication"]).await {
        Ok(OwnedFrame::Array(kv)) => Ok(Some(
            kv.get(1)
                .and_then(frame_str)
                .is_some_and(|v| v.eq_ignore_ascii_case("yes")),
        )),
        Ok(other) => Err(UpstreamError::Decode(format!(
            "CONFIG GET tls-replication: {other:?}"
        ))),
        Err(UpstreamError::Refused(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_buffer_limit_is_read_from_any_spelling() {
        let v = "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60";
        assert_eq!(
            shown_value("client-output-buffer-limit", v),
            "replica 268435456 67108864 60"
        );
        let v = "normal 0 0 0 replica 0 0 0 pubsub 33554432 8388608 60";
        assert_eq!(
            shown_value("client-output-buffer-limit", v),
            "replica 0 0 0"
        );
        assert_eq!(args()[..2], ["--save".to_string(), String::new()]);
    }
}
