//! A soak under random faults: many holders on one key, a fenced store behind them, and a fault
//! thread that pauses, restarts and disturbs Redis. Shared by `examples/soak.rs` (minutes) and
//! `tests/soak.rs` (seconds, in CI).
//!
//! What it counts, and what must stay zero:
//! - overlaps: two holds of the key whose intervals intersect, where a hold runs from its grant to
//!   the last moment its holder saw `is_held()` true (what a careful holder acts on);
//! - token regressions: a grant whose token is not above every earlier grant's;
//! - stale writes accepted: a fenced write applied after one with a higher token. Every accepted
//!   write takes a sequence number from the store in the same atomic step (a fenced `incr_by`),
//!   so the store's own order of application is what is checked.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient};

use super::proxy::{Mode, Proxy};
use super::{RedisServer, Rng};

/// How long, how many, and how often.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub duration: Duration,
    pub threads: usize,
    pub clients: usize,
    pub lease: Duration,
    /// Mean time between faults.
    pub fault_every: Duration,
    pub seed: u64,
}

impl Default for SoakConfig {
    fn default() -> Self {
        SoakConfig {
            duration: Duration::from_secs(60),
            threads: 8,
            clients: 2,
            lease: Duration::from_millis(300),
            fault_every: Duration::from_millis(1_500),
            seed: 0x5eed,
        }
    }
}

#[derive(Debug, Default)]
pub struct SoakReport {
    pub grants: u64,
    pub lock_errors: u64,
    pub losses_seen: u64,
    pub faults: Vec<(&'static str, u64)>,
    pub overlaps: u64,
    pub token_regressions: u64,
    pub writes_accepted: u64,
    pub stale_writes_rejected: u64,
    pub stale_writes_accepted: u64,
}

impl SoakReport {
    pub fn print(&self, config: &SoakConfig) {
        println!(
            "soak: {:?} of {} threads over {} clients, lease {:?}, seed {:#x}",
            config.duration, config.threads, config.clients, config.lease, config.seed
        );
        println!("  grants                 {}", self.grants);
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
    }

    pub fn is_clean(&self) -> bool {
        self.overlaps == 0 && self.token_regressions == 0 && self.stale_writes_accepted == 0
    }
}

const FAULTS: [&str; 5] = [
    "pause < lease",
    "pause > lease",
    "connections reset",
    "delay 50 ms",
    "kill + restart (AOF)",
];

struct Grant {
    token: u64,
    start: Instant,
    /// Last moment the holder saw is_held() true.
    end: Instant,
}

pub fn run(config: &SoakConfig) -> SoakReport {
    // AOF, so that the fenced store's accepted tokens survive the restarts the soak injects.
    let server = Arc::new(Mutex::new(RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])));
    let (port, url) = {
        let s = server.lock().unwrap();
        (s.port(), s.url())
    };
    let proxy = Proxy::start(port);
    let clients: Vec<LockClient> = (0..config.clients)
        .map(|_| {
            LockClient::builder(proxy.url())
                .namespace("soak")
                .lease(config.lease)
                .connection_timeout(Duration::from_secs(1))
                .response_timeout(Duration::from_secs(1))
                .build()
                .unwrap()
        })
        .collect();
    let store = FencedRedis::open(&url)
        .unwrap()
        .with_namespace("soak")
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(Mutex::new(Vec::<Grant>::new()));
    let writes = Arc::new(Mutex::new(Vec::<(i64, u64)>::new()));
    let lock_errors = Arc::new(AtomicU64::new(0));
    let losses = Arc::new(AtomicU64::new(0));
    let stale_rejected = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + config.duration;

    let workers: Vec<_> = (0..config.threads)
        .map(|t| {
            let client = clients[t % clients.len()].clone();
            let store = store.clone();
            let (stop, grants, writes) = (stop.clone(), grants.clone(), writes.clone());
            let (lock_errors, losses, stale_rejected) =
                (lock_errors.clone(), losses.clone(), stale_rejected.clone());
            let mut rng = Rng(config.seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    let guard = match client.try_lock("key", Duration::from_secs(2)) {
                        Ok(Some(guard)) => guard,
                        Ok(None) => continue,
                        Err(_) => {
                            lock_errors.fetch_add(1, Ordering::Relaxed);
                            thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                    };
                    let start = Instant::now();
                    let token = guard.token();
                    let mut last_held = start;
                    if guard.is_held() {
                        last_held = Instant::now();
                    }
                    thread::sleep(Duration::from_micros(rng.below(2_000)));
                    if guard.is_held() {
                        last_held = Instant::now();
                        match store.incr_by("seq", token, 1) {
                            Ok(seq) => writes.lock().unwrap().push((seq, token.as_u64())),
                            Err(e) if e.is_stale_token() => {
                                stale_rejected.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {}
                        }
                    }
                    if guard.is_held() {
                        last_held = Instant::now();
                    } else {
                        losses.fetch_add(1, Ordering::Relaxed);
                    }
                    grants.lock().unwrap().push(Grant {
                        token: token.as_u64(),
                        start,
                        end: last_held,
                    });
                    let _ = guard.unlock();
                }
            })
        })
        .collect();

    let mut rng = Rng(config.seed);
    let mut injected = [0u64; FAULTS.len()];
    let mean = config.fault_every.as_millis() as u64;
    while Instant::now() < end {
        let gap = Duration::from_millis(mean / 2 + rng.below(mean));
        thread::sleep(gap.min(end.saturating_duration_since(Instant::now())));
        if Instant::now() >= end {
            break;
        }
        let fault = rng.below(FAULTS.len() as u64) as usize;
        injected[fault] += 1;
        match fault {
            0 | 1 => {
                let pause = if fault == 0 {
                    config.lease / 3
                } else {
                    config.lease * 2
                };
                let s = server.lock().unwrap();
                s.pause();
                thread::sleep(pause);
                s.resume();
            }
            2 => proxy.close_connections(),
            3 => {
                proxy.set_mode(Mode::Delay(Duration::from_millis(50)));
                thread::sleep(config.lease);
                proxy.set_mode(Mode::Pass);
            }
            _ => {
                let mut s = server.lock().unwrap();
                s.kill();
                s.restart();
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }

    let mut grants = std::mem::take(&mut *grants.lock().unwrap());
    grants.sort_by_key(|g| g.start);
    let mut report = SoakReport {
        grants: grants.len() as u64,
        lock_errors: lock_errors.load(Ordering::Relaxed),
        losses_seen: losses.load(Ordering::Relaxed),
        faults: FAULTS.iter().copied().zip(injected).collect(),
        stale_writes_rejected: stale_rejected.load(Ordering::Relaxed),
        ..SoakReport::default()
    };
    // Only holds a holder acted on count: a grant whose reply came after its lease had already
    // ended (a pause, a delay) is never seen held, so its holder does nothing with it. Between
    // acted-on holds, client-side start order is grant order.
    let (mut latest_end, mut highest) = (None::<Instant>, 0u64);
    for g in grants.iter().filter(|g| g.end > g.start) {
        if latest_end.is_some_and(|e| g.start < e) {
            report.overlaps += 1;
        }
        latest_end = Some(latest_end.map_or(g.end, |e| e.max(g.end)));
        if g.token <= highest {
            report.token_regressions += 1;
        }
        highest = g.token;
    }
    let mut writes = std::mem::take(&mut *writes.lock().unwrap());
    writes.sort();
    report.writes_accepted = writes.len() as u64;
    let mut highest = 0u64;
    for (_, token) in &writes {
        if *token < highest {
            report.stale_writes_accepted += 1;
        }
        highest = highest.max(*token);
    }
    report
}
