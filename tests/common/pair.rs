//! Two clients driven in lockstep, one to Valkey directly and one through walrus: every
//! reply must be the same bytes.
use super::{show, Raw};
use redis_protocol::resp2::types::OwnedFrame;

pub struct Pair {
    /// Talks to Valkey A directly.
    pub a: Raw,
    /// Talks to walrus (in front of Valkey B).
    pub w: Raw,
}

pub fn show_args<A: AsRef<[u8]>>(args: &[A]) -> String {
    args.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(a.as_ref())))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Pair {
    /// Sends `args` to both; returns (Valkey's reply, walrus's reply).
    pub fn both<A: AsRef<[u8]>>(&mut self, args: &[A]) -> (Vec<u8>, Vec<u8>) {
        (self.a.cmd(args), self.w.cmd(args))
    }

    /// Both replies must be the same bytes; returns them.
    #[track_caller]
    pub fn same<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Vec<u8> {
        let (a, w) = self.both(args);
        assert!(
            a == w,
            "reply to {} differs\n valkey: {}\n walrus: {}",
            show_args(args),
            show(&a),
            show(&w)
        );
        a
    }

    /// Same bytes, and not an error reply.
    #[track_caller]
    pub fn ok<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Vec<u8> {
        let r = self.same(args);
        assert!(
            !r.starts_with(b"-"),
            "{} failed on both: {}",
            show_args(args),
            show(&r)
        );
        r
    }

    /// Same bytes, and an error reply.
    #[track_caller]
    pub fn err<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Vec<u8> {
        let r = self.same(args);
        assert!(
            r.starts_with(b"-"),
            "{} should fail: {}",
            show_args(args),
            show(&r)
        );
        r
    }

    /// Same bytes, equal to `expected`.
    #[track_caller]
    pub fn expect<A: AsRef<[u8]>>(&mut self, args: &[A], expected: &[u8]) {
        let r = self.same(args);
        assert!(
            r == expected,
            "{}: expected {}, got {}",
            show_args(args),
            show(expected),
            show(&r)
        );
    }

    /// Runs a sequence of commands, each must succeed identically.
    #[track_caller]
    pub fn run(&mut self, cmds: &[&[&str]]) {
        for c in cmds {
            self.ok(c);
        }
    }

    /// A HELLO reply: the same but for the connection id.
    #[track_caller]
    pub fn hello(&mut self, args: &[&str]) -> Vec<u8> {
        let (a, w) = self.both(args);
        assert!(!a.starts_with(b"-"), "{}", show(&a));
        assert_eq!(show(&hello_without_id(&w)), show(&hello_without_id(&a)));
        a
    }

    pub fn send_both(&mut self, bytes: &[u8]) {
        self.a.send_raw(bytes);
        self.w.send_raw(bytes);
    }

    /// Reads the next frame from both (a push, a late reply); they must be equal.
    #[track_caller]
    pub fn read_same(&mut self) -> Vec<u8> {
        let (a, w) = (self.a.read_frame(), self.w.read_frame());
        assert!(
            a == w,
            "next frame differs\n valkey: {}\n walrus: {}",
            show(&a),
            show(&w)
        );
        a
    }

    /// Same reply once the elements of its (possibly nested) arrays are sorted: for replies
    /// whose order comes from a hash table, seeded at random per server.
    #[track_caller]
    pub fn same_unordered<A: AsRef<[u8]>>(&mut self, args: &[A]) -> OwnedFrame {
        let (a, w) = self.both(args);
        let (fa, fw) = (sorted(decode(&a)), sorted(decode(&w)));
        assert!(
            fa == fw,
            "reply to {} differs beyond order\n valkey: {}\n walrus: {}",
            show_args(args),
            show(&a),
            show(&w)
        );
        fa
    }

    /// Same reply, starting with `prefix`.
    #[track_caller]
    pub fn starts(&mut self, args: &[&str], prefix: &str) -> Vec<u8> {
        let r = self.same(args);
        assert!(
            r.starts_with(prefix.as_bytes()),
            "{}: expected {prefix}..., got {}",
            show_args(args),
            show(&r)
        );
        r
    }
}

/// Removes the one field of a HELLO reply that differs between connections: the client id.
pub fn hello_without_id(reply: &[u8]) -> Vec<u8> {
    let key = b"$2\r\nid\r\n:";
    let at = reply
        .windows(key.len())
        .position(|w| w == key)
        .unwrap_or_else(|| panic!("no id in HELLO reply {}", show(reply)))
        + key.len();
    let end = at + reply[at..].iter().position(|&b| b == b'\r').unwrap();
    assert!(reply[at..end].iter().all(u8::is_ascii_digit));
    [&reply[..at], b"ID", &reply[end..]].concat()
}

pub fn decode(b: &[u8]) -> OwnedFrame {
    let (f, n) = redis_protocol::resp2::decode::decode(b)
        .expect("RESP2")
        .expect("complete frame");
    assert_eq!(n, b.len());
    f
}

/// Sorts every array whose elements are all arrays or all not: lists of keys or of
/// records, but not a SCAN reply's `[cursor, keys]` or a record's fields.
pub fn sorted(f: OwnedFrame) -> OwnedFrame {
    match f {
        OwnedFrame::Array(items) => {
            let mut items: Vec<OwnedFrame> = items.into_iter().map(sorted).collect();
            let arrays = items
                .iter()
                .filter(|i| matches!(i, OwnedFrame::Array(_)))
                .count();
            if arrays == 0 || arrays == items.len() {
                items.sort_by_key(|i| format!("{i:?}"));
            }
            OwnedFrame::Array(items)
        }
        other => other,
    }
}
