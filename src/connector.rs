//! Where connections come from: the one place that knows the shape of the deployment.
//!
//! The pool, the renewal thread and the wake thread hold no `redis::Client` of their own. They
//! ask the connector for a connection to the [`Node`] that serves a key (or, for pub/sub, to one
//! that carries the client's release channel), and tell it when a connection broke under a
//! command, so that a shape with more than one node can find its nodes anew. Work that goes out
//! in batches (renewal pipelines, combined unlocks) is grouped by node.
//!
//! Today the deployment has one shape, a single server, and one node. Other shapes become
//! variants of [`Shape`]: each answers the same three questions (which node serves this key,
//! how to reach that node, what a failure tells about the nodes).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::LockKeys;

/// Names one Redis server of the deployment among those a client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Node(u32);

impl Node {
    /// The only node of a single server.
    pub(crate) const SINGLE: Node = Node(0);
}

/// Hands out connections to the nodes of one deployment.
pub(crate) struct Connector {
    shape: Shape,
}

enum Shape {
    /// One server, at a URL.
    Single(redis::Client),
}

impl Connector {
    /// A connector for the server at `url` (`redis://`, `redis+unix://` or `unix://`). Parses
    /// only: nothing is connected until a connection is asked for.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the URL does not parse.
    pub(crate) fn open(url: &str) -> Result<Connector> {
        Ok(Connector {
            shape: Shape::Single(client(url)?),
        })
    }

    /// The node that serves `keys` (all of one lock's keys share a node: they share a hash
    /// slot).
    pub(crate) fn node_of(&self, _keys: &LockKeys) -> Node {
        match self.shape {
            Shape::Single(_) => Node::SINGLE,
        }
    }

    /// A new connection to `node`, made within `connect_timeout`, whose reads and writes time
    /// out after `response_timeout`.
    pub(crate) fn connect(
        &self,
        node: Node,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        match (&self.shape, node) {
            (Shape::Single(client), _) => {
                let con = client.get_connection_with_timeout(connect_timeout)?;
                con.set_read_timeout(Some(response_timeout))?;
                con.set_write_timeout(Some(response_timeout))?;
                Ok(con)
            }
        }
    }

    /// A new connection for the client's release channel, as [`connect`](Connector::connect).
    pub(crate) fn subscriber(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        match self.shape {
            Shape::Single(_) => self.connect(Node::SINGLE, connect_timeout, response_timeout),
        }
    }

    /// A connection to `node` broke under a command, or a command failed with `error`. A single
    /// server has nowhere else to look: the caller's own retry and reconnect are all there is.
    pub(crate) fn failed(&self, node: Node, error: &redis::RedisError) {
        match self.shape {
            Shape::Single(_) => {
                let _ = (node, error);
            }
        }
    }
}

/// A client for `url`, with Nagle's algorithm off on its connections. redis-rs leaves it on,
/// and then a pipeline that spans several TCP segments (a renewal batch) can wait for a delayed
/// ACK: batches of a few hundred extends took 100-400 ms on loopback, long enough to lose leases.
fn client(url: &str) -> Result<redis::Client> {
    let invalid = |e: redis::RedisError| Error::invalid("url", format!("{e}"));
    let info = redis::Client::open(url)
        .map_err(invalid)?
        .get_connection_info()
        .clone();
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    redis::Client::open(info.set_tcp_settings(tcp)).map_err(invalid)
}
