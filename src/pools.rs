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
//! | `TRYAGAIN` | a migration split the call's keys between two nodes | after a pause (10 ms, doubling, at most 100 ms) |
//! | `CLUSTERDOWN` | the cluster is electing a master, or lost one | after a pause, with the map asked for again |
//! | a broken connection, or none | the master died | after a pause, with the map asked for again: a replica may have taken over |
//!
//! Sending a call again is safe for every script: acquire is idempotent for its owner id,
//! extend and release compare the owner before they change anything, and a refused call did
//! not run. A call that may have run before its connection broke goes again marked
//! [`Run::Retry`], as within one pool. Redirects stop at the caller's deadline, or without one
//! after the connection timeout, and after [`MAX_REDIRECTS`].

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::Value;

use crate::connector::{Connector, Node, Redirect};
use crate::error::{Error, Result};
use crate::pool::{Pool, Run};

/// The most times one call is sent in all, redirects and pauses included.
const MAX_REDIRECTS: u32 = 32;
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// The pools of one client (or fenced store): one per node, made when first needed.
pub(crate) struct Pools {
    connector: Arc<Connector>,
    size: u32,
    connection_timeout: Duration,
    response_timeout: Duration,
    by_node: RwLock<HashMap<Node, Arc<Pool>>>,
}

impl Pools {
    pub(crate) fn new(
        connector: Arc<Connector>,
        size: u32,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Pools {
        Pools {
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
        mut f: impl FnMut(&mut redis::Connection, Run) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.routed(key, deadline, |pool, asking, run| {
            pool.run_as(run, deadline, |con, run| {
                ask(con, asking)?;
                f(con, run)
            })
        })
    }

    /// [`Pool::run_once`] on the pool that serves `key`. A redirect means the call did not
    /// run, so it goes again where the redirect says.
    pub(crate) fn run_once<T>(
        &self,
        key: &str,
        mut f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.routed(key, None, |pool, asking, _| {
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
        self.routed(key, None, |pool, asking, run| match first.take() {
            Some((packed, reply)) if !asking && run == Run::First => {
                pool.run_combined(packed, reply, &mut f)
            }
            _ => pool.run_as(run, None, |con, run| {
                ask(con, asking)?;
                f(con, run)
            }),
        })
    }

    /// Runs `attempt` on the pool that serves `key` (with whether to send `ASKING` first, and
    /// which run it is), and again wherever a redirect sends it: see the module docs.
    fn routed<T>(
        &self,
        key: &str,
        deadline: Option<Instant>,
        mut attempt: impl FnMut(&Pool, bool, Run) -> Result<T>,
    ) -> Result<T> {
        if !self.connector.routes() {
            return attempt(&self.pool(Node::SINGLE), false, Run::First);
        }
        let give_up = deadline.unwrap_or_else(|| Instant::now() + self.connection_timeout);
        let mut asking = None;
        let mut pause = FIRST_PAUSE;
        let mut run = Run::First;
        let mut sent = 0;
        loop {
            let (node, ask) = match asking.take() {
                Some(node) => (node, true),
                None => (
                    self.connector
                        .route(key, self.connection_timeout, deadline)?,
                    false,
                ),
            };
            let result = attempt(&self.pool(node), ask, run);
            sent += 1;
            let Err(error) = &result else {
                return result;
            };
            let redirect = redis_error(error).and_then(|e| self.connector.redirect(e));
            let left = give_up.saturating_duration_since(Instant::now());
            if sent >= MAX_REDIRECTS
                || (left.is_zero()
                    && !matches!(redirect, Some(Redirect::Moved(_)) | Some(Redirect::Ask(_))))
            {
                return result.map_err(down);
            }
            match redirect {
                Some(Redirect::Moved(_)) => {}
                Some(Redirect::Ask(node)) => asking = Some(node),
                Some(Redirect::Later) => {
                    std::thread::sleep(pause.min(left));
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                None if error.is_connection() && self.connector.failed_since_map(node) => {
                    // The master may have died: after a pause, the map is asked for again, and
                    // names its replica once that has taken over. The call may have reached
                    // the dead master before its connection broke.
                    run = Run::Retry;
                    std::thread::sleep(pause.min(left));
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                None => return result,
            }
        }
    }
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
        Error::Redis(e) | Error::Connection(e) | Error::Timeout(e) | Error::Rejected(e) => {
            e.downcast_ref::<redis::RedisError>()
        }
        _ => None,
    }
}

/// A `CLUSTERDOWN` that outlasted the redirects is the cluster being unavailable: a connection
/// error, as a server that does not answer is.
fn down(error: Error) -> Error {
    match &error {
        Error::Redis(e)
            if e.downcast_ref::<redis::RedisError>().is_some_and(|e| {
                e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown)
            }) =>
        {
            Error::Connection(format!("the cluster is down: {e}").into())
        }
        _ => error,
    }
}
