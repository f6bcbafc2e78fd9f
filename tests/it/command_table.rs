//! The whole command table of the server under test, not only the commands someone thought
//! of: every command and subcommand in its `COMMAND LIST` is sent through walrus by some
//! test in tests/ (found in their sources as `"NAME"`, or `"CONTAINER", "SUB"`), or is
//! excused below with its reason. A new Valkey version's new commands fail the first test
//! until someone compares them; the second compares, byte for byte against a direct Valkey
//! of the same version, the commands no other suite sends.
use crate::common;
use common::*;

use std::collections::BTreeSet;

/// Commands not sent through walrus by any test, and why. A name ending in `|*` covers
/// every subcommand of its container. (The scan skips this list.)
// excused: begin
const EXCUSED: &[(&str, &str)] = &[
    ("cluster", "cluster mode: walrus serves one standalone Valkey (Valkey Cluster is its own issue)"),
    ("cluster|*", "cluster mode, as CLUSTER"),
    ("clusterscan", "cluster mode, as CLUSTER"),
    ("readonly", "cluster mode, as CLUSTER"),
    ("readwrite", "cluster mode, as CLUSTER"),
    ("asking", "cluster mode, as CLUSTER"),
    ("restore-asking", "cluster slot migration, as CLUSTER"),
    ("migrate", "moves keys to another server, which walrus does not front"),
    ("role", "walrus is Valkey's replica: ROLE through walrus shows it, by design"),
    ("replicaof", "administration of replication, which walrus owns (its own restore uses it)"),
    ("slaveof", "as REPLICAOF"),
    ("failover", "as REPLICAOF"),
    ("shutdown", "stops the server; managed mode restarts and restores it (tests/it/restore.rs kills it instead)"),
    ("monitor", "refused by walrus unless proxy.allow_monitor (tests/it/side_channels.rs): it shows writes before they are durable"),
    ("bgsave", "persistence administration: walrus is the persistence"),
    ("bgrewriteaof", "as BGSAVE"),
    ("module|load", "no module is installed with the servers of the matrix"),
    ("module|loadex", "as MODULE LOAD"),
    ("module|unload", "as MODULE LOAD"),
    ("pfdebug", "a debugging command of HyperLogLog internals"),
    ("pfselftest", "a self-test of the server's HyperLogLog code"),
    ("lolwut", "draws random art"),
    ("latency|*", "this server's own timings: differ between any two servers"),
    ("latency", "as LATENCY's subcommands"),
    ("commandlog|*", "this server's own timings and requests: differ between any two servers"),
    ("commandlog", "as COMMANDLOG's subcommands"),
    ("slowlog|len", "this server's own timings"),
    ("slowlog|reset", "this server's own timings"),
    ("memory|doctor", "this server's own allocator figures"),
    ("memory|malloc-stats", "this server's own allocator figures"),
    ("memory|stats", "this server's own allocator figures"),
    ("memory|purge", "this server's own allocator"),
    ("config|resetstat", "resets the server's statistics, walrus's connections' included"),
    ("config|rewrite", "needs a configuration file; the tests' servers run from arguments"),
    ("client|pause", "pauses every client of the server, walrus's replica link included"),
    ("client|unpause", "as CLIENT PAUSE"),
    ("client|import-source", "marks a connection as an import source (Valkey 9 migration), not a client's"),
    ("client|unblock", "needs another connection's id, which differs between servers"),
    ("client|reply", "changes which replies follow; a pinned session's, not yet compared"),
    ("client|tracking", "its invalidations wait for the journal (tests/it/side_channels.rs), later than a Valkey alone sends them: not compared"),
    ("client|caching", "as CLIENT TRACKING"),
    ("client|capa", "as CLIENT TRACKING (redirect capability)"),
    ("script|debug", "the interactive Lua debugger (YES and SYNC refused by walrus, src/proxy/admin.rs: it runs code walrus cannot check)"),
    ("acl|save", "needs an ACL file; the tests' servers have none"),
    ("acl|load", "as ACL SAVE"),
    ("acl|genpass", "random"),
    ("function|restore", "refused by walrus (src/proxy/admin.rs): its payload's libraries cannot be checked for set_repl"),
];
// excused: end

fn excused(name: &str) -> bool {
    EXCUSED.iter().any(|(e, _)| {
        *e == name
            || e.strip_suffix("|*")
                .is_some_and(|c| name.strip_prefix(c).is_some_and(|r| r.starts_with('|')))
    })
}

/// The lower-cased sources of every test, this file without its list of excuses.
fn test_sources() -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut text = String::new();
    for sub in [dir.clone(), dir.join("it"), dir.join("common")] {
        for e in std::fs::read_dir(sub).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "rs") {
                let mut s = std::fs::read_to_string(&p).unwrap();
                if let (Some(a), Some(b)) = (s.find("// excused: begin"), s.find("// excused: end"))
                {
                    s.replace_range(a..b, "");
                }
                text.push_str(&s.to_lowercase());
            }
        }
    }
    text
}

fn command_list(addr: &str) -> Vec<String> {
    let reply = Raw::connect(addr).cmd(&["COMMAND", "LIST"]);
    match decode(&reply) {
        redis_protocol::resp2::types::OwnedFrame::Array(items) => items
            .into_iter()
            .map(|f| match f {
                redis_protocol::resp2::types::OwnedFrame::BulkString(b) => {
                    String::from_utf8(b).unwrap().to_lowercase()
                }
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("COMMAND LIST: {other:?}"),
    }
}

#[test]
fn every_command_in_the_servers_table_is_tested_through_walrus_or_excused() {
    let v = Valkey::start();
    let sources = test_sources();
    let sent = |name: &str| match name.split_once('|') {
        Some((c, s)) => sources.contains(&format!("\"{c}\", \"{s}\"")),
        None => sources.contains(&format!("\"{name}\"")),
    };
    let missing: BTreeSet<String> = command_list(&v.addr())
        .into_iter()
        .filter(|c| !sent(c) && !excused(c))
        .collect();
    assert!(
        missing.is_empty(),
        "{} has commands no test sends through walrus; compare them in \
         the_rest_of_the_table_answers_as_valkey_does, or excuse them with a reason: {missing:?}",
        server::under_test()
    );
}

/// Whether the server has a command (`container|sub` for a subcommand).
fn known(p: &mut Pair, name: &str) -> bool {
    let r = p.a.cmd(&["COMMAND", "INFO", name]);
    !r.starts_with(b"*1\r\n*-1") && !r.starts_with(b"*1\r\n$-1") && !r.starts_with(b"-")
}

#[test]
fn the_rest_of_the_table_answers_as_valkey_does() {
    let twins = Twins::start();
    let mut p = twins.pair();
    let at = "4102444800"; // 2100-01-01: absolute times compare exactly.
                           // Strings and keys.
    p.ok(&["SET", "s", "hello"]);
    p.ok(&["GETSET", "s", "world"]);
    p.ok(&["SUBSTR", "s", "1", "3"]);
    p.ok(&["EXPIREAT", "s", at]);
    p.ok(&["EXPIRETIME", "s"]);
    p.ok(&["PEXPIRETIME", "s"]);
    p.ok(&["PEXPIRE", "s", "100000000", "GT"]);
    p.ok(&["OBJECT", "HELP"]);
    p.err(&["OBJECT", "FREQ", "s"]);
    p.ok(&["MEMORY", "USAGE", "s"]);
    p.ok(&["MEMORY", "HELP"]);
    if known(&mut p, "msetex") {
        p.ok(&["MSETEX", "2", "m1", "x", "m2", "y", "EXAT", at]);
        p.ok(&["MGET", "m1", "m2"]);
    }
    // Lists, blocking forms that find data.
    p.ok(&["RPUSHX", "nolist", "x"]);
    p.ok(&["RPUSH", "l", "a", "b", "c"]);
    p.ok(&["RPUSHX", "l", "d"]);
    p.ok(&["BRPOPLPUSH", "l", "l2", "1"]);
    p.ok(&["LRANGE", "l2", "0", "-1"]);
    // Hashes.
    p.ok(&["HMSET", "h", "f1", "1", "f2", "2", "f3", "3"]);
    if known(&mut p, "hexpireat") {
        p.ok(&["HEXPIREAT", "h", at, "FIELDS", "1", "f1"]);
    }
    if known(&mut p, "hgetdel") {
        p.ok(&["HGETDEL", "h", "FIELDS", "2", "f2", "nope"]);
    }
    p.ok(&["HGETALL", "h"]);
    // Sets.
    p.ok(&["SADD", "s1", "a", "b", "c"]);
    p.ok(&["SADD", "s2", "b", "c", "d"]);
    p.same_unordered(&["SINTER", "s1", "s2"]);
    p.same_unordered(&["SUNION", "s1", "s2"]);
    p.same_unordered(&["SDIFF", "s1", "s2"]);
    // Sorted sets.
    p.ok(&["ZADD", "z1", "1", "a", "2", "b", "3", "c", "4", "d"]);
    p.ok(&["ZADD", "z2", "2", "b", "3", "c", "5", "e"]);
    p.ok(&["ZREVRANGE", "z1", "0", "-1", "WITHSCORES"]);
    p.ok(&["ZRANGEBYLEX", "z1", "-", "[c"]);
    p.ok(&["ZREVRANGEBYLEX", "z1", "+", "(b"]);
    p.ok(&["ZREVRANK", "z1", "c"]);
    p.ok(&["ZINTER", "2", "z1", "z2", "WITHSCORES"]);
    p.ok(&["ZUNION", "2", "z1", "z2", "WITHSCORES"]);
    p.ok(&["ZINTERCARD", "2", "z1", "z2"]);
    p.ok(&["ZDIFFSTORE", "zd", "2", "z1", "z2"]);
    p.ok(&["ZRANGESTORE", "zr", "z1", "0", "1"]);
    p.same_unordered(&["ZRANDMEMBER", "zr", "2"]);
    p.ok(&["ZADD", "one", "1", "only"]);
    p.ok(&["ZRANDMEMBER", "one"]);
    p.ok(&["ZREM", "z1", "a", "nope"]);
    p.ok(&["ZREMRANGEBYRANK", "z1", "0", "0"]);
    p.ok(&["ZREMRANGEBYSCORE", "z2", "-inf", "2"]);
    p.ok(&["BZPOPMAX", "z2", "1"]);
    p.ok(&["BZMPOP", "1", "1", "z2", "MIN"]);
    p.ok(&["SORT_RO", "l2", "ALPHA"]);
    // Geo, the deprecated radius forms.
    p.ok(&[
        "GEOADD",
        "g",
        "13.361389",
        "38.115556",
        "Palermo",
        "15.087269",
        "37.502669",
        "Catania",
    ]);
    p.ok(&["GEORADIUS", "g", "15", "37", "200", "km", "ASC"]);
    p.ok(&["GEORADIUS_RO", "g", "15", "37", "200", "km", "ASC"]);
    p.ok(&["GEORADIUSBYMEMBER", "g", "Palermo", "200", "km", "ASC"]);
    p.ok(&["GEORADIUSBYMEMBER_RO", "g", "Palermo", "200", "km", "ASC"]);
    // Streams: consumer groups.
    p.ok(&["XADD", "x", "1-1", "f", "v"]);
    p.ok(&["XGROUP", "CREATE", "x", "g", "0"]);
    p.ok(&["XGROUP", "CREATECONSUMER", "x", "g", "c"]);
    p.ok(&["XGROUP", "SETID", "x", "g", "0"]);
    p.ok(&["XGROUP", "DELCONSUMER", "x", "g", "c"]);
    p.ok(&["XGROUP", "HELP"]);
    p.ok(&["XINFO", "HELP"]);
    let strip_times = |r: Vec<u8>| r.len();
    let (xa, xw) = p.both(&["XINFO", "STREAM", "x"]);
    assert_eq!(strip_times(xa), strip_times(xw), "XINFO STREAM's shape");
    p.ok(&["XINFO", "CONSUMERS", "x", "g"]);
    p.ok(&["XGROUP", "DESTROY", "x", "g"]);
    // Scripts and functions.
    p.ok(&["SCRIPT", "HELP"]);
    let sha = String::from_utf8(p.ok(&["SCRIPT", "LOAD", "return 1"])).unwrap();
    let sha = sha.split("\r\n").nth(1).unwrap().to_string();
    if known(&mut p, "script|show") {
        p.ok(&["SCRIPT", "SHOW", &sha]);
    }
    p.ok(&["FUNCTION", "HELP"]);
    p.ok(&[
        "FUNCTION",
        "LOAD",
        "#!lua name=lib\nredis.register_function('f', function() return 1 end)",
    ]);
    p.ok(&["FUNCTION", "DUMP"]);
    p.ok(&["FUNCTION", "STATS"]);
    p.ok(&["FUNCTION", "DELETE", "lib"]);
    // FUNCTION RESTORE is refused by walrus (EXCUSED above; tests/it/admin.rs).
    p.ok(&["FUNCTION", "FLUSH"]);
    // Server and connection introspection.
    for cmd in [
        &["COMMAND", "HELP"][..],
        &["COMMAND", "DOCS", "GET"],
        &["COMMAND", "GETKEYSANDFLAGS", "SET", "k", "v"],
        &["CONFIG", "HELP"],
        &["CLIENT", "HELP"],
        &["CLIENT", "GETREDIR"],
        &["CLIENT", "TRACKINGINFO"],
        &["MODULE", "HELP"],
        &["MODULE", "LIST"],
        &["MEMORY", "USAGE", "nokey"],
        &["SLOWLOG", "HELP"],
        &["PUBSUB", "HELP"],
        &["PUBSUB", "CHANNELS"],
        &["PUBSUB", "SHARDCHANNELS"],
        &["PUBSUB", "SHARDNUMSUB", "nobody"],
        &["ACL", "HELP"],
        &["ACL", "CAT"],
        &["ACL", "USERS"],
        &["ACL", "LIST"],
        &["ACL", "GETUSER", "default"],
        &["ACL", "DRYRUN", "default", "GET", "k"],
        &["ACL", "LOG", "RESET"],
        &["ACL", "LOG"],
        &["ACL", "DELUSER", "nobody"],
    ] {
        p.same(cmd);
    }
    p.same_unordered(&["COMMAND", "LIST", "FILTERBY", "PATTERN", "xgroup*"]);
    if known(&mut p, "client|no-touch") {
        p.ok(&["CLIENT", "NO-TOUCH", "ON"]);
    }
    p.ok(&["CLIENT", "NO-EVICT", "ON"]);
    p.ok(&["FLUSHDB"]);
    p.expect(&["DBSIZE"], b":0\r\n");
}
