//! A holder cut off from Redis: its permit comes back within its lease, the holder hears of
//! the loss by then, and its late release harms nobody.

use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::{lock_client, lock_client_at, ms, RedisServer};

#[test]
fn the_permit_of_a_holder_cut_off_comes_back_within_its_lease() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(600);
    let cut_off = fencelock::LockClient::builder(proxy.url())
        .namespace(crate::support::NAMESPACE)
        .lease(lease)
        .response_timeout(ms(200))
        .build()
        .unwrap();
    let other = lock_client(&server, 5_000);
    let mine = cut_off.semaphore("slots", 2).unwrap();
    let theirs = other.semaphore("slots", 2).unwrap();
    let stale = mine.acquire().unwrap();
    let kept = theirs.acquire().unwrap();
    assert!(theirs.try_acquire(Duration::ZERO).unwrap().is_none());

    // Renewal gets no reply from now on: the permit key runs out in Redis.
    proxy.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    let back = theirs
        .try_acquire(Duration::from_secs(10))
        .unwrap()
        .expect("the permit came back");
    let took = cut.elapsed();
    // Within the lease, and a waiter's look after it: loose, against a loaded machine.
    assert!(took < lease + ms(1_500), "came back after {took:?}");
    assert!(back.token() > stale.token() && back.token() > kept.token());
    // The holder knew before Redis let the permit go: its local deadline is earlier, and
    // `is_held` reads it. The signal comes from the renewal thread, a little later on a busy
    // machine.
    assert!(!stale.is_held());
    assert!(
        stale.lost().recv_timeout(Duration::from_secs(2)).is_ok(),
        "no loss signal"
    );
    // Still never more than two.
    assert!(theirs.try_acquire(Duration::ZERO).unwrap().is_none());
    let status = theirs.status().unwrap();
    assert_eq!((status.held, status.available()), (2, 0));

    // The stale permit's drop (in the background: it is known lost) frees nobody's.
    drop(stale);
    assert_eq!(theirs.status().unwrap().held, 2);
    drop(kept);
    drop(back);
    assert_eq!(theirs.status().unwrap().held, 0);
}

#[test]
fn a_release_after_the_lease_ran_out_is_lock_lost_and_frees_nobody_elses() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(400);
    let cut_off = lock_client_at(&proxy.url(), 400);
    let other = lock_client(&server, 5_000);
    let stale = cut_off.semaphore("one", 1).unwrap().acquire().unwrap();
    proxy.set_mode(Mode::Blackhole);
    let theirs = other.semaphore("one", 1).unwrap();
    let fresh = theirs
        .try_acquire(lease * 10)
        .unwrap()
        .expect("the permit came back");
    proxy.set_mode(Mode::Reset);
    proxy.set_mode(Mode::Pass);
    let err = stale.release().unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(fresh.is_held());
    assert!(theirs.try_acquire(Duration::ZERO).unwrap().is_none());
    fresh.release().unwrap();
}

#[test]
fn what_a_holder_cut_off_leaves_behind_goes_at_the_next_call() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let cut_off = lock_client_at(&proxy.url(), 300);
    let other = lock_client(&server, 5_000);
    let stale = cut_off.semaphore("left", 2).unwrap().acquire().unwrap();
    proxy.set_mode(Mode::Blackhole);
    assert!(
        stale.lost().recv_timeout(Duration::from_secs(5)).is_ok(),
        "no loss signal"
    );
    let mut con = server.connection();
    crate::support::poll_until(Duration::from_secs(5), ms(10), || {
        let exists: bool = redis::cmd("EXISTS")
            .arg("test:limit:{%semaphore:left}")
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        let permits: u64 = redis::cmd("EVAL")
            .arg("return #redis.call('KEYS', 'test:permit:*')")
            .arg(0)
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        if exists && permits == 0 {
            Ok(())
        } else {
            Err(format!("count stored: {exists}, permit keys: {permits}"))
        }
    })
    .unwrap();
    // The holder's member and the count are left behind; nobody holds or waits, so another
    // count is in force from the next call on, and that call prunes the member.
    let three = other.semaphore("left", 3).unwrap();
    let status = three.status().unwrap();
    assert_eq!((status.held, status.waiters), (0, 0));
    let permits: Vec<_> = (0..3)
        .map(|_| {
            three
                .try_acquire(Duration::ZERO)
                .unwrap()
                .expect("a permit")
        })
        .collect();
    let members: u64 = redis::cmd("ZCARD")
        .arg("test:permits:{%semaphore:left}")
        .query(&mut con)
        .unwrap();
    assert_eq!(members, 3);
    drop(permits);
    drop(stale);
    let keys: Vec<String> = redis::cmd("KEYS").arg("test:*").query(&mut con).unwrap();
    assert_eq!(keys, vec!["test:fence:{%semaphore:left}".to_owned()]);
}

#[test]
fn a_lost_permit_dropped_is_released_by_the_background_thread() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = lock_client_at(&proxy.url(), 300);
    let permit = client
        .semaphore("background", 1)
        .unwrap()
        .acquire()
        .unwrap();
    proxy.set_mode(Mode::Reset);
    assert!(
        permit.lost().recv_timeout(Duration::from_secs(5)).is_ok(),
        "no loss signal"
    );
    proxy.set_mode(Mode::Pass);
    let dropped = Instant::now();
    drop(permit);
    assert!(dropped.elapsed() < ms(100), "the drop waited for Redis");
    // Its member of the holders goes without another call on the semaphore.
    let mut con = server.connection();
    crate::support::poll_until(Duration::from_secs(5), ms(10), || {
        let members: u64 = redis::cmd("ZCARD")
            .arg("test:permits:{%semaphore:background}")
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        if members == 0 {
            Ok(())
        } else {
            Err(format!("{members} member(s) left"))
        }
    })
    .unwrap();
}
