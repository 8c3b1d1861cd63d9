//! The little RESP the counting proxy reads: where complete values end in a byte buffer, how
//! many there are, and which commands are EVALSHA. Nothing is decoded beyond that.
//!
//! Why not the `redis` crate's parser: the proxy gets bytes in arbitrary chunks and must count
//! the complete commands (or replies) in a chunk, and know where the last one ends, before it
//! forwards the chunk. `redis::Parser` (1.x) does neither: it reports no byte offset, and once
//! its reader has nothing more to give (the end of a chunk), it fails with "unexpected end of
//! file" and keeps failing even after the rest of the value is fed to it; on a blocking socket it
//! would instead wait for the next value, which the proxy cannot do while it holds replies back.
//! The crate's resumable decoder (`ValueCodec`) needs its `aio` feature (tokio) and is hidden
//! from its public API.

/// `(value, index after its CRLF)` of the integer line starting at `at` (after the type byte).
fn resp_line(b: &[u8], at: usize) -> Option<(i64, usize)> {
    let end = at + b.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let v = std::str::from_utf8(&b[at..end]).ok()?.parse().unwrap_or(0);
    Some((v, end + 2))
}

/// The end of one complete RESP value at `at`, or `None` if incomplete.
pub fn resp_value(b: &[u8], at: usize) -> Option<usize> {
    match *b.get(at)? {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
            let (_, next) = resp_line(b, at + 1)?;
            Some(next)
        }
        b'$' | b'=' | b'!' => {
            let (len, next) = resp_line(b, at + 1)?;
            if len < 0 {
                return Some(next);
            }
            let end = next + len as usize + 2;
            (end <= b.len()).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let (n, mut next) = resp_line(b, at + 1)?;
            let n = if matches!(b[at], b'%' | b'|') {
                n * 2
            } else {
                n
            };
            for _ in 0..n.max(0) {
                next = resp_value(b, next)?;
            }
            Some(next)
        }
        // Not RESP: count nothing from here on (cannot happen with redis-rs).
        _ => None,
    }
}

/// `(bytes consumed, complete replies)`.
pub fn parse_replies(b: &[u8]) -> (usize, u64) {
    let (mut at, mut n) = (0, 0);
    while let Some(next) = resp_value(b, at) {
        at = next;
        n += 1;
    }
    (at, n)
}

/// `(bytes consumed, complete commands, of which EVALSHA)`; commands are arrays of bulk strings.
pub fn parse_requests(b: &[u8]) -> (usize, u64, u64) {
    let (mut at, mut n, mut evalsha) = (0, 0, 0);
    while let Some(next) = resp_value(b, at) {
        // The command name is the first bulk string: `*N\r\n$len\r\nNAME\r\n`.
        let name = resp_line(b, at + 1)
            .and_then(|(_, first)| {
                let (len, start) = resp_line(b, first + 1)?;
                b.get(start..start + usize::try_from(len).ok()?)
            })
            .unwrap_or_default();
        if name.eq_ignore_ascii_case(b"EVALSHA") {
            evalsha += 1;
        }
        at = next;
        n += 1;
    }
    (at, n, evalsha)
}
