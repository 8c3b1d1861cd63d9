//! `LockClient::status`: held or free, the holder's exact token, its remaining lease, and the
//! clients waiting in Redis' queue, read without taking the lock.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::support;
use crate::support::{await_queue_len, fence_key, lock_client, lock_key, ms, RedisServer};

#[test]
fn a_free_key_is_free_with_no_token_lease_or_waiters() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let status = client.status("never-locked").unwrap();
    assert!(!status.held, "{status:?}");
    assert_eq!(status.token, None, "{status:?}");
    assert_eq!(status.remaining_lease, None, "{status:?}");
    assert_eq!(status.waiters, 0, "{status:?}");

    // Released: free again, though the fence counter stays (status reads it only while held).
    client.lock("released").unwrap().unlock().unwrap();
    let status = client.status("released").unwrap();
    assert!(!status.held && status.token.is_none(), "{status:?}");
}

#[test]
fn a_held_key_shows_the_holders_token_and_lease_from_any_client() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 10_000);
    let observer = lock_client(&server, 30_000);
    for _ in 0..3 {
        let guard = holder.lock("held").unwrap();
        let status = observer.status("held").unwrap();
        assert!(status.held, "{status:?}");
        assert_eq!(status.token, Some(guard.token()), "{status:?}");
        let left = status.remaining_lease.expect("a held lock has a lease");
        assert!(
            left > Duration::from_secs(5) && left <= Duration::from_secs(10),
            "{left:?} left of a 10 s lease just granted"
        );
        assert_eq!(status.waiters, 0, "{status:?}");
        guard.unlock().unwrap();
    }
}

/// A counter beyond 2^53 (set by hand) is reported exactly: the script hands it over as the
/// stored digits, never as a Lua double.
#[test]
fn the_token_is_exact_beyond_2_pow_53() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();
    // The grant's token, 2^53 + 3, is odd: a double cannot hold it.
    let start: u64 = (1 << 53) + 2;
    let _: () = redis::cmd("SET")
        .arg(fence_key("big"))
        .arg(start.to_string())
        .query(&mut con)
        .unwrap();
    let guard = client.lock("big").unwrap();
    assert_eq!(guard.token().as_u64(), start + 1);
    assert_eq!(client.status("big").unwrap().token, Some(guard.token()));
    guard.unlock().unwrap();
}

/// While held, a counter that is gone (expired during a very long hold, deleted) gives no
/// token rather than a wrong one; the rest of the status stands.
#[test]
fn a_held_key_without_its_counter_reports_no_token() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();
    let guard = client.lock("counterless").unwrap();
    let _: () = redis::cmd("DEL")
        .arg(fence_key("counterless"))
        .query(&mut con)
        .unwrap();
    let status = client.status("counterless").unwrap();
    assert!(status.held, "{status:?}");
    assert_eq!(status.token, None, "{status:?}");
    assert!(status.remaining_lease.is_some(), "{status:?}");
    guard.unlock().unwrap();
}

/// Waiting clients are counted once each, however many of their threads wait; a lock key
/// without expiry (set by hand) is held with no lease.
#[test]
fn waiters_are_counted_per_client() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 10_000);
    let mut con = server.connection();
    let key = "busy";
    let guard = holder.lock(key).unwrap();

    let (done_tx, done) = mpsc::channel();
    let mut threads = Vec::new();
    // Two clients; the second with two threads waiting.
    let first = lock_client(&server, 10_000);
    let second = lock_client(&server, 10_000);
    for client in [first.clone(), second.clone(), second.clone()] {
        let done_tx = done_tx.clone();
        threads.push(thread::spawn(move || {
            let got = client.try_lock(key, Duration::from_secs(30));
            let _ = done_tx.send(());
            got.map(|g| g.map(|g| g.unlock()))
        }));
    }
    await_queue_len(&mut con, key, 2);
    // Give the second client's other thread time to queue locally behind its head.
    thread::sleep(ms(100));
    let status = first.status(key).unwrap();
    assert!(status.held, "{status:?}");
    assert_eq!(status.waiters, 2, "{status:?}");
    assert_eq!(status.token, Some(guard.token()));

    guard.unlock().unwrap();
    for _ in 0..3 {
        done.recv_timeout(Duration::from_secs(30))
            .expect("every waiter got the lock in turn");
    }
    for t in threads {
        t.join().unwrap().unwrap().unwrap().unwrap();
    }
    let status = first.status(key).unwrap();
    assert_eq!((status.held, status.waiters), (false, 0), "{status:?}");

    let _: () = redis::cmd("SET")
        .arg(lock_key("by-hand"))
        .arg("someone")
        .query(&mut con)
        .unwrap();
    let status = first.status("by-hand").unwrap();
    assert!(status.held, "{status:?}");
    assert_eq!(status.remaining_lease, None, "{status:?}");
}

/// A waiter that died while queued is counted until its entry expires, then not.
#[test]
fn an_expired_queue_entry_is_not_counted() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();
    let entries = format!("{}:waiters:{{stale}}", support::NAMESPACE);
    let now_ms: u64 = {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
        secs * 1000 + micros / 1000
    };
    let _: () = redis::cmd("HSET")
        .arg(&entries)
        .arg("dead:1")
        .arg(format!("{} 1000", now_ms - 1))
        .arg("live:1")
        .arg(format!("{} 1000", now_ms + 60_000))
        .query(&mut con)
        .unwrap();
    assert_eq!(client.status("stale").unwrap().waiters, 1);
}

#[test]
fn bad_keys_are_refused_before_any_network_call() {
    // Nothing listens here: a network call would fail with a connection error instead.
    let client = fencelock::LockClient::new("redis://127.0.0.1:1/").unwrap();
    let err = client.status("").unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    let err = client.force_unlock("").unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
}
