//! The connection pool behind acquire and release.
//!
//! A lock call connects in its own thread, once, within the connection timeout, and hears why a
//! connection failed at once: refused, timed out, or rejected by the server (a wrong password,
//! a database that does not exist). A general-purpose pool such as r2d2 connects on a thread of
//! its own, retries failures in the background, and reports them only as text after the whole
//! connection timeout, so a `try_lock` of 100 ms took the connection timeout twice with Redis
//! down, and a wrong password looked like an outage.
//!
//! Checkout costs no round trip: connections are numbered as they are made, and once any call
//! sees the connection to Redis break (a restart, say), every connection made before that point
//! is discarded at its next checkout, so one outage costs one failed command, not one per pooled
//! connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisError, Value};

use crate::net::connector::{connect_error, Connector, Node};
use crate::net::wire::{self, Interrupted};

use crate::error::{Error, Result};

mod combine;

use combine::{Combiner, Turn};

/// Which run of a call a [`Pool::run_as`] closure makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Run {
    /// The first: nothing of it can have reached Redis yet.
    First,
    /// Another: an earlier run may have taken effect before its connection broke or its reply
    /// was cut short.
    Retry,
}

/// A connection of the pool, borrowed by [`Pool::get`] and given back by [`Pool::put`]. One
/// dropped instead (an error path that returned early, say) closes, and frees its place.
pub(crate) struct Conn {
    pub(crate) con: redis::Connection,
    generation: u64,
    /// The connector's epoch when it was made: see [`Connector::epoch`].
    epoch: u64,
    /// A command on it timed out: the connection may be half-open, or out of step with replies
    /// that will never come. Discarded when it goes back to the pool.
    timed_out: bool,
    /// Where its place is counted; empty once it no longer counts.
    shelf: Weak<Shelf>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(shelf) = self.shelf.upgrade() {
            let mut slots = shelf.slots();
            slots.open = slots.open.saturating_sub(1);
            shelf.wake_one(slots);
        }
    }
}

/// The connections to one node: a lock call borrows one, and unlocks of concurrent threads go
/// out together on one.
pub(crate) struct Pool {
    connector: Arc<Connector>,
    node: Node,
    size: u32,
    connection_timeout: Duration,
    response_timeout: Duration,
    shelf: Arc<Shelf>,
    /// Every connection numbered below this predates a break: discarded at its next checkout.
    made: AtomicU64,
    stale_below: AtomicU64,
    /// The last connection attempt or command failed to reach Redis, and nothing has succeeded
    /// since: see [`Pool::unreachable`].
    unreachable: AtomicBool,
    /// Batches of combined calls that got no reply within the response timeout: a call that
    /// waited behind one is not sent (see [`Unsent`]).
    batch_failures: AtomicU64,
    /// Calls waiting to go out together (see [`Pool::combined`]).
    combining: Combiner<Vec<u8>, Combined>,
}

/// The idle connections, and how many there are in all.
#[derive(Default)]
struct Shelf {
    slots: Mutex<Slots>,
    /// Signalled when a connection comes back, or a place frees up, if anyone waits.
    returned: Condvar,
}

#[derive(Default)]
struct Slots {
    idle: Vec<Conn>,
    /// Connections in existence or being made: idle, borrowed, or connecting.
    open: u32,
    /// Threads waiting on `returned` for a connection.
    waiting: u32,
}

impl Shelf {
    /// Never held while a counted [`Conn`] is dropped: its drop takes this lock.
    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases `slots`, changed by the caller, and wakes a thread waiting for a connection, if
    /// there is one. Only then: a notify is a system call even when nobody waits (a futex wake),
    /// and a connection goes back after every call. A waiter counts itself under the lock
    /// before it waits, so none is missed.
    fn wake_one(&self, slots: MutexGuard<'_, Slots>) {
        let anyone = slots.waiting > 0;
        drop(slots);
        if anyone {
            self.returned.notify_one();
        }
    }
}

/// How a combined call ended.
enum Combined {
    Reply(Value),
    /// The call may have run (a timeout, a broken connection, a signal); the error says which,
    /// and the number the connector's epoch had when its connection was made.
    Failed(RedisError, u64),
    /// No connection could be had: the call did not run.
    NoConnection(Error),
    /// Refused unrun (NOSCRIPT): to be run alone, which loads the script.
    NotRun,
    /// Not sent: the batch ahead of it got no reply while it waited (see [`Unsent`]).
    Unsent,
}

/// The cause of an [`Error::Connection`] for a call that was not sent because the batch of calls
/// sent just before it got no reply: Redis stopped answering. Sending it anyway would wait for
/// the response timeout once more.
#[derive(Debug)]
pub(crate) struct Unsent;

impl std::fmt::Display for Unsent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not sent: the calls sent just before it got no reply from redis")
    }
}

impl std::error::Error for Unsent {}

/// Whether `e` is a call that was never sent because Redis had just stopped answering.
pub(crate) fn unsent(e: &Error) -> bool {
    match e {
        Error::Connection(cause) => cause.is::<Unsent>(),
        _ => false,
    }
}

impl Pool {
    pub(crate) fn new(
        connector: Arc<Connector>,
        node: Node,
        size: u32,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Pool {
        Pool {
            connector,
            node,
            size,
            connection_timeout,
            response_timeout,
            shelf: Arc::default(),
            made: AtomicU64::new(0),
            stale_below: AtomicU64::new(0),
            unreachable: AtomicBool::new(false),
            batch_failures: AtomicU64::new(0),
            combining: Combiner::default(),
        }
    }

    /// An idle connection, or a new one made within the connection timeout, or, with every
    /// connection in use, the first one given back within the connection timeout; either by
    /// `deadline` at the latest, when the caller has one (at least [`MIN_READ`]). A failed
    /// connection attempt is reported at once, with its cause: never retried here.
    fn get(&self, deadline: Option<Instant>) -> Result<Conn> {
        let started = Instant::now();
        let patience = match deadline {
            Some(deadline) => self
                .connection_timeout
                .min(deadline.saturating_duration_since(started).max(MIN_READ)),
            None => self.connection_timeout,
        };
        let mut slots = self.shelf.slots();
        // Popped stale connections, dropped once the lock is released (their drop takes it).
        let mut stale = Vec::new();
        loop {
            while let Some(mut conn) = slots.idle.pop() {
                if self.is_stale(&conn) {
                    slots.open = slots.open.saturating_sub(1);
                    conn.shelf = Weak::new();
                    stale.push(conn);
                    continue;
                }
                return Ok(conn);
            }
            if slots.open < self.size {
                slots.open += 1;
                drop(slots);
                drop(stale);
                return self.connect(patience, patience < self.connection_timeout);
            }
            let waited = started.elapsed();
            let Some(left) = patience.checked_sub(waited).filter(|l| !l.is_zero()) else {
                return Err(Error::PoolExhausted {
                    size: self.size,
                    waited,
                });
            };
            slots.waiting += 1;
            slots = self
                .shelf
                .returned
                .wait_timeout(slots, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            slots.waiting -= 1;
        }
    }

    /// Gives a connection back: kept for the next call, or closed if it broke.
    fn put(&self, conn: Conn) {
        let broken = conn.timed_out || !conn.con.is_open() || self.is_stale(&conn);
        if broken {
            drop(conn);
            return;
        }
        let mut slots = self.shelf.slots();
        slots.idle.push(conn);
        self.shelf.wake_one(slots);
    }

    /// Makes a connection for a place already counted in `open`, within `timeout`; `cut`: the
    /// caller's deadline made that shorter than the connection timeout.
    fn connect(&self, timeout: Duration, cut: bool) -> Result<Conn> {
        let generation = self.made.fetch_add(1, Ordering::Relaxed);
        // Read before connecting: a connection made while the epoch moves counts as older.
        let epoch = self.connector.epoch(self.node);
        match self.connect_aside(timeout) {
            Ok(con) => Ok(Conn {
                con,
                generation,
                epoch,
                timed_out: false,
                shelf: Arc::downgrade(&self.shelf),
            }),
            Err(e) => {
                let mut slots = self.shelf.slots();
                slots.open = slots.open.saturating_sub(1);
                self.shelf.wake_one(slots);
                // A connection the caller's deadline cut short says nothing about the server:
                // it may only be slower than that deadline (see `finish`).
                if !(cut && e.is_timeout()) {
                    self.unreachable.store(true, Ordering::Relaxed);
                }
                Err(connect_error(e).at(self.connector.server(self.node)))
            }
        }
    }

    /// A new connection, made on a thread of its own while this one waits for it, at most
    /// `connection_timeout`. A signal that interrupts the handshake's reads (EINTR, see `wire`)
    /// can leave redis-rs waiting for a reply it already consumed until the timeout runs out;
    /// the caller's thread is the one a program's signals target (a profiler, a timer), the
    /// connecting thread is not.
    fn connect_aside(&self, connection_timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let (made, connection) = crossbeam_channel::bounded(1);
        let connector = Arc::clone(&self.connector);
        let (node, response_timeout) = (self.node, self.response_timeout);
        let spawned = std::thread::Builder::new()
            .name("fencelock-connect".into())
            .spawn(move || {
                let _ = made.send(connect(
                    &connector,
                    node,
                    connection_timeout,
                    response_timeout,
                ));
            });
        if spawned.is_err() {
            return connect(&self.connector, node, connection_timeout, response_timeout);
        }
        // A little more than the connection timeout, which the connecting thread keeps itself.
        match connection.recv_timeout(connection_timeout + MIN_READ) {
            Ok(made) => made,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connecting took longer than the connection timeout",
            ))),
        }
    }

    fn is_stale(&self, conn: &Conn) -> bool {
        conn.generation < self.stale_below.load(Ordering::Relaxed)
            || conn.epoch < self.connector.epoch(self.node)
    }

    /// The node this pool's connections go to.
    pub(crate) fn node(&self) -> Node {
        self.node
    }

    /// Whether the last connection attempt or command of this pool failed to reach Redis (it
    /// was refused, broke, or timed out) with no success since: a call now would likely wait
    /// for a timeout.
    pub(crate) fn unreachable(&self) -> bool {
        self.unreachable.load(Ordering::Relaxed)
    }

    /// Runs `f` on a pooled connection, its first run being `first` (a retry, if an earlier
    /// run, on this pool or another, may have run). If the connection turns out to be broken
    /// (Redis restarted since it was made), every older connection is retired and `f` runs once
    /// more on a fresh one, told so by its [`Run`] argument; a second failure is returned. A
    /// reply a signal interrupted costs a run again, on the same connection. `f` must be safe
    /// to repeat: the first run may have taken effect before the connection broke or the read
    /// was cut.
    ///
    /// With a `deadline`, replies are awaited until then (at least [`MIN_READ`]) when that is
    /// sooner than the response timeout, and a reply that comes later is a timeout like any
    /// other.
    pub(crate) fn run_as<T>(
        &self,
        first: Run,
        deadline: Option<Instant>,
        mut f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut conn = self.get(deadline)?;
        let mut cut = self.cut_reads(&mut conn, deadline);
        let mut result = f(&mut conn.con, first);
        let mut reconnected = false;
        // Whether any run so far may have taken effect.
        let mut run = first;
        for _ in 0..wire::MAX_INTERRUPTS {
            match &result {
                // A connection broke, or went to a server that is no longer the node's master
                // (which refused the command unrun, so this run counts as not having happened):
                // once more, on a fresh connection.
                Err(e) if (broke(e) || self.connector.not_master(e)) && !reconnected => {
                    if broke(e) {
                        run = Run::Retry;
                    }
                    self.retire_all(conn.epoch, e);
                    self.put(conn);
                    conn = self.get(deadline)?;
                    cut = self.cut_reads(&mut conn, deadline);
                    reconnected = true;
                }
                // A signal cut the wait for the reply; the connection is fine (see `wire`).
                Err(e) if wire::interrupted(e) => run = Run::Retry,
                _ => break,
            }
            result = f(&mut conn.con, run);
        }
        if cut {
            // Back to the response timeout for the next borrower, whatever the reply was (an
            // error reply too); if that fails, the connection is not trusted with it.
            conn.timed_out |= conn
                .con
                .set_read_timeout(Some(self.response_timeout))
                .is_err();
        }
        let result = self.finish(&mut conn, result, cut);
        self.put(conn);
        result
    }

    /// Shortens the reads on `conn` to end at `deadline`, if that comes before the response
    /// timeout would; returns whether it did.
    fn cut_reads(&self, conn: &mut Conn, deadline: Option<Instant>) -> bool {
        let Some(left) = deadline.map(|d| d.saturating_duration_since(Instant::now())) else {
            return false;
        };
        if left >= self.response_timeout {
            return false;
        }
        // Failing that, the response timeout stands: a bound all the same.
        conn.con.set_read_timeout(Some(left.max(MIN_READ))).is_ok()
    }

    /// Runs `f` once, for work that must not be repeated (the first run may have taken effect
    /// before a connection broke). A broken connection still retires every older one. A call a
    /// server refused because it is no master any more (READONLY, say) did not run, and goes
    /// once more, on a fresh connection.
    pub(crate) fn run_once<T>(
        &self,
        mut f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut conn = self.get(None)?;
        let mut result = f(&mut conn.con);
        if let Err(e) = &result {
            let not_master = self.connector.not_master(e);
            if broke(e) || not_master {
                self.retire_all(conn.epoch, e);
            }
            if not_master {
                self.put(conn);
                conn = self.get(None)?;
                result = f(&mut conn.con);
            }
        }
        let result = self.finish(&mut conn, result, false);
        self.put(conn);
        result
    }

    /// Like [`run_as`](Pool::run_as) for a call that `f` makes and `packed` holds encoded: `packed`
    /// goes out first, together with the calls other threads make meanwhile, and its reply is
    /// read by `reply`. A batch whose connection broke or whose read a signal cut runs `f`
    /// alone, as a retry (the batch may have run the call); a timeout or an error reply is the
    /// answer, as for a call alone.
    pub(crate) fn run_combined<T>(
        &self,
        packed: Vec<u8>,
        reply: impl FnOnce(Value) -> redis::RedisResult<T>,
        f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        match self.combined(packed) {
            Combined::Reply(value) => reply(value).map_err(Error::from_redis),
            // Refused unrun by a server that is no longer the master: as if never sent.
            Combined::Failed(e, epoch) if self.connector.not_master(&e) => {
                self.retire_all(epoch, &e);
                self.run_as(Run::First, None, f)
            }
            Combined::Failed(e, _) if !e.is_io_error() || e.is_timeout() => {
                Err(Error::from_redis(e))
            }
            Combined::Failed(..) => self.run_as(Run::Retry, None, f),
            Combined::NoConnection(e) => Err(e),
            Combined::NotRun => self.run_as(Run::First, None, f),
            Combined::Unsent => Err(Error::Connection(Box::new(Unsent))),
        }
    }

    /// Sends one command together with those other threads send meanwhile, as one pipeline on
    /// one connection, behind a [`PING`]: group commit. Redis reads and answers a batch in one
    /// system call each way, which under load costs it a fraction of separate calls. Alone, a
    /// call goes out at once. A thread sends at most one batch, its own call first, and passes
    /// the sending of the calls queued meanwhile on to the first of them. Nothing is retried
    /// here. Who sends what is the [`Combiner`]'s bookkeeping; this is the connection's part.
    fn combined(&self, packed: Vec<u8>) -> Combined {
        let failures = self.batch_failures.load(Ordering::Relaxed);
        let mut batch = match self.combining.join(packed) {
            // Not sent (its batch was dropped): the caller runs it alone.
            Turn::Answered(reply) => return reply.unwrap_or(Combined::NotRun),
            Turn::Lead(batch) => batch,
        };
        if self.batch_failures.load(Ordering::Relaxed) != failures {
            // The batch ahead of ours got no reply while we waited: Redis stopped answering,
            // and ours would wait for the response timeout once more.
            batch.pass_on();
            let unsent: Vec<Combined> = batch.items().map(|_| Combined::Unsent).collect();
            return batch.answer(unsent).unwrap_or(Combined::Unsent);
        }
        let mut buf = Vec::with_capacity(PING.len() + batch.items().map(Vec::len).sum::<usize>());
        let mut ends = Vec::with_capacity(1 + batch.items().len());
        buf.extend_from_slice(PING);
        ends.push(buf.len());
        for packed in batch.items() {
            buf.extend_from_slice(packed);
            ends.push(buf.len());
        }
        let sent = self.get(None).map(|mut conn| {
            let (replies, failed) =
                wire::exchange_partial(&mut conn.con, &buf, &ends, Interrupted::LeaveUnanswered);
            // Replies of the batch may be left unread: the connection is not to be reused.
            conn.timed_out = failed.is_some();
            let missed = failed
                .as_ref()
                .is_some_and(|e| e.is_io_error() || e.is_timeout());
            self.unreachable.store(missed, Ordering::Relaxed);
            // A broken connection is retried on a fresh one (a restart costs nothing visible);
            // a batch that got no reply in time means Redis stopped answering.
            if failed.as_ref().is_some_and(|e| e.is_timeout()) {
                self.batch_failures.fetch_add(1, Ordering::Relaxed);
            }
            let replaced = self.connector.may_be_replaced();
            if let Some(e) = failed
                .as_ref()
                .filter(|e| broke(e) || (replaced && e.is_timeout()))
            {
                self.retire_all(conn.epoch, e);
            }
            let epoch = conn.epoch;
            self.put(conn);
            (replies, epoch)
        });
        // The next batch goes out while this one's answers are handed round.
        batch.pass_on();
        let replies: Vec<Combined> = match sent {
            Err(e) => batch
                .items()
                .map(|_| Combined::NoConnection(same_failure(&e)))
                .collect(),
            // The PING's reply, whatever it is, only served the order of Redis' writes.
            Ok((replies, epoch)) => replies
                .into_iter()
                .skip(1)
                .map(|reply| match reply {
                    Some(Ok(value)) => Combined::Reply(value),
                    // Refused before running: the caller runs it alone, which loads the script.
                    Some(Err(e)) if wire::no_script(&e) => Combined::NotRun,
                    Some(Err(e)) => Combined::Failed(e, epoch),
                    None => Combined::Failed(wire::interrupted_error(), epoch),
                })
                .collect(),
        };
        batch.answer(replies).unwrap_or(Combined::NotRun)
    }

    /// Marks a connection whose command timed out, so that it is discarded, notes whether Redis
    /// answered, and maps the error. A reply that missed a caller's deadline (`cut`) says
    /// nothing about Redis being unreachable: it may just have been slower than the deadline.
    fn finish<T>(&self, conn: &mut Conn, result: redis::RedisResult<T>, cut: bool) -> Result<T> {
        conn.timed_out |= result.as_ref().is_err_and(|e| e.is_timeout());
        let missed = result
            .as_ref()
            .is_err_and(|e| e.is_io_error() || e.is_timeout());
        if !(cut && missed) {
            self.unreachable.store(missed, Ordering::Relaxed);
        }
        match &result {
            // A whole response timeout without a reply: the master stopped answering (frozen,
            // or cut off) and may be being replaced (Sentinel, Cluster); every pooled
            // connection to it would cost as much again. The deployment is told, so that the
            // master is looked for anew before the next connection. A single server has no
            // other to offer: only the connection that timed out goes (below), and a stall
            // (a fork, a long script) does not cost the others.
            Err(e) if e.is_timeout() && !cut && self.connector.may_be_replaced() => {
                self.retire_all(conn.epoch, e)
            }
            _ => {}
        }
        result.map_err(Error::from_redis)
    }

    /// Every connection made so far predates the break we just saw (`error`, on a connection
    /// made at connector epoch `epoch`); none is worth a failed call.
    fn retire_all(&self, epoch: u64, error: &RedisError) {
        self.connector.failed(self.node, epoch, error);
        let made = self.made.load(Ordering::Relaxed);
        self.stale_below.fetch_max(made, Ordering::Relaxed);
    }
}

/// The same failure to get a connection as `error`, for each call of a batch that could not go
/// out.
fn same_failure(error: &Error) -> Error {
    match error {
        Error::PoolExhausted { size, waited } => Error::PoolExhausted {
            size: *size,
            waited: *waited,
        },
        Error::Rejected(e) => Error::Rejected(e.to_string().into()),
        other => Error::Connection(other.to_string().into()),
    }
}

/// Connects to `node` within `connection_timeout`, starting again when a signal interrupts the
/// connect (nothing is set up yet then).
fn connect(
    connector: &Connector,
    node: Node,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> redis::RedisResult<redis::Connection> {
    let started = Instant::now();
    let mut made = connector.connect(node, connection_timeout, response_timeout);
    for _ in 0..wire::MAX_INTERRUPTS {
        let left = connection_timeout.saturating_sub(started.elapsed());
        match &made {
            Err(e) if wire::interrupted(e) && !left.is_zero() => {
                made = connector.connect(node, left, response_timeout);
            }
            _ => break,
        }
    }
    made
}

/// Sent first in each batch of unlocks ([`Pool::combined`]). With its default single-threaded
/// I/O, Redis writes to the clients it has queued for writing, the most recently queued first,
/// and queues a client at its first reply of an event-loop turn. Without the PING, a release
/// script that hands the lock to another client's waiter queues the waiter's subscription (its
/// `PUBLISH`) before this connection (the script's reply), so Redis wakes the releasing process
/// first and the waiter's after it. With
/// the PING's reply queued first, the message goes out first, as PostgreSQL wakes a waiting
/// backend before it answers the unlock. It costs a few microseconds per unlock and saves a
/// waiter in another process more (docs/benchmarks.md, runs O and Q).
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// The shortest wait for a reply that [`Pool::run_as`] allows near a deadline: below this, a
/// busy machine would fail calls Redis answered in good time.
pub(crate) const MIN_READ: Duration = Duration::from_millis(10);

/// The connection broke under the command (a restart, say), as opposed to a reply that is late.
fn broke(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}
