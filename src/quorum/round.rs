//! A round: a lock call's requests written to every master at once on lanes (`lanes.rs`),
//! connections the calling thread drives itself, so that its rounds cost a write to every
//! master's socket and a `poll` over them, not a hop to a worker thread per master and back.
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
//! not run twice. Calls sent unwatched (a failed attempt's release) take the same way on
//! `NOSCRIPT` or a broken lane, even when read by a later round: nobody waits for them, but they
//! must run. Only `redis://` masters over TCP in RESP2 have lanes; TLS and Unix-socket
//! masters are served by their workers alone.
//!
//! Requests from one round to one master go on one lane in order, so a failed attempt's release
//! runs after its acquire on every master, frozen or not, as on a worker's connection.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use redis::Script;
use rustix::event::{self, PollFd, PollFlags, Timespec};

use super::lanes::{Due, Lane, Pool, MAX_DUE, NOBODY};
use super::masters::{Masters, Reply, Request, STALL};
use super::Next;
use crate::net::wire;

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

    /// The lane to `m` broke: closed, and every request on it that someone waits for, or that
    /// was sent unwatched, goes to the worker, marked `retried` (it may have run), as the worker
    /// marks a request it sends again after its connection broke.
    fn broke(&mut self, m: usize) {
        let Some(lane) = self.lanes[m].take() else {
            return;
        };
        for due in lane.due {
            let Some((script, packed, expires)) = due.request else {
                continue;
            };
            if due.tag == self.tag {
                self.via[m] = Via::Worker;
                self.hand_over(m, script, packed, expires, due.tag, true);
            } else if due.tag == NOBODY {
                // Sent unwatched (a failed attempt's release): it may not have run, and running
                // it twice finds nothing the second time.
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
            // Calls of the current send, and calls sent unwatched (a failed attempt's release,
            // which must run even though nobody waits for it); not calls whose caller gave up.
            let current = due.tag == self.tag;
            if !current && due.tag != NOBODY {
                continue;
            }
            let result = value.extract_error();
            if let (Err(e), Some((script, packed, expires))) = (&result, &due.request) {
                if wire::no_script(e) {
                    // The master restarted or its scripts were flushed: the worker loads the
                    // script and sends the call again (it did not run).
                    if current {
                        self.via[m] = Via::Worker;
                    }
                    self.hand_over(m, script, Arc::clone(packed), *expires, due.tag, false);
                    continue;
                }
            }
            if !current {
                continue;
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
            // Nobody waits for these replies any more. A call sent unwatched keeps its request,
            // so that a `NOSCRIPT` still sends it through the worker; a watched one whose caller
            // gave up must not run late.
            for due in &mut lane.due {
                if due.tag != NOBODY {
                    due.tag = NOBODY;
                    due.request = None;
                }
            }
            if let Some(pool) = self.masters.pool(m) {
                pool.put(lane);
            }
        }
    }
}
