//! Administrative commands walrus must refuse (`src/proxy/admin.rs`, docs/design.md "Administrative
//! commands"; MONITOR, which shows every write before it is durable; SYNC and PSYNC, which
//! would stream them): each is sent on a connection of its own, which is closed after its
//! reply. The reply must be an error (one a fault explains, `-LOADING` say, proves nothing
//! and is only counted), never a success: walrus must keep serving, and what the command
//! would have done must not happen (a SHUTDOWN let through would stop Valkey, and every
//! check after it would say so).

use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd, Conn, Reply, HANG_BOUND};
use crate::history::expected_error;
use crate::shared::Ctx;
use std::time::Instant;

/// A script that reaches `set_repl` by a computed name, so that no text search finds it,
/// turns replication off and writes: a write the journal would never see.
const HIDDEN_SET_REPL: &str =
    "local f = server['set_' .. 'repl'] f(server.REPL_NONE) return server.call('SET', KEYS[1], ARGV[1])";

/// The commands, with the key the script writes (outside the clients' keys: `ghost{gen}`).
fn commands() -> Vec<Cmd> {
    vec![
        cmd(&["SHUTDOWN", "NOSAVE"]),
        cmd(&["DEBUG", "RELOAD"]),
        cmd(&["SAVE"]),
        cmd(&["BGSAVE"]),
        cmd(&["FAILOVER"]),
        cmd(&["CLIENT", "PAUSE", "1000"]),
        cmd(&["CLIENT", "KILL", "TYPE", "replica"]),
        cmd(&["CONFIG", "SET", "appendonly", "yes"]),
        cmd(&["CONFIG", "SET", "min-replicas-to-write", "0"]),
        cmd(&["REPLICAOF", "127.0.0.1", "1"]),
        cmd(&["SYNC"]),
        cmd(&["PSYNC", "?", "-1"]),
        cmd(&["CLIENT", "REPLY", "OFF"]),
        cmd(&["MONITOR"]),
        cmd(&["EVAL", HIDDEN_SET_REPL, "1", "ghost{gen}", "boo"]),
    ]
}

/// Sends one of the commands at random to a walrus, on a new connection.
pub fn refused(ctx: &Ctx, rng: &mut Rng) -> bool {
    let all = commands();
    let c = &all[rng.below(all.len() as u64) as usize];
    let nodes = ctx.nodes();
    let addr = &nodes[rng.below(nodes.len() as u64) as usize];
    let Some(mut conn) = Conn::connect(addr) else {
        return false;
    };
    let name = describe(&c[..c.len().min(2)].to_vec());
    ctx.h().count(&format!("op: refused {name}"));
    if conn.send(std::slice::from_ref(c)).is_err() {
        return false;
    }
    let reply = conn.reply(Instant::now() + HANG_BOUND);
    let mut h = ctx.h();
    match reply {
        Ok(Reply::Error(e)) if e.contains("refused") || e.contains("not supported") => {
            h.count("check: administrative command refused");
            true
        }
        Ok(Reply::Error(e)) if expected_error(&e) => {
            h.count(&format!("refused: inconclusive ({name}: -{e})"));
            false
        }
        Ok(Reply::Error(_)) => {
            h.count("check: administrative command refused");
            true
        }
        Ok(other) => {
            h.violation(format!(
                "refused command accepted: `{}` answered {other:?}",
                describe(c)
            ));
            false
        }
        Err(crate::conn::Wait::TimedOut) => {
            h.violation(format!(
                "hang: no reply to `{}` within {HANG_BOUND:?}",
                describe(c)
            ));
            false
        }
        // Closed: walrus may close a connection that asks for replication (SYNC).
        Err(crate::conn::Wait::Closed) => true,
    }
}
