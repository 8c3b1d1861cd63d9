//! Redis ACLs: what `docs/design.md` says a client's user needs (keys `~<namespace>:*`, channels
//! `&<namespace>:released:*`) is enough; a user without the channel pattern is told so in the
//! log, and its releases still hand over.
//!
//! Its own test binary, with one test: it captures the log, and a logger is process-wide
//! (installed once, and other tests' records would mix in).

#[path = "../support/mod.rs"]
mod support;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use log::Level;
use support::{await_queue_len, lock_client_at, ms, RedisServer};

#[test]
fn a_user_limited_to_its_namespace_can_lock_and_hand_over() {
    support::capture_logs();
    let server = RedisServer::start();
    let mut con = server.connection();
    support::add_documented_acl_user(&mut con);
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "deaf",
            "on",
            ">secret",
            "resetchannels",
            "~test:*",
            "+@all",
        ])
        .query(&mut con)
        .unwrap();
    let url = |user: &str| format!("redis://{user}:secret@127.0.0.1:{}/", server.port());

    // Locks and a handoff between two clients, heard at once.
    let holder = lock_client_at(&url("locker"), 30_000);
    let waiter = lock_client_at(&url("locker"), 30_000);
    let guard = holder.lock("acl").unwrap();
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let guard = waiter.lock("acl").unwrap();
        tx.send(guard.token()).unwrap();
        guard.unlock().unwrap();
    });
    await_queue_len(&mut con, "acl", 1);
    let token = guard.token();
    guard.unlock().unwrap();
    let handed = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the waiter was handed the lock");
    assert!(handed > token, "token {handed} after {token}");
    t.join().unwrap();
    let warned = |records: &[(Level, String)]| {
        records
            .iter()
            .filter(|(level, m)| *level == Level::Warn && m.contains("may not subscribe"))
            .count()
    };
    assert_eq!(warned(&support::log_records()), 0, "no ACL warning");

    // Without the channel pattern the wake thread cannot subscribe: one warning naming what is
    // missing, and the handoff, granted in Redis, goes unheard until the waiter looks again (a
    // lease later, so here not within the try_lock).
    let holder = lock_client_at(&url("locker"), 30_000);
    let deaf = lock_client_at(&url("deaf"), 30_000);
    let guard = holder.lock("acl2").unwrap();
    let t = thread::spawn(move || deaf.try_lock("acl2", ms(1_500)).unwrap().is_some());
    await_queue_len(&mut con, "acl2", 1);
    guard.unlock().unwrap();
    assert!(
        !t.join().unwrap(),
        "a waiter that cannot subscribe heard the handoff"
    );

    let records = support::log_records();
    assert_eq!(
        warned(&records),
        1,
        "one warning, however many retries: {records:?}"
    );
    assert!(
        records
            .iter()
            .any(|(_, m)| m.contains("may not subscribe") && m.contains("&<namespace>:released:*")),
        "the warning names the channel pattern"
    );

    // A holder that may not publish still hands over: its unlock succeeds and the lock is the
    // waiter's in Redis (the waiter, unnotified, would find it at its next attempt).
    let mute = lock_client_at(&url("deaf"), 30_000);
    let waiter = lock_client_at(&url("locker"), 30_000);
    let guard = mute.lock("acl3").unwrap();
    let t = thread::spawn(move || waiter.try_lock("acl3", ms(1_500)).unwrap().is_some());
    await_queue_len(&mut con, "acl3", 1);
    guard
        .unlock()
        .expect("a refused PUBLISH does not fail a release that handed over");
    assert!(
        support::lock_exists(&mut con, "acl3"),
        "the lock was handed to the waiter, not deleted"
    );
    assert!(!t.join().unwrap(), "the waiter was not notified");
}
