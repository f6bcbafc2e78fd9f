//! Side channels held like data, against a real Valkey with a slowed journal: a keyspace
//! notification or a CLIENT TRACKING invalidation reaches its client only once the journal
//! covers the write it reports, whichever way the client hears of it (RESP2 or RESP3, a
//! channel or a pattern, tracking by key, by prefix or redirected); one that cannot be
//! released in time closes its client with the reason; MONITOR is refused unless allowed.
use crate::common;
use common::*;

use std::time::Duration;

/// A RESP frame of `head` (`*` or `>`) whose items are already encoded.
fn frame(head: &str, items: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("{head}{}\r\n", items.len()).into_bytes();
    for i in items {
        out.extend_from_slice(i);
    }
    out
}

/// The keys array of an invalidation naming `k`.
const K_INVALIDATED: &[u8] = b"*1\r\n$1\r\nk\r\n";

/// Valkey with keyspace notifications on (set through walrus: walrus does not refuse it)
/// and `k` already written, and a walrus in front of it whose journal takes
/// [`JOURNAL_DELAY_MS`] a write.
fn slow_pair() -> (Valkey, Walrus, Raw) {
    let v = Valkey::start();
    let mut direct = Raw::connect(&v.addr());
    assert_eq!(direct.cmd(&["SET", "k", "v1"]), b"+OK\r\n");
    let w = Walrus::slow(&v, JOURNAL_DELAY_MS);
    let mut c = Raw::connect(&w.addr);
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]),
        b"+OK\r\n"
    );
    (v, w, direct)
}

/// A RESP3 connection to walrus.
fn resp3(w: &Walrus) -> Raw {
    let mut c = Raw::connect(&w.addr);
    assert!(c.cmd(&["HELLO", "3"]).starts_with(b"%"));
    c
}

/// `c` subscribes to `channel` (or, `pattern`, to a pattern), confirmed.
fn subscribe(c: &mut Raw, how: &str, channel: &str) {
    let r = c.cmd(&[how, channel]);
    assert!(
        r.ends_with(&[bulk(channel), b":1\r\n".to_vec()].concat()),
        "{}",
        show(&r)
    );
}

/// The Valkey client id of the connection walrus opened for the client named `name`.
fn valkey_id(direct: &mut Raw, name: &str) -> String {
    let list = String::from_utf8(direct.cmd(&["CLIENT", "LIST"])).unwrap();
    let line = list
        .lines()
        .find(|l| l.split(' ').any(|f| f == format!("name={name}")))
        .unwrap_or_else(|| panic!("no client named {name}: {list}"));
    line.split(' ')
        .find_map(|f| f.strip_prefix("id="))
        .unwrap()
        .to_string()
}

/// The rule for every kind: `watcher` (set up to hear of a write of `k`) gets nothing while
/// the journal has not covered a SET of `k` that Valkey has run, the writer's reply comes,
/// then `expect` does.
fn held_until_durable(w: &Walrus, direct: &mut Raw, mut watcher: Raw, expect: &[u8]) {
    let mut writer = Raw::connect(&w.addr);
    run_unjournaled(
        &mut writer,
        &["SET", "k", "v2"],
        direct,
        &["GET", "k"],
        b"$2\r\nv2\r\n",
    );
    if replied_within(&watcher, EARLY) {
        panic!(
            "told of the write before the journal covered it: {}",
            show(&watcher.read_frame())
        );
    }
    assert_eq!(writer.read_frame(), b"+OK\r\n");
    assert_eq!(show(&watcher.read_frame()), show(expect));
}

fn keyspace_message(head: &str) -> Vec<u8> {
    frame(
        head,
        &[&bulk("message"), &bulk("__keyspace@0__:k"), &bulk("set")],
    )
}

#[test]
fn a_keyspace_notification_to_a_resp2_subscriber_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut sub = Raw::connect(&w.addr);
    subscribe(&mut sub, "SUBSCRIBE", "__keyspace@0__:k");
    held_until_durable(&w, &mut direct, sub, &keyspace_message("*"));
}

#[test]
fn a_keyspace_notification_to_a_resp3_subscriber_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut sub = resp3(&w);
    subscribe(&mut sub, "SUBSCRIBE", "__keyspace@0__:k");
    held_until_durable(&w, &mut direct, sub, &keyspace_message(">"));
}

#[test]
fn a_keyevent_notification_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut sub = Raw::connect(&w.addr);
    subscribe(&mut sub, "SUBSCRIBE", "__keyevent@0__:set");
    let expect = frame(
        "*",
        &[&bulk("message"), &bulk("__keyevent@0__:set"), &bulk("k")],
    );
    held_until_durable(&w, &mut direct, sub, &expect);
}

#[test]
fn a_notification_to_a_pattern_subscriber_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut sub = Raw::connect(&w.addr);
    subscribe(&mut sub, "PSUBSCRIBE", "__keyspace@0__:*");
    let expect = frame(
        "*",
        &[
            &bulk("pmessage"),
            &bulk("__keyspace@0__:*"),
            &bulk("__keyspace@0__:k"),
            &bulk("set"),
        ],
    );
    held_until_durable(&w, &mut direct, sub, &expect);
}

#[test]
fn a_tracking_invalidation_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut tracker = resp3(&w);
    assert_eq!(tracker.cmd(&["CLIENT", "TRACKING", "ON"]), b"+OK\r\n");
    assert_eq!(tracker.cmd(&["GET", "k"]), b"$2\r\nv1\r\n");
    let expect = frame(">", &[&bulk("invalidate"), K_INVALIDATED]);
    held_until_durable(&w, &mut direct, tracker, &expect);
}

#[test]
fn a_tracking_invalidation_in_optin_and_optout_modes_waits_for_the_journal() {
    for (mode, before_get) in [
        ("OPTIN", Some(["CLIENT", "CACHING", "YES"])),
        ("OPTOUT", None),
    ] {
        let (_v, w, mut direct) = slow_pair();
        let mut tracker = resp3(&w);
        assert_eq!(tracker.cmd(&["CLIENT", "TRACKING", "ON", mode]), b"+OK\r\n");
        if let Some(caching) = before_get {
            assert_eq!(tracker.cmd(&caching), b"+OK\r\n");
        }
        assert_eq!(tracker.cmd(&["GET", "k"]), b"$2\r\nv1\r\n");
        let expect = frame(">", &[&bulk("invalidate"), K_INVALIDATED]);
        held_until_durable(&w, &mut direct, tracker, &expect);
    }
}

#[test]
fn a_broadcast_tracking_invalidation_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut tracker = resp3(&w);
    assert_eq!(
        tracker.cmd(&["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "k"]),
        b"+OK\r\n"
    );
    let expect = frame(">", &[&bulk("invalidate"), K_INVALIDATED]);
    held_until_durable(&w, &mut direct, tracker, &expect);
}

#[test]
fn a_tracking_invalidation_redirected_to_a_resp2_subscriber_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut target = Raw::connect(&w.addr);
    assert_eq!(target.cmd(&["CLIENT", "SETNAME", "target"]), b"+OK\r\n");
    subscribe(&mut target, "SUBSCRIBE", "__redis__:invalidate");
    let id = valkey_id(&mut direct, "target");
    let mut tracker = Raw::connect(&w.addr);
    assert_eq!(
        tracker.cmd(&["CLIENT", "TRACKING", "ON", "REDIRECT", &id]),
        b"+OK\r\n"
    );
    assert_eq!(tracker.cmd(&["GET", "k"]), b"$2\r\nv1\r\n");
    let expect = frame(
        "*",
        &[
            &bulk("message"),
            &bulk("__redis__:invalidate"),
            K_INVALIDATED,
        ],
    );
    held_until_durable(&w, &mut direct, target, &expect);
}

#[test]
fn a_tracking_invalidation_redirected_to_a_resp3_client_waits_for_the_journal() {
    let (_v, w, mut direct) = slow_pair();
    let mut target = resp3(&w);
    subscribe(&mut target, "SUBSCRIBE", "__redis__:invalidate");
    // Asked on its own (dedicated) connection to Valkey.
    let id = String::from_utf8(target.cmd(&["CLIENT", "ID"])).unwrap();
    let id = id.trim_start_matches(':').trim_end();
    let mut tracker = Raw::connect(&w.addr);
    assert_eq!(
        tracker.cmd(&["CLIENT", "TRACKING", "ON", "REDIRECT", id]),
        b"+OK\r\n"
    );
    assert_eq!(tracker.cmd(&["GET", "k"]), b"$2\r\nv1\r\n");
    let expect = frame(">", &[&bulk("invalidate"), K_INVALIDATED]);
    held_until_durable(&w, &mut direct, target, &expect);
}

/// A PUBLISH is not data: it reaches a subscriber at once, while a write is pending. But a
/// subscriber gets its messages in Valkey's order: one that Valkey sent after a held
/// notification waits behind it.
#[test]
fn a_published_message_passes_unless_a_held_notification_is_before_it() {
    let (_v, w, mut direct) = slow_pair();
    let mut sub = Raw::connect(&w.addr);
    subscribe(&mut sub, "SUBSCRIBE", "__keyspace@0__:k");
    subscribe_more(&mut sub, "news");
    let mut news_only = resp3(&w);
    subscribe(&mut news_only, "SUBSCRIBE", "news");
    let mut writer = Raw::connect(&w.addr);
    run_unjournaled(
        &mut writer,
        &["SET", "k", "v2"],
        &mut direct,
        &["GET", "k"],
        b"$2\r\nv2\r\n",
    );
    assert_eq!(direct.cmd(&["PUBLISH", "news", "hello"]), b":2\r\n");
    let pushed = frame(">", &[&bulk("message"), &bulk("news"), &bulk("hello")]);
    assert_eq!(show(&news_only.read_frame()), show(&pushed));
    assert!(
        !replied_within(&writer, Duration::from_millis(1)),
        "the write was durable before the message came: nothing shows it was not held"
    );
    assert!(
        !replied_within(&sub, EARLY),
        "a message went ahead of the notification held before it"
    );
    assert_eq!(writer.read_frame(), b"+OK\r\n");
    assert_eq!(show(&sub.read_frame()), show(&keyspace_message("*")));
    let news = frame("*", &[&bulk("message"), &bulk("news"), &bulk("hello")]);
    assert_eq!(show(&sub.read_frame()), show(&news));
}

/// A second subscription on a RESP2 subscriber: confirmed with the count of two.
fn subscribe_more(c: &mut Raw, channel: &str) {
    let r = c.cmd(&["SUBSCRIBE", channel]);
    assert!(
        r.ends_with(&[bulk(channel), b":2\r\n".to_vec()].concat()),
        "{}",
        show(&r)
    );
}

/// A notification that cannot be released within `durability.max_hold_ms` is never
/// delivered: its subscriber gets the reason and is closed (a subscriber that silently
/// missed it would go on with a stale view), in either protocol.
#[test]
fn a_notification_held_past_max_hold_closes_its_subscriber_with_the_reason() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[durability]\nmax_hold_ms = 300\n")
        .slow_journal(2000)
        .start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]),
        b"+OK\r\n"
    );
    let mut resp2 = Raw::connect(&w.addr);
    subscribe(&mut resp2, "SUBSCRIBE", "__keyspace@0__:k");
    let mut resp3 = resp3(&w);
    subscribe(&mut resp3, "SUBSCRIBE", "__keyspace@0__:k");
    let r = show(&c.cmd(&["SET", "k", "v"]));
    assert!(
        r.starts_with("-ERR walrus: this write was not journaled"),
        "{r}"
    );
    for mut sub in [resp2, resp3] {
        let r = show(&sub.read_frame());
        assert!(
            r.starts_with(
                "-ERR walrus: a keyspace notification or tracking invalidation for this connection \
                 reports a write not journaled within 300 ms (durability.max_hold_ms)"
            ),
            "{r}"
        );
        assert!(sub.closed());
    }
}

#[test]
fn monitor_is_refused_naming_the_setting_that_allows_it() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    let r = show(&c.cmd(&["MONITOR"]));
    assert!(
        r.starts_with("-ERR walrus: MONITOR is refused: it shows every command")
            && r.contains("(proxy.allow_monitor lets it through)"),
        "{r}"
    );
    assert_eq!(
        c.cmd(&["PING"]),
        b"+PONG\r\n",
        "the connection stays usable"
    );
}

#[test]
fn monitor_is_relayed_when_allowed() {
    let v = Valkey::start();
    let w = Walrus::build()
        .upstream(&v.addr())
        .config("[proxy]\nallow_monitor = true\n")
        .start();
    let mut monitor = Raw::connect(&w.addr);
    assert_eq!(monitor.cmd(&["MONITOR"]), b"+OK\r\n");
    assert_eq!(
        Raw::connect(&w.addr).cmd(&["SET", "watched", "v"]),
        b"+OK\r\n"
    );
    // walrus's own commands (ROLE, its replica link's) show too.
    while !show(&monitor.read_frame()).contains("\"SET\" \"watched\" \"v\"") {}
}
