//! Losing a lock: the holder learns it at once, and its stale unlock harms nobody.

use std::time::{Duration, Instant};

use crate::support::{lock_client, ms, RedisServer};

#[test]
fn redis_paused_past_the_lease_loses_the_lock_safely() {
    let server = RedisServer::start();
    let lease = ms(300);
    let a = lock_client(&server, 300);
    let b = lock_client(&server, 30_000);
    let stale = a.lock("paused").unwrap();
    let old_token = stale.token();

    server.pause();
    let paused = Instant::now();
    // The signal fires by the local deadline, without any word from Redis.
    assert!(
        stale.lost().recv_timeout(lease + ms(500)).is_ok(),
        "no loss signal"
    );
    let noticed = paused.elapsed();
    assert!(!stale.is_held());
    assert!(noticed < lease + ms(500), "noticed after {noticed:?}");
    // Keep Redis stopped until its copy of the lease has surely expired.
    std::thread::sleep((lease + ms(100)).saturating_sub(paused.elapsed()));
    server.resume();

    let fresh = b
        .try_lock("paused", Duration::from_secs(5))
        .unwrap()
        .expect("lock after expiry");
    assert!(fresh.token() > old_token);

    let err = stale.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(fresh.is_held());
    let mut con = server.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg("test:lock:{paused}")
        .query(&mut con)
        .unwrap();
    assert!(exists, "the stale unlock deleted the new holder's lock");
    fresh.unlock().unwrap();
}

#[test]
fn a_key_deleted_or_taken_under_the_holder_is_reported_lost() {
    let server = RedisServer::start();
    let client = lock_client(&server, 300);
    let mut con = server.connection();

    let deleted = client.lock("gone").unwrap();
    let _: () = redis::cmd("DEL")
        .arg("test:lock:{gone}")
        .query(&mut con)
        .unwrap();
    assert!(deleted.lost().recv_timeout(ms(1_000)).is_ok());
    assert!(!deleted.is_held());
    assert!(deleted.unlock().unwrap_err().is_lock_lost());

    let taken = client.lock("taken").unwrap();
    let _: () = redis::cmd("SET")
        .arg("test:lock:{taken}")
        .arg("someone-else")
        .query(&mut con)
        .unwrap();
    assert!(taken.lost().recv_timeout(ms(1_000)).is_ok());
    assert!(taken.unlock().unwrap_err().is_lock_lost());
    let owner: String = redis::cmd("GET")
        .arg("test:lock:{taken}")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        owner, "someone-else",
        "a stale unlock deleted another owner's lock"
    );
}
