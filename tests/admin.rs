//! Administrative commands that would break what walrus relies on are refused with the
//! reason, alone or inside a transaction, and `proxy.allow_admin_commands` passes them on.
//! Managed mode: the Valkey users get by default.

mod common;
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
];

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
}
