//! Per-lock options: a lease of its own, renewal off, explicit extend, a maximum hold time,
//! cancellation of a wait, and namespaces that never contend.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, LockOptions};

use crate::support;
use crate::support::{lock_client, lock_pttl, ms, RedisServer};

fn pttl(server: &RedisServer, key: &str) -> i64 {
    lock_pttl(&mut server.connection(), key)
}

#[test]
fn a_lock_can_have_a_lease_of_its_own() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let guard = client
        .lock_with("short", &LockOptions::new().lease(ms(500)))
        .unwrap();
    assert_eq!(guard.lease(), ms(500));
    let left = pttl(&server, "short");
    assert!(left > 0 && left <= 500, "pttl {left}");
    let err = client
        .lock_with("bad", &LockOptions::new().lease(ms(3)))
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
}

#[test]
fn without_renewal_the_lease_runs_out_and_is_reported() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let options = LockOptions::new().lease(ms(200)).renew(false);
    let guard = client.lock_with("unrenewed", &options).unwrap();
    assert!(guard.lost().recv_timeout(ms(700)).is_ok(), "no loss signal");
    assert!(!guard.is_held());
    let took_over = rival.try_lock("unrenewed", ms(500)).unwrap();
    assert!(took_over.is_some_and(|g| g.token() > guard.token()));
}

#[test]
fn extend_keeps_an_unrenewed_lock_and_sets_the_lease() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let options = LockOptions::new().lease(ms(600)).renew(false);
    let guard = client.lock_with("extended", &options).unwrap();
    let until = Instant::now() + ms(2_000);
    while Instant::now() < until {
        thread::sleep(ms(150));
        guard.extend(ms(600)).unwrap();
        assert!(guard.is_held());
    }
    guard.extend(ms(3_000)).unwrap();
    assert!(pttl(&server, "extended") > 2_000);
    // The longer lease now counts locally too.
    thread::sleep(ms(900));
    assert!(guard.is_held());
    assert!(guard.extend(ms(1)).unwrap_err().is_invalid_argument());
    guard.unlock().unwrap();
}

#[test]
fn extend_of_a_lost_lock_reports_the_loss() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let guard = client.lock("vanishing").unwrap();
    let mut con = server.connection();
    let _: () = redis::cmd("DEL")
        .arg("test:lock:{vanishing}")
        .query(&mut con)
        .unwrap();
    let err = guard.extend(ms(5_000)).unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(!guard.is_held());
    assert!(guard.lost().try_recv().is_ok());
}

#[test]
fn max_hold_stops_renewal_and_reports_loss() {
    let server = RedisServer::start();
    // A 1 s lease: renewal keeps it through a busy machine's delays (a 300 ms one was once lost
    // before its bound under load).
    let client = lock_client(&server, 1_000);
    let rival = lock_client(&server, 1_000);
    let granted = Instant::now();
    let guard = client
        .lock_with("bounded", &LockOptions::new().max_hold(ms(3_000)))
        .unwrap();
    assert!(
        guard.lost().recv_timeout(ms(8_000)).is_ok(),
        "never stopped"
    );
    let held_for = granted.elapsed();
    // Renewed while under the bound (several leases), then it ran out within about a lease.
    assert!(
        held_for >= ms(2_950),
        "lost after {held_for:?}, before its bound"
    );
    assert!(
        held_for <= ms(3_000 + 1_000 + 300),
        "lost after {held_for:?}"
    );
    assert!(rival.try_lock("bounded", ms(500)).unwrap().is_some());

    // A hold that ends before its bound is unaffected.
    let early = client
        .lock_with("early", &LockOptions::new().max_hold(ms(4_000)))
        .unwrap();
    thread::sleep(ms(900));
    assert!(early.is_held());
    early.unlock().unwrap();
}

#[test]
fn a_wait_can_be_cancelled_and_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let waiter = lock_client(&server, 30_000);
    let held = holder.lock("contended").unwrap();

    let (cancel, cancelled) = crossbeam_channel::bounded(1);
    let options = LockOptions::new().cancel(cancelled);
    let t = {
        let waiter = waiter.clone();
        thread::spawn(move || {
            let result = waiter.lock_with("contended", &options);
            (result.map(|g| g.token()), Instant::now())
        })
    };
    thread::sleep(ms(200));
    let sent = Instant::now();
    cancel.send(()).unwrap();
    let (result, returned) = t.join().unwrap();
    assert!(result.unwrap_err().is_cancelled());
    assert!(returned.duration_since(sent) < ms(100));

    // Dropping the sender cancels every wait sharing the receiver.
    let (cancel_all, cancelled) = crossbeam_channel::bounded::<()>(1);
    let waits: Vec<_> = (0..3)
        .map(|_| {
            let waiter = waiter.clone();
            let options = LockOptions::new().cancel(cancelled.clone());
            thread::spawn(move || waiter.lock_with("contended", &options).map(|_| ()))
        })
        .collect();
    thread::sleep(ms(200));
    drop(cancel_all);
    for w in waits {
        assert!(w.join().unwrap().unwrap_err().is_cancelled());
    }

    held.unlock().unwrap();
    let mut con = server.connection();
    let left: bool = redis::cmd("EXISTS")
        .arg("test:lock:{contended}")
        .query(&mut con)
        .unwrap();
    assert!(!left, "a cancelled waiter left a lock behind");
}

#[test]
fn different_namespaces_never_contend() {
    let server = RedisServer::start();
    let build = |ns: &str| {
        LockClient::builder(server.url())
            .namespace(ns)
            .build()
            .unwrap()
    };
    let (a, b) = (build("orders"), build("billing"));
    let ga = a.lock("42").unwrap();
    let gb = b.try_lock("42", Duration::ZERO).unwrap();
    assert!(gb.is_some(), "namespaces contended");
    // The same namespace does contend, from another client too.
    let a2 = build("orders");
    assert!(a2.try_lock("42", Duration::ZERO).unwrap().is_none());
    drop(ga);
}

/// A thread queued behind a holder of its own client never asks Redis, so it sets no wait mark.
/// When that holder's short, unrenewed lease runs out and its unlock finds the lock lost, the
/// waiter must still be woken at once, not after its own (long) lease.
#[test]
fn a_waiter_behind_a_local_holder_whose_lease_ran_out_is_not_stranded() {
    let server = RedisServer::start();
    let remote = lock_client(&server, 30_000);
    let client = lock_client(&server, 30_000);
    let first = remote.lock("relay").unwrap();

    let short = LockOptions::new().lease(ms(200)).renew(false);
    let holder = {
        let client = client.clone();
        thread::spawn(move || {
            let guard = client.lock_with("relay", &short).unwrap();
            let granted = Instant::now();
            thread::sleep(ms(500));
            assert!(guard.unlock().unwrap_err().is_lock_lost());
            granted
        })
    };
    // The holder waits in Redis' queue first.
    support::await_queue_len(&mut server.connection(), "relay", 1);
    let waiter = {
        let client = client.clone();
        thread::spawn(move || {
            let long = LockOptions::new().lease(ms(20_000));
            let guard = client.lock_with("relay", &long).unwrap();
            let granted = Instant::now();
            guard.unlock().unwrap();
            granted
        })
    };
    thread::sleep(ms(100));
    first.unlock().unwrap();
    let holder_granted = holder.join().unwrap();
    let waiter_granted = waiter.join().unwrap();
    let waited = waiter_granted.duration_since(holder_granted);
    assert!(
        waited < ms(2_000),
        "the waiter got the free key {waited:?} after the holder"
    );
}
