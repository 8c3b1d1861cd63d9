//! The renewal thread keeps short leases alive for many lease periods.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::TryRecvError;
use support::{lock_client, ms, RedisServer};

#[test]
fn a_100ms_lease_is_held_for_twenty_lease_periods() {
    let server = RedisServer::start();
    let client = lock_client(&server, 100);
    let rival = lock_client(&server, 100);
    let mut con = server.connection();
    let guard = client.lock("long").unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    let mut checks = 0;
    while Instant::now() < until {
        thread::sleep(ms(50));
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
    let client = lock_client(&server, 150);
    let guards: Vec<_> = (0..200)
        .map(|i| client.lock(&format!("many:{i}")).unwrap())
        .collect();
    thread::sleep(Duration::from_secs(1));
    assert!(guards.iter().all(|g| g.is_held()));
    let mut con = server.connection();
    let alive: usize = redis::cmd("EVAL")
        .arg("local n = 0 for i = 0, 199 do if redis.call('PTTL', 'test:lock:{many:' .. i .. '}') > 0 then n = n + 1 end end return n")
        .arg(0)
        .query(&mut con)
        .unwrap();
    assert_eq!(alive, 200);
    for guard in guards {
        guard.unlock().unwrap();
    }
}
