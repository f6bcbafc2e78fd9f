//! Databases other than 0, and SELECT inside MULTI (not in cluster mode, where there is
//! only database 0). On a connection of its own a worker selects a database, then runs a
//! transaction that selects another one and appends to that database's list, and that
//! runs (EXEC), or aborts: a command refused while queued (`-EXECABORT`), a WATCH that
//! fired (the worker touches the watched key itself, so EXEC must answer nil), or DISCARD.
//! Then it asks where it is: a SET of a key of its own, a SELECT of the database it must be
//! in (the transaction's if it ran, else the one before) and a GET of that key, which must
//! find the SET's value. It also reads the lists of the other databases, which every check
//! of the lists of database 0 covers too (`history.rs`, `check.rs`).

use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd, Conn, Reply};
use crate::history::{list_db, History, DBS, LISTS};
use crate::keys::list_key;
use crate::shared::Ctx;
use crate::workers::bulks;
use redis_protocol::resp2::types::OwnedFrame;

/// How a transaction ends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    Exec,
    Refused,
    Watched,
    Discard,
}

/// The key worker `w` asks where it is with.
fn where_key(w: usize) -> String {
    format!("{{gen}}:where{w}")
}

/// The key worker `w` WATCHes and touches.
fn watch_key(w: usize) -> String {
    format!("{{gen}}:watch{w}")
}

/// One transaction on `conn` (opened if need be; dropped when something broke).
pub fn transaction(conn: &mut Option<Conn>, ctx: &Ctx, rng: &mut Rng, w: usize) -> bool {
    if conn.is_none() {
        *conn = Conn::open(ctx);
    }
    let Some(c) = conn.as_mut() else {
        return true;
    };
    let before = rng.below(DBS as u64 + 1) as usize;
    let inside = 1 + rng.below(DBS as u64) as usize;
    let end = match rng.below(5) {
        0 => End::Refused,
        1 => End::Watched,
        2 => End::Discard,
        _ => End::Exec,
    };
    let list = LISTS + inside - 1;
    debug_assert_eq!(list_db(list), inside);
    let (elem, token) = {
        let mut h = ctx.h();
        h.count(&format!("op: SELECT inside MULTI, {end:?}"));
        let e = h.appends("SELECT in MULTI/EXEC", &[list])[0];
        (e, h.tick())
    };
    let mut cmds: Vec<Cmd> = vec![cmd(&["SELECT", &before.to_string()])];
    if end == End::Watched {
        cmds.push(cmd(&["WATCH", &watch_key(w)]));
        cmds.push(cmd(&["SET", &watch_key(w), &token.to_string()]));
    }
    let multi = cmds.len();
    cmds.push(cmd(&["MULTI"]));
    cmds.push(cmd(&["SELECT", &inside.to_string()]));
    cmds.push(cmd(&["RPUSH", &list_key(list), &format!("e{elem}")]));
    if end == End::Refused {
        cmds.push(cmd(&["RPUSH", &list_key(list)]));
    }
    cmds.push(cmd(&[if end == End::Discard {
        "DISCARD"
    } else {
        "EXEC"
    }]));
    let last = cmds.len() - 1;
    // Where the client must be now: the transaction's database if it ran.
    let want = if end == End::Exec { inside } else { before };
    let probe = format!("p{token}");
    cmds.push(cmd(&["SET", &where_key(w), &probe]));
    cmds.push(cmd(&["SELECT", &want.to_string()]));
    cmds.push(cmd(&["GET", &where_key(w)]));
    // And a read of another database's list.
    let other = 1 + rng.below(DBS as u64) as usize;
    let read_ts = ctx.h().tick();
    cmds.push(cmd(&["SELECT", &other.to_string()]));
    cmds.push(cmd(&["LRANGE", &list_key(LISTS + other - 1), "0", "-1"]));
    let replies = c.call(ctx, &cmds);
    let mut h = ctx.h();
    let mut clean = settle(&mut h, elem, end, &cmds, &replies, multi, last);
    // Where the SET went, if everything before it was answered as it should be.
    let errors = replies
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            !matches!(r, Reply::Frame(_))
                && !(end == End::Refused && (*i == last || *i == last - 1))
        })
        .count();
    if clean && errors == 0 {
        h.count("check: database after a transaction");
        let got = &replies[last + 3];
        if !matches!(got, Reply::Frame(OwnedFrame::BulkString(b)) if *b == probe.as_bytes()) {
            h.violation(format!(
                "database moved: after `{}` ({end:?}), the client's SET did not land in database \
                 {want}, where it must be (GET there: {got:?})",
                cmds[multi..=last]
                    .iter()
                    .map(describe)
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }
    match &replies[last + 5] {
        Reply::Frame(OwnedFrame::Array(items)) => match bulks(items.clone()) {
            Some(items) => {
                h.observe_list(LISTS + other - 1, Some(read_ts), &items, "LRANGE");
            }
            None => h.unexpected("LRANGE", &items),
        },
        Reply::Error(e) => {
            h.error("LRANGE", e);
            clean = false;
        }
        Reply::Lost => clean = false,
        Reply::Frame(f) => h.unexpected("LRANGE", f),
    }
    if !clean || errors > 0 {
        *conn = None;
    }
    clean
}

/// Settles the transaction's element from its replies; true when it ran or aborted as
/// intended.
fn settle(
    h: &mut History,
    elem: u32,
    end: End,
    cmds: &[Cmd],
    replies: &[Reply],
    multi: usize,
    last: usize,
) -> bool {
    let queued = replies[multi + 1..last]
        .iter()
        .enumerate()
        .all(|(i, r)| match r {
            Reply::Frame(OwnedFrame::SimpleString(s)) => s == b"QUEUED",
            // The refused command.
            Reply::Error(e) => {
                end == End::Refused && multi + 1 + i == last - 1 && e.starts_with("ERR")
            }
            _ => false,
        });
    let multi_ok =
        matches!(&replies[multi], Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK");
    if !multi_ok {
        // MULTI refused: what followed ran, if at all, one by one (EXEC then answers
        // "without MULTI"); the RPUSH may have run on its own.
        if let Reply::Error(e) = &replies[multi] {
            h.error("MULTI", e);
        }
        h.unknown(&[elem]);
        return false;
    }
    if !queued {
        // A command refused while queued (-LOADING, -MISCONF: a fault) aborts EXEC.
        for (i, (r, c)) in replies[..last].iter().zip(cmds).enumerate() {
            let intended = end == End::Refused && i == last - 1;
            if let (Reply::Error(e), false) = (r, intended) {
                h.error(&describe(c), e);
            }
        }
        match &replies[last] {
            Reply::Error(e) if e.starts_with("EXECABORT") => h.not_run(&[elem]),
            _ => h.unknown(&[elem]),
        }
        return false;
    }
    // A WATCH, or the SET that fires it, refused by a fault: EXEC runs as if unwatched.
    let fired = end == End::Watched
        && replies[multi - 2..multi].iter().all(|r| {
            let ok = matches!(r, Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK");
            if let Reply::Error(e) = r {
                h.error("WATCH or SET before MULTI", e);
            }
            ok
        });
    match (&replies[last], end) {
        (Reply::Frame(OwnedFrame::Array(items)), End::Exec | End::Watched) if !fired => match items.as_slice() {
            [OwnedFrame::SimpleString(_), OwnedFrame::Integer(n)] if *n > 0 => {
                h.ack(&[(elem, *n as usize)]);
                true
            }
            _ => {
                h.unexpected("EXEC", items);
                h.unknown(&[elem]);
                false
            }
        },
        (Reply::Error(e), End::Refused) if e.starts_with("EXECABORT") => {
            h.not_run(&[elem]);
            true
        }
        (Reply::Frame(OwnedFrame::Null), End::Watched) => {
            h.not_run(&[elem]);
            true
        }
        (Reply::Frame(OwnedFrame::SimpleString(s)), End::Discard) if s == b"OK" => {
            h.not_run(&[elem]);
            true
        }
        (Reply::Error(e), _) => {
            h.error(&describe(&cmds[last]), e);
            h.unknown(&[elem]);
            false
        }
        (Reply::Lost, _) => {
            h.unknown(&[elem]);
            false
        }
        (Reply::Frame(f), _) => {
            h.unexpected(&describe(&cmds[last]), f);
            h.unknown(&[elem]);
            false
        }
    }
}
