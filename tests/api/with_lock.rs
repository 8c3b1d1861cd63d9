//! The closure helpers: run under the lock, hand over the guard, release on return, on error and
//! on panic; errors of the closure and of fencelock come back as one error type.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use fencelock::{Error, FencedRedis, LockOptions};

use crate::support::{lock_client, lock_exists, lock_pttl, ms, RedisServer, NAMESPACE};

/// An application's own error type, as a caller of `with_lock` has one.
#[derive(Debug)]
enum AppError {
    OutOfStock,
    Lock(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Lock(e)
    }
}

#[test]
fn with_lock_returns_the_value_and_releases() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let (token, was_held) = client
        .with_lock("stock:1", |guard| {
            assert!(rival.try_lock("stock:1", Duration::ZERO)?.is_none());
            Ok::<_, Error>((guard.token(), guard.is_held()))
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
        client.with_lock("stock:2", |_guard| -> Result<(), Error> {
            panic!("deduction failed")
        })
    }));
    assert!(outcome.is_err());
    assert!(rival.try_lock("stock:2", Duration::ZERO).unwrap().is_some());
}

#[test]
fn a_fallible_closure_and_the_lock_share_one_error_type() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let store = FencedRedis::from(&client);
    let take_one = || -> Result<i64, AppError> {
        client.with_lock("stock:4", |guard| {
            let left = store.incr_by("stock:4", guard.token(), -1)?;
            if left < 0 {
                store.incr_by("stock:4", guard.token(), 1)?;
                return Err(AppError::OutOfStock);
            }
            Ok(left)
        })
    };
    let mut con = server.connection();
    let _: () = redis::cmd("SET")
        .arg(format!("{NAMESPACE}:data:{{stock:4}}"))
        .arg(2)
        .query(&mut con)
        .unwrap();
    assert_eq!(take_one().unwrap(), 1);
    assert_eq!(take_one().unwrap(), 0);
    // The closure's own error comes back as it is, and the lock is released all the same.
    assert!(matches!(take_one(), Err(AppError::OutOfStock)));
    assert!(!lock_exists(&mut con, "stock:4"));

    // fencelock's errors arrive converted: here a fenced write refused inside the closure...
    let newer = client.lock("stock:4").unwrap();
    let stale = newer.token();
    drop(newer);
    let current = client.lock("stock:4").unwrap();
    store.claim("stock:4", current.token()).unwrap();
    drop(current);
    let refused = client.with_lock("stock:4", |_| {
        store.set("stock:4", stale, "7")?;
        Ok::<_, AppError>(())
    });
    assert!(
        matches!(&refused, Err(AppError::Lock(e)) if e.is_stale_token()),
        "{refused:?}"
    );
    // ...and bad input, before anything ran.
    let mut ran = false;
    let invalid = client.with_lock("", |_| {
        ran = true;
        Ok::<_, AppError>(())
    });
    assert!(
        matches!(&invalid, Err(AppError::Lock(e)) if e.is_invalid_argument()) && !ran,
        "{invalid:?}"
    );
}

#[test]
fn try_with_lock_skips_the_closure_when_busy_and_reports_loss() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let held = rival.lock("stock:3").unwrap();
    let mut ran = false;
    let got = client
        .try_with_lock("stock:3", ms(100), |_| {
            ran = true;
            Ok::<_, Error>(())
        })
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
            Ok::<_, Error>(())
        })
        .unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
}

#[test]
fn with_lock_options_takes_the_lock_with_its_options() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();

    // A lease of its own, without renewal: Redis sees that lease, not the client's 30 s.
    let options = LockOptions::new().lease(ms(2_000)).renew(false);
    let (pttl, lease) = client
        .with_lock_options("report", &options, |guard| {
            Ok::<_, Error>((lock_pttl(&mut con, "report"), guard.lease()))
        })
        .unwrap();
    assert_eq!(lease, ms(2_000));
    assert!(pttl > 0 && pttl <= 2_000, "pttl {pttl} ms for a 2 s lease");
    assert!(!lock_exists(&mut con, "report"));

    // The timed variant, with options: skipped while busy, run once free.
    let rival = lock_client(&server, 30_000);
    let held = rival.lock("report").unwrap();
    let busy = client
        .try_with_lock_options("report", ms(100), &options, |_| Ok::<_, Error>(()))
        .unwrap();
    assert!(busy.is_none());
    drop(held);
    let free = client
        .try_with_lock_options("report", ms(1_000), &options, |guard| {
            Ok::<_, Error>(guard.lease())
        })
        .unwrap();
    assert_eq!(free, Some(ms(2_000)));

    // Options out of range are refused before the closure runs.
    let bad = LockOptions::new().lease(Duration::ZERO);
    let err = client
        .with_lock_options("report", &bad, |_| Ok::<_, Error>(()))
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
}
