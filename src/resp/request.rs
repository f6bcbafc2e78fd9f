//! Client requests: RESP arrays of bulk strings, and inline commands (what redis-cli and
//! telnet users type), parsed with Valkey's own rules and error texts (networking.c:
//! `processMultibulkBuffer`, `processInlineBuffer`).
//!
//! The parser is resumable: a request that arrives in pieces is scanned once, with its
//! progress kept in [`RequestParser`], and a large bulk is awaited by length, never re-read.
//! A complete request is split off the read buffer without copying: its arguments are
//! slices of the very bytes that are then forwarded upstream.

use super::{parse_i64, write, Limits};
use bytes::{Bytes, BytesMut};
use std::ops::Range;

/// One client command.
#[derive(Debug, Clone)]
pub struct Request {
    /// The command as forwarded upstream: the client's bytes for an array request, a
    /// re-encoded array for an inline one.
    pub raw: Bytes,
    /// Arguments, the command name first; never empty.
    pub args: Vec<Bytes>,
}

impl Request {
    /// The command name, as sent (any case).
    pub fn name(&self) -> &[u8] {
        &self.args[0]
    }

    /// True when argument `i` equals `word`, ignoring ASCII case.
    pub fn arg_is(&self, i: usize, word: &str) -> bool {
        self.args
            .get(i)
            .is_some_and(|a| a.eq_ignore_ascii_case(word.as_bytes()))
    }
}

/// A request the client got wrong. Valkey answers `-ERR Protocol error: <text>` and closes
/// the connection; so does walrus.
///
/// The text holds one char per byte of the reply (Latin-1): it is ASCII except for the byte
/// of `expected '$', got '<c>'`, which Valkey's `%c` copies as it is, CR and LF excepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ParseError(pub String);

impl ParseError {
    fn new(text: impl Into<String>) -> Self {
        ParseError(text.into())
    }

    /// `expected '$', got '<c>'`. Valkey's error replies turn CR and LF into spaces
    /// (`addReplyErrorLength`): a byte of the request must not end the reply's line.
    fn expected_bulk(got: u8) -> Self {
        let got = match got {
            b'\r' | b'\n' => ' ',
            b => char::from(b),
        };
        ParseError(format!("expected '$', got '{got}'"))
    }

    /// The reply Valkey would send for this error, byte for byte.
    pub fn reply(&self) -> Bytes {
        const PREFIX: &[u8] = b"-ERR Protocol error: ";
        let mut out = BytesMut::with_capacity(PREFIX.len() + self.0.len() + 2);
        out.extend_from_slice(PREFIX);
        // Every char is below 256 (see the type's doc): one byte each.
        out.extend(self.0.chars().map(|c| u8::try_from(c).unwrap_or(b'?')));
        out.extend_from_slice(b"\r\n");
        out.freeze()
    }
}

#[derive(Debug)]
enum State {
    /// Between requests.
    Idle,
    /// Inside an array request: `pos` is where scanning resumes in the read buffer,
    /// `remaining` how many bulk strings are still to come.
    Array {
        remaining: usize,
        pos: usize,
        args: Vec<Range<usize>>,
    },
}

/// Incremental request parser. Feed it the session's read buffer after every read.
#[derive(Debug)]
pub struct RequestParser {
    limits: Limits,
    state: State,
    /// Bytes the buffer must hold before parsing can make progress (0: unknown).
    wanted: usize,
}

impl RequestParser {
    pub fn new(limits: Limits) -> Self {
        RequestParser {
            limits,
            state: State::Idle,
            wanted: 0,
        }
    }

    /// How many bytes the read buffer must hold before the next request can complete, when
    /// known (a bulk string's length was read): lets the reader reserve once for a large value.
    pub fn bytes_wanted(&self) -> usize {
        self.wanted
    }

    /// Takes the next complete request off the front of `buf`, if there is one.
    /// Empty requests (blank inline lines, `*0`) are skipped as Valkey skips them.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, ParseError> {
        loop {
            if buf.is_empty() {
                return Ok(None);
            }
            let parsed = match self.state {
                State::Idle if buf[0] != b'*' => self.inline(buf)?,
                _ => self.array(buf)?,
            };
            match parsed {
                Step::Done(req) => return Ok(Some(req)),
                Step::Skipped => continue,
                Step::NeedMore => return Ok(None),
            }
        }
    }

    fn inline(&mut self, buf: &mut BytesMut) -> Result<Step, ParseError> {
        // Valkey looks for the newline with strchr, which stops at a NUL byte: a line with a
        // NUL before its newline is never complete (until it is too big).
        let too_big = || Err(ParseError::new("too big inline request"));
        let nl = match buf.iter().position(|&b| b == b'\n' || b == 0) {
            Some(i) if buf[i] == b'\n' => i,
            Some(_) if buf.len() > self.limits.max_inline_bytes => return too_big(),
            None => {
                // The line so far, less a last `\r` that may turn out to be its CR: once it
                // is longer than the limit, it is refused whole or not.
                let text = buf.len() - usize::from(buf.last() == Some(&b'\r'));
                if text > self.limits.max_inline_bytes {
                    return too_big();
                }
                return Ok(Step::NeedMore);
            }
            Some(_) => return Ok(Step::NeedMore),
        };
        let line = buf.split_to(nl + 1);
        let mut text = &line[..nl];
        if text.last() == Some(&b'\r') {
            text = &text[..text.len() - 1];
        }
        if text.len() > self.limits.max_inline_bytes {
            return too_big();
        }
        let args =
            split_args(text).ok_or_else(|| ParseError::new("unbalanced quotes in request"))?;
        if args.is_empty() {
            return Ok(Step::Skipped);
        }
        if args.len() > self.limits.max_array_len {
            return Err(ParseError::new("invalid multibulk length"));
        }
        let args: Vec<Bytes> = args.into_iter().map(Bytes::from).collect();
        Ok(Step::Done(Request {
            raw: write::command(&args),
            args,
        }))
    }

    fn array(&mut self, buf: &mut BytesMut) -> Result<Step, ParseError> {
        if let State::Idle = self.state {
            let Some(cr) = line(buf, 1, self.limits, "too big mbulk count string")? else {
                return Ok(Step::NeedMore);
            };
            let count = parse_i64(&buf[1..cr])
                .filter(|&n| n <= i32::MAX as i64 && n <= self.limits.max_array_len as i64)
                .ok_or_else(|| ParseError::new("invalid multibulk length"))?;
            if count <= 0 {
                let _ = buf.split_to(cr + 2);
                return Ok(Step::Skipped);
            }
            // Capacity is bounded: a hostile count must not reserve memory up front.
            let args = Vec::with_capacity((count as usize).min(64));
            self.state = State::Array {
                remaining: count as usize,
                pos: cr + 2,
                args,
            };
        }
        let State::Array {
            remaining,
            pos,
            args,
        } = &mut self.state
        else {
            unreachable!()
        };
        while *remaining > 0 {
            let Some(cr) = line(buf, *pos, self.limits, "too big bulk count string")? else {
                self.wanted = 0;
                return Ok(Step::NeedMore);
            };
            if buf[*pos] != b'$' {
                return Err(ParseError::expected_bulk(buf[*pos]));
            }
            let len = parse_i64(&buf[*pos + 1..cr])
                .filter(|&n| n >= 0 && n as u64 <= self.limits.max_bulk_bytes as u64)
                .ok_or_else(|| ParseError::new("invalid bulk length"))?
                as usize;
            let start = cr + 2;
            let end = start + len + 2;
            if buf.len() < end {
                self.wanted = end;
                return Ok(Step::NeedMore);
            }
            // Valkey (9.0.x patch releases, 8.0.11+) refuses a bulk not followed by CRLF.
            // Checking matters beyond the error text: the raw bytes are forwarded, and Valkey
            // would close the shared pooled connection on them.
            if &buf[end - 2..end] != b"\r\n" {
                return Err(ParseError::new("invalid CRLF in request"));
            }
            args.push(start..start + len);
            *pos = end;
            *remaining -= 1;
        }
        let consumed = *pos;
        let ranges = std::mem::take(args);
        self.state = State::Idle;
        self.wanted = 0;
        let raw = buf.split_to(consumed).freeze();
        let args = ranges.into_iter().map(|r| raw.slice(r)).collect();
        Ok(Step::Done(Request { raw, args }))
    }
}

enum Step {
    Done(Request),
    Skipped,
    NeedMore,
}

/// The end (`\r`) of the count line at `from`, once it has arrived whole: Valkey finds it
/// by its `\r` and then skips two bytes. A line longer than `max_inline_bytes` is refused
/// with `too_big` as soon as that shows, whole or not, so that the error does not depend on
/// how the bytes arrive (Valkey, reading 16 KiB at a time, refuses such lines by that text).
fn line(
    buf: &[u8],
    from: usize,
    limits: Limits,
    too_big: &str,
) -> Result<Option<usize>, ParseError> {
    let cr = buf[from..]
        .iter()
        .position(|&b| b == b'\r')
        .map(|p| p + from);
    let (end, whole) = match cr {
        Some(cr) if cr + 1 < buf.len() => (cr, true),
        // The line ends at the last byte at the earliest.
        _ => (buf.len().saturating_sub(1).max(from), false),
    };
    if end - from > limits.max_inline_bytes {
        return Err(ParseError::new(too_big));
    }
    Ok(whole.then_some(end))
}

/// Splits an inline command line into arguments with Valkey's `sdssplitargs` rules:
/// blanks separate, "double quotes" take `\n \r \t \b \a \\ \" \xHH` escapes, 'single quotes'
/// take `\'`, and quoted and unquoted parts next to each other form one argument
/// (`"a"'b'c` is `abc`, as in Valkey 9). A NUL byte ends the line, as it ends a C string.
/// `None` means unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
    let mut args = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && is_space(line[i]) {
            i += 1;
        }
        if i >= n {
            return Some(args);
        }
        let mut cur = Vec::new();
        let (mut inq, mut insq) = (false, false);
        loop {
            if inq {
                if i >= n {
                    return None;
                }
                let c = line[i];
                if c == b'\\'
                    && i + 3 < n
                    && line[i + 1] == b'x'
                    && hex(line[i + 2]).is_some()
                    && hex(line[i + 3]).is_some()
                {
                    cur.push(hex(line[i + 2]).unwrap() * 16 + hex(line[i + 3]).unwrap());
                    i += 3;
                } else if c == b'\\' && i + 1 < n {
                    i += 1;
                    cur.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        other => other,
                    });
                } else if c == b'"' {
                    // Valkey 9: quoted and unquoted parts of one argument concatenate.
                    inq = false;
                } else {
                    cur.push(c);
                }
            } else if insq {
                if i >= n {
                    return None;
                }
                let c = line[i];
                if c == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                    i += 1;
                    cur.push(b'\'');
                } else if c == b'\'' {
                    insq = false;
                } else {
                    cur.push(c);
                }
            } else {
                if i >= n {
                    break;
                }
                match line[i] {
                    c if is_space(c) || c == 0 => break,
                    b'"' => inq = true,
                    b'\'' => insq = true,
                    c => cur.push(c),
                }
            }
            i += 1;
        }
        args.push(cur);
    }
}

/// C's `isspace`, which `sdssplitargs` uses (Rust's `is_ascii_whitespace` lacks `\v`).
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> (Vec<Vec<Vec<u8>>>, Option<ParseError>) {
        parse_in(Limits::default(), &[input])
    }

    /// The requests of `parts` read one after the other, and the error that ended them.
    fn parse_in(limits: Limits, parts: &[&[u8]]) -> (Vec<Vec<Vec<u8>>>, Option<ParseError>) {
        let mut p = RequestParser::new(limits);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for part in parts {
            buf.extend_from_slice(part);
            loop {
                match p.next(&mut buf) {
                    Ok(Some(r)) => out.push(r.args.iter().map(|a| a.to_vec()).collect()),
                    Ok(None) => break,
                    Err(e) => return (out, Some(e)),
                }
            }
        }
        (out, None)
    }

    /// Found by fuzzing (fuzz/regressions/request/long-bulk-line-without-dollar): a line
    /// past `max_inline_bytes` got one error or another, or none, depending on where a read
    /// ended.
    #[test]
    fn limit_errors_do_not_depend_on_how_the_bytes_arrive() {
        let limits = Limits {
            max_inline_bytes: 16,
            ..Limits::default()
        };
        let cases: &[&[u8]] = &[
            b"*1\r\n+aaaaaaaaaaaaaaaaaaaaaaa\r\n",
            b"*1\r\n$1111111111111111111\r\n",
            b"*11111111111111111111\r\n",
            b"*1111111111111111\r\n",
            b"0123456789abcdef\r\nPING\r\n",
            b"0123456789abcdefg\r\n",
            b"GET a\0bbbbbbbbbbbbbbbbbb\r\n",
        ];
        for input in cases {
            let whole = parse_in(limits, &[input]);
            for cut in 0..=input.len() {
                let (a, b) = input.split_at(cut);
                assert_eq!(parse_in(limits, &[a, b]), whole, "{input:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn array_and_inline_requests() {
        let (reqs, err) =
            parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nSET a \"b c\"\r\n\r\n*0\r\nPING\n");
        assert!(err.is_none());
        assert_eq!(
            reqs,
            vec![
                vec![b"GET".to_vec(), b"k".to_vec()],
                vec![b"SET".to_vec(), b"a".to_vec(), b"b c".to_vec()],
                vec![b"PING".to_vec()],
            ]
        );
    }

    #[test]
    fn byte_by_byte_feeding_gives_the_same_requests() {
        let input = b"*3\r\n$3\r\nSET\r\n$5\r\nhello\r\n$10\r\n0123456789\r\nGET x\r\n";
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for &b in input.iter() {
            buf.extend_from_slice(&[b]);
            while let Some(r) = p.next(&mut buf).unwrap() {
                got.push(r);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0].raw[..], &input[..41]);
        assert_eq!(&got[0].args[2][..], b"0123456789");
        assert_eq!(&got[1].raw[..], b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n");
    }

    #[test]
    fn valkey_error_texts() {
        let cases: &[(&[u8], &str)] = &[
            (b"*x\r\n", "invalid multibulk length"),
            (b"*1\r\n+foo\r\n", "expected '$', got '+'"),
            (b"*1\r\n$-5\r\n", "invalid bulk length"),
            (b"*1\r\n$999999999999\r\n", "invalid bulk length"),
            (b"SET \"a\r\n", "unbalanced quotes in request"),
            (b"*1\r\n$4\r\nPINGxx", "invalid CRLF in request"),
            (b"*01\r\n", "invalid multibulk length"),
            (b"*1\r\n$04\r\n", "invalid bulk length"),
        ];
        for (input, text) in cases {
            let (_, err) = parse_all(input);
            assert_eq!(
                err.unwrap().0,
                *text,
                "input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    /// Found by fuzzing (fuzz/regressions/request/cr-in-expected-dollar-error): the byte
    /// in the error broke the reply's line, and a debug build panicked on it. Valkey 9.1.2
    /// answers these bytes as below.
    #[test]
    fn error_replies_are_one_line_with_the_byte_valkey_shows() {
        let cases: &[(&[u8], &[u8])] = &[
            (
                b"*1\r\n\r\n",
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                b"*1\r\n\n\r\n",
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                b"*1\r\n\xff\r\n",
                b"-ERR Protocol error: expected '$', got '\xff'\r\n",
            ),
            (
                b"*x\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
        ];
        for (input, reply) in cases {
            let (_, err) = parse_all(input);
            assert_eq!(&err.unwrap().reply()[..], *reply);
        }
    }

    #[test]
    fn oversized_headers_are_refused_before_buffering_forever() {
        let limits = Limits {
            max_inline_bytes: 16,
            ..Limits::default()
        };
        for (input, text) in [
            (
                &b"GET aaaaaaaaaaaaaaaaaaaaaaaa"[..],
                "too big inline request",
            ),
            (b"*1111111111111111111111", "too big mbulk count string"),
            (
                b"*1\r\n$11111111111111111111111",
                "too big bulk count string",
            ),
        ] {
            let mut p = RequestParser::new(limits);
            let err = p.next(&mut BytesMut::from(input)).unwrap_err();
            assert_eq!(err.0, text);
        }
    }

    #[test]
    fn bulk_length_limit_is_configurable() {
        let limits = Limits {
            max_bulk_bytes: 4,
            ..Limits::default()
        };
        let mut p = RequestParser::new(limits);
        assert!(p
            .next(&mut BytesMut::from(&b"*1\r\n$4\r\nPING\r\n"[..]))
            .unwrap()
            .is_some());
        let err = p
            .next(&mut BytesMut::from(&b"*1\r\n$5\r\n"[..]))
            .unwrap_err();
        assert_eq!(err.0, "invalid bulk length");
    }

    #[test]
    fn large_bulk_announces_its_size() {
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$1000\r\nab"[..]);
        assert!(p.next(&mut buf).unwrap().is_none());
        assert_eq!(p.bytes_wanted(), 13 + 7 + 1000 + 2);
    }

    #[test]
    fn split_args_escapes() {
        assert_eq!(
            split_args(b"set k \"a\\x41\\n\" 'it\\'s'").unwrap(),
            vec![
                b"set".to_vec(),
                b"k".to_vec(),
                b"aA\n".to_vec(),
                b"it's".to_vec()
            ]
        );
        assert_eq!(split_args(b"   ").unwrap(), Vec::<Vec<u8>>::new());
        assert!(split_args(b"'abc").is_none());
        assert_eq!(
            split_args(b"ECHO \"a\"'b'c").unwrap(),
            vec![b"ECHO".to_vec(), b"abc".to_vec()]
        );
        assert_eq!(split_args(b"a\0b c").unwrap(), vec![b"a".to_vec()]);
    }
}
