//! A lock handed over by another client's release starts with a lease of at most 5 s (so that a
//! waiter that died while queued costs the others little). The waiter confirms its own lease
//! with one extend before it makes a guard when the handoff arrives late, or when nothing would
//! renew the lease in time. These tests check what happens around that confirmation:
//!
//! - a handoff that turns out stale (the capped grant ran out before the waiter heard of it)
//!   must not strand the client's other waiters for the key: nothing else would wake them while
//!   the key sits free in Redis;
//! - a confirmation that fails (times out) must hand the lock on, or at least wake the client's
//!   next waiter, rather than leave the lock held by nobody for the waiter's whole lease;
//! - a waiter with a maximum hold shorter than the first renewal must still get the lease it
//!   asked for, not the 5 s of the handoff.
//!
//! Faults go through the support's TCP proxy; every server is a throwaway `redis-server`.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, LockOptions};

use crate::support;
use crate::support::proxy::{Mode, Proxy};
use crate::support::{
    await_queue_len, lock_client, lock_exists, lock_pttl, ms, RedisServer, NAMESPACE,
};

#[test]
fn a_stale_handoff_wakes_the_clients_next_waiter() {
    const KEY: &str = "stale-handoff";
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let x = lock_client(&server, 10_000);
    // A 200 ms lease: the handoff to it runs out while the proxy holds its connections back.
    let a = LockClient::builder(proxy.url())
        .namespace(NAMESPACE)
        .lease(ms(200))
        .build()
        .unwrap();
    let mut con = server.connection();

    let held = x.lock(KEY).unwrap();
    // Each waiter's thread id comes first, for await_parked.
    let waiter = |timeout: Duration| {
        let a = a.clone();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let t = thread::spawn(move || {
            tid_tx.send(support::own_tid()).unwrap();
            let got = a.try_lock(KEY, timeout).map(|g| g.map(|g| g.token()));
            (got, Instant::now())
        });
        (t, tid_rx.recv().unwrap())
    };
    let (first, _) = waiter(Duration::from_secs(12));
    await_queue_len(&mut con, KEY, 1);
    let (second, second_tid) = waiter(Duration::from_secs(14));
    // The second waits in A's local queue behind the first.
    support::await_parked(second_tid, Duration::from_secs(10));

    // Hold back A's connections (its pub/sub one included) while X hands the lock to the first
    // waiter and that 200 ms grant runs out unheard of.
    proxy.set_mode(Mode::HoldExisting(ms(30_000)));
    held.unlock().unwrap();
    // The handed grant (200 ms) runs out in Redis, unheard of by A.
    if let Err(why) = support::poll_until(Duration::from_secs(10), ms(10), || {
        if lock_exists(&mut con, KEY) {
            Err("the key is still held".to_string())
        } else {
            Ok(())
        }
    }) {
        panic!("the handed grant never ran out: {why}");
    }
    let released = Instant::now();
    proxy.release_held();

    let (got_first, first_at) = first.join().unwrap();
    let (got_second, second_at) = second.join().unwrap();
    let (got_first, got_second) = (got_first.unwrap(), got_second.unwrap());
    assert!(
        got_first.is_some() && got_second.is_some(),
        "with the key free in Redis, waiters got {got_first:?} after {:?} and {got_second:?} \
         after {:?}",
        first_at - released,
        second_at - released
    );
    let last = first_at.max(second_at) - released;
    assert!(
        last < Duration::from_secs(8),
        "the client's waiters took {last:?} to get a free key"
    );
}

#[test]
fn a_confirmation_that_times_out_hands_the_lock_on() {
    const KEY: &str = "unconfirmed";
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let x = lock_client(&server, 10_000);
    let a = LockClient::builder(proxy.url())
        .namespace(NAMESPACE)
        .lease(ms(60_000))
        .response_timeout(ms(300))
        .build()
        .unwrap();
    let mut con = server.connection();

    let held = x.lock(KEY).unwrap();
    let first = {
        let a = a.clone();
        thread::spawn(move || a.lock(KEY).map(|g| g.token()))
    };
    await_queue_len(&mut con, KEY, 1);
    // The client's second waiter, behind the first in its local queue. Calls that fail (the
    // proxy below slows every round trip past the response timeout) are made again.
    let second = {
        let a = a.clone();
        thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(20);
            let mut errors = Vec::new();
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                match a.try_lock(KEY, left) {
                    Ok(got) => return (got.map(|g| g.token()), Instant::now(), errors),
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (None, Instant::now(), errors)
        })
    };
    // Past half of the 5 s handoff lease, so the first waiter confirms before it makes a guard;
    // before its own 5 s look.
    thread::sleep(ms(3_000));
    // Round trips of 800 ms: the confirming extend times out (the pub/sub message still comes).
    proxy.set_mode(Mode::Delay(ms(400)));
    held.unlock().unwrap();
    let unlocked = Instant::now();
    let outcome = first.join().unwrap();
    proxy.set_mode(Mode::Pass);

    // Whether the first waiter's lock() failed or its guard was dropped at once (the thread kept
    // only the token), the second must not be left asleep while the lock is free or unheld.
    let (got, at, errors) = second.join().unwrap();
    assert!(
        got.is_some(),
        "the first waiter ended with {outcome:?}; the second got nothing in 20 s (errors: \
         {errors:?}; PTTL now {} ms)",
        lock_pttl(&mut con, KEY)
    );
    let waited = at - unlocked;
    assert!(
        waited < Duration::from_secs(12),
        "the second waiter got the lock {waited:?} after the unlock"
    );
}

#[test]
fn a_short_max_hold_still_gets_the_whole_lease_of_a_handoff() {
    const KEY: &str = "max-hold-handoff";
    let server = RedisServer::start();
    let x = lock_client(&server, 10_000);
    let a = lock_client(&server, 30_000);
    let mut con = server.connection();
    // Renewal stops after 1 s, before the first renewal of a 5 s handoff lease would be due.
    let options = LockOptions::new().max_hold(ms(1_000));

    let held = x.lock(KEY).unwrap();
    let waiting = {
        let a = a.clone();
        thread::spawn(move || a.lock_with(KEY, &options).unwrap())
    };
    await_queue_len(&mut con, KEY, 1);
    thread::sleep(ms(200));
    held.unlock().unwrap();
    let guard = waiting.join().unwrap();
    let pttl = lock_pttl(&mut con, KEY);
    assert!(
        pttl > 20_000,
        "a handoff with a 30 s lease has {pttl} ms left in Redis"
    );
    // Past the 5 s of the handoff lease: still held, as a lock taken directly would be.
    thread::sleep(ms(6_000));
    assert!(guard.is_held(), "lost before its 30 s lease ran out");
    guard.unlock().unwrap();
}
