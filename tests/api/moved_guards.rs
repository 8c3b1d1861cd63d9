//! Guards that move between threads, as in a thread pool: a plain `LockGuard` belongs to no
//! thread, so a lock call never refuses because of the thread it runs on. Re-locking a key whose
//! plain guard the caller holds waits like any waiter (bounded by a timeout or a cancel); only a
//! `ReentrantGuard`, which cannot leave its thread, makes a plain lock of its key on that thread
//! fail with `WouldDeadlock`.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockGuard, LockOptions};

use crate::support::{lock_client, lock_exists, ms, RedisServer};

#[test]
fn a_thread_that_sent_its_guard_away_waits_for_the_lock_like_anyone() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let guard = client.lock("g4").unwrap();
    let first = guard.token();

    // Thread B takes the guard over and releases it 300 ms later.
    let (to_b, at_b) = mpsc::channel::<LockGuard>();
    let b = thread::spawn(move || {
        let guard = at_b.recv().unwrap();
        thread::sleep(ms(300));
        guard.unlock().unwrap();
    });
    to_b.send(guard).unwrap();

    // A asks again: the lock is B's now, so A waits for B's release and gets the next grant.
    let started = Instant::now();
    let again = client
        .try_lock("g4", Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("A's try_lock after sending its guard away: {e:?}"))
        .expect("B released within the timeout");
    let waited = started.elapsed();
    assert!(again.token() > first);
    assert!(
        waited >= ms(250) && waited < ms(1_500),
        "A waited {waited:?} for a release due 300 ms after the send"
    );
    b.join().unwrap();
    again.unlock().unwrap();
}

#[test]
fn a_thread_that_holds_a_moved_guard_waits_for_itself_until_its_bound() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let guard = client.lock("g5").unwrap();

    // B receives the guard and asks for the same key while holding it: a self-wait, as with
    // std's and parking_lot's mutexes. It ends at the timeout, or when cancelled.
    let b = {
        let client = client.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let got = client.try_lock("g5", ms(300)).unwrap();
            let waited = started.elapsed();
            assert!(got.is_none(), "granted a key this thread holds");
            assert!(
                waited >= ms(300) && waited < ms(1_000),
                "{waited:?} for a 300 ms timeout"
            );

            let (cancel, cancelled) = crossbeam_channel::bounded(1);
            let canceller = thread::spawn(move || {
                thread::sleep(ms(200));
                cancel.send(()).unwrap();
            });
            let err = client
                .lock_with("g5", &LockOptions::new().cancel(cancelled))
                .unwrap_err();
            assert!(err.is_cancelled(), "{err:?}");
            canceller.join().unwrap();

            assert!(guard.is_held(), "waiting must not cost the guard its lock");
            guard.unlock().unwrap();
        })
    };
    b.join().unwrap();
    assert!(!lock_exists(&mut server.connection(), "g5"));
}

#[test]
fn a_pool_of_workers_passing_guards_around_never_hits_would_deadlock() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 20;
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);

    // Each worker locks a key, hands the guard to the next worker, and takes the one handed to
    // it; the next round locks the same key again on a thread that no longer holds its guard.
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..WORKERS).map(|_| mpsc::channel::<LockGuard>()).unzip();
    let workers: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(i, inbox)| {
            let client = client.clone();
            let next = senders[(i + 1) % WORKERS].clone();
            thread::spawn(move || {
                let key = format!("pool:{i}");
                for round in 0..ROUNDS {
                    let guard = client
                        .try_lock(&key, Duration::from_secs(5))
                        .unwrap_or_else(|e| panic!("worker {i}, round {round}: {e:?}"))
                        .unwrap_or_else(|| panic!("worker {i}, round {round}: not granted"));
                    next.send(guard).unwrap();
                    let handed = inbox.recv_timeout(Duration::from_secs(5)).unwrap();
                    handed.unlock().unwrap();
                }
            })
        })
        .collect();
    drop(senders);
    for worker in workers {
        worker.join().unwrap();
    }
}

#[test]
fn a_reentrant_hold_refuses_a_plain_lock_on_its_own_thread_only() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let nested = client.reentrant_lock("twice").unwrap();
    for err in [
        client.lock("twice").unwrap_err(),
        client.try_lock("twice", ms(100)).unwrap_err(),
        client.try_lock("twice", Duration::ZERO).unwrap_err(),
    ] {
        assert!(err.is_would_deadlock(), "{err:?}");
    }
    // Another client is another lock holder: it waits rather than deadlocking.
    let other = lock_client(&server, 30_000);
    assert!(other.try_lock("twice", ms(100)).unwrap().is_none());
    // Another thread of the same client waits too.
    let elsewhere = {
        let client = client.clone();
        thread::spawn(move || client.try_lock("twice", ms(100)).map(|g| g.is_none()))
    };
    assert!(elsewhere.join().unwrap().unwrap());
    drop(nested);
    client.lock("twice").unwrap().unlock().unwrap();
}
