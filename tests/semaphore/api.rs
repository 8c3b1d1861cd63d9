//! The semaphore's calls: validation, `try_acquire`'s timeout, one count per name, a lock of
//! the same name, the quorum's refusal, and `acquire_with`'s options (cancel, lease).

use std::time::{Duration, Instant};

use fencelock::{LockClient, LockOptions, Permit, Semaphore, SemaphoreStatus};

use crate::support::quorum::Quorum;
use crate::support::{free_port, lock_client, ms, RedisServer};

#[test]
fn semaphores_and_permits_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Semaphore>();
    send_sync::<Permit>();
    send_sync::<SemaphoreStatus>();
}

#[test]
fn bad_names_and_counts_are_refused_before_any_network_call() {
    // Nothing listens there: a call that reached the network would fail otherwise.
    let client = LockClient::new(format!("redis://127.0.0.1:{}/", free_port())).unwrap();
    for (name, permits) in [
        ("", 1),
        ("a", 0),
        (&*"k".repeat(fencelock::MAX_KEY_LEN + 1), 1),
    ] {
        let err = client.semaphore(name, permits).unwrap_err();
        assert!(err.is_invalid_argument(), "{name:?} {permits}: {err:?}");
    }
    let ok = client.semaphore("uploads", 4).unwrap();
    assert_eq!((ok.name(), ok.permits()), ("uploads", 4));
}

#[test]
fn try_acquire_gives_up_at_its_timeout_and_leaves_the_queue() {
    let server = RedisServer::start();
    let a = lock_client(&server, 5_000);
    let b = lock_client(&server, 5_000);
    let held = a.semaphore("one", 1).unwrap().acquire().unwrap();
    let one = b.semaphore("one", 1).unwrap();

    let started = Instant::now();
    assert!(one.try_acquire(Duration::ZERO).unwrap().is_none());
    assert!(started.elapsed() < ms(500), "{:?}", started.elapsed());
    assert_eq!(one.status().unwrap().waiters, 0, "a zero timeout queued");

    let timeout = ms(300);
    let started = Instant::now();
    assert!(one.try_acquire(timeout).unwrap().is_none());
    let took = started.elapsed();
    assert!(took >= timeout, "gave up after {took:?}");
    assert!(took < timeout + ms(700), "gave up after {took:?}");
    assert_eq!(one.status().unwrap().waiters, 0, "left its entry behind");

    // The release finds nobody to hand to: the permit is free for the next caller.
    held.release().unwrap();
    assert!(one.try_acquire(Duration::ZERO).unwrap().is_some());
}

#[test]
fn another_count_is_refused_while_the_semaphore_is_in_use() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let two = client.semaphore("count", 2).unwrap();
    let three = client.semaphore("count", 3).unwrap();
    let held = two.acquire().unwrap();
    for err in [
        three.try_acquire(Duration::ZERO).unwrap_err(),
        three.try_acquire(ms(100)).unwrap_err(),
        three.status().unwrap_err(),
    ] {
        assert!(err.is_invalid_argument(), "{err:?}");
        assert!(err.to_string().contains("in use with 2 permits"), "{err}");
    }
    assert_eq!(two.status().unwrap().held, 1);
    held.release().unwrap();
    // Nobody holds or waits: the next call's count is the one in force.
    let held = three.acquire().unwrap();
    let err = two.try_acquire(Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("in use with 3 permits"), "{err}");
    let more: Vec<_> = (0..2)
        .map(|_| {
            three
                .try_acquire(Duration::ZERO)
                .unwrap()
                .expect("a permit")
        })
        .collect();
    assert!(three.try_acquire(Duration::ZERO).unwrap().is_none());
    drop((held, more));
}

#[test]
fn a_lock_and_a_semaphore_of_one_name_share_nothing() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let guard = client.lock("shared").unwrap();
    let permit = client
        .semaphore("shared", 1)
        .unwrap()
        .try_acquire(Duration::ZERO)
        .unwrap()
        .expect("the lock holds no permit");
    assert!(client.try_lock("shared", Duration::ZERO).unwrap().is_none());
    assert!(client.status("shared").unwrap().held);
    guard.unlock().unwrap();
    assert!(permit.is_held());
    permit.release().unwrap();
}

#[test]
fn a_quorum_client_refuses_semaphores() {
    let quorum = Quorum::start(3);
    let client = quorum.client(ms(5_000));
    let err = client.semaphore("uploads", 4).unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    assert!(err.to_string().contains("quorum"), "{err}");
}

#[test]
fn a_waiter_alone_keeps_the_count_in_force() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let one = client.semaphore("waited", 1).unwrap();
    let held = one.acquire().unwrap();
    // Another client's waiter stands in the queue (made by hand), and the holder's lease runs
    // out (its key deleted by hand): nobody holds, somebody waits.
    let mut con = server.connection();
    let now: (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let expiry = now.0 * 1000 + now.1 / 1000 + 60_000;
    let permit_keys: Vec<String> = redis::cmd("KEYS")
        .arg("test:permit:*")
        .query(&mut con)
        .unwrap();
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg("test:queue:{%semaphore:waited}")
        .arg("other:1")
        .ignore()
        .cmd("HSET")
        .arg("test:waiters:{%semaphore:waited}")
        .arg("other:1")
        .arg(format!("{expiry} 5000"))
        .ignore()
        .cmd("DEL")
        .arg(&permit_keys)
        .ignore()
        .query(&mut con)
        .unwrap();
    let status = one.status().unwrap();
    assert_eq!((status.held, status.waiters), (0, 1));
    let two = client.semaphore("waited", 2).unwrap();
    let err = two.try_acquire(Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("in use with 1 permits"), "{err}");
    assert!(two.status().unwrap_err().is_invalid_argument());
    drop(held);
}

#[test]
fn any_name_works_and_stays_in_one_slot() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    for name in ["{x}%", "a}b{c", "nul\0cr\r\nlf", "ключ", "%S"] {
        let semaphore = client.semaphore(name, 1).unwrap();
        let permit = semaphore.acquire().unwrap();
        assert_eq!(permit.name(), name);
        assert!(semaphore.try_acquire(Duration::ZERO).unwrap().is_none());
        permit.release().unwrap();
        assert!(semaphore.try_acquire(Duration::ZERO).unwrap().is_some());
    }
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("test:*").query(&mut con).unwrap();
    assert_eq!(keys.len(), 5, "{keys:?}");
    assert!(
        keys.iter()
            .all(|k| k.starts_with("test:fence:{%semaphore:")),
        "{keys:?}"
    );
}

#[test]
fn a_cancelled_acquire_with_ends_and_leaves_the_queue_and_unsupported_options_are_refused() {
    let server = RedisServer::start();
    let a = lock_client(&server, 5_000);
    let b = lock_client(&server, 5_000);
    let held = a.semaphore("one", 1).unwrap().acquire().unwrap();
    let semaphore = b.semaphore("one", 1).unwrap();

    let (cancel, cancelled) = fencelock::crossbeam_channel::bounded(1);
    let options = LockOptions::new().cancel(cancelled);
    let waiter = {
        let semaphore = semaphore.clone();
        std::thread::spawn(move || semaphore.acquire_with(&options).map(|_| ()))
    };
    let started = Instant::now();
    while semaphore.status().unwrap().waiters != 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "never queued");
        std::thread::sleep(ms(5));
    }
    cancel.send(()).unwrap();
    let err = waiter.join().unwrap().unwrap_err();
    assert!(err.is_cancelled(), "{err:?}");
    assert_eq!(semaphore.status().unwrap().waiters, 0, "left in the queue");

    // A per-call lease is taken; renewal off and a maximum hold are refused.
    held.release().unwrap();
    let permit = semaphore
        .try_acquire_with(ms(500), &LockOptions::new().lease(ms(2_000)))
        .unwrap()
        .expect("free");
    permit.release().unwrap();
    for options in [
        LockOptions::new().renew(false),
        LockOptions::new().max_hold(ms(1_000)),
        LockOptions::new().lease(Duration::ZERO),
    ] {
        let err = semaphore.try_acquire_with(ms(0), &options).unwrap_err();
        assert!(err.is_invalid_argument(), "{options:?}: {err:?}");
    }
}
