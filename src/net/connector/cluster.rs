//! Redis Cluster: each lock goes to the master that owns its hash slot.
//!
//! ```text
//! state of the client's view      what moves it
//! ------------------------------  -----------------------------------------------------------
//! no map                          a call is routed: ask the seeds for CLUSTER SLOTS, in turn,
//!                                 each within the connection timeout (and the caller's)
//! map M                           every call goes to the owner of its key's slot in M
//! slot s moved                    a node answered MOVED s addr: s goes to addr at once, and
//!                                 the whole map is asked for again before the next call
//!                                 (at most every REFRESH_GAP)
//! map M suspect                   a node broke a connection, timed out, or answered
//!                                 CLUSTERDOWN: the map is asked for again, nodes that failed
//!                                 asked last
//! ```
//!
//! Redirects (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`) are followed by the router (`router.rs`)
//! and the renewal thread; this file keeps the map and the nodes. A node is named by its
//! address: a [`Node`] number, once given to an address, stays with it, so a pool or a renewal
//! connection for a node never goes to another server. A master that became a replica answers
//! `MOVED`, so no connection to it needs dropping.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ErrorKind, RedisError, RedisResult, Value};

use super::Node;
use crate::error::{Error, Result};
use crate::net::target::ClusterSpec;
use crate::net::tls::TlsSettings;

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;
/// The least time between two full refreshes of the map prompted by redirects: during a slot
/// migration every call to the slot is redirected, and one refresh tells all of them.
const REFRESH_GAP: Duration = Duration::from_millis(100);
const NO_NODE: u32 = u32::MAX;
/// A reply that took this long may come from a master that was frozen while its replica took
/// over, and that answers what waited in its socket before it learns so (and then drops what
/// that wrote): a grant is checked against the map, a renewal not counted. A failover takes
/// about twice `cluster-node-timeout` at the least, and no sane node timeout is below 500 ms.
pub(crate) const SLOW_REPLY: Duration = Duration::from_secs(1);

/// The nodes of a Redis Cluster, and which master owns which slot.
pub(crate) struct Cluster {
    /// How to reach a node the cluster names: the first seed's settings, another address.
    template: redis::ConnectionInfo,
    tls: Option<TlsSettings>,
    /// Seeds as given, for messages.
    seeds_shown: Vec<String>,
    map: RwLock<Map>,
    /// One thread asks for the map at a time; the others go on with the map they have.
    refreshing: Mutex<()>,
    /// Ask for the map again before the next call.
    suspect: AtomicBool,
    /// The last question for the map was answered: see [`Cluster::answered`].
    answered: AtomicBool,
    /// The client's connection timeout: a connection given less (by a caller's deadline) that
    /// times out says nothing about the node.
    connection_timeout: Duration,
}

struct Map {
    /// `Node(i)` is `nodes[i]`; entries are never removed.
    nodes: Vec<Entry>,
    by_addr: HashMap<String, u32>,
    /// The master of every slot, `NO_NODE` for a slot no master serves.
    slots: Vec<u32>,
    /// The seeds' node numbers, in the order given.
    seeds: Vec<u32>,
    /// The masters and replicas the last map named.
    masters: Vec<u32>,
    replicas: Vec<u32>,
    loaded: bool,
    refreshed: Option<Instant>,
    /// Where the next release-channel subscription goes first (see [`Cluster::subscriber`]).
    next_subscriber: usize,
}

struct Entry {
    addr: String,
    client: redis::Client,
    /// When a connection to it last failed: asked last for the map.
    failed: Option<Instant>,
}

impl Cluster {
    /// Parses and checks the seeds; connects to nothing.
    pub(crate) fn open(
        spec: &ClusterSpec,
        tls: &TlsSettings,
        connection_timeout: Duration,
    ) -> Result<Cluster> {
        let mut seed_clients = Vec::with_capacity(spec.seeds.len());
        for url in &spec.seeds {
            seed_clients.push(crate::net::url::client(url, tls)?);
        }
        let template = seed_clients[0].get_connection_info().clone();
        let mut map = Map {
            nodes: Vec::new(),
            by_addr: HashMap::new(),
            slots: vec![NO_NODE; SLOTS],
            seeds: Vec::new(),
            masters: Vec::new(),
            replicas: Vec::new(),
            loaded: false,
            refreshed: None,
            next_subscriber: 0,
        };
        for client in seed_clients {
            let addr = match client.get_connection_info().addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    address(host, *port)
                }
                _ => {
                    return Err(Error::invalid(
                        "topology",
                        "a cluster seed must be a TCP address",
                    ))
                }
            };
            let id = match map.by_addr.get(&addr) {
                Some(id) => *id,
                None => map.add(addr, client),
            };
            if !map.seeds.contains(&id) {
                map.seeds.push(id);
            }
        }
        Ok(Cluster {
            template,
            tls: spec.tls().then(|| tls.clone()),
            seeds_shown: spec
                .seeds
                .iter()
                .map(|s| crate::net::url::shown(s))
                .collect(),
            map: RwLock::new(map),
            refreshing: Mutex::new(()),
            suspect: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            connection_timeout,
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Map> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Map> {
        self.map.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The master of `slot` as the map has it, without asking anyone: the first seed while
    /// no map is known or no master serves the slot (it redirects, or says the cluster is
    /// down).
    pub(crate) fn node_of_slot(&self, slot: u16) -> Node {
        let map = self.read();
        match map.slots[usize::from(slot)] {
            NO_NODE => Node(map.seeds[0]),
            node => Node(node),
        }
    }

    /// The master of `slot`, asking for the map first if there is none yet or it is suspect,
    /// within the connection timeout and `deadline`.
    ///
    /// # Errors
    /// [`Error::Connection`] if no map could be had (saying what each seed answered), or no
    /// master serves the slot (the cluster is down or not set up).
    pub(crate) fn route(
        &self,
        slot: u16,
        connection_timeout: Duration,
        deadline: Option<Instant>,
    ) -> Result<Node> {
        let (loaded, due, served) = {
            let map = self.read();
            let due = map.refreshed.is_none_or(|at| at.elapsed() >= REFRESH_GAP);
            (map.loaded, due, map.slots[usize::from(slot)] != NO_NODE)
        };
        // A slot no master served when the map was read may be served now (a cluster still
        // being set up, a master added back).
        if !loaded || (due && (!served || self.suspect.load(Ordering::Relaxed))) {
            if let Err(e) = self.refresh(connection_timeout, deadline) {
                if !self.read().loaded {
                    return Err(e);
                }
                log::debug!("fencelock: asking the cluster for its slots failed: {e}");
            }
        }
        let map = self.read();
        match map.slots[usize::from(slot)] {
            NO_NODE => Err(Error::Connection(
                format!(
                    "no master of the cluster serves hash slot {slot}: the cluster is down or \
                     not fully set up (CLUSTER SLOTS leaves the slot out)"
                )
                .into(),
            )),
            node => Ok(Node(node)),
        }
    }

    /// Asks for the map if it is suspect and was not asked for in the last [`REFRESH_GAP`].
    pub(crate) fn refresh_if_suspect(&self, connection_timeout: Duration) {
        let due = self
            .read()
            .refreshed
            .is_none_or(|at| at.elapsed() >= REFRESH_GAP);
        if due && self.suspect.load(Ordering::Relaxed) {
            if let Err(e) = self.refresh(connection_timeout, None) {
                log::debug!("fencelock: asking the cluster for its slots failed: {e}");
            }
        }
    }

    /// Whether `node` still serves `slot`, as the map says once asked for again of the other
    /// nodes first. An unanswered question leaves the map as it was.
    pub(crate) fn still_serves(
        &self,
        slot: u16,
        node: Node,
        connection_timeout: Duration,
        deadline: Option<Instant>,
    ) -> bool {
        if let Err(e) = self.refresh_avoiding(connection_timeout, deadline, Some(node.0)) {
            log::debug!("fencelock: asking the cluster for its slots failed: {e}");
        }
        self.read().slots[usize::from(slot)] == node.0
    }

    /// Asks the nodes for the map (`CLUSTER SLOTS`), the masters first and those that failed
    /// last, until one answers. One thread at a time: a thread that finds another asking waits
    /// for it (within its own bounds) and uses its answer.
    fn refresh(&self, connection_timeout: Duration, deadline: Option<Instant>) -> Result<()> {
        self.refresh_avoiding(connection_timeout, deadline, None)
    }

    /// `node`'s address, for messages.
    pub(crate) fn shown(&self, node: Node) -> String {
        self.read()
            .nodes
            .get(node.0 as usize)
            .map_or_else(|| format!("cluster node {}", node.0), |e| e.addr.clone())
    }

    /// Whether a node told the map when it was last asked for: while one does, a master that
    /// stopped answering may yet be replaced by its replica, and a caller with time left asks
    /// again. With no node answering, nothing new can be learnt.
    pub(crate) fn answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    /// [`refresh`](Cluster::refresh), asking `avoid` last.
    fn refresh_avoiding(
        &self,
        connection_timeout: Duration,
        deadline: Option<Instant>,
        avoid: Option<u32>,
    ) -> Result<()> {
        let started = Instant::now();
        let until = deadline
            .unwrap_or(started + connection_timeout)
            .min(started + connection_timeout * 2);
        let turn = loop {
            match self.refreshing.try_lock() {
                Ok(turn) => break turn,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if Instant::now() >= until {
                        return Err(Error::Connection(
                            "timed out waiting for another thread asking the cluster for its \
                             slots"
                                .into(),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        // Another thread may have refreshed while this one waited.
        if self.read().refreshed.is_some_and(|at| at >= started) {
            return Ok(());
        }
        let candidates: Vec<(u32, String, redis::Client)> = {
            let map = self.read();
            let mut order: Vec<u32> = Vec::new();
            for id in map.masters.iter().chain(&map.seeds).chain(&map.replicas) {
                if !order.contains(id) {
                    order.push(*id);
                }
            }
            // Healthy first, then by how long ago they failed; `avoid` last.
            order.sort_by_key(|id| {
                (
                    Some(*id) == avoid,
                    map.nodes[*id as usize].failed.map(|at| -elapsed_ms(at)),
                )
            });
            order
                .into_iter()
                .map(|id| {
                    let e = &map.nodes[id as usize];
                    (id, e.addr.clone(), e.client.clone())
                })
                .collect()
        };
        let mut said = Vec::new();
        let asked = candidates.len();
        let mut not_cluster = Vec::new();
        for (id, addr, client) in candidates {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                said.push("(no time left to ask the others)".to_owned());
                break;
            }
            match ask_slots(&client, left.min(connection_timeout)) {
                Ok(ranges) if !ranges.is_empty() => {
                    self.apply(&addr, ranges);
                    self.answered.store(true, Ordering::Relaxed);
                    drop(turn);
                    return Ok(());
                }
                Ok(_) => said.push(format!("{addr}: knows no slots")),
                // A server that is no cluster node ("ERR This instance has cluster support
                // disabled"). Another node named may still be one (a stale seed).
                Err(e) if e.to_string().contains("cluster support disabled") => {
                    not_cluster.push(addr);
                }
                Err(e) => {
                    if let Some(entry) = self.write().nodes.get_mut(id as usize) {
                        entry.failed = Some(Instant::now());
                    }
                    said.push(format!("{addr}: {e}"));
                }
            }
        }
        // Every node asked is a plain server: the topology is wrong, which no retry mends.
        if !not_cluster.is_empty() && not_cluster.len() == asked {
            drop(turn);
            return Err(Error::Rejected(
                format!("{} {}", not_cluster.join(", "), crate::error::NOT_A_CLUSTER).into(),
            ));
        }
        for addr in &not_cluster {
            said.push(format!("{addr} {}", crate::error::NOT_A_CLUSTER));
        }
        // Nodes cut short by a caller's deadline may only be slow.
        if deadline.is_none_or(|d| d >= started + connection_timeout) {
            self.answered.store(false, Ordering::Relaxed);
        }
        drop(turn);
        Err(Error::Connection(
            format!(
                "no node of the cluster told its slots (seeds {}): {}",
                self.seeds_shown.join(", "),
                said.join("; ")
            )
            .into(),
        ))
    }

    /// Takes the map a node at `asked` gave.
    fn apply(&self, asked: &str, ranges: Vec<Range>) {
        let asked_host = asked.rsplit_once(':').map_or(asked, |(h, _)| h).to_owned();
        let mut map = self.write();
        let mut slots = vec![NO_NODE; SLOTS];
        let (mut masters, mut replicas) = (Vec::new(), Vec::new());
        for range in ranges {
            // An empty host means "the address you reached me at".
            let host = |h: &str| {
                if h.is_empty() || h == "?" {
                    asked_host.clone()
                } else {
                    h.to_owned()
                }
            };
            let master = map.node(self, address(&host(&range.master.0), range.master.1));
            let (Some(master), start, end) = (master, range.start, range.end) else {
                continue;
            };
            for slot in start..=end.min(SLOTS as u16 - 1) {
                slots[usize::from(slot)] = master;
            }
            if !masters.contains(&master) {
                masters.push(master);
            }
            for (h, p) in &range.replicas {
                if let Some(replica) = map.node(self, address(&host(h), *p)) {
                    if !replicas.contains(&replica) {
                        replicas.push(replica);
                    }
                }
            }
        }
        // A map with slots no master serves stays suspect: asked for again before the renewal
        // thread's next round.
        self.suspect
            .store(slots.contains(&NO_NODE), Ordering::Relaxed);
        map.slots = slots;
        map.masters = masters;
        map.replicas = replicas;
        map.loaded = true;
        map.refreshed = Some(Instant::now());
    }

    /// A `MOVED slot addr` reply: the slot is `addr`'s now, and the rest of the map may have
    /// changed too (a failover moves every slot of a master).
    pub(crate) fn moved(&self, slot: u16, addr: &str) {
        let mut map = self.write();
        let (host, port) = split_addr(addr);
        let Some(port) = port else { return };
        if let Some(node) = map.node(self, address(host, port)) {
            map.slots[usize::from(slot) % SLOTS] = node;
        }
        self.suspect.store(true, Ordering::Relaxed);
    }

    /// `addr` as a redirect from node `from` gives it, with `from`'s host when it names none (a
    /// node announcing `cluster-preferred-endpoint-type unknown-endpoint` says `:port`).
    pub(crate) fn full_address(&self, addr: &str, from: Node) -> String {
        let (host, port) = split_addr(addr);
        if !host.is_empty() && host != "?" {
            return addr.to_owned();
        }
        let map = self.read();
        match (map.nodes.get(from.0 as usize), port) {
            (Some(entry), Some(port)) => {
                let (from_host, _) = split_addr(&entry.addr);
                address(from_host, port)
            }
            _ => addr.to_owned(),
        }
    }

    /// The node at `addr` (as a redirect names it), given a number if it is new.
    pub(crate) fn node_at(&self, addr: &str) -> Option<Node> {
        let (host, port) = split_addr(addr);
        let mut map = self.write();
        map.node(self, address(host, port?)).map(Node)
    }

    /// A connection to `node` failed, or a command on it timed out, or it said the cluster is
    /// down: ask for the map before the next call.
    pub(crate) fn failed(&self, node: Node, error: &RedisError) {
        if error.is_io_error() || error.is_timeout() || error.is_connection_dropped() {
            if let Some(entry) = self.write().nodes.get_mut(node.0 as usize) {
                entry.failed = Some(Instant::now());
            }
        }
        if let Some((addr, slot)) = error.redirect_node() {
            if error.kind() == ErrorKind::Server(redis::ServerErrorKind::Moved) {
                self.moved(slot, addr);
                return;
            }
        }
        self.suspect.store(true, Ordering::Relaxed);
    }

    /// Ask for the map before the next call.
    pub(crate) fn suspect(&self) {
        self.suspect.store(true, Ordering::Relaxed);
    }

    /// Whether a connection to `node` failed since the map was last asked for.
    pub(crate) fn failed_since_refresh(&self, node: Node) -> bool {
        let map = self.read();
        match (
            map.nodes.get(node.0 as usize).and_then(|e| e.failed),
            map.refreshed,
        ) {
            (Some(failed), Some(refreshed)) => failed >= refreshed,
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// A new connection to `node`.
    pub(crate) fn connect(
        &self,
        node: Node,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<redis::Connection> {
        self.connect_as(node, connect_timeout, response_timeout, false)
    }

    /// A new connection to `node` that speaks RESP3, where pub/sub messages and confirmations
    /// are push messages: redis-rs skips a reply that once timed out, but never a push.
    pub(crate) fn connect_pushing(
        &self,
        node: Node,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<redis::Connection> {
        self.connect_as(node, connect_timeout, response_timeout, true)
    }

    fn connect_as(
        &self,
        node: Node,
        connect_timeout: Duration,
        response_timeout: Duration,
        resp3: bool,
    ) -> RedisResult<redis::Connection> {
        let client = {
            let map = self.read();
            match map.nodes.get(node.0 as usize) {
                Some(entry) if resp3 => {
                    let info = entry.client.get_connection_info().clone();
                    let settings = info
                        .redis_settings()
                        .clone()
                        .set_protocol(redis::ProtocolVersion::RESP3);
                    redis::Client::open(info.set_redis_settings(settings))?
                }
                Some(entry) => entry.client.clone(),
                None => {
                    return Err(RedisError::from((
                        ErrorKind::Io,
                        "no such cluster node",
                        format!("{node:?}"),
                    )))
                }
            }
        };
        let made = super::open(&client, connect_timeout, response_timeout);
        let cut = |e: &RedisError| e.is_timeout() && connect_timeout < self.connection_timeout;
        if made.as_ref().is_err_and(|e| !cut(e)) {
            if let Some(entry) = self.write().nodes.get_mut(node.0 as usize) {
                entry.failed = Some(Instant::now());
            }
            self.suspect.store(true, Ordering::Relaxed);
        }
        made
    }

    /// A connection for the client's release channel, to any node: a `PUBLISH` reaches every
    /// node of a cluster. Each call starts one node further along, so that a subscription whose
    /// node failed moves to another.
    pub(crate) fn subscriber(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<redis::Connection> {
        let started = Instant::now();
        let nodes: Vec<u32> = {
            let mut map = self.write();
            let mut order: Vec<u32> = Vec::new();
            for id in map.masters.iter().chain(&map.seeds).chain(&map.replicas) {
                if !order.contains(id) {
                    order.push(*id);
                }
            }
            let first = map.next_subscriber % order.len().max(1);
            map.next_subscriber = map.next_subscriber.wrapping_add(1);
            order.rotate_left(first);
            order
        };
        let mut last = None;
        for id in nodes {
            let left = connect_timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            match self.connect(Node(id), left, response_timeout) {
                Ok(con) => return Ok(con),
                Err(e) if super::is_refusal(&e) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((ErrorKind::Io, "no cluster node could be reached in time"))
        }))
    }
}

impl Map {
    /// The number of the node at `addr`, made (with a client from the template) if new.
    fn node(&mut self, cluster: &Cluster, addr: String) -> Option<u32> {
        if let Some(id) = self.by_addr.get(&addr) {
            return Some(*id);
        }
        let (host, port) = split_addr(&addr);
        let client = match cluster.client_at(host, port?) {
            Ok(client) => client,
            Err(e) => {
                log::warn!("fencelock: cannot make a client for cluster node {addr}: {e}");
                return None;
            }
        };
        Some(self.add(addr, client))
    }

    /// Numbers a node new to the map.
    fn add(&mut self, addr: String, client: redis::Client) -> u32 {
        let id = self.nodes.len() as u32;
        self.by_addr.insert(addr.clone(), id);
        self.nodes.push(Entry {
            addr,
            client,
            failed: None,
        });
        id
    }
}

impl Cluster {
    /// A client for the node at `host:port`, with the first seed's settings.
    fn client_at(&self, host: &str, port: u16) -> RedisResult<redis::Client> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let addr = match self.template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        let info = self.template.clone().set_addr(addr);
        match &self.tls {
            None => redis::Client::open(info),
            Some(tls) => crate::net::tls::client(info, tls).map_err(|e| {
                RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "TLS settings",
                    e.to_string(),
                ))
            }),
        }
    }
}

/// `host:port`, with an IPv6 host in brackets: how nodes are named.
fn address(host: &str, port: u16) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits `host:port` (`[v6]:port` too).
fn split_addr(addr: &str) -> (&str, Option<u16>) {
    match addr.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()),
        None => (addr, None),
    }
}

fn elapsed_ms(at: Instant) -> i64 {
    i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX)
}

/// One entry of `CLUSTER SLOTS`.
struct Range {
    start: u16,
    end: u16,
    master: (String, u16),
    replicas: Vec<(String, u16)>,
}

/// Asks one node for `CLUSTER SLOTS`, within `timeout` for connecting and for the reply.
fn ask_slots(client: &redis::Client, timeout: Duration) -> RedisResult<Vec<Range>> {
    let mut con = super::open(client, timeout, timeout)?;
    let reply: Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)?;
    parse_slots(reply)
}

fn parse_slots(reply: Value) -> RedisResult<Vec<Range>> {
    let bad = |what: &str| {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "unexpected CLUSTER SLOTS reply",
            what.to_owned(),
        ))
    };
    let Value::Array(entries) = reply else {
        return Err(bad("not an array"));
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(parts) = entry else {
            return Err(bad("an entry is not an array"));
        };
        let mut parts = parts.into_iter();
        let start: u16 = redis::from_redis_value(parts.next().ok_or_else(|| bad("no start"))?)?;
        let end: u16 = redis::from_redis_value(parts.next().ok_or_else(|| bad("no end"))?)?;
        let mut nodes = Vec::new();
        for node in parts {
            let Value::Array(fields) = node else {
                return Err(bad("a node is not an array"));
            };
            let mut fields = fields.into_iter();
            // Nil for a node that announces no address (`unknown-endpoint`): the asked one's.
            let host: Option<String> =
                redis::from_redis_value(fields.next().ok_or_else(|| bad("no host"))?)?;
            let host = host.unwrap_or_default();
            let port: u16 = redis::from_redis_value(fields.next().ok_or_else(|| bad("no port"))?)?;
            nodes.push((host, port));
        }
        let mut nodes = nodes.into_iter();
        let Some(master) = nodes.next() else {
            return Err(bad("a range without a master"));
        };
        ranges.push(Range {
            start,
            end,
            master,
            replicas: nodes.collect(),
        });
    }
    Ok(ranges)
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{` and
/// the next `}`, when not empty) or of the whole key, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS as u16
}

/// CRC16-CCITT (XMODEM), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_as_redis_computes_them() {
        // Values from CLUSTER KEYSLOT, and the cluster specification's own example.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        for (key, expected) in [
            ("foo", 12182),
            ("{user1000}.following", 3443),
            ("{user1000}.followers", 3443),
            ("foo{{bar}}zap", slot(b"{bar")),
            ("foo{bar}{zap}", slot(b"bar")),
            ("", 0),
        ] {
            assert_eq!(slot(key.as_bytes()), expected, "{key}");
        }
        // An empty tag hashes the whole key.
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn names_nodes_by_address() {
        assert_eq!(address("127.0.0.1", 1), "127.0.0.1:1");
        assert_eq!(address("::1", 2), "[::1]:2");
        assert_eq!(address("[::1]", 2), "[::1]:2");
        assert_eq!(split_addr("[::1]:2"), ("[::1]", Some(2)));
    }
}
