//! Where a command runs: the routing rule, written down once.
//!
//! - **Pool** (the default): the command neither depends on nor changes the state of the
//!   connection it runs on, so any pooled connection of the client's identity will do.
//!   Unknown commands go here too.
//! - **Local**: connection-state commands walrus answers itself, because on a shared
//!   connection they would change every client's state: AUTH and HELLO (verified with
//!   Valkey, then switch the client's pool), SELECT (the database travels with each request),
//!   QUIT, RESET, CLIENT SETNAME/GETNAME/SETINFO.
//! - **Pin**: the command starts state that must stay on one connection: MULTI and WATCH
//!   (transactions), (P|S)SUBSCRIBE, MONITOR, CLIENT TRACKING/CACHING/REPLY/NO-EVICT/NO-TOUCH,
//!   READONLY/READWRITE/ASKING, replication handshakes (SYNC, PSYNC, REPLCONF), and every
//!   command Valkey flags `blocking` (BLPOP, BLMOVE, BZPOPMIN, WAIT, WAITAOF, ...; XREAD and
//!   XREADGROUP only with BLOCK). From then on the client has a dedicated upstream
//!   connection for the rest of its session.
//!
//! Only the names in this file are hard-coded; everything else comes from the command table.

use crate::commands::CommandTable;
use crate::resp::Request;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Pool,
    Pin,
    Local(Local),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    Auth,
    Hello,
    Select,
    Quit,
    Reset,
    ClientSetName,
    ClientGetName,
    ClientSetInfo,
}

pub fn route(table: &CommandTable, req: &Request) -> Route {
    let Some(info) = table.lookup(&req.args) else {
        return Route::Pool;
    };
    match info.name.as_str() {
        "auth" => Route::Local(Local::Auth),
        "hello" => Route::Local(Local::Hello),
        "select" => Route::Local(Local::Select),
        "quit" => Route::Local(Local::Quit),
        "reset" => Route::Local(Local::Reset),
        "client|setname" => Route::Local(Local::ClientSetName),
        "client|getname" => Route::Local(Local::ClientGetName),
        "client|setinfo" => Route::Local(Local::ClientSetInfo),
        "multi" | "watch" | "subscribe" | "psubscribe" | "ssubscribe" | "monitor"
        | "client|tracking" | "client|caching" | "client|reply" | "client|no-evict"
        | "client|no-touch" | "readonly" | "readwrite" | "asking" | "sync" | "psync"
        | "replconf" => Route::Pin,
        "xread" | "xreadgroup" => {
            if req
                .args
                .iter()
                .skip(1)
                .any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
            {
                Route::Pin
            } else {
                Route::Pool
            }
        }
        _ if info.flags.blocking => Route::Pin,
        _ => Route::Pool,
    }
}
