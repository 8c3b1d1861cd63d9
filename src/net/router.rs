//! Which pool a call goes to, and following a Redis Cluster's redirects.
//!
//! One server and Sentinel have one pool. A cluster has a pool per master, and a call goes to
//! the master of its key's hash slot (every key of one lock, or of one fenced resource, shares a
//! slot). A cluster node that does not serve the slot refuses the call unrun, and says where
//! to go:
//!
//! | reply | what it means | what happens |
//! |---|---|---|
//! | `MOVED slot addr` | the slot is served by `addr` now | the map is told, the call goes again to `addr` |
//! | `ASK slot addr` | a migration under way: the keys are being moved to `addr` | this call alone goes to `addr`, behind an `ASKING` |
//! | `TRYAGAIN` | a slot mid-migration, and the call's keys not all on one of its two nodes | after a pause (10 ms, doubling, at most 100 ms) |
//! | `CLUSTERDOWN` | the cluster is electing a master, or lost one | after a pause, with the map asked for again |
//! | `READONLY` | the node is a replica (a stale map) | as `CLUSTERDOWN` |
//! | a broken connection, or none | the master died | after a pause, with the map asked for again: a replica may have taken over |
//!
//! A redirect means the call did not run, so following it is safe for any call. Sending a call
//! again after its connection broke is safe for the lock scripts (acquire is idempotent for its
//! owner id, extend and release compare the owner before they change anything), and such a call
//! goes again marked [`Run::Retry`], as within one pool; a call that must not run twice (a fenced
//! write, a forced release) is not sent again then. Pauses stop at the caller's deadline, or
//! without one after the connection timeout; `MOVED` and `ASK` are followed at most
//! [`MAX_REDIRECTS`] times.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::Value;

use crate::error::{Error, Result};
use crate::net::connector::{Connector, Node, Redirect};
use crate::net::pool::{Pool, Run};

/// How long a lock call without a deadline (`lock`) goes on looking for a master that stopped
/// answering, counted from its first failure: long enough for a failover under the
/// deployments' default settings (Sentinel's `down-after-milliseconds` of 30 s, Redis Cluster's
/// `cluster-node-timeout` of 15 s), and an end for a master that no replica replaces.
pub(crate) const FAILOVER_PATIENCE: Duration = Duration::from_secs(60);
/// The pauses between two attempts of a call riding out a failover: from the first, doubling,
/// to the last.
const FIRST_RIDE_PAUSE: Duration = Duration::from_millis(50);
const MAX_RIDE_PAUSE: Duration = Duration::from_secs(1);

/// The most `MOVED` and `ASK` redirects one call follows.
const MAX_REDIRECTS: u32 = 32;
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// The pools of one client (or fenced store): one per node, made when first needed.
pub(crate) struct Router {
    connector: Arc<Connector>,
    size: u32,
    connection_timeout: Duration,
    response_timeout: Duration,
    by_node: RwLock<HashMap<Node, Arc<Pool>>>,
}

impl Router {
    pub(crate) fn new(
        connector: Arc<Connector>,
        size: u32,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Router {
        Router {
            connector,
            size,
            connection_timeout,
            response_timeout,
            by_node: RwLock::default(),
        }
    }

    /// The pool of `node`.
    fn pool(&self, node: Node) -> Arc<Pool> {
        if let Some(pool) = self
            .by_node
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&node)
        {
            return Arc::clone(pool);
        }
        let mut pools = self.by_node.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(pools.entry(node).or_insert_with(|| {
            Arc::new(Pool::new(
                Arc::clone(&self.connector),
                node,
                self.size,
                self.connection_timeout,
                self.response_timeout,
            ))
        }))
    }

    /// After a lock attempt failed with `error`: the pause before it goes again, or `None` if it
    /// does not. It goes again if the master did not answer (a timeout, a broken or failed
    /// connection), or would not write for now ([`Error::NotWritable`]: a new master without a
    /// replica in sync yet, an old one demoted), while the deployment can name another one (Sentinel's sentinels or a
    /// Cluster's nodes still answer, see [`Connector::fails_over`]), until `deadline`, or
    /// without one for [`FAILOVER_PATIENCE`] from the first failure. The pool has told the
    /// deployment of the failure, so the next attempt looks for the master anew: a failover
    /// costs the caller the failover, not an error at its first response timeout.
    pub(crate) fn ride(
        &self,
        ride: &mut Ride,
        error: &Error,
        deadline: Option<Instant>,
    ) -> Option<Duration> {
        let passing = error.is_connection() || error.is_not_writable();
        if !passing || !self.connector.fails_over() {
            return None;
        }
        let now = Instant::now();
        let first = *ride.first.get_or_insert(now);
        let until = deadline.unwrap_or(first + FAILOVER_PATIENCE);
        let pause = ride.pause.max(FIRST_RIDE_PAUSE);
        // Time for the pause and a reply after it, or the error stands.
        if until.saturating_duration_since(now) <= pause + crate::net::pool::MIN_READ {
            return None;
        }
        ride.pause = (pause * 2).min(MAX_RIDE_PAUSE);
        log::debug!("fencelock: the master did not answer ({error}); looking for it again");
        Some(pause)
    }

    /// Where this router's connections come from.
    pub(crate) fn connector(&self) -> &Arc<Connector> {
        &self.connector
    }

    /// Whether the pool that serves `key` last failed to reach its server (see
    /// [`Pool::unreachable`]).
    pub(crate) fn unreachable(&self, key: &str) -> bool {
        self.pool(self.connector.node_of_key(key)).unreachable()
    }

    /// [`Pool::run_as`] on the pool that serves `key`, as a first run with no deadline.
    pub(crate) fn run<T>(
        &self,
        key: &str,
        f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.run_until(key, None, f)
    }

    /// [`Pool::run_as`] on the pool that serves `key`, as a first run until `deadline`.
    pub(crate) fn run_until<T>(
        &self,
        key: &str,
        deadline: Option<Instant>,
        f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.run_until_noting(key, deadline, &Cell::new(None), f)
    }

    /// [`run_until`](Router::run_until), noting in `served` the node of the last run.
    pub(crate) fn run_until_noting<T>(
        &self,
        key: &str,
        deadline: Option<Instant>,
        served: &Cell<Option<Node>>,
        mut f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let ran = Cell::new(false);
        self.routed(key, deadline, Repeat::IfSafe, &ran, |pool, asking, run| {
            served.set(Some(pool.node()));
            pool.run_as(run, deadline, |con, run| {
                ran.set(ran.get() || run == Run::Retry);
                ask(con, asking)?;
                f(con, run)
            })
        })
    }

    /// Whether a reply from `node` to a call on `key` that took `took` can be trusted: after a
    /// slow reply from a cluster master, whether the map, asked of the other nodes first, still
    /// names it (see [`Connector::suspect_reply`]).
    pub(crate) fn trusted(
        &self,
        key: &str,
        node: Node,
        took: Duration,
        deadline: Option<Instant>,
    ) -> bool {
        !self.connector.suspect_reply(took)
            || self
                .connector
                .still_serves(key, node, self.connection_timeout, deadline)
    }

    /// [`Pool::run_once`] on the pool that serves `key`. A redirect means the call did not
    /// run, so it goes again where the redirect says; nothing else sends it again (a call whose
    /// connection broke may have run).
    pub(crate) fn run_once<T>(
        &self,
        key: &str,
        mut f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let ran = Cell::new(false);
        self.routed(key, None, Repeat::Never, &ran, |pool, asking, _| {
            pool.run_once(|con| {
                ask(con, asking)?;
                f(con)
            })
        })
    }

    /// [`Pool::run_combined`] on the pool that serves `key`; after a redirect the call goes
    /// alone, by `f`.
    pub(crate) fn run_combined<T>(
        &self,
        key: &str,
        packed: Vec<u8>,
        reply: impl FnOnce(Value) -> redis::RedisResult<T>,
        mut f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut first = Some((packed, reply));
        let ran = Cell::new(false);
        self.routed(key, None, Repeat::IfSafe, &ran, |pool, asking, run| {
            let mut f = |con: &mut redis::Connection, run: Run| {
                ran.set(ran.get() || run == Run::Retry);
                ask(con, asking)?;
                f(con, run)
            };
            match first.take() {
                Some((packed, reply)) if !asking && run == Run::First => {
                    pool.run_combined(packed, reply, &mut f)
                }
                _ => pool.run_as(run, None, f),
            }
        })
    }

    /// Runs `attempt` on the pool that serves `key` (with whether to send `ASKING` first, and
    /// which run it is), and again wherever a redirect sends it: see the module docs. `ran` is
    /// set by the attempts when a run may have taken effect, so that the next node gets the call
    /// as a retry.
    fn routed<T>(
        &self,
        key: &str,
        deadline: Option<Instant>,
        repeat: Repeat,
        ran: &Cell<bool>,
        mut attempt: impl FnMut(&Pool, bool, Run) -> Result<T>,
    ) -> Result<T> {
        if !self.connector.routes() {
            return attempt(&self.pool(Node::SINGLE), false, Run::First);
        }
        let give_up = deadline.unwrap_or_else(|| Instant::now() + self.connection_timeout);
        let mut asking = None;
        let mut pause = FIRST_PAUSE;
        let mut redirects = 0;
        loop {
            let (node, ask) = match asking.take() {
                Some(node) => (node, true),
                None => (
                    self.connector
                        .route(key, self.connection_timeout, deadline)?,
                    false,
                ),
            };
            let run = if ran.get() { Run::Retry } else { Run::First };
            let result = attempt(&self.pool(node), ask, run);
            let Err(error) = &result else {
                return result;
            };
            let redirect = redis_error(error).and_then(|e| self.connector.redirect(e, node));
            let left = give_up.saturating_duration_since(Instant::now());
            match redirect {
                // Sent on at once, a bounded number of times (a migration's ASK, NOSCRIPT and
                // MOVED take a few).
                Some(Redirect::Moved(_)) | Some(Redirect::Ask(_)) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    if let Some(Redirect::Ask(node)) = redirect {
                        asking = Some(node);
                    }
                }
                // TRYAGAIN (a slot mid-migration: the importing node refuses a script unless
                // every key it names is there) and CLUSTERDOWN last as long as they last: again
                // after a pause, until the caller's time is up.
                Some(Redirect::Later) if !left.is_zero() => {
                    std::thread::sleep(pause.min(left));
                    pause = (pause * 2).min(MAX_PAUSE);
                    // Mid-migration, the source sends on (ASK) and the target says TRYAGAIN
                    // until every key of the call is there: bounded by time, not by count.
                    redirects = 0;
                }
                // The master may have died: after a pause, the map is asked for again, and names
                // its replica once that has taken over. The call may have reached the dead
                // master before its connection broke: only a call that is safe to repeat goes.
                None if repeat == Repeat::IfSafe
                    && matches!(error, Error::Connection(_))
                    && self.connector.failed_since_map(node)
                    && !left.is_zero() =>
                {
                    ran.set(true);
                    std::thread::sleep(pause.min(left));
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                _ => return result.map_err(down),
            }
        }
    }
}

/// A lock call's failures so far, for [`Router::ride`].
#[derive(Debug, Default)]
pub(crate) struct Ride {
    first: Option<Instant>,
    pause: Duration,
}

/// Whether a call may be sent again after its connection broke under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repeat {
    /// Yes: running it twice does what running it once does (the lock scripts).
    IfSafe,
    /// No: only after a redirect, which means it did not run (a fenced write, a forced release).
    Never,
}

/// Sends `ASKING` first, when the call follows an `ASK` redirect: the node importing the slot
/// then serves the one command that follows.
fn ask(con: &mut redis::Connection, asking: bool) -> redis::RedisResult<()> {
    if asking {
        redis::cmd("ASKING").query::<()>(con)?;
    }
    Ok(())
}

/// The Redis error inside `error`, if it is one.
fn redis_error(error: &Error) -> Option<&redis::RedisError> {
    match error {
        Error::Redis(e)
        | Error::Connection(e)
        | Error::Timeout(e)
        | Error::Rejected(e)
        | Error::NotWritable(e) => e.downcast_ref::<redis::RedisError>(),
        _ => None,
    }
}

/// A `CLUSTERDOWN` or `TRYAGAIN` that outlasted the caller's time is the slot being unavailable:
/// a connection error, as a server that does not answer is.
fn down(error: Error) -> Error {
    use redis::{ErrorKind, ServerErrorKind};
    let kind = match &error {
        Error::Redis(e) => e.downcast_ref::<redis::RedisError>().map(|e| e.kind()),
        _ => None,
    };
    match kind {
        Some(ErrorKind::Server(ServerErrorKind::ClusterDown)) => {
            Error::Connection(format!("the cluster is down: {error}").into())
        }
        Some(ErrorKind::Server(ServerErrorKind::TryAgain)) => Error::Connection(
            format!(
                "the key's slot is being migrated, and the call could not run on either node \
                 in time: {error}"
            )
            .into(),
        ),
        _ => error,
    }
}
