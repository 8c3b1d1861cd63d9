//! Redis restarts under a live client: the same client keeps working, pub/sub included.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::{lock_client, ms, release_channels, RedisServer};

/// Waits until `n` clients are subscribed to their release channels.
fn await_subscribers(server: &RedisServer, n: usize) {
    let mut con = server.connection();
    let deadline = Instant::now() + Duration::from_secs(5);
    while release_channels(&mut con)
        .iter()
        .filter(|(_, subscribers)| *subscribers == 1)
        .count()
        < n
    {
        assert!(
            Instant::now() < deadline,
            "pub/sub connections were not re-established"
        );
        thread::sleep(ms(20));
    }
}

#[test]
fn the_same_client_recovers_after_a_restart() {
    let mut server = RedisServer::start();
    let a = lock_client(&server, 30_000);
    let b = lock_client(&server, 30_000);
    // Fill both pools with connections that the restart will break.
    let guards: Vec<_> = (0..4).map(|i| a.lock(&format!("k{i}")).unwrap()).collect();
    drop(guards);
    b.lock("k0").unwrap().unlock().unwrap();
    await_subscribers(&server, 2);

    server.restart();

    // No rebuild, no error: stale pooled connections are replaced on first use.
    let guard = a.lock("after").unwrap();
    assert!(guard.is_held());
    guard.unlock().unwrap();

    // And the pub/sub connections came back: a release wakes a waiter at once.
    await_subscribers(&server, 2);
    let held = a.lock("handoff").unwrap();
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let got = b.lock("handoff").unwrap();
        tx.send(Instant::now()).unwrap();
        got.unlock().unwrap();
    });
    support::await_queue_len(&mut server.connection(), "handoff", 1);
    let released = Instant::now();
    held.unlock().unwrap();
    let granted = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("waiter never woke");
    assert!(granted.duration_since(released) < ms(100));
    t.join().unwrap();
}

#[test]
fn a_waiter_gets_an_answer_when_redis_goes_away() {
    let mut server = RedisServer::start();
    let holder = lock_client(&server, 2_000);
    let waiter = lock_client(&server, 30_000);
    let _guard = holder.lock("outage").unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        tx.send(waiter.try_lock("outage", Duration::from_secs(60)))
            .unwrap();
    });
    thread::sleep(ms(200));
    server.kill();
    // The waiter retries when the holder's lease would run out; with Redis gone that attempt
    // fails and ends the wait with a connection error instead of hanging.
    let answer = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("waiter hung");
    let err = answer.expect_err("no lock can be granted by a dead server");
    assert!(err.is_connection(), "{err:?}");
}
