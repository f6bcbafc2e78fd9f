//! Client certificates as ACL users (`tls.auth_clients_user`, Valkey 9's
//! `tls-auth-clients-user`): a client whose certificate names an enabled `nopass` user runs
//! as that user, may do what the user may and nothing more; a certificate that names no
//! enabled user leaves its client the default user; one that names a user with a password
//! is refused, saying why; and AUTH afterwards behaves as on Valkey, a certificate user
//! taking no password as a Valkey user with none would not (src/proxy/cert_user.rs).
//!
//! Valkey requires a password (`requirepass secret`): the default user must authenticate.

use crate::common;
use common::certs::Leaf;
use common::tls::{tls_addr, TlsFiles, TlsRaw};
use common::*;

const LOCALHOST: &str = "localhost";
const NOAUTH: &[u8] = b"-NOAUTH Authentication required.\r\n";
const WRONGPASS: &[u8] = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
const DAVE: &str = "urn:valkey:user:dave";

/// Valkey with its users: alice and dave are certificate users (nopass), bob has a
/// password, carol is disabled.
fn valkey() -> Valkey {
    let v = Valkey::start_with(&["--requirepass", "secret"]);
    let mut admin = Raw::connect(&v.addr());
    assert_eq!(admin.cmd(&["AUTH", "secret"]), b"+OK\r\n");
    for user in [
        &["alice", "on", "nopass", "~alice:*", "+@all"][..],
        &["bob", "on", ">pw2", "~bob:*", "+@all"],
        &["carol", "off", "nopass", "~*", "+@all"],
        &[DAVE, "on", "nopass", "~dave:*", "+@all"],
    ] {
        let mut cmd = vec!["ACL", "SETUSER"];
        cmd.extend_from_slice(user);
        assert_eq!(admin.cmd(&cmd), b"+OK\r\n");
    }
    v
}

/// walrus in front of `v` (as its own user: the default one, by password), mapping
/// certificates as `how` says; durable or a plain proxy (one journal per Valkey).
fn walrus(v: &Valkey, files: &TlsFiles, how: &str, durable: bool, metrics: &str) -> Walrus {
    let mut config = String::from("[upstream]\npassword = \"secret\"\n");
    if !durable {
        config.push_str("[durability]\nenabled = false\n");
    }
    Walrus::build()
        .upstream(&v.addr())
        .config(&config)
        .config(&files.toml(&format!("auth_clients_user = \"{how}\"")))
        .args(&["--metrics-listen", metrics])
        .start()
}

#[test]
fn a_certificates_cn_names_the_acl_user_its_client_runs_as() {
    let v = valkey();
    let files = TlsFiles::new();
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = walrus(&v, &files, "CN", true, &metrics);
    let tls = tls_addr(&w.proc);
    let as_cn = |cn: &str| {
        let cert = files.client_cert(&Leaf::client(cn));
        TlsRaw::connect(&tls, &files.client(Some(&cert)), LOCALHOST).unwrap()
    };

    // CN=alice: alice, with what alice may do and nothing more, pooled or on a dedicated
    // connection (a transaction).
    let mut alice = as_cn("alice");
    assert_eq!(alice.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(alice.cmd(&["SET", "alice:1", "a"]), b"+OK\r\n");
    assert_eq!(alice.cmd(&["GET", "alice:1"]), bulk("a"));
    let denied = alice.cmd(&["SET", "bob:1", "x"]);
    assert!(denied.starts_with(b"-NOPERM"), "{}", show(&denied));
    assert_eq!(alice.cmd(&["MULTI"]), b"+OK\r\n");
    assert_eq!(alice.cmd(&["SET", "alice:2", "b"]), b"+QUEUED\r\n");
    assert_eq!(alice.cmd(&["ACL", "WHOAMI"]), b"+QUEUED\r\n");
    assert_eq!(alice.cmd(&["EXEC"]), b"*2\r\n+OK\r\n$5\r\nalice\r\n");
    let denied = alice.cmd(&["GET", "bob:1"]);
    assert!(denied.starts_with(b"-NOPERM"), "{}", show(&denied));

    // AUTH later behaves as on Valkey: a good password switches user, a wrong one leaves
    // the client as it was, RESET makes it the default user again.
    assert_eq!(alice.cmd(&["AUTH", "bob", "wrong"]), WRONGPASS);
    assert_eq!(alice.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(alice.cmd(&["AUTH", "bob", "pw2"]), b"+OK\r\n");
    assert_eq!(alice.cmd(&["ACL", "WHOAMI"]), bulk("bob"));
    assert_eq!(alice.cmd(&["RESET"]), b"+RESET\r\n");
    assert_eq!(alice.cmd(&["GET", "alice:1"]), NOAUTH);

    // A CN that names no user, or a disabled one: the default user (which must AUTH here).
    for cn in ["nobody", "carol"] {
        let mut c = as_cn(cn);
        assert_eq!(c.cmd(&["GET", "alice:1"]), NOAUTH, "CN={cn}");
        assert_eq!(c.cmd(&["AUTH", "secret"]), b"+OK\r\n");
        assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("default"));
    }

    // A CN that names a user with a password: walrus cannot act as bob without it, says so,
    // and closes the connection.
    let mut bob = as_cn("bob");
    let e = bob.try_read_frame().unwrap();
    assert!(
        e.starts_with(
            b"-ERR walrus: the client certificate names ACL user 'bob', who has a password"
        ),
        "{}",
        show(&e)
    );
    assert!(bob.try_cmd(&["PING"]).is_none());

    // Certificate users take no password: AUTH naming one is refused, on either port, as
    // Valkey refuses AUTH for a user with no password; others' AUTH is untouched.
    let mut plain = Raw::connect(&w.addr);
    assert_eq!(plain.cmd(&["AUTH", "alice", "anything"]), WRONGPASS);
    assert_eq!(plain.cmd(&["HELLO", "3", "AUTH", "alice", "x"]), WRONGPASS);
    assert_eq!(plain.cmd(&["GET", "alice:1"]), NOAUTH);
    assert_eq!(plain.cmd(&["AUTH", "bob", "pw2"]), b"+OK\r\n");
    assert_eq!(plain.cmd(&["AUTH", "default", "secret"]), b"+OK\r\n");

    let users = |result: &str| {
        metric(
            &metrics,
            &format!("walrus_tls_cert_users_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(users("mapped"), 1.0);
    assert_eq!(users("unmapped"), 2.0);
    assert_eq!(users("refused"), 1.0);
    assert_eq!(users("auth_refused"), 2.0);
}

#[test]
fn a_certificates_uris_or_nothing_name_the_user_as_configured() {
    let v = valkey();
    let files = TlsFiles::new();
    let connect = |w: &Walrus, leaf: &Leaf| {
        let cert = files.client_cert(leaf);
        TlsRaw::connect(&tls_addr(&w.proc), &files.client(Some(&cert)), LOCALHOST).unwrap()
    };

    // URI: the first URI that names an enabled user.
    let uri = walrus(
        &v,
        &files,
        "URI",
        false,
        &format!("127.0.0.1:{}", free_port()),
    );
    let dave = Leaf::client("alice").uris(&["urn:valkey:user:ghost", "carol", DAVE]);
    let mut c = connect(&uri, &dave);
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk(DAVE));
    assert_eq!(c.cmd(&["SET", "dave:1", "d"]), b"+OK\r\n");
    assert!(c.cmd(&["SET", "alice:1", "d"]).starts_with(b"-NOPERM"));
    // Its CN does not count.
    let mut c = connect(&uri, &Leaf::client("alice"));
    assert_eq!(c.cmd(&["GET", "k"]), NOAUTH);

    // off: the certificate names nobody, and AUTH is Valkey's, nopass users included.
    let off = walrus(
        &v,
        &files,
        "off",
        false,
        &format!("127.0.0.1:{}", free_port()),
    );
    let mut c = connect(&off, &Leaf::client("alice"));
    assert_eq!(c.cmd(&["GET", "k"]), NOAUTH);
    assert_eq!(c.cmd(&["AUTH", "alice", "anything"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("alice"));
}

/// A session pinned to a connection of its own (WATCH, MULTI, a blocking command) answers
/// `HELLO ... AUTH` there: walrus checks those credentials first, as on a pooled session,
/// so no one logs in as a certificate user with a password (issue 25's review: anyone,
/// on the plaintext port, became alice with `HELLO 2 AUTH alice anything`).
#[test]
fn hello_auth_on_a_pinned_session_cannot_name_a_certificate_user() {
    let v = valkey();
    let files = TlsFiles::new();
    let w = walrus(&v, &files, "CN", false, "");
    let mut c = Raw::connect(&w.addr);
    // Pinned: Valkey refuses the WATCH itself, but the session has its own connection.
    assert_eq!(c.cmd(&["WATCH", "k"]), NOAUTH);
    assert_eq!(
        c.cmd(&["HELLO", "2", "AUTH", "alice", "anything"]),
        WRONGPASS
    );
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), NOAUTH);
    // A user with a password still logs in that way, and runs as that user.
    assert!(c
        .cmd(&["HELLO", "2", "AUTH", "bob", "pw2"])
        .starts_with(b"*"));
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("bob"));
    assert_eq!(c.cmd(&["HELLO", "2", "AUTH", "bob", "wrong"]), WRONGPASS);
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), bulk("bob"));
}
