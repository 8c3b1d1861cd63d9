//! Several workers contend for one lock; each writes under it with its fencing token, one holds
//! it across several leases to show renewal, and everything shuts down cleanly.
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server` on a free port and
//! stops it at the end.
//!
//!     cargo run --example quickstart

#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencingToken, LockClient};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = throwaway_redis::redis_url()?;
    println!("using {url}");

    let client = LockClient::builder(url.as_str())
        .namespace("quickstart")
        .lease(Duration::from_millis(300))
        .build()?;

    // The "storage": it remembers the highest token it accepted and refuses lower ones.
    let store = Arc::new(Mutex::new((FencingToken::from(0), Vec::new())));
    let started = Instant::now();

    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let client = client.clone();
            let store = Arc::clone(&store);
            thread::spawn(move || -> Result<(), fencelock::Error> {
                for round in 0..3 {
                    let guard = client.lock("shared-report")?;
                    let token = guard.token();
                    println!(
                        "{:>5} ms  worker {worker} got the lock, token {token}",
                        started.elapsed().as_millis()
                    );
                    {
                        let mut store = store.lock().unwrap();
                        assert!(token > store.0, "storage would reject a stale token");
                        store.0 = token;
                        store.1.push(format!("worker {worker} round {round}"));
                    }
                    thread::sleep(Duration::from_millis(20));
                    guard.unlock()?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker panicked")?;
    }

    // Renewal: hold a 300 ms lease for a full second; the renewal thread keeps it alive.
    let guard = client.lock("long-job")?;
    thread::sleep(Duration::from_secs(1));
    println!(
        "held 'long-job' for 1 s on a {:?} lease: still held = {}",
        client.lease(),
        guard.is_held()
    );
    guard.unlock()?;

    let (last, writes) = &*store.lock().unwrap();
    println!(
        "{} writes accepted, last token {last}; clean exit",
        writes.len()
    );
    Ok(())
}
