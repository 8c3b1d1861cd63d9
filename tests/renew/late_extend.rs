//! A late extend must not shorten a lease that a later extend lengthened, and so must never let
//! two clients both see the lock held.
//!
//! Why: every PEXPIRE of a grant was assumed to reach Redis in the order sent, on the renewal
//! thread's one connection. But a renewal that times out is retried on a new connection, while
//! the old one may still carry the timed-out command to Redis. If that stale renewal (the old,
//! short lease) runs after an explicit `extend` to a longer lease, Redis' TTL drops back to the
//! short lease while the holder's local deadline still counts the long one: the key expires,
//! another client is granted it, and the first holder's `is_held()` still says true (until its
//! next renewal, a third of the long lease later, finds the key gone).
//!
//! The repro: client A (lease 2 s, response timeout 300 ms) talks to Redis through the support's
//! fault proxy. Once A's renewal thread has its connection, the proxy holds back the bytes of
//! every connection then open ([`Mode::HoldExisting`]); A's next renewal is held there, times
//! out, and is retried on a new connection, which passes. A then extends to 30 s (PTTL ~30 s).
//! Then the proxy delivers the held bytes: the stale 2 s renewal reaches Redis. Checked: Redis'
//! lease stays long (well above 2 s), and over a 10 s window client B (direct to Redis), trying
//! for the key again and again, never holds it while A's `is_held()` is true.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::support::proxy::{Mode, Proxy};
use crate::support::{lock_client, lock_key, lock_pttl, ms, RedisServer, NAMESPACE};

const KEY: &str = "late-extend";

/// Polls `condition` every 10 ms until it holds; panics after `limit`.
fn wait_until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        thread::sleep(ms(10));
    }
}

/// Waits until Redis' PTTL of [`KEY`] goes up (by more than 200 ms between two readings 10 ms
/// apart): a renewal (or extend) landed since the wait began. Panics after `limit`.
fn await_renewal(con: &mut redis::Connection, limit: Duration, what: &str) {
    let mut last = lock_pttl(con, KEY);
    wait_until(limit, what, || {
        let now = lock_pttl(con, KEY);
        let renewed = now > last + 200;
        last = now;
        renewed
    });
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_stale_renewal_delivered_late_neither_shortens_the_lease_nor_lets_two_clients_hold() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let a = LockClient::builder(proxy.url())
        .namespace(NAMESPACE)
        .lease(ms(2_000))
        .response_timeout(ms(300))
        .build()
        .unwrap();
    let b = lock_client(&server, 5_000);
    let mut con = server.connection();

    let guard = a.lock(KEY).unwrap();
    let a_token = guard.token().as_u64();
    // The first renewal (a third of the lease after the grant) makes the renewal thread's own
    // connection: only a connection open when the hold starts is held.
    await_renewal(&mut con, ms(10_000), "A's first renewal");

    proxy.set_mode(Mode::HoldExisting(ms(30_000)));
    // A's next renewal goes out on the held connection: it names the lock key.
    let key = lock_key(KEY);
    wait_until(ms(10_000), "a renewal of A held back by the proxy", || {
        contains(&proxy.held_upstream(), key.as_bytes())
    });
    // It times out (300 ms) and the renewal thread retries on a new connection, which passes.
    await_renewal(
        &mut con,
        ms(10_000),
        "A's renewal retried on a new connection",
    );
    assert!(
        guard.is_held(),
        "A lost the lock while its renewal was retried"
    );

    // The explicit extend, after the stale renewal was sent (retried: a 300 ms response timeout
    // may run out on a busy machine).
    let mut extended = Err(None);
    for _ in 0..3 {
        match guard.extend(Duration::from_secs(30)) {
            Ok(()) => {
                extended = Ok(());
                break;
            }
            Err(e) => extended = Err(Some(e)),
        }
    }
    extended.unwrap_or_else(|e| panic!("A's extend to 30 s failed: {e:?}"));
    let extended_pttl = lock_pttl(&mut con, KEY);
    assert!(
        extended_pttl > 25_000,
        "PTTL {extended_pttl} ms right after A's extend to 30 s"
    );
    assert!(
        proxy.held_bytes() > 0,
        "nothing was still held back before the release"
    );

    // The stale renewal reaches Redis, late: wait until all held bytes are delivered and Redis
    // has read (and then closed) every connection whose client had given up on it.
    proxy.release_held();
    wait_until(ms(10_000), "held bytes delivered and read by Redis", || {
        proxy.held_bytes() == 0 && proxy.orphaned_connections() == 0
    });
    thread::sleep(ms(200));
    let delivered_pttl = lock_pttl(&mut con, KEY);

    // The safety property: B, direct to Redis, tries for the key for 10 s; whenever it holds
    // the key, A must not think it holds it too.
    let window = Instant::now();
    let mut both_held: Option<(Duration, u64)> = None;
    let mut b_grants = 0;
    let mut b_attempts = 0;
    while window.elapsed() < ms(10_000) && b_attempts < 1_000 {
        b_attempts += 1;
        match b.try_lock(KEY, ms(250)) {
            Ok(Some(b_guard)) => {
                b_grants += 1;
                let a_held = guard.is_held();
                let b_token = b_guard.token().as_u64();
                let _ = b_guard.unlock();
                if a_held {
                    both_held = Some((window.elapsed(), b_token));
                    break;
                }
            }
            Ok(None) => {}
            Err(e) => panic!("B's try_lock failed: {e:?}"),
        }
    }

    let mut failures = Vec::new();
    if delivered_pttl <= 20_000 {
        failures.push(format!(
            "the stale renewal shortened A's 30 s lease: Redis' PTTL of {KEY:?} is \
             {delivered_pttl} ms after the held bytes were delivered (it was {extended_pttl} ms \
             right after the extend)"
        ));
    }
    if let Some((at, b_token)) = both_held {
        failures.push(format!(
            "B was granted {KEY:?} (token {b_token}) {at:?} into the window while A (token \
             {a_token}) still saw is_held() true"
        ));
    }
    assert!(
        failures.is_empty(),
        "{}\n(B: {b_grants} grant(s) in {b_attempts} attempt(s))",
        failures.join("\n")
    );
    assert!(guard.is_held(), "A lost the lock it extended to 30 s");
    guard.unlock().unwrap();
}
