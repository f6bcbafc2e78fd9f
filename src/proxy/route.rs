//! Where a command runs: the routing rule, written down once.
//!
//! - **Pool** (the default): the command neither depends on nor changes the state of the
//!   connection it runs on, so any pooled connection of the client's identity will do.
//!   Unknown commands go here too.
//! - **Local**: connection-state commands walrus answers itself, because on a shared
//!   connection they would change every client's state: AUTH and HELLO (verified with
//!   Valkey, then switch the client's pool), SELECT (the database travels with each request),
//!   QUIT, RESET, CLIENT SETNAME/GETNAME/SETINFO/REPLY. Replication handshakes (SYNC, PSYNC,
//!   REPLCONF) are refused here: the stream would show every write before it is durable, and
//!   walrus itself is Valkey's journaling replica (replicas attach to Valkey directly).
//!   `POST` and `Host:` (an HTTP request sent to walrus) end that client's connection, as
//!   Valkey ends one it takes for a cross-protocol attack: forwarded, they would make Valkey
//!   abort the pooled connection other clients share. Administrative commands that would
//!   break what walrus relies on (REPLICAOF, CONFIG SET appendonly, ...) are refused here
//!   ([`super::admin`]).
//! - **Pin**: the command starts state that must stay on one connection: MULTI and WATCH
//!   (transactions), (P|S)SUBSCRIBE, MONITOR, CLIENT TRACKING/CACHING/NO-EVICT/NO-TOUCH,
//!   READONLY/READWRITE/ASKING, and every command Valkey flags `blocking` (BLPOP, BLMOVE, BZPOPMIN, WAIT, WAITAOF, ...; XREAD and
//!   XREADGROUP only with BLOCK). From then on the client has a dedicated upstream
//!   connection, pipelined and gated like a pooled one, until it sends RESET. RESP2 Pub/Sub
//!   and MONITOR are relayed instead ([`is_relay_mode`]): the relay holds keyspace
//!   notifications and tracking invalidations as the pushes of a dedicated connection are
//!   held ([`super::pushes`]); what MONITOR shows is not gated, so it is refused unless
//!   `proxy.allow_monitor` ([`super::admin::MONITOR`]).
//!
//! Only the names in this file are hard-coded; everything else comes from the command table.

use crate::commands::CommandInfo;
use crate::resp::Request;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Pool,
    Pin,
    Local(Local),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Local {
    Auth,
    Hello,
    Select,
    Quit,
    Reset,
    ClientSetName,
    ClientGetName,
    ClientSetInfo,
    /// CLIENT REPLY: ON is a no-op; OFF and SKIP are refused, since walrus must pair every
    /// request with its reply to hold it until durable.
    ClientReply,
    /// SYNC, PSYNC, REPLCONF: refused.
    Replication,
    /// `POST`, `Host:`: an HTTP request; the connection is closed.
    CrossProtocol,
    /// An administrative command that would break what walrus relies on ([`super::admin`]).
    Admin(super::admin::Forbidden),
}

/// Pinned sessions whose upstream connection stops answering one reply per request
/// (RESP2 Pub/Sub, MONITOR) are relayed byte for byte. Such a
/// relay accepts only the commands these modes allow, none of which reads or writes data.
pub fn is_relay_mode(req: &Request, resp3: bool) -> bool {
    let n = req.name();
    let subscribe = ["subscribe", "psubscribe", "ssubscribe"]
        .iter()
        .any(|c| n.eq_ignore_ascii_case(c.as_bytes()));
    (subscribe && !resp3) || n.eq_ignore_ascii_case(b"monitor")
}

/// (P|S)(UN)SUBSCRIBE. In RESP3 their confirmations are pushes, not replies.
pub fn is_subscription(req: &Request) -> bool {
    const NAMES: [&str; 6] = [
        "subscribe",
        "unsubscribe",
        "psubscribe",
        "punsubscribe",
        "ssubscribe",
        "sunsubscribe",
    ];
    NAMES
        .iter()
        .any(|c| req.name().eq_ignore_ascii_case(c.as_bytes()))
}

/// What a relayed session may still send.
pub fn allowed_in_relay(req: &Request) -> bool {
    const ALSO: [&str; 3] = ["ping", "quit", "reset"];
    is_subscription(req)
        || ALSO
            .iter()
            .any(|c| req.name().eq_ignore_ascii_case(c.as_bytes()))
}

/// `info`: the request's entry in the command table (`None`: not in it).
pub fn route(info: Option<&CommandInfo>, req: &Request) -> Route {
    // Not in Valkey's command table: its command processing catches them by name.
    if ["post", "host:"]
        .iter()
        .any(|c| req.name().eq_ignore_ascii_case(c.as_bytes()))
    {
        return Route::Local(Local::CrossProtocol);
    }
    let Some(info) = info else {
        return Route::Pool;
    };
    if let Some(forbidden) = super::admin::forbidden(&info.name, req) {
        return Route::Local(Local::Admin(forbidden));
    }
    match info.name.as_str() {
        "auth" => Route::Local(Local::Auth),
        "hello" => Route::Local(Local::Hello),
        "select" => Route::Local(Local::Select),
        "quit" => Route::Local(Local::Quit),
        "reset" => Route::Local(Local::Reset),
        "client|setname" => Route::Local(Local::ClientSetName),
        "client|getname" => Route::Local(Local::ClientGetName),
        "client|setinfo" => Route::Local(Local::ClientSetInfo),
        "client|reply" => Route::Local(Local::ClientReply),
        "sync" | "psync" | "replconf" => Route::Local(Local::Replication),
        "multi" | "watch" | "subscribe" | "psubscribe" | "ssubscribe" | "unsubscribe"
        | "punsubscribe" | "sunsubscribe" | "monitor" | "client|tracking" | "client|caching"
        | "client|no-evict" | "client|no-touch" | "readonly" | "readwrite" | "asking" => Route::Pin,
        _ if may_block(info, req) => Route::Pin,
        _ => Route::Pool,
    }
}

/// Commands whose effect Valkey keeps for the next command only (`resetClient` in its
/// networking.c): ASKING, and CLIENT CACHING (kept across CLIENT commands). CLIENT REPLY
/// SKIP is the other, and walrus refuses it.
pub fn is_one_shot(info: &CommandInfo) -> bool {
    matches!(info.name.as_str(), "asking" | "client|caching")
}

/// Whether the request may block: Valkey flags the command `blocking`, and XREAD and
/// XREADGROUP (flagged so whatever their arguments) only with BLOCK.
pub fn may_block(info: &CommandInfo, req: &Request) -> bool {
    if matches!(info.name.as_str(), "xread" | "xreadgroup") {
        return req
            .args
            .iter()
            .skip(1)
            .any(|a| a.eq_ignore_ascii_case(b"BLOCK"));
    }
    info.flags.blocking
}
