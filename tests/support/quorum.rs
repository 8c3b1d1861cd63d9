//! A quorum of independent redis-servers (AOF on, fsync always) for the quorum-mode tests:
//! clients on it, faults on single masters (freeze, kill and wipe, restart), a look at each
//! master's keys, and the pace of a contention workload.

use std::fs;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Builder, LockClient, Topology};

use super::clock::ServerClock;
use super::{fence_key, lock_key, ms, RedisServer, ServerOptions, NAMESPACE};

/// How long a client waits for one master's reply. A frozen master counts as a refusal after
/// this: short, so that a test with frozen masters moves on, and long enough for a master that
/// fsyncs every write on a busy machine.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a client waits for a connection to one master.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_millis(300);
/// Added to the longest lease before a wiped master restarts: the lease is counted from the
/// last write the master took, which is a little before the kill.
const RESTART_MARGIN: Duration = Duration::from_millis(200);

/// N redis-servers on 127.0.0.1, each a master of its own (no replication between them), with
/// AOF on and fsync always, so that a kill without a wipe loses nothing.
pub struct Quorum {
    servers: Vec<RedisServer>,
    frozen: Vec<AtomicBool>,
    /// When each master was last killed, if it is down.
    killed_at: Vec<Option<Instant>>,
    /// The longest lease any client made through [`Quorum::builder`] (or noted with
    /// [`Quorum::note_lease`]) may hold, in ms: how long a wiped master stays down.
    longest_lease_ms: AtomicU64,
    /// Each master's wall clock, when started with [`Quorum::start_with_clocks`]; dropped after
    /// the servers that read them.
    clocks: Vec<ServerClock>,
}

impl Quorum {
    /// `n` masters, each answering PING.
    pub fn start(n: usize) -> Quorum {
        Self::start_as(n, Vec::new())
    }

    /// [`Quorum::start`], every master with a wall clock of its own that the test can step and
    /// skew ([`Quorum::clock`]; a restarted master keeps it).
    pub fn start_with_clocks(n: usize) -> Quorum {
        Self::start_as(n, (0..n).map(|_| ServerClock::new()).collect())
    }

    fn start_as(n: usize, clocks: Vec<ServerClock>) -> Quorum {
        let servers: Vec<RedisServer> = (0..n)
            .map(|i| {
                RedisServer::start_as(&ServerOptions {
                    args: ["--appendonly", "yes", "--appendfsync", "always"]
                        .map(str::to_owned)
                        .to_vec(),
                    env: clocks.get(i).map(ServerClock::env).unwrap_or_default(),
                    ..ServerOptions::default()
                })
            })
            .collect();
        Quorum {
            frozen: (0..n).map(|_| AtomicBool::new(false)).collect(),
            killed_at: vec![None; n],
            servers,
            longest_lease_ms: AtomicU64::new(0),
            clocks,
        }
    }

    /// Master `i`'s wall clock: see [`Quorum::start_with_clocks`].
    pub fn clock(&self, i: usize) -> &ServerClock {
        self.clocks
            .get(i)
            .unwrap_or_else(|| panic!("master {i} has no clock of its own: start_with_clocks"))
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// How many masters make a majority.
    pub fn majority(&self) -> usize {
        self.len() / 2 + 1
    }

    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    pub fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(RedisServer::port).collect()
    }

    /// `redis://127.0.0.1:PORT/` of every master.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    pub fn topology(&self) -> Topology {
        Topology::quorum(self.urls())
    }

    /// The `redis+quorum://127.0.0.1:P1,127.0.0.1:P2,...` form of [`Quorum::topology`].
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+quorum://{}", hosts.join(","))
    }

    /// Tells the quorum that a client may hold leases of `lease`: [`Quorum::restart`] keeps a
    /// wiped master down for longer than the longest.
    pub fn note_lease(&self, lease: Duration) {
        let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self.longest_lease_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// A client builder on `topology` in the test namespace, with short timeouts (see
    /// [`RESPONSE_TIMEOUT`]); `lease` is noted for [`Quorum::restart`].
    pub fn builder_on(&self, topology: Topology, lease: Duration) -> Builder {
        self.note_lease(lease);
        LockClient::builder(topology)
            .namespace(NAMESPACE)
            .lease(lease)
            .response_timeout(RESPONSE_TIMEOUT)
            .connection_timeout(CONNECTION_TIMEOUT)
    }

    /// [`Quorum::builder_on`] these masters.
    pub fn builder(&self, lease: Duration) -> Builder {
        self.builder_on(self.topology(), lease)
    }

    pub fn client(&self, lease: Duration) -> LockClient {
        self.builder(lease)
            .build()
            .unwrap_or_else(|e| panic!("a quorum client (lease {lease:?}): {e}"))
    }

    /// SIGSTOP master `i`: it stops answering, its connections stay open, and its clock (for
    /// key expiry) goes on, so its leases are over once it resumes.
    pub fn freeze(&self, i: usize) {
        self.frozen[i].store(true, Ordering::SeqCst);
        self.servers[i].pause();
    }

    /// SIGCONT master `i` after [`Quorum::freeze`].
    pub fn thaw(&self, i: usize) {
        self.servers[i].resume();
        self.frozen[i].store(false, Ordering::SeqCst);
    }

    pub fn thaw_all(&self) {
        for i in 0..self.len() {
            if self.frozen[i].load(Ordering::SeqCst) {
                self.thaw(i);
            }
        }
    }

    pub fn is_frozen(&self, i: usize) -> bool {
        self.frozen[i].load(Ordering::SeqCst)
    }

    pub fn is_down(&self, i: usize) -> bool {
        self.killed_at[i].is_some()
    }

    /// SIGKILL master `i`, keeping its data files: [`Quorum::restart`] brings it back with
    /// every write it acknowledged (AOF, fsync always). Unlike a frozen master, it runs nothing
    /// of what was sent to it meanwhile.
    pub fn kill(&mut self, i: usize) {
        self.thaw(i);
        self.servers[i].kill();
        self.killed_at[i] = Some(Instant::now());
    }

    /// SIGKILL master `i` and delete its data files (the AOF directory and any RDB): it comes
    /// back empty from [`Quorum::restart`], as a master that lost its disk would.
    pub fn kill_and_wipe(&mut self, i: usize) {
        self.thaw(i);
        self.servers[i].kill();
        self.killed_at[i] = Some(Instant::now());
        let dir = self.servers[i].dir().to_path_buf();
        for name in ["appendonlydir", "appendonly.aof", "dump.rdb"] {
            let path = dir.join(name);
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match removed {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => panic!("cannot wipe {}: {e}", path.display()),
            }
        }
    }

    /// Starts master `i` again, empty, on its port, once it has been down for longer than the
    /// longest lease (sleeping until then).
    ///
    /// Why wait: a master that lost its data no longer knows which locks it granted. Back at
    /// once, it would grant a lock that another client still holds through it, and that grant
    /// plus the masters that a partition or a freeze keeps from the holder could make a second
    /// majority: two holders. Once every lease it held has run out, there is nothing left for
    /// it to forget. (Its tokens need no wait here: every master runs on this machine's clock,
    /// so an empty master's clock floor is past every token any master minted from the clock;
    /// a test that sets a fence counter ahead by hand relies on the write-back instead.)
    pub fn restart(&mut self, i: usize) {
        let killed = self.killed_at[i].unwrap_or_else(|| panic!("master {i} is not down"));
        let down =
            Duration::from_millis(self.longest_lease_ms.load(Ordering::SeqCst)) + RESTART_MARGIN;
        let since = killed.elapsed();
        if since < down {
            thread::sleep(down - since);
        }
        self.servers[i].restart();
        self.killed_at[i] = None;
    }

    /// A connection to master `i` for the test's own checks (5 s timeouts).
    pub fn connection(&self, i: usize) -> redis::Connection {
        self.servers[i].connection()
    }

    /// Master `i`'s fence counter of `key` (its last token), if it has one.
    pub fn fence(&self, i: usize, key: &str) -> Option<u64> {
        let value: Option<String> = redis::cmd("GET")
            .arg(fence_key(key))
            .query(&mut self.connection(i))
            .unwrap_or_else(|e| panic!("master {i}: GET fence of {key:?}: {e}"));
        value.map(|v| {
            v.parse()
                .unwrap_or_else(|e| panic!("master {i}: fence of {key:?} is {v:?}: {e}"))
        })
    }

    /// Sets master `i`'s fence counter of `key` to `value` by hand, without expiry.
    pub fn set_fence(&self, i: usize, key: &str, value: u64) {
        let _: () = redis::cmd("SET")
            .arg(fence_key(key))
            .arg(value.to_string())
            .query(&mut self.connection(i))
            .unwrap_or_else(|e| panic!("master {i}: SET fence of {key:?}: {e}"));
    }

    /// Master `i`'s clock (`TIME`) in microseconds: what its clock floor mints now.
    pub fn clock_us(&self, i: usize) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query(&mut self.connection(i))
            .unwrap_or_else(|e| panic!("master {i}: TIME: {e}"));
        secs * 1_000_000 + micros
    }

    /// The owner id in master `i`'s lock key of `key`, if the key exists.
    pub fn lock_owner(&self, i: usize, key: &str) -> Option<String> {
        redis::cmd("GET")
            .arg(lock_key(key))
            .query(&mut self.connection(i))
            .unwrap_or_else(|e| panic!("master {i}: GET lock of {key:?}: {e}"))
    }

    /// The remaining lease of master `i`'s lock key of `key`, in ms (-2: no such key).
    pub fn lock_pttl(&self, i: usize, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(lock_key(key))
            .query(&mut self.connection(i))
            .unwrap_or_else(|e| panic!("master {i}: PTTL lock of {key:?}: {e}"))
    }

    /// The masters (of those running and not frozen) whose lock key of `key` exists.
    pub fn masters_holding(&self, key: &str) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| !self.is_down(i) && !self.is_frozen(i))
            .filter(|&i| self.lock_owner(i, key).is_some())
            .collect()
    }
}

impl Drop for Quorum {
    fn drop(&mut self) {
        // A stopped process still dies of SIGKILL, but resuming first lets each server's drop
        // kill and reap it the ordinary way, and clients dropped after the quorum see closed
        // connections rather than silent ones.
        for (i, frozen) in self.frozen.iter().enumerate() {
            if frozen.load(Ordering::SeqCst) {
                self.servers[i].resume();
            }
        }
    }
}

/// What [`pace`] saw: grants per client, the wait of every `try_lock` (granted or not), sorted,
/// and the calls that failed.
pub struct Pace {
    pub grants: Vec<u64>,
    pub waits: Vec<Duration>,
    pub errors: u64,
    /// How many runs this is ([`Pace::merge`]).
    pub runs: usize,
}

impl Pace {
    /// Several runs of one workload as one.
    pub fn merge(runs: Vec<Pace>) -> Pace {
        let mut all = Pace {
            grants: Vec::new(),
            waits: Vec::new(),
            errors: 0,
            runs: 0,
        };
        for run in runs {
            all.grants.resize(all.grants.len().max(run.grants.len()), 0);
            for (a, g) in all.grants.iter_mut().zip(&run.grants) {
                *a += g;
            }
            all.waits.extend(run.waits);
            all.errors += run.errors;
            all.runs += run.runs;
        }
        all.waits.sort_unstable();
        all
    }

    pub fn total(&self) -> u64 {
        self.grants.iter().sum()
    }

    /// The `q` quantile of the waits (0 with none).
    pub fn wait(&self, q: f64) -> Duration {
        let last = self.waits.len().saturating_sub(1);
        let i = ((self.waits.len() as f64 * q) as usize).min(last);
        self.waits.get(i).copied().unwrap_or_default()
    }
}

impl std::fmt::Display for Pace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} grants {:?}, {} errors, wait p50 {:?} p99 {:?} max {:?}",
            self.total(),
            self.grants,
            self.errors,
            self.wait(0.5),
            self.wait(0.99),
            self.waits.last().copied().unwrap_or_default()
        )
    }
}

/// The contention workload of a quorum's pace: `threads` threads on each client take `keys` in
/// turn with `try_lock(key, wait)`, hold each grant for half a millisecond and unlock it, for
/// `run`.
pub fn pace(
    clients: &[LockClient],
    keys: &[&str],
    threads: usize,
    wait: Duration,
    run: Duration,
) -> Pace {
    let stop = Arc::new(AtomicBool::new(false));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + run;
    let mut handles = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..threads {
            let (client, stop, waits) = (client.clone(), Arc::clone(&stop), Arc::clone(&waits));
            let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
            handles.push(thread::spawn(move || {
                let (mut grants, mut errors) = (0u64, 0u64);
                let mut i = c * 7 + t;
                // Bounded by `end` (and `stop`), whatever the calls do.
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    i += 1;
                    let started = Instant::now();
                    match client.try_lock(&keys[i % keys.len()], wait) {
                        Ok(granted) => {
                            waits
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(started.elapsed());
                            if let Some(guard) = granted {
                                grants += 1;
                                thread::sleep(Duration::from_micros(500));
                                let _ = guard.unlock();
                            }
                        }
                        Err(_) => {
                            errors += 1;
                            thread::sleep(ms(10));
                        }
                    }
                }
                (c, grants, errors)
            }));
        }
    }
    thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let mut pace = Pace {
        grants: vec![0; clients.len()],
        waits: Vec::new(),
        errors: 0,
        runs: 1,
    };
    for handle in handles {
        let (c, grants, errors) = handle
            .join()
            .unwrap_or_else(|_| panic!("a pace thread panicked"));
        pace.grants[c] += grants;
        pace.errors += errors;
    }
    pace.waits = std::mem::take(&mut *waits.lock().unwrap_or_else(|p| p.into_inner()));
    pace.waits.sort_unstable();
    pace
}
