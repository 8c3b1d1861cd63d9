//! A workload of threads on several clients that lock keys, record every hold for the history
//! check, and write through a fenced store while they hold: the quorum tests' and the soaks'.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient, LockGuard};

use super::history::{History, Hold};
use super::{ms, Rng};

/// Lock-holding threads on several clients, with fenced writes to a store.
///
/// Each thread takes a random key with `try_lock`, holds it for a few ms (now and then for
/// longer than a lease, so renewals run under the faults too) and records the hold from the
/// grant to the last moment it saw `is_held()` true, which is what a careful holder acts on.
/// While held it writes through the fenced store (`incr_by` on a resource per key): the value
/// each accepted write returns is the store's own order of application.
pub struct Workload {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// How a [`Workload`] runs.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub threads_per_client: usize,
    pub keys: Vec<String>,
    /// `try_lock`'s timeout.
    pub wait: Duration,
    /// A long hold, one in `long_one_in`: longer than a lease, so that renewal runs.
    pub long_hold: Duration,
    pub long_one_in: u64,
    /// No thread runs longer than this, whatever `stop` does.
    pub max_run: Duration,
    pub seed: u64,
}

impl WorkloadConfig {
    pub fn new(keys: &[&str], lease: Duration) -> WorkloadConfig {
        WorkloadConfig {
            threads_per_client: 4,
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            wait: Duration::from_secs(1),
            long_hold: lease * 3 / 2,
            long_one_in: 8,
            max_run: Duration::from_secs(60),
            seed: 0x5eed,
        }
    }
}

#[derive(Default)]
struct Shared {
    history: History,
    grants: AtomicU64,
    /// Grants whose holder never saw them held (the reply came after the validity ran out).
    never_held: AtomicU64,
    /// Holds that turned false before their holder released them.
    lost: AtomicU64,
    errors: AtomicU64,
    /// (resource, value the store returned, token) of every accepted write.
    writes: Mutex<Vec<(String, i64, u64)>>,
    stale_rejected: AtomicU64,
    write_errors: AtomicU64,
}

/// What a [`Workload`] saw.
pub struct Outcome {
    pub history: History,
    pub grants: u64,
    pub never_held: u64,
    pub lost: u64,
    pub errors: u64,
    pub writes: Vec<(String, i64, u64)>,
    pub stale_rejected: u64,
    pub write_errors: u64,
}

impl Workload {
    pub fn start(clients: &[LockClient], store: &FencedRedis, config: &WorkloadConfig) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared::default());
        let end = Instant::now() + config.max_run;
        let mut threads = Vec::new();
        for (c, client) in clients.iter().enumerate() {
            for t in 0..config.threads_per_client {
                let holder = c * 100 + t;
                let (client, store, stop, shared, config) = (
                    client.clone(),
                    store.clone(),
                    Arc::clone(&stop),
                    Arc::clone(&shared),
                    config.clone(),
                );
                let mut rng = Rng(config.seed ^ (holder as u64 + 1).wrapping_mul(0x9e37_79b9));
                threads.push(thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                        let key = &config.keys[rng.below(config.keys.len() as u64) as usize];
                        match client.try_lock(key, config.wait) {
                            Ok(Some(guard)) => {
                                shared.grants.fetch_add(1, Ordering::Relaxed);
                                let time = if rng.below(config.long_one_in) == 0 {
                                    config.long_hold
                                } else {
                                    Duration::from_micros(1_000 + rng.below(4_000))
                                };
                                hold(&guard, key, holder, time, &store, &shared);
                                let _ = guard.unlock();
                            }
                            Ok(None) => {}
                            Err(_) => {
                                shared.errors.fetch_add(1, Ordering::Relaxed);
                                thread::sleep(ms(10));
                            }
                        }
                    }
                }));
            }
        }
        Workload {
            stop,
            threads,
            shared,
        }
    }

    pub fn grants(&self) -> u64 {
        self.shared.grants.load(Ordering::Relaxed)
    }

    pub fn errors(&self) -> u64 {
        self.shared.errors.load(Ordering::Relaxed)
    }

    /// Waits until `more` grants beyond `since` were made; panics after `timeout`.
    pub fn await_grants(&self, since: u64, more: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.grants() < since + more {
            assert!(
                Instant::now() < deadline,
                "only {} of {more} grants within {timeout:?} ({} errors)",
                self.grants() - since,
                self.errors()
            );
            thread::sleep(ms(10));
        }
    }

    pub fn stop(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join()
                .unwrap_or_else(|_| panic!("a workload thread panicked"));
        }
        let shared = Arc::try_unwrap(self.shared)
            .unwrap_or_else(|_| panic!("the workload's threads are joined"));
        Outcome {
            history: shared.history,
            grants: shared.grants.into_inner(),
            never_held: shared.never_held.into_inner(),
            lost: shared.lost.into_inner(),
            errors: shared.errors.into_inner(),
            writes: shared
                .writes
                .into_inner()
                .unwrap_or_else(|p| p.into_inner()),
            stale_rejected: shared.stale_rejected.into_inner(),
            write_errors: shared.write_errors.into_inner(),
        }
    }
}

/// The fenced store's resource for lock `key`.
pub fn resource(key: &str) -> String {
    format!("res-{key}")
}

fn hold(
    guard: &LockGuard,
    key: &str,
    holder: usize,
    time: Duration,
    store: &FencedRedis,
    shared: &Shared,
) {
    let start = Instant::now();
    let token = guard.token();
    let until = start + time;
    let mut end = None;
    let mut wrote = false;
    // Bounded: one pass a ms until `time` is up, and the lock's loss ends it sooner.
    let max_passes = time.as_millis() as u64 + 2;
    for _ in 0..max_passes {
        if !guard.is_held() {
            if end.is_some() {
                shared.lost.fetch_add(1, Ordering::Relaxed);
            }
            break;
        }
        end = Some(Instant::now());
        if !wrote || Instant::now() >= until {
            wrote = true;
            match store.incr_by(&resource(key), token, 1) {
                Ok(value) => shared
                    .writes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((resource(key), value, token.as_u64())),
                Err(e) if e.is_stale_token() => {
                    shared.stale_rejected.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    shared.write_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if Instant::now() >= until {
            break;
        }
        thread::sleep(ms(1));
    }
    match end {
        // Only holds a holder acted on count: a grant never seen held (its reply came after its
        // validity ran out) is one its holder does nothing with, and its start says nothing
        // about the order of grants.
        Some(end) => shared.history.record(Hold {
            key: key.to_owned(),
            holder,
            token: token.as_u64(),
            start,
            end,
        }),
        None => {
            shared.never_held.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Outcome {
    /// Accepted writes applied after one with a higher token, per resource, in the store's own
    /// order.
    pub fn stale_accepted(&self) -> u64 {
        let mut writes = self.writes.clone();
        writes.sort();
        let mut stale = 0;
        let mut highest: Option<(&str, u64)> = None;
        for (resource, _, token) in &writes {
            match highest {
                Some((r, h)) if r == resource.as_str() => {
                    if *token < h {
                        stale += 1;
                    }
                    highest = Some((r, h.max(*token)));
                }
                _ => highest = Some((resource.as_str(), *token)),
            }
        }
        stale
    }

    /// One line for messages.
    pub fn summary(&self) -> String {
        format!(
            "{} grants ({} never seen held, {} lost while held), {} lock errors, {} writes \
             accepted, {} stale rejected, {} write errors",
            self.grants,
            self.never_held,
            self.lost,
            self.errors,
            self.writes.len(),
            self.stale_rejected,
            self.write_errors
        )
    }

    /// Panics unless the holds never overlapped, tokens rose per key in grant order, and the
    /// store accepted no stale write.
    pub fn assert_safe(&self) {
        if let Err(violations) = self.history.check() {
            panic!("{violations}\n({})", self.summary());
        }
        assert_eq!(
            self.stale_accepted(),
            0,
            "the fenced store accepted stale writes ({})",
            self.summary()
        );
    }
}
