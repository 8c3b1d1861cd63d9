//! Fault injection, the network: the connection to Redis reset, delayed and blackholed, and the
//! renewal thread's connection cut off mid-hold.
//!
//! A network fault leaves the client unsure of what Redis did. A grant whose reply was lost must
//! neither outlive its lease nor be taken for another holder's; a call must not hang on a dead
//! connection, and a connection out of step must not be reused; a renewal thread that cannot reach
//! Redis must keep trying, and report the loss before the next holder can be granted the key.
//!
//! Each test names the protection it checks and why it fails without it. Servers are throw-away
//! `redis-server`s on loopback (tests/support), never one on 6379; network faults go through the
//! support's TCP proxy. Bounds are generous, since the suite runs on small, busy machines, but each
//! is far below what the broken behaviour would take.

use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, TryRecvError};

use crate::support::faults::{builder, fence_value, spawn_answer, wait_until, within};
use crate::support::proxy::{Mode, Proxy};
use crate::support::{lock_client, lock_exists, lock_pttl, ms, RedisServer};

// ---------------------------------------------------------------------------
// the connection reset, delayed, blackholed (TCP fault proxy)
// ---------------------------------------------------------------------------

/// The connection is reset after Redis granted an acquire but before its reply came back, and
/// stays down: the call fails with a connection error, the grant it made is an orphan that no
/// guard holds and nothing renews, and it expires with its lease; then a rival gets the key, with
/// a higher token, and the faulted client, reconnected, does not think it holds the key.
///
/// Protection: every grant carries its lease (SET PX) and the client renews only grants it handed
/// out. A grant without expiry, or one renewed although its reply never came, would keep the key
/// from the rival for its whole 4 s wait.
#[test]
fn a_reset_after_the_grant_leaves_an_orphan_that_expires_with_its_lease() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(2_000);
    let client = builder(proxy.url(), lease)
        .connection_timeout(ms(500))
        .build()
        .unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap(); // a pooled connection; the scripts loaded

    proxy.set_mode(Mode::Delay(ms(400)));
    let faulted = client.clone();
    let answer = spawn_answer(move || faulted.try_lock("orphan", Duration::ZERO));
    // The acquire reaches Redis 400 ms after it was sent; its reply is then held 400 ms more.
    wait_until(ms(5_000), "the delayed acquire to reach redis", || {
        lock_exists(&mut con, "orphan")
    });
    proxy.set_mode(Mode::Reset);
    let reset = Instant::now();
    let orphan_token = fence_value(&mut con, "orphan").unwrap();
    let pttl = lock_pttl(&mut con, "orphan");
    assert!(pttl > 0 && pttl <= 2_000, "orphan's pttl {pttl}");
    // The pool retries on a fresh connection, which the proxy resets too; the checkout gives up
    // after the 500 ms connection timeout.
    let err = answer
        .recv_timeout(ms(5_000))
        .expect("try_lock hung after a reset")
        .expect_err("granted although its reply was lost and the connection stayed down");
    assert!(err.is_connection(), "{err:?}");

    let fresh = rival
        .try_lock("orphan", ms(4_000))
        .unwrap()
        .expect("the orphaned grant outlived its lease");
    let freed = reset.elapsed();
    assert!(freed <= lease + ms(500), "the orphan lasted {freed:?}");
    assert!(fresh.token().as_u64() > orphan_token);

    proxy.set_mode(Mode::Pass);
    assert!(
        client.try_lock("orphan", Duration::ZERO).unwrap().is_none(),
        "the faulted client was granted the rival's lock"
    );
    fresh.unlock().unwrap();
    let again = client
        .try_lock("orphan", ms(3_000))
        .unwrap()
        .expect("the faulted client did not recover");
    again.unlock().unwrap();
}

/// The connection is reset after Redis granted an acquire but before its reply came back, and
/// the network works again at once: the pool repeats the acquire on a fresh connection and it
/// returns the grant already made (same token, no second grant), instead of "held" against the
/// caller's own orphan. Exactly one holder: a rival is refused until the guard unlocks.
///
/// Protection: the acquire script treats a lock already held by the same owner id as granted, and
/// one `try_lock` call keeps its owner id across the retry. Without that, the retry finds the key
/// held, `try_lock(ZERO)` returns `Ok(None)`, and the orphan blocks everyone for its lease.
#[test]
fn a_reply_lost_to_a_reset_is_retried_into_the_same_grant() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000)).build().unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Delay(ms(400)));
    let faulted = client.clone();
    let answer = spawn_answer(move || faulted.try_lock("retried", Duration::ZERO));
    wait_until(ms(5_000), "the delayed acquire to reach redis", || {
        lock_exists(&mut con, "retried")
    });
    let granted_token = fence_value(&mut con, "retried").unwrap();
    // The held reply dies with its connection; new connections still get through (delayed).
    proxy.close_connections();
    let guard = answer
        .recv_timeout(ms(10_000))
        .expect("try_lock hung after a reset")
        .expect("the retry after a reset failed")
        .expect("the retry took the caller's own grant for another holder's");
    assert_eq!(guard.token().as_u64(), granted_token);
    assert_eq!(
        fence_value(&mut con, "retried"),
        Some(granted_token),
        "the retry made a second grant"
    );

    proxy.set_mode(Mode::Pass);
    assert!(guard.is_held());
    assert!(rival.try_lock("retried", Duration::ZERO).unwrap().is_none());
    guard.unlock().unwrap();
    assert!(!lock_exists(&mut con, "retried"));
}

/// An acquire whose reply takes longer than the response timeout (the proxy delays each direction
/// by 500 ms; the timeout is 300 ms) fails with `is_timeout()`. Its late effect is undone: the
/// grant it made once it reached Redis is gone long before its 30 s lease, and a rival takes the
/// key. The connection that timed out, the client's only one, then answers the next acquire with
/// that acquire's own reply, not the late "granted".
///
/// Protection: after a timed-out acquire the client sends a compare-and-delete for its owner id on
/// the same connection, so it runs after the acquire whatever that did. Without it the lock key
/// stays for its 30 s lease and the wait for it to go fails. And late replies are skipped, never
/// read as a later command's (redis-rs counts the replies it gave up on; the pool could also drop
/// the connection): reading the late `{1, token}` as the next acquire's answer would give the
/// faulted client a guard for the key the rival holds.
#[test]
fn an_acquire_that_timed_out_is_undone_and_its_late_reply_is_never_taken_for_another() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000))
        .pool_size(1)
        .response_timeout(ms(300))
        .build()
        .unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Delay(ms(500)));
    let started = Instant::now();
    let err = client
        .try_lock("late", Duration::ZERO)
        .expect_err("a reply 1 s late arrived within a 300 ms response timeout");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        started.elapsed() < ms(2_000),
        "took {:?}",
        started.elapsed()
    );
    proxy.set_mode(Mode::Pass);

    // The acquire ran late (the counter moved), and the compare-and-delete behind it removed its
    // lock.
    wait_until(ms(5_000), "the late grant to be undone", || {
        fence_value(&mut con, "late").is_some() && !lock_exists(&mut con, "late")
    });
    thread::sleep(ms(300));
    assert!(
        !lock_exists(&mut con, "late"),
        "a lock appeared after the clean-up"
    );

    let fresh = rival
        .try_lock("late", Duration::ZERO)
        .unwrap()
        .expect("a rival could not take the key");
    assert!(
        client.try_lock("late", Duration::ZERO).unwrap().is_none(),
        "the faulted client read a late reply as a grant of the rival's lock"
    );
    let other = client
        .try_lock("other", Duration::ZERO)
        .unwrap()
        .expect("the faulted client's connection is out of step");
    other.unlock().unwrap();
    fresh.unlock().unwrap();
}

/// Every byte dropped (the proxy's blackhole): `try_lock` and `lock` fail within the response
/// timeouts instead of waiting forever, nothing reaches Redis (no lock, no token), a rival talking
/// to Redis directly takes the key at once, and once the dead connections are torn down the same
/// client works again.
///
/// Protection: the response timeout on pooled connections (without it the calls hang, which the
/// bounds catch), and the pool's replacement of broken connections.
#[test]
fn a_blackholed_acquire_times_out_grants_nothing_and_the_client_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000))
        .response_timeout(ms(300))
        .connection_timeout(ms(1_000))
        .build()
        .unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let attempt = client.clone();
    let err = within(ms(5_000), "try_lock(ZERO) through a blackhole", move || {
        attempt.try_lock("dropped", Duration::ZERO).map(drop)
    })
    .expect_err("granted through a blackhole");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        started.elapsed() < ms(2_000),
        "took {:?}",
        started.elapsed()
    );
    let waiter = client.clone();
    let err = within(ms(5_000), "lock() through a blackhole", move || {
        waiter.lock("dropped").map(drop)
    })
    .expect_err("granted through a blackhole");
    assert!(err.is_connection(), "{err:?}");

    assert!(!lock_exists(&mut con, "dropped"));
    assert_eq!(fence_value(&mut con, "dropped"), None);
    rival
        .try_lock("dropped", Duration::ZERO)
        .unwrap()
        .expect("redis itself was fine")
        .unlock()
        .unwrap();

    // The partition ends the way it does for a TCP connection that lost bytes: the connection is
    // torn down.
    proxy.set_mode(Mode::Reset);
    proxy.set_mode(Mode::Pass);
    let guard = client
        .try_lock("dropped", ms(3_000))
        .unwrap()
        .expect("the client did not recover after the partition");
    assert!(guard.is_held());
    guard.unlock().unwrap();
}

/// A pooled connection whose command timed out is not handed out again: after a partition that
/// silently dropped bytes and then healed without tearing connections down, the next call works
/// on a fresh connection instead of timing out for ever on one still waiting for lost replies.
///
/// Protection: the pool retires a connection on a response timeout. Without that, the warm
/// connection goes back to the pool out of step and every later call on it times out.
#[test]
fn a_connection_that_timed_out_is_not_reused() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000))
        .response_timeout(ms(300))
        .pool_size(1)
        .build()
        .unwrap();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Blackhole);
    let err = client.try_lock("healed", Duration::ZERO).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    // The partition heals without a reset: the old connection is still open, but out of step.
    proxy.set_mode(Mode::Pass);
    for attempt in 0..3 {
        let got = client.try_lock("healed", Duration::ZERO);
        assert!(
            matches!(got, Ok(Some(_))),
            "attempt {attempt} after the partition healed: {got:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// the renewal thread's connection broken mid-hold
// ---------------------------------------------------------------------------

/// The renewal thread's connection is cut every 200 ms for five leases of 500 ms: it reconnects
/// each time and the lock stays held throughout, in the guard and in Redis.
///
/// Protection: after a failed round trip the renewal thread drops the connection, reconnects and
/// retries after lease/10. A renewal thread that kept the broken connection, or stopped retrying,
/// would let the lease lapse within one lease of the first cut.
#[test]
fn renewal_reconnects_when_its_connection_is_cut() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(500);
    let client = builder(proxy.url(), lease).build().unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = client.lock("cut").unwrap();

    let accepted_before = proxy.accepted_connections();
    let started = Instant::now();
    let mut cuts = 0;
    while started.elapsed() < lease * 5 {
        thread::sleep(ms(200));
        proxy.close_connections();
        cuts += 1;
        assert!(guard.is_held(), "lost after {cuts} cuts");
        assert_eq!(guard.lost().try_recv(), Err(TryRecvError::Empty));
        assert!(lock_pttl(&mut con, "cut") > 0, "the lease ran out in redis");
    }
    thread::sleep(ms(200));
    assert!(guard.is_held());
    let reconnects = proxy.accepted_connections() - accepted_before;
    assert!(
        reconnects >= cuts / 2,
        "{reconnects} new connections over {cuts} cuts: renewal did not reconnect"
    );
    assert!(rival.try_lock("cut", Duration::ZERO).unwrap().is_none());
    guard.unlock().unwrap();
    assert!(!lock_exists(&mut con, "cut"));
}

/// The renewal thread is cut off (blackhole) for longer than the lease: the loss signal fires
/// within lease + 500 ms although no reply and no error ever arrives, `is_held()` is false, and
/// the next holder, talking to Redis directly, gets the key with a higher token; the stale
/// holder's unlock then leaves the new holder's lock alone.
///
/// Protection: the renewal thread waits for a reply, and for a new connection, no longer than the
/// first local deadline in its batch, then reports the loss. Waiting the full response timeout
/// (5 s) on the blackholed connection instead would keep `lost()` silent past the bound: nobody
/// calls `is_held()` before it fires, so only the renewal thread can fire it. The unlock is a
/// compare-and-delete: a plain DEL would remove the new holder's lock.
#[test]
fn renewal_cut_off_past_the_deadline_reports_the_loss_before_the_next_holder() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(500);
    let client = builder(proxy.url(), lease).build().unwrap();
    let direct = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = client.lock("partitioned").unwrap();
    let token = guard.token();
    thread::sleep(ms(300));

    proxy.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    let fired = guard.lost().recv_timeout(lease + ms(500));
    let noticed = cut.elapsed();
    assert!(
        !matches!(fired, Err(RecvTimeoutError::Timeout)),
        "no loss signal within {noticed:?} of the cut"
    );
    assert!(!guard.is_held());

    let fresh = direct
        .try_lock("partitioned", ms(3_000))
        .unwrap()
        .expect("the cut-off lease never ran out in redis");
    assert!(fresh.token() > token);

    proxy.set_mode(Mode::Pass);
    let err = guard.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(
        lock_exists(&mut con, "partitioned"),
        "the stale unlock removed the new holder's lock"
    );
    fresh.unlock().unwrap();
}
