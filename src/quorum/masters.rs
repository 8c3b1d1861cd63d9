//! One thread and one connection per master, for the requests a lock call's own connections
//! (`lanes.rs`) cannot carry: the first call to a master (the worker then opens a connection for
//! the callers' pool), a request whose connection broke, a script the master lost, calls nobody
//! waits for (a guard's drop), the renewal thread's rounds, status, force_unlock, and every call
//! to a TLS or Unix-socket master.
//!
//! A caller hands each master's worker the same request and collects the replies on one
//! channel, so the N round trips overlap and a call waits for the majority, never for the
//! slowest master. A worker sends everything queued for its master as one pipeline, so threads
//! calling at once share round trips instead of queueing for connections.
//!
//! | the master | the worker | the caller |
//! |---|---|---|
//! | answers | replies to each request on its caller's channel | counts the reply |
//! | refuses the connection | fails the batch at once; waits 50 ms, doubling to 1 s, before connecting again, failing requests meanwhile | counts a refusal |
//! | frozen, or cut off | waits a response timeout, drops the connection, fails the batch; connects again for the next batch, with no pause (that takes a connection timeout by itself) | no longer waits for it once it is stalled (below) and the others decide; else counts a refusal at its own deadline |
//! | answers after its caller gave up | a request whose caller stopped waiting is not sent | - |
//!
//! A caller cannot tell a frozen master from a slow one, but it need not wait for one to decide:
//! each worker publishes since when it has been busy with one exchange (or a connection
//! attempt), and whether its last exchange timed out. A master whose worker has been busy for
//! [`STALL`], or that timed out last time and is busy again, is *stalled*: a call waits no longer
//! for it once the other masters' replies decide the step (see [`Masters::stalled_at`]). A reply
//! that comes from it before the step is decided still counts. Without this, every attempt that
//! the live masters alone could not decide (two clients splitting them) waited for a frozen
//! master until the attempt's validity ran out, and a frozen minority cut grants to a few per
//! cent.
//!
//! A request that reaches a frozen master may run when it wakes, late: the protocol allows for
//! that (a late acquire holds a master's key until its lease runs out; a late confirm or extend
//! does nothing unless the lock is still that attempt's).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use redis::{RedisError, RedisResult, Script, Value};

use super::lanes::{Dial, Pool};
use crate::net::connector::Connector;
use crate::net::wire::{self, Interrupted};

/// The most requests one pipeline carries.
const MAX_BATCH: usize = 256;
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a worker may be busy with one exchange before callers stop waiting for its master
/// (when the others decide without it). Far above a round trip, even on a loaded machine, and far
/// below a lease: a master that is only slow costs an attempt a retry at worst, never a wrong
/// answer, since a step decided without it is decided by the others' replies alone.
pub(crate) const STALL: Duration = Duration::from_millis(50);

/// One request to one master.
pub(crate) struct Request {
    /// One `EVALSHA` call, packed (shared by the requests of one fan-out).
    pub(crate) packed: Arc<Vec<u8>>,
    /// Its script, loaded when a master answers NOSCRIPT.
    pub(crate) script: &'static Script,
    /// Not sent after this: nobody waits for the reply any more.
    pub(crate) expires: Instant,
    /// Where the reply goes, with `tag`.
    pub(crate) reply: Sender<Reply>,
    pub(crate) tag: u64,
    /// Must not run twice (a forced release): never sent again.
    pub(crate) once: bool,
    /// Sent again on a new connection after the first broke under it: it may have run twice.
    retried: bool,
}

impl Request {
    /// A request of `packed` (a call of `script`), answered on `reply` with `tag`; `retried`
    /// when it went out once already on a connection that broke.
    pub(crate) fn new(
        packed: Arc<Vec<u8>>,
        script: &'static Script,
        expires: Instant,
        reply: Sender<Reply>,
        tag: u64,
        once: bool,
        retried: bool,
    ) -> Request {
        Request {
            packed,
            script,
            expires,
            reply,
            tag,
            once,
            retried,
        }
    }
}

/// One call for [`Masters::send`]: `packed` (a call of `script`), unsent after `expires`,
/// answered on `reply` with `tag`.
pub(crate) struct Call<'a> {
    pub(crate) script: &'static Script,
    pub(crate) packed: Vec<u8>,
    pub(crate) expires: Instant,
    pub(crate) reply: &'a Sender<Reply>,
    pub(crate) tag: u64,
    /// Must not run twice.
    pub(crate) once: bool,
}

/// A master's reply to one request.
pub(crate) struct Reply {
    pub(crate) master: usize,
    pub(crate) tag: u64,
    pub(crate) result: RedisResult<Value>,
    /// The request went twice (see [`Request`]): a `0` from a release may mean the first run
    /// deleted the key.
    pub(crate) retried: bool,
}

/// The sending end of each master's worker; the workers end when this is dropped.
pub(crate) struct Masters {
    workers: Vec<Sender<Request>>,
    health: Vec<Arc<Health>>,
    /// Each master's idle lanes (`lanes.rs`), for masters that can have them.
    pools: Vec<Option<Arc<Pool>>>,
    /// What [`Health::busy_since`] counts from.
    epoch: Instant,
}

/// What a worker tells callers about its master.
struct Health {
    /// Microseconds from [`Masters::epoch`] to the start of the exchange (or connection attempt)
    /// under way, plus one; 0 while the worker waits for requests.
    busy_since: AtomicU64,
    /// The last exchange or connection attempt timed out, and no reply came since.
    suspect: AtomicBool,
}

impl Health {
    fn busy(&self, epoch: Instant) {
        let micros = u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        self.busy_since.store(micros + 1, Ordering::Relaxed);
    }

    fn idle(&self) {
        self.busy_since.store(0, Ordering::Relaxed);
    }
}

impl Masters {
    /// Starts a worker per master of `connector`.
    pub(crate) fn start(
        connector: &Arc<Connector>,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> std::io::Result<Masters> {
        let mut workers = Vec::new();
        let mut healths = Vec::new();
        let mut pools = Vec::new();
        let epoch = Instant::now();
        for index in 0..connector.masters() {
            let pool = connector
                .master_client(index)
                .and_then(Dial::of)
                .map(|dial| Arc::new(Pool::new(dial)));
            pools.push(pool.clone());
            let (tx, rx) = crossbeam_channel::unbounded();
            let health = Arc::new(Health {
                busy_since: AtomicU64::new(0),
                suspect: AtomicBool::new(false),
            });
            healths.push(Arc::clone(&health));
            let worker = Worker {
                index,
                health,
                epoch,
                last_failure: None,
                connector: Arc::clone(connector),
                connection_timeout,
                response_timeout,
                con: None,
                pool,
                retry_at: None,
                backoff: FIRST_BACKOFF,
            };
            thread::Builder::new()
                .name(format!("fencelock-master-{index}"))
                .spawn(move || worker.run(&rx))?;
            workers.push(tx);
        }
        Ok(Masters {
            workers,
            health: healths,
            pools,
            epoch,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// From when `master` counts as stalled if it has not answered by then: now or earlier when
    /// it already is (busy for [`STALL`], or busy again after a timeout), `None` while its worker
    /// waits for requests (it takes ours at once).
    pub(crate) fn stalled_at(&self, master: usize) -> Option<Instant> {
        let health = &self.health[master];
        let since = match health.busy_since.load(Ordering::Relaxed) {
            0 => return None,
            micros => self.epoch + Duration::from_micros(micros - 1),
        };
        if health.suspect.load(Ordering::Relaxed) {
            return Some(since);
        }
        Some(since + STALL)
    }

    /// When to look again at the masters in `waiting` (not answered yet, none stalled at `now`):
    /// the first moment one of them may count as stalled.
    pub(crate) fn next_stall(
        &self,
        waiting: impl IntoIterator<Item = usize>,
        now: Instant,
    ) -> Instant {
        waiting
            .into_iter()
            .map(|m| self.stalled_at(m).unwrap_or(now + STALL))
            .min()
            .unwrap_or(now + STALL)
            .max(now + Duration::from_millis(1))
    }

    pub(crate) fn is_stalled(&self, master: usize, now: Instant) -> bool {
        self.stalled_at(master).is_some_and(|at| at <= now)
    }

    /// `master`'s pool of lanes, if it can have lanes.
    pub(crate) fn pool(&self, master: usize) -> Option<&Pool> {
        self.pools[master].as_deref()
    }

    /// Whether `master`'s last exchange timed out, with no reply since.
    pub(crate) fn is_suspect(&self, master: usize) -> bool {
        self.health[master].suspect.load(Ordering::Relaxed)
    }

    /// A reply came from `master` on a lane.
    pub(crate) fn answered(&self, master: usize) {
        self.health[master].suspect.store(false, Ordering::Relaxed);
    }

    /// A request on a lane to `master` went unanswered for a response timeout.
    pub(crate) fn timed_out(&self, master: usize) {
        self.health[master].suspect.store(true, Ordering::Relaxed);
    }

    /// Hands `request` to `master`'s worker; a refusal if the worker is gone.
    pub(crate) fn dispatch(&self, master: usize, request: Request) {
        if let Err(unsent) = self.workers[master].send(request) {
            // The worker is gone (it cannot panic, so only at shutdown): a refusal.
            let request = unsent.into_inner();
            let _ = request.reply.send(Reply {
                master,
                tag: request.tag,
                result: Err(RedisError::from((
                    redis::ErrorKind::Io,
                    "the master's worker thread is gone",
                ))),
                retried: false,
            });
        }
    }

    /// Sends `packed` (a call of `script`) to each of `to`, replies to `reply` tagged `tag`;
    /// unsent after `expires`.
    pub(crate) fn send(&self, to: impl IntoIterator<Item = usize>, call: Call<'_>) {
        let packed = Arc::new(call.packed);
        for master in to {
            let request = Request::new(
                Arc::clone(&packed),
                call.script,
                call.expires,
                call.reply.clone(),
                call.tag,
                call.once,
                false,
            );
            self.dispatch(master, request);
        }
    }
}

struct Worker {
    index: usize,
    health: Arc<Health>,
    epoch: Instant,
    /// Why the last connection attempt failed: what requests fail with until the next one.
    last_failure: Option<RedisError>,
    connector: Arc<Connector>,
    connection_timeout: Duration,
    response_timeout: Duration,
    con: Option<redis::Connection>,
    /// The master's lanes: one is opened when there is none, after the master answered.
    pool: Option<Arc<Pool>>,
    /// After a failed connect, no new one before this.
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl Worker {
    fn run(mut self, requests: &Receiver<Request>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Ok(first) = requests.recv() {
            // Requests nobody waits for any more are dropped as they are taken, so that what
            // queued behind a frozen master (an attempt's acquire and release every few ms) is
            // never more than one batch once it thaws.
            let now = Instant::now();
            if first.expires > now {
                batch.push(first);
            }
            while batch.len() < MAX_BATCH {
                match requests.try_recv() {
                    Ok(request) if request.expires > now => batch.push(request),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.health.busy(self.epoch);
                let answered = self.serve(&mut batch);
                if let (true, Some(pool)) = (answered, &self.pool) {
                    pool.refill(self.connection_timeout, self.response_timeout);
                }
                self.health.idle();
            }
            batch.clear();
        }
    }

    /// Sends `batch` as one pipeline and answers each request. Requests that may run twice are
    /// sent again once on a new connection when a reused one turns out broken (a master that
    /// restarted, an idle connection the master or a proxy closed), so that an outage is one
    /// refusal and a closed connection none; a timeout is never sent again (a frozen master).
    /// Whether the master answered any of them.
    fn serve(&mut self, batch: &mut [Request]) -> bool {
        let mut replies: Vec<Option<RedisResult<Value>>> = batch.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..batch.len()).collect();
        let (mut loaded, mut reconnected) = (false, false);
        let mut answered = false;
        // A first send, one after NOSCRIPT, one on a new connection: three at most.
        for _ in 0..3 {
            if todo.is_empty() {
                break;
            }
            let reused = self.con.is_some();
            let con = match self.connection() {
                Ok(con) => con,
                Err(e) => {
                    for &i in &todo {
                        replies[i] = Some(Err(e.clone()));
                    }
                    break;
                }
            };
            // Connecting may have taken a while (a frozen master answers no PING).
            let now = Instant::now();
            todo.retain(|&i| batch[i].expires > now);
            if todo.is_empty() {
                break;
            }
            let mut packed = Vec::with_capacity(todo.iter().map(|&i| batch[i].packed.len()).sum());
            let mut ends = Vec::with_capacity(todo.len());
            for &i in &todo {
                packed.extend_from_slice(&batch[i].packed);
                ends.push(packed.len());
            }
            // After a signal cuts a read short, the quorum scripts may run again: acquire,
            // confirm and extend do the same again for the same owner, and a release that runs
            // again finds nothing and answers 0 (not marked `retried`: `unlock` would report the
            // lock lost only if that happened on a majority of masters at once). A forced
            // release may not run again.
            let on_interrupt = if todo.iter().any(|&i| batch[i].once) {
                Interrupted::LeaveUnanswered
            } else {
                Interrupted::SendAgain
            };
            let (got, failed) = wire::exchange_partial(con, &packed, &ends, on_interrupt);
            if got.iter().any(|r| matches!(r, Some(Ok(_)))) {
                answered = true;
                self.health.suspect.store(false, Ordering::Relaxed);
            } else if failed.as_ref().is_some_and(RedisError::is_timeout) {
                self.health.suspect.store(true, Ordering::Relaxed);
            }
            let refused: Vec<usize> = todo
                .iter()
                .zip(&got)
                .filter(|(_, r)| no_script(r))
                .map(|(&i, _)| i)
                .collect();
            let broken = failed.as_ref().is_some_and(|e| !e.is_timeout());
            if failed.is_some() {
                // Timed out or broken: a late reply must not be read as the answer to the next
                // pipeline.
                self.con = None;
            }
            let mut again = Vec::new();
            for (&i, reply) in todo.iter().zip(got) {
                let unanswered = match &reply {
                    None => true,
                    Some(Err(e)) => {
                        failed.is_some() && (e.is_io_error() || e.is_connection_dropped())
                    }
                    Some(Ok(_)) => false,
                };
                if refused.contains(&i) && !loaded && failed.is_none() {
                    // A master that restarted, or whose scripts were flushed: refused calls did
                    // not run.
                    again.push(i);
                } else if unanswered && broken && reused && !reconnected && !batch[i].once {
                    batch[i].retried = true;
                    again.push(i);
                } else {
                    replies[i] = reply;
                }
            }
            if !refused.is_empty() && !loaded && failed.is_none() {
                loaded = true;
                if let Some(con) = self.con.as_mut() {
                    let mut scripts: Vec<&Script> =
                        again.iter().map(|&i| batch[i].script).collect();
                    scripts.dedup_by_key(|s| s.get_hash().to_owned());
                    if let Err(e) = scripts.iter().try_for_each(|s| s.load(con).map(drop)) {
                        self.con = None;
                        for &i in &again {
                            replies[i] = Some(Err(e.clone()));
                        }
                        again.clear();
                    }
                }
            }
            if broken && reused {
                reconnected = true;
            }
            todo = again;
        }
        for (request, reply) in batch.iter().zip(replies) {
            let result = reply.unwrap_or_else(|| Err(wire::interrupted_error()));
            let _ = request.reply.send(Reply {
                master: self.index,
                tag: request.tag,
                result,
                retried: request.retried,
            });
        }
        answered
    }

    fn connection(&mut self) -> RedisResult<&mut redis::Connection> {
        if self.con.is_none() {
            if let Some(at) = self.retry_at {
                if Instant::now() < at {
                    // The refusal of a moment ago, as it was.
                    return Err(self.last_failure.clone().unwrap_or_else(|| {
                        RedisError::from((
                            redis::ErrorKind::Io,
                            "the master could not be reached a moment ago",
                        ))
                    }));
                }
            }
            match self
                .connector
                .master(self.index, self.connection_timeout, self.response_timeout)
            {
                Ok(con) => {
                    self.con = Some(con);
                    self.retry_at = None;
                    self.last_failure = None;
                    self.backoff = FIRST_BACKOFF;
                }
                Err(e) if e.is_timeout() => {
                    // A frozen or cut-off master: the attempt itself took the connection
                    // timeout, so no pause is added, and requests that come after a thaw are
                    // not failed with an error of before it.
                    self.health.suspect.store(true, Ordering::Relaxed);
                    log::debug!("fencelock: quorum master {} unreachable: {e}", self.index);
                    return Err(e);
                }
                Err(e) => {
                    self.last_failure = Some(e.clone());
                    self.retry_at = Some(Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    log::debug!("fencelock: quorum master {} unreachable: {e}", self.index);
                    return Err(e);
                }
            }
        }
        self.con
            .as_mut()
            .ok_or_else(|| RedisError::from((redis::ErrorKind::Io, "no connection to the master")))
    }
}

fn no_script(reply: &Option<RedisResult<Value>>) -> bool {
    matches!(reply, Some(Err(e)) if wire::no_script(e))
}
