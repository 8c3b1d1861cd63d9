//! Fairness between clients: a client whose threads pass a lock among themselves must not
//! starve another client's waiter. The library bounds local handoffs in a row (8) while other
//! clients wait; that count must survive the client's local queue for the key emptying between
//! handoffs, which is what happens when just two threads pass the key back and forth.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::support::{lock_client, ms, RedisServer};

/// How long the busy threads run at most, whatever happens to the test.
const BUSY_FOR: Duration = Duration::from_secs(25);

/// The busy client's threads: stopped and joined on drop, so they end on every path out of the
/// test (a failed assertion included). Each is bounded by `BUSY_FOR` and waits for the lock with
/// a timeout, so the join is bounded too.
struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    acquisitions: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Busy {
    fn start(client: &fencelock::LockClient, key: &'static str, threads: usize) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let acquisitions = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..threads)
            .map(|_| {
                let client = client.clone();
                let (stop, acquisitions, errors) = (
                    Arc::clone(&stop),
                    Arc::clone(&acquisitions),
                    Arc::clone(&errors),
                );
                thread::spawn(move || {
                    let start = Instant::now();
                    while !stop.load(Ordering::SeqCst) && start.elapsed() < BUSY_FOR {
                        let guard = match client.try_lock(key, Duration::from_secs(2)) {
                            Ok(Some(guard)) => guard,
                            Ok(None) => continue,
                            Err(e) => {
                                errors.lock().unwrap().push(format!("lock: {e}"));
                                break;
                            }
                        };
                        acquisitions.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(ms(5));
                        if let Err(e) = guard.unlock() {
                            errors.lock().unwrap().push(format!("unlock: {e}"));
                            break;
                        }
                    }
                })
            })
            .collect();
        Busy {
            stop,
            threads,
            acquisitions,
            errors,
        }
    }

    fn acquisitions(&self) -> u64 {
        self.acquisitions.load(Ordering::SeqCst)
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Two threads of client A pass a key back and forth (lock, 5 ms, unlock); client B, queued in
/// Redis, gets its turn after a bounded number of A's holds, long before its 15 s timeout.
#[test]
fn two_threads_passing_a_key_back_and_forth_do_not_starve_another_client() {
    let server = RedisServer::start();
    let a = lock_client(&server, 2_000);
    let b = lock_client(&server, 2_000);
    let key = "ping-pong";

    let busy = Busy::start(&a, key, 2);
    // Let A's two threads get into their back-and-forth.
    let warmup = Instant::now();
    while busy.acquisitions() < 20 {
        assert!(
            warmup.elapsed() < Duration::from_secs(10),
            "client A never got going: {} holds, errors {:?}",
            busy.acquisitions(),
            busy.errors()
        );
        thread::sleep(ms(5));
    }

    let before = busy.acquisitions();
    let asked = Instant::now();
    let got = b.try_lock(key, Duration::from_secs(15)).unwrap();
    let waited = asked.elapsed();
    let passed = busy.acquisitions() - before;
    let granted = got.is_some();
    if let Some(guard) = got {
        guard.unlock().unwrap();
    }
    let errors = busy.errors();
    drop(busy);
    eprintln!("client B: granted {granted} after {waited:?}; client A held the lock {passed} times meanwhile");

    assert!(errors.is_empty(), "client A's threads failed: {errors:?}");
    assert!(
        granted,
        "client B got no turn in {waited:?} while client A took the lock {passed} times"
    );
    // 8 local handoffs in a row, give or take the holds around B's queuing; generous.
    assert!(
        passed <= 64,
        "client A took the lock {passed} times before client B's turn ({waited:?})"
    );
}
