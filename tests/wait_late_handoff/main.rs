//! A handoff by pub/sub to a waiter that has waited longer than its own lease is a good grant:
//! the lease was set by the release that handed it over, just now, not when the waiter first
//! attempted. Taking the first attempt as the lease's start makes the waiter see the grant as
//! already expired: it logs a false "lost the lock" warning, gives the lock away and goes to the
//! back of the queue, so waiters are served out of order and late.
//!
//! Its own test binary: it captures log records, and a logger can be installed once per process
//! (another test's "lost the lock" warnings would mix in).

#[path = "../support/mod.rs"]
mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::{
    await_queue_len, capture_logs, command_calls, lock_client, log_records, ms, RedisServer,
};

const KEY: &str = "late";
/// Everybody's lease: the waiters wait three of them.
const LEASE_MS: u64 = 1_000;
/// How long the holder keeps the lock (its renewal keeps it alive meanwhile).
const HOLD: Duration = Duration::from_secs(3);
/// How promptly a waiter must be served after its predecessor's unlock; loose.
const PROMPT: Duration = Duration::from_secs(1);

/// What one waiter saw.
#[derive(Debug)]
struct Served {
    waiter: usize,
    granted: Instant,
    token: u64,
    held_at_once: bool,
    unlocking: Instant,
}

#[test]
fn waiters_that_waited_longer_than_their_lease_take_the_handoff_in_order() {
    capture_logs();
    let server = RedisServer::start();
    let holder = lock_client(&server, LEASE_MS);
    let mut con = server.connection();

    let held = holder.lock(KEY).unwrap();
    let held_at = Instant::now();
    let held_token = held.token().as_u64();

    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for waiter in 1..=2usize {
        let client = lock_client(&server, LEASE_MS);
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let guard = client.lock(KEY).unwrap();
            let granted = Instant::now();
            let held_at_once = guard.is_held();
            let token = guard.token().as_u64();
            thread::sleep(ms(50));
            let unlocking = Instant::now();
            let unlocked = guard.unlock();
            let _ = tx.send(Served {
                waiter,
                granted,
                token,
                held_at_once,
                unlocking,
            });
            unlocked
        }));
        // W1 stands in Redis' queue before W2 starts.
        await_queue_len(&mut con, KEY, waiter as u64);
    }
    drop(tx);

    thread::sleep(HOLD.saturating_sub(held_at.elapsed()));
    assert!(held.is_held(), "the holder lost the lock while holding it");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let released = Instant::now();
    held.unlock().unwrap();

    let mut served = Vec::new();
    for _ in 0..2 {
        served.push(
            rx.recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("a waiter got nothing in 30 s: {e}; {served:?}")),
        );
    }
    for t in threads {
        t.join().unwrap().unwrap();
    }
    // The holder's release hands the lock to W1, W1's to W2: two handoffs between clients, each
    // published once. A handoff thrown away is handed on again, and published again.
    let published = command_calls(&mut con, "publish");
    served.sort_by_key(|s| s.granted);
    for s in &served {
        eprintln!(
            "W{} granted {:?} after the holder's release, token {}",
            s.waiter,
            s.granted.saturating_duration_since(released),
            s.token
        );
    }

    // Every check is made and reported together: which of them fail tells what went wrong.
    let mut failures = Vec::new();
    let lost: Vec<_> = log_records()
        .into_iter()
        .filter(|(level, text)| *level == log::Level::Warn && text.contains("lost the lock"))
        .collect();
    if !lost.is_empty() {
        failures.push(format!("false loss warnings: {lost:?}"));
    }
    if published != 2 {
        failures.push(format!(
            "{published} handoffs published after the holder's release, not 2 (holder to W1, W1 to W2)"
        ));
    }
    let order: Vec<usize> = served.iter().map(|s| s.waiter).collect();
    if order != [1, 2] {
        failures.push(format!(
            "served in the order {order:?}, not [1, 2] (queue order)"
        ));
    }
    if !served.iter().all(|s| s.held_at_once) {
        failures.push("a handed-over guard was not held".to_owned());
    }
    if !(held_token < served[0].token && served[0].token < served[1].token) {
        failures.push(format!(
            "tokens not increasing: holder {held_token}, then {} and {}",
            served[0].token, served[1].token
        ));
    }
    let first = served[0].granted.saturating_duration_since(released);
    if first >= PROMPT {
        failures.push(format!(
            "the first waiter served got the lock {first:?} after the holder's release"
        ));
    }
    let second = served[1]
        .granted
        .saturating_duration_since(served[0].unlocking);
    if second >= PROMPT {
        failures.push(format!(
            "the second waiter served got the lock {second:?} after the first one's unlock"
        ));
    }
    let summary: Vec<String> = served
        .iter()
        .map(|s| {
            format!(
                "W{} granted at +{:?}, unlocking at +{:?}, token {}, held at once {}",
                s.waiter,
                s.granted.saturating_duration_since(released),
                s.unlocking.saturating_duration_since(released),
                s.token,
                s.held_at_once
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} check(s) failed:\n  {}\nafter the holder's release (token {held_token}):\n  {}",
        failures.len(),
        failures.join("\n  "),
        summary.join("\n  ")
    );
}
