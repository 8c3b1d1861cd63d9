//! A caller's timeout holds whatever Redis does, a configuration error fails at once and says
//! what is wrong, and dropping a guard never waits long for a Redis that is gone.

use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::support::{free_port, lock_client, lock_exists, ms, RedisServer, NAMESPACE};

/// Far more than any of the bounds below: a call that waits for it fails its test.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

fn client_at(url: &str) -> LockClient {
    LockClient::builder(url)
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(10))
        .connection_timeout(CONNECTION_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .build()
        .unwrap_or_else(|e| panic!("client for {url}: {e}"))
}

/// Runs `f`, asserting it returns within `bound`.
fn within<T>(bound: Duration, what: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let value = f();
    let took = started.elapsed();
    assert!(took < bound, "{what} took {took:?}, more than {bound:?}");
    value
}

#[test]
fn calls_fail_at_once_when_nothing_listens() {
    let client = client_at(&format!("redis://127.0.0.1:{}/", free_port()));
    let bound = Duration::from_secs(2);
    let e = within(bound, "try_lock(200 ms)", || client.try_lock("k", ms(200))).unwrap_err();
    assert!(e.is_connection(), "{e}");
    assert!(
        e.to_string().contains("refused"),
        "the cause is in the message: {e}"
    );
    let e = within(bound, "lock()", || client.lock("k")).unwrap_err();
    assert!(e.is_connection(), "{e}");
    let e = within(bound, "with_lock()", || {
        client.with_lock("k", |_| Ok::<_, fencelock::Error>(()))
    })
    .unwrap_err();
    assert!(e.is_connection(), "{e}");
    let e = within(bound, "try_lock(0)", || {
        client.try_lock("k", Duration::ZERO)
    })
    .unwrap_err();
    assert!(e.is_connection(), "{e}");
}

#[test]
fn a_killed_server_costs_no_timeout() {
    let mut server = RedisServer::start();
    let client = client_at(&server.url());
    // Pooled connections exist, and then go stale.
    drop(client.lock("k").unwrap());
    server.kill();
    let e = within(Duration::from_secs(2), "try_lock(1 s)", || {
        client.try_lock("k", Duration::from_secs(1))
    })
    .unwrap_err();
    assert!(e.is_connection(), "{e}");
}

#[test]
fn try_lock_returns_by_its_deadline_from_a_frozen_server() {
    let server = RedisServer::start();
    let client = client_at(&server.url());
    drop(client.lock("k").unwrap());
    server.pause();
    let result = within(Duration::from_secs(2), "try_lock(300 ms)", || {
        client.try_lock("k", ms(300))
    });
    server.resume();
    let e = result.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    // Nothing is left behind: whatever the attempt did ran, and was undone, once Redis woke.
    let mut con = server.connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock_exists(&mut con, "k") && Instant::now() < deadline {
        std::thread::sleep(ms(20));
    }
    assert!(!lock_exists(&mut con, "k"), "a lock was left behind");
    assert!(client
        .try_lock("k", Duration::from_secs(2))
        .unwrap()
        .is_some());
}

#[test]
fn dropping_a_guard_while_redis_is_frozen_does_not_wait_for_it() {
    let server = RedisServer::start();
    let client = LockClient::builder(server.url())
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let guard = client.lock("held").unwrap();
    server.pause();
    // The client learns that Redis stopped answering: a call got no reply within the response
    // timeout. (A reply that missed a try_lock's deadline would not tell it: Redis may just be
    // slower than that deadline.)
    let e = client.lock("other").unwrap_err();
    assert!(e.is_timeout(), "{e}");
    within(Duration::from_secs(1), "dropping a guard", || drop(guard));
    server.resume();
    // The release was not lost: it ran in the background once Redis answered.
    let mut con = server.connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock_exists(&mut con, "held") && Instant::now() < deadline {
        std::thread::sleep(ms(20));
    }
    assert!(
        !lock_exists(&mut con, "held"),
        "the dropped guard's lock was never released"
    );
}

#[test]
fn dropping_a_guard_after_redis_died_does_not_wait() {
    let mut server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let guard = client.lock("held").unwrap();
    server.kill();
    within(Duration::from_secs(1), "dropping a guard", || drop(guard));
    let guard_error = client.try_lock("k", ms(100)).unwrap_err();
    assert!(guard_error.is_connection(), "{guard_error}");
}

fn rejected(url: &str, says: &str) {
    let client = client_at(url);
    for (what, result) in [
        ("lock", client.lock("k").map(drop)),
        (
            "try_lock",
            client.try_lock("k", Duration::from_secs(3)).map(drop),
        ),
    ] {
        let e = within(Duration::from_secs(2), what, || result).unwrap_err();
        assert!(e.is_rejected(), "{url} {what}: {e:?}");
        assert!(!e.is_connection(), "{url} {what}: not an outage: {e:?}");
        let shown = e.to_string();
        assert!(shown.contains(says), "{url} {what}: {shown}");
    }
}

#[test]
fn configuration_errors_fail_at_once_and_say_why() {
    let open = RedisServer::start();
    let guarded = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "sekrit"])
        .query(&mut guarded.connection())
        .unwrap();
    let at = |server: &RedisServer, auth: &str, db: &str| {
        format!("redis://{auth}127.0.0.1:{}/{db}", server.port())
    };
    rejected(&at(&guarded, ":wrong@", ""), "authentication failed");
    rejected(&at(&guarded, "", ""), "NOAUTH");
    rejected(&at(&open, ":sekrit@", ""), "authentication failed");
    rejected(&at(&open, "", "99"), "DB index is out of range");
    // And the right settings work on the same servers.
    drop(client_at(&at(&guarded, ":sekrit@", "")).lock("k").unwrap());
    drop(client_at(&at(&open, "", "3")).lock("k").unwrap());
}
