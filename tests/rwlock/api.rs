//! The read-write lock's calls: guards that move between threads, readers together, the `try_*`
//! timeouts, loss, keys left behind, independence from the plain lock of the same name, and the
//! quorum's refusal.

use std::time::{Duration, Instant};

use fencelock::{LockClient, ReadGuard, WriteGuard};

use crate::support::quorum::Quorum;
use crate::support::{free_port, lock_client, ms, RedisServer};
use crate::tag;

#[test]
fn guards_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ReadGuard>();
    send_sync::<WriteGuard>();
}

#[test]
fn bad_names_are_refused_before_any_network_call() {
    // Nothing listens there: a call that reached the network would fail otherwise.
    let client = LockClient::new(format!("redis://127.0.0.1:{}/", free_port())).unwrap();
    for name in ["", &*"k".repeat(fencelock::MAX_KEY_LEN + 1)] {
        let err = client.read_lock(name).unwrap_err();
        assert!(err.is_invalid_argument(), "{name:?}: {err:?}");
        let err = client.try_write_lock(name, ms(10)).unwrap_err();
        assert!(err.is_invalid_argument(), "{name:?}: {err:?}");
    }
}

#[test]
fn readers_hold_together_a_writer_alone_and_tokens_rise() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let r1 = client.read_lock("config").unwrap();
    let r2 = client
        .try_read_lock("config", Duration::ZERO)
        .unwrap()
        .expect("second reader");
    assert!(r2.token() > r1.token());
    assert_eq!(r1.key(), "config");
    assert!(client
        .try_write_lock("config", Duration::ZERO)
        .unwrap()
        .is_none());
    drop(r1);
    assert!(client
        .try_write_lock("config", Duration::ZERO)
        .unwrap()
        .is_none());
    let r2_token = r2.token();
    r2.unlock().unwrap();
    let w = client
        .try_write_lock("config", Duration::ZERO)
        .unwrap()
        .expect("free");
    assert!(w.token() > r2_token);
    assert!(client
        .try_read_lock("config", Duration::ZERO)
        .unwrap()
        .is_none());
    assert!(client
        .try_write_lock("config", Duration::ZERO)
        .unwrap()
        .is_none());
    let w_token = w.token();
    drop(w);
    let r3 = client.read_lock("config").unwrap();
    assert!(r3.token() > w_token);
    drop(r3);
    // Nothing is left behind once nobody holds or waits, but the fence counter.
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("test:*").query(&mut con).unwrap();
    assert_eq!(keys, vec![format!("test:fence:{{{}}}", tag("config"))]);
}

#[test]
fn try_timeouts_are_honoured() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let other = lock_client(&server, 30_000);
    let w = client.write_lock("slow").unwrap();
    for timeout in [Duration::ZERO, ms(300)] {
        let asked = Instant::now();
        assert!(other.try_read_lock("slow", timeout).unwrap().is_none());
        assert!(other.try_write_lock("slow", timeout).unwrap().is_none());
        let took = asked.elapsed();
        assert!(took >= timeout * 2, "gave up after {took:?}");
        assert!(took < timeout * 2 + ms(1_500), "gave up after {took:?}");
    }
    // A waiter that gave up left the queue.
    let mut con = server.connection();
    assert_eq!(crate::support::queue_len(&mut con, &tag("slow")), 0);
    drop(w);
    let r = other.try_read_lock("slow", ms(300)).unwrap().expect("free");
    let asked = Instant::now();
    assert!(client.try_write_lock("slow", ms(300)).unwrap().is_none());
    assert!(asked.elapsed() >= ms(300));
    drop(r);
}

#[test]
fn a_grant_whose_key_is_gone_is_reported_lost() {
    let server = RedisServer::start();
    let client = lock_client(&server, 1_000);
    let r = client.read_lock("gone").unwrap();
    let w_key = {
        let mut con = server.connection();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("test:rwhold:{{{}}}:*", tag("gone")))
            .query(&mut con)
            .unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        let _: () = redis::cmd("DEL").arg(&keys[0]).query(&mut con).unwrap();
        keys[0].clone()
    };
    // Renewal finds the key gone within a lease.
    r.lost()
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no loss reported for {w_key}: {e}"));
    assert!(!r.is_held());
    let err = r.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    // And a writer gets in at once.
    assert!(client
        .try_write_lock("gone", Duration::ZERO)
        .unwrap()
        .is_some());
}

#[test]
fn a_plain_lock_of_the_same_name_is_another_lock() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let w = client.write_lock("shared-name").unwrap();
    let l = client
        .try_lock("shared-name", Duration::ZERO)
        .unwrap()
        .expect("independent");
    let s = client
        .semaphore("shared-name", 1)
        .unwrap()
        .try_acquire(Duration::ZERO)
        .unwrap();
    assert!(s.is_some());
    assert!(w.is_held() && l.is_held());
}

#[test]
fn a_quorum_client_refuses_read_write_locks() {
    let quorum = Quorum::start(3);
    let client = quorum.client(ms(5_000));
    for err in [
        client.read_lock("config").unwrap_err(),
        client.write_lock("config").unwrap_err(),
        client.try_read_lock("config", ms(100)).unwrap_err(),
        client.try_write_lock("config", Duration::ZERO).unwrap_err(),
    ] {
        assert!(err.is_invalid_argument(), "{err:?}");
        assert!(err.to_string().contains("quorum"), "{err}");
    }
}

#[test]
fn names_with_braces_percent_signs_and_non_ascii_work_and_leave_only_their_fence_counter() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let names = ["{", "}", "a}b{c", "%7D", "%R", "ключ", "a b\r\n"];
    for name in names {
        let r = client.read_lock(name).unwrap();
        assert!(client
            .try_write_lock(name, Duration::ZERO)
            .unwrap()
            .is_none());
        let r2 = client
            .try_read_lock(name, Duration::ZERO)
            .unwrap()
            .expect(name);
        drop((r, r2));
        let w = client
            .try_write_lock(name, Duration::ZERO)
            .unwrap()
            .expect(name);
        assert_eq!(w.key(), name);
        w.unlock().unwrap();
    }
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("test:*").query(&mut con).unwrap();
    assert_eq!(keys.len(), names.len(), "{keys:?}");
    assert!(
        keys.iter().all(|k| k.starts_with("test:fence:{%rwlock:")),
        "{keys:?}"
    );
}
