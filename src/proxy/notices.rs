//! Which of the messages Valkey sends a client unasked report writes, and what they name: the
//! durability gate holds those until the journal covers the writes
//! ([`crate::durability::notices`]). Read from the frame's own text, RESP2 or RESP3:
//!
//! - a keyspace notification: a `message` (or a pattern's `pmessage`) on
//!   `__keyspace@<db>__:<key>` names that key; on `__keyevent@<db>__:<event>` the key is the
//!   payload;
//! - a tracking invalidation: the RESP3 push `invalidate` with the keys (in whichever
//!   database: tracking does not tell), or a `message` on `__redis__:invalidate` for a RESP2
//!   client that a tracking client redirects to; a null in place of the keys is a flush and
//!   names everything.
//!
//! A message published with PUBLISH on any other channel is not data (walrus holds what
//! clients read, not what they tell each other) and names nothing; nor do subscription
//! confirmations and PING's answers. An array or push of another kind, or one of the above
//! that cannot be read, names everything: a message walrus cannot map waits for every
//! pending write rather than leak one. Replies that are not arrays (a MONITOR line, `+OK`,
//! an error) name nothing.

use crate::durability::notices::Names;
use bytes::Bytes;

/// What the message in `frame` (one whole RESP frame) reports; `None`: no write.
pub fn names(frame: &Bytes) -> Option<Names> {
    let mut items = Items { frame, at: 0 };
    match items.header()? {
        (b'*' | b'>', n) if n > 0 => message(&mut items, n).unwrap_or(Some(Names::Everything)),
        _ => None,
    }
}

/// A message of `n` items; the outer `None`: it cannot be read.
fn message(items: &mut Items, n: i64) -> Option<Option<Names>> {
    let kind = items.bulk()?;
    match (&kind[..], n) {
        (b"message", 3) => {
            let channel = items.bulk()?;
            on_channel(&channel, items)
        }
        (b"pmessage", 4) => {
            items.bulk()?; // the pattern
            let channel = items.bulk()?;
            on_channel(&channel, items)
        }
        (b"invalidate", 2) => invalidated(items),
        (
            b"subscribe"
            | b"unsubscribe"
            | b"psubscribe"
            | b"punsubscribe"
            | b"ssubscribe"
            | b"sunsubscribe"
            | b"smessage"
            | b"pong"
            | b"tracking-redir-broken",
            _,
        ) => Some(None),
        _ => None,
    }
}

/// A message on `channel`, its payload next in `items`.
fn on_channel(channel: &Bytes, items: &mut Items) -> Option<Option<Names>> {
    if let Some(rest) = channel.strip_prefix(b"__keyspace@") {
        let (db, key_at) = database(rest)?;
        let key = channel.slice(channel.len() - rest.len() + key_at..);
        return Some(Some(Names::Keys {
            db: Some(db),
            keys: vec![key],
        }));
    }
    if let Some(rest) = channel.strip_prefix(b"__keyevent@") {
        let (db, _) = database(rest)?;
        return Some(Some(Names::Keys {
            db: Some(db),
            keys: vec![items.bulk()?],
        }));
    }
    if &channel[..] == b"__redis__:invalidate" {
        return invalidated(items);
    }
    Some(None)
}

/// `<db>__:...`: the database, and where what follows `__:` starts.
fn database(rest: &[u8]) -> Option<(u32, usize)> {
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let db = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    rest[digits..]
        .starts_with(b"__:")
        .then_some((db, digits + 3))
}

/// An invalidation's keys: an array of them, or a null for a flush.
fn invalidated(items: &mut Items) -> Option<Option<Names>> {
    let names = match items.header()? {
        (b'*', n) if n >= 0 => Names::Keys {
            db: None,
            keys: (0..n).map(|_| items.bulk()).collect::<Option<_>>()?,
        },
        (b'*' | b'$', -1) | (b'_', _) => Names::Everything,
        _ => return None,
    };
    Some(Some(names))
}

/// The items of a frame, read in order.
struct Items<'a> {
    frame: &'a Bytes,
    at: usize,
}

impl Items<'_> {
    /// The next item's type byte and the number on its line (0 for a null `_`).
    fn header(&mut self) -> Option<(u8, i64)> {
        let kind = *self.frame.get(self.at)?;
        let line = &self.frame[self.at + 1..];
        let end = line.windows(2).position(|w| w == b"\r\n")?;
        self.at += 1 + end + 2;
        if kind == b'_' {
            return Some((kind, 0));
        }
        Some((kind, crate::resp::parse_i64(&line[..end])?))
    }

    /// The next item, a bulk string.
    fn bulk(&mut self) -> Option<Bytes> {
        let (b'$', n) = self.header()? else {
            return None;
        };
        let len = usize::try_from(n).ok()?;
        let end = self.at.checked_add(len)?;
        if self.frame.get(end..end + 2)? != b"\r\n" {
            return None;
        }
        let data = self.frame.slice(self.at..end);
        self.at = end + 2;
        Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: &str, items: &[&str]) -> Bytes {
        let mut out = format!("{kind}{}\r\n", items.len());
        for i in items {
            out.push_str(&format!("${}\r\n{i}\r\n", i.len()));
        }
        Bytes::from(out)
    }

    fn keys(db: Option<u32>, keys: &[&'static str]) -> Option<Names> {
        Some(Names::Keys {
            db,
            keys: keys
                .iter()
                .map(|k| Bytes::from_static(k.as_bytes()))
                .collect(),
        })
    }

    #[test]
    fn keyspace_and_keyevent_messages_name_their_key_in_either_protocol() {
        for kind in ["*", ">"] {
            assert_eq!(
                names(&frame(kind, &["message", "__keyspace@3__:user:1", "set"])),
                keys(Some(3), &["user:1"])
            );
            assert_eq!(
                names(&frame(kind, &["message", "__keyspace@0__:a__:b", "del"])),
                keys(Some(0), &["a__:b"])
            );
            assert_eq!(
                names(&frame(
                    kind,
                    &["pmessage", "__key*", "__keyevent@12__:expired", "k"]
                )),
                keys(Some(12), &["k"])
            );
        }
    }

    #[test]
    fn invalidations_name_keys_of_any_database_and_a_flush_everything() {
        let push = Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n");
        assert_eq!(names(&push), keys(None, &["a", "b"]));
        let flush = Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n_\r\n");
        assert_eq!(names(&flush), Some(Names::Everything));
        let redirected = Bytes::from_static(
            b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n$1\r\na\r\n",
        );
        assert_eq!(names(&redirected), keys(None, &["a"]));
        let flushed =
            Bytes::from_static(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n$-1\r\n");
        assert_eq!(names(&flushed), Some(Names::Everything));
    }

    #[test]
    fn what_reports_no_write_names_nothing_and_what_cannot_be_read_everything() {
        for nothing in [
            frame("*", &["message", "news", "hello"]),
            frame(">", &["smessage", "__keyspace@0__:k", "set"]),
            frame(">", &["subscribe", "__keyspace@0__:k"]),
            frame("*", &["pong", ""]),
            Bytes::from_static(b"+1700000000.000000 [0 127.0.0.1:1] \"SET\" \"k\" \"v\"\r\n"),
            Bytes::from_static(b"-NOPERM no permissions\r\n"),
        ] {
            assert_eq!(names(&nothing), None, "{nothing:?}");
        }
        for unknown in [
            frame(">", &["keyspace-v2", "k"]),
            frame("*", &["message", "__keyspace@x__:k", "set"]),
            frame("*", &["message", "__keyevent@0__"]),
            Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n:1\r\n"),
        ] {
            assert_eq!(names(&unknown), Some(Names::Everything), "{unknown:?}");
        }
    }
}
