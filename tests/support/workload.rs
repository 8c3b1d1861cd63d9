//! A workload for failover tests: threads of several clients taking and releasing locks on a
//! few keys, every hold recorded for the history check.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, LockGuard};

use super::history::{History, Hold};
use super::ms;

/// Threads of several clients taking and releasing locks on a few keys, recording every hold.
pub struct Workload {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
    history: History,
    /// Grants per client.
    grants: Vec<Arc<AtomicU64>>,
    errors: Arc<AtomicU64>,
}

impl Workload {
    pub fn start(clients: &[LockClient], threads_per_client: usize, keys: usize) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let history = History::new();
        let errors = Arc::new(AtomicU64::new(0));
        let mut grants = Vec::new();
        let mut threads = Vec::new();
        for (c, client) in clients.iter().enumerate() {
            let granted = Arc::new(AtomicU64::new(0));
            grants.push(Arc::clone(&granted));
            for t in 0..threads_per_client {
                let (client, stop, history, errors, granted) = (
                    client.clone(),
                    Arc::clone(&stop),
                    history.clone(),
                    Arc::clone(&errors),
                    Arc::clone(&granted),
                );
                let holder = c * 100 + t;
                threads.push(thread::spawn(move || {
                    let mut n = holder;
                    while !stop.load(Ordering::Relaxed) {
                        n = n.wrapping_mul(31).wrapping_add(7);
                        let key = format!("k{}", n % keys);
                        match client.try_lock(&key, ms(1500)) {
                            Ok(Some(guard)) => {
                                granted.fetch_add(1, Ordering::Relaxed);
                                hold(&guard, &key, holder, ms(3), &history);
                            }
                            Ok(None) => {}
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                thread::sleep(ms(20));
                            }
                        }
                    }
                }));
            }
        }
        Workload {
            stop,
            threads,
            history,
            grants,
            errors,
        }
    }

    pub fn grants(&self) -> Vec<u64> {
        self.grants
            .iter()
            .map(|g| g.load(Ordering::Relaxed))
            .collect()
    }

    /// Until every client has granted `more` locks beyond `since`; panics after `timeout`.
    pub fn await_grants(&self, since: &[u64], more: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.grants();
            if now.iter().zip(since).all(|(n, s)| *n >= s + more) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "clients stopped granting: {since:?} then {now:?} ({} errors)",
                self.errors.load(Ordering::Relaxed)
            );
            thread::sleep(ms(20));
        }
    }

    pub fn stop(self) -> History {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.history
    }
}

/// Holds `guard` for about `time`, and records the hold up to the last moment it was seen held:
/// a lock lost meanwhile (a failover that lost it) ends there.
pub fn hold(guard: &LockGuard, key: &str, holder: usize, time: Duration, history: &History) {
    let start = Instant::now();
    let token = guard.token().as_u64();
    let mut end = start;
    let until = start + time;
    loop {
        let now = Instant::now();
        if !guard.is_held() {
            break;
        }
        end = now;
        if now >= until {
            break;
        }
        thread::sleep(ms(1));
    }
    history.record(Hold {
        key: key.to_owned(),
        holder,
        token,
        start,
        end,
    });
}
