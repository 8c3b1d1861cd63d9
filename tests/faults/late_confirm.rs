//! A grant whose reply took more than half its lease is confirmed by one extend before it is
//! handed out (see late_grant.rs). If Redis stops answering between the grant's reply and that
//! extend, the confirmation, and the give-back after it, must not hold the caller past its
//! timeout: a `try_*` call with a timeout returns by then (give or take a round trip), as it
//! does when Redis stops answering its attempt.

use std::time::{Duration, Instant};

use crate::support::faults::{builder, spawn_answer, wait_until};
use crate::support::proxy::{Mode, Proxy};
use crate::support::{ms, RedisServer};

/// The caller's timeout.
const TIMEOUT: Duration = Duration::from_secs(3);
/// How late past it a call may return: the delayed round trip (1.4 s) and some.
const SLACK: Duration = Duration::from_millis(2_000);

/// Runs `call` (a `try_*` with [`TIMEOUT`]) through a proxy that delays each way by 700 ms, on
/// a client with a lease of 1 s: the grant's reply comes 1.4 s after it was sent, more than
/// half the lease, so the client confirms it. Redis is paused (SIGSTOP) as soon as the grant is
/// in it (`granted` says), before the confirmation reaches it. Returns how long the call took
/// and a description of its result.
fn call_with_redis_stopped_after_the_grant(
    what: &str,
    call: impl FnOnce(fencelock::LockClient) -> String + Send + 'static,
    mut granted: impl FnMut(&mut redis::Connection) -> bool,
    warm: impl FnOnce(&fencelock::LockClient),
) -> (Duration, String) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // Long response timeout: a confirmation that waits for it shows plainly.
    let client = builder(proxy.url(), ms(1_000))
        .response_timeout(Duration::from_secs(8))
        .connection_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    warm(&client); // a pooled connection; the scripts loaded
    let mut con = server.connection();
    proxy.set_mode(Mode::Delay(ms(700)));
    let answer = spawn_answer(move || {
        let started = Instant::now();
        let result = call(client);
        (started.elapsed(), result)
    });
    wait_until(ms(10_000), what, || granted(&mut con));
    server.pause();
    let answer = answer.recv_timeout(Duration::from_secs(60));
    server.resume();
    answer.unwrap_or_else(|_| panic!("{what}: the call did not return within 60 s"))
}

#[test]
fn try_acquire_returns_by_its_timeout_when_redis_stops_before_a_late_permit_is_confirmed() {
    let (took, result) = call_with_redis_stopped_after_the_grant(
        "the delayed permit to be granted in redis",
        |client| {
            let pool = client.semaphore("late-confirm", 1).unwrap();
            match pool.try_acquire(TIMEOUT) {
                Ok(Some(permit)) => format!("a permit (token {})", permit.token()),
                Ok(None) => "no permit".to_owned(),
                Err(e) => format!("error {e}"),
            }
        },
        |con| {
            redis::cmd("ZCARD")
                .arg("test:permits:{%semaphore:late-confirm}")
                .query::<u64>(con)
                .unwrap()
                == 1
        },
        |client| {
            let pool = client.semaphore("late-confirm", 1).unwrap();
            pool.acquire().unwrap().release().unwrap();
        },
    );
    assert!(
        took < TIMEOUT + SLACK,
        "try_acquire({TIMEOUT:?}) returned after {took:?} ({result}): the confirmation of its \
         late grant, and the give-back after it, each waited for the response timeout"
    );
}

#[test]
fn try_write_lock_returns_by_its_timeout_when_redis_stops_before_a_late_write_is_confirmed() {
    let (took, result) = call_with_redis_stopped_after_the_grant(
        "the delayed write to be granted in redis",
        |client| match client.try_write_lock("late-confirm", TIMEOUT) {
            Ok(Some(write)) => format!("a write (token {})", write.token()),
            Ok(None) => "no write".to_owned(),
            Err(e) => format!("error {e}"),
        },
        |con| {
            redis::cmd("ZCARD")
                .arg("test:writers:{%rwlock:late-confirm}")
                .query::<u64>(con)
                .unwrap()
                == 1
        },
        |client| client.write_lock("late-confirm").unwrap().unlock().unwrap(),
    );
    assert!(
        took < TIMEOUT + SLACK,
        "try_write_lock({TIMEOUT:?}) returned after {took:?} ({result}): the confirmation of \
         its late grant, and the give-back after it, each waited for the response timeout"
    );
}

#[test]
fn try_lock_returns_by_its_timeout_when_redis_stops_before_a_late_lock_is_confirmed() {
    let (took, result) = call_with_redis_stopped_after_the_grant(
        "the delayed lock to be granted in redis",
        |client| match client.try_lock("late-confirm", TIMEOUT) {
            Ok(Some(guard)) => format!("a lock (token {})", guard.token()),
            Ok(None) => "no lock".to_owned(),
            Err(e) => format!("error {e}"),
        },
        |con| crate::support::lock_exists(con, "late-confirm"),
        |client| client.lock("late-confirm").unwrap().unlock().unwrap(),
    );
    assert!(
        took < TIMEOUT + SLACK,
        "try_lock({TIMEOUT:?}) returned after {took:?} ({result}): the confirmation of its late \
         grant, and the give-back after it, each waited for the response timeout"
    );
}
