//! The `*_with` calls: a cancelled wait ends and leaves Redis' queue, a per-call lease is the
//! grant's, and the options a read or write grant does not take are refused.

use std::time::{Duration, Instant};

use fencelock::LockOptions;

use crate::support::{lock_client, ms, RedisServer};

#[test]
fn a_cancelled_read_or_write_wait_ends_and_leaves_the_queue() {
    let server = RedisServer::start();
    let a = lock_client(&server, 5_000);
    let b = lock_client(&server, 5_000);
    let held = a.write_lock("doc").unwrap();

    for write in [false, true] {
        let (cancel, cancelled) = fencelock::crossbeam_channel::bounded(1);
        let options = LockOptions::new().cancel(cancelled);
        let (done, result) = std::sync::mpsc::channel();
        {
            let b = b.clone();
            std::thread::spawn(move || {
                let taken = if write {
                    b.write_lock_with("doc", &options).map(drop)
                } else {
                    b.read_lock_with("doc", &options).map(drop)
                };
                let _ = done.send(taken);
            });
        }
        let started = Instant::now();
        while b.rwlock_status("doc").unwrap().waiters != 1 {
            assert!(started.elapsed() < Duration::from_secs(10), "never queued");
            std::thread::sleep(ms(5));
        }
        cancel.send(()).unwrap();
        let err = result
            .recv_timeout(Duration::from_secs(10))
            .expect("the cancelled wait did not end within 10 s")
            .unwrap_err();
        assert!(err.is_cancelled(), "write {write}: {err:?}");
        assert_eq!(
            b.rwlock_status("doc").unwrap().waiters,
            0,
            "write {write}: left in the queue"
        );
        assert!(held.is_held(), "the holder kept its write");
    }

    // A wait cancelled before it starts touches nothing.
    let (cancel, cancelled) = fencelock::crossbeam_channel::bounded(1);
    cancel.send(()).unwrap();
    let err = b
        .try_read_lock_with("doc", ms(1_000), &LockOptions::new().cancel(cancelled))
        .unwrap_err();
    assert!(err.is_cancelled(), "{err:?}");
    held.unlock().unwrap();
}

#[test]
fn a_per_call_lease_is_the_grants_and_unsupported_options_are_refused() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let options = LockOptions::new().lease(ms(2_000));

    let read = client
        .try_read_lock_with("doc", ms(500), &options)
        .unwrap()
        .expect("free");
    assert_eq!(read.lease(), ms(2_000));
    read.unlock().unwrap();
    let write = client.write_lock_with("doc", &options).unwrap();
    assert_eq!(write.lease(), ms(2_000));
    // In Redis too: the write's key runs the per-call lease, not the client's 5 s.
    let status_lease = {
        let mut con = server.connection();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*:rwhold:{%rwlock:doc}:*")
            .query(&mut con)
            .unwrap();
        assert_eq!(keys.len(), 1, "one grant key: {keys:?}");
        let pttl: i64 = redis::cmd("PTTL").arg(&keys[0]).query(&mut con).unwrap();
        pttl
    };
    assert!(
        (1..=2_000).contains(&status_lease),
        "a key of the write runs {status_lease} ms, more than the 2 s asked for"
    );
    write.unlock().unwrap();

    for options in [
        LockOptions::new().renew(false),
        LockOptions::new().max_hold(ms(1_000)),
        LockOptions::new().lease(Duration::ZERO),
    ] {
        let err = client
            .try_write_lock_with("doc", ms(0), &options)
            .unwrap_err();
        assert!(err.is_invalid_argument(), "{options:?}: {err:?}");
        let err = client
            .try_read_lock_with("doc", ms(0), &options)
            .unwrap_err();
        assert!(err.is_invalid_argument(), "{options:?}: {err:?}");
    }
}
