//! Upstream replies are delimited, not decoded: walrus needs to know where each reply ends
//! so that it can hand exactly those bytes to the client that asked, in order.
//!
//! [`ReplyScanner`] walks RESP2 and RESP3 frames with an explicit stack of "children still
//! expected" per open aggregate, so scanning resumes where the last read ended (a 100 MB
//! LRANGE reply arriving in 64 KiB reads is scanned once), nesting depth is bounded without
//! recursion, and a bulk string is skipped by its declared length.

use super::{find_crlf, parse_i64, Limits};

/// The upstream sent something that is not RESP, or exceeds a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    #[error("upstream protocol error: {0}")]
    Protocol(String),
    #[error("upstream reply nested deeper than {0} levels (proxy.max_reply_depth)")]
    TooDeep(usize),
    #[error("upstream reply larger than {0} bytes (proxy.max_reply_bytes)")]
    TooLarge(usize),
}

/// Resumable frame delimiter for one connection's incoming byte stream.
#[derive(Debug)]
pub struct ReplyScanner {
    limits: Limits,
    /// Offset, from the start of the frame being scanned, of the next unscanned element.
    pos: usize,
    /// For each open aggregate, how many child elements are still to come.
    stack: Vec<u64>,
}

/// The longest line accepted after its type byte: a length, or a simple string or error
/// (a script's status reply may be long; longer than this it is refused, whole or in parts).
const MAX_LINE_BYTES: usize = 64 << 10;

impl ReplyScanner {
    pub fn new(limits: Limits) -> Self {
        ReplyScanner {
            limits,
            pos: 0,
            stack: Vec::new(),
        }
    }

    /// Returns the length of the complete frame at the front of `buf`, or `None` when more
    /// bytes are needed. `buf` must start at the frame being scanned and keep its bytes until
    /// a length is returned (only appending in between).
    ///
    /// The outcome does not depend on how the bytes arrive: a limit is enforced on an
    /// incomplete frame only once its bytes prove that the whole frame exceeds it, and then
    /// at once (so an incomplete frame never holds more than `max_reply_bytes` in `buf`).
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ScanError> {
        let found = self.frame(buf);
        if let Ok(None) = found {
            // The frame needs at least one more byte.
            if buf.len() >= self.limits.max_reply_bytes {
                return Err(ScanError::TooLarge(self.limits.max_reply_bytes));
            }
        }
        found
    }

    fn frame(&mut self, buf: &[u8]) -> Result<Option<usize>, ScanError> {
        loop {
            if self.pos >= buf.len() {
                return Ok(None);
            }
            let at = self.pos;
            let Some(cr) = find_crlf(buf, at + 1) else {
                // The CR may be the last byte: the line is at least this long.
                if buf.len() - at - 1 > MAX_LINE_BYTES + 1 {
                    return Err(ScanError::Protocol("reply line too long".into()));
                }
                return Ok(None);
            };
            if cr - at - 1 > MAX_LINE_BYTES {
                return Err(ScanError::Protocol("reply line too long".into()));
            }
            let line = &buf[at + 1..cr];
            let after = cr + 2;
            let children: u64 = match buf[at] {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => 0,
                b'$' | b'!' | b'=' => {
                    let len = self.length(line, buf[at] == b'$')?;
                    if let Some(len) = len {
                        let end = after + len + 2;
                        // Known too large before its bytes are awaited.
                        if end > self.limits.max_reply_bytes {
                            return Err(ScanError::TooLarge(self.limits.max_reply_bytes));
                        }
                        if buf.len() < end {
                            return Ok(None);
                        }
                        if &buf[end - 2..end] != b"\r\n" {
                            return Err(ScanError::Protocol(
                                "bulk string not terminated by CRLF".into(),
                            ));
                        }
                        self.pos = end;
                    } else {
                        self.pos = after;
                    }
                    self.check_size()?;
                    if let Some(len) = self.complete() {
                        return Ok(Some(len));
                    }
                    continue;
                }
                b'*' | b'~' | b'>' => self.length(line, buf[at] == b'*')?.unwrap_or(0) as u64,
                b'%' => 2 * self.length(line, false)?.unwrap_or(0) as u64,
                // An attribute map is followed by the value it annotates: both are one reply.
                b'|' => 2 * self.length(line, false)?.unwrap_or(0) as u64 + 1,
                other => {
                    return Err(ScanError::Protocol(format!(
                        "unexpected type byte {:?}",
                        other as char
                    )));
                }
            };
            self.pos = after;
            self.check_size()?;
            if children > 0 {
                if self.stack.len() >= self.limits.max_reply_depth {
                    return Err(ScanError::TooDeep(self.limits.max_reply_depth));
                }
                self.stack.push(children);
                continue;
            }
            if let Some(len) = self.complete() {
                return Ok(Some(len));
            }
        }
    }

    /// Parses a length; `-1` is the RESP2 null when `null_ok`.
    fn length(&self, line: &[u8], null_ok: bool) -> Result<Option<usize>, ScanError> {
        match parse_i64(line) {
            Some(-1) if null_ok => Ok(None),
            Some(n) if n >= 0 => {
                if n as u64 > self.limits.max_reply_bytes as u64 {
                    return Err(ScanError::TooLarge(self.limits.max_reply_bytes));
                }
                Ok(Some(n as usize))
            }
            _ => Err(ScanError::Protocol(format!(
                "invalid length {:?}",
                String::from_utf8_lossy(line)
            ))),
        }
    }

    fn check_size(&self) -> Result<(), ScanError> {
        if self.pos > self.limits.max_reply_bytes {
            return Err(ScanError::TooLarge(self.limits.max_reply_bytes));
        }
        Ok(())
    }

    /// One element finished: pop every aggregate it completes. Returns the frame length when
    /// the outermost one is done, and resets for the next frame.
    fn complete(&mut self) -> Option<usize> {
        while let Some(top) = self.stack.last_mut() {
            *top -= 1;
            if *top > 0 {
                return None;
            }
            self.stack.pop();
        }
        let len = self.pos;
        self.pos = 0;
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[u8]) -> Result<Vec<Vec<u8>>, ScanError> {
        let mut s = ReplyScanner::new(Limits::default());
        let mut out = Vec::new();
        let mut rest = input;
        while let Some(n) = s.scan(rest)? {
            out.push(rest[..n].to_vec());
            rest = &rest[n..];
        }
        assert!(
            rest.is_empty(),
            "left over: {:?}",
            String::from_utf8_lossy(rest)
        );
        Ok(out)
    }

    #[test]
    fn delimits_resp2_and_resp3() {
        let input: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR x\r\n",
            b":12\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"$3\r\na\r\n\r\n",
            b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
            b"*0\r\n",
            b"%1\r\n+k\r\n*2\r\n_\r\n,1.5\r\n",
            b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",
            b">2\r\n$7\r\nmessage\r\n=7\r\ntxt:abc\r\n",
            b"~1\r\n#t\r\n",
        ];
        let joined: Vec<u8> = input.concat();
        let got = frames(&joined).unwrap();
        assert_eq!(got, input.iter().map(|f| f.to_vec()).collect::<Vec<_>>());
    }

    #[test]
    fn resumes_across_every_split_point() {
        let frame = b"*3\r\n$5\r\nhello\r\n*2\r\n:1\r\n$0\r\n\r\n%1\r\n+a\r\n+b\r\n";
        for cut in 0..frame.len() {
            let mut s = ReplyScanner::new(Limits::default());
            assert_eq!(s.scan(&frame[..cut]).unwrap(), None, "cut {cut}");
            assert_eq!(s.scan(&frame[..]).unwrap(), Some(frame.len()), "cut {cut}");
        }
    }

    /// A long status line (a script's `status_reply`) was refused when it came in parts and
    /// taken when it came in one read: now the line's length alone decides.
    #[test]
    fn long_lines_are_refused_however_they_arrive() {
        for len in [MAX_LINE_BYTES, MAX_LINE_BYTES + 1] {
            let mut line = vec![b'+'];
            line.resize(1 + len, b'x');
            line.extend_from_slice(b"\r\n");
            let whole = ReplyScanner::new(Limits::default()).scan(&line);
            let mut s = ReplyScanner::new(Limits::default());
            let mut parts = Ok(None);
            for end in (1..=line.len()).step_by(1000).chain([line.len()]) {
                parts = s.scan(&line[..end]);
                if parts.is_err() {
                    break;
                }
            }
            if len > MAX_LINE_BYTES {
                assert!(whole.is_err() && parts.is_err(), "{len}");
            } else {
                assert_eq!((whole, parts), (Ok(Some(line.len())), Ok(Some(line.len()))));
            }
        }
    }

    #[test]
    fn limits_are_enforced() {
        let limits = Limits {
            max_reply_depth: 3,
            max_reply_bytes: 100,
            ..Limits::default()
        };
        let mut s = ReplyScanner::new(limits);
        assert_eq!(
            s.scan(b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"),
            Err(ScanError::TooDeep(3))
        );
        let mut s = ReplyScanner::new(limits);
        assert_eq!(s.scan(b"$101\r\n"), Err(ScanError::TooLarge(100)));
        // The last element's length shows the frame too large: refused before its bytes
        // are awaited (they were buffered whole first, up to twice the limit).
        let mut s = ReplyScanner::new(limits);
        assert_eq!(
            s.scan(b"*2\r\n$1\r\na\r\n$95\r\n"),
            Err(ScanError::TooLarge(100))
        );
        // An incomplete frame already as large as the limit.
        let mut s = ReplyScanner::new(limits);
        assert_eq!(s.scan(&[b'+'; 100]), Err(ScanError::TooLarge(100)));
        let mut s = ReplyScanner::new(limits);
        assert_eq!(s.scan(&[b'+'; 99]), Ok(None));
        let mut s = ReplyScanner::new(limits);
        assert!(matches!(s.scan(b"?x\r\n"), Err(ScanError::Protocol(_))));
        let mut s = ReplyScanner::new(limits);
        assert!(matches!(
            s.scan(b"$1\r\nab\r\n"),
            Err(ScanError::Protocol(_))
        ));
    }
}
