//! How a request relates to durability: free, a read of some keys, or a write of some keys.
//!
//! Mostly decided from Valkey's own command table (flags and key specs); the exceptions are
//! written here, each with why:
//! - scripts and functions may touch undeclared keys in any database: they touch everything
//!   (only reading it, for an EVAL whose shebang declares `no-writes`: Valkey refuses its
//!   writes);
//! - SCRIPT KILL and FUNCTION KILL stop a script that has written nothing (Valkey refuses to
//!   kill one that has: `-UNKILLABLE`): they change no data and show none; FUNCTION STATS
//!   shows how many functions the dataset holds: it reads everything, and writes nothing;
//! - MOVE and COPY ... DB write a database their key specs do not name;
//! - FLUSHDB empties one database;
//! - a command with no key arguments that is neither a write nor flagged `readonly` may
//!   still show data (INFO keyspace, SLOWLOG GET, COMMANDLOG GET, MEMORY STATS, DEBUG, a
//!   command a newer Valkey adds), or counts and sizes of the writes Valkey ran (INFO stats,
//!   memory, persistence, replication, commandstats; ROLE's offset; CLIENT LIST; MEMORY
//!   MALLOC-STATS; LATENCY HISTOGRAM):
//!   it reads the keyspace as a whole, unless it is known to reveal nothing
//!   ([`reveals_nothing`]: a short list, and Pub/Sub).

use super::dirty::Scope;
use crate::commands::Keys;
use bytes::Bytes;

/// How a request relates to durability, decided from its classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Reveals no data: released at once (PING, CLIENT ..., CONFIG GET, ...).
    Free,
    /// Reads what `Scope` covers.
    Read(Scope),
    /// May change what `Scope` covers.
    Write(Scope),
}

/// Keys from a request larger than this are copied, so that a held dirty-key mark does not
/// keep a large request (a 64 MiB SET) in memory.
const COPY_KEYS_ABOVE_BYTES: usize = 64 << 10;

/// Decides a request's [`Access`] (the rules in the module doc).
pub fn access(class: &crate::commands::Class, args: &[Bytes], raw_len: usize, db: u32) -> Access {
    let keys = |idx: &[usize]| -> Vec<Bytes> {
        idx.iter()
            .map(|&i| {
                if raw_len > COPY_KEYS_ABOVE_BYTES {
                    Bytes::copy_from_slice(&args[i])
                } else {
                    args[i].clone()
                }
            })
            .collect()
    };
    let Some(info) = &class.info else {
        return Access::Write(Scope::All);
    };
    match info.name.as_str() {
        "script|kill" | "function|kill" => return Access::Free,
        "function|stats" => return Access::Read(Scope::All),
        _ => {}
    }
    // Scripts and functions (Valkey flags them `no_mandatory_keys`) may touch keys they do
    // not declare, in any database: standalone Valkey allows it. Whatever they declare,
    // they count as touching everything.
    if info.flags.no_mandatory_keys {
        return if class.may_write && !declares_no_writes(&info.name, args) {
            Access::Write(Scope::All)
        } else {
            Access::Read(Scope::All)
        };
    }
    if class.may_write {
        let scope = match &class.keys {
            // MOVE and COPY ... DB write a key in another database, which key specs do not
            // describe: they may touch anything.
            _ if matches!(info.name.as_str(), "move" | "copy") => Scope::All,
            Keys::Args(idx) if !idx.is_empty() => Scope::Keys {
                db,
                keys: keys(idx),
            },
            // FLUSHDB empties one database; every other keyless write (FLUSHALL, SWAPDB,
            // scripts declaring no keys, FUNCTION ...) may touch anything.
            Keys::Args(_) if info.name == "flushdb" => Scope::Db(db),
            _ => Scope::All,
        };
        return Access::Write(scope);
    }
    match &class.keys {
        Keys::Args(idx) if !idx.is_empty() => Access::Read(Scope::Keys {
            db,
            keys: keys(idx),
        }),
        // Read-only commands without key arguments read the keyspace as a whole (KEYS, SCAN,
        // DBSIZE, RANDOMKEY); so does any other keyless command, unless it is known to
        // reveal nothing: a command walrus does not know about waits, it does not leak.
        Keys::Args(_) if !info.flags.readonly && reveals_nothing(info, args) => Access::Free,
        Keys::Args(_) | Keys::Unknown => Access::Read(Scope::All),
    }
}

/// Keyless commands (neither writes nor `readonly`) that show nothing of the dataset, nor
/// how many writes Valkey ran or how large they were, so that their replies need not wait
/// for pending writes: connection and transaction control, server configuration and
/// introspection that lists no keys or values, and Pub/Sub (channels and messages are not
/// the dataset; what PUBLISH delivers is a side effect, as in a restore). A count or a size
/// of writes a crash can still lose (used_memory, commandstats' calls, a client's query
/// buffer, the replication offset in ROLE and INFO replication) would show them as surely
/// as a key count does.
fn reveals_nothing(info: &crate::commands::CommandInfo, args: &[Bytes]) -> bool {
    if info.flags.pubsub {
        return true;
    }
    let name = info.name.as_str();
    if name == "info" {
        // Sections a newer Valkey adds wait.
        const FREE: [&str; 5] = ["server", "clients", "cpu", "modules", "cluster"];
        let sections = &args[1..];
        return !sections.is_empty()
            && sections
                .iter()
                .all(|s| FREE.iter().any(|f| s.eq_ignore_ascii_case(f.as_bytes())));
    }
    let container = name.split('|').next().unwrap_or(name);
    match container {
        // Connection and transaction control; answers about the server, not the data.
        "ping" | "echo" | "time" | "lastsave" | "lolwut" | "hello" | "auth" | "select" | "quit"
        | "reset" | "multi" | "discard" | "unwatch" | "wait" | "waitaof" | "readonly"
        | "readwrite" | "asking" | "save" | "bgsave" | "bgrewriteaof" => true,
        // Every subcommand of these describes commands, clients, users, settings or
        // timings: no key and no value; but CLIENT LIST and INFO show each connection's
        // buffers and last command, and LATENCY HISTOGRAM counts each command's calls.
        // (SCRIPT and FUNCTION are `@scripting`: walrus counts them as writes of everything,
        // but for their KILL and STATS: see `access`.)
        "client" => !matches!(name, "client|list" | "client|info"),
        "latency" => name != "latency|histogram",
        "command" | "config" | "acl" | "module" => true,
        // Some subcommands of these show data (MEMORY STATS counts keys, SLOWLOG GET and
        // COMMANDLOG GET show arguments, MALLOC-STATS and DOCTOR the allocator's sizes).
        "memory" => matches!(name, "memory|help" | "memory|purge"),
        "slowlog" | "commandlog" => !name.ends_with("|get"),
        "object" => name == "object|help",
        // The cluster's topology and state, which lives in nodes.conf, not in the journal:
        // cluster clients refresh it while a shard's writes wait (a full ring), and must
        // not wait with them (CLUSTER SHARDS shows replication offsets all the same).
        // Counting or listing a slot's keys shows data (SLOT-STATS counts them too).
        "cluster" => !matches!(
            name,
            "cluster|countkeysinslot" | "cluster|getkeysinslot" | "cluster|slot-stats"
        ),
        _ => false,
    }
}

/// An EVAL whose script starts with a shebang declaring `flags=no-writes`
/// (`#!lua flags=no-writes,...`): Valkey refuses any write it attempts.
fn declares_no_writes(name: &str, args: &[Bytes]) -> bool {
    let Some(body) = args.get(1).filter(|_| name == "eval") else {
        return false;
    };
    let Some(shebang) = body.strip_prefix(b"#!") else {
        return false;
    };
    let line = shebang.split(|&b| b == b'\n').next().unwrap_or_default();
    String::from_utf8_lossy(line)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("flags="))
        .any(|flags| flags.split(',').any(|f| f == "no-writes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(body: &str) -> Vec<Bytes> {
        vec![
            Bytes::from_static(b"EVAL"),
            Bytes::copy_from_slice(body.as_bytes()),
        ]
    }

    #[test]
    fn only_an_eval_shebang_declaring_no_writes_counts() {
        assert!(declares_no_writes(
            "eval",
            &eval("#!lua flags=no-writes\nreturn 1")
        ));
        assert!(declares_no_writes(
            "eval",
            &eval("#!lua flags=allow-stale,no-writes\nreturn 1")
        ));
        assert!(!declares_no_writes("eval", &eval("#!lua\nreturn 1")));
        assert!(!declares_no_writes(
            "eval",
            &eval("return 1 -- flags=no-writes")
        ));
        assert!(!declares_no_writes(
            "eval",
            &eval("#!lua flags=allow-oom\nreturn 'no-writes'")
        ));
        assert!(!declares_no_writes(
            "evalsha",
            &eval("#!lua flags=no-writes\n")
        ));
    }
}
