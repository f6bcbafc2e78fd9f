//! Administrative commands that would break what walrus relies on: Valkey is a primary
//! whose every change reaches walrus's replica link, with the settings walrus needs
//! ([`crate::upstream::settings`]). Each is refused with the reason, unless
//! `proxy.allow_admin_commands` lets it through (an operator who knows what it does).
//!
//! Administrative commands not listed keep working: `CONFIG SET` of any other setting,
//! `CLIENT KILL` of clients, `ACL` (walrus's own user must keep the commands it uses: INFO,
//! ROLE, PSYNC, REPLCONF, CLIENT KILL).
//!
//! Scripts and function libraries (EVAL, EVAL_RO, SCRIPT LOAD, FUNCTION LOAD) that may
//! call `set_repl` are refused as well: [`script`] says which, reading them with [`lua`].
//!
//! MONITOR breaks the durability rule instead, and is refused the same way unless
//! `proxy.allow_monitor` lets it through ([`MONITOR`]).

pub mod lua;
pub mod script;

use crate::resp::Request;
use crate::upstream::settings::SETTINGS;
use std::borrow::Cow;

/// Why a command is refused: what it touches, and what that would break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forbidden {
    pub what: &'static str,
    pub why: Cow<'static, str>,
}

impl Forbidden {
    /// The error a client gets.
    pub fn error(&self) -> String {
        self.error_unless("proxy.allow_admin_commands")
    }

    /// The error a client gets, naming the `setting` that lets the command through.
    pub fn error_unless(&self, setting: &str) -> String {
        format!(
            "ERR walrus: {} is refused: {} ({setting} lets it through)",
            self.what, self.why
        )
    }
}

/// MONITOR, refused unless `proxy.allow_monitor`.
pub const MONITOR: Forbidden = Forbidden {
    what: "MONITOR",
    why: Cow::Borrowed("it shows every command with its arguments as Valkey runs it, the values of writes a crash can still lose among them, before the journal holds them"),
};

/// Old names Valkey still accepts for settings walrus depends on.
const ALIASES: [(&str, &str); 2] = [
    ("min-slaves-to-write", "min-replicas-to-write"),
    ("min-slaves-max-lag", "min-replicas-max-lag"),
];

/// DEBUG subcommands that only look at the data (or wait): passed on.
const DEBUG_HARMLESS: [&str; 7] = [
    "HELP",
    "SLEEP",
    "DIGEST",
    "DIGEST-VALUE",
    "OBJECT",
    "PROTOCOL",
    "LISTPACK",
];

/// `name`: the command's name in the command table (`config|set` for a subcommand).
pub fn forbidden(name: &str, req: &Request) -> Option<Forbidden> {
    let refuse = |what, why: &'static str| {
        Some(Forbidden {
            what,
            why: why.into(),
        })
    };
    match name {
        "replicaof" | "slaveof" => refuse(
            "REPLICAOF",
            "Valkey would load another server's dataset, which the journal does not hold, and stop being the primary walrus journals",
        ),
        "failover" => refuse(
            "FAILOVER",
            "Valkey would hand its primary role to a replica (walrus's own link is one), and walrus journals only a primary's stream",
        ),
        "shutdown" => refuse(
            "SHUTDOWN",
            "walrus runs or follows this Valkey; stop walrus (managed mode) or Valkey's own service instead",
        ),
        "debug" if !DEBUG_HARMLESS.iter().any(|s| req.arg_is(1, s)) => refuse(
            "DEBUG",
            "its subcommands other than those that only look (SLEEP, DIGEST, OBJECT, ...) load, create or change data behind the replication stream the journal holds (RELOAD, POPULATE), change its history (CHANGE-REPL-ID) or let scripts run any command",
        ),
        "save" | "bgsave" => refuse(
            "SAVE (or BGSAVE)",
            "the dump.rdb it leaves in Valkey's directory is loaded by Valkey's next start, behind the history walrus restores; walrus is the persistence: `walrus checkpoint` takes one now, `walrus backup --to DIR` copies a data directory to restore from, `walrus journal export-aof` writes an AOF",
        ),
        "client|kill" if kills_replicas(req) => refuse(
            "CLIENT KILL TYPE replica",
            "it closes walrus's replica link, and every write waits until it is back",
        ),
        "client|pause" => refuse(
            "CLIENT PAUSE",
            "it stops the writes of every client of walrus together, and walrus's own connections",
        ),
        "function|restore" => refuse(
            "FUNCTION RESTORE",
            "the libraries in its payload cannot be checked for set_repl (load them with FUNCTION LOAD)",
        ),
        "eval" | "eval_ro" | "script|load" | "function|load" => script_forbidden(name, req),
        "script|debug" if req.arg_is(2, "YES") || req.arg_is(2, "SYNC") => refuse(
            "SCRIPT DEBUG YES (or SYNC)",
            "the Lua debugger runs code typed into it, which walrus cannot check for set_repl (SYNC keeps its writes), and it would turn a connection other clients share into a debugging session",
        ),
        "cluster|replicate" => refuse(
            "CLUSTER REPLICATE",
            "this node would become a replica and load another node's dataset, and walrus journals only a primary's stream (docs/cluster.md, \"Valkey Cluster\": primaries only)",
        ),
        "cluster|failover" => refuse(
            "CLUSTER FAILOVER",
            "a replica promoted by it may lack writes walrus acknowledged (docs/cluster.md, \"Valkey Cluster\": primaries only, each restored in place by its walrus)",
        ),
        "cluster|migrateslots" => refuse(
            "CLUSTER MIGRATESLOTS",
            "the target node takes the slots before walrus in front of it has journaled them (Valkey does not wait for its replicas, valkey-io/valkey#2723), and the source then deletes them: a crash of the target in that moment loses acknowledged writes; reshard with MIGRATE through the walruses' addresses (`redis-cli --cluster reshard`, docs/cluster.md, \"Valkey Cluster\")",
        ),
        "cluster|flushslot" => refuse(
            "CLUSTER FLUSHSLOT",
            "its deletions reach the replication stream as the command itself, which the plain valkey-server a restore in place replays the journal into refuses: the keys would come back (delete them with DEL or UNLINK)",
        ),
        "cluster|syncslots" => refuse(
            "CLUSTER SYNCSLOTS",
            "it drives an atomic slot migration, which walrus cannot make durable (see CLUSTER MIGRATESLOTS)",
        ),
        "config|set" => config_set(req),
        _ => None,
    }
}

/// A script or function library that may call `server.set_repl` ([`script::check`]).
fn script_forbidden(name: &str, req: &Request) -> Option<Forbidden> {
    // EVAL's source comes first; SCRIPT LOAD's and FUNCTION LOAD's last. Keys and
    // arguments are data, whatever they spell.
    let source = match name {
        "eval" | "eval_ro" => req.args.get(1),
        _ => req.args.last(),
    }?;
    let finding = script::check(source).err()?;
    Some(Forbidden {
        what: "a script that may call server.set_repl (writes it keeps out of the replication stream are never journaled)",
        why: finding.to_string().into(),
    })
}

/// `CLIENT KILL ... TYPE replica|slave|master|primary ...` (the filter form).
fn kills_replicas(req: &Request) -> bool {
    req.args.get(2..).unwrap_or_default().chunks(2).any(|w| {
        w.len() == 2
            && w[0].eq_ignore_ascii_case(b"TYPE")
            && ["replica", "slave", "master", "primary"]
                .iter()
                .any(|t| w[1].eq_ignore_ascii_case(t.as_bytes()))
    })
}

/// `CONFIG SET name value [name value ...]`: refused if any pair changes a setting walrus
/// needs, or turns on eviction (Valkey's own deletions of keys, which walrus cannot hold:
/// a read would show a key gone before its eviction is durable).
fn config_set(req: &Request) -> Option<Forbidden> {
    req.args.get(2..)?.chunks(2).find_map(|pair| {
        let [name, value] = pair else { return None };
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let name = ALIASES
            .iter()
            .find(|(old, _)| *old == name)
            .map_or(name.as_str(), |(_, new)| new);
        if name.starts_with("cluster-announce-") || name == "cluster-preferred-endpoint-type" {
            return Some(Forbidden {
                what: "cluster-announce-* (or cluster-preferred-endpoint-type)",
                why: "cluster clients would be told another address than this walrus's, and go around it, or the other nodes would lose this one (set cluster.announce_ip and cluster.announce_port instead)".into(),
            });
        }
        if name == "cluster-allow-replica-migration" && !value.eq_ignore_ascii_case(b"no") {
            return Some(Forbidden {
                what: "cluster-allow-replica-migration",
                why: "a primary that gives away its last slot would become another node's replica and load that node's dataset, and walrus journals only a primary's stream".into(),
            });
        }
        if matches!(name, "protected-mode" | "bind" | "port" | "tls-port") {
            return Some(Forbidden {
                what: "protected-mode, bind, port and tls-port",
                why: "they decide who can reach Valkey other than through walrus: a client that opened them could read writes before they are durable and write around the journal (set them on Valkey's command line or in walrus.toml)".into(),
            });
        }
        if name == "requirepass" {
            return Some(Forbidden {
                what: "requirepass",
                why: "walrus's own connections use the password in its configuration (upstream.password); change both together, with walrus stopped".into(),
            });
        }
        let s = SETTINGS.iter().find(|s| s.name == name)?;
        let same = value.eq_ignore_ascii_case(s.value.as_bytes())
            || value.eq_ignore_ascii_case(s.shown.as_bytes());
        (!same).then_some(Forbidden {
            what: s.name,
            why: s.risk.into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn req(args: &[&str]) -> Request {
        Request {
            raw: Bytes::new(),
            args: args
                .iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect(),
        }
    }

    #[test]
    fn config_set_is_refused_only_for_a_setting_walrus_needs_changed() {
        let refused = |args: &[&str]| forbidden("config|set", &req(args)).map(|r| r.what);
        assert_eq!(
            refused(&["CONFIG", "SET", "appendonly", "yes"]),
            Some("appendonly")
        );
        assert_eq!(refused(&["config", "set", "APPENDONLY", "no"]), None);
        assert_eq!(
            refused(&[
                "CONFIG",
                "SET",
                "maxmemory",
                "1gb",
                "min-slaves-to-write",
                "0"
            ]),
            Some("min-replicas-to-write")
        );
        assert_eq!(
            refused(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]),
            Some("maxmemory-policy")
        );
        assert_eq!(refused(&["CONFIG", "SET", "maxmemory", "1gb"]), None);
        assert_eq!(
            refused(&["CONFIG", "SET", "save"]),
            None,
            "Valkey's arity error"
        );
    }

    #[test]
    fn scripts_that_turn_off_replication_are_refused() {
        let refused = |name: &str, args: &[&str]| forbidden(name, &req(args)).is_some();
        let body = "redis.set_repl(redis.REPL_NONE) redis.call('SET', KEYS[1], 'v')";
        assert!(refused("eval", &["EVAL", body, "1", "k"]));
        assert!(refused("script|load", &["SCRIPT", "LOAD", body]));
        assert!(refused(
            "function|load",
            &["FUNCTION", "LOAD", "REPLACE", body]
        ));
        assert!(!refused(
            "eval",
            &["EVAL", "return redis.call('SET', KEYS[1], 'v')", "1", "k"]
        ));
        // The name in a key or an argument is data, not code.
        assert!(!refused(
            "eval",
            &["EVAL", "return 1", "1", "set_repl", "set_repl"]
        ));
        // The name built at run time (the full rule: `script::tests`).
        let ghost = "local f = server['set_' .. 'repl'] f(server.REPL_NONE) return server.call('SET', KEYS[1], ARGV[1])";
        assert!(refused("eval", &["EVAL", ghost, "1", "ghost", "v"]));
        assert!(refused("eval_ro", &["EVAL_RO", ghost, "1", "ghost", "v"]));
        assert!(refused("script|load", &["SCRIPT", "LOAD", ghost]));
        let library =
            format!("#!lua name=lib\nserver.register_function('f', function() {ghost} end)");
        assert!(refused("function|load", &["FUNCTION", "LOAD", &library]));
        // The debugger runs code typed into it.
        assert!(refused("script|debug", &["SCRIPT", "DEBUG", "SYNC"]));
        assert!(refused("script|debug", &["SCRIPT", "DEBUG", "yes"]));
        assert!(!refused("script|debug", &["SCRIPT", "DEBUG", "NO"]));
        assert!(refused(
            "config|set",
            &["CONFIG", "SET", "requirepass", "x"]
        ));
        assert!(refused("debug", &["DEBUG", "POPULATE", "10"]));
        assert!(!refused("debug", &["debug", "sleep", "0"]));
    }

    #[test]
    fn client_kill_is_refused_only_for_replicas() {
        let refused = |args: &[&str]| forbidden("client|kill", &req(args)).is_some();
        assert!(refused(&["CLIENT", "KILL", "TYPE", "replica"]));
        assert!(refused(&[
            "CLIENT", "KILL", "SKIPME", "no", "type", "SLAVE"
        ]));
        assert!(!refused(&["CLIENT", "KILL", "TYPE", "normal"]));
        assert!(!refused(&["CLIENT", "KILL", "127.0.0.1:5000"]));
        assert!(!refused(&["CLIENT", "KILL", "ADDR", "type"]));
    }

    #[test]
    fn cluster_commands_that_would_send_clients_or_data_elsewhere_are_refused() {
        let refused = |name: &str, args: &[&str]| forbidden(name, &req(args)).is_some();
        assert!(refused(
            "cluster|replicate",
            &["CLUSTER", "REPLICATE", "abc"]
        ));
        assert!(refused("cluster|failover", &["CLUSTER", "FAILOVER"]));
        assert!(refused(
            "config|set",
            &["CONFIG", "SET", "cluster-announce-client-port", "1"]
        ));
        assert!(refused(
            "config|set",
            &["config", "set", "CLUSTER-ANNOUNCE-CLIENT-IPV4", "10.0.0.1"]
        ));
        assert!(refused(
            "cluster|migrateslots",
            &[
                "CLUSTER",
                "MIGRATESLOTS",
                "SLOTSRANGE",
                "0",
                "10",
                "NODE",
                "abc"
            ]
        ));
        assert!(refused("cluster|flushslot", &["CLUSTER", "FLUSHSLOT", "1"]));
        assert!(refused(
            "config|set",
            &["CONFIG", "SET", "cluster-announce-port", "7000"]
        ));
        assert!(refused(
            "config|set",
            &["CONFIG", "SET", "cluster-announce-ip", "10.0.0.2"]
        ));
        // What would open Valkey to clients around walrus.
        for (name, value) in [
            ("protected-mode", "no"),
            ("bind", "* -::*"),
            ("port", "6390"),
            ("tls-port", "6391"),
        ] {
            assert!(
                refused("config|set", &["CONFIG", "SET", name, value]),
                "{name}"
            );
        }
        assert!(refused(
            "config|set",
            &[
                "CONFIG",
                "SET",
                "cluster-preferred-endpoint-type",
                "hostname"
            ]
        ));
        assert!(refused(
            "cluster|syncslots",
            &["CLUSTER", "SYNCSLOTS", "CAPA"]
        ));
        assert!(refused(
            "config|set",
            &["CONFIG", "SET", "cluster-allow-replica-migration", "yes"]
        ));
        assert!(!refused(
            "config|set",
            &["CONFIG", "SET", "cluster-allow-replica-migration", "no"]
        ));
        assert!(!refused("cluster|slots", &["CLUSTER", "SLOTS"]));
        assert!(!refused(
            "cluster|setslot",
            &["CLUSTER", "SETSLOT", "1", "STABLE"]
        ));
        assert!(!refused(
            "config|set",
            &["CONFIG", "SET", "cluster-node-timeout", "5000"]
        ));
    }
}
