//! Lanes: connections to the masters that the calling thread drives itself, so that a lock call's
//! rounds cost a write to every master's socket and a `poll` over them, not a hop to a worker
//! thread per master and back.
//!
//! A [`Round`] takes one idle lane per master from that master's pool when it first sends to
//! it, writes each request to every lane at once, and reads the replies as they come. A step is
//! decided by the replies that came: a master that has not answered is not waited for once it is
//! stalled (its request out for [`STALL`], or at once when its last exchange timed out), as with
//! the workers. When the round ends, every lane goes back to its pool with the replies still due
//! on it noted, to be read and dropped before the next reply on it: a late reply is never taken
//! for the answer to a later request. A lane with too many replies due, or one due for longer
//! than a response timeout, is closed instead.
//!
//! What a lane cannot do goes to the master's worker ([`Masters`]): the first call to a master
//! (the pool is empty; the worker opens a lane for the pool after it answers), a lane that broke
//! under a request (sent again on the worker's connection, marked `retried` as the worker marks
//! it), a `NOSCRIPT` refusal (the worker loads the script and sends it again), and calls that must
//! not run twice. Only `redis://` masters over TCP in RESP2 have lanes; TLS and Unix-socket
//! masters are served by their workers alone.
//!
//! Requests from one round to one master go on one lane in order, so a failed attempt's release
//! runs after its acquire on every master, frozen or not, as on a worker's connection.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use redis::{Script, Value};
use rustix::event::{self, PollFd, PollFlags, Timespec};

use super::masters::{Masters, Reply, Request, STALL};
use super::Next;
use crate::net::wire::{self, Arg};

/// The most idle lanes a master's pool keeps: as many as threads of a client lock at once.
const MAX_IDLE: usize = 64;
/// The most replies that may be due on a lane that goes back to its pool.
const MAX_DUE: usize = 32;
/// The tag of requests whose replies nobody waits for.
const NOBODY: u64 = u64::MAX;

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
        lane.stream.set_nonblocking(true)?;
        Ok(lane)
    }
}

/// One reply due on a lane.
struct Due {
    /// When its request was written.
    sent: Instant,
    /// The send of the round it answers; [`NOBODY`] once nobody waits for it.
    tag: u64,
    /// The request, to hand to the worker if the lane breaks or the script is not loaded.
    request: Option<(&'static Script, Arc<Vec<u8>>, Instant)>,
}

/// A connection to one master, non-blocking once set up.
pub(crate) struct Lane {
    stream: TcpStream,
    /// Bytes read and not yet taken as replies.
    buf: Vec<u8>,
    /// The replies still to come, in order.
    due: VecDeque<Due>,
}

impl Lane {
    /// One reply, read blocking (during the set-up).
    fn read_blocking(&mut self) -> std::io::Result<Value> {
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
    fn take(&mut self) -> std::io::Result<Option<Value>> {
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
    fn fill(&mut self) -> std::io::Result<()> {
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
    fn write(&mut self, packed: &[u8]) -> std::io::Result<()> {
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

    fn take(&self) -> Option<Lane> {
        self.idle.lock().ok()?.pop()
    }

    fn put(&self, lane: Lane) {
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

/// How a round reaches one master.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// Not asked in this send.
    Nobody,
    /// On the round's lane to it.
    Lane,
    /// Through its worker (no lane, or the lane broke, or `NOSCRIPT`).
    Worker,
}

/// One lock call's sends to the masters and the replies to them, on lanes where it can.
pub(crate) struct Round<'a> {
    masters: &'a Masters,
    response_timeout: Duration,
    lanes: Vec<Option<Lane>>,
    /// How the current send reached each master.
    via: Vec<Via>,
    /// When the current send went to each master.
    sent: Vec<Instant>,
    /// The current send's tag: replies with another are dropped.
    tag: u64,
    ready: VecDeque<Reply>,
    /// The channel of the requests handed to workers, made at the first.
    worker: Option<(Sender<Reply>, Receiver<Reply>)>,
    /// The masters whose lanes have a reply due, polled in `wait`.
    fd_master: Vec<usize>,
}

impl<'a> Round<'a> {
    pub(crate) fn new(masters: &'a Masters, response_timeout: Duration) -> Round<'a> {
        let n = masters.len();
        let now = Instant::now();
        Round {
            masters,
            response_timeout,
            lanes: (0..n).map(|_| None).collect(),
            via: vec![Via::Nobody; n],
            sent: vec![now; n],
            tag: 0,
            ready: VecDeque::new(),
            worker: None,
            fd_master: Vec::with_capacity(n),
        }
    }

    /// Sends `packed` (a call of `script`) to each of `to`; the replies come from
    /// [`next`](Round::next) until the next send. Unsent by a worker after `expires`.
    pub(crate) fn send(
        &mut self,
        to: impl IntoIterator<Item = usize>,
        script: &'static Script,
        packed: Vec<u8>,
        expires: Instant,
    ) {
        self.tag += 1;
        self.ready.clear();
        self.via.iter_mut().for_each(|v| *v = Via::Nobody);
        let tag = self.tag;
        self.post(to, script, packed, expires, tag);
    }

    /// Sends `packed` to each of `to` and waits for no reply: behind what this round sent
    /// before, on the same lanes.
    pub(crate) fn send_unwatched(
        &mut self,
        to: impl IntoIterator<Item = usize>,
        script: &'static Script,
        packed: Vec<u8>,
        expires: Instant,
    ) {
        self.post(to, script, packed, expires, NOBODY);
    }

    fn post(
        &mut self,
        to: impl IntoIterator<Item = usize>,
        script: &'static Script,
        packed: Vec<u8>,
        expires: Instant,
        tag: u64,
    ) {
        let packed = Arc::new(packed);
        for m in to {
            let now = Instant::now();
            if tag != NOBODY {
                self.sent[m] = now;
            }
            if self.lanes[m].is_none() {
                self.lanes[m] = self.masters.pool(m).and_then(Pool::take);
                if self.lanes[m]
                    .as_ref()
                    .is_some_and(|lane| !lane.due.is_empty())
                {
                    // Late replies of earlier rounds that have come since are read and dropped
                    // now: only one still to come makes the master look slow.
                    self.read(m);
                }
            }
            let via = match self.lanes[m].as_mut() {
                Some(lane) => match lane.write(&packed) {
                    Ok(()) => {
                        lane.due.push_back(Due {
                            sent: now,
                            tag,
                            request: Some((script, Arc::clone(&packed), expires)),
                        });
                        Via::Lane
                    }
                    Err(e) => {
                        // Not written whole: the master never runs it. The lane is in an
                        // unknown state: closed; what was due on it is the worker's now.
                        log::debug!("fencelock: a lane to quorum master {m} broke: {e}");
                        self.broke(m);
                        self.hand_over(m, script, Arc::clone(&packed), expires, tag, false);
                        Via::Worker
                    }
                },
                None => {
                    self.hand_over(m, script, Arc::clone(&packed), expires, tag, false);
                    Via::Worker
                }
            };
            if tag != NOBODY {
                self.via[m] = via;
            }
        }
    }

    fn hand_over(
        &mut self,
        m: usize,
        script: &'static Script,
        packed: Arc<Vec<u8>>,
        expires: Instant,
        tag: u64,
        retried: bool,
    ) {
        let (tx, _) = self.worker.get_or_insert_with(crossbeam_channel::unbounded);
        let request = Request::new(packed, script, expires, tx.clone(), tag, false, retried);
        self.masters.dispatch(m, request);
    }

    /// The lane to `m` broke: closed, and every request on it that someone waits for goes to
    /// the worker, marked `retried` (it may have run), as the worker marks a request it sends
    /// again after its connection broke.
    fn broke(&mut self, m: usize) {
        let Some(lane) = self.lanes[m].take() else {
            return;
        };
        for due in lane.due {
            if let (true, Some((script, packed, expires))) = (due.tag == self.tag, due.request) {
                self.via[m] = Via::Worker;
                self.hand_over(m, script, packed, expires, due.tag, true);
            }
        }
    }

    /// Reads what came on the lane to `m` and keeps the replies of the current send.
    fn read(&mut self, m: usize) {
        let Some(lane) = self.lanes[m].as_mut() else {
            return;
        };
        let mut broken = lane.fill().err();
        let mut came = Vec::new();
        while broken.is_none() {
            match lane.take() {
                Ok(Some(value)) => match lane.due.pop_front() {
                    Some(due) => came.push((due, value)),
                    None => {
                        broken = Some(std::io::Error::new(
                            ErrorKind::InvalidData,
                            "a reply to no request",
                        ))
                    }
                },
                Ok(None) => break,
                Err(e) => broken = Some(e),
            }
        }
        if !came.is_empty() {
            self.masters.answered(m);
        }
        for (due, value) in came {
            if due.tag != self.tag {
                continue;
            }
            let result = value.extract_error();
            if let (Err(e), Some((script, packed, expires))) = (&result, &due.request) {
                if wire::no_script(e) {
                    // The master restarted or its scripts were flushed: the worker loads the
                    // script and sends the call again (it did not run).
                    self.via[m] = Via::Worker;
                    self.hand_over(m, script, Arc::clone(packed), *expires, due.tag, false);
                    continue;
                }
            }
            self.ready.push_back(Reply {
                master: m,
                tag: due.tag,
                result,
                retried: false,
            });
        }
        if let Some(e) = broken {
            log::debug!("fencelock: a lane to quorum master {m} broke: {e}");
            self.broke(m);
        }
    }

    /// From when `m`, asked in the current send and not answered yet, counts as stalled.
    fn stalled_at(&self, m: usize) -> Option<Instant> {
        match self.via[m] {
            Via::Nobody => None,
            Via::Worker => self.masters.stalled_at(m),
            Via::Lane => {
                // Out for STALL counting from the oldest request still due on the lane (a
                // late reply ahead of ours is the master's slowness too); at once after a
                // timeout, as for a worker.
                let oldest = self.lanes[m]
                    .as_ref()
                    .and_then(|lane| lane.due.front())
                    .map_or(self.sent[m], |due| due.sent);
                if self.masters.is_suspect(m) {
                    Some(oldest)
                } else {
                    Some(oldest + STALL)
                }
            }
        }
    }

    fn is_stalled(&self, m: usize, now: Instant) -> bool {
        self.stalled_at(m).is_some_and(|at| at <= now)
    }

    /// The masters the current send still waits for at `now`: not `done` (answered, or not
    /// asked), and not stalled.
    pub(crate) fn waited_for<'b>(
        &'b self,
        done: &'b [bool],
        now: Instant,
    ) -> impl Iterator<Item = usize> + 'b {
        (0..self.via.len()).filter(move |m| !done[*m] && !self.is_stalled(*m, now))
    }

    /// The next reply to the current send, waiting no later than `until`, nor past the moment
    /// a master the step still waits for stalls: the step then counts again without it.
    pub(crate) fn next(&mut self, done: &[bool], until: Instant) -> Next {
        loop {
            if let Some(reply) = self.take_ready() {
                return Next::Reply(reply);
            }
            let now = Instant::now();
            let look = self
                .waited_for(done, now)
                .map(|m| self.stalled_at(m).unwrap_or(now + STALL))
                .min()
                .unwrap_or(now + STALL)
                .max(now + Duration::from_micros(100));
            let wake = look.min(until);
            if now >= until {
                return Next::Done;
            }
            self.wait(wake - now);
            if self.ready.is_empty() && Instant::now() >= wake {
                if let Some(reply) = self.take_ready() {
                    return Next::Reply(reply);
                }
                return if look < until {
                    Next::Recount
                } else {
                    Next::Done
                };
            }
        }
    }

    /// A reply to the current send that has come already, if any.
    pub(crate) fn try_next(&mut self) -> Option<Reply> {
        if let Some(reply) = self.take_ready() {
            return Some(reply);
        }
        self.wait(Duration::ZERO);
        self.take_ready()
    }

    fn take_ready(&mut self) -> Option<Reply> {
        if let Some(reply) = self.ready.pop_front() {
            return Some(reply);
        }
        let (_, rx) = self.worker.as_ref()?;
        while let Ok(reply) = rx.try_recv() {
            if reply.tag == self.tag {
                return Some(reply);
            }
        }
        None
    }

    /// Waits up to `timeout` for something to read on a lane (or for a worker's reply: looked
    /// at every millisecond while one is awaited), and reads it.
    fn wait(&mut self, timeout: Duration) {
        self.fd_master.clear();
        for (m, lane) in self.lanes.iter().enumerate() {
            if lane.as_ref().is_some_and(|lane| !lane.due.is_empty()) {
                self.fd_master.push(m);
            }
        }
        let by_worker = self.via.contains(&Via::Worker);
        let timeout = if by_worker {
            timeout.min(Duration::from_millis(1))
        } else {
            timeout
        };
        if self.fd_master.is_empty() {
            if let (true, Some((_, rx))) = (by_worker, self.worker.as_ref()) {
                if let Ok(reply) = rx.recv_timeout(timeout) {
                    if reply.tag == self.tag {
                        self.ready.push_back(reply);
                    }
                }
            } else if !timeout.is_zero() {
                std::thread::sleep(timeout);
            }
            return;
        }
        // The poll set borrows the lanes' sockets, so it is made for each wait (a handful of
        // entries); after it, `fd_master` keeps only the masters with something to read.
        let (lanes, fd_master) = (&self.lanes, &mut self.fd_master);
        let mut fds: Vec<PollFd<'_>> = fd_master
            .iter()
            .filter_map(|&m| lanes[m].as_ref())
            .map(|lane| PollFd::new(&lane.stream, PollFlags::IN))
            .collect();
        // A wait past a minute is cut there: the caller looks at the clock and waits again.
        let spec = Timespec::try_from(timeout.min(Duration::from_secs(60))).ok();
        if !matches!(event::poll(&mut fds, spec.as_ref()), Ok(n) if n > 0) {
            // Timed out, or a signal: the caller looks at the clock.
            return;
        }
        let mut revents = fds.iter().map(|fd| fd.revents());
        fd_master.retain(|_| revents.next().is_some_and(|r| !r.is_empty()));
        drop(fds);
        for i in 0..self.fd_master.len() {
            self.read(self.fd_master[i]);
        }
    }
}

impl Drop for Round<'_> {
    /// Every lane back to its pool, with what is due on it noted; a lane with too much due, or
    /// due for longer than a response timeout (a frozen master), is closed, and its master
    /// counts as timed out until it answers again.
    fn drop(&mut self) {
        let now = Instant::now();
        for m in 0..self.lanes.len() {
            let Some(mut lane) = self.lanes[m].take() else {
                continue;
            };
            let overdue = lane
                .due
                .front()
                .is_some_and(|due| now.duration_since(due.sent) >= self.response_timeout);
            if overdue {
                self.masters.timed_out(m);
            }
            if overdue || lane.due.len() > MAX_DUE {
                continue;
            }
            for due in &mut lane.due {
                due.tag = NOBODY;
                due.request = None;
            }
            if let Some(pool) = self.masters.pool(m) {
                pool.put(lane);
            }
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
    fn finds_where_replies_end() {
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
