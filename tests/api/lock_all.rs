//! `lock_all` on one server: a set is held all or none, each key with its own rising token;
//! overlapping sets named in any order never deadlock; a set that times out leaves nothing
//! locked in Redis; losing one key loses the set; extend lengthens every key's lease, and loses
//! the set if a key is gone; unlock and drop release every key.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::crossbeam_channel::RecvTimeoutError;
use fencelock::{LockClient, LockOptions};

use crate::support::sets::{run_random_sets, Rounds};
use crate::support::{
    fence_key, lock_client, lock_exists, lock_key, lock_pttl, ms, poll_until, queue_len,
    RedisServer,
};

/// The keys of `keys` that are locked in Redis now.
fn locked(con: &mut redis::Connection, keys: &[&str]) -> Vec<String> {
    keys.iter()
        .filter(|key| lock_exists(con, key))
        .map(|key| (*key).to_owned())
        .collect()
}

fn counter(con: &mut redis::Connection, key: &str) -> u64 {
    let raw: String = redis::cmd("GET").arg(fence_key(key)).query(con).unwrap();
    raw.parse().unwrap()
}

#[test]
fn a_set_is_held_all_or_none() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let setter = lock_client(&server, 30_000);
    let mut con = server.connection();
    let keys = ["acct:3", "acct:1", "acct:7"];

    let one = holder.lock("acct:1").unwrap();
    assert!(setter.try_lock_all(&keys, ms(200)).unwrap().is_none());
    assert_eq!(locked(&mut con, &keys), ["acct:1"]);

    one.unlock().unwrap();
    let set = setter.lock_all(&keys).unwrap();
    assert!(set.is_held());
    assert_eq!(locked(&mut con, &keys).len(), 3);
    // Taken in one order, whatever order they were named in.
    assert_eq!(
        set.keys().collect::<Vec<_>>(),
        ["acct:1", "acct:3", "acct:7"]
    );
    // Nobody else gets one of them while the set is held.
    for key in keys {
        assert!(holder.try_lock(key, Duration::ZERO).unwrap().is_none());
    }
    set.unlock().unwrap();
}

#[test]
fn each_key_has_its_own_token_and_tokens_rise_per_key() {
    let server = RedisServer::start();
    let clients = [lock_client(&server, 30_000), lock_client(&server, 30_000)];
    let mut con = server.connection();
    let mut last = [0_u64; 2];
    for round in 0..6 {
        let client = &clients[round % 2];
        let names = if round % 3 == 0 {
            ["t:b", "t:a"]
        } else {
            ["t:a", "t:b"]
        };
        let set = client.lock_all(&names).unwrap();
        for (i, key) in ["t:a", "t:b"].into_iter().enumerate() {
            let token = set.token(key).unwrap().as_u64();
            // The token is the key's own counter, and above every earlier grant of the key.
            assert_eq!(token, counter(&mut con, key), "round {round}, {key}");
            assert!(
                token > last[i],
                "round {round}, {key}: {token} after {}",
                last[i]
            );
            last[i] = token;
        }
        if round % 2 == 0 {
            set.unlock().unwrap();
        } else {
            drop(set);
        }
    }
    // A plain lock of one of the keys continues the same sequence.
    let guard = clients[0].lock("t:a").unwrap();
    assert!(guard.token().as_u64() > last[0]);
}

/// 8 threads in 4 clients take random sets of 2 to 4 of 6 keys, each named in a random order,
/// for about 3 s (at most 2000 sets each). A deadlock stops every thread it catches for good, so
/// the run gives the threads 30 s past its end, then cancels their waits and fails.
#[test]
fn overlapping_sets_in_random_orders_never_deadlock() {
    const KEYS: [&str; 6] = ["d:0", "d:1", "d:2", "d:3", "d:4", "d:5"];
    let server = RedisServer::start();
    let clients: Vec<LockClient> = (0..4).map(|_| lock_client(&server, 2_000)).collect();
    let Rounds(rounds) = run_random_sets(
        &clients,
        8,
        &KEYS,
        4,
        Duration::from_secs(3),
        2_000,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Every thread got its sets: none was starved.
    assert!(rounds.iter().all(|&n| n > 0), "{rounds:?}");
    eprintln!("sets taken by each thread: {rounds:?}");
    let mut con = server.connection();
    assert!(locked(&mut con, &KEYS).is_empty());
}

/// A set that cannot be had whole within its timeout leaves nothing behind: the keys it took
/// before the held one are free in Redis when `try_lock_all` returns, and the keys after it were
/// never taken; with a zero timeout too.
#[test]
fn a_set_that_times_out_leaves_nothing_locked() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let setter = lock_client(&server, 30_000);
    let mut con = server.connection();
    let keys = ["p:4", "p:3", "p:2", "p:1"];
    let held = holder.lock("p:3").unwrap();

    for timeout in [ms(300), Duration::ZERO] {
        let started = Instant::now();
        assert!(setter.try_lock_all(&keys, timeout).unwrap().is_none());
        let took = started.elapsed();
        assert!(took < timeout + ms(1_000), "{took:?} for {timeout:?}");
        // Checked as soon as the call returns: p:1 and p:2 were taken, and released before it.
        assert_eq!(
            locked(&mut con, &keys),
            ["p:3"],
            "after a {timeout:?} timeout"
        );
    }
    // The waiter left the held key's queue too (in the background if Redis was slow to answer).
    poll_until(Duration::from_secs(5), ms(10), || {
        match queue_len(&mut con, "p:3") {
            0 => Ok(()),
            n => Err(format!("{n} waiters")),
        }
    })
    .unwrap();
    // The keys it released are anyone's at once.
    for key in ["p:1", "p:2", "p:4"] {
        assert!(holder.try_lock(key, Duration::ZERO).unwrap().is_some());
    }
    drop(held);
}

#[test]
fn losing_one_key_loses_the_set_and_fires_lost_once() {
    let server = RedisServer::start();
    let client = lock_client(&server, 600);
    let operator = lock_client(&server, 30_000);
    let set = client.lock_all(&["l:a", "l:b", "l:c"]).unwrap();
    let lost = set.lost().clone();
    assert_eq!(lost.recv_timeout(ms(500)), Err(RecvTimeoutError::Timeout));
    assert!(set.is_held(), "renewal keeps every key");

    assert!(operator.force_unlock("l:b").unwrap());
    // Renewal runs about every lease / 3 (200 ms) and finds l:b gone.
    assert_eq!(lost.recv_timeout(ms(3_000)), Ok(()));
    assert!(!set.is_held());
    assert!(operator.force_unlock("l:c").unwrap());
    // Once: after its one message the channel disconnects, however many keys go.
    assert_eq!(
        lost.recv_timeout(ms(3_000)),
        Err(RecvTimeoutError::Disconnected)
    );
    let e = set.unlock().unwrap_err();
    assert!(e.is_lock_lost(), "{e:?}");
    let mut con = server.connection();
    assert!(locked(&mut con, &["l:a", "l:b", "l:c"]).is_empty());
}

/// Without renewal, a set's keys would expire with their 1 s lease; `extend` re-arms every one
/// of them in Redis, and the set stays held past the lease it was taken with.
#[test]
fn extend_lengthens_every_keys_lease() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let keys = ["e:3", "e:1", "e:2"];
    let options = LockOptions::new().lease(ms(1_000)).renew(false);
    let set = client.lock_all_with(&keys, &options).unwrap();
    for key in keys {
        let left = lock_pttl(&mut con, key);
        assert!(0 < left && left <= 1_000, "{key}: pttl {left} before");
    }
    let e = set.extend(ms(1)).unwrap_err();
    assert!(e.is_invalid_argument(), "{e:?}");

    set.extend(ms(60_000)).unwrap();
    for key in keys {
        let left = lock_pttl(&mut con, key);
        assert!(left > 50_000, "{key}: pttl {left} after the extend");
    }
    // Past the lease the set was taken with: held, here and in Redis.
    thread::sleep(ms(1_500));
    assert!(set.is_held());
    assert_eq!(locked(&mut con, &keys).len(), 3);
    set.unlock().unwrap();
    assert!(locked(&mut con, &keys).is_empty());
}

/// A key of the set deleted behind the holder's back (renewal, 10 s away, has not noticed):
/// the set's extend reports that key lost, and the whole set is lost with it: not held, and
/// `lost()` fires. The key taken before it was extended, the one after it was not asked.
#[test]
fn extend_of_a_set_with_a_key_gone_reports_it_lost_and_loses_the_set() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let keys = ["g:a", "g:b", "g:c"];
    let set = client.lock_all(&keys).unwrap();
    let lost = set.lost().clone();
    let deleted: u32 = redis::cmd("DEL")
        .arg(lock_key("g:b"))
        .query(&mut con)
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(set.is_held(), "nothing has told the set yet");

    let e = set.extend(ms(60_000)).unwrap_err();
    assert!(
        matches!(&e, fencelock::Error::LockLost { key } if key == "g:b"),
        "{e:?}"
    );
    assert!(!set.is_held(), "a set with a key gone still says held");
    assert_eq!(lost.recv_timeout(ms(1_000)), Ok(()), "lost() did not fire");
    assert!(lock_pttl(&mut con, "g:a") > 50_000);
    assert!(lock_pttl(&mut con, "g:c") <= 30_000);
    // Known lost: a second extend fails the same way.
    assert!(set.extend(ms(60_000)).unwrap_err().is_lock_lost());
    // The release frees the keys that were still ours.
    let e = set.unlock().unwrap_err();
    assert!(e.is_lock_lost(), "{e:?}");
    assert!(locked(&mut con, &keys).is_empty());
}

#[test]
fn drop_releases_every_key() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let keys = ["r:1", "r:2", "r:3"];
    let set = client.lock_all(&keys).unwrap();
    assert_eq!(locked(&mut con, &keys).len(), 3);
    drop(set);
    assert!(locked(&mut con, &keys).is_empty());
}

#[test]
fn unlock_releases_every_key() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let other = lock_client(&server, 30_000);
    let mut con = server.connection();
    let keys = ["u:1", "u:2", "u:3"];
    let set = client.lock_all(&keys).unwrap();
    set.unlock().unwrap();
    assert!(locked(&mut con, &keys).is_empty());
    let again = other.try_lock_all(&keys, Duration::ZERO).unwrap();
    assert!(again.is_some_and(|set| set.is_held()));
}

/// A set waits in each key's queue, so callers of a single key who come after it do not keep
/// it waiting: here two threads of another client take turns on `f:2` without a break, and the
/// set, queued at `f:2` behind the one holding it, gets it within a few of their turns.
#[test]
fn a_set_is_not_starved_by_callers_of_single_keys() {
    let server = RedisServer::start();
    let singles = lock_client(&server, 30_000);
    let setter = lock_client(&server, 30_000);
    let mut con = server.connection();
    let stop = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicU64::new(0));
    let hammers: Vec<_> = (0..2)
        .map(|_| {
            let (client, stop, turns) = (singles.clone(), Arc::clone(&stop), Arc::clone(&turns));
            thread::spawn(move || {
                // Bounded: stops when told, or after 20 s.
                let until = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    let guard = client.lock("f:2").unwrap();
                    turns.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(ms(5));
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    poll_until(Duration::from_secs(10), ms(5), || {
        match turns.load(Ordering::Relaxed) {
            n if n >= 10 => Ok(()),
            n => Err(format!("{n} turns")),
        }
    })
    .unwrap();
    let before = turns.load(Ordering::Relaxed);
    let set = setter
        .try_lock_all(&["f:1", "f:2", "f:3"], Duration::from_secs(10))
        .unwrap();
    let waited_turns = turns.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let set = set.expect("the set was starved for 10 s");
    // The other client's threads go ahead of the set's client at most 8 times in a row once the
    // set is queued in Redis; a few more turns may pass before it gets there.
    eprintln!("the set waited {waited_turns} turns of the single-key callers");
    assert!(waited_turns <= 16, "the set waited {waited_turns} turns");
    set.unlock().unwrap();
    for hammer in hammers {
        hammer.join().unwrap();
    }
    assert!(locked(&mut con, &["f:1", "f:2", "f:3"]).is_empty());
}

#[test]
fn a_set_of_duplicates_locks_each_key_once() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let set = client.lock_all(&["same", "same"]).unwrap();
    assert_eq!(set.keys().collect::<HashSet<_>>().len(), 1);
    assert_eq!(locked(&mut con, &["same"]), ["same"]);
    set.unlock().unwrap();
    assert!(!lock_exists(&mut con, "same"));
}
