//! Where connections come from: the one place that knows the shape of the deployment.
//!
//! The pool, the renewal thread and the wake thread hold no `redis::Client` of their own. They
//! ask the connector for a connection to the [`Node`] that serves a key (or, for pub/sub, to one
//! that carries the client's release channel), and tell it when a connection broke under a
//! command, so that a shape with more than one server can find its nodes anew. Work that goes
//! out in batches (renewal pipelines, combined unlocks) is grouped by node.
//!
//! Each shape answers the same questions: which node serves this key, how to reach that node,
//! what a failure tells about the nodes, and since when connections are current (its
//! [`epoch`](Connector::epoch): a connection made before the current epoch goes to a server
//! that no longer serves its node, and is dropped when next used).
//!
//! | shape | nodes | a failure |
//! |---|---|---|
//! | one server | one, at its URL | nothing to learn: the caller retries and reconnects |
//! | Sentinel (`sentinel.rs`) | one, the master the sentinels name | ask the sentinels again |
//! | Cluster (`cluster.rs`) | a node per server, a key's node the master of its slot | a redirect moves the slot; a failure asks for the map again |
//! | quorum | a node per master, every key on all of them (`quorum.rs` asks [`master`](Connector::master) for each) | nothing to learn: a master that fails counts as a refusal |

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::net::target::Target;
use crate::net::tls::{HandshakeFailed, TlsSettings};
use crate::net::url;

mod cluster;
mod sentinel;

pub(crate) use cluster::slot;
use sentinel::is_refusal;

/// Names one Redis server of the deployment among those a client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Node(pub(crate) u32);

impl Node {
    /// The only node of a single server, or of a Sentinel deployment (its master).
    pub(crate) const SINGLE: Node = Node(0);
}

/// Hands out connections to the nodes of one deployment.
pub(crate) struct Connector {
    shape: Shape,
}

enum Shape {
    /// One server, at a URL. Boxed: a client is large, and a connector is made once.
    Single(Box<redis::Client>),
    /// The master that a group of sentinels names.
    Sentinel(sentinel::Sentinel),
    /// The masters of a Redis Cluster, each serving the keys of its slots. Boxed, as `Single`.
    Cluster(Box<cluster::Cluster>),
    /// Independent masters that each hold every lock: `quorum.rs` connects to each by
    /// [`master`](Connector::master). There is no one node to route a call to.
    Quorum(Vec<redis::Client>),
}

/// What a reply from a cluster node says about where a command should go. Every one of them
/// means the command did not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// `MOVED`: the slot is served by `node` now; the map was told.
    Moved(Node),
    /// `ASK`: this command, and only this one, goes to `node` behind an `ASKING`.
    Ask(Node),
    /// `TRYAGAIN` (the keys of one slot are split by a migration under way) or `CLUSTERDOWN`:
    /// wait a little and send it again.
    Later,
}

impl Connector {
    /// A connector for `target` (one that passed its checks), with `tls` for `rediss://`
    /// servers; `connection_timeout` bounds the connections a Sentinel watcher makes in the
    /// background. Parses only: nothing is connected until a connection is asked for.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a URL does not parse, or the TLS settings do not (or were
    /// given for a URL that is not `rediss://`).
    pub(crate) fn open(
        target: Target,
        tls: &TlsSettings,
        connection_timeout: Duration,
    ) -> Result<Connector> {
        let shape = match target {
            Target::Single(url) => Shape::Single(Box::new(url::client(&url, tls)?)),
            Target::Sentinel(spec) => {
                Shape::Sentinel(sentinel::Sentinel::open(&spec, tls, connection_timeout)?)
            }
            Target::Cluster(spec) => Shape::Cluster(Box::new(cluster::Cluster::open(
                &spec,
                tls,
                connection_timeout,
            )?)),
            Target::Quorum(spec) => Shape::Quorum(
                spec.nodes
                    .iter()
                    .map(|u| url::client(u, tls))
                    .collect::<Result<_>>()?,
            ),
        };
        Ok(Connector { shape })
    }

    /// The node that serves `keys` (all of one lock's keys share a node: they share a hash
    /// slot).
    pub(crate) fn node_of(&self, keys: &LockKeys) -> Node {
        self.node_of_key(keys.lock())
    }

    /// The node that serves `key`, as far as is known now: nothing is asked.
    pub(crate) fn node_of_key(&self, key: &str) -> Node {
        match &self.shape {
            Shape::Single(_) | Shape::Sentinel(_) | Shape::Quorum(_) => Node::SINGLE,
            Shape::Cluster(cluster) => cluster.node_of_slot(slot(key.as_bytes())),
        }
    }

    /// The node that serves `key`, asking the deployment first where it has to (a cluster's
    /// map not known yet, or suspect), within `connection_timeout` and `deadline`.
    pub(crate) fn route(
        &self,
        key: &str,
        connection_timeout: Duration,
        deadline: Option<Instant>,
    ) -> Result<Node> {
        match &self.shape {
            Shape::Single(_) | Shape::Sentinel(_) | Shape::Quorum(_) => Ok(Node::SINGLE),
            Shape::Cluster(cluster) => {
                cluster.route(slot(key.as_bytes()), connection_timeout, deadline)
            }
        }
    }

    /// Asks for a cluster's map if it is suspect (a node failed, a slot moved), within
    /// `connection_timeout`: for the renewal thread, which routes by [`node_of`] alone.
    /// Nothing to do for other shapes.
    ///
    /// [`node_of`]: Connector::node_of
    pub(crate) fn refresh(&self, connection_timeout: Duration) {
        if let Shape::Cluster(cluster) = &self.shape {
            cluster.refresh_if_suspect(connection_timeout);
        }
    }

    /// Something says a cluster's map is out of date (a slot left the node we subscribed on):
    /// ask for it again before the next call. Nothing for other shapes.
    pub(crate) fn map_suspect(&self) {
        if let Shape::Cluster(cluster) = &self.shape {
            cluster.suspect();
        }
    }

    /// Whether a reply that took `took` may come from a cluster master that was frozen while its
    /// replica took over (see [`cluster::SLOW_REPLY`]). Never for other shapes.
    pub(crate) fn suspect_reply(&self, took: Duration) -> bool {
        matches!(self.shape, Shape::Cluster(_)) && took >= cluster::SLOW_REPLY
    }

    /// Whether `node` still serves `key`, the deployment asked again (a cluster's other nodes
    /// first), within `connection_timeout` and `deadline`. Always for one node.
    pub(crate) fn still_serves(
        &self,
        key: &str,
        node: Node,
        connection_timeout: Duration,
        deadline: Option<Instant>,
    ) -> bool {
        match &self.shape {
            Shape::Cluster(cluster) => {
                cluster.still_serves(slot(key.as_bytes()), node, connection_timeout, deadline)
            }
            _ => true,
        }
    }

    /// Whether a call that found its master unreachable (no reply, no connection) may find
    /// another one by asking the deployment again: under Sentinel, while a sentinel named the
    /// master when last asked; on a Cluster, while a node told the map when last asked. A
    /// single server, a quorum, or a deployment whose sentinels or nodes all stopped answering
    /// has no other master to offer.
    pub(crate) fn fails_over(&self) -> bool {
        match &self.shape {
            Shape::Single(_) | Shape::Quorum(_) => false,
            Shape::Sentinel(sentinel) => sentinel.answered(),
            Shape::Cluster(cluster) => cluster.answered(),
        }
    }

    /// `node` as a message names it: its address (`host:port`, or a socket's path; never a
    /// password), and under Sentinel the master's name.
    pub(crate) fn server(&self, node: Node) -> String {
        match &self.shape {
            Shape::Single(client) => client.get_connection_info().addr().to_string(),
            Shape::Sentinel(sentinel) => sentinel.shown(),
            Shape::Cluster(cluster) => cluster.shown(node),
            Shape::Quorum(_) => "a quorum master".to_owned(),
        }
    }

    /// Whether a master that stops answering may be replaced by another server (Sentinel,
    /// Cluster), so that connections to it are worth retiring and the deployment worth asking.
    pub(crate) fn may_be_replaced(&self) -> bool {
        self.moves() || self.routes()
    }

    /// Whether keys are spread over several nodes (a cluster), so that calls are routed.
    pub(crate) fn routes(&self) -> bool {
        matches!(self.shape, Shape::Cluster(_))
    }

    /// Where the reply `error` of the cluster node `from` sends the command, if it is a
    /// redirect; the map learns from a `MOVED` or a `CLUSTERDOWN` at once. `None` for any other
    /// error, and always for a single server or Sentinel.
    pub(crate) fn redirect(&self, error: &redis::RedisError, from: Node) -> Option<Redirect> {
        use redis::{ErrorKind, ServerErrorKind};
        let Shape::Cluster(cluster) = &self.shape else {
            return None;
        };
        match error.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => {
                let (addr, slot) = error.redirect_node()?;
                let addr = cluster.full_address(addr, from);
                cluster.moved(slot, &addr);
                cluster.node_at(&addr).map(Redirect::Moved)
            }
            ErrorKind::Server(ServerErrorKind::Ask) => {
                let (addr, _) = error.redirect_node()?;
                cluster
                    .node_at(&cluster.full_address(addr, from))
                    .map(Redirect::Ask)
            }
            ErrorKind::Server(ServerErrorKind::TryAgain) => Some(Redirect::Later),
            // A master that became a replica answers MOVED; READONLY would mean a node the map
            // took for a master is a replica: the map is asked for again, as for CLUSTERDOWN.
            ErrorKind::Server(ServerErrorKind::ClusterDown)
            | ErrorKind::Server(ServerErrorKind::ReadOnly) => {
                cluster.failed(from, error);
                Some(Redirect::Later)
            }
            _ => None,
        }
    }

    /// Whether a connection to `node` failed since the deployment's map was last asked for, so
    /// that asking again may send the call elsewhere (a cluster's failed master).
    pub(crate) fn failed_since_map(&self, node: Node) -> bool {
        match &self.shape {
            Shape::Cluster(cluster) => cluster.failed_since_refresh(node),
            _ => false,
        }
    }

    /// Connections to `node` made before this number changed go to a server that no longer
    /// serves it: drop them when next used.
    pub(crate) fn epoch(&self, _node: Node) -> u64 {
        match &self.shape {
            // A cluster node is an address: a connection to it is never to another server.
            Shape::Single(_) | Shape::Cluster(_) | Shape::Quorum(_) => 0,
            Shape::Sentinel(sentinel) => sentinel.epoch(),
        }
    }

    /// Whether a node can move to another server ([`epoch`](Connector::epoch) can change), so
    /// that long-lived connections should look at the epoch often.
    pub(crate) fn moves(&self) -> bool {
        matches!(self.shape, Shape::Sentinel(_))
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
            (Shape::Single(client), _) => open(client, connect_timeout, response_timeout),
            // ROLE, asked of every new connection, does what `open`'s PING does.
            (Shape::Sentinel(sentinel), _) => sentinel.connect(connect_timeout, response_timeout),
            (Shape::Cluster(cluster), node) => {
                cluster.connect(node, connect_timeout, response_timeout)
            }
            (Shape::Quorum(_), _) => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a quorum of masters is no one server",
                "open a fenced store (FencedRedis::open) on the server that holds the data".into(),
            ))),
        }
    }

    /// How many masters a quorum has; 0 for other shapes.
    pub(crate) fn masters(&self) -> usize {
        match &self.shape {
            Shape::Quorum(masters) => masters.len(),
            _ => 0,
        }
    }

    /// The client of master `index` of a quorum, if there is one.
    pub(crate) fn master_client(&self, index: usize) -> Option<&redis::Client> {
        match &self.shape {
            Shape::Quorum(masters) => masters.get(index),
            _ => None,
        }
    }

    /// A new connection to master `index` of a quorum (`index < masters()`), as
    /// [`connect`](Connector::connect).
    pub(crate) fn master(
        &self,
        index: usize,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        match &self.shape {
            Shape::Quorum(masters) if index < masters.len() => {
                open(&masters[index], connect_timeout, response_timeout)
            }
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no such quorum master",
            ))),
        }
    }

    /// A new RESP3 connection to cluster node `node` (see [`cluster::Cluster::connect_pushing`]),
    /// as [`connect`](Connector::connect) otherwise; a plain connection for other shapes.
    pub(crate) fn connect_pushing(
        &self,
        node: Node,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        match &self.shape {
            Shape::Cluster(cluster) => {
                cluster.connect_pushing(node, connect_timeout, response_timeout)
            }
            _ => self.connect(node, connect_timeout, response_timeout),
        }
    }

    /// A new connection for the client's release channel, as [`connect`](Connector::connect).
    pub(crate) fn subscriber(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        match &self.shape {
            Shape::Cluster(cluster) => cluster.subscriber(connect_timeout, response_timeout),
            _ => self.connect(Node::SINGLE, connect_timeout, response_timeout),
        }
    }

    /// A connection to `node` made at `epoch` broke under a command, or a command on it failed
    /// with `error`. A single server has nowhere else to look: the caller's own retry and
    /// reconnect are all there is. Under Sentinel, the sentinels are asked again before the next
    /// connection, unless the master moved since `epoch` (the failure is then old news).
    pub(crate) fn failed(&self, node: Node, epoch: u64, error: &redis::RedisError) {
        match &self.shape {
            Shape::Single(_) => {
                let _ = (node, epoch, error);
            }
            Shape::Sentinel(sentinel) => sentinel.failed(epoch, error),
            Shape::Cluster(cluster) => cluster.failed(node, error),
            Shape::Quorum(_) => {}
        }
    }

    /// Whether `error` is a refusal by a server that is no longer `node`'s master (READONLY,
    /// say): the command did nothing, and goes again on a new connection, after the failure is
    /// reported with [`failed`](Connector::failed).
    pub(crate) fn not_master(&self, error: &redis::RedisError) -> bool {
        match &self.shape {
            // A cluster node that is not the master of a slot redirects instead.
            Shape::Single(_) | Shape::Cluster(_) | Shape::Quorum(_) => false,
            Shape::Sentinel(_) => sentinel::not_master(error),
        }
    }
}

/// A connection by `client`, within `connect_timeout`, whose reads and writes time out after
/// `response_timeout`.
fn open(
    client: &redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> redis::RedisResult<redis::Connection> {
    let connect_timeout = connect_timeout.max(Duration::from_millis(1));
    let mut con = client.get_connection_with_timeout(connect_timeout)?;
    con.set_read_timeout(Some(response_timeout))?;
    con.set_write_timeout(Some(response_timeout))?;
    if client
        .get_connection_info()
        .redis_settings()
        .password()
        .is_none()
    {
        // Without a password nothing in the set-up asks the server, and a server that wants one
        // would refuse the first command (NOAUTH) or, for a script with many arguments, close
        // the connection with a protocol error. Asking now makes it a rejected set-up, which
        // retrying cannot fix.
        redis::cmd("PING").query::<()>(&mut con)?;
    }
    Ok(con)
}

/// A failed connection attempt as an error: refused or timed out (an outage, worth retrying
/// later), or rejected by the server during the set-up, or a failed TLS handshake (a
/// configuration error, not worth it).
pub(crate) fn connect_error(e: redis::RedisError) -> Error {
    // Before the I/O errors: redis-rs reports a failed handshake as an I/O error.
    let e = match HandshakeFailed::from_connect(e) {
        Ok(failed) => return Error::Rejected(Box::new(failed)),
        Err(e) => e,
    };
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.code(),
            Some("LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
        );
    // redis-rs wraps a failed SELECT in a message of its own, dropping the reply's code:
    // a server busy with a script or still loading is an outage all the same.
    let detail = e.detail().unwrap_or_default().to_ascii_lowercase();
    let busy = detail.contains("busy") || detail.contains("loading");
    if e.is_timeout() {
        // Nothing was sent: unlike a command's timeout, nothing may have run.
        Error::Connection(Box::new(e))
    } else if transient || busy {
        Error::from_redis(e)
    } else {
        Error::Rejected(Box::new(e))
    }
}
