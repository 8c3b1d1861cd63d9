//! Releases of many threads go out together: one pipeline, one read for Redis.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use crate::support;
use crate::support::proxy::Proxy;
use crate::support::{info_stat, lock_client, lock_client_at, lock_exists, RedisServer};

/// Runs `rounds` rounds in which `threads` threads each take a key of their own and then all
/// unlock at once; every unlock must succeed. Returns how many unlocks there were.
fn unlock_together(client: &fencelock::LockClient, threads: usize, rounds: usize) -> usize {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (client, barrier) = (client.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                for round in 0..rounds {
                    let guard = client.lock(&format!("together:{t}")).unwrap();
                    barrier.wait();
                    guard
                        .unlock()
                        .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
                    barrier.wait();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    threads * rounds
}

#[test]
fn concurrent_unlocks_share_round_trips() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();
    // Warm up: every thread's pooled connection exists.
    unlock_together(&client, 16, 1);
    let (reads, calls) = (
        info_stat(&mut con, "total_reads_processed"),
        support::command_calls(&mut con, "evalsha"),
    );
    let unlocks = unlock_together(&client, 16, 20);
    let reads = info_stat(&mut con, "total_reads_processed") - reads;
    let calls = support::command_calls(&mut con, "evalsha") - calls;
    // Each round: 16 acquires, each read alone, and 16 releases in a few batches.
    assert_eq!(
        calls,
        2 * unlocks as u64,
        "one script call per lock and per unlock"
    );
    assert!(
        reads < calls * 3 / 4,
        "{reads} reads for {calls} script calls: releases were not combined"
    );
    for t in 0..16 {
        assert!(!lock_exists(&mut con, &format!("together:{t}")));
    }
}

#[test]
fn combined_unlocks_survive_a_connection_reset() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = lock_client_at(&proxy.url(), 10_000);
    const THREADS: usize = 8;
    const ROUNDS: usize = 20;
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (client, barrier, errors) =
                (client.clone(), Arc::clone(&barrier), Arc::clone(&errors));
            thread::spawn(move || {
                for round in 0..ROUNDS {
                    let guard = client.lock(&format!("reset:{t}"));
                    barrier.wait();
                    // Errors are collected, not panicked on: a panic would leave the others
                    // waiting at the barrier.
                    let outcome = guard.and_then(|g| g.unlock());
                    if let Err(e) = outcome {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("round {round}, thread {t}: {e:?}"));
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    for round in 0..ROUNDS {
        barrier.wait();
        // Break every connection while the unlocks are on their way, at a different moment
        // each round.
        thread::sleep(Duration::from_micros(50 * round as u64));
        // Closes what is open without refusing new connections: Reset then Pass would refuse
        // the retry's fresh connection too whenever this thread is descheduled between the
        // two, a second fault in one round.
        proxy.close_connections();
        barrier.wait();
    }
    for h in handles {
        h.join().unwrap();
    }
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} failed: {:?}",
        errors.len(),
        &errors[..]
    );
    let mut con = server.connection();
    for t in 0..THREADS {
        assert!(!lock_exists(&mut con, &format!("reset:{t}")));
    }
}
