//! `LockClient::rwlock_status`: readers, a writer and waiting clients as Redis has them, a
//! holder whose lease ran out not counted, bad names refused, and the quorum's refusal.

use std::time::Duration;

use fencelock::RwLockStatus;

use crate::support::quorum::Quorum;
use crate::support::{lock_client, ms, RedisServer};
use crate::{await_waiting, tag};

fn counts(status: &RwLockStatus) -> (u64, bool, u64) {
    (status.readers, status.writer, status.waiters)
}

#[test]
fn status_counts_readers_a_writer_and_waiters() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let other = lock_client(&server, 30_000);
    let free = client.rwlock_status("config").unwrap();
    assert_eq!(counts(&free), (0, false, 0));
    assert!(!free.held());

    let r1 = client.read_lock("config").unwrap();
    let r2 = other.read_lock("config").unwrap();
    let status = client.rwlock_status("config").unwrap();
    assert_eq!(counts(&status), (2, false, 0));
    assert!(status.held());

    // A writer of another client waits behind the readers; a read status takes nothing.
    let writer = std::thread::spawn({
        let other = other.clone();
        move || other.write_lock("config").map(|w| w.token())
    });
    let mut con = server.connection();
    await_waiting(&mut con, "config", 1);
    assert_eq!(
        counts(&client.rwlock_status("config").unwrap()),
        (2, false, 1)
    );
    drop((r1, r2));
    writer.join().unwrap().unwrap();
    // The writer's thread has dropped its guard by now: nobody holds.
    assert_eq!(
        counts(&client.rwlock_status("config").unwrap()),
        (0, false, 0)
    );

    let w = client.write_lock("config").unwrap();
    let status = client.rwlock_status("config").unwrap();
    assert_eq!(counts(&status), (0, true, 0));
    assert!(status.held());
    w.unlock().unwrap();
}

#[test]
fn a_holder_whose_key_ran_out_is_not_counted() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let kept = client.read_lock("lapsed").unwrap();
    let gone = client.read_lock("lapsed").unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("test:rwhold:{{{}}}:*", tag("lapsed")))
        .query(&mut con)
        .unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    // As if one reader's lease ran out: its member stays in the readers' set until a script
    // that writes prunes it, but it holds nothing.
    let _: () = redis::cmd("DEL").arg(&keys[0]).query(&mut con).unwrap();
    assert_eq!(
        counts(&client.rwlock_status("lapsed").unwrap()),
        (1, false, 0)
    );
    drop((kept, gone));

    let w = client.write_lock("lapsed").unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("test:rwhold:{{{}}}:*", tag("lapsed")))
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&keys[0]).query(&mut con).unwrap();
    let status = client.rwlock_status("lapsed").unwrap();
    assert_eq!(counts(&status), (0, false, 0));
    assert!(!status.held());
    // And it is free indeed.
    assert!(client
        .try_read_lock("lapsed", Duration::ZERO)
        .unwrap()
        .is_some());
    drop(w);
}

#[test]
fn status_refuses_bad_names_and_a_quorum_client() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    for bad in [String::new(), "k".repeat(fencelock::MAX_KEY_LEN + 1)] {
        let err = client.rwlock_status(&bad).unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
    }
    let quorum = Quorum::start(3);
    let err = quorum
        .client(ms(5_000))
        .rwlock_status("config")
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    assert!(err.to_string().contains("quorum"), "{err}");
}
