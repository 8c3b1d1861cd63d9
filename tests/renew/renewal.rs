//! The renewal thread keeps short leases alive for many lease periods.

use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::TryRecvError;

use crate::support;
use crate::support::{lock_client, ms, RedisServer};

/// How many of the lock keys `test:lock:{<prefix>:0}` .. `{<prefix>:<n-1>}` have a live lease.
fn live_leases(server: &RedisServer, prefix: &str, n: usize) -> usize {
    let mut con = server.connection();
    redis::cmd("EVAL")
        .arg(
            "local n = 0 for i = 0, ARGV[2] - 1 do \
             if redis.call('PTTL', 'test:lock:{' .. ARGV[1] .. ':' .. i .. '}') > 0 then n = n + 1 end \
             end return n",
        )
        .arg(0)
        .arg(prefix)
        .arg(n)
        .query(&mut con)
        .unwrap()
}

#[test]
fn a_short_lease_is_held_for_ten_lease_periods() {
    // Leases here are long enough to ride out a stall of the (shared, virtual) test machine;
    // the claim is the number of lease periods, not the lease's length.
    let server = RedisServer::start();
    let client = lock_client(&server, 400);
    let rival = lock_client(&server, 400);
    let mut con = server.connection();
    let guard = client.lock("long").unwrap();
    let until = Instant::now() + Duration::from_secs(4);
    let mut checks = 0;
    while Instant::now() < until {
        thread::sleep(ms(100));
        assert!(guard.is_held(), "lost after {checks} checks");
        assert_eq!(guard.lost().try_recv(), Err(TryRecvError::Empty));
        let pttl: i64 = redis::cmd("PTTL")
            .arg("test:lock:{long}")
            .query(&mut con)
            .unwrap();
        assert!(pttl > 0, "lease ran out in redis: pttl {pttl}");
        if checks % 5 == 0 {
            assert!(rival.try_lock("long", Duration::ZERO).unwrap().is_none());
        }
        checks += 1;
    }
    guard.unlock().unwrap();
    assert!(rival.try_lock("long", Duration::ZERO).unwrap().is_some());
}

#[test]
fn many_locks_of_one_client_are_all_kept() {
    let server = RedisServer::start();
    let client = lock_client(&server, 500);
    let guards: Vec<_> = (0..200)
        .map(|i| client.lock(&format!("many:{i}")).unwrap())
        .collect();
    thread::sleep(Duration::from_secs(2));
    assert!(guards.iter().all(|g| g.is_held()));
    assert_eq!(live_leases(&server, "many", 200), 200);
    for guard in guards {
        guard.unlock().unwrap();
    }
}

#[test]
fn leases_beyond_one_pipeline_are_all_kept() {
    let server = RedisServer::start();
    let client = lock_client(&server, 2_000);
    let guards: Vec<_> = (0..2_500)
        .map(|i| client.lock(&format!("bulk:{i}")).unwrap())
        .collect();
    thread::sleep(Duration::from_millis(4_500));
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of {} leases lost", guards.len());
    assert_eq!(live_leases(&server, "bulk", 2_500), 2_500);
}

#[test]
fn one_broken_key_costs_only_its_own_lease() {
    let server = RedisServer::start();
    let client = lock_client(&server, 600);
    let healthy = client.lock("healthy").unwrap();
    let broken = client.lock("broken").unwrap();
    let mut con = server.connection();
    // A wrong type at the lock key makes its extend fail with WRONGTYPE inside the pipeline.
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg("test:lock:{broken}")
        .cmd("RPUSH")
        .arg("test:lock:{broken}")
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert!(broken.lost().recv_timeout(ms(2_000)).is_ok());
    thread::sleep(ms(1_200));
    assert!(healthy.is_held());
    healthy.unlock().unwrap();
}

#[test]
fn a_response_timeout_below_five_ms_still_renews() {
    let server = RedisServer::start();
    let client = fencelock::LockClient::builder(server.url())
        .namespace(support::NAMESPACE)
        .lease(ms(600))
        .response_timeout(ms(4))
        .build()
        .unwrap();
    // A 4 ms budget can be missed on a busy machine; the point here is the renewal thread.
    let guard = (0..50)
        .find_map(|_| client.lock("tight").ok())
        .expect("no grant in 50 tries");
    thread::sleep(ms(1_800));
    assert!(
        guard.is_held(),
        "lease not renewed with a 4 ms response timeout"
    );
}

/// A held lease is extended about every lease/3, not more often: a renewal thread woken early (to
/// look at its inbox) must not renew early, or every lease drifts to a shorter period.
#[test]
fn a_lease_is_renewed_about_every_third_of_a_lease() {
    let server = RedisServer::start();
    let client = lock_client(&server, 600);
    let mut con = server.connection();
    let guard = client.lock("steady").unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    thread::sleep(ms(3_000));
    let extends = support::command_calls(&mut con, "evalsha");
    assert!(guard.is_held());
    guard.unlock().unwrap();
    // 3 s / 200 ms = 15 renewals; renewing at lease/6 would be 30.
    assert!(
        (10..=20).contains(&extends),
        "{extends} extends in 3 s at a 600 ms lease"
    );
}
