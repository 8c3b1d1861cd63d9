//! `LockClient::force_unlock`: an operator takes a lock from whoever holds it. The holder learns
//! of it at its next renewal, tokens keep rising (the fence counter is left alone), and the
//! lock goes to the next waiter at once, as a release hands it over.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::support::{await_queue_len, fence_key, lock_client, lock_exists, ms, RedisServer};

fn counter(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(fence_key(key)).query(con).unwrap()
}

#[test]
fn a_forced_holder_learns_it_at_its_next_renewal_and_its_release_reports_the_loss() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 600);
    let operator = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = holder.lock("hung").unwrap();

    assert!(operator.force_unlock("hung").unwrap());
    assert!(!lock_exists(&mut con, "hung"));
    // Renewal runs about every lease / 3 (200 ms): it finds the key gone.
    let forced = Instant::now();
    assert!(
        guard.lost().recv_timeout(ms(2_000)).is_ok(),
        "the forced holder was not told within 2 s"
    );
    assert!(!guard.is_held());
    eprintln!("the holder learnt of it {:?} later", forced.elapsed());
    assert!(guard.unlock().unwrap_err().is_lock_lost());

    // Free already: nothing to force.
    assert!(!operator.force_unlock("hung").unwrap());
    assert!(!operator.force_unlock("never-locked").unwrap());
}

/// The fence counter is left alone, so the next grant's token is above the forced holder's even
/// where the clock could not lift it: here the counter runs far ahead of the clock (a deleted
/// counter would start the next grant at the clock, below the forced holder's token).
#[test]
fn tokens_keep_rising_across_a_forced_release() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 10_000);
    let next = lock_client(&server, 10_000);
    let mut con = server.connection();
    let ahead: u64 = 5_000_000_000_000_000; // year 2128 in microseconds
    let _: () = redis::cmd("SET")
        .arg(fence_key("ahead"))
        .arg(ahead.to_string())
        .query(&mut con)
        .unwrap();
    let guard = holder.lock("ahead").unwrap();
    let before = counter(&mut con, "ahead");

    assert!(next.force_unlock("ahead").unwrap());
    assert_eq!(
        counter(&mut con, "ahead"),
        before,
        "a forced release without waiters changed the fence counter"
    );
    let taken = next.lock("ahead").unwrap();
    assert!(
        taken.token() > guard.token(),
        "token {} after the forced holder's {}",
        taken.token(),
        guard.token()
    );
    taken.unlock().unwrap();
    drop(guard);
}

/// Client W waits (queued in Redis) behind holder H with a long lease; `waker` forces the lock.
/// Returns how long after the force W got the lock, and checks its token.
fn forced_handoff(server: &RedisServer, waiter: LockClient, waker: &LockClient) -> Duration {
    let holder = lock_client(server, 20_000);
    let mut con = server.connection();
    let key = "handoff";
    let held = holder.lock(key).unwrap();
    let held_token = held.token();
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let got = waiter.try_lock(key, Duration::from_secs(30));
        let _ = tx.send(Instant::now());
        got.map(|g| g.map(|g| (g.token(), g.unlock())))
    });
    await_queue_len(&mut con, key, 1);
    let forced = Instant::now();
    assert!(waker.force_unlock(key).unwrap());
    let granted = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the waiter got nothing in 30 s");
    let (token, unlocked) = t.join().unwrap().unwrap().expect("granted");
    unlocked.unwrap();
    assert!(token > held_token, "token {token} after {held_token}");
    // The old holder's release finds the lock another's (the first test covers its renewal).
    assert!(held.unlock().unwrap_err().is_lock_lost());
    granted.saturating_duration_since(forced)
}

/// A waiter of another client hears of the handoff by pub/sub, at once rather than when it
/// would look again by itself (5 s here).
#[test]
fn a_forced_release_hands_the_lock_to_another_clients_waiter_at_once() {
    let server = RedisServer::start();
    let waiter = lock_client(&server, 20_000);
    let operator = lock_client(&server, 20_000);
    let latency = forced_handoff(&server, waiter, &operator);
    assert!(
        latency < Duration::from_secs(2),
        "the waiter got the lock {latency:?} after the forced release"
    );
}

/// A waiter of the forcing client itself hears of it from that client, as from its own release.
#[test]
fn a_forced_release_hands_the_lock_to_the_forcing_clients_own_waiter_at_once() {
    let server = RedisServer::start();
    let client = lock_client(&server, 20_000);
    let latency = forced_handoff(&server, client.clone(), &client);
    assert!(
        latency < Duration::from_secs(2),
        "the waiter got the lock {latency:?} after its own client forced it"
    );
}
