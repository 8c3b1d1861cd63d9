//! Our commands on the wire: RESP encoding of the few commands fencelock sends, and reading their
//! replies one at a time.
//!
//! Encoding here rather than through `redis::Cmd` saves the allocations and copies it makes for
//! every call: a lock and an unlock each cost one buffer, and a renewal pipeline of 1,000 extends
//! one buffer reused from tick to tick. That is measured, not assumed: packing the extends with
//! `redis::Cmd` raised the renewal thread's CPU per extend from 0.8-1.1 µs to 1.3-1.5 µs (10,000
//! held locks at a 3 s lease: 1.35-1.76% of a core against a target of 1%). Reading replies one at a time
//! is what makes a pipeline survive a signal. A socket with a read timeout (all of ours) is
//! never restarted by the kernel after a signal handler runs, so a read fails with `EINTR` (a
//! debugger or `strace` attaching does the same). redis-rs then keeps the connection and drops
//! the interrupted reply when it arrives. Reading a pipeline's replies one by one, we know which
//! command lost its reply and send it again; redis-rs' own pipeline reading would instead wait
//! for one reply too many, until the read timeout.

use std::collections::VecDeque;

use redis::{RedisError, RedisResult, RetryMethod, Value};

/// One argument of a command.
#[derive(Clone, Copy)]
pub(crate) enum Arg<'a> {
    Str(&'a str),
    Int(u64),
}

/// Appends one command, as a RESP array of bulk strings, to `buf`.
pub(crate) fn pack(buf: &mut Vec<u8>, args: &[Arg<'_>]) {
    array(buf, args.len());
    for a in args {
        arg(buf, *a);
    }
}

/// Starts a command of `len` arguments; `len` calls of [`arg`] follow.
pub(crate) fn array(buf: &mut Vec<u8>, len: usize) {
    buf.push(b'*');
    push_decimal(buf, len as u64);
    buf.extend_from_slice(b"\r\n");
}

pub(crate) fn arg(buf: &mut Vec<u8>, arg: Arg<'_>) {
    match arg {
        Arg::Str(s) => bulk(buf, s.as_bytes()),
        Arg::Int(n) => {
            let mut digits = [0u8; 20];
            bulk(buf, decimal(n, &mut digits));
        }
    }
}

fn bulk(buf: &mut Vec<u8>, data: &[u8]) {
    buf.push(b'$');
    push_decimal(buf, data.len() as u64);
    buf.extend_from_slice(b"\r\n");
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

fn push_decimal(buf: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    buf.extend_from_slice(decimal(n, &mut digits));
}

fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        // n % 10 < 10: the cast cannot truncate.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

/// Sends one command and reads its reply; a server error comes back as `Err`.
pub(crate) fn call(con: &mut redis::Connection, packed: &[u8]) -> RedisResult<Value> {
    redis::ConnectionLike::req_packed_command(con, packed)?.extract_error()
}

/// What becomes of a command of a pipeline whose reply a signal interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupted {
    /// Sent again, behind the others: every command must be safe to repeat alone and in
    /// another order. Past a budget of such repeats, its reply is `None`.
    SendAgain,
    /// Its reply is `None`.
    LeaveUnanswered,
}

/// Sends `packed`, the commands ending at each offset of `ends`, and reads their replies in
/// order: a server error is `Ok(Err(..))` (the rest still count); an interrupted reply is
/// handled as `on_interrupt` says. A timeout or a broken connection fails the whole exchange.
pub(crate) fn exchange(
    con: &mut redis::Connection,
    packed: &[u8],
    ends: &[usize],
    on_interrupt: Interrupted,
) -> RedisResult<Vec<Option<RedisResult<Value>>>> {
    match exchange_partial(con, packed, ends, on_interrupt) {
        (_, Some(e)) => Err(e),
        (replies, None) => Ok(replies),
    }
}

/// Like [`exchange`], but a timeout or a broken connection keeps the replies read before it:
/// the commands not answered get the error, which is also returned on its own.
pub(crate) fn exchange_partial(
    con: &mut redis::Connection,
    packed: &[u8],
    ends: &[usize],
    on_interrupt: Interrupted,
) -> (Vec<Option<RedisResult<Value>>>, Option<RedisError>) {
    if let Err(e) = con.send_packed_command(packed) {
        return (ends.iter().map(|_| Some(Err(e.clone()))).collect(), Some(e));
    }
    let mut replies: Vec<Option<RedisResult<Value>>> = ends.iter().map(|_| None).collect();
    // The command each reply still to come answers, in order.
    let mut awaited: VecDeque<usize> = (0..ends.len()).collect();
    let mut repeats = 0;
    while let Some(i) = awaited.pop_front() {
        let failed = match con.recv_response() {
            // Out-of-band (RESP3 pushes): not a reply to any of ours.
            Ok(Value::Push { .. }) => {
                awaited.push_front(i);
                None
            }
            Ok(value) => {
                replies[i] = Some(value.extract_error());
                None
            }
            Err(e) if interrupted(&e) => {
                // redis-rs drops this reply when it comes: ask again.
                if on_interrupt == Interrupted::SendAgain && repeats < MAX_INTERRUPTS + ends.len() {
                    let start = if i == 0 { 0 } else { ends[i - 1] };
                    match con.send_packed_command(&packed[start..ends[i]]) {
                        Ok(()) => {
                            awaited.push_back(i);
                            repeats += 1;
                            None
                        }
                        Err(e) => {
                            awaited.push_front(i);
                            Some(e)
                        }
                    }
                } else {
                    None
                }
            }
            Err(e) => {
                awaited.push_front(i);
                Some(e)
            }
        };
        if let Some(e) = failed {
            for i in awaited {
                replies[i] = Some(Err(e.clone()));
            }
            return (replies, Some(e));
        }
    }
    (replies, None)
}

/// Calls a signal may cut short, one after another, before the caller gives up: a bound for a
/// signal storm. (A pipeline may repeat this many commands beyond one per command.)
pub(crate) const MAX_INTERRUPTS: usize = 16;

/// A read interrupted by a signal (`EINTR`): redis-rs keeps the connection and skips the late
/// reply. redis-rs does not expose the I/O error kind, so this takes the I/O errors it classes
/// as neither a timeout nor a dropped connection and, of those, the ones whose message says
/// interrupted (the OS's "Interrupted system call", or std's "operation interrupted"); an ICMP
/// error such as "No route to host" is not one.
pub(crate) fn interrupted(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Io
        && !e.is_timeout()
        && !e.is_connection_dropped()
        && matches!(e.retry_method(), RetryMethod::RetryImmediately)
        && e.to_string().contains("nterrupted")
}

/// The error an interrupted reply of a pipeline turns into when the caller needs every reply.
pub(crate) fn interrupted_error() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::Interrupted))
}

/// Whether a server error is NOSCRIPT: the script must be loaded before it runs. A call so
/// refused did not run; the scripts load and send it again, and the unlock batches count it as
/// not sent.
pub(crate) fn no_script(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_a_command_as_resp_bulk_strings() {
        let mut buf = Vec::new();
        pack(
            &mut buf,
            &[
                Arg::Str("EVALSHA"),
                Arg::Str(""),
                Arg::Int(0),
                Arg::Int(u64::MAX),
            ],
        );
        assert_eq!(
            buf,
            b"*4\r\n$7\r\nEVALSHA\r\n$0\r\n\r\n$1\r\n0\r\n$20\r\n18446744073709551615\r\n"
        );
    }

    #[test]
    fn an_interrupted_read_is_told_from_timeouts_and_breaks() {
        let io = |kind| RedisError::from(std::io::Error::from(kind));
        assert!(interrupted(&io(std::io::ErrorKind::Interrupted)));
        assert!(interrupted(&interrupted_error()));
        assert!(!interrupted(&io(std::io::ErrorKind::TimedOut)));
        assert!(!interrupted(&io(std::io::ErrorKind::WouldBlock)));
        assert!(!interrupted(&io(std::io::ErrorKind::ConnectionReset)));
        assert!(!interrupted(&io(std::io::ErrorKind::UnexpectedEof)));
        assert!(!interrupted(&io(std::io::ErrorKind::HostUnreachable)));
        assert!(!interrupted(&io(std::io::ErrorKind::Other)));
        let eintr = RedisError::from(std::io::Error::from_raw_os_error(4));
        assert!(interrupted(&eintr), "{eintr}");
        let server = RedisError::from((redis::ErrorKind::Client, "no"));
        assert!(!interrupted(&server));
    }
}
