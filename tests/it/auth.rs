//! Authentication and ACLs through walrus. Valkey requires a password (`requirepass secret`)
//! and has a user `alice` who may only touch `alice:*` keys. walrus authenticates its own
//! control connections with the password from its configuration file; client traffic runs
//! as each client's own user, on pooled connections shared by clients of the same user.
//!
//! Every reply is compared with what a direct connection to the same Valkey gets.

use crate::common;
use common::*;

const ALICE: &[&str] = &["ACL", "SETUSER", "alice", "on", ">pw", "~alice:*", "+@all"];
const BOB: &[&str] = &[
    "ACL",
    "SETUSER",
    "bob",
    "on",
    ">pw2",
    "~bob:*",
    "+@read",
    "+ping",
    "+acl|whoami",
];

struct Setup {
    valkey: Valkey,
    walrus: Walrus,
}

impl Setup {
    fn start() -> Setup {
        let valkey = Valkey::start_with(&["--requirepass", "secret"]);
        let mut admin = Raw::connect(&valkey.addr());
        assert_eq!(admin.cmd(&["AUTH", "secret"]), b"+OK\r\n");
        assert_eq!(admin.cmd(ALICE), b"+OK\r\n");
        assert_eq!(admin.cmd(BOB), b"+OK\r\n");
        let walrus = Walrus::build()
            .upstream(&valkey.addr())
            .config("[upstream]\nusername = \"\"\npassword = \"secret\"\n")
            .start();
        Setup { valkey, walrus }
    }

    /// A direct client and a walrus client of the same Valkey, driven in lockstep.
    fn pair(&self) -> Pair {
        Pair {
            a: Raw::connect(&self.valkey.addr()),
            w: Raw::connect(&self.walrus.addr),
        }
    }
}

const NOAUTH: &[u8] = b"-NOAUTH Authentication required.\r\n";
const WRONGPASS: &[u8] = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";

#[test]
fn unauthenticated_clients_get_valkeys_noauth() {
    let s = Setup::start();
    let mut p = s.pair();
    p.expect(&["GET", "k"], NOAUTH);
    p.expect(&["SET", "k", "v"], NOAUTH);
    p.expect(&["PING"], NOAUTH);
    p.expect(&["NOSUCHCOMMAND"], NOAUTH);
    p.starts(
        &["HELLO", "3"],
        "-NOAUTH HELLO must be called with the client already authenticated",
    );
    p.expect(&["GET", "k"], NOAUTH);
    p.starts(&["MULTI"], "-NOAUTH");
    p.starts(&["BLPOP", "q", "0"], "-NOAUTH");
    p.expect(&["GET", "k"], NOAUTH);
    p.expect(&["QUIT"], b"+OK\r\n");
    let mut p = s.pair();
    p.starts(&["SUBSCRIBE", "ch"], "-NOAUTH");
    p.expect(&["QUIT"], b"+OK\r\n");
}

/// Valkey refuses every command but AUTH, HELLO, QUIT and RESET before authentication,
/// including the connection-state commands walrus answers itself.
#[test]
fn unauthenticated_clients_cannot_change_connection_state() {
    let s = Setup::start();
    let mut p = s.pair();
    p.expect(&["SELECT", "1"], NOAUTH);
    p.expect(&["GET", "k"], NOAUTH);
    p.same(&["SELECT"]);
    p.expect(&["CLIENT", "SETNAME", "x"], NOAUTH);
    p.expect(&["CLIENT", "GETNAME"], NOAUTH);
    p.expect(&["CLIENT", "SETINFO", "lib-name", "x"], NOAUTH);
    p.expect(&["RESET"], b"+RESET\r\n");
    // Nothing was changed: after AUTH, database 0 and no name.
    p.expect(&["AUTH", "secret"], b"+OK\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$-1\r\n");
    p.expect(&["SELECT", "1"], b"+OK\r\n");
    p.expect(&["CLIENT", "SETNAME", "y"], b"+OK\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$1\r\ny\r\n");
    p.expect(&["RESET"], b"+RESET\r\n");
    p.expect(&["SELECT", "1"], NOAUTH);
}

#[test]
fn wrong_credentials_get_valkeys_wrongpass() {
    let s = Setup::start();
    let mut p = s.pair();
    p.expect(&["AUTH", "wrong"], WRONGPASS);
    p.expect(&["AUTH", "alice", "wrong"], WRONGPASS);
    p.expect(&["AUTH", "nosuchuser", "pw"], WRONGPASS);
    p.expect(&["AUTH", "default", "wrong"], WRONGPASS);
    p.starts(&["HELLO", "3", "AUTH", "alice", "wrong"], "-WRONGPASS");
    p.same(&["AUTH"]);
    p.same(&["AUTH", "a", "b", "c"]);
    // Still not authenticated, still RESP2.
    p.expect(&["GET", "k"], NOAUTH);
    // Authenticated, then a failed AUTH: the client stays who it was.
    p.expect(&["AUTH", "secret"], b"+OK\r\n");
    p.expect(&["AUTH", "wrong"], WRONGPASS);
    p.expect(&["SET", "k", "v"], b"+OK\r\n");
    p.expect(&["ACL", "WHOAMI"], b"$7\r\ndefault\r\n");
}

#[test]
fn password_authentication_unlocks_commands() {
    let s = Setup::start();
    let mut p = s.pair();
    p.expect(&["AUTH", "secret"], b"+OK\r\n");
    p.expect(&["SET", "any:key", "v"], b"+OK\r\n");
    p.expect(&["GET", "any:key"], b"$1\r\nv\r\n");
    p.expect(&["ACL", "WHOAMI"], b"$7\r\ndefault\r\n");
    p.expect(&["SELECT", "2"], b"+OK\r\n");
    p.expect(&["GET", "any:key"], b"$-1\r\n");
    // A dedicated connection is authenticated as the client, in its database.
    p.expect(&["MULTI"], b"+OK\r\n");
    p.expect(&["ACL", "WHOAMI"], b"+QUEUED\r\n");
    p.expect(&["SET", "tx:key", "in2"], b"+QUEUED\r\n");
    p.expect(&["EXEC"], b"*2\r\n$7\r\ndefault\r\n+OK\r\n");
    let mut admin = Raw::connect(&s.valkey.addr());
    admin.cmd(&["AUTH", "secret"]);
    admin.cmd(&["SELECT", "2"]);
    assert_eq!(admin.cmd(&["GET", "tx:key"]), b"$3\r\nin2\r\n");
    // AUTH username password for the default user too.
    let mut q = s.pair();
    q.expect(&["AUTH", "default", "secret"], b"+OK\r\n");
    q.expect(&["GET", "any:key"], b"$1\r\nv\r\n");
    // RESET logs the client out again.
    q.expect(&["RESET"], b"+RESET\r\n");
    q.expect(&["GET", "any:key"], NOAUTH);
}

#[test]
fn acl_user_is_limited_to_its_keys() {
    let s = Setup::start();
    let mut p = s.pair();
    p.expect(&["AUTH", "alice", "pw"], b"+OK\r\n");
    p.expect(&["ACL", "WHOAMI"], b"$5\r\nalice\r\n");
    p.expect(&["SET", "alice:1", "mine"], b"+OK\r\n");
    p.expect(&["GET", "alice:1"], b"$4\r\nmine\r\n");
    let noperm = p.starts(&["SET", "other:3", "x"], "-NOPERM");
    p.same(&["GET", "other:1"]);
    p.same(&["MSET", "alice:2", "a", "other:2", "b"]);
    p.same(&["EVAL", "return redis.call('GET', 'other:1')", "0"]);
    // On a dedicated connection too: in a transaction, in a blocking pop.
    p.expect(&["MULTI"], b"+OK\r\n");
    p.expect(&["SET", "other:3", "x"], &noperm);
    p.starts(&["EXEC"], "-EXECABORT");
    p.starts(&["BLPOP", "other:q", "0.01"], "-NOPERM");
    p.expect(&["BLPOP", "alice:q", "0.01"], b"*-1\r\n");
    p.expect(&["ACL", "WHOAMI"], b"$5\r\nalice\r\n");

    // bob may only read his keys.
    let mut b = s.pair();
    b.expect(&["AUTH", "bob", "pw2"], b"+OK\r\n");
    b.expect(&["GET", "bob:1"], b"$-1\r\n");
    b.starts(&["SET", "bob:1", "x"], "-NOPERM");
    b.starts(&["GET", "alice:1"], "-NOPERM");
    b.expect(&["PING"], b"+PONG\r\n");
}

#[test]
fn hello_3_with_auth_and_setname() {
    let s = Setup::start();
    let mut p = s.pair();
    let r = p.hello(&["HELLO", "3", "AUTH", "alice", "pw", "SETNAME", "x"]);
    assert!(r.starts_with(b"%7\r\n"), "{}", show(&r));
    p.expect(&["CLIENT", "GETNAME"], b"$1\r\nx\r\n");
    p.expect(&["ACL", "WHOAMI"], b"$5\r\nalice\r\n");
    // Both clients write to the same Valkey: only the second HSET's reply is comparable.
    p.a.cmd(&["HSET", "alice:h", "f", "v"]);
    p.expect(&["HSET", "alice:h", "f", "v"], b":0\r\n");
    p.expect(&["HGETALL", "alice:h"], b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n");
    p.expect(&["GET", "alice:none"], b"_\r\n");
    p.starts(&["HGETALL", "other:h"], "-NOPERM");
    // Switching user and protocol again.
    let r = p.hello(&["HELLO", "2", "AUTH", "default", "secret"]);
    assert!(r.starts_with(b"*14\r\n"), "{}", show(&r));
    p.expect(&["ACL", "WHOAMI"], b"$7\r\ndefault\r\n");
    p.expect(&["HGETALL", "alice:h"], b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n");
    p.expect(&["CLIENT", "GETNAME"], b"$1\r\nx\r\n");
    // A failed HELLO AUTH changes nothing.
    p.starts(&["HELLO", "3", "AUTH", "alice", "nope"], "-WRONGPASS");
    p.expect(&["ACL", "WHOAMI"], b"$7\r\ndefault\r\n");
    p.expect(&["GET", "alice:none"], b"$-1\r\n");
}

#[test]
fn clients_of_different_users_are_isolated() {
    let s = Setup::start();
    let mut alice = Raw::connect(&s.walrus.addr);
    let mut admin = Raw::connect(&s.walrus.addr);
    let mut bob = Raw::connect(&s.walrus.addr);
    let mut anon = Raw::connect(&s.walrus.addr);
    let mut alice2 = Raw::connect(&s.walrus.addr);
    assert_eq!(alice.cmd(&["AUTH", "alice", "pw"]), b"+OK\r\n");
    assert_eq!(admin.cmd(&["AUTH", "secret"]), b"+OK\r\n");
    assert_eq!(bob.cmd(&["AUTH", "bob", "pw2"]), b"+OK\r\n");
    assert_eq!(alice2.cmd(&["AUTH", "alice", "pw"]), b"+OK\r\n");
    // Interleaved, many times: each client's permissions are its own, although clients
    // of one user share pooled connections.
    for i in 0..50 {
        let other = format!("other:{i}");
        let mine = format!("alice:{i}");
        assert!(alice.cmd(&["SET", &other, "x"]).starts_with(b"-NOPERM"));
        assert_eq!(admin.cmd(&["SET", &other, "x"]), b"+OK\r\n");
        assert_eq!(alice2.cmd(&["SET", &mine, "y"]), b"+OK\r\n");
        assert!(bob.cmd(&["SET", "bob:1", "x"]).starts_with(b"-NOPERM"));
        assert_eq!(anon.cmd(&["GET", &other]), NOAUTH);
        assert_eq!(alice.cmd(&["GET", &mine]), b"$1\r\ny\r\n");
        assert_eq!(admin.cmd(&["GET", &mine]), b"$1\r\ny\r\n");
    }
    for (c, who) in [
        (&mut alice, &b"$5\r\nalice\r\n"[..]),
        (&mut admin, b"$7\r\ndefault\r\n"),
        (&mut bob, b"$3\r\nbob\r\n"),
        (&mut alice2, b"$5\r\nalice\r\n"),
    ] {
        assert_eq!(c.cmd(&["ACL", "WHOAMI"]), who);
    }
    // Pipelined by several clients at once.
    let mut batch = Vec::new();
    for i in 0..200 {
        batch.extend_from_slice(&walrus::resp::write::command([
            "SET".to_string(),
            format!("other:p{i}"),
            "v".into(),
        ]));
    }
    alice.send_raw(&batch);
    admin.send_raw(&batch);
    for _ in 0..200 {
        assert!(alice.read_frame().starts_with(b"-NOPERM"));
        assert_eq!(admin.read_frame(), b"+OK\r\n");
    }
    assert_eq!(anon.cmd(&["AUTH", "alice", "pw"]), b"+OK\r\n");
    assert_eq!(anon.cmd(&["ACL", "WHOAMI"]), b"$5\r\nalice\r\n");
}
