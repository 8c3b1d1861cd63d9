//! A real-process Redis Sentinel set-up on 127.0.0.1: one master, some replicas and three
//! sentinels, every process a child of the test with its own temp dir, killed and reaped on drop.
//!
//! Sentinel configuration: quorum 2, `down-after-milliseconds 1000`, `failover-timeout 5000`,
//! `parallel-syncs 1`. Measured on a 2-core machine with Redis 7.0.15: `SENTINEL FAILOVER` to
//! the new address about 1.1 s, SIGSTOP of the master to the new address about 3.1 s, and a
//! live old master (demoted, or resumed after SIGCONT) a synced replica about 10 s later.
//!
//! Data servers get `--repl-diskless-sync-delay 0` (before `server_args`, which may override
//! it): Redis 7's default waits 5 s before every full sync, which held up the start and every
//! rejoin of an old master.
//!
//! Replicas are started as plain servers and then told `REPLICAOF 127.0.0.1 <master>` (not
//! `--replicaof` on the command line): [`RedisServer::restart`] reuses the start arguments,
//! so a `--replicaof` argument would make a restarted server that Sentinel has since promoted
//! come back replicating from its own replica. A restarted server therefore comes back as an
//! (empty, unless persistence is in `server_args`) master; [`SentinelSet::restart_server`]
//! points it at the current master again, or Sentinel converts it itself (`+convert-to-slave`,
//! about 10 s later: Sentinel's `INFO` period for replicas is 10 s and it acts only 8 s after it
//! saw the role change).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{self, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use super::{
    file_len, free_port, kill_and_reap, lock, read_from, redis_bin, signal_if_alive,
    unique_temp_dir, wait_ready, Readiness, RedisServer, INSTALL_HINT, START_TRIES,
};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// Sentinels that must agree that the master is down before a failover.
const QUORUM: u32 = 2;
/// Sentinels in a set.
const SENTINELS: usize = 3;
/// `sentinel down-after-milliseconds`.
const DOWN_AFTER_MS: u64 = 1000;
/// `sentinel failover-timeout`. Sentinel waits twice this after a failover attempt of a master
/// before it tries again on its own, but a completed failover resets that clock
/// (`sentinelResetMaster`), and `SENTINEL FAILOVER` ignores it: three forced failovers in a row
/// worked here. It also bounds the reconfiguration of the other replicas.
const FAILOVER_TIMEOUT_MS: u64 = 5000;

/// How long [`SentinelSet::start`] may take to reach its ready state (after the processes run).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`SentinelSet::failover`] retries `-INPROG` / `-NOGOODSLAVE`.
const FAILOVER_RETRY: Duration = Duration::from_secs(20);
/// How long [`SentinelSet::failover`] waits for the switch once a sentinel accepted.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(15);
/// Poll interval of the wait loops.
const POLL: Duration = Duration::from_millis(50);
/// Connect/read/write timeout of the probes (a paused process must not hang a wait loop).
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Log lines per process in panic messages.
const LOG_TAIL_LINES: usize = 25;

// ---------------------------------------------------------------------------
// One sentinel process
// ---------------------------------------------------------------------------

/// A `redis-server <dir>/sentinel.conf --sentinel` child process. Its log is
/// `<dir>/redis.log` (the name the shared readiness check looks at), early fatal errors go to
/// `<dir>/redis.stdio`; Sentinel rewrites `<dir>/sentinel.conf` as it learns the topology.
struct Sentinel {
    /// `None` once killed (and reaped).
    child: Mutex<Option<process::Child>>,
    port: u16,
    dir: PathBuf,
    /// Whether it is SIGSTOPped (by [`SentinelSet::pause_sentinel`]).
    paused: AtomicBool,
}

impl Sentinel {
    /// Starts a sentinel monitoring `127.0.0.1:master_port` on a free port (retrying on a port
    /// taken between `free_port` and the bind) and waits until it answers PING as itself.
    fn start(master_port: u16) -> Sentinel {
        let bin = redis_bin();
        let dir = unique_temp_dir("fencelock-sentinel");
        let conf = dir.join("sentinel.conf");
        let mut attempts = Vec::new();
        for _ in 0..START_TRIES {
            let port = free_port();
            // Written afresh on every try: a sentinel that started rewrote it.
            fs::write(&conf, sentinel_conf(port, &dir, master_port))
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", conf.display()));
            let log_offset = file_len(&dir.join("redis.log"));
            let mut child = match spawn_sentinel(&bin, &conf, &dir) {
                Ok(child) => child,
                Err(msg) => {
                    let _ = fs::remove_dir_all(&dir);
                    panic!("{msg}");
                }
            };
            match wait_ready(&mut child, port, &dir, log_offset) {
                Readiness::Ready => {
                    return Sentinel {
                        child: Mutex::new(Some(child)),
                        port,
                        dir,
                        paused: AtomicBool::new(false),
                    }
                }
                Readiness::PortTaken(why) => {
                    kill_and_reap(&mut child);
                    attempts.push(format!("port {port}: {why}"));
                }
                Readiness::Failed(why) => {
                    kill_and_reap(&mut child);
                    let logs = log_tail_of("sentinel", &dir);
                    let _ = fs::remove_dir_all(&dir);
                    panic!(
                        "sentinel ({} {} --sentinel) on port {port} failed to start: {why}\n{logs}",
                        bin.to_string_lossy(),
                        conf.display()
                    );
                }
            }
        }
        let logs = log_tail_of("sentinel", &dir);
        let _ = fs::remove_dir_all(&dir);
        panic!(
            "sentinel could not get a free port after {START_TRIES} tries: {attempts:#?}\n{logs}"
        );
    }

    /// Running and not paused.
    fn is_live(&self) -> bool {
        if self.paused.load(Ordering::SeqCst) {
            return false;
        }
        let mut guard = lock(&self.child);
        match guard.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn kill(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(mut child) = child {
            kill_and_reap(&mut child);
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    fn signal(&self, sig: libc::c_int) -> bool {
        let mut guard = lock(&self.child);
        match guard.as_mut() {
            Some(child) => signal_if_alive(child, sig),
            None => false,
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn sentinel_conf(port: u16, dir: &Path, master_port: u16) -> String {
    // `sentinel resolve-hostnames` and `announce-hostnames` stay at their default (no): every
    // address here is 127.0.0.1.
    format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         daemonize no\n\
         dir \"{dir}\"\n\
         logfile \"{log}\"\n\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n\
         sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n",
        dir = dir.display(),
        log = dir.join("redis.log").display(),
    )
}

fn spawn_sentinel(
    bin: &std::ffi::OsStr,
    conf: &Path,
    dir: &Path,
) -> Result<process::Child, String> {
    let stdio_path = dir.join("redis.stdio");
    let stdio = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&stdio_path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", stdio_path.display()));
    let stdio_err = stdio
        .try_clone()
        .unwrap_or_else(|e| panic!("cannot clone a file handle: {e}"));
    Command::new(bin)
        .arg(conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(stdio)
        .stderr(stdio_err)
        .spawn()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                format!(
                    "redis-server not found (tried {:?} for a sentinel; {INSTALL_HINT})",
                    bin.to_string_lossy()
                )
            } else {
                format!(
                    "cannot spawn a sentinel with {:?}: {e} ({INSTALL_HINT})",
                    bin.to_string_lossy()
                )
            }
        })
}

// ---------------------------------------------------------------------------
// Probes (short timeouts, errors as strings for the wait loops' messages)
// ---------------------------------------------------------------------------

fn connect(port: u16) -> Result<redis::Connection, String> {
    let url = format!("redis://127.0.0.1:{port}/");
    let client = redis::Client::open(url.as_str()).map_err(|e| format!("{url}: {e}"))?;
    let con = client
        .get_connection_with_timeout(PROBE_TIMEOUT)
        .map_err(|e| format!("connect {url}: {e}"))?;
    con.set_read_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    con.set_write_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| format!("set_write_timeout: {e}"))?;
    Ok(con)
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` on the sentinel at `port`: the master's port.
fn sentinel_master_port(port: u16) -> Result<u16, String> {
    let mut con = connect(port)?;
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query(&mut con)
        .map_err(|e| format!("sentinel {port}: GET-MASTER-ADDR-BY-NAME: {e}"))?;
    let (host, master) =
        addr.ok_or_else(|| format!("sentinel {port}: no master named {MASTER_NAME}"))?;
    if host != "127.0.0.1" {
        return Err(format!(
            "sentinel {port}: master at {host}:{master}, not 127.0.0.1"
        ));
    }
    Ok(master)
}

/// `SENTINEL <what> mymaster` (REPLICAS, SENTINELS): one field map per instance.
fn sentinel_instances(port: u16, what: &str) -> Result<Vec<HashMap<String, String>>, String> {
    let mut con = connect(port)?;
    redis::cmd("SENTINEL")
        .arg(what)
        .arg(MASTER_NAME)
        .query(&mut con)
        .map_err(|e| format!("sentinel {port}: SENTINEL {what}: {e}"))
}

/// Whether a `flags` field of `SENTINEL REPLICAS`/`SENTINELS` says the instance is usable.
fn flags_healthy(flags: &str) -> bool {
    !flags
        .split(',')
        .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
}

/// `INFO replication` of the server at `port`, as field -> value.
fn replication_info(port: u16) -> Result<HashMap<String, String>, String> {
    let mut con = connect(port)?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .map_err(|e| format!("server {port}: INFO replication: {e}"))?;
    Ok(info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

/// The `slaveN:` entries of a master's `INFO replication` that are `state=online`: their ports.
fn online_replica_ports(info: &HashMap<String, String>) -> Vec<u16> {
    let mut ports: Vec<u16> = info
        .iter()
        .filter(|(k, _)| {
            k.strip_prefix("slave")
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
        .filter_map(|(_, v)| {
            let fields: HashMap<&str, &str> =
                v.split(',').filter_map(|f| f.split_once('=')).collect();
            (fields.get("state") == Some(&"online"))
                .then(|| fields.get("port").and_then(|p| p.parse().ok()))
                .flatten()
        })
        .collect();
    ports.sort_unstable();
    ports
}

/// Whether the server at `port` says `role:master`.
fn is_master(port: u16) -> Result<bool, String> {
    Ok(replication_info(port)?.get("role").map(String::as_str) == Some("master"))
}

/// Calls `check` every [`POLL`] until it returns `Ok`, at most `timeout` and at most
/// `timeout / POLL + 1` times; `Err` carries the last reason it gave.
fn poll_until<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    let max_polls = timeout.as_millis() / POLL.as_millis() + 1;
    let mut last = String::from("never checked");
    for _ in 0..max_polls {
        match check() {
            Ok(value) => return Ok(value),
            Err(why) => last = why,
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        thread::sleep(POLL.min(deadline - now));
    }
    Err(last)
}

/// The last [`LOG_TAIL_LINES`] lines of `<dir>/redis.log` (and any stdout/stderr), headed by `name`.
fn log_tail_of(name: &str, dir: &Path) -> String {
    let log = read_from(&dir.join("redis.log"), 0);
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
    let mut out = format!(
        "--- {name} ({}/redis.log, last {LOG_TAIL_LINES} lines) ---\n{tail}\n",
        dir.display()
    );
    let stdio = read_from(&dir.join("redis.stdio"), 0);
    if !stdio.trim().is_empty() {
        let _ = writeln!(out, "--- {name} stdout/stderr ---\n{stdio}");
    }
    out
}

// ---------------------------------------------------------------------------
// The set
// ---------------------------------------------------------------------------

/// A master (server 0 at the start), `replicas` replicas and three sentinels, all real processes
/// on 127.0.0.1, dropped (sentinels first: SIGCONT, SIGKILL, reap) with the set.
///
/// Data servers are [`RedisServer`]s: pause, resume, kill and restart them through
/// [`SentinelSet::servers`] / [`SentinelSet::server_mut`]. The wait helpers treat a server that
/// is running as live, so resume a paused one before [`SentinelSet::wait_settled`].
pub struct SentinelSet {
    // Declared (so dropped) before the servers: no sentinel reacts to the servers' deaths.
    sentinels: Vec<Sentinel>,
    servers: Vec<RedisServer>,
}

impl SentinelSet {
    /// A master, `replicas` replicas and 3 sentinels (quorum 2, `down-after-milliseconds 1000`,
    /// `failover-timeout 5000`, `parallel-syncs 1`), each on a free 127.0.0.1 port in its own temp
    /// dir. Returns once `SENTINEL CKQUORUM mymaster` is OK on every sentinel, the master's
    /// `INFO replication` shows every replica online (`connected_slaves == replicas`), every
    /// replica's `master_link_status` is up, and every sentinel lists all replicas and the 2
    /// other sentinels, none of them down.
    pub fn start(replicas: usize) -> SentinelSet {
        Self::start_with(replicas, &[])
    }

    /// [`SentinelSet::start`] with `server_args` appended to every data server's command line
    /// (e.g. `&["--min-replicas-to-write", "1", "--min-replicas-max-lag", "2"]`; the master gets
    /// them too, because any server may become master).
    pub fn start_with(replicas: usize, server_args: &[&str]) -> SentinelSet {
        let mut set = SentinelSet {
            sentinels: Vec::new(),
            servers: Vec::new(),
        };
        // No 5 s wait before a full sync (Redis 7's default `repl-diskless-sync-delay`): it
        // would hold up the start and every rejoin of a demoted master. `server_args` can
        // override it.
        let args: Vec<&str> = ["--repl-diskless-sync-delay", "0"]
            .into_iter()
            .chain(server_args.iter().copied())
            .collect();
        // Built in place, so a panic half-way drops (kills) whatever was started already.
        set.servers.push(RedisServer::start_with(&args));
        let master_port = set.servers[0].port();
        for _ in 0..replicas {
            let replica = RedisServer::start_with(&args);
            replica_of(&replica, master_port);
            set.servers.push(replica);
        }
        // Replicas first: a sentinel learns the replicas from the master's first INFO.
        if let Err(why) = poll_until(SETTLE_TIMEOUT, || set.replication_settled(master_port)) {
            panic!(
                "sentinel set-up: replication to master {master_port} not settled within \
                 {SETTLE_TIMEOUT:?}: {why}\n{}",
                set.logs()
            );
        }
        for _ in 0..SENTINELS {
            set.sentinels.push(Sentinel::start(master_port));
        }
        if let Err(why) = poll_until(SETTLE_TIMEOUT, || set.ready(master_port)) {
            panic!(
                "sentinel set-up: not ready within {SETTLE_TIMEOUT:?}: {why}\n{}",
                set.logs()
            );
        }
        set
    }

    /// `redis://127.0.0.1:PORT/` of every sentinel, by index (killed ones included).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// Every sentinel's port, by index (killed ones included).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The data servers; index 0 was the master at the start.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Data server `i`, to kill or restart it (see also [`SentinelSet::restart_server`]).
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// The index of the data server on `port`. Panics if none is.
    pub fn server_by_port(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port() == port)
            .unwrap_or_else(|| {
                let ports: Vec<u16> = self.servers.iter().map(RedisServer::port).collect();
                panic!("no data server on port {port} (servers: {ports:?})")
            })
    }

    /// The master's port as a live sentinel reports it (`SENTINEL GET-MASTER-ADDR-BY-NAME`),
    /// asking each live (not killed, not paused) sentinel in turn until one answers. Panics if
    /// none does.
    pub fn master_port(&self) -> u16 {
        let mut errors = Vec::new();
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_live() {
                errors.push(format!("sentinel {i} (port {}): not live", sentinel.port));
                continue;
            }
            match sentinel_master_port(sentinel.port) {
                Ok(port) => return port,
                Err(why) => errors.push(format!("sentinel {i}: {why}")),
            }
        }
        panic!(
            "no live sentinel reported the master's address: {errors:#?}\n{}",
            self.logs()
        )
    }

    /// The index of the master [`SentinelSet::master_port`] reports.
    pub fn master_index(&self) -> usize {
        self.server_by_port(self.master_port())
    }

    /// `SENTINEL FAILOVER mymaster` on the first live sentinel (retrying `-INPROG` and
    /// `-NOGOODSLAVE` for up to 20 s), then [`SentinelSet::wait_for_switch`] (15 s). Returns the
    /// new master's port. The old master, if alive, stays a writable master until Sentinel
    /// reconfigures it (about 10 s): [`SentinelSet::wait_settled`] waits for that.
    pub fn failover(&self) -> u16 {
        let from = self.master_port();
        let accepted = poll_until(FAILOVER_RETRY, || {
            let (i, sentinel) = self
                .sentinels
                .iter()
                .enumerate()
                .find(|(_, s)| s.is_live())
                .ok_or_else(|| "no live sentinel".to_string())?;
            let mut con = connect(sentinel.port).map_err(|e| format!("sentinel {i}: {e}"))?;
            let reply: Result<String, redis::RedisError> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER_NAME)
                .query(&mut con);
            match reply {
                Ok(_) => Ok(Ok(())),
                Err(e) => {
                    let text = e.to_string();
                    if text.contains("INPROG") || text.contains("NOGOODSLAVE") {
                        Err(format!("sentinel {i}: SENTINEL FAILOVER: {text}"))
                    } else {
                        Ok(Err(format!("sentinel {i}: SENTINEL FAILOVER: {text}")))
                    }
                }
            }
        });
        match accepted {
            Ok(Ok(())) => {}
            Ok(Err(why)) => panic!("failover from {from} refused: {why}\n{}", self.logs()),
            Err(why) => panic!(
                "failover from {from}: no sentinel accepted SENTINEL FAILOVER within \
                 {FAILOVER_RETRY:?}: {why}\n{}",
                self.logs()
            ),
        }
        self.wait_for_switch(from, SWITCH_TIMEOUT)
    }

    /// Polls the live sentinels until one reports a master other than `from_port` and that
    /// server's `INFO replication` says `role:master`; returns its port. Panics after `timeout`.
    pub fn wait_for_switch(&self, from_port: u16, timeout: Duration) -> u16 {
        let switched = poll_until(timeout, || {
            let mut reasons = Vec::new();
            for (i, sentinel) in self.sentinels.iter().enumerate() {
                if !sentinel.is_live() {
                    continue;
                }
                match sentinel_master_port(sentinel.port) {
                    Ok(port) if port == from_port => {
                        reasons.push(format!("sentinel {i}: still {from_port}"))
                    }
                    Ok(port) => match is_master(port) {
                        Ok(true) => return Ok(port),
                        Ok(false) => reasons.push(format!(
                            "sentinel {i}: {port}, whose role is not master yet"
                        )),
                        Err(why) => reasons.push(format!("sentinel {i}: {port}: {why}")),
                    },
                    Err(why) => reasons.push(format!("sentinel {i}: {why}")),
                }
            }
            if reasons.is_empty() {
                reasons.push("no live sentinel".to_string());
            }
            Err(reasons.join("; "))
        });
        switched.unwrap_or_else(|why| {
            panic!(
                "no switch away from master {from_port} within {timeout:?}: {why}\n{}",
                self.logs()
            )
        })
    }

    /// Waits until every live sentinel reports the same master, that server says `role:master`,
    /// every other running server is its replica with `master_link_status:up`, the master's
    /// `INFO replication` lists exactly those replicas as online, and every live sentinel lists
    /// each of them as a replica that is not down. Panics after `timeout`.
    pub fn wait_settled(&self, timeout: Duration) {
        if let Err(why) = poll_until(timeout, || self.settled()) {
            panic!(
                "sentinel set not settled within {timeout:?}: {why}\n{}",
                self.logs()
            );
        }
    }

    /// Restarts data server `i` (same port, dir and arguments: it comes back as a master) and,
    /// if a sentinel reports another server as master, makes it that master's replica. Does not
    /// wait for the sync: use [`SentinelSet::wait_settled`].
    pub fn restart_server(&mut self, i: usize) {
        self.servers[i].restart();
        let master = self.master_port();
        if master != self.servers[i].port() {
            replica_of(&self.servers[i], master);
        }
    }

    /// SIGKILLs sentinel `i` and reaps it. Idempotent.
    pub fn kill_sentinel(&mut self, i: usize) {
        self.sentinels[i].kill();
    }

    /// SIGSTOPs sentinel `i`; the helpers skip it until [`SentinelSet::resume_sentinel`]. A
    /// sentinel stopped for more than 2 s enters TILT mode for 30 s when resumed (it sees its
    /// clock jump): it still answers queries but acts on nothing.
    pub fn pause_sentinel(&self, i: usize) {
        let sentinel = &self.sentinels[i];
        if sentinel.signal(libc::SIGSTOP) {
            sentinel.paused.store(true, Ordering::SeqCst);
        }
    }

    /// SIGCONT after [`SentinelSet::pause_sentinel`].
    pub fn resume_sentinel(&self, i: usize) {
        let sentinel = &self.sentinels[i];
        sentinel.signal(libc::SIGCONT);
        sentinel.paused.store(false, Ordering::SeqCst);
    }

    /// Log tails of every sentinel and data server, for panic messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.sentinels.iter().enumerate() {
            let state = if s.is_live() {
                "live"
            } else if s.paused.load(Ordering::SeqCst) {
                "paused"
            } else {
                "dead"
            };
            out.push_str(&log_tail_of(
                &format!("sentinel {i}, port {}, {state}", s.port),
                &s.dir,
            ));
        }
        for (i, s) in self.servers.iter().enumerate() {
            let state = if s.is_running() { "running" } else { "dead" };
            out.push_str(&log_tail_of(
                &format!("server {i}, port {}, {state}", s.port()),
                s.dir(),
            ));
        }
        out
    }

    /// Ports of the running data servers other than `master`.
    fn live_replica_ports(&self, master: u16) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .servers
            .iter()
            .filter(|s| s.is_running() && s.port() != master)
            .map(RedisServer::port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// Every running server but `master` replicates from it with its link up, and the master
    /// sees exactly those replicas online.
    fn replication_settled(&self, master: u16) -> Result<(), String> {
        let info = replication_info(master)?;
        if info.get("role").map(String::as_str) != Some("master") {
            return Err(format!("server {master} is not role:master: {info:?}"));
        }
        let replicas = self.live_replica_ports(master);
        for &port in &replicas {
            let info = replication_info(port)?;
            let (role, link_to, link) = (
                info.get("role").map(String::as_str),
                info.get("master_port").and_then(|p| p.parse::<u16>().ok()),
                info.get("master_link_status").map(String::as_str),
            );
            if role != Some("slave") || link_to != Some(master) || link != Some("up") {
                return Err(format!(
                    "server {port}: role {role:?}, master_port {link_to:?}, \
                     master_link_status {link:?} (want slave of {master}, up)"
                ));
            }
        }
        let online = online_replica_ports(&info);
        let connected = info.get("connected_slaves").cloned().unwrap_or_default();
        if online != replicas || connected != replicas.len().to_string() {
            return Err(format!(
                "master {master}: connected_slaves {connected}, online replicas {online:?}, \
                 want {replicas:?}"
            ));
        }
        Ok(())
    }

    /// Every live sentinel lists each of `replicas` as a replica that is not down.
    fn sentinels_see_replicas(&self, replicas: &[u16]) -> Result<(), String> {
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_live() {
                continue;
            }
            let listed = sentinel_instances(sentinel.port, "REPLICAS")?;
            for &port in replicas {
                let entry = listed
                    .iter()
                    .find(|r| r.get("port").and_then(|p| p.parse::<u16>().ok()) == Some(port));
                match entry {
                    None => return Err(format!("sentinel {i} does not list replica {port} yet")),
                    Some(r) => {
                        let flags = r.get("flags").map(String::as_str).unwrap_or("");
                        if !flags.split(',').any(|f| f == "slave") || !flags_healthy(flags) {
                            return Err(format!("sentinel {i}: replica {port} has flags {flags}"));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The start-up condition (see [`SentinelSet::start`]).
    fn ready(&self, master: u16) -> Result<(), String> {
        self.replication_settled(master)?;
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            let mut con = connect(sentinel.port).map_err(|e| format!("sentinel {i}: {e}"))?;
            let quorum: String = redis::cmd("SENTINEL")
                .arg("CKQUORUM")
                .arg(MASTER_NAME)
                .query(&mut con)
                .map_err(|e| format!("sentinel {i}: CKQUORUM: {e}"))?;
            if !quorum.starts_with("OK") {
                return Err(format!("sentinel {i}: CKQUORUM: {quorum}"));
            }
            let reported = sentinel_master_port(sentinel.port)?;
            if reported != master {
                return Err(format!(
                    "sentinel {i} reports master {reported}, not {master}"
                ));
            }
            let peers = sentinel_instances(sentinel.port, "SENTINELS")?;
            let healthy = peers
                .iter()
                .filter(|p| flags_healthy(p.get("flags").map(String::as_str).unwrap_or("")))
                .count();
            if healthy != SENTINELS - 1 {
                return Err(format!(
                    "sentinel {i} knows {healthy} healthy other sentinels (of {} listed), want {}",
                    peers.len(),
                    SENTINELS - 1
                ));
            }
        }
        self.sentinels_see_replicas(&self.live_replica_ports(master))
    }

    /// The [`SentinelSet::wait_settled`] condition.
    fn settled(&self) -> Result<(), String> {
        let mut master = None;
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_live() {
                continue;
            }
            let port = sentinel_master_port(sentinel.port)?;
            match master {
                None => master = Some(port),
                Some(m) if m == port => {}
                Some(m) => {
                    return Err(format!(
                        "sentinels disagree: one reports {m}, sentinel {i} reports {port}"
                    ))
                }
            }
        }
        let master = master.ok_or_else(|| "no live sentinel".to_string())?;
        self.replication_settled(master)?;
        self.sentinels_see_replicas(&self.live_replica_ports(master))
    }
}

/// `REPLICAOF 127.0.0.1 <master_port>` on `server`.
fn replica_of(server: &RedisServer, master_port: u16) {
    let mut con = server.connection();
    let reply: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master_port)
        .query(&mut con)
        .unwrap_or_else(|e| {
            panic!(
                "REPLICAOF 127.0.0.1 {master_port} on server {}: {e}\n{}",
                server.port(),
                log_tail_of("server", server.dir())
            )
        });
    assert!(reply.starts_with("OK"), "REPLICAOF answered {reply:?}");
}
