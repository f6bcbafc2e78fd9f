//! The data directory proves what it holds, with real processes: one walrus owns it (a
//! second `walrus serve` beside a running one exits, naming the first, having touched
//! nothing), and its parts belong together (a lost checkpoint manifest, or a journal
//! manifest copied in from another data directory, is refused by `serve` and `verify`
//! alike, naming the file and the way out, and nothing is deleted). A directory written
//! before walrus recorded identities is adopted when its parts agree.
mod common;
use common::*;

const OK: &[u8] = b"+OK\r\n";
/// A person runs `walrus serve` by hand beside the one systemd runs (or two pods share a
/// volume): the second exits at once with 1 (trying again succeeds once the first stops),
/// naming the first's pid, before it starts a Valkey of its own. The first keeps serving,
/// and its Valkey's socket stays: a second valkey-server on it would have replaced it, and
/// unlinked it when stopped, leaving the first walrus unable to reach its Valkey again.
#[test]
fn a_second_serve_on_a_running_data_directory_exits_and_the_first_keeps_its_valkey() {
    let w = Walrus::build().start();
    let data = w.data.path().join("data");
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), OK);
    let socket = data.join("run/valkey.sock");
    assert!(socket.exists(), "{}", socket.display());
    let journal = data.join("journal/MANIFEST");
    let before = std::fs::read(&journal).unwrap();

    let (mut second, _cfg) = Walrus::build().data(&data).spawn();
    let status = second
        .wait_exit(START_TIMEOUT)
        .expect("the second walrus exits");
    let log = second.log_text();
    // The first walrus's Valkey is still reachable on its socket, by a new connection.
    let mut v = Raw::try_connect(&format!("unix:{}", socket.display())).unwrap_or_else(|e| {
        panic!("the first walrus's Valkey socket is gone ({e}); the second walrus's log:\n{log}")
    });
    assert_eq!(v.cmd(&["GET", "k"]), bulk("v"));
    assert_eq!(status.code(), Some(1), "{log}");
    let first = w.proc.child.id();
    for part in [
        format!("{} is in use", data.display()),
        format!("pid {first}"),
        "walrus serve".to_string(),
    ] {
        assert!(log.contains(&part), "{part:?} missing:\n{log}");
    }
    assert!(
        !log.contains("valkey-server"),
        "the second walrus started a Valkey:\n{log}"
    );
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        before,
        "the journal was touched"
    );
    // The first goes on serving, writes included.
    assert_eq!(c.cmd(&["SET", "k2", "v2"]), OK);
    assert_eq!(c.cmd(&["GET", "k"]), bulk("v"));
}
