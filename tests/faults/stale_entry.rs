//! A waiter that gives up while Redis does not answer: its `try_*` returns by its timeout, and
//! its place in Redis' queue is taken out once Redis answers again (by the client's background
//! thread), not left to run out by itself. A live entry left behind is owed what frees up: a
//! release hands it the lock (a permit, a write) for up to 5 s with nobody to use it, and a
//! semaphore's permits freed by a lease that ran out, or a read-write lock's reads behind a
//! writer's entry, wait for it until the entry expires (the holder's remaining lease plus the
//! waiter's own).

use std::time::Duration;

use crate::support::faults::{builder, spawn_answer, wait_until};
use crate::support::{ms, RedisServer};

/// Leases long enough that an entry left behind outlives the test's patience by far.
const LEASE: Duration = Duration::from_secs(30);

/// The waiter's timeout.
const TIMEOUT: Duration = Duration::from_millis(800);

/// Runs `wait` (a `try_*` with [`TIMEOUT`] on a client of its own, while another client holds
/// what it waits for) until its entry is in Redis' queue (`entries` counts the live entries),
/// then stops Redis (SIGSTOP) until the call has returned, so that its leaving the queue gets
/// no answer; then resumes Redis and waits for the entry to be gone.
fn gives_up_while_stopped(
    hold: impl FnOnce(&fencelock::LockClient) -> Box<dyn std::any::Any>,
    wait: impl FnOnce(fencelock::LockClient) -> String + Send + 'static,
    mut entries: impl FnMut(&mut redis::Connection) -> u64,
) {
    let server = RedisServer::start();
    let holder = builder(server.url(), LEASE).build().unwrap();
    let waiter = builder(server.url(), LEASE)
        .response_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut con = server.connection();
    let held = hold(&holder);
    let answer = spawn_answer(move || wait(waiter));
    wait_until(ms(5_000), "the waiter's entry in Redis' queue", || {
        entries(&mut con) == 1
    });
    server.pause();
    let answer = answer.recv_timeout(Duration::from_secs(30));
    server.resume();
    let result = answer.expect("the waiter did not return within 30 s");
    assert!(
        result.starts_with("none") || result.starts_with("error"),
        "the waiter got a grant while another held it: {result}"
    );
    let mut con = server.connection();
    wait_until(
        ms(5_000),
        &format!(
            "the entry of a waiter that gave up ({result}) while Redis was stopped to be taken \
             out once it answers again (it stays live for the holder's lease plus the waiter's)"
        ),
        || entries(&mut con) == 0,
    );
    drop(held);
}

/// Live entries of a queue's HASH (`"<expiry ms> ..."`), by the server's clock.
fn live_entries(con: &mut redis::Connection, hash: &str) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
    let now = secs * 1000 + micros / 1000;
    let values: Vec<String> = redis::cmd("HVALS").arg(hash).query(con).unwrap();
    values
        .iter()
        .filter_map(|v| v.split(' ').next()?.parse::<u64>().ok())
        .filter(|expiry| *expiry > now)
        .count() as u64
}

fn describe<T>(result: fencelock::Result<Option<T>>) -> String {
    match result {
        Ok(Some(_)) => "a grant".to_owned(),
        Ok(None) => "none".to_owned(),
        Err(e) => format!("error {e}"),
    }
}

#[test]
fn a_permit_waiter_that_gives_up_while_redis_is_stopped_leaves_no_entry_behind() {
    gives_up_while_stopped(
        |holder| Box::new(holder.semaphore("stale", 1).unwrap().acquire().unwrap()),
        |waiter| describe(waiter.semaphore("stale", 1).unwrap().try_acquire(TIMEOUT)),
        |con| live_entries(con, "test:waiters:{%semaphore:stale}"),
    );
}

#[test]
fn a_writer_that_gives_up_while_redis_is_stopped_leaves_no_entry_behind() {
    gives_up_while_stopped(
        |holder| Box::new(holder.read_lock("stale").unwrap()),
        |waiter| describe(waiter.try_write_lock("stale", TIMEOUT)),
        |con| live_entries(con, "test:waiters:{%rwlock:stale}"),
    );
}

/// The same for a plain lock, whose waiter leaves it to the background thread.
#[test]
fn a_lock_waiter_that_gives_up_while_redis_is_stopped_leaves_no_entry_behind() {
    gives_up_while_stopped(
        |holder| Box::new(holder.lock("stale").unwrap()),
        |waiter| describe(waiter.try_lock("stale", TIMEOUT)),
        |con| live_entries(con, "test:waiters:{stale}"),
    );
}
