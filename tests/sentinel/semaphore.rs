//! Counting semaphores on Sentinel: permits held across a failover stay held and counted on the
//! new master, and the tokens granted after it are larger.

use std::time::Duration;

use fencelock::{LockClient, Topology};

use crate::support::ms;
use crate::support::sentinel::{SentinelSet, MASTER_NAME};

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
