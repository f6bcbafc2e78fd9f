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
#[path = "reply_tests.rs"]
mod tests;
