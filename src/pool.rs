//! The r2d2 pool behind acquire and release.
//!
//! redis' own r2d2 manager connects without a timeout and PINGs on every checkout. This one
//! connects with the connection timeout, sets response timeouts, and checks out without a round
//! trip: connections are numbered as they are made, and once any call sees the connection to
//! Redis break (a restart, say), every connection made before that point is discarded at its
//! next checkout, so one outage costs one failed command, not one per pooled connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisError, Value};

use crate::connector::{Connector, Node};
use crate::wire::{self, Interrupted};

use crate::error::{Error, Result};

mod combine;

use combine::{Combiner, Turn};

/// Which run of a call a [`Pool::run`] closure makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Run {
    /// The first: nothing of it can have reached Redis yet.
    First,
    /// Another: an earlier run may have taken effect before its connection broke or its reply
    /// was cut short.
    Retry,
}

pub(crate) struct Conn {
    pub(crate) con: redis::Connection,
    generation: u64,
    /// A command on it timed out: the connection may be half-open, or out of step with replies
    /// that will never come. Discarded when it goes back to the pool.
    timed_out: bool,
}

#[derive(Default)]
struct Generations {
    made: AtomicU64,
    stale_below: AtomicU64,
}

pub(crate) struct Manager {
    connector: Arc<Connector>,
    node: Node,
    connection_timeout: Duration,
    response_timeout: Duration,
    generations: Arc<Generations>,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = redis::RedisError;

    fn connect(&self) -> redis::RedisResult<Conn> {
        let con =
            self.connector
                .connect(self.node, self.connection_timeout, self.response_timeout)?;
        let generation = self.generations.made.fetch_add(1, Ordering::Relaxed);
        Ok(Conn {
            con,
            generation,
            timed_out: false,
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        if conn.generation < self.generations.stale_below.load(Ordering::Relaxed) {
            return Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::NotConnected,
            )));
        }
        Ok(())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.timed_out
            || !conn.con.is_open()
            || conn.generation < self.generations.stale_below.load(Ordering::Relaxed)
    }
}

/// Logs the pool's background connection failures at debug: callers get them as errors already.
#[derive(Debug)]
struct DebugLog;

impl r2d2::HandleError<redis::RedisError> for DebugLog {
    fn handle_error(&self, error: redis::RedisError) {
        log::debug!("fencelock: could not open a pooled redis connection: {error}");
    }
}

/// The connections to one node: a lock call borrows one, and unlocks of concurrent threads go
/// out together on one.
pub(crate) struct Pool {
    pool: r2d2::Pool<Manager>,
    connector: Arc<Connector>,
    node: Node,
    generations: Arc<Generations>,
    /// Calls waiting to go out together (see [`Pool::combined`]).
    combining: Combiner<Vec<u8>, Combined>,
}

/// How a combined call ended.
enum Combined {
    Reply(Value),
    /// The call may have run (a timeout, a broken connection, a signal); the error says which.
    Failed(RedisError),
    /// No connection could be had: the call did not run.
    NoConnection(Error),
    /// Refused unrun (NOSCRIPT): to be run alone, which loads the script.
    NotRun,
}

impl Pool {
    pub(crate) fn new(
        connector: Arc<Connector>,
        node: Node,
        size: u32,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Pool {
        let generations = Arc::new(Generations::default());
        let manager = Manager {
            connector: Arc::clone(&connector),
            node,
            connection_timeout,
            response_timeout,
            generations: Arc::clone(&generations),
        };
        let pool = r2d2::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .test_on_check_out(true)
            .connection_timeout(connection_timeout)
            .error_handler(Box::new(DebugLog))
            .build_unchecked(manager);
        Pool {
            pool,
            connector,
            node,
            generations,
            combining: Combiner::default(),
        }
    }

    fn get(&self) -> Result<r2d2::PooledConnection<Manager>> {
        let started = Instant::now();
        self.pool.get().map_err(|e| {
            let state = self.pool.state();
            let size = self.pool.max_size();
            if state.connections >= size && state.idle_connections == 0 {
                Error::PoolExhausted {
                    size,
                    waited: started.elapsed(),
                }
            } else {
                Error::Connection(Box::new(e))
            }
        })
    }

    /// Runs `f` on a pooled connection. If the connection turns out to be broken (Redis restarted
    /// since it was made), every older connection is retired and `f` runs once more on a fresh
    /// one, told so by its [`Run`] argument; a second failure is returned. A reply a signal
    /// interrupted costs a run again, on the same connection. `f` must be safe to repeat: the
    /// first run may have taken effect before the connection broke or the read was cut.
    pub(crate) fn run<T>(
        &self,
        f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.run_from(f, Run::First)
    }

    /// [`run`](Pool::run), whose first run is `first` (a retry, if an earlier run may have run).
    fn run_from<T>(
        &self,
        mut f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
        first: Run,
    ) -> Result<T> {
        let mut conn = self.get()?;
        let mut result = f(&mut conn.con, first);
        let mut reconnected = false;
        for _ in 0..wire::MAX_INTERRUPTS {
            match &result {
                Err(e) if broke(e) && !reconnected => {
                    self.retire_all(e);
                    drop(conn);
                    conn = self.get()?;
                    reconnected = true;
                }
                // A signal cut the wait for the reply; the connection is fine (see `wire`).
                Err(e) if wire::interrupted(e) => {}
                _ => break,
            }
            result = f(&mut conn.con, Run::Retry);
        }
        finish(&mut conn, result)
    }

    /// Runs `f` once, for work that must not be repeated (the first run may have taken effect
    /// before a connection broke). A broken connection still retires every older one.
    pub(crate) fn run_once<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut conn = self.get()?;
        let result = f(&mut conn.con);
        if let Err(e) = &result {
            if broke(e) {
                self.retire_all(e);
            }
        }
        finish(&mut conn, result)
    }

    /// Like [`run`](Pool::run) for a call that `f` makes and `packed` holds encoded: `packed`
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
            Combined::Failed(e) if !e.is_io_error() || e.is_timeout() => Err(Error::from_redis(e)),
            Combined::Failed(_) => self.run_from(f, Run::Retry),
            Combined::NoConnection(e) => Err(e),
            Combined::NotRun => self.run_from(f, Run::First),
        }
    }

    /// Sends one command together with those other threads send meanwhile, as one pipeline on
    /// one connection: group commit. Redis reads and answers a batch in one system call each
    /// way, which under load costs it a fraction of separate calls. Alone, a call goes out at
    /// once. A thread sends at most one batch, its own call first, and passes the sending of
    /// the calls queued meanwhile on to the first of them. Nothing is retried here. Who sends
    /// what is the [`Combiner`]'s bookkeeping; this is the connection's part.
    fn combined(&self, packed: Vec<u8>) -> Combined {
        let mut batch = match self.combining.join(packed) {
            // Not sent (its batch was dropped): the caller runs it alone.
            Turn::Answered(reply) => return reply.unwrap_or(Combined::NotRun),
            Turn::Lead(batch) => batch,
        };
        let mut buf = Vec::with_capacity(batch.items().map(Vec::len).sum());
        let mut ends = Vec::with_capacity(batch.items().len());
        for packed in batch.items() {
            buf.extend_from_slice(packed);
            ends.push(buf.len());
        }
        let sent = self.get().map(|mut conn| {
            let (replies, failed) =
                wire::exchange_partial(&mut conn.con, &buf, &ends, Interrupted::LeaveUnanswered);
            // Replies of the batch may be left unread: the connection is not to be reused.
            conn.timed_out = failed.is_some();
            if let Some(e) = failed.as_ref().filter(|e| broke(e)) {
                self.retire_all(e);
            }
            replies
        });
        // The next batch goes out while this one's answers are handed round.
        batch.pass_on();
        let replies: Vec<Combined> = match sent {
            Err(e) => (0..ends.len())
                .map(|_| Combined::NoConnection(e.same()))
                .collect(),
            Ok(replies) => replies
                .into_iter()
                .map(|reply| match reply {
                    Some(Ok(value)) => Combined::Reply(value),
                    // Refused before running: the caller runs it alone, which loads the script.
                    Some(Err(e)) if crate::scripts::no_script(&e) => Combined::NotRun,
                    Some(Err(e)) => Combined::Failed(e),
                    None => Combined::Failed(wire::interrupted_error()),
                })
                .collect(),
        };
        batch.answer(replies).unwrap_or(Combined::NotRun)
    }

    /// Every connection made so far predates the break we just saw (`error`); none is worth a
    /// failed call.
    fn retire_all(&self, error: &RedisError) {
        self.connector.failed(self.node, error);
        let made = self.generations.made.load(Ordering::Relaxed);
        self.generations
            .stale_below
            .fetch_max(made, Ordering::Relaxed);
    }
}

impl Error {
    /// The same failure to get a connection, for each call of a batch that could not go out.
    fn same(&self) -> Error {
        match self {
            Error::PoolExhausted { size, waited } => Error::PoolExhausted {
                size: *size,
                waited: *waited,
            },
            other => Error::Connection(other.to_string().into()),
        }
    }
}

/// The connection broke under the command (a restart, say), as opposed to a reply that is late.
fn broke(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}

/// Marks a connection whose command timed out, so the pool discards it, and maps the error.
fn finish<T>(conn: &mut Conn, result: redis::RedisResult<T>) -> Result<T> {
    conn.timed_out = result.as_ref().is_err_and(|e| e.is_timeout());
    result.map_err(Error::from_redis)
}
