//! Where the clients' keys live. Every key carries one of two hash tags, `{gen}` and
//! `{gen2}`, and what one command or one transaction touches shares its tag: Valkey Cluster
//! refuses commands across slots. In cluster mode the two tags' slots (10060 and 1616) belong
//! to two different primaries when the cluster is created (`cluster.rs`), and slot moves
//! (`reshard.rs`) carry either anywhere; the clients follow (`route.rs`). Elsewhere the tags
//! mean nothing: one Valkey holds every key.

use crate::conn::Cmd;

pub const TAGS: [&str; 2] = ["gen", "gen2"];
/// A SCAN pattern matching every client key (and no key written around walrus).
pub const PATTERN: &str = "{gen*";
/// Pub/Sub's channel: not a key (a cluster broadcasts every PUBLISH to all its nodes).
pub const CHANNEL: &str = "{gen}:chan";

/// The tag (an index of `TAGS`) of the `i`th list, queue or counter, and of worker `i`'s
/// large values.
pub fn tag(i: usize) -> usize {
    i % TAGS.len()
}

fn key(tag_of: usize, what: std::fmt::Arguments) -> String {
    format!("{{{}}}:{what}", TAGS[tag(tag_of)])
}

pub fn list_key(i: usize) -> String {
    key(i, format_args!("l{i}"))
}

pub fn queue_key(i: usize) -> String {
    key(i, format_args!("q{i}"))
}

pub fn counter_key(i: usize) -> String {
    key(i, format_args!("c{i}"))
}

/// A worker's large values share its tag, so that one transaction may write them all.
pub fn big_key(worker: usize, slot: usize) -> String {
    key(worker, format_args!("big:{worker}:{slot}"))
}

/// The tag's part of a client key (`{gen}:` or `{gen2}:`) and what follows, if it is one.
fn parts(key: &str) -> Option<&str> {
    TAGS.iter()
        .find_map(|t| key.strip_prefix('{')?.strip_prefix(t)?.strip_prefix("}:"))
}

pub fn is_client_key(key: &str) -> bool {
    parts(key).is_some()
}

/// Queues (popped empty, they vanish), registers (deleted) and expiring keys come and go;
/// every other client key stays.
pub fn comes_and_goes(key: &str) -> bool {
    parts(key).is_some_and(|rest| rest.starts_with(['q', 'r', 'x']))
}

/// Where jobs that BLMOVE takes from the queues of tag `t` go.
pub fn done_key(t: usize) -> String {
    format!("{{{}}}:done", TAGS[t])
}

/// The indexes below `n` whose keys share `i`'s tag, from `i` on (wrapping around).
pub fn same_tag(i: usize, n: usize) -> Vec<usize> {
    (0..n)
        .map(|k| (i + k) % n)
        .filter(|&k| tag(k) == tag(i))
        .collect()
}

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag (or of the whole key without
/// one), modulo 16384, as Valkey computes it.
pub fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The slot of tag `t`.
pub fn tag_slot(t: usize) -> u16 {
    slot(format!("{{{}}}", TAGS[t]).as_bytes())
}

/// The key a command of the workload is routed by, if it has one: the first argument, but
/// for scripts (their first key) and the commands without keys.
pub fn routing_key(c: &Cmd) -> Option<&[u8]> {
    let name = String::from_utf8_lossy(&c[0]).to_ascii_uppercase();
    match name.as_str() {
        "EVAL" | "EVAL_RO" | "EVALSHA" => {
            let keys: usize = std::str::from_utf8(c.get(2)?).ok()?.parse().ok()?;
            (keys > 0).then(|| c.get(3).map(Vec::as_slice)).flatten()
        }
        "MULTI" | "EXEC" | "DISCARD" | "ASKING" | "DBSIZE" | "INFO" | "RANDOMKEY" | "SCAN"
        | "PUBLISH" | "SUBSCRIBE" | "PING" => None,
        _ => c.get(1).map(Vec::as_slice),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_valkeys() {
        // CLUSTER KEYSLOT's answers.
        assert_eq!(tag_slot(0), 10060);
        assert_eq!(tag_slot(1), 1616);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(list_key(3).as_bytes()), tag_slot(1));
    }
}
