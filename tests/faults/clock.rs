//! The server's wall clock stepped while a lock is held. Redis expires keys by its wall clock,
//! so the lock assumes it does not jump (docs/design.md): these tests show what a jump does
//! anyway, and that fencing keeps the data safe.
//!
//! - Forward past the lease: Redis expires the lock at once, another client is granted while the
//!   holder's own deadline (a monotonic clock) still says held. Mutual exclusion is broken, as
//!   documented; tokens still rise, and the fenced store refuses the first holder's late write.
//! - Back by an hour: a lock whose holder stopped renewing lives on in Redis for the hour (a
//!   liveness cost, not a safety one), and the next grants' tokens still rise above every
//!   earlier one.

use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockOptions};

use crate::support::clock::SteppedServer;
use crate::support::{lock_client, NAMESPACE};

fn store(stepped: &SteppedServer) -> FencedRedis {
    FencedRedis::open(stepped.server.url())
        .and_then(|store| store.with_namespace(NAMESPACE))
        .unwrap_or_else(|e| panic!("the fenced store: {e}"))
}

#[test]
fn a_forward_clock_step_past_the_lease_breaks_exclusion_and_the_fence_holds() {
    let mut stepped = SteppedServer::start_with(&[]);
    let before = stepped.time_us();
    let (a, b) = (
        lock_client(&stepped.server, 30_000),
        lock_client(&stepped.server, 30_000),
    );
    let store = store(&stepped);
    let first = a.lock("clocked").unwrap();
    store.set("data", first.token(), "a").unwrap();

    stepped.forward(Duration::from_secs(60));
    assert!(
        stepped.time_us() >= before + 60_000_000,
        "the server's clock stepped"
    );
    // Expired by the step: b is granted at once, with a larger token, while a still holds by
    // its own (monotonic) deadline.
    let second = b
        .try_lock("clocked", Duration::from_secs(5))
        .unwrap()
        .expect("the lock expired with the step");
    assert!(
        first.is_held(),
        "a's deadline is its own clock's: it cannot see the step"
    );
    assert!(second.token() > first.token());
    store.set("data", second.token(), "b").unwrap();

    // a's write, late: refused.
    let refused = store.set("data", first.token(), "a, late").unwrap_err();
    assert!(refused.is_stale_token(), "{refused:?}");
    assert_eq!(store.get("data").unwrap().unwrap(), b"b");
    // a learns of the loss at its next renewal (about lease / 3).
    first.lost().recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(!first.is_held());
    drop(second);
}

#[test]
fn a_backward_clock_step_keeps_a_dead_holders_lock_and_tokens_still_rise() {
    let mut stepped = SteppedServer::start_with(&[]);
    let a = lock_client(&stepped.server, 30_000);
    let b = lock_client(&stepped.server, 30_000);
    let lease = Duration::from_millis(300);
    // A holder that stops renewing, as a crashed one does.
    let dead = a
        .lock_with("clocked", &LockOptions::new().lease(lease).renew(false))
        .unwrap();
    let token = dead.token();
    stepped.back(Duration::from_secs(3600));

    // Its lease ran out by every clock but Redis': nobody gets the lock for the hour.
    let tried = Instant::now();
    assert!(b.try_lock("clocked", lease * 3).unwrap().is_none());
    assert!(tried.elapsed() >= lease * 3);
    assert!(!dead.is_held(), "its holder knows its lease is over");

    // Stepped forward again, the lock is free; the next token is above the last, though the
    // server's clock has been an hour behind since the grant.
    stepped.forward(Duration::from_secs(3600));
    let next = b
        .try_lock("clocked", Duration::from_secs(5))
        .unwrap()
        .expect("free once the clock is back");
    assert!(next.token() > token, "{} after {token}", next.token());
    // A grant made while the clock is an hour behind again still rises above them all: the
    // counter lifts it, where the clock alone would not.
    drop(next);
    stepped.back(Duration::from_secs(3600));
    let again = b
        .try_lock("clocked", Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert!(again.token() > token);
}

#[test]
fn a_skewed_server_clock_runs_fast_or_slow_without_jumping() {
    use crate::support::clock::ServerClock;
    let stepped = SteppedServer::start_with(&[]);
    let clock: &ServerClock = &stepped.clock;
    // Four times fast: over a measured stretch of real time, the server's clock moves about four
    // times as far (loose bounds: the two TIME calls' own latencies fall inside the stretch).
    let measure = |clock_rate: f64| {
        clock.set_rate(clock_rate);
        let (before, started) = (stepped.time_us(), Instant::now());
        std::thread::sleep(Duration::from_millis(500));
        let (after, real) = (stepped.time_us(), started.elapsed());
        (after as f64 - before as f64) / real.as_micros() as f64
    };
    let fast = measure(4.0);
    assert!((3.0..=5.0).contains(&fast), "4x fast ran at {fast:.2}x");
    // Back to the true rate: no jump at the switch, the clock is ahead by what it gained.
    let ahead_before = clock.ahead_ns();
    let normal = measure(1.0);
    assert!(
        (0.8..=1.25).contains(&normal),
        "true rate ran at {normal:.2}x"
    );
    assert!(
        (clock.ahead_ns() - ahead_before).abs() < 5_000_000,
        "the clock moved at the true rate"
    );
    let slow = measure(0.25);
    assert!(
        (0.1..=0.4).contains(&slow),
        "quarter rate ran at {slow:.2}x"
    );
}
