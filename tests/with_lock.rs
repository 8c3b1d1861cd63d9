//! The closure helper: runs under the lock, hands over the guard, releases on return and panic.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use support::{lock_client, ms, RedisServer};

#[test]
fn with_lock_returns_the_value_and_releases() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let (token, was_held) = client
        .with_lock("stock:1", |guard| {
            assert!(rival.try_lock("stock:1", Duration::ZERO).unwrap().is_none());
            (guard.token(), guard.is_held())
        })
        .unwrap();
    assert!(was_held);
    let after = rival.try_lock("stock:1", Duration::ZERO).unwrap().unwrap();
    assert!(after.token() > token);
}

#[test]
fn with_lock_releases_when_the_closure_panics() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        client.with_lock("stock:2", |_guard| panic!("deduction failed"))
    }));
    assert!(outcome.is_err());
    assert!(rival.try_lock("stock:2", Duration::ZERO).unwrap().is_some());
}

#[test]
fn try_with_lock_skips_the_closure_when_busy_and_reports_loss() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let held = rival.lock("stock:3").unwrap();
    let mut ran = false;
    let got = client
        .try_with_lock("stock:3", ms(100), |_| ran = true)
        .unwrap();
    assert!(got.is_none() && !ran);
    drop(held);

    // The closure finished, but the lock was gone by then: the caller must hear it.
    let mut con = server.connection();
    let err = client
        .with_lock("stock:3", |_| {
            let _: () = redis::cmd("DEL")
                .arg("test:lock:{stock:3}")
                .query(&mut con)
                .unwrap();
        })
        .unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
}
