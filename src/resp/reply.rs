//! Upstream replies are delimited, not decoded: walrus needs to know where each reply ends
//! so that it can hand exactly those bytes to the client that asked, in order.
//!
//! [`ReplyScanner`] walks RESP2 and RESP3 frames with an explicit stack of "children still
//! expected" per open aggregate, so scanning resumes where the last read ended (a 100 MB
//! LRANGE reply arriving in 64 KiB reads is scanned once), nesting depth is bounded without
//! recursion, and a bulk string is skipped by its declared length.
//!
//! A frame past walrus's limits (too deep, too large, a line too long to read as one) is
//! refused, not the stream: the scanner then walks the rest of that frame without holding it
//! ([`ReplyScanner::discard`]), and the frames after it are delimited as before. Only bytes
//! that are not RESP break the stream.

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
    #[error("upstream reply line longer than {0} bytes")]
    LineTooLong(usize),
}

impl ScanError {
    /// The frame breaks one of walrus's limits, and is discarded; the stream goes on.
    pub fn is_limit(&self) -> bool {
        !matches!(self, ScanError::Protocol(_))
    }
}

/// Resumable frame delimiter for one connection's incoming byte stream.
#[derive(Debug)]
pub struct ReplyScanner {
    limits: Limits,
    /// Offset, from the start of the frame being scanned, of the next unscanned element.
    pos: usize,
    /// For each open aggregate, how many child elements are still to come, a run of levels
    /// with the same count in one entry `(count, levels)`: a frame nested deep (a script's
    /// `{{{...}}}`) that is discarded costs an entry per run, not one per level.
    stack: Vec<(u64, usize)>,
    /// Open aggregates.
    depth: usize,
    /// The frame being scanned broke a limit: the rest of it is walked without limits and
    /// without being held.
    discarding: Option<Discarding>,
}

#[derive(Debug, Default)]
struct Discarding {
    /// Bytes of a bulk string (its CRLF included) still to come.
    body: u64,
    /// Inside a simple line too long to read as one, until its CRLF.
    line: bool,
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
            depth: 0,
            discarding: None,
        }
    }

    /// Returns the length of the complete frame at the front of `buf`, or `None` when more
    /// bytes are needed. `buf` must start at the frame being scanned and keep its bytes until
    /// a length is returned (only appending in between).
    ///
    /// The outcome does not depend on how the bytes arrive: a limit is enforced on an
    /// incomplete frame only once its bytes prove that the whole frame exceeds it, and then
    /// at once (so an incomplete frame never holds more than `max_reply_bytes` in `buf`).
    /// After an error that [`is_limit`](ScanError::is_limit), the frame is walked on with
    /// [`discard`](Self::discard) before anything else is scanned.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ScanError> {
        debug_assert!(
            self.discarding.is_none(),
            "a refused frame is discarded first"
        );
        let found = self.frame(buf);
        if let Ok(None) = found {
            // The frame needs at least one more byte.
            if buf.len() >= self.limits.max_reply_bytes {
                return Err(self.refuse(ScanError::TooLarge(self.limits.max_reply_bytes)));
            }
        }
        found
    }

    /// A frame [`scan`](Self::scan) refused for a limit is being discarded.
    pub fn discarding(&self) -> bool {
        self.discarding.is_some()
    }

    /// Walks on through a refused frame at the front of `buf`: returns how many bytes at
    /// the front belong to it, which the caller drops before it calls again (what it keeps
    /// is at most a line), and whether the frame ended with them. `Err` only for bytes that
    /// are not RESP.
    pub fn discard(&mut self, buf: &[u8]) -> Result<(usize, bool), ScanError> {
        match self.frame(buf)? {
            Some(n) => {
                self.discarding = None;
                Ok((n, true))
            }
            None => Ok((std::mem::take(&mut self.pos), false)),
        }
    }

    /// The frame breaks a limit: from the element at `pos` on, it is walked without limits.
    fn refuse(&mut self, e: ScanError) -> ScanError {
        self.discarding = Some(Discarding::default());
        e
    }

    fn limited(&self) -> bool {
        self.discarding.is_none()
    }

    fn frame(&mut self, buf: &[u8]) -> Result<Option<usize>, ScanError> {
        loop {
            if let Some(d) = &mut self.discarding {
                if d.body > 0 {
                    let n = d.body.min((buf.len() - self.pos) as u64);
                    self.pos += n as usize;
                    d.body -= n;
                    if d.body > 0 {
                        return Ok(None);
                    }
                    if let Some(len) = self.complete() {
                        return Ok(Some(len));
                    }
                    continue;
                }
                if d.line {
                    let Some(cr) = find_crlf(buf, self.pos) else {
                        // All of it but a CR that may start the CRLF.
                        let keep = usize::from(buf.ends_with(b"\r"));
                        self.pos = self.pos.max(buf.len() - keep);
                        return Ok(None);
                    };
                    d.line = false;
                    self.pos = cr + 2;
                    if let Some(len) = self.complete() {
                        return Ok(Some(len));
                    }
                    continue;
                }
            }
            if self.pos >= buf.len() {
                return Ok(None);
            }
            let at = self.pos;
            let simple = matches!(buf[at], b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(');
            if let (Some(d), true) = (&mut self.discarding, simple) {
                // Discarded as it comes, however long.
                d.line = true;
                continue;
            }
            let cr = find_crlf(buf, at + 1);
            // Without its CR yet, the line is at least this long (the CR may be the last byte).
            let line_len = cr.map_or(buf.len().saturating_sub(at + 2), |cr| cr - at - 1);
            if line_len > MAX_LINE_BYTES {
                if !simple {
                    return Err(ScanError::Protocol("reply line too long".into()));
                }
                // Refused for the limit its bytes reach first, however they arrive: the
                // frame's size, or the line's length (proven once it has a byte past it,
                // and one more that may be the CR).
                let e = if at + MAX_LINE_BYTES + 3 > self.limits.max_reply_bytes {
                    ScanError::TooLarge(self.limits.max_reply_bytes)
                } else {
                    ScanError::LineTooLong(MAX_LINE_BYTES)
                };
                self.discarding = Some(Discarding {
                    line: true,
                    ..Discarding::default()
                });
                return Err(e);
            }
            let Some(cr) = cr else {
                return Ok(None);
            };
            let line = &buf[at + 1..cr];
            let after = cr + 2;
            let children: u64 = match buf[at] {
                _ if simple => 0,
                b'$' | b'!' | b'=' => {
                    let Some(len) = length(line, buf[at] == b'$')? else {
                        self.advance(after)?;
                        if let Some(len) = self.complete() {
                            return Ok(Some(len));
                        }
                        continue;
                    };
                    let end = (after as u64).saturating_add(len).saturating_add(2);
                    if self.limited() && end > self.limits.max_reply_bytes as u64 {
                        // Known too large before its bytes are awaited.
                        return Err(self.refuse(ScanError::TooLarge(self.limits.max_reply_bytes)));
                    }
                    if let Some(d) = &mut self.discarding {
                        d.body = len + 2;
                        self.pos = after;
                        continue;
                    }
                    let end = end as usize;
                    if buf.len() < end {
                        return Ok(None);
                    }
                    if &buf[end - 2..end] != b"\r\n" {
                        return Err(ScanError::Protocol(
                            "bulk string not terminated by CRLF".into(),
                        ));
                    }
                    self.advance(end)?;
                    if let Some(len) = self.complete() {
                        return Ok(Some(len));
                    }
                    continue;
                }
                b'*' | b'~' | b'>' => length(line, buf[at] == b'*')?.unwrap_or(0),
                b'%' => length(line, false)?.unwrap_or(0).saturating_mul(2),
                // An attribute map is followed by the value it annotates: both are one reply.
                b'|' => length(line, false)?
                    .unwrap_or(0)
                    .saturating_mul(2)
                    .saturating_add(1),
                other => {
                    return Err(ScanError::Protocol(format!(
                        "unexpected type byte {:?}",
                        other as char
                    )));
                }
            };
            // The frame's size first (its bytes may reach that limit before this header ends,
            // when they arrive in parts), then its depth.
            if self.limited() && children > self.limits.max_reply_bytes as u64 {
                // More elements than bytes allowed.
                return Err(self.refuse(ScanError::TooLarge(self.limits.max_reply_bytes)));
            }
            if self.limited() && after > self.limits.max_reply_bytes {
                return Err(self.refuse(ScanError::TooLarge(self.limits.max_reply_bytes)));
            }
            if self.limited() && children > 0 && self.depth >= self.limits.max_reply_depth {
                return Err(self.refuse(ScanError::TooDeep(self.limits.max_reply_depth)));
            }
            self.advance(after)?;
            if children > 0 {
                self.push(children);
                continue;
            }
            if let Some(len) = self.complete() {
                return Ok(Some(len));
            }
        }
    }

    /// The element at `pos` ends at `to`: refused if that takes the frame past
    /// `max_reply_bytes` (`pos` stays at it, to be walked again while discarding).
    fn advance(&mut self, to: usize) -> Result<(), ScanError> {
        if self.limited() && to > self.limits.max_reply_bytes {
            return Err(self.refuse(ScanError::TooLarge(self.limits.max_reply_bytes)));
        }
        self.pos = to;
        Ok(())
    }

    /// An aggregate of `children` elements opens.
    fn push(&mut self, children: u64) {
        self.depth += 1;
        match self.stack.last_mut() {
            Some((count, levels)) if *count == children => *levels += 1,
            _ => self.stack.push((children, 1)),
        }
    }

    /// One element finished: pop every aggregate it completes. Returns the frame length when
    /// the outermost one is done, and resets for the next frame.
    fn complete(&mut self) -> Option<usize> {
        while let Some((count, levels)) = self.stack.last_mut() {
            if *count > 1 {
                // The innermost level has more to come.
                if *levels > 1 {
                    *levels -= 1;
                    let left = *count - 1;
                    self.stack.push((left, 1));
                } else {
                    *count -= 1;
                }
                return None;
            }
            // Its last child: the innermost level ends, and with it each level of its run
            // (one child left in each, the one ending).
            self.depth -= *levels;
            self.stack.pop();
        }
        let len = self.pos;
        self.pos = 0;
        Some(len)
    }
}

/// Parses a length; `-1` is the RESP2 null when `null_ok`.
fn length(line: &[u8], null_ok: bool) -> Result<Option<u64>, ScanError> {
    match parse_i64(line) {
        Some(-1) if null_ok => Ok(None),
        Some(n) if n >= 0 => Ok(Some(n as u64)),
        _ => Err(ScanError::Protocol(format!(
            "invalid length {:?}",
            String::from_utf8_lossy(line)
        ))),
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

    /// What a connection's reader makes of `input` arriving `chunk` bytes at a time: each
    /// frame, or the error that refused it (and its frame is skipped), until the stream
    /// breaks. Also the most bytes a refused frame kept buffered.
    fn frames_skipping(input: &[u8], chunk: usize, limits: Limits) -> (Vec<String>, usize) {
        let mut s = ReplyScanner::new(limits);
        let (mut buf, mut out, mut held) = (Vec::new(), Vec::new(), 0);
        for piece in input.chunks(chunk) {
            buf.extend_from_slice(piece);
            loop {
                if s.discarding() {
                    let (n, done) = s.discard(&buf).unwrap();
                    buf.drain(..n);
                    if !done {
                        held = held.max(buf.len());
                        break;
                    }
                    continue;
                }
                match s.scan(&buf) {
                    Ok(Some(n)) => out.push(
                        String::from_utf8_lossy(&buf.drain(..n).collect::<Vec<_>>()).into_owned(),
                    ),
                    Ok(None) => break,
                    Err(e) if e.is_limit() => out.push(e.to_string()),
                    Err(e) => {
                        out.push(e.to_string());
                        return (out, held);
                    }
                }
            }
        }
        assert!(buf.is_empty() && !s.discarding(), "left over: {buf:?}");
        (out, held)
    }

    /// A frame past a limit is refused and skipped as it arrives, holding no more than a
    /// line of it, and the frames after it are delimited as before, however the bytes
    /// arrive; bytes that are not RESP still break the stream.
    #[test]
    fn a_refused_frame_is_skipped_and_the_stream_goes_on() {
        let limits = Limits {
            max_reply_depth: 3,
            max_reply_bytes: 100,
            ..Limits::default()
        };
        let deep = "*1\r\n*2\r\n*1\r\n*1\r\n*1\r\n:1\r\n$3\r\nabc\r\n";
        let large = format!("*2\r\n$200\r\n{}\r\n+x\r\n", "b".repeat(200));
        let long_line = format!("-ERR {}\r\n", "e".repeat(MAX_LINE_BYTES + 10));
        let many = format!("*60\r\n{}", ":1\r\n".repeat(60));
        let input =
            format!("+a\r\n{deep}:2\r\n{large}%1\r\n+k\r\n+v\r\n{long_line}{many}$1\r\nz\r\n");
        let want = [
            "+a\r\n",
            "upstream reply nested deeper than 3 levels (proxy.max_reply_depth)",
            ":2\r\n",
            "upstream reply larger than 100 bytes (proxy.max_reply_bytes)",
            "%1\r\n+k\r\n+v\r\n",
            // Its first 100 bytes already refuse it.
            "upstream reply larger than 100 bytes (proxy.max_reply_bytes)",
            "upstream reply larger than 100 bytes (proxy.max_reply_bytes)",
            "$1\r\nz\r\n",
        ];
        for chunk in [1, 2, 3, 7, 64, 1000, input.len()] {
            let (got, held) = frames_skipping(input.as_bytes(), chunk, limits);
            assert_eq!(got, want, "chunk {chunk}");
            assert!(
                held < 16,
                "chunk {chunk}: held {held} bytes of a refused frame"
            );
        }
        // Under a larger size limit, the line's own.
        let roomy = Limits {
            max_reply_bytes: 1 << 20,
            ..limits
        };
        let input = format!("{long_line}+b\r\n");
        let line_refused = format!("upstream reply line longer than {MAX_LINE_BYTES} bytes");
        for chunk in [1000, 4096, input.len()] {
            let (got, _) = frames_skipping(input.as_bytes(), chunk, roomy);
            assert_eq!(got, [line_refused.as_str(), "+b\r\n"], "chunk {chunk}");
        }
        let broken = format!("{large}?x\r\n+after\r\n");
        let (got, _) = frames_skipping(broken.as_bytes(), 5, limits);
        assert_eq!(
            got.last().unwrap(),
            "upstream protocol error: unexpected type byte '?'"
        );
    }

    /// A frame nested a million levels deep (each one child) is walked with one entry on
    /// the stack.
    #[test]
    fn a_deep_frame_is_discarded_in_little_memory() {
        let mut s = ReplyScanner::new(Limits::default());
        let mut input = "*1\r\n".repeat(1_000_000).into_bytes();
        input.extend_from_slice(b":1\r\n");
        assert_eq!(s.scan(&input), Err(ScanError::TooDeep(128)));
        let (mut peak, mut at) = (0, 0);
        loop {
            let end = (at + 4096).min(input.len());
            let (n, done) = s.discard(&input[at..end]).unwrap();
            peak = peak.max(s.stack.len());
            at += n;
            if done {
                break;
            }
        }
        assert_eq!(at, input.len());
        assert!(peak <= 2, "{peak} stack entries");
    }
}
