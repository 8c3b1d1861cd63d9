//! Reentrancy: nested grants share one token, only the outermost release releases, and a plain
//! lock of a key the thread holds reentrantly is refused instead of waiting forever.

use std::time::Duration;

use crate::support::{lock_client, lock_exists, ms, RedisServer};

fn exists(server: &RedisServer, key: &str) -> bool {
    lock_exists(&mut server.connection(), key)
}

#[test]
fn nested_guards_share_the_token_and_the_last_one_releases() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);

    let guards: Vec<_> = (0..5)
        .map(|_| client.reentrant_lock("nest").unwrap())
        .collect();
    assert!(guards.iter().all(|g| g.token() == guards[0].token()));
    assert_eq!(guards[0].hold_count(), 5);

    // Release in an order that is neither LIFO nor FIFO; the lock stays until the last.
    let mut guards: Vec<_> = guards.into_iter().map(Some).collect();
    for i in [2, 0, 4, 1] {
        guards[i].take().unwrap().unlock().unwrap();
        assert!(exists(&server, "nest"), "released after dropping guard {i}");
        assert!(rival.try_lock("nest", Duration::ZERO).unwrap().is_none());
    }
    let last = guards[3].take().unwrap();
    assert_eq!(last.hold_count(), 1);
    last.unlock().unwrap();
    assert!(!exists(&server, "nest"));

    // A fresh reentrant lock after full release is a new grant with a higher token.
    let again = client.reentrant_lock("nest").unwrap();
    assert_eq!(again.hold_count(), 1);
    drop(again);
    assert!(
        !exists(&server, "nest"),
        "drop of the last share must release"
    );
}

#[test]
fn interleaved_keys_keep_separate_counts() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let a1 = client.reentrant_lock("a").unwrap();
    let b1 = client.reentrant_lock("b").unwrap();
    let a2 = client.reentrant_lock("a").unwrap();
    let b2 = client.reentrant_lock("b").unwrap();
    let a3 = client.reentrant_lock("a").unwrap();
    assert_eq!((a1.hold_count(), b1.hold_count()), (3, 2));
    drop(b1);
    drop(a3);
    assert_eq!((a2.hold_count(), b2.hold_count()), (2, 1));
    drop(b2);
    assert!(!exists(&server, "b"));
    assert!(exists(&server, "a"));
    drop(a1);
    drop(a2);
    assert!(!exists(&server, "a"));
}

#[test]
fn another_thread_or_client_does_not_share_the_hold() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let held = client.reentrant_lock("mine").unwrap();
    let other_thread = {
        let client = client.clone();
        std::thread::spawn(move || {
            let got = client.try_lock("mine", ms(200)).unwrap();
            got.is_none()
        })
    };
    assert!(
        other_thread.join().unwrap(),
        "another thread entered a held reentrant lock"
    );
    let other_client = lock_client(&server, 30_000);
    assert!(other_client
        .try_lock("mine", Duration::ZERO)
        .unwrap()
        .is_none());
    drop(held);
}

#[test]
fn only_reentrant_guards_nest() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    // A plain guard is not tracked by thread (it may move): a reentrant lock of its key waits.
    let guard = client.lock("once").unwrap();
    let started = std::time::Instant::now();
    let waited = client.try_lock("once", ms(100)).unwrap();
    assert!(waited.is_none() && started.elapsed() >= ms(100));
    // A reentrant hold refuses a plain re-lock on its thread (`moved_guards` has more).
    let nested = client.reentrant_lock("twice").unwrap();
    assert!(client.lock("twice").unwrap_err().is_would_deadlock());
    drop(nested);
    // After release the same thread locks again normally.
    guard.unlock().unwrap();
    client.lock("once").unwrap().unlock().unwrap();
    client.reentrant_lock("twice").unwrap().unlock().unwrap();
}

#[test]
fn nesting_into_a_lost_grant_reports_the_loss() {
    let server = RedisServer::start();
    let client = lock_client(&server, 300);
    let outer = client.reentrant_lock("gone").unwrap();
    let mut con = server.connection();
    let _: () = redis::cmd("DEL")
        .arg("test:lock:{gone}")
        .query(&mut con)
        .unwrap();
    assert!(outer.lost().recv_timeout(ms(1_000)).is_ok());
    let err = client.reentrant_lock("gone").unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert_eq!(outer.hold_count(), 1);
}

#[test]
fn try_reentrant_lock_nests_at_once_and_waits_at_most_its_timeout_otherwise() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);

    let outer = client
        .try_reentrant_lock("bounded", Duration::ZERO)
        .unwrap()
        .expect("a free key");
    // Nested: at once, with a zero timeout, sharing the grant.
    let inner = client
        .try_reentrant_lock("bounded", Duration::ZERO)
        .unwrap()
        .expect("nesting never waits");
    assert_eq!(inner.token(), outer.token());
    assert_eq!(outer.hold_count(), 2);

    // Another thread waits its timeout, then gets the lock once this thread lets go.
    let elsewhere = {
        let client = client.clone();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let busy = client.try_reentrant_lock("bounded", ms(200)).unwrap();
            let waited = started.elapsed();
            assert!(busy.is_none(), "granted a key another thread holds");
            assert!(waited >= ms(200) && waited < ms(1_000), "{waited:?}");
            let later = client
                .try_reentrant_lock("bounded", Duration::from_secs(5))
                .unwrap();
            later.map(|guard| guard.token())
        })
    };
    std::thread::sleep(ms(400));
    let first = outer.token();
    drop(inner);
    drop(outer);
    let token = elsewhere
        .join()
        .unwrap()
        .expect("granted after the release");
    assert!(token > first);

    // Input and lost holds are reported as for reentrant_lock.
    let err = client.try_reentrant_lock("", ms(10)).unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    let client = lock_client(&server, 300); // renews every 100 ms: hears of the loss soon
    let gone = client.reentrant_lock("gone2").unwrap();
    let _: () = redis::cmd("DEL")
        .arg("test:lock:{gone2}")
        .query(&mut server.connection())
        .unwrap();
    assert!(gone.lost().recv_timeout(ms(1_000)).is_ok());
    let err = client.try_reentrant_lock("gone2", ms(10)).unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
}
