//! Counting semaphores on Sentinel and replication: permits held across a failover stay held
//! and counted on the new master, and the tokens granted after it are larger; with replica
//! acknowledgement, a permit no replica acknowledged is never reported held.

use std::thread;
use std::time::Duration;

use fencelock::{LockClient, Topology};

use crate::support::proxy::{Mode, Proxy};
use crate::support::sentinel::{SentinelSet, MASTER_NAME};
use crate::support::{ms, poll_until, RedisServer, NAMESPACE};

fn client(set: &SentinelSet) -> LockClient {
    LockClient::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .namespace("sentinel")
        .lease(ms(3000))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

#[test]
fn permits_held_across_a_failover_stay_held_and_counted() {
    let set = SentinelSet::start(1);
    let (a, b) = (client(&set), client(&set));
    let mine = a.semaphore("jobs", 2).unwrap();
    let theirs = b.semaphore("jobs", 2).unwrap();
    let first = mine.acquire().unwrap();
    let second = theirs.acquire().unwrap();
    let before = first.token().max(second.token());

    let old = set.master_port();
    let new = set.failover();
    assert_ne!(old, new);
    // Renewal follows the master: after a lease's worth on the new one, both still hold, and
    // the new master counts them.
    let renewed = theirs.try_acquire(ms(3500)).unwrap();
    assert!(
        renewed.is_none(),
        "a third permit of two after the failover"
    );
    assert!(first.is_held() && second.is_held());
    let status = theirs.status().unwrap();
    assert_eq!((status.held, status.permits), (2, 2));

    first.release().unwrap();
    let third = theirs
        .try_acquire(Duration::from_secs(5))
        .unwrap()
        .expect("the released permit");
    assert!(third.token() > before);
    drop((second, third));
    assert_eq!(mine.status().unwrap().held, 0);
}

/// A master and a replica that replicates it through a fault proxy.
fn pair() -> (RedisServer, Proxy, RedisServer) {
    let master = RedisServer::start();
    let link = Proxy::start(master.port());
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &link.port().to_string(),
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let mut con = master.connection();
    poll_until(Duration::from_secs(10), ms(50), || {
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(200)
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        if acked >= 1 {
            Ok(())
        } else {
            Err("the replica never caught up".to_owned())
        }
    })
    .unwrap();
    (master, link, replica)
}

#[test]
fn with_replica_acks_an_unreplicated_permit_is_never_reported_held() {
    let (master, link, _replica) = pair();
    let client = LockClient::builder(master.url())
        .namespace(NAMESPACE)
        .lease(ms(30_000))
        .min_replica_acks(1, ms(1_000))
        .build()
        .unwrap();
    let pool = client.semaphore("acked", 2).unwrap();
    let permit = pool.acquire().unwrap();
    assert!(permit.is_held());
    permit.release().unwrap();

    link.set_mode(Mode::Blackhole);
    let err = pool.try_acquire(Duration::ZERO).unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    let err = pool.acquire().unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    // The unacknowledged grants were given back, not left to expire.
    let status = pool.status().unwrap();
    assert_eq!((status.held, status.waiters), (0, 0));
}

/// A permit handed over by a release was written by the releaser on another connection; the
/// waiter's replica check covers it all the same.
#[test]
fn with_replica_acks_an_unreplicated_handoff_is_never_reported_held() {
    let (master, link, _replica) = pair();
    let holder = LockClient::builder(master.url())
        .namespace(NAMESPACE)
        .lease(ms(30_000))
        .build()
        .unwrap();
    let waiter = LockClient::builder(master.url())
        .namespace(NAMESPACE)
        .lease(ms(30_000))
        .min_replica_acks(1, ms(1_000))
        .build()
        .unwrap();
    let held = holder.semaphore("handed", 1).unwrap().acquire().unwrap();
    let pool = waiter.semaphore("handed", 1).unwrap();
    let waiting = {
        let pool = pool.clone();
        thread::spawn(move || pool.acquire().map(|p| p.token()))
    };
    poll_until(Duration::from_secs(10), ms(5), || {
        match pool.status().map_err(|e| e.to_string())?.waiters {
            1 => Ok(()),
            n => Err(format!("{n} waiting")),
        }
    })
    .unwrap();
    link.set_mode(Mode::Blackhole);
    held.release().unwrap();
    let err = waiting.join().unwrap().unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    let status = pool.status().unwrap();
    assert_eq!((status.held, status.waiters), (0, 0));
}
