//! try_lock waits about its timeout and no longer; Duration::ZERO is exactly one attempt.

use std::time::{Duration, Instant};

use crate::support::{command_calls, lock_client, ms, RedisServer};

#[test]
fn try_lock_gives_up_near_its_timeout_on_a_held_key() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let waiter = lock_client(&server, 30_000);
    let _guard = holder.lock("busy").unwrap();
    for timeout in [ms(150), ms(400)] {
        let started = Instant::now();
        assert!(waiter.try_lock("busy", timeout).unwrap().is_none());
        let waited = started.elapsed();
        assert!(
            waited >= timeout,
            "gave up after {waited:?}, before its {timeout:?}"
        );
        assert!(
            waited < timeout + ms(250),
            "took {waited:?} for a {timeout:?} timeout"
        );
    }
}

#[test]
fn try_lock_gets_a_lock_released_within_its_timeout() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let waiter = lock_client(&server, 30_000);
    let guard = holder.lock("soon").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(ms(200));
        guard.unlock().unwrap();
    });
    let started = Instant::now();
    let got = waiter.try_lock("soon", Duration::from_secs(5)).unwrap();
    assert!(got.is_some());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    release.join().unwrap();
}

#[test]
fn zero_timeout_is_exactly_one_attempt() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let other = lock_client(&server, 30_000);
    let _guard = holder.lock("one-shot").unwrap();
    let mut con = server.connection();
    // Load the script so the attempt is one EVALSHA, then count from zero.
    assert!(other
        .try_lock("one-shot", Duration::ZERO)
        .unwrap()
        .is_none());
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();

    let started = Instant::now();
    assert!(other
        .try_lock("one-shot", Duration::ZERO)
        .unwrap()
        .is_none());
    assert!(started.elapsed() < ms(500));
    assert_eq!(command_calls(&mut con, "evalsha"), 1);
    assert_eq!(command_calls(&mut con, "eval"), 0);

    let free = other.try_lock("free", Duration::ZERO).unwrap();
    assert!(free.is_some_and(|g| g.is_held()));
}
