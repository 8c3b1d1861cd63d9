//! Waiting without polling: a release wakes a waiter at once, and only one.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::{await_queue_len, command_calls, lock_client, ms, RedisServer};

#[test]
fn a_waiter_in_another_client_wakes_soon_after_a_release() {
    let server = RedisServer::start();
    // A 30 s lease: without the release message the waiter would sleep for 30 s.
    let holder = lock_client(&server, 30_000);
    let waiter = lock_client(&server, 30_000);
    for round in 0..3 {
        let guard = holder.lock("handoff").unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = waiter.clone();
        let t = thread::spawn(move || {
            let got = waiter.lock("handoff").unwrap();
            tx.send(Instant::now()).unwrap();
            got.unlock().unwrap();
        });
        await_queue_len(&mut server.connection(), "handoff", 1);
        let released = Instant::now();
        guard.unlock().unwrap();
        let granted = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("waiter never woke");
        let latency = granted.duration_since(released);
        assert!(
            latency < ms(100),
            "round {round}: woke {latency:?} after the release"
        );
        t.join().unwrap();
    }
}

#[test]
fn one_release_wakes_one_waiter_and_local_waiters_are_served_in_order() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let waiters = lock_client(&server, 30_000);
    let guard = holder.lock("queue").unwrap();
    let (tx, rx) = mpsc::channel();
    let mut con = server.connection();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let client = waiters.clone();
            let tx = tx.clone();
            let (tid_tx, tid_rx) = mpsc::channel();
            let t = thread::spawn(move || {
                tid_tx.send(support::own_tid()).unwrap();
                let got = client.lock("queue").unwrap();
                tx.send(i).unwrap();
                thread::sleep(ms(100));
                got.unlock().unwrap();
            });
            // Join the queue in a known order: the first in Redis' queue, each next one parked
            // behind it in the client's own before the next starts.
            let tid = tid_rx.recv().unwrap();
            if i == 0 {
                support::await_queue_len(&mut con, "queue", 1);
            }
            support::await_parked(tid, Duration::from_secs(10));
            t
        })
        .collect();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    guard.unlock().unwrap();
    let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    thread::sleep(ms(5));
    // The release and the head's grant; the seven behind it stay quiet.
    let calls = command_calls(&mut con, "evalsha");
    assert!(
        calls <= 3,
        "{calls} script calls for one handoff to 8 waiters"
    );
    let mut order = vec![first];
    order.extend((1..8).map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap()));
    assert_eq!(
        order,
        (0..8).collect::<Vec<_>>(),
        "not served in arrival order"
    );
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_release_publishes_only_when_someone_waits() {
    let server = RedisServer::start();
    let a = lock_client(&server, 30_000);
    let b = lock_client(&server, 30_000);
    let mut con = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    for _ in 0..20 {
        a.lock("quiet").unwrap().unlock().unwrap();
    }
    assert_eq!(
        command_calls(&mut con, "publish"),
        0,
        "published with nobody waiting"
    );

    let held = a.lock("quiet").unwrap();
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let got = b.lock("quiet").unwrap();
        tx.send(()).unwrap();
        got.unlock().unwrap();
    });
    await_queue_len(&mut server.connection(), "quiet", 1);
    held.unlock().unwrap();
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the waiter was not woken");
    t.join().unwrap();
    assert_eq!(command_calls(&mut con, "publish"), 1);
}
