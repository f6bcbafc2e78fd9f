//! The reply scanner's tests: frames delimited however the bytes arrive, limits, and
//! frames refused for a limit skipped as they arrive.

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
    let input = format!("+a\r\n{deep}:2\r\n{large}%1\r\n+k\r\n+v\r\n{long_line}{many}$1\r\nz\r\n");
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
