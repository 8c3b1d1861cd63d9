//! A grant whose reply arrives after its lease ran out. The acquire reaches Redis, which sets
//! the lock with its lease; the reply is held up (here by the fault proxy; in the recorded
//! histories by a holder process starved of CPU by a cgroup quota) for longer than the lease.
//! Redis expires the key, a rival is granted it with a higher token, and only then does the
//! first caller's reply arrive.
//!
//! What a lock must do then, as Redlock does with a validity that is not positive: report the
//! attempt as not granted (and clean up), since by the caller's own clock the lease ran out
//! before it heard of it. Returning a guard would hand the caller a lock that another client
//! holds at that moment, with a token below the other's: in Jepsen's mutex model (the history
//! checker's), two holders at once, and a token that goes back.

use std::time::{Duration, Instant};

use crate::support::faults::{builder, spawn_answer, wait_until};
use crate::support::proxy::{Mode, Proxy};
use fencelock::LockClient;

use crate::support::{lock_client, lock_exists, ms, RedisServer};

#[test]
fn a_grant_whose_reply_comes_after_its_lease_ran_out_is_not_returned_as_held() {
    let (server, proxy, late, rival) = late_and_rival();
    let mut con = server.connection();
    late.lock("warm").unwrap().unlock().unwrap(); // a pooled connection; the scripts loaded

    // Each way takes a second: the acquire reaches Redis a second after it was sent, Redis
    // expires the key 300 ms later, and the reply arrives a second after the grant.
    proxy.set_mode(Mode::Delay(Duration::from_secs(1)));
    let caller = late.clone();
    let answer = spawn_answer(move || {
        let result = caller.try_lock("late", Duration::ZERO);
        (result, Instant::now())
    });
    wait_until(ms(10_000), "the delayed acquire to reach redis", || {
        lock_exists(&mut con, "late")
    });
    // The rival takes the key once Redis expired the late grant, before its reply arrives.
    let taken = rival
        .try_lock("late", Duration::from_secs(5))
        .unwrap()
        .expect("the rival is granted the key once the late grant expired");
    let rival_granted = Instant::now();
    let (result, returned) = answer.recv_timeout(Duration::from_secs(30)).unwrap();
    proxy.set_mode(Mode::Pass);
    assert!(
        returned > rival_granted,
        "the late reply came before the rival's grant: the fault did not happen as planned"
    );
    match result {
        Ok(None) => {}
        Err(e) => assert!(!e.is_connection(), "an error, not a grant: {e}"),
        Ok(Some(guard)) => panic!(
            "try_lock returned a grant (token {}, is_held() {}) {:?} after a rival was granted \
             the key (token {}, held): its lease ran out before the reply came, so two callers \
             hold the key at once and the later-returned token is the lower",
            guard.token(),
            guard.is_held(),
            returned - rival_granted,
            taken.token()
        ),
    }
    assert!(taken.is_held());
}

/// The same for a permit of a semaphore: a late permit would make n + 1 holders.
#[test]
fn a_permit_whose_reply_comes_after_its_lease_ran_out_is_not_returned_as_held() {
    let (_server, proxy, late, rival) = late_and_rival();
    let ours = late.semaphore("late-permit", 1).unwrap();
    let theirs = rival.semaphore("late-permit", 1).unwrap();
    ours.acquire().unwrap().release().unwrap(); // a pooled connection; the scripts loaded

    proxy.set_mode(Mode::Delay(Duration::from_secs(1)));
    let answer = spawn_answer(move || {
        let result = ours.try_acquire(Duration::ZERO);
        (result, Instant::now())
    });
    wait_until(
        ms(10_000),
        "the delayed acquire to be granted in redis",
        || theirs.status().unwrap().held == 1,
    );
    let taken = theirs
        .try_acquire(Duration::from_secs(5))
        .unwrap()
        .expect("the rival is granted the permit once the late grant expired");
    let rival_granted = Instant::now();
    let (result, returned) = answer.recv_timeout(Duration::from_secs(30)).unwrap();
    proxy.set_mode(Mode::Pass);
    assert!(
        returned > rival_granted,
        "the late reply came before the rival's grant: the fault did not happen as planned"
    );
    match result {
        Ok(None) => {}
        Err(e) => assert!(!e.is_connection(), "an error, not a grant: {e}"),
        Ok(Some(permit)) => panic!(
            "try_acquire returned a permit (token {}) after the rival was granted the only one \
             (token {}): two holders of one permit",
            permit.token(),
            taken.token()
        ),
    }
    assert!(taken.is_held());
}

/// The same for a write grant of a read-write lock.
#[test]
fn a_write_grant_whose_reply_comes_after_its_lease_ran_out_is_not_returned_as_held() {
    let (_server, proxy, late, rival) = late_and_rival();
    late.write_lock("late-rw").unwrap().unlock().unwrap(); // a pooled connection; the scripts

    proxy.set_mode(Mode::Delay(Duration::from_secs(1)));
    let caller = late.clone();
    let answer = spawn_answer(move || {
        let result = caller.try_write_lock("late-rw", Duration::ZERO);
        (result, Instant::now())
    });
    wait_until(
        ms(10_000),
        "the delayed write to be granted in redis",
        || rival.rwlock_status("late-rw").unwrap().writer,
    );
    let taken = rival
        .try_write_lock("late-rw", Duration::from_secs(5))
        .unwrap()
        .expect("the rival is granted the write once the late grant expired");
    let rival_granted = Instant::now();
    let (result, returned) = answer.recv_timeout(Duration::from_secs(30)).unwrap();
    proxy.set_mode(Mode::Pass);
    assert!(
        returned > rival_granted,
        "the late reply came before the rival's grant: the fault did not happen as planned"
    );
    match result {
        Ok(None) => {}
        Err(e) => assert!(!e.is_connection(), "an error, not a grant: {e}"),
        Ok(Some(write)) => panic!(
            "try_write_lock returned a write grant (token {}) after the rival was granted the \
             write (token {}): two writers at once",
            write.token(),
            taken.token()
        ),
    }
    assert!(taken.is_held());
}

/// A server, the fault proxy in front of it, a client through the proxy (lease 300 ms, with
/// response and connection timeouts long enough to wait out the proxy's delays) and a rival
/// client straight to the server.
fn late_and_rival() -> (RedisServer, Proxy, LockClient, LockClient) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let late = builder(proxy.url(), ms(300))
        .response_timeout(Duration::from_secs(10))
        .connection_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let rival = lock_client(&server, 300);
    (server, proxy, late, rival)
}
