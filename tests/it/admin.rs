//! Administrative commands that would break what walrus relies on are refused with the
//! reason, alone or inside a transaction, and `proxy.allow_admin_commands` passes them on.
//! Scripts and function libraries that may reach `set_repl` are among them.
//! Managed mode: the Valkey users get by default.

use crate::common;
use common::*;

const REFUSED: &[&[&str]] = &[
    &["CONFIG", "SET", "appendonly", "yes"],
    &[
        "CONFIG",
        "SET",
        "maxmemory",
        "1gb",
        "min-slaves-to-write",
        "0",
    ],
    &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    &["REPLICAOF", "127.0.0.1", "1"],
    &["SLAVEOF", "127.0.0.1", "1"],
    &["FAILOVER"],
    &["SHUTDOWN", "NOSAVE"],
    &["DEBUG", "RELOAD"],
    &["DEBUG", "SET-DISABLE-DENY-SCRIPTS", "1"],
    &["CLIENT", "KILL", "TYPE", "replica"],
    &["CLIENT", "PAUSE", "10000", "WRITE"],
    &["CONFIG", "SET", "requirepass", "secret"],
    &["BGSAVE"],
    &["SAVE"],
    &["FUNCTION", "RESTORE", "payload"],
    &[
        "EVAL",
        "redis.set_repl(redis.REPL_NONE) return redis.call('SET', KEYS[1], 'v')",
        "1",
        "k",
    ],
    &["EVAL", GHOST, "1", "ghost", "v"],
    &["SCRIPT", "DEBUG", "SYNC"],
];

/// The reviewers' script: it builds set_repl's name at run time, turns off its own
/// replication and writes.
const GHOST: &str = "local f = server['set_' .. 'repl'] f(server.REPL_NONE) return server.call('SET', KEYS[1], ARGV[1])";

fn config_get(c: &mut Raw, name: &str) -> String {
    show(&c.cmd(&["CONFIG", "GET", name]))
}

#[test]
fn commands_that_break_what_walrus_relies_on_are_refused_with_the_reason() {
    let w = Walrus::build().start();
    let mut c = Raw::connect(&w.addr);
    for cmd in REFUSED {
        let r = show(&c.cmd(cmd));
        assert!(
            r.starts_with("-ERR walrus: ")
                && r.contains("is refused: ")
                && r.contains("allow_admin_commands"),
            "{cmd:?}: {r}"
        );
    }
    // SAVE's refusal names what to run instead.
    let r = show(&c.cmd(&["SAVE"]));
    assert!(r.contains("`walrus backup --to DIR`"), "{r}");
    let r = show(&c.cmd(&["CONFIG", "SET", "appendonly", "yes"]));
    assert!(r.contains("appendonly is refused: Valkey's own AOF"), "{r}");
    assert!(config_get(&mut c, "appendonly").contains("no"));
    assert!(config_get(&mut c, "maxmemory-policy").contains("noeviction"));
    let role = c.cmd(&["ROLE"]);
    assert!(role.starts_with(b"*3\r\n$6\r\nmaster"), "{}", show(&role));
    // Refused while queueing: the transaction is aborted, as Valkey aborts one.
    assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+QUEUED\r\n");
    assert!(c
        .cmd(&["REPLICAOF", "127.0.0.1", "1"])
        .starts_with(b"-ERR walrus"));
    assert!(c.cmd(&["EXEC"]).starts_with(b"-EXECABORT"));
    assert_eq!(c.cmd(&["GET", "k"]), b"$-1\r\n");
    // What walrus does not rely on passes.
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory", "1gb"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["CONFIG", "SET", "appendonly", "no"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]), b":0\r\n");
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+OK\r\n");
}

#[test]
fn allow_admin_commands_passes_them_on() {
    let w = Walrus::build()
        .config("[proxy]\nallow_admin_commands = true\n")
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]),
        b"+OK\r\n"
    );
    assert!(config_get(&mut c, "maxmemory-policy").contains("allkeys-lru"));
    // A script walrus cannot check, too.
    let r = c.cmd(&[
        "EVAL",
        "local t = _G return t.server.call('SET', KEYS[1], 'v')",
        "1",
        "k",
    ]);
    assert_eq!(r, b"+OK\r\n", "{}", show(&r));
}

/// No script or function writes behind the journal: the reviewers' script, the same through
/// SCRIPT LOAD and EVALSHA, a function library reaching set_repl through an alias, and the
/// script inside a transaction are refused, naming what they do; after SIGKILL of walrus and
/// Valkey and the restore, every acknowledged write is there, the scripts' included.
#[test]
fn no_script_keeps_a_write_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut w = Walrus::build().data(&data).start();
    let mut c = Raw::connect(&w.addr);
    let refused = |r: Vec<u8>, construct: &str| {
        let r = show(&r);
        assert!(
            r.starts_with("-ERR walrus: a script that may call server.set_repl")
                && r.contains(construct),
            "{r}"
        );
    };
    refused(
        c.cmd(&["EVAL", GHOST, "1", "ghost", "v"]),
        "line 1: `server[` indexes the server table by a computed name; write server.<name>",
    );
    refused(c.cmd(&["SCRIPT", "LOAD", GHOST]), "`server[`");
    let sha = c.cmd(&["EVAL", "return server.sha1hex(ARGV[1])", "0", GHOST]);
    let sha = String::from_utf8(sha[sha.len() - 42..sha.len() - 2].to_vec()).unwrap();
    let r = show(&c.cmd(&["EVALSHA", &sha, "1", "ghost", "v"]));
    assert!(r.starts_with("-NOSCRIPT"), "{r}");
    let library = "#!lua name=ghosts\n\
        local s = server\n\
        server.register_function('ghost', function(keys, args) s.set_repl(s.REPL_NONE) return server.call('SET', keys[1], args[1]) end)";
    refused(
        c.cmd(&["FUNCTION", "LOAD", library]),
        "line 2: `server` uses the server table as a value",
    );
    let r = show(&c.cmd(&["FCALL", "ghost", "1", "ghost", "v"]));
    assert!(r.starts_with("-ERR Function not found"), "{r}");
    assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["SET", "tx", "v"]), b"+QUEUED\r\n");
    refused(c.cmd(&["EVAL", GHOST, "1", "ghost", "v"]), "`server[`");
    assert!(c.cmd(&["EXEC"]).starts_with(b"-EXECABORT"));
    // What a script may do keeps working, and is journaled.
    let set = "return server.call('SET', KEYS[1], ARGV[1])";
    assert_eq!(c.cmd(&["EVAL", set, "1", "scripted", "v"]), b"+OK\r\n");
    let library = "#!lua name=kept\n\
        server.register_function('kept', function(keys, args)\n\
            local call = server.call\n\
            return call('SET', keys[1], args[1])\n\
        end)";
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", library]), b"$4\r\nkept\r\n");
    assert_eq!(c.cmd(&["FCALL", "kept", "1", "called", "v"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["SET", "later", "v"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["GET", "ghost"]), b"$-1\r\n");
    w.kill_with_valkey();
    let w = Walrus::build().data(&data).start();
    let mut c = Raw::connect(&w.addr);
    for key in ["scripted", "called", "later"] {
        assert_eq!(c.cmd(&["GET", key]), b"$1\r\nv\r\n", "{key}");
    }
    for key in ["ghost", "tx"] {
        assert_eq!(c.cmd(&["GET", key]), b"$-1\r\n", "{key}");
    }
    assert_eq!(c.cmd(&["FCALL", "kept", "1", "again", "v"]), b"+OK\r\n");
}
