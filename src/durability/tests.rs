use super::dirty::Scope;
use super::*;
use bytes::Bytes;
use tokio::sync::oneshot;

fn held(reply: &str) -> (Held, oneshot::Receiver<Bytes>) {
    let (tx, rx) = reply_channel(&ClientOutput::unlimited());
    (Held::new(tx, Bytes::copy_from_slice(reply.as_bytes())), rx)
}

/// A write of `k` whose reply waits for `offset`.
fn held_write(d: &Durability, k: &str, offset: u64, epoch: u64) -> oneshot::Receiver<Bytes> {
    let mark = d.begin_write(key(k)).unwrap();
    let (w, rx) = held("+OK\r\n");
    d.settle_batch(offset, epoch, vec![w], vec![mark]);
    rx
}

fn key(k: &str) -> Scope {
    Scope::Keys {
        db: 0,
        keys: vec![Bytes::copy_from_slice(k.as_bytes())],
    }
}

#[test]
fn writes_are_refused_until_attached() {
    let d = Durability::new(1 << 20, 1 << 20);
    let refused = d.begin_write(key("a")).unwrap_err();
    assert!(refused.reply().starts_with(b"-MISCONF"));
    d.attach("p", 100, true, true, 0);
    assert!(d.begin_write(key("a")).is_ok());
    d.detach();
    assert!(d.begin_write(key("a")).is_err());
}

#[test]
fn a_fenced_journal_stays_fenced_across_an_attach() {
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 100, true, true, 0);
    d.fail("journal segment seg-00003.wal is gone");
    d.attach("p", 200, true, false, 0);
    assert!(matches!(d.status(), LinkState::Failed(_)));
    assert!(d
        .begin_write(key("a"))
        .unwrap_err()
        .reply()
        .starts_with(b"-MISCONF walrus: journal failed"));
}

#[test]
fn a_write_reply_and_a_dirty_read_wait_for_the_durable_offset() {
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 100, true, true, 0);
    let mut w_rx = held_write(&d, "a", 150, 1);
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    d.read_reply(&key("a"), 1, r);
    let (clean, mut clean_rx) = held("$1\r\nc\r\n");
    d.read_reply(&key("b"), 1, clean);
    assert!(
        clean_rx.try_recv().is_ok(),
        "a clean read is released at once"
    );
    assert!(w_rx.try_recv().is_err() && r_rx.try_recv().is_err());
    d.set_durable(149);
    assert!(w_rx.try_recv().is_err() && r_rx.try_recv().is_err());
    d.set_durable(150);
    assert_eq!(&w_rx.try_recv().unwrap()[..], b"+OK\r\n");
    assert_eq!(&r_rx.try_recv().unwrap()[..], b"$1\r\nv\r\n");
    assert_eq!(d.snapshot().2, 0, "no held bytes left");
}

#[test]
fn a_reply_held_past_the_bound_gets_an_error_and_its_keys_stay_dirty() {
    let d = Durability::new(1 << 20, 1 << 20).with_max_hold(std::time::Duration::from_secs(30));
    d.attach("p", 100, true, true, 0);
    let mut w_rx = held_write(&d, "a", 150, 1);
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    d.read_reply(&key("a"), 1, r);
    let now = std::time::Instant::now();
    d.expire_held(now + std::time::Duration::from_secs(29));
    assert!(w_rx.try_recv().is_err() && r_rx.try_recv().is_err());
    d.expire_held(now + std::time::Duration::from_secs(31));
    let reply = w_rx.try_recv().unwrap();
    assert!(reply.starts_with(b"-ERR walrus: this write was not journaled within 30000 ms"));
    assert!(r_rx
        .try_recv()
        .unwrap()
        .starts_with(b"-ERR walrus: a write this read depends on"));
    assert_eq!(d.snapshot().2, 0, "no held bytes left");
    // The write may have run: its key is shown only once it is durable.
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    d.read_reply(&key("a"), 1, r);
    assert!(r_rx.try_recv().is_err());
    d.set_durable(150);
    assert_eq!(&r_rx.try_recv().unwrap()[..], b"$1\r\nv\r\n");
}

#[tokio::test(start_paused = true)]
async fn a_write_waiting_for_room_is_refused_past_the_bound() {
    let d = Durability::new(1 << 20, 1 << 20).with_max_hold(std::time::Duration::from_secs(30));
    d.attach("p", 0, true, true, 0);
    let mark = d.begin_write(key("a")).unwrap();
    d.settle_batch(2 << 20, 1, Vec::new(), vec![mark]);
    let refused = d.write_room().await.unwrap_err();
    assert!(refused
        .reply()
        .starts_with(b"-MISCONF walrus: no room for writes within 30000 ms"));
}

#[test]
fn a_valkey_ahead_of_the_journal_at_attach_makes_every_read_wait() {
    // Even when it is another process than before: its new epoch must not drop the mark.
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 100, true, true, 0);
    d.detach();
    d.attach("q", 100, true, false, 150);
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    assert!(d.read_reply(&key("a"), 2, r).is_none());
    assert!(
        r_rx.try_recv().is_err(),
        "held until the journal covers 150"
    );
    d.set_durable(150);
    assert_eq!(&r_rx.try_recv().unwrap()[..], b"$1\r\nv\r\n");
}

#[test]
fn another_process_continuing_the_history_fails_what_the_dead_one_held() {
    // Valkey process p ran a write at 150; the journal ends at 100 when p dies. Process
    // q loaded an RDB ending at 100 and continues the same history: its own writes reach
    // offset 150, which must not release p's reply (that write is gone).
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 100, true, true, 0);
    let mut w_rx = held_write(&d, "a", 150, 1);
    d.detach();
    d.attach("p", 100, true, false, 0);
    assert!(
        w_rx.try_recv().is_err(),
        "the same process re-attaching keeps it"
    );
    d.detach();
    d.attach("q", 100, true, false, 0);
    assert!(w_rx
        .try_recv()
        .unwrap()
        .starts_with(b"-ERR walrus: Valkey's replication history changed"));
    assert_eq!(d.attached(None), Some((2, "q".to_string())));
}

#[test]
fn a_failed_journal_turns_held_replies_into_errors() {
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 0, true, true, 0);
    let mut w_rx = held_write(&d, "a", 10, 1);
    d.fail("fsync failed");
    assert!(w_rx.try_recv().unwrap().starts_with(b"-MISCONF"));
    assert!(d
        .begin_write(key("a"))
        .unwrap_err()
        .reply()
        .starts_with(b"-MISCONF"));
    // The failed write ran in Valkey: reading its key fails; other keys read fine.
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    d.read_reply(&key("a"), 1, r);
    assert!(r_rx.try_recv().unwrap().starts_with(b"-MISCONF"));
    let (clean, mut clean_rx) = held("$1\r\nc\r\n");
    d.read_reply(&key("b"), 1, clean);
    assert_eq!(&clean_rx.try_recv().unwrap()[..], b"$1\r\nc\r\n");
}

#[test]
fn an_offset_from_another_history_is_never_acknowledged() {
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 5000, true, true, 0);
    let mark = d.begin_write(key("a")).unwrap();
    let (w, mut w_rx) = held("+OK\r\n");
    // A restarted Valkey counts from 0 again: 42 is below where this history began.
    d.settle_batch(42, 1, vec![w], vec![mark]);
    assert!(w_rx
        .try_recv()
        .unwrap()
        .starts_with(b"-ERR walrus: Valkey's replication history changed"));
}

#[test]
fn a_new_history_from_offset_zero_is_told_apart_by_its_epoch() {
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 0, true, true, 0);
    let old = d.epoch();
    let mark = d.begin_write(key("a")).unwrap();
    let (w, mut w_rx) = held("+OK\r\n");
    // A held read of the dirty key, and a held write: both must fail, not be released,
    // when Valkey is lost and restored.
    d.settle_batch(40, old, vec![w], vec![mark]);
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    d.read_reply(&key("a"), old, r);
    d.begin_restore();
    assert!(w_rx
        .try_recv()
        .unwrap()
        .starts_with(b"-ERR walrus: Valkey's replication history changed"));
    assert!(r_rx
        .try_recv()
        .unwrap()
        .starts_with(b"-ERR walrus: Valkey's replication history changed"));
    // While restoring: reads and writes get Valkey's -LOADING.
    assert!(d.admit_read().unwrap_err().reply().starts_with(b"-LOADING"));
    assert!(d
        .begin_write(key("b"))
        .unwrap_err()
        .reply()
        .starts_with(b"-LOADING"));
    let (r, mut r_rx) = held("$-1\r\n");
    d.read_reply(&key("a"), d.epoch(), r);
    assert!(r_rx.try_recv().unwrap().starts_with(b"-LOADING"));
    // Attached again, from offset 0 of a new history: a batch that ran on a connection
    // of the old epoch is refused even though its offset (10) looks covered.
    d.attach("p", 0, true, true, 0);
    d.set_durable(100);
    let mark = d.begin_write(key("b")).unwrap();
    let (w, mut w_rx) = held("+OK\r\n");
    d.settle_batch(10, old, vec![w], vec![mark]);
    assert!(w_rx
        .try_recv()
        .unwrap()
        .starts_with(b"-ERR walrus: Valkey's replication history changed"));
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    d.read_reply(&key("c"), old, r);
    assert!(r_rx.try_recv().unwrap().starts_with(b"-LOADING"));
    // The current epoch works as before.
    let mark = d.begin_write(key("b")).unwrap();
    let (w, mut w_rx) = held("+OK\r\n");
    d.settle_batch(10, d.epoch(), vec![w], vec![mark]);
    assert_eq!(&w_rx.try_recv().unwrap()[..], b"+OK\r\n");
}

#[test]
fn reads_held_behind_a_lost_write_get_an_error() {
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 0, true, true, 0);
    let e = d.epoch();
    let mark = d.begin_write(key("a")).unwrap();
    let (r, mut r_rx) = held("$1\r\nv\r\n");
    d.read_reply(&key("a"), e, r);
    assert!(r_rx.try_recv().is_err(), "held while the write is pending");
    d.abandon_batch(Vec::new(), vec![mark], Bytes::new(), None);
    assert!(r_rx.try_recv().unwrap().starts_with(b"-ERR"));
    assert_eq!(d.snapshot().2, 0);
}

/// A batch whose connection broke after its replies arrived, with Valkey's offset learned
/// afterwards: the replies are real outcomes, released once the journal covers it (they got
/// the error for a lost connection); without one, they get that error.
#[test]
fn replies_of_a_broken_batch_settle_at_the_offset_learned_afterwards() {
    let d = Durability::new(1 << 20, 1 << 20);
    d.attach("p", 100, true, true, 0);
    let e = d.epoch();
    let mark = d.begin_write(key("a")).unwrap();
    let (w, mut w_rx) = held("+OK\r\n");
    d.abandon_batch(
        vec![w],
        vec![mark],
        Bytes::from_static(b"-ERR lost\r\n"),
        Some((150, e)),
    );
    assert!(
        w_rx.try_recv().is_err(),
        "held until the journal covers 150"
    );
    d.set_durable(150);
    assert_eq!(&w_rx.try_recv().unwrap()[..], b"+OK\r\n");
    let (w, mut w_rx) = held("+OK\r\n");
    d.abandon_batch(
        vec![w],
        Vec::new(),
        Bytes::from_static(b"-ERR lost\r\n"),
        None,
    );
    assert_eq!(&w_rx.try_recv().unwrap()[..], b"-ERR lost\r\n");
}
