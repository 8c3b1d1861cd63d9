//! A soak of quorum mode under random faults of up to two masters at a time: threads of several
//! clients lock two keys on five masters (each behind a fault proxy) and write to a fenced store
//! on a server of its own, while masters are frozen, killed and wiped (and restarted once the
//! longest lease has run out), and their traffic delayed or cut. Shared by
//! `examples/quorum_soak.rs` (minutes) and `tests/quorum_soak.rs` (seconds, in CI).
//!
//! What must stay zero, as in the single-server soak (`soak.rs`): overlapping holds (a hold runs
//! from its grant to the last moment its holder saw `is_held()` true), token regressions per key
//! in grant order, and stale writes accepted by the store (in the store's own order).

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient, Topology};

use super::history::Hold;
use super::proxy::{Mode, Proxy};
use super::quorum::{Quorum, Workload, WorkloadConfig};
use super::{RedisServer, Rng};

/// How long, how many, and how often.
#[derive(Clone, Debug)]
pub struct QuorumSoakConfig {
    pub duration: Duration,
    pub masters: usize,
    /// Lock-holding threads in all, spread over the clients.
    pub threads: usize,
    pub clients: usize,
    pub lease: Duration,
    /// Mean time between faults.
    pub fault_every: Duration,
    pub seed: u64,
}

impl Default for QuorumSoakConfig {
    fn default() -> Self {
        QuorumSoakConfig {
            duration: Duration::from_secs(60),
            masters: 5,
            threads: 8,
            clients: 2,
            lease: Duration::from_millis(400),
            fault_every: Duration::from_millis(1_000),
            seed: 0x5eed,
        }
    }
}

#[derive(Debug, Default)]
pub struct QuorumSoakReport {
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

impl QuorumSoakReport {
    pub fn print(&self, config: &QuorumSoakConfig) {
        println!(
            "quorum soak: {:?} on {} masters, {} threads over {} clients, lease {:?}, seed {:#x}",
            config.duration,
            config.masters,
            config.threads,
            config.clients,
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

const FAULTS: [&str; 7] = [
    "freeze 1 < lease",
    "freeze 1 > lease",
    "freeze 2 > lease",
    "kill + wipe + restart",
    "wipe 1 + freeze 1",
    "delay 2 by 50 ms",
    "connections reset",
];

/// Two distinct masters of `n`.
fn two(rng: &mut Rng, n: usize) -> (usize, usize) {
    let i = rng.below(n as u64) as usize;
    let j = (i + 1 + rng.below(n as u64 - 1) as usize) % n;
    (i, j)
}

pub fn run(config: &QuorumSoakConfig) -> QuorumSoakReport {
    let mut quorum = Quorum::start(config.masters);
    let proxies: Vec<Proxy> = quorum.ports().into_iter().map(Proxy::start).collect();
    let topology = Topology::quorum(proxies.iter().map(Proxy::url));
    let clients: Vec<LockClient> = (0..config.clients)
        .map(|_| {
            quorum
                .builder_on(topology.clone(), config.lease)
                .build()
                .unwrap_or_else(|e| panic!("a quorum client: {e}"))
        })
        .collect();
    let store_server = RedisServer::start();
    let store = FencedRedis::open(store_server.url()).unwrap();
    let workload = WorkloadConfig {
        threads_per_client: config.threads.div_ceil(config.clients.max(1)),
        max_run: config.duration + Duration::from_secs(30),
        seed: config.seed,
        ..WorkloadConfig::new(&["a", "b"], config.lease)
    };
    let load = Workload::start(&clients, &store, &workload);

    let mut rng = Rng(config.seed);
    let mut injected = [0u64; FAULTS.len()];
    let n = config.masters;
    let lease = config.lease;
    let mean = config.fault_every.as_millis() as u64;
    let end = Instant::now() + config.duration;
    // Bounded in time by `end` (each fault lasts at most a few leases) and in count.
    let first = rng.below(FAULTS.len() as u64) as usize;
    for round in 0..100_000 {
        let gap = Duration::from_millis(mean / 2 + rng.below(mean));
        thread::sleep(gap.min(end.saturating_duration_since(Instant::now())));
        if Instant::now() >= end {
            break;
        }
        // Every kind in turn, from a random start: a short run still sees each of them.
        let fault = (first + round) % FAULTS.len();
        injected[fault] += 1;
        let (i, j) = two(&mut rng, n);
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
                proxies[i].set_mode(Mode::Delay(Duration::from_millis(50)));
                proxies[j].set_mode(Mode::Delay(Duration::from_millis(50)));
                thread::sleep(lease);
                proxies[i].set_mode(Mode::Pass);
                proxies[j].set_mode(Mode::Pass);
            }
            _ => proxies[i].close_connections(),
        }
    }
    quorum.thaw_all();
    let outcome = load.stop();

    let mut report = QuorumSoakReport {
        grants: outcome.grants,
        never_held: outcome.never_held,
        lock_errors: outcome.errors,
        losses_seen: outcome.lost,
        faults: FAULTS.iter().copied().zip(injected).collect(),
        writes_accepted: outcome.writes.len() as u64,
        stale_writes_rejected: outcome.stale_rejected,
        stale_writes_accepted: outcome.stale_accepted(),
        violations: outcome.history.check().err().unwrap_or_default(),
        ..QuorumSoakReport::default()
    };
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
