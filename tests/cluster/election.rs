//! Elections on a Redis Cluster: elections whose slots live on different masters, observers
//! that hear them through whichever node they subscribed on, and a failover of an election's
//! master.

use std::time::Duration;

use fencelock::{LockClient, Topology};

use crate::support::cluster::ClusterSet;
use crate::support::ms;

fn client(set: &ClusterSet) -> LockClient {
    LockClient::builder(Topology::cluster(set.seed_urls()))
        .namespace("elect")
        .lease(ms(3000))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn elections_on_every_master_are_observed_and_ride_a_failover() {
    let set = ClusterSet::start(3, 1);
    let names: Vec<String> = (0..6).map(|i| format!("job-{i}")).collect();
    // Names whose slots lie on at least two different masters.
    let masters: std::collections::BTreeSet<u16> = names
        .iter()
        .map(|n| set.master_of_slot(ClusterSet::slot_of(&format!("%election:{n}"))))
        .collect();
    assert!(masters.len() >= 2, "{masters:?}");

    let leaders = client(&set);
    let observers = client(&set);
    for name in &names {
        let observer = observers.election(name).unwrap().observe().unwrap();
        assert_eq!(observer.changes().recv_timeout(PATIENCE).unwrap(), None);
        let leadership = leaders.election(name).unwrap().campaign("x").unwrap();
        let seen = observer.changes().recv_timeout(PATIENCE).unwrap().unwrap();
        assert_eq!((seen.value(), seen.epoch()), ("x", leadership.epoch()));
        leadership.proclaim("y").unwrap();
        assert_eq!(
            observer
                .changes()
                .recv_timeout(PATIENCE)
                .unwrap()
                .unwrap()
                .value(),
            "y"
        );
        leadership.resign().unwrap();
        assert_eq!(observer.changes().recv_timeout(PATIENCE).unwrap(), None);
    }

    // A failover of the master that serves one election: a new campaign leads with a higher
    // epoch, and its observer hears it.
    let name = &names[0];
    let slot = ClusterSet::slot_of(&format!("%election:{name}"));
    let before = leaders.election(name).unwrap().campaign("before").unwrap();
    let epoch = before.epoch();
    let observer = observers.election(name).unwrap().observe().unwrap();
    assert_eq!(
        observer
            .changes()
            .recv_timeout(PATIENCE)
            .unwrap()
            .unwrap()
            .epoch(),
        epoch
    );
    let master = set.master_of_slot(slot);
    set.failover(set.replica_of(master));
    set.wait_for_owner_change(slot, master, PATIENCE);
    drop(before);
    let after = leaders
        .election(name)
        .unwrap()
        .try_campaign("after", PATIENCE)
        .unwrap()
        .expect("a leader after the failover");
    assert!(after.epoch() > epoch);
    let now = (0..4)
        .find_map(|_| {
            observer
                .changes()
                .recv_timeout(PATIENCE)
                .unwrap()
                .filter(|l| l.value() == "after")
        })
        .expect("the new leader reported");
    assert_eq!(now.epoch(), after.epoch());
}
