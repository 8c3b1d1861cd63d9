//! Real network partitions between processes on one machine, with Linux network namespaces.
//!
//! A [`Network`] is a set of namespaces, one per node, each with one interface (`eth0`, one end
//! of a veth pair) and an address `10.213.0.N/24`; the other ends are ports of a bridge (`br0`)
//! in a namespace of the network's own, the hub. The root namespace is not touched at all: no
//! interface, address or route is added to it, so the addresses cannot clash with the
//! machine's, nor with another test's network (every network has a hub of its own).
//!
//! ```text
//!   node 1 (10.213.0.1)   node 2 (10.213.0.2)   ...     hub: br0 (10.213.0.254, forwarding off)
//!        eth0 ───── v1 ─┐      eth0 ───── v2 ─┐         every vN a port of br0
//! ```
//!
//! Processes run inside a node: [`Network::command`] wraps a program in `ip netns exec`, so a
//! worker process (the test binary started again) or a `redis-server` ([`NsRedis`], bound to the
//! node's address) has that node's network and no other. The test process itself stays in the
//! root namespace; [`Node::run`] runs a closure on a thread that entered the node's namespace,
//! and sockets made there stay in it, so the test reaches a server for its own checks from the
//! server's own node, whatever the partition.
//!
//! **Cuts are silent drops.** [`Network::cut`] adds, in each of the two nodes, a host route to
//! the other through the hub's address. The hub does not forward (`ip_forward` 0, checked), and
//! a host that does not forward drops such packets without an ICMP error; ARP still works, so
//! neither side hears anything: a connected socket's writes are buffered and retransmitted, its
//! reads time out, and a new connection's SYN goes unanswered until the caller's timeout. Packets
//! of other pairs pass as before. [`Network::heal`] deletes the two routes; TCP's retransmissions
//! then deliver what was buffered, as after a real partition. Only `ip` (iproute2) is needed: no
//! packet filter, no `tc` actions.
//!
//! **Clean-up.** Names carry the test process's pid (`fl<pid>-<n>-<node>`), so parallel tests
//! and runs cannot collide. Dropping a [`Network`] deletes its namespaces (and with them every
//! veth and the bridge), also when the test panics; [`NsRedis`] and the test's workers kill
//! their processes on drop, and are dropped before the network when declared after it. A
//! network also deletes, when made, the namespaces of earlier runs whose process no longer
//! exists, and kills what still runs in them: a run killed by SIGKILL cannot clean up (its
//! workers exit as their stdin closes, its redis-servers do not).
//!
//! Needs Linux, root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), and `ip`: a missing tool or a missing
//! permission fails the test with what to install or how to run it, never a skip.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{self, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use super::{kill_and_reap, poll_until, unique_temp_dir};

const IP_HINT: &str = "the partition tests need `ip` from iproute2: \
     `sudo apt-get install -y iproute2` on Debian/Ubuntu";
const ROOT_HINT: &str = "the partition tests make network namespaces and veth pairs: run them \
     as root (or with CAP_NET_ADMIN and CAP_SYS_ADMIN), as CI does";
/// The hub's address on the bridge: the gateway of every cut, which drops what it gets.
const SINK: &str = "10.213.0.254";
/// How long one `ip` command may take.
const IP_TIMEOUT: Duration = Duration::from_secs(10);

static NETWORKS: AtomicU64 = AtomicU64::new(0);

/// Runs `ip args`, bounded by [`IP_TIMEOUT`]; `Ok` has its stdout, `Err` its stderr.
fn ip(args: &[&str]) -> Result<String, String> {
    ip_with_input(args, "")
}

/// Runs `ip args` with `input` on its stdin (`-batch -` reads its commands there).
fn ip_with_input(args: &[&str], input: &str) -> Result<String, String> {
    let mut child = Command::new("ip")
        .args(args)
        .stdin(if input.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                format!("`ip` not found: {IP_HINT}")
            } else {
                format!("cannot run `ip`: {e} ({IP_HINT})")
            }
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A few hundred bytes: the pipe takes them whole, whatever `ip` does.
        let _ = io::Write::write_all(&mut stdin, input.as_bytes());
    }
    let deadline = Instant::now() + IP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut stderr) = child.stderr.take() {
                    let _ = io::Read::read_to_string(&mut stderr, &mut err);
                }
                // Small outputs (a few lines): the pipe held them until now.
                let mut out = String::new();
                if let Some(mut stdout) = child.stdout.take() {
                    let _ = io::Read::read_to_string(&mut stdout, &mut out);
                }
                return if status.success() {
                    Ok(out)
                } else {
                    Err(format!("`ip {}`: {status}: {}", args.join(" "), err.trim()))
                };
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`ip {}` still running after {IP_TIMEOUT:?}",
                    args.join(" ")
                ));
            }
            Ok(None) => thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(format!("`ip {}`: {e}", args.join(" "))),
        }
    }
}

/// [`ip`], panicking with the hints on failure.
fn ip_or_panic(args: &[&str]) {
    ip_input_or_panic(args, "");
}

/// [`ip_with_input`], panicking with the hints on failure.
fn ip_input_or_panic(args: &[&str], input: &str) {
    if let Err(e) = ip_with_input(args, input) {
        let hint = if e.contains("not permitted") || e.contains("Permission denied") {
            ROOT_HINT
        } else {
            ""
        };
        panic!("{e}\n{hint}");
    }
}

/// Deletes the namespaces that earlier test processes (pid no longer running) left behind, and
/// kills the processes still running in them.
fn remove_leftovers() {
    let Ok(entries) = fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("fl")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            // The processes that run on in it (a redis-server of a killed test): without them
            // the namespace goes away with its name.
            let pids = ip(&["netns", "pids", &name]).unwrap_or_default();
            for pid in pids
                .lines()
                .filter_map(|p| p.trim().parse::<libc::pid_t>().ok())
            {
                if pid > 0 {
                    // SAFETY: kill(2) on a process inside a namespace this test suite made for a
                    // run that is gone; it touches no memory of ours.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// One node of a [`Network`]: a namespace with one address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    /// The node's name in the test ("m0", "client-1").
    pub name: String,
    /// The namespace's name (`fl<pid>-<n>-<name>`).
    pub netns: String,
    /// The last byte of its address.
    index: u8,
}

impl Node {
    /// `10.213.0.N`.
    pub fn addr(&self) -> String {
        format!("10.213.0.{}", self.index)
    }

    /// Runs `f` on a thread inside this node's namespace and returns what it returns. Sockets
    /// made in `f` stay in the namespace wherever they are used later; threads spawned in it
    /// start in it too.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.netns);
        thread::scope(|s| {
            s.spawn(|| {
                enter(&path).unwrap_or_else(|e| panic!("cannot enter {path}: {e}\n{ROOT_HINT}"));
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

/// Moves the calling thread into the network namespace at `path` (setns(2); the thread only).
fn enter(path: &str) -> io::Result<()> {
    let file = fs::File::open(path)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: setns(2) takes an open file descriptor, which `file` keeps open for the call, and
    // a flag; it changes the calling thread's network namespace and touches no memory of ours.
    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Namespaces joined by a bridge, with cuts between chosen nodes. See the module docs.
pub struct Network {
    prefix: String,
    hub: String,
    nodes: Vec<Node>,
    /// The pairs cut now, each (lower index, higher index).
    cuts: Mutex<BTreeSet<(u8, u8)>>,
}

impl Network {
    /// A network of nodes named `names`, every one reaching every other.
    pub fn new(names: &[&str]) -> Network {
        assert!(names.len() < 250, "at most 249 nodes");
        remove_leftovers();
        let n = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("fl{}-{n}", process::id());
        let hub = format!("{prefix}-hub");
        // From here on, dropping `network` deletes whatever was made, also on a panic.
        let mut network = Network {
            prefix,
            hub: hub.clone(),
            nodes: Vec::new(),
            cuts: Mutex::new(BTreeSet::new()),
        };
        ip_or_panic(&["netns", "add", &hub]);
        ip_or_panic(&["-n", &hub, "link", "add", "name", "br0", "type", "bridge"]);
        ip_or_panic(&[
            "-n",
            &hub,
            "addr",
            "add",
            &format!("{SINK}/24"),
            "dev",
            "br0",
        ]);
        ip_or_panic(&["-n", &hub, "link", "set", "br0", "up"]);
        let hub_node = Node {
            name: "hub".to_owned(),
            netns: hub.clone(),
            index: 254,
        };
        // The hub must drop what a cut routes to it, not forward it: a new namespace starts
        // with forwarding off, unless the host makes it inherit the root namespace's.
        hub_node.run(|| {
            let path = "/proc/sys/net/ipv4/ip_forward";
            fs::write(path, "0").unwrap_or_else(|e| panic!("writing {path} in the hub: {e}"));
            let now = fs::read_to_string(path).unwrap_or_default();
            assert_eq!(
                now.trim(),
                "0",
                "the hub forwards packets: cuts would not cut"
            );
        });
        for (i, name) in names.iter().enumerate() {
            let index = u8::try_from(i + 1).expect("fewer than 250 nodes");
            let netns = format!("{}-{name}", network.prefix);
            ip_or_panic(&["netns", "add", &netns]);
            network.nodes.push(Node {
                name: (*name).to_owned(),
                netns: netns.clone(),
                index,
            });
            let port = format!("v{index}");
            ip_or_panic(&[
                "-n", &hub, "link", "add", "name", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &netns,
            ]);
            ip_or_panic(&["-n", &hub, "link", "set", &port, "master", "br0", "up"]);
            let addr = format!("10.213.0.{index}/24");
            ip_or_panic(&["-n", &netns, "addr", "add", &addr, "dev", "eth0"]);
            ip_or_panic(&["-n", &netns, "link", "set", "eth0", "up"]);
            ip_or_panic(&["-n", &netns, "link", "set", "lo", "up"]);
        }
        network
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name:?} in the network"))
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// `program` to be run inside `node`'s namespace (`ip netns exec`, which then runs it in its
    /// own place: the child's pid is the program's).
    pub fn command(&self, node: &Node, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &node.netns]).arg(program);
        cmd
    }

    fn pair(a: &Node, b: &Node) -> (u8, u8) {
        (a.index.min(b.index), a.index.max(b.index))
    }

    /// Cuts `a` from `b`, both ways: their packets to each other are dropped silently from now
    /// on. Cutting a pair already cut does nothing.
    pub fn cut(&self, a: &Node, b: &Node) {
        self.split(&[a], &[b]);
    }

    /// Cuts every node of `side` from every node of `other`, with one `ip` call per node
    /// (about 5 ms each), the routes of a node added at once.
    pub fn split(&self, side: &[&Node], other: &[&Node]) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|p| p.into_inner());
        let mut pairs = Vec::new();
        for a in side {
            for b in other {
                assert_ne!(a, b, "a node cannot be cut from itself");
                if cuts.insert(Self::pair(a, b)) {
                    pairs.push(((*a).clone(), (*b).clone()));
                }
            }
        }
        self.routes("add", &pairs);
    }

    /// Heals the cut between `a` and `b`, if there is one.
    pub fn heal(&self, a: &Node, b: &Node) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|p| p.into_inner());
        if cuts.remove(&Self::pair(a, b)) {
            self.routes("del", &[(a.clone(), b.clone())]);
        }
    }

    /// Heals every cut.
    pub fn heal_all(&self) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|p| p.into_inner());
        let pairs: Vec<(Node, Node)> = cuts
            .iter()
            .map(|&(a, b)| (self.by_index(a).clone(), self.by_index(b).clone()))
            .collect();
        cuts.clear();
        self.routes("del", &pairs);
    }

    /// Adds or deletes (`op`) the routes of the cuts between `pairs`, both ways.
    fn routes(&self, op: &str, pairs: &[(Node, Node)]) {
        let mut per_node: BTreeMap<&str, String> = BTreeMap::new();
        for (a, b) in pairs {
            for (from, to) in [(a, b), (b, a)] {
                let batch = per_node.entry(from.netns.as_str()).or_default();
                batch.push_str(&format!("route {op} {}/32 via {SINK}\n", to.addr()));
            }
        }
        for (netns, batch) in per_node {
            ip_input_or_panic(&["-n", netns, "-batch", "-"], &batch);
        }
    }

    /// How many pairs are cut now.
    pub fn cuts(&self) -> usize {
        self.cuts.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn by_index(&self, index: u8) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.index == index)
            .expect("a node of this network")
    }
}

impl Drop for Network {
    /// Deletes every namespace of the network (their veths and the bridge go with them). Never
    /// panics.
    fn drop(&mut self) {
        for node in &self.nodes {
            let _ = ip(&["netns", "del", &node.netns]);
        }
        let _ = ip(&["netns", "del", &self.hub]);
    }
}

/// A `redis-server` (a data server, or a sentinel) inside a node, listening on the node's
/// address, port 6379 (a sentinel 26379; each namespace has ports of its own), with a temp dir of
/// its own; killed, reaped and its dir removed on drop.
pub struct NsRedis {
    child: Option<process::Child>,
    node: Node,
    port: u16,
    dir: PathBuf,
}

impl NsRedis {
    pub const PORT: u16 = 6379;
    pub const SENTINEL_PORT: u16 = 26379;

    /// Starts a data server with `extra_args` appended, and returns once it answers PING from
    /// its node.
    pub fn start(network: &Network, node: &Node, extra_args: &[&str]) -> NsRedis {
        let dir = unique_temp_dir("fencelock-netns-redis");
        let mut args: Vec<std::ffi::OsString> = vec![
            "--bind".into(),
            node.addr().into(),
            "--port".into(),
            Self::PORT.to_string().into(),
            "--dir".into(),
            dir.clone().into(),
            "--logfile".into(),
            dir.join("redis.log").into(),
        ];
        // Clients come from other addresses than loopback, and there is no password.
        for arg in [
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ] {
            args.push(arg.into());
        }
        args.extend(extra_args.iter().map(|a| a.into()));
        Self::spawn(network, node, Self::PORT, dir, args)
    }

    /// A replica of `master` (`--replicaof`, with diskless syncs that start at once).
    pub fn start_replica(network: &Network, node: &Node, master: &NsRedis) -> NsRedis {
        let port = master.port.to_string();
        Self::start(
            network,
            node,
            &[
                "--replicaof",
                &master.node.addr(),
                &port,
                "--repl-diskless-sync-delay",
                "0",
            ],
        )
    }

    /// A sentinel in `node` that monitors `master` as `name`, with `config` (`sentinel ...`
    /// lines: quorum, timeouts) after the monitor line.
    pub fn start_sentinel(
        network: &Network,
        node: &Node,
        master: &NsRedis,
        name: &str,
        quorum: u32,
        config: &str,
    ) -> NsRedis {
        let dir = unique_temp_dir("fencelock-netns-sentinel");
        let conf = dir.join("sentinel.conf");
        // Sentinel rewrites its config file: it lives in the sentinel's own dir.
        let text = format!(
            "port {}\nbind {}\nprotected-mode no\ndaemonize no\ndir {}\nlogfile {}\n\
             sentinel monitor {name} {} {} {quorum}\n{config}\n",
            Self::SENTINEL_PORT,
            node.addr(),
            dir.display(),
            dir.join("redis.log").display(),
            master.node.addr(),
            master.port,
        );
        fs::write(&conf, text).unwrap_or_else(|e| panic!("writing {}: {e}", conf.display()));
        Self::spawn(
            network,
            node,
            Self::SENTINEL_PORT,
            dir,
            vec![conf.into(), "--sentinel".into()],
        )
    }

    fn spawn(
        network: &Network,
        node: &Node,
        port: u16,
        dir: PathBuf,
        args: Vec<std::ffi::OsString>,
    ) -> NsRedis {
        let bin = std::env::var_os("REDIS_SERVER_BIN")
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| "redis-server".into());
        let stdio = fs::File::create(dir.join("redis.stdio"))
            .unwrap_or_else(|e| panic!("cannot create a log file in {}: {e}", dir.display()));
        let mut cmd = network.command(node, &bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(stdio.try_clone().expect("a file handle"))
            .stderr(stdio);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server in {}: {e}\n{IP_HINT}",
                node.netns
            )
        });
        let mut server = NsRedis {
            child: Some(child),
            node: node.clone(),
            port,
            dir,
        };
        let ready = poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
            if let Some(child) = server.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Ok(Err(format!("exited: {status}")));
                }
            }
            server
                .try_connection(Duration::from_millis(500))
                .and_then(|mut con| {
                    redis::cmd("PING")
                        .query::<String>(&mut con)
                        .map_err(|e| e.to_string())
                })
                .map(Ok)
        });
        match ready {
            Ok(Ok(_)) => server,
            Ok(Err(why)) | Err(why) => panic!(
                "redis-server in {} did not answer PING: {why}\n{}",
                node.netns,
                server.logs()
            ),
        }
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// `redis://10.213.0.N:PORT/`
    pub fn url(&self) -> String {
        format!("redis://{}:{}/", self.node.addr(), self.port)
    }

    /// `10.213.0.N:PORT`
    pub fn host(&self) -> String {
        format!("{}:{}", self.node.addr(), self.port)
    }

    fn try_connection(&self, timeout: Duration) -> Result<redis::Connection, String> {
        let url = self.url();
        self.node.run(|| {
            let con = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(timeout))
                .map_err(|e| format!("{url}: {e}"))?;
            con.set_read_timeout(Some(timeout))
                .and_then(|()| con.set_write_timeout(Some(timeout)))
                .map_err(|e| e.to_string())?;
            Ok(con)
        })
    }

    /// A connection for the test's own checks, made from the server's own node (so no cut
    /// stands between them), with 5 s timeouts.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("a connection to the server in {}: {e}", self.node.netns))
    }

    /// Its log, for messages.
    pub fn logs(&self) -> String {
        let log = fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let stdio = fs::read_to_string(self.dir.join("redis.stdio")).unwrap_or_default();
        format!("--- redis.log ---\n{log}--- stdout/stderr ---\n{stdio}")
    }
}

impl Drop for NsRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
