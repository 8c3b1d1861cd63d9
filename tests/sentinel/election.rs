//! An election through Sentinel: a leader and an observer ride a failover; the observer then
//! reports the leader the new master knows, and epochs keep rising.

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
fn an_election_and_its_observer_ride_a_failover() {
    let set = SentinelSet::start(1);
    let election = client(&set).election("scheduler").unwrap();
    let observer = client(&set)
        .election("scheduler")
        .unwrap()
        .observe()
        .unwrap();
    let patience = Duration::from_secs(30);
    let first = observer.changes().recv_timeout(patience).unwrap();
    assert_eq!(first, None);

    let a = election.campaign("a").unwrap();
    let seen = observer.changes().recv_timeout(patience).unwrap().unwrap();
    assert_eq!((seen.value(), seen.epoch()), ("a", a.epoch()));
    let epoch = a.epoch();
    set.failover();
    // The leadership's record replicated with it, or the failover lost both: either way,
    // campaign again (resigning what is left) and lead with a higher epoch.
    drop(a);
    let b = client(&set)
        .election("scheduler")
        .unwrap()
        .try_campaign("b", Duration::from_secs(30))
        .unwrap()
        .expect("a leader after the failover");
    assert!(b.epoch() > epoch, "{} after {epoch}", b.epoch());
    // The observer follows the master and reports b (perhaps after "nobody"), never a as
    // current again.
    let now = (0..4)
        .find_map(|_| {
            let change = observer.changes().recv_timeout(patience).unwrap();
            assert!(change
                .as_ref()
                .is_none_or(|l| l.value() != "a" || l.epoch() == epoch));
            change.filter(|l| l.value() == "b")
        })
        .expect("b reported");
    assert_eq!(now.epoch(), b.epoch());
    assert_eq!(election.leader().unwrap(), Some(now));
}
