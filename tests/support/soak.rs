//! A soak under random faults: threads of several clients lock keys and write through a fenced
//! store ([`Workload`]), while a fault thread injects the faults of the deployment they run on,
//! each kind in turn from a random start. Four deployments: [`OneServer`] (a redis-server with
//! AOF behind a fault proxy), [`SentinelOf`] (a master, two replicas and three sentinels, failed
//! over for real), [`ClusterOf`] (three masters with a replica each) and [`QuorumOf`] (masters,
//! each behind a fault proxy). Shared by `examples/soak.rs` and `examples/quorum_soak.rs`
//! (minutes) and `tests/soak/` (seconds, in CI).
//!
//! What it counts, and what must stay zero:
//! - overlaps: two holds of a key whose intervals intersect, where a hold runs from its grant to
//!   the last moment its holder saw `is_held()` true (what a careful holder acts on);
//! - token regressions: per key, in grant order, a token not above the one before;
//! - stale writes accepted: a fenced write applied after one with a higher token. Every accepted
//!   write returns the store's count in the same atomic step (a fenced `incr_by`), so the
//!   store's own order of application is what is checked.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient, Topology};

use super::cluster::ClusterSet;
use super::fenced_workload::{Workload, WorkloadConfig};
use super::history::Hold;
use super::proxy::{Mode, Proxy};
use super::quorum::Quorum;
use super::sentinel::{SentinelSet, MASTER_NAME};
use super::{RedisServer, Rng};

/// What a soak runs on: how its clients and its fenced store reach it, and what can go wrong
/// with it.
pub trait Deployment {
    /// What it is, for the report.
    fn name(&self) -> String;
    /// Its faults, by name; [`Deployment::inject`] takes an index into them.
    fn faults(&self) -> &'static [&'static str];
    fn client(&self, lease: Duration) -> LockClient;
    fn store(&self) -> FencedRedis;
    /// Injects fault `fault` and returns once it is over (each lasts at most a few leases).
    fn inject(&mut self, fault: usize, lease: Duration, rng: &mut Rng);
}

/// How long, how many, and how often.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub duration: Duration,
    /// Lock-holding threads in all, spread over the clients.
    pub threads: usize,
    pub clients: usize,
    pub keys: &'static [&'static str],
    pub lease: Duration,
    /// One hold in this many is longer than a lease, so that renewal runs under the faults.
    pub long_one_in: u64,
    /// Mean time between faults.
    pub fault_every: Duration,
    /// The run goes on past `duration` (up to twice as long again) until this many faults were
    /// injected: a fault can take seconds to settle (a failover), so a short run on a loaded
    /// machine would otherwise inject too few to prove anything.
    pub min_faults: u64,
    pub seed: u64,
}

impl SoakConfig {
    /// For [`OneServer`]: a minute of 8 threads over 2 clients on one key, a fault about every
    /// 1.5 s.
    pub fn one_server() -> SoakConfig {
        SoakConfig {
            duration: Duration::from_secs(60),
            threads: 8,
            clients: 2,
            keys: &["key"],
            lease: Duration::from_millis(300),
            // Rare on one key: eight threads wait out each long hold, and the grants' count,
            // not the renewals', is what the soak is mostly about.
            long_one_in: 64,
            fault_every: Duration::from_millis(1_500),
            min_faults: 0,
            seed: 0x5eed,
        }
    }

    /// For [`QuorumOf`]: a minute of 8 threads over 2 clients on two keys, a fault about every
    /// second.
    pub fn quorum() -> SoakConfig {
        SoakConfig {
            keys: &["a", "b"],
            lease: Duration::from_millis(400),
            long_one_in: 8,
            fault_every: Duration::from_millis(1_000),
            ..SoakConfig::one_server()
        }
    }
}

impl SoakConfig {
    /// For [`SentinelOf`] and [`ClusterOf`]: a minute of 8 threads over 2 clients on three
    /// keys, a fault about every 2 s (a failover takes seconds to settle).
    pub fn replicated() -> SoakConfig {
        SoakConfig {
            keys: &["a", "b", "c"],
            lease: Duration::from_millis(400),
            long_one_in: 8,
            fault_every: Duration::from_millis(2_000),
            ..SoakConfig::one_server()
        }
    }
}

#[derive(Debug, Default)]
pub struct SoakReport {
    /// The deployment's name.
    pub on: String,
    pub grants: u64,
    pub never_held: u64,
    pub lock_errors: u64,
    pub losses_seen: u64,
    pub faults: Vec<(&'static str, u64)>,
    pub overlaps: u64,
    pub token_regressions: u64,
    pub writes_accepted: u64,
    pub stale_writes_rejected: u64,
    pub stale_writes_accepted: u64,
    /// The history check's description of the first violations ("" if none).
    pub violations: String,
}

impl SoakReport {
    pub fn print(&self, config: &SoakConfig) {
        println!(
            "soak on {}: {:?}, {} threads over {} clients on keys {:?}, lease {:?}, seed {:#x}",
            self.on,
            config.duration,
            config.threads,
            config.clients,
            config.keys,
            config.lease,
            config.seed
        );
        println!("  grants                 {}", self.grants);
        println!("  grants never seen held {}", self.never_held);
        println!("  lock errors (faults)   {}", self.lock_errors);
        println!("  losses reported        {}", self.losses_seen);
        let faults: u64 = self.faults.iter().map(|(_, n)| n).sum();
        println!("  faults injected        {faults}");
        for (name, n) in &self.faults {
            println!("    {name:<22} {n}");
        }
        println!("  writes accepted        {}", self.writes_accepted);
        println!("  stale writes rejected  {}", self.stale_writes_rejected);
        println!("  overlaps               {}", self.overlaps);
        println!("  token regressions      {}", self.token_regressions);
        println!("  stale writes accepted  {}", self.stale_writes_accepted);
        if !self.violations.is_empty() {
            println!("  {}", self.violations);
        }
    }

    pub fn is_clean(&self) -> bool {
        self.overlaps == 0 && self.token_regressions == 0 && self.stale_writes_accepted == 0
    }
}

pub fn run(on: &mut impl Deployment, config: &SoakConfig) -> SoakReport {
    let clients: Vec<LockClient> = (0..config.clients)
        .map(|_| on.client(config.lease))
        .collect();
    let store = on.store();
    let workload = WorkloadConfig {
        threads_per_client: config.threads.div_ceil(config.clients.max(1)),
        max_run: config.duration * 3 + Duration::from_secs(30),
        long_one_in: config.long_one_in,
        seed: config.seed,
        ..WorkloadConfig::new(config.keys, config.lease)
    };
    let load = Workload::start(&clients, &store, &workload);

    let faults = on.faults();
    let mut rng = Rng(config.seed);
    let mut injected = vec![0u64; faults.len()];
    let mean = config.fault_every.as_millis() as u64;
    let end = Instant::now() + config.duration;
    // Short of `min_faults` at `end`, the run goes on until they are in, or until `cap`.
    let cap = end + config.duration * 2;
    // Bounded in time by `cap` (each fault lasts at most a few leases, or a failover) and in
    // count.
    let first = rng.below(faults.len() as u64) as usize;
    for round in 0..100_000 {
        let until = if injected.iter().sum::<u64>() >= config.min_faults {
            end
        } else {
            cap
        };
        let gap = Duration::from_millis(mean / 2 + rng.below(mean));
        thread::sleep(gap.min(until.saturating_duration_since(Instant::now())));
        if Instant::now() >= until {
            break;
        }
        // Every kind in turn, from a random start: a short run still sees each of them.
        let fault = (first + round) % faults.len();
        injected[fault] += 1;
        on.inject(fault, config.lease, &mut rng);
    }
    let outcome = load.stop();

    let mut report = SoakReport {
        on: on.name(),
        grants: outcome.grants,
        never_held: outcome.never_held,
        lock_errors: outcome.errors,
        losses_seen: outcome.lost,
        faults: faults.iter().copied().zip(injected).collect(),
        writes_accepted: outcome.writes.len() as u64,
        stale_writes_rejected: outcome.stale_rejected,
        stale_writes_accepted: outcome.stale_accepted(),
        violations: outcome.history.check().err().unwrap_or_default(),
        ..SoakReport::default()
    };
    // Only holds a holder acted on are recorded: a grant whose reply came after its lease had
    // already ended (a pause, a delay) is never seen held, so its holder does nothing with it.
    // Between acted-on holds of a key, start order is grant order.
    let mut by_key: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    for hold in outcome.history.holds() {
        by_key.entry(hold.key.clone()).or_default().push(hold);
    }
    for holds in by_key.values_mut() {
        holds.sort_by_key(|h| h.start);
        let (mut latest_end, mut highest) = (None::<Instant>, 0u64);
        for h in holds.iter() {
            if latest_end.is_some_and(|e| h.start < e) {
                report.overlaps += 1;
            }
            latest_end = Some(latest_end.map_or(h.end, |e| e.max(h.end)));
            if h.token <= highest {
                report.token_regressions += 1;
            }
            highest = highest.max(h.token);
        }
    }
    drop(clients);
    report
}

/// One redis-server behind a fault proxy, which the clients go through. AOF (fsync always), so
/// that the fenced store, on the same server and reached directly, keeps its accepted tokens
/// across the restarts.
pub struct OneServer {
    server: RedisServer,
    proxy: Proxy,
}

impl OneServer {
    pub fn start() -> OneServer {
        let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
        let proxy = Proxy::start(server.port());
        OneServer { server, proxy }
    }
}

impl Deployment for OneServer {
    fn name(&self) -> String {
        "one server".to_owned()
    }

    fn faults(&self) -> &'static [&'static str] {
        &[
            "pause < lease",
            "pause > lease",
            "connections reset",
            "delay 50 ms",
            "kill + restart (AOF)",
        ]
    }

    fn client(&self, lease: Duration) -> LockClient {
        LockClient::builder(self.proxy.url())
            .namespace("soak")
            .lease(lease)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .build()
            .unwrap_or_else(|e| panic!("a client: {e}"))
    }

    fn store(&self) -> FencedRedis {
        FencedRedis::open(self.server.url())
            .and_then(|store| store.with_namespace("soak"))
            .unwrap_or_else(|e| panic!("the fenced store: {e}"))
    }

    fn inject(&mut self, fault: usize, lease: Duration, _: &mut Rng) {
        match fault {
            0 | 1 => {
                self.server.pause();
                thread::sleep(if fault == 0 { lease / 3 } else { lease * 2 });
                self.server.resume();
            }
            2 => self.proxy.close_connections(),
            3 => {
                self.proxy.set_mode(Mode::Delay(Duration::from_millis(50)));
                thread::sleep(lease);
                self.proxy.set_mode(Mode::Pass);
            }
            _ => {
                self.server.kill();
                self.server.restart();
            }
        }
    }
}

/// A quorum of masters, each behind a fault proxy, with faults of up to two of them at a time;
/// the fenced store on a server of its own.
pub struct QuorumOf {
    quorum: Quorum,
    proxies: Vec<Proxy>,
    topology: Topology,
    store: RedisServer,
}

impl QuorumOf {
    pub fn start(masters: usize) -> QuorumOf {
        let quorum = Quorum::start(masters);
        let proxies: Vec<Proxy> = quorum.ports().into_iter().map(Proxy::start).collect();
        let topology = Topology::quorum(proxies.iter().map(Proxy::url));
        QuorumOf {
            quorum,
            proxies,
            topology,
            store: RedisServer::start(),
        }
    }

    /// Two distinct masters.
    fn two(&self, rng: &mut Rng) -> (usize, usize) {
        let n = self.quorum.len();
        let i = rng.below(n as u64) as usize;
        let j = (i + 1 + rng.below(n as u64 - 1) as usize) % n;
        (i, j)
    }
}

impl Deployment for QuorumOf {
    fn name(&self) -> String {
        format!("a quorum of {} masters", self.quorum.len())
    }

    fn faults(&self) -> &'static [&'static str] {
        &[
            "freeze 1 < lease",
            "freeze 1 > lease",
            "freeze 2 > lease",
            "kill + wipe + restart",
            "wipe 1 + freeze 1",
            "delay 2 by 50 ms",
            "connections reset",
        ]
    }

    fn client(&self, lease: Duration) -> LockClient {
        self.quorum
            .builder_on(self.topology.clone(), lease)
            .build()
            .unwrap_or_else(|e| panic!("a quorum client: {e}"))
    }

    fn store(&self) -> FencedRedis {
        FencedRedis::open(self.store.url()).unwrap_or_else(|e| panic!("the fenced store: {e}"))
    }

    fn inject(&mut self, fault: usize, lease: Duration, rng: &mut Rng) {
        let (i, j) = self.two(rng);
        let quorum = &mut self.quorum;
        match fault {
            0 | 1 => {
                quorum.freeze(i);
                thread::sleep(if fault == 0 { lease / 2 } else { lease * 2 });
                quorum.thaw(i);
            }
            2 => {
                quorum.freeze(i);
                quorum.freeze(j);
                thread::sleep(lease * 2);
                quorum.thaw(i);
                quorum.thaw(j);
            }
            3 => {
                quorum.kill_and_wipe(i);
                // Sleeps until the master has been down for longer than the lease.
                quorum.restart(i);
            }
            4 => {
                quorum.kill_and_wipe(i);
                quorum.freeze(j);
                quorum.restart(i);
                quorum.thaw(j);
            }
            5 => {
                for k in [i, j] {
                    self.proxies[k].set_mode(Mode::Delay(Duration::from_millis(50)));
                }
                thread::sleep(lease);
                for k in [i, j] {
                    self.proxies[k].set_mode(Mode::Pass);
                }
            }
            _ => self.proxies[i].close_connections(),
        }
    }
}

/// Redis Sentinel: a master and two replicas with `min-replicas-to-write 1` (and AOF), three
/// sentinels; the clients find the master through the sentinels, with `min_replica_acks(1)` when
/// `acks`. The fenced store is a server of its own: what is checked is the lock.
pub struct SentinelOf {
    set: SentinelSet,
    acks: bool,
    store: RedisServer,
}

impl SentinelOf {
    pub fn start(acks: bool) -> SentinelOf {
        let set = SentinelSet::builder()
            .replicas(2)
            .server_args(&[
                "--min-replicas-to-write",
                "1",
                "--min-replicas-max-lag",
                "1",
                "--appendonly",
                "yes",
            ])
            .start();
        SentinelOf {
            set,
            acks,
            store: RedisServer::start(),
        }
    }
}

impl Deployment for SentinelOf {
    fn name(&self) -> String {
        format!(
            "Sentinel (a master, 2 replicas, min-replicas-to-write 1, {})",
            if self.acks {
                "min_replica_acks(1)"
            } else {
                "no replica acks"
            }
        )
    }

    fn faults(&self) -> &'static [&'static str] {
        &[
            "pause master < lease",
            "pause master > lease",
            "SENTINEL FAILOVER",
            "kill master, failover",
        ]
    }

    fn client(&self, lease: Duration) -> LockClient {
        let mut builder =
            LockClient::builder(Topology::sentinel(self.set.sentinel_urls(), MASTER_NAME))
                .namespace("soak")
                .lease(lease)
                .connection_timeout(Duration::from_secs(1))
                .response_timeout(Duration::from_secs(1));
        if self.acks {
            builder = builder.min_replica_acks(1, lease / 4);
        }
        builder
            .build()
            .unwrap_or_else(|e| panic!("a Sentinel client: {e}"))
    }

    fn store(&self) -> FencedRedis {
        FencedRedis::open(self.store.url()).unwrap_or_else(|e| panic!("the fenced store: {e}"))
    }

    fn inject(&mut self, fault: usize, lease: Duration, _: &mut Rng) {
        let settle = Duration::from_secs(60);
        match fault {
            0 | 1 => {
                let master = &self.set.servers()[self.set.master_index()];
                master.pause();
                thread::sleep(if fault == 0 { lease / 3 } else { lease * 2 });
                master.resume();
            }
            2 => {
                self.set.failover();
                self.set.wait_settled(settle);
            }
            _ => {
                let (i, port) = (self.set.master_index(), self.set.master_port());
                self.set.server_mut(i).kill();
                self.set.wait_for_switch(port, settle);
                self.set.restart_server(i);
                self.set.wait_settled(settle);
            }
        }
    }
}

/// Redis Cluster: three masters with a replica each; the keys' slots spread over them. The
/// fenced store is a server of its own.
pub struct ClusterOf {
    set: ClusterSet,
    keys: &'static [&'static str],
    store: RedisServer,
}

impl ClusterOf {
    pub fn start(keys: &'static [&'static str]) -> ClusterOf {
        ClusterOf {
            set: ClusterSet::start(3, 1),
            keys,
            store: RedisServer::start(),
        }
    }

    /// The port of the master that serves a random key of the soak's.
    fn master_of_a_key(&self, rng: &mut Rng) -> u16 {
        let key = self.keys[rng.below(self.keys.len() as u64) as usize];
        self.set
            .master_of_slot(ClusterSet::slot_of(&format!("{{{key}}}")))
    }
}

impl Deployment for ClusterOf {
    fn name(&self) -> String {
        "Cluster (3 masters, a replica each)".to_owned()
    }

    fn faults(&self) -> &'static [&'static str] {
        &[
            "pause a master < lease",
            "pause a master > lease",
            "CLUSTER FAILOVER",
            "pause a master > node timeout",
        ]
    }

    fn client(&self, lease: Duration) -> LockClient {
        LockClient::builder(Topology::cluster(self.set.seed_urls()))
            .namespace("soak")
            .lease(lease)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .build()
            .unwrap_or_else(|e| panic!("a Cluster client: {e}"))
    }

    fn store(&self) -> FencedRedis {
        FencedRedis::open(self.store.url()).unwrap_or_else(|e| panic!("the fenced store: {e}"))
    }

    fn inject(&mut self, fault: usize, lease: Duration, rng: &mut Rng) {
        let settle = Duration::from_secs(30);
        let master = self.master_of_a_key(rng);
        let i = self.set.index_of_port(master);
        match fault {
            0 | 1 => {
                self.set.pause(i);
                thread::sleep(if fault == 0 { lease / 3 } else { lease * 2 });
                self.set.resume(i);
            }
            2 => {
                self.set.failover(self.set.replica_of(master));
                self.set.wait_ok(settle);
            }
            _ => {
                let slot = ClusterSet::slot_of(&format!("{{{}}}", self.keys[0]));
                let paused = self.set.index_of_port(self.set.master_of_slot(slot));
                self.set.pause(paused);
                self.set
                    .wait_for_owner_change(slot, self.set.port_of(paused), settle);
                self.set.resume(paused);
                self.set.wait_ok(settle);
            }
        }
    }
}
