//! Handoff to another client's waiter for keys with unusual bytes: the release message names the
//! key by its tag, which keeps every byte but `%`, `{` and `}`, NUL included. A message cut short
//! at a NUL names no waiting key, so the waiter would sleep until the holder's lease ran out
//! (here 10 s) instead of waking at once. A plain key is the control.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{await_queue_len, lock_client, RedisServer};

/// Holder and waiter leases: what a lost handoff message costs the waiter.
const LEASE_MS: u64 = 10_000;

/// Client H holds `key`; client W waits for it (queued in Redis); H unlocks. Returns how long
/// after the unlock W got the lock, and W's token (bounded: panics after 30 s).
fn cross_client_handoff(key: &'static str) -> (Duration, u64) {
    let server = RedisServer::start();
    let holder = lock_client(&server, LEASE_MS);
    let waiter = lock_client(&server, LEASE_MS);
    let mut con = server.connection();
    let held = holder.lock(key).unwrap();
    let held_token = held.token().as_u64();
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let got = waiter.lock(key);
        let at = Instant::now();
        let token = got.as_ref().map(|g| g.token().as_u64()).ok();
        let _ = tx.send((at, token));
        got.map(|g| g.unlock())
    });
    await_queue_len(&mut con, key, 1);
    let released = Instant::now();
    held.unlock().unwrap();
    let (granted, token) = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("the waiter for {key:?} got nothing in 30 s: {e}"));
    t.join().unwrap().unwrap().unwrap();
    let token = token.unwrap_or_else(|| panic!("the waiter for {key:?} got no lock"));
    assert!(
        token > held_token,
        "{key:?}: token {token} after {held_token}"
    );
    let latency = granted.saturating_duration_since(released);
    eprintln!("{key:?}: handed over {latency:?} after the release");
    (latency, token)
}

#[test]
fn a_key_with_a_nul_byte_is_handed_to_another_clients_waiter_at_once() {
    let (latency, _) = cross_client_handoff("a\0b");
    assert!(
        latency < Duration::from_secs(2),
        "the waiter for \"a\\0b\" got the lock {latency:?} after the release (a lease is {LEASE_MS} ms)"
    );
}

#[test]
fn control_a_plain_key_is_handed_to_another_clients_waiter_at_once() {
    let (latency, _) = cross_client_handoff("ab");
    assert!(
        latency < Duration::from_secs(2),
        "the waiter for \"ab\" got the lock {latency:?} after the release (a lease is {LEASE_MS} ms)"
    );
}
