//! A real-process Redis Cluster on 127.0.0.1: `masters` masters with `replicas_per_master`
//! replicas each, every node a [`RedisServer`] child of the test in its own temp dir, killed and
//! reaped on drop.
//!
//! Node settings: `cluster-enabled yes`, `cluster-config-file nodes.conf` (in the node's dir),
//! `cluster-node-timeout 2000`, a cluster bus port of its own (`--cluster-port`, drawn free
//! like the main port: the default port + 10000 can be taken or above 65535), and
//! `repl-diskless-sync-delay 0` (Redis 7's default holds every full sync back 5 s). The extra
//! arguments of [`ClusterSet::start_with`] come last and may override these.
//!
//! The cluster is built over plain connections, not with `redis-cli --cluster create`: a
//! distinct `CLUSTER SET-CONFIG-EPOCH` on every node, `CLUSTER ADDSLOTSRANGE` on the masters
//! (16384 slots split evenly, in order), `CLUSTER MEET` from every node to every node after it
//! (with MEETs from node 0 only, the others learnt of each other by gossip in 1 to 2 s; so
//! every handshake is direct and takes about 0.1 s), then, once every node knows every other,
//! `CLUSTER REPLICATE` on the replicas. Node `i < masters` starts as a master; replica
//! `masters + k` replicates master `k % masters`.
//!
//! "Live" nodes are those running and not paused by [`ClusterSet::pause`]; every helper asks
//! only them. "Agreeing" means: every live node says `cluster_state:ok`, lists every live node
//! at its address, and gives the same owner for each of the 16384 slots and the same role
//! (master, or replica of which master) for every live node in `CLUSTER NODES`.
//!
//! Measured on a 2-core machine with Redis 7.0.15 (3 masters + 3 replicas, two clusters at
//! once): start-up about 2.1 s, nearly all of it the 2 s a master waits after its start
//! before it says `cluster_state:ok` (`CLUSTER_WRITABLE_DELAY`, not configurable);
//! [`ClusterSet::failover`] 0.1 to 0.9 s (the switch itself is quick; the rest is gossip
//! reaching every node); a SIGSTOPped master replaced by its replica 3.3 to 4.2 s after the
//! stop.
//!
//! Seen on the way, worth knowing when testing a client:
//! - `CLUSTER SLOTS` leaves out a replica whose replication offset is 0: right after the start,
//!   until the first write on its master (or the master's replication PING, every 10 s), it
//!   lists masters only. `CLUSTER NODES` lists the replicas at once.
//! - A command that reached a frozen master's socket while it was stopped is run on SIGCONT
//!   (a SET answered OK) before the node reads the newer configuration from the cluster bus.
//!   A command sent after SIGCONT gets MOVED, or for a few ms (45 once) `CLUSTERDOWN Hash slot
//!   not served` first. The OK'd write is lost when the node resyncs as a replica of the new
//!   master.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::clock::ServerClock;
use super::{free_port, lock, read_from, RedisServer, ServerOptions};

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// `cluster-node-timeout` of every node, in ms: a master silent this long is suspected
/// (`PFAIL`), and its replica starts an election once the masters agree it failed.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// How long [`ClusterSet::start`] may take to settle once the processes run.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`ClusterSet::failover`] waits for the replica's link, and then for the switch.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long [`ClusterSet::finish_migration`] waits for every live node to agree.
const AGREE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long [`ClusterSet::migrate_rest`] may take, and how many batches it may send.
const MIGRATE_REST_TIMEOUT: Duration = Duration::from_secs(30);
const MIGRATE_REST_ROUNDS: usize = 1000;
/// Keys per `MIGRATE ... KEYS` batch, and the `MIGRATE` timeout in ms.
const MIGRATE_BATCH: usize = 100;
const MIGRATE_TIMEOUT_MS: u64 = 5000;
/// Poll interval of the wait loops.
const POLL: Duration = Duration::from_millis(20);
/// Connect/read/write timeout of the probes (a paused node must not hang a wait loop).
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Log lines per node in [`ClusterSet::logs`].
const LOG_TAIL_LINES: usize = 30;

// ---------------------------------------------------------------------------
// Hash slots
// ---------------------------------------------------------------------------

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), the checksum of Redis Cluster's key slots.
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

/// The part of `key` that is hashed: what lies between the first `{` and the first `}` after
/// it, if that is not empty; else the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

// ---------------------------------------------------------------------------
// Probes: what one node says (errors as strings for the wait loops' messages)
// ---------------------------------------------------------------------------

/// A node's role in one node's `CLUSTER NODES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Master,
    /// A replica of the master on this port (0: a master the answering node has no address of).
    Replica(u16),
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
struct NodeLine {
    id: String,
    /// 0 while the answering node does not know the address.
    port: u16,
    flags: Vec<String>,
    /// The master's id, for a replica.
    master_id: Option<String>,
    /// Slot ranges it owns (inclusive); migrating/importing markers left out.
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// One node's `CLUSTER NODES`.
#[derive(Clone, Debug)]
struct View {
    /// The port of the node that answered.
    from: u16,
    lines: Vec<NodeLine>,
}

impl View {
    fn parse(from: u16, text: &str) -> Result<View, String> {
        let mut lines = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return Err(format!("node {from}: CLUSTER NODES line {line:?}"));
            }
            // `ip:port@cport[,hostname]`; `:0@0` while the address is unknown.
            let address = fields[1].split(',').next().unwrap_or("");
            let host_port = address.split('@').next().unwrap_or("");
            let port = host_port
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .ok_or_else(|| format!("node {from}: no port in CLUSTER NODES line {line:?}"))?;
            let mut slots = Vec::new();
            for token in &fields[8..] {
                if token.starts_with('[') {
                    continue; // [slot->-id] migrating, [slot-<-id] importing
                }
                let (lo, hi) = token.split_once('-').unwrap_or((token, token));
                match (lo.parse::<u16>(), hi.parse::<u16>()) {
                    (Ok(lo), Ok(hi)) if lo <= hi && hi < SLOTS => slots.push((lo, hi)),
                    _ => return Err(format!("node {from}: slot {token:?} in line {line:?}")),
                }
            }
            lines.push(NodeLine {
                id: fields[0].to_owned(),
                port,
                flags: fields[2].split(',').map(str::to_owned).collect(),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            });
        }
        Ok(View { from, lines })
    }

    fn by_id(&self, id: &str) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.id == id)
    }

    fn by_port(&self, port: u16) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.port == port)
    }

    fn myself(&self) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.has_flag("myself"))
    }

    fn role(&self, line: &NodeLine) -> Role {
        match (&line.master_id, line.has_flag("slave")) {
            (Some(master), true) => Role::Replica(self.by_id(master).map_or(0, |m| m.port)),
            _ => Role::Master,
        }
    }

    /// The port owning each slot (0: unassigned).
    fn owners(&self) -> Vec<u16> {
        let mut owners = vec![0u16; usize::from(SLOTS)];
        for line in &self.lines {
            for &(lo, hi) in &line.slots {
                for owner in &mut owners[usize::from(lo)..=usize::from(hi)] {
                    *owner = line.port;
                }
            }
        }
        owners
    }

    /// Ports of the masters that own slots, in no particular order.
    fn masters_with_slots(&self) -> Vec<u16> {
        self.lines
            .iter()
            .filter(|l| l.has_flag("master") && !l.slots.is_empty())
            .map(|l| l.port)
            .collect()
    }
}

fn probe(port: u16) -> Result<redis::Connection, String> {
    super::Access::default().connect(port, PROBE_TIMEOUT)
}

/// `<what>` on the node at `port`, as a string reply.
fn query_string(port: u16, cmd: &redis::Cmd, what: &str) -> Result<String, String> {
    let mut con = probe(port)?;
    cmd.query(&mut con)
        .map_err(|e| format!("node {port}: {what}: {e}"))
}

fn cluster_nodes(port: u16) -> Result<View, String> {
    let text = query_string(port, redis::cmd("CLUSTER").arg("NODES"), "CLUSTER NODES")?;
    View::parse(port, &text)
}

/// `field:value` lines (`INFO <section>`, `CLUSTER INFO`) as a map.
fn fields(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn cluster_info(port: u16) -> Result<HashMap<String, String>, String> {
    query_string(port, redis::cmd("CLUSTER").arg("INFO"), "CLUSTER INFO").map(|t| fields(&t))
}

fn replication_info(port: u16) -> Result<HashMap<String, String>, String> {
    query_string(
        port,
        redis::cmd("INFO").arg("replication"),
        "INFO replication",
    )
    .map(|t| fields(&t))
}

/// `CLUSTER <args>` on the node at `port`, which must answer `OK`.
fn cluster_ok(port: u16, args: &[&str]) -> Result<(), String> {
    let mut cmd = redis::cmd("CLUSTER");
    for arg in args {
        cmd.arg(*arg);
    }
    let what = format!("CLUSTER {}", args.join(" "));
    let reply = query_string(port, &cmd, &what)?;
    if reply == "OK" {
        Ok(())
    } else {
        Err(format!("node {port}: {what} answered {reply:?}"))
    }
}

// ---------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------

/// One cluster node.
struct Node {
    server: RedisServer,
    bus_port: u16,
    /// `CLUSTER MYID`, asked once at the start (a node keeps its id in `nodes.conf`).
    id: String,
    /// Whether it is SIGSTOPped (by [`ClusterSet::pause`]).
    paused: AtomicBool,
    /// Its wall clock, if it has one of its own (dropped after the server that reads it).
    clock: Option<ServerClock>,
}

impl Node {
    fn start(extra_args: &[&str], clock: Option<ServerClock>) -> Node {
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &NODE_TIMEOUT_MS.to_string(),
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let mut bus_port = 0;
        let server = RedisServer::start_as_with(
            &ServerOptions {
                args,
                env: clock.as_ref().map(ServerClock::env).unwrap_or_default(),
                ..ServerOptions::default()
            },
            || {
                bus_port = free_port();
                vec!["--cluster-port".to_owned(), bus_port.to_string()]
            },
        );
        let id = query_string(
            server.port(),
            redis::cmd("CLUSTER").arg("MYID"),
            "CLUSTER MYID",
        )
        .unwrap_or_else(|e| {
            panic!(
                "cluster node on port {} (is cluster mode on?): {e}\n{}",
                server.port(),
                server.log()
            )
        });
        Node {
            server,
            bus_port,
            id,
            paused: AtomicBool::new(false),
            clock,
        }
    }

    fn is_live(&self) -> bool {
        !self.paused.load(Ordering::SeqCst) && self.server.is_running()
    }
}

/// A slot being moved by [`ClusterSet::begin_migration`], node indexes.
#[derive(Clone, Copy, Debug)]
struct Migration {
    source: usize,
    target: usize,
}

/// What the live nodes agree on (see the module doc).
struct Agreed {
    /// Port owning each slot.
    owners: Vec<u16>,
    /// Role of every live node, by port.
    roles: BTreeMap<u16, Role>,
    /// `CLUSTER NODES` of every live node.
    views: Vec<View>,
}

/// A Redis Cluster of real `redis-server` processes on 127.0.0.1 (see the module doc). Nodes
/// are numbered in start order, masters first; dropping the set SIGKILLs and reaps every node
/// and removes their dirs.
pub struct ClusterSet {
    nodes: Vec<Node>,
    /// Slots being migrated in steps, by slot.
    migrations: Mutex<HashMap<u16, Migration>>,
}

impl ClusterSet {
    /// [`ClusterSet::start_with`] without extra arguments.
    pub fn start(masters: usize, replicas_per_master: usize) -> ClusterSet {
        Self::start_with(masters, replicas_per_master, &[])
    }

    /// Starts `masters` masters and `replicas_per_master` replicas of each, builds the cluster
    /// and returns once it is settled: every node agrees (module doc), every slot is assigned,
    /// each replica replicates its planned master with `master_link_status:up`, and no node
    /// flags another `fail`/`pfail`. `extra_args` go on every node's command line, last (e.g.
    /// `&["--appendonly", "yes"]`). Panics, with the nodes' logs, if that takes more than 20 s;
    /// a missing `redis-server` fails naming how to install it.
    pub fn start_with(
        masters: usize,
        replicas_per_master: usize,
        extra_args: &[&str],
    ) -> ClusterSet {
        Self::start_as(masters, replicas_per_master, extra_args, false)
    }

    /// [`ClusterSet::start_with`], every node with a wall clock of its own that the test can
    /// step and skew ([`ClusterSet::clock`]).
    pub fn start_with_clocks(
        masters: usize,
        replicas_per_master: usize,
        extra_args: &[&str],
    ) -> ClusterSet {
        Self::start_as(masters, replicas_per_master, extra_args, true)
    }

    fn start_as(
        masters: usize,
        replicas_per_master: usize,
        extra_args: &[&str],
        clocks: bool,
    ) -> ClusterSet {
        assert!(
            (1..=usize::from(SLOTS)).contains(&masters),
            "a cluster needs 1 to {SLOTS} masters, not {masters}"
        );
        let total = masters * (1 + replicas_per_master);
        // Built in place, so a panic half-way drops (kills) whatever was started already.
        let mut set = ClusterSet {
            nodes: Vec::with_capacity(total),
            migrations: Mutex::new(HashMap::new()),
        };
        for _ in 0..total {
            set.nodes
                .push(Node::start(extra_args, clocks.then(ServerClock::new)));
        }
        set.must(&format!("set-up of {total} nodes"), || {
            for (i, node) in set.nodes.iter().enumerate() {
                let epoch = (i + 1).to_string();
                cluster_ok(node.server.port(), &["SET-CONFIG-EPOCH", &epoch])?;
            }
            for m in 0..masters {
                let lo = m * usize::from(SLOTS) / masters;
                let hi = (m + 1) * usize::from(SLOTS) / masters - 1;
                cluster_ok(
                    set.port_of(m),
                    &["ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()],
                )?;
            }
            for (i, from) in set.nodes.iter().enumerate() {
                for node in &set.nodes[i + 1..] {
                    let (port, bus) = (node.server.port().to_string(), node.bus_port.to_string());
                    cluster_ok(from.server.port(), &["MEET", "127.0.0.1", &port, &bus])?;
                }
            }
            Ok(())
        });
        set.wait("every node to know every other", SETTLE_TIMEOUT, || {
            set.all_known()
        });
        for k in 0..masters * replicas_per_master {
            let (replica, master) = (masters + k, k % masters);
            // Retried: a node may still be finishing the handshake with the master.
            set.wait(
                &format!("node {replica} to accept CLUSTER REPLICATE"),
                SETTLE_TIMEOUT,
                || cluster_ok(set.port_of(replica), &["REPLICATE", &set.nodes[master].id]),
            );
        }
        set.wait("the cluster to settle", SETTLE_TIMEOUT, || {
            let agreed = set.settled()?;
            for k in 0..masters * replicas_per_master {
                let (replica, master) = (set.port_of(masters + k), set.port_of(k % masters));
                if agreed.roles.get(&replica) != Some(&Role::Replica(master)) {
                    return Err(format!(
                        "node {replica}: role {:?}, want replica of {master}",
                        agreed.roles.get(&replica)
                    ));
                }
            }
            match agreed.owners.iter().position(|&p| p == 0) {
                Some(slot) => Err(format!("slot {slot} unassigned")),
                None => Ok(()),
            }
        });
        set
    }

    /// `redis://127.0.0.1:<port>/` of every node (killed ones too): the current masters (those
    /// owning slots, as a live node says) first, then the others, each part in index order.
    pub fn seed_urls(&self) -> Vec<String> {
        let masters = self
            .any_view()
            .map(|v| v.masters_with_slots())
            .unwrap_or_default();
        let (mut first, rest): (Vec<u16>, Vec<u16>) = self
            .node_ports()
            .into_iter()
            .partition(|p| masters.contains(p));
        first.extend(rest);
        first
            .into_iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }

    /// The port of every node, by node index.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.server.port()).collect()
    }

    /// Ports of the masters that own slots now, as a live node says, in node index order.
    pub fn master_ports(&self) -> Vec<u16> {
        let view = self.view_or_panic();
        let masters = view.masters_with_slots();
        self.node_ports()
            .into_iter()
            .filter(|p| masters.contains(p))
            .collect()
    }

    /// The port of node `i`.
    pub fn port_of(&self, i: usize) -> u16 {
        self.nodes[i].server.port()
    }

    /// The index of the node on `port`; panics if none is.
    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.server.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}: {:?}", self.node_ports()))
    }

    /// The cluster bus port of node `i` (`--cluster-port`).
    pub fn bus_port_of(&self, i: usize) -> u16 {
        self.nodes[i].bus_port
    }

    /// Node `i`'s id (`CLUSTER MYID`, asked at the start: it never changes).
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i].id.clone()
    }

    /// Node `i`'s wall clock: see [`ClusterSet::start_with_clocks`].
    pub fn clock(&self, i: usize) -> &ServerClock {
        self.nodes[i].clock.as_ref().unwrap_or_else(|| {
            panic!("node {i} has no clock of its own: start it with start_with_clocks")
        })
    }

    /// Node `i` itself, to read its log or dir, say.
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.nodes[i].server
    }

    /// A fresh plain connection to node `i` with 5 s connect/read/write timeouts (not cluster
    /// aware: it sees MOVED/ASK/TRYAGAIN as errors).
    pub fn connection(&self, i: usize) -> redis::Connection {
        self.nodes[i].server.connection()
    }

    /// The slot of `key`: CRC16-XMODEM of its hash tag (the text between the first `{` and the
    /// next `}`, if not empty; else the whole key) mod 16384, as `CLUSTER KEYSLOT` computes it.
    pub fn slot_of(key: &str) -> u16 {
        crc16(hash_tag(key.as_bytes())) % SLOTS
    }

    /// The port of the master owning `slot`, as the first live node that answers says.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        let view = self.view_or_panic();
        match view.owners()[usize::from(slot)] {
            0 => panic!("node {} says slot {slot} is unassigned", view.from),
            port => port,
        }
    }

    /// The port of one replica of the master on `master_port` (a live one, not flagged failed,
    /// if there is one), as the first live node that answers says. Panics if it has none.
    pub fn replica_of(&self, master_port: u16) -> u16 {
        let view = self.view_or_panic();
        let master = view.by_port(master_port).unwrap_or_else(|| {
            panic!(
                "node {} does not know a node on port {master_port}",
                view.from
            )
        });
        let replicas: Vec<&NodeLine> = view
            .lines
            .iter()
            .filter(|l| l.has_flag("slave") && l.master_id.as_deref() == Some(&master.id))
            .collect();
        let usable = |l: &&&NodeLine| {
            !l.has_flag("fail")
                && !l.has_flag("fail?")
                && self
                    .nodes
                    .iter()
                    .any(|n| n.server.port() == l.port && n.is_live())
        };
        replicas
            .iter()
            .find(usable)
            .or_else(|| replicas.first())
            .map(|l| l.port)
            .unwrap_or_else(|| {
                panic!(
                    "node {} knows no replica of {master_port}\n{}",
                    view.from,
                    self.logs()
                )
            })
    }

    /// `CLUSTER FAILOVER` on the replica on `replica_port` (a coordinated manual failover: it
    /// first catches up with its master, so nothing is lost), after waiting for its
    /// `master_link_status:up`. Returns once every live node agrees that it is a master and owns
    /// its old master's slots, and the old master, if live, is its replica. Panics after 15 s
    /// per step.
    pub fn failover(&self, replica_port: u16) {
        let i = self.index_of_port(replica_port);
        assert!(
            self.is_live(i),
            "failover: node {i} ({replica_port}) is not live"
        );
        let old_master = self.wait(
            &format!("replica {replica_port}'s link to its master"),
            FAILOVER_TIMEOUT,
            || {
                let info = replication_info(replica_port)?;
                let master = info.get("master_port").and_then(|p| p.parse::<u16>().ok());
                match (info.get("role").map(String::as_str), master) {
                    (Some("slave"), Some(master))
                        if info.get("master_link_status").map(String::as_str) == Some("up") =>
                    {
                        Ok(master)
                    }
                    (role, _) => Err(format!(
                        "node {replica_port}: role {role:?}, master_link_status {:?}",
                        info.get("master_link_status")
                    )),
                }
            },
        );
        let moving: Vec<usize> = cluster_nodes(replica_port)
            .map(|v| v.owners())
            .unwrap_or_else(|e| panic!("failover: {e}\n{}", self.logs()))
            .iter()
            .enumerate()
            .filter(|(_, &p)| p == old_master)
            .map(|(slot, _)| slot)
            .collect();
        let old_live = self
            .nodes
            .iter()
            .any(|n| n.server.port() == old_master && n.is_live());
        self.must(&format!("CLUSTER FAILOVER on {replica_port}"), || {
            cluster_ok(replica_port, &["FAILOVER"])
        });
        self.wait(
            &format!("replica {replica_port} to take over from {old_master}"),
            FAILOVER_TIMEOUT,
            || {
                let agreed = self.agreement()?;
                if agreed.roles.get(&replica_port) != Some(&Role::Master) {
                    return Err(format!(
                        "node {replica_port} has role {:?}",
                        agreed.roles.get(&replica_port)
                    ));
                }
                if let Some(&slot) = moving.iter().find(|&&s| agreed.owners[s] != replica_port) {
                    return Err(format!(
                        "slot {slot} is owned by {}, not {replica_port}",
                        agreed.owners[slot]
                    ));
                }
                let demoted = agreed.roles.get(&old_master);
                if old_live && demoted != Some(&Role::Replica(replica_port)) {
                    return Err(format!("old master {old_master} has role {demoted:?}"));
                }
                Ok(())
            },
        );
    }

    /// SIGSTOP node `i`: it stops answering (connections stay open, nothing is lost from its
    /// socket buffers). The helpers skip it until [`ClusterSet::resume`].
    pub fn pause(&self, i: usize) {
        self.nodes[i].server.pause();
        self.nodes[i].paused.store(true, Ordering::SeqCst);
    }

    /// SIGCONT after [`ClusterSet::pause`].
    pub fn resume(&self, i: usize) {
        self.nodes[i].server.resume();
        self.nodes[i].paused.store(false, Ordering::SeqCst);
    }

    /// SIGKILL node `i` and reap it. Idempotent; the helpers skip it from then on.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].server.kill();
        self.nodes[i].paused.store(false, Ordering::SeqCst);
    }

    /// Starts node `i` again after [`ClusterSet::kill`]: same port, bus port, dir and
    /// arguments, so it comes back with its `nodes.conf` (its id and its last view). A master
    /// whose replica took over meanwhile learns of the higher epoch from the others and turns
    /// into that replica's replica (empty, without persistence, until it syncs). Does not wait
    /// for that: use [`ClusterSet::wait_ok`].
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].server.restart();
        self.nodes[i].paused.store(false, Ordering::SeqCst);
    }

    /// Whether node `i` is paused ([`ClusterSet::pause`] without a resume since).
    pub fn is_paused(&self, i: usize) -> bool {
        self.nodes[i].paused.load(Ordering::SeqCst)
    }

    /// Whether node `i`'s process is gone ([`ClusterSet::kill`]).
    pub fn is_killed(&self, i: usize) -> bool {
        !self.nodes[i].server.is_running()
    }

    /// Whether node `i` runs and is not paused: the helpers ask only such nodes.
    pub fn is_live(&self, i: usize) -> bool {
        self.nodes[i].is_live()
    }

    /// Indexes of the live nodes.
    pub fn live_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.is_live(i)).collect()
    }

    /// Waits until the live nodes agree (module doc) that `slot` is owned by a node other than
    /// `from_port`; returns that node's port. Panics after `timeout`.
    pub fn wait_for_owner_change(&self, slot: u16, from_port: u16, timeout: Duration) -> u16 {
        self.wait(
            &format!("slot {slot} to move away from {from_port}"),
            timeout,
            || {
                let agreed = self.agreement()?;
                match agreed.owners[usize::from(slot)] {
                    p if p == from_port => Err(format!("slot {slot} still owned by {from_port}")),
                    0 => Err(format!("slot {slot} unassigned")),
                    p => Ok(p),
                }
            },
        )
    }

    /// Waits until the live nodes agree (module doc), every live replica's link to its master is
    /// up, and no live node flags another live one `fail`/`pfail`. Panics after `timeout`.
    pub fn wait_ok(&self, timeout: Duration) {
        self.wait("the cluster to settle", timeout, || {
            self.settled().map(|_| ())
        });
    }

    /// Starts moving `slot` from its current owner to the master on `to_port`:
    /// `CLUSTER SETSLOT <slot> IMPORTING <source-id>` on the target, then `MIGRATING
    /// <target-id>` on the source. Keys then move with [`ClusterSet::migrate_key`] and
    /// [`ClusterSet::migrate_rest`]; [`ClusterSet::finish_migration`] ends it.
    pub fn begin_migration(&self, slot: u16, to_port: u16) {
        assert!(slot < SLOTS, "slot {slot} is out of range");
        let source_port = self.master_of_slot(slot);
        assert_ne!(
            source_port, to_port,
            "slot {slot} is owned by {to_port} already"
        );
        let (source, target) = (self.index_of_port(source_port), self.index_of_port(to_port));
        {
            let mut migrations = self.migrations();
            if let Some(m) = migrations.get(&slot) {
                panic!("slot {slot} is being migrated already: {m:?}");
            }
            migrations.insert(slot, Migration { source, target });
        }
        let slot_text = slot.to_string();
        self.must(&format!("begin migration of slot {slot}"), || {
            cluster_ok(
                to_port,
                &["SETSLOT", &slot_text, "IMPORTING", &self.nodes[source].id],
            )?;
            cluster_ok(
                source_port,
                &["SETSLOT", &slot_text, "MIGRATING", &self.nodes[target].id],
            )
        });
    }

    /// `MIGRATE 127.0.0.1 <target> <key> 0 5000 REPLACE` on the source of `slot`'s migration
    /// (begun with [`ClusterSet::begin_migration`]): moves that one key now. A key the source
    /// does not have (`NOKEY`) is fine.
    pub fn migrate_key(&self, slot: u16, key: &str) {
        assert_eq!(
            Self::slot_of(key),
            slot,
            "key {key:?} is not in slot {slot}"
        );
        let m = self.migration(slot);
        let (source, target) = (self.port_of(m.source), self.port_of(m.target));
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg("127.0.0.1")
            .arg(target)
            .arg(key)
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("REPLACE");
        self.must(
            &format!("MIGRATE {key:?} to {target}"),
            || match query_string(source, &cmd, "MIGRATE")?.as_str() {
                "OK" | "NOKEY" => Ok(()),
                other => Err(format!("node {source}: MIGRATE answered {other:?}")),
            },
        );
    }

    /// Moves every key of `slot` still on the source to the target: `CLUSTER GETKEYSINSLOT`
    /// and `MIGRATE ... REPLACE KEYS` in batches of 100, until the source has none (at most
    /// 1000 batches and 30 s).
    pub fn migrate_rest(&self, slot: u16) {
        let m = self.migration(slot);
        let (source, target) = (self.port_of(m.source), self.port_of(m.target));
        let deadline = Instant::now() + MIGRATE_REST_TIMEOUT;
        for _ in 0..MIGRATE_REST_ROUNDS {
            let keys: Vec<String> = self.must("CLUSTER GETKEYSINSLOT", || {
                let mut con = probe(source)?;
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(MIGRATE_BATCH)
                    .query(&mut con)
                    .map_err(|e| format!("node {source}: CLUSTER GETKEYSINSLOT {slot}: {e}"))
            });
            if keys.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "slot {slot}: keys left on {source} after {MIGRATE_REST_TIMEOUT:?}\n{}",
                self.logs()
            );
            let mut cmd = redis::cmd("MIGRATE");
            cmd.arg("127.0.0.1")
                .arg(target)
                .arg("")
                .arg(0)
                .arg(MIGRATE_TIMEOUT_MS)
                .arg("REPLACE")
                .arg("KEYS")
                .arg(&keys);
            self.must(
                &format!("MIGRATE {} keys to {target}", keys.len()),
                || match query_string(source, &cmd, "MIGRATE")?.as_str() {
                    "OK" | "NOKEY" => Ok(()),
                    other => Err(format!("node {source}: MIGRATE answered {other:?}")),
                },
            );
        }
        panic!(
            "slot {slot}: keys left on {source} after {MIGRATE_REST_ROUNDS} batches\n{}",
            self.logs()
        );
    }

    /// Ends `slot`'s migration: `CLUSTER SETSLOT <slot> NODE <target-id>` on the target, the
    /// source, then every other live master; returns once every live node agrees that the
    /// target owns it (15 s at most). The source must hold no key of the slot any more
    /// ([`ClusterSet::migrate_rest`]).
    pub fn finish_migration(&self, slot: u16) {
        let m = self.migration(slot);
        let target_port = self.port_of(m.target);
        let target_id = self.nodes[m.target].id.clone();
        let slot_text = slot.to_string();
        let args = ["SETSLOT", slot_text.as_str(), "NODE", target_id.as_str()];
        self.must(&format!("finish migration of slot {slot}"), || {
            cluster_ok(target_port, &args)?;
            cluster_ok(self.port_of(m.source), &args)
        });
        let others: Vec<u16> = self
            .master_ports()
            .into_iter()
            .filter(|&p| p != target_port && p != self.port_of(m.source))
            .filter(|&p| self.is_live(self.index_of_port(p)))
            .collect();
        for port in others {
            self.must(&format!("SETSLOT {slot} NODE on {port}"), || {
                cluster_ok(port, &args)
            });
        }
        self.migrations().remove(&slot);
        self.wait(
            &format!("every node to agree that {target_port} owns slot {slot}"),
            AGREE_TIMEOUT,
            || {
                let agreed = self.agreement()?;
                match agreed.owners[usize::from(slot)] {
                    p if p == target_port => Ok(()),
                    p => Err(format!("slot {slot} owned by {p}")),
                }
            },
        );
    }

    /// The last lines of every node's log, each headed by its index, ports, role (as a live
    /// node says) and state (live, paused, killed): for panic messages.
    pub fn logs(&self) -> String {
        let view = self.any_view().ok();
        let mut out = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let port = node.server.port();
            let role = match view.as_ref().and_then(|v| v.by_port(port).map(|l| (v, l))) {
                Some((v, line)) => match v.role(line) {
                    Role::Master if line.slots.is_empty() => "master without slots".to_owned(),
                    Role::Master => "master".to_owned(),
                    Role::Replica(m) => format!("replica of {m}"),
                },
                None => "role unknown".to_owned(),
            };
            let state = if self.is_killed(i) {
                "killed"
            } else if self.is_paused(i) {
                "paused"
            } else {
                "live"
            };
            let dir = node.server.dir();
            let log = read_from(&dir.join("redis.log"), 0);
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
            let _ = writeln!(
                out,
                "--- node {i}, port {port}, bus {}, {role}, {state} ({}/redis.log, last \
                 {LOG_TAIL_LINES} lines) ---\n{tail}",
                node.bus_port,
                dir.display()
            );
            let stdio = read_from(&dir.join("redis.stdio"), 0);
            if !stdio.trim().is_empty() {
                let _ = writeln!(out, "--- node {i} stdout/stderr ---\n{stdio}");
            }
        }
        out
    }

    // -- internals ----------------------------------------------------------

    fn migrations(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Migration>> {
        lock(&self.migrations)
    }

    fn migration(&self, slot: u16) -> Migration {
        self.migrations()
            .get(&slot)
            .copied()
            .unwrap_or_else(|| panic!("slot {slot} is not being migrated: begin_migration first"))
    }

    /// `CLUSTER NODES` of the first live node that answers.
    fn any_view(&self) -> Result<View, String> {
        let mut reasons = Vec::new();
        for i in self.live_nodes() {
            match cluster_nodes(self.port_of(i)) {
                Ok(view) => return Ok(view),
                Err(why) => reasons.push(why),
            }
        }
        if reasons.is_empty() {
            reasons.push("no live node".to_owned());
        }
        Err(reasons.join("; "))
    }

    fn view_or_panic(&self) -> View {
        self.any_view()
            .unwrap_or_else(|why| panic!("no live cluster node answered: {why}\n{}", self.logs()))
    }

    /// `step()` once; panics with the logs if it fails.
    fn must<T>(&self, what: &str, step: impl FnOnce() -> Result<T, String>) -> T {
        step().unwrap_or_else(|why| panic!("{what}: {why}\n{}", self.logs()))
    }

    /// [`poll`] that panics with the logs on timeout.
    fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> Result<T, String>,
    ) -> T {
        poll(timeout, check).unwrap_or_else(|why| {
            panic!(
                "timed out after {timeout:?} waiting for {what}: {why}\n{}",
                self.logs()
            )
        })
    }

    /// Every node lists every node, with its address, past the handshake.
    fn all_known(&self) -> Result<(), String> {
        for node in &self.nodes {
            let view = cluster_nodes(node.server.port())?;
            for other in &self.nodes {
                let line = view.by_id(&other.id).ok_or_else(|| {
                    format!(
                        "node {} does not know node {} yet",
                        view.from,
                        other.server.port()
                    )
                })?;
                if line.port != other.server.port()
                    || line.has_flag("handshake")
                    || line.has_flag("noaddr")
                {
                    return Err(format!(
                        "node {} lists {} as port {} with flags {:?}",
                        view.from,
                        other.server.port(),
                        line.port,
                        line.flags
                    ));
                }
            }
        }
        Ok(())
    }

    /// The live nodes' agreement (module doc), or why there is none.
    fn agreement(&self) -> Result<Agreed, String> {
        let live = self.live_nodes();
        if live.is_empty() {
            return Err("no live node".to_owned());
        }
        let mut agreed: Option<Agreed> = None;
        for &i in &live {
            let port = self.port_of(i);
            let info = cluster_info(port)?;
            let state = info.get("cluster_state").map(String::as_str);
            if state != Some("ok") {
                return Err(format!("node {port}: cluster_state {state:?}"));
            }
            let view = cluster_nodes(port)?;
            let mut roles = BTreeMap::new();
            for &j in &live {
                let node = &self.nodes[j];
                let line = view.by_id(&node.id).ok_or_else(|| {
                    format!("node {port} does not know node {}", node.server.port())
                })?;
                if line.port != node.server.port() || line.has_flag("noaddr") {
                    return Err(format!(
                        "node {port} lists node {} at port {}",
                        node.server.port(),
                        line.port
                    ));
                }
                roles.insert(node.server.port(), view.role(line));
            }
            let owners = view.owners();
            match &mut agreed {
                None => {
                    agreed = Some(Agreed {
                        owners,
                        roles,
                        views: vec![view],
                    })
                }
                Some(first) => {
                    let other = first.views[0].from;
                    if let Some(slot) = (0..owners.len()).find(|&s| owners[s] != first.owners[s]) {
                        return Err(format!(
                            "node {port} says slot {slot} is owned by {}, node {other} says {}",
                            owners[slot], first.owners[slot]
                        ));
                    }
                    if roles != first.roles {
                        return Err(format!(
                            "node {port} sees roles {roles:?}, node {other} sees {:?}",
                            first.roles
                        ));
                    }
                    first.views.push(view);
                }
            }
        }
        agreed.ok_or_else(|| "no live node".to_owned())
    }

    /// [`ClusterSet::agreement`], every live replica's link up to the master it is listed
    /// under, and no live node flagged `fail`/`pfail` by a live node.
    fn settled(&self) -> Result<Agreed, String> {
        let agreed = self.agreement()?;
        for view in &agreed.views {
            for &port in agreed.roles.keys() {
                let line = view
                    .by_port(port)
                    .ok_or_else(|| format!("node {} does not list {port}", view.from))?;
                if line.has_flag("fail") || line.has_flag("fail?") {
                    return Err(format!("node {} flags {port} {:?}", view.from, line.flags));
                }
            }
        }
        for (&port, role) in &agreed.roles {
            if let Role::Replica(master) = *role {
                let info = replication_info(port)?;
                let (to, link) = (
                    info.get("master_port").and_then(|p| p.parse::<u16>().ok()),
                    info.get("master_link_status").map(String::as_str),
                );
                if to != Some(master) || link != Some("up") {
                    return Err(format!(
                        "replica {port}: master_port {to:?}, master_link_status {link:?} \
                         (want {master}, up)"
                    ));
                }
            }
        }
        Ok(agreed)
    }
}

/// [`poll_until`](super::poll_until) every [`POLL`].
fn poll<T>(timeout: Duration, check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    super::poll_until(timeout, POLL, check)
}
