//! Waiting without polling, in arrival order across clients: a release hands its permit to the
//! waiter that came first, at once; status counts the holders and the waiting clients.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{lock_client, ms, poll_until, RedisServer};

fn await_waiters(semaphore: &fencelock::Semaphore, n: u64) {
    poll_until(Duration::from_secs(10), ms(5), || {
        let status = semaphore.status().map_err(|e| e.to_string())?;
        if status.waiters == n {
            Ok(())
        } else {
            Err(format!("{} waiting, not {n}", status.waiters))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn releases_hand_permits_to_waiting_clients_in_arrival_order_at_once() {
    let server = RedisServer::start();
    // Long leases: a waiter asks again by itself only after 5 s, so a grant within that comes
    // from a handoff.
    let holder = lock_client(&server, 30_000);
    let pool = holder.semaphore("queue", 2).unwrap();
    let first = pool.acquire().unwrap();
    let second = pool.acquire().unwrap();
    let (granted_tx, granted) = mpsc::channel();
    let mut waiters = Vec::new();
    for i in 0..4u64 {
        let client = lock_client(&server, 30_000);
        let tx = granted_tx.clone();
        let semaphore = client.semaphore("queue", 2).unwrap();
        waiters.push(thread::spawn(move || {
            let permit = semaphore.acquire().unwrap();
            tx.send((i, Instant::now(), permit.token().as_u64()))
                .unwrap();
            // Held until told: the test hands each on by hand.
            permit
        }));
        await_waiters(&pool, i + 1);
    }
    let status = pool.status().unwrap();
    assert_eq!((status.held, status.waiters, status.permits), (2, 4, 2));

    let mut order = Vec::new();
    let mut permits = Vec::new();
    for release in [first, second] {
        let released = Instant::now();
        release.release().unwrap();
        let (i, at, token) = granted.recv_timeout(Duration::from_secs(10)).unwrap();
        let took = at - released;
        assert!(
            took < ms(2_500),
            "waiter {i} got the permit {took:?} after the release"
        );
        order.push((i, token));
    }
    // Two held by the waiters now; they release in turn to the other two.
    for handle in waiters.drain(..2) {
        permits.push(handle.join().unwrap());
    }
    await_waiters(&pool, 2);
    for permit in permits.drain(..) {
        let released = Instant::now();
        permit.release().unwrap();
        let (i, at, token) = granted.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(at - released < ms(2_500), "waiter {i}: {:?}", at - released);
        order.push((i, token));
    }
    let arrival: Vec<u64> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(arrival, vec![0, 1, 2, 3], "granted out of arrival order");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens not rising in grant order: {order:?}"
    );
    for handle in waiters {
        handle.join().unwrap().release().unwrap();
    }
    let status = pool.status().unwrap();
    assert_eq!((status.held, status.waiters), (0, 0));
}

#[test]
fn threads_of_one_client_all_get_permits_freed_at_once() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let waiting = lock_client(&server, 30_000);
    let pool = holder.semaphore("burst", 3).unwrap();
    let held: Vec<_> = (0..3).map(|_| pool.acquire().unwrap()).collect();
    let (tx, granted) = mpsc::channel();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let semaphore = waiting.semaphore("burst", 3).unwrap();
            let tx = tx.clone();
            thread::spawn(move || {
                let permit = semaphore.acquire().unwrap();
                tx.send(()).unwrap();
                permit
            })
        })
        .collect();
    await_waiters(&pool, 1);
    let released = Instant::now();
    for permit in held {
        permit.release().unwrap();
    }
    for _ in 0..3 {
        granted.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    assert!(released.elapsed() < ms(2_500), "{:?}", released.elapsed());
    let permits: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(pool.status().unwrap().held, 3);
    drop(permits);
}

#[test]
fn a_free_permit_owed_to_an_earlier_waiter_is_not_taken_by_a_newcomer() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let pool = client.semaphore("owed", 1).unwrap();
    drop(pool.acquire().unwrap());
    // A waiter of another client stands in the queue, live for a minute, while the permit is
    // free: as after a holder's lease ran out, before that waiter asked again.
    let mut con = server.connection();
    let now: (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let expiry = now.0 * 1000 + now.1 / 1000 + 60_000;
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg("test:queue:{%semaphore:owed}")
        .arg("other:1")
        .ignore()
        .cmd("HSET")
        .arg("test:waiters:{%semaphore:owed}")
        .arg("other:1")
        .arg(format!("{expiry} 5000"))
        .ignore()
        .query(&mut con)
        .unwrap();
    let status = pool.status().unwrap();
    assert_eq!((status.held, status.waiters), (0, 1));
    assert!(
        pool.try_acquire(Duration::ZERO).unwrap().is_none(),
        "a newcomer took the permit owed to the waiter before it"
    );
    // That waiter gone (its entry run out), the permit is anyone's.
    let _: () = redis::cmd("HDEL")
        .arg("test:waiters:{%semaphore:owed}")
        .arg("other:1")
        .query(&mut con)
        .unwrap();
    assert!(pool.try_acquire(Duration::ZERO).unwrap().is_some());
}
