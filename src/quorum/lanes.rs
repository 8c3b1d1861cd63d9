//! Lanes: connections to the masters that a lock call's own thread drives, and each master's
//! pool of idle ones. A lane is a plain TCP connection spoken to in RESP2, set non-blocking once
//! it is open, with the replies still due on it kept in order, so that a late reply is read and
//! dropped, never taken for the answer to a later request. [`Round`](super::round::Round) writes
//! to them and polls them; the master's worker refills an empty pool after its master answered.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Script, Value};

use crate::net::wire::{self, Arg};

/// The most idle lanes a master's pool keeps: as many as threads of a client lock at once.
pub(super) const MAX_IDLE: usize = 64;
/// The most replies that may be due on a lane that goes back to its pool.
pub(super) const MAX_DUE: usize = 32;
/// The tag of requests whose replies nobody waits for.
pub(super) const NOBODY: u64 = u64::MAX;

/// How to open a lane to one master: a plain TCP master spoken to in RESP2.
pub(crate) struct Dial {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

impl Dial {
    /// The dial of `client`'s master, or `None` when its connections cannot be lanes (TLS, a
    /// Unix socket, RESP3).
    pub(crate) fn of(client: &redis::Client) -> Option<Dial> {
        let info = client.get_connection_info();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        if settings.protocol() != redis::ProtocolVersion::RESP2 {
            return None;
        }
        Some(Dial {
            host: host.clone(),
            port: *port,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
        })
    }

    /// A new lane, set up as the worker's connections are (`AUTH`, `SELECT`, and a `PING` that a
    /// server wanting a password refuses), within the timeouts.
    pub(crate) fn open(
        &self,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> std::io::Result<Lane> {
        let timeout = connection_timeout.max(Duration::from_millis(1));
        let mut stream = None;
        let mut last = None;
        for addr in (self.host.as_str(), self.port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match stream {
            Some(s) => s,
            None => return Err(last.unwrap_or_else(|| ErrorKind::NotFound.into())),
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(response_timeout.max(Duration::from_millis(1))))?;
        stream.set_write_timeout(Some(response_timeout.max(Duration::from_millis(1))))?;
        let mut packed = Vec::with_capacity(128);
        let mut due = 1;
        if let Some(password) = &self.password {
            match &self.username {
                Some(user) => wire::pack(
                    &mut packed,
                    &[Arg::Str("AUTH"), Arg::Str(user), Arg::Str(password)],
                ),
                None => wire::pack(&mut packed, &[Arg::Str("AUTH"), Arg::Str(password)]),
            }
            due += 1;
        }
        if self.db != 0 {
            let db = self.db.to_string();
            wire::pack(&mut packed, &[Arg::Str("SELECT"), Arg::Str(&db)]);
            due += 1;
        }
        wire::pack(&mut packed, &[Arg::Str("PING")]);
        // The scripts the lane carries, loaded before its first call (see
        // `scripts::LANE_SCRIPTS`). A refusal (an ACL without `SCRIPT`) costs nothing here: a
        // call answered `NOSCRIPT` goes to the worker, which loads and sends it again.
        for body in crate::scripts::LANE_SCRIPTS {
            wire::pack(
                &mut packed,
                &[Arg::Str("SCRIPT"), Arg::Str("LOAD"), Arg::Str(body)],
            );
        }
        let mut lane = Lane {
            stream,
            buf: Vec::with_capacity(512),
            due: VecDeque::new(),
        };
        lane.stream.write_all(&packed)?;
        for _ in 0..due {
            if let Err(e) = lane.read_blocking()?.extract_error() {
                return Err(std::io::Error::other(e.to_string()));
            }
        }
        for _ in crate::scripts::LANE_SCRIPTS {
            lane.read_blocking()?;
        }
        lane.stream.set_nonblocking(true)?;
        Ok(lane)
    }
}

/// One reply due on a lane.
pub(super) struct Due {
    /// When its request was written.
    pub(super) sent: Instant,
    /// The send of the round it answers; [`NOBODY`] once nobody waits for it.
    pub(super) tag: u64,
    /// The request, to hand to the worker if the lane breaks or the script is not loaded.
    pub(super) request: Option<(&'static Script, Arc<Vec<u8>>, Instant)>,
}

/// A connection to one master, non-blocking once set up.
pub(crate) struct Lane {
    pub(super) stream: TcpStream,
    /// Bytes read and not yet taken as replies.
    pub(super) buf: Vec<u8>,
    /// The replies still to come, in order.
    pub(super) due: VecDeque<Due>,
}

impl Lane {
    /// One reply, read blocking (during the set-up).
    pub(super) fn read_blocking(&mut self) -> std::io::Result<Value> {
        let mut chunk = [0u8; 512];
        loop {
            if let Some(value) = self.take()? {
                return Ok(value);
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The first complete reply in the buffer, taken out of it.
    pub(super) fn take(&mut self) -> std::io::Result<Option<Value>> {
        match resp_end(&self.buf, 0) {
            Ok(Some(end)) => {
                let value = redis::parse_redis_value(&self.buf[..end])
                    .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.to_string()))?;
                self.buf.drain(..end);
                Ok(Some(value))
            }
            Ok(None) => Ok(None),
            Err(()) => Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "a reply that is not RESP",
            )),
        }
    }

    /// Reads what has come without blocking; an error or the end of the stream breaks the lane.
    pub(super) fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if n < chunk.len() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes one request whole, without blocking: a request that does not fit in the socket's
    /// buffer at once (a master that stopped reading) breaks the lane.
    pub(super) fn write(&mut self, packed: &[u8]) -> std::io::Result<()> {
        let mut at = 0;
        while at < packed.len() {
            match self.stream.write(&packed[at..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => at += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return Err(std::io::Error::new(
                        ErrorKind::WouldBlock,
                        "the master does not read its requests",
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Each master's idle lanes, and how to open more.
pub(crate) struct Pool {
    dial: Dial,
    idle: Mutex<Vec<Lane>>,
}

impl Pool {
    pub(crate) fn new(dial: Dial) -> Pool {
        Pool {
            dial,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn take(&self) -> Option<Lane> {
        self.idle.lock().ok()?.pop()
    }

    pub(super) fn put(&self, lane: Lane) {
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(lane);
            }
        }
    }

    /// Opens a lane for the pool when it has none (the worker calls this after its master
    /// answered): the next round to that master has one.
    pub(crate) fn refill(&self, connection_timeout: Duration, response_timeout: Duration) {
        if !self.idle.lock().is_ok_and(|idle| idle.is_empty()) {
            return;
        }
        match self.dial.open(connection_timeout, response_timeout) {
            Ok(lane) => self.put(lane),
            Err(e) => log::debug!("fencelock: no lane to a quorum master: {e}"),
        }
    }
}

/// The end of one complete RESP2 value at `at` in `b`: `Ok(None)` while incomplete, `Err` for
/// bytes that are not RESP2.
fn resp_end(b: &[u8], at: usize) -> Result<Option<usize>, ()> {
    let Some(&kind) = b.get(at) else {
        return Ok(None);
    };
    let line = |from: usize| -> Result<Option<(i64, usize)>, ()> {
        let Some(rest) = b.get(from..) else {
            return Ok(None);
        };
        let Some(len) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let text = std::str::from_utf8(&rest[..len]).map_err(|_| ())?;
        Ok(Some((text.parse().unwrap_or(0), from + len + 2)))
    };
    match kind {
        b'+' | b'-' | b':' => Ok(line(at + 1)?.map(|(_, next)| next)),
        b'$' => {
            let Some((len, next)) = line(at + 1)? else {
                return Ok(None);
            };
            if len < 0 {
                return Ok(Some(next));
            }
            let end = next + usize::try_from(len).map_err(|_| ())? + 2;
            Ok((end <= b.len()).then_some(end))
        }
        b'*' => {
            let Some((n, mut next)) = line(at + 1)? else {
                return Ok(None);
            };
            for _ in 0..n.max(0) {
                match resp_end(b, next)? {
                    Some(end) => next = end,
                    None => return Ok(None),
                }
            }
            Ok(Some(next))
        }
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::resp_end;

    #[test]
    pub(super) fn finds_where_replies_end() {
        assert_eq!(resp_end(b"+OK\r\n", 0), Ok(Some(5)));
        assert_eq!(resp_end(b":1\r", 0), Ok(None));
        assert_eq!(resp_end(b"$3\r\nabc\r\n:1\r\n", 0), Ok(Some(9)));
        assert_eq!(resp_end(b"$3\r\nab", 0), Ok(None));
        assert_eq!(resp_end(b"$-1\r\n", 0), Ok(Some(5)));
        assert_eq!(resp_end(b"*2\r\n:1\r\n$2\r\n12\r\n", 0), Ok(Some(16)));
        assert_eq!(resp_end(b"*2\r\n:1\r\n", 0), Ok(None));
        assert_eq!(resp_end(b"-NOSCRIPT x\r\n", 0), Ok(Some(13)));
        assert_eq!(resp_end(b"?", 0), Err(()));
    }
}
