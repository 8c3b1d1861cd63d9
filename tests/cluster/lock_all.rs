//! `lock_all` on a Redis Cluster, over keys that live on different masters: all or none, a
//! timeout leaves nothing locked on any node, unlock frees every node, and overlapping sets
//! named in random orders do not deadlock.

use std::time::Duration;

use fencelock::{LockClient, Topology};

use crate::support::cluster::ClusterSet;
use crate::support::ms;
use crate::support::sets::{run_random_sets, Rounds};

const NAMESPACE: &str = "sets";

fn client(set: &ClusterSet) -> LockClient {
    LockClient::builder(Topology::cluster(set.seed_urls()))
        .namespace(NAMESPACE)
        .lease(ms(2000))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

fn lock_key(key: &str) -> String {
    format!("{NAMESPACE}:lock:{{{key}}}")
}

/// The slot of `key`'s lock key, as `CLUSTER KEYSLOT` on node 0 computes it.
fn keyslot(set: &ClusterSet, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(lock_key(key))
        .query(&mut set.connection(0))
        .unwrap()
}

/// Whether `key` is locked on the master that serves it.
fn locked_on_its_master(set: &ClusterSet, key: &str) -> bool {
    let master = set.master_of_slot(keyslot(set, key));
    redis::cmd("EXISTS")
        .arg(lock_key(key))
        .query(&mut set.connection(set.index_of_port(master)))
        .unwrap()
}

const KEYS: [&str; 6] = ["s:0", "s:1", "s:2", "s:3", "s:4", "s:5"];

#[test]
fn sets_over_keys_on_different_masters() {
    let set = ClusterSet::start(3, 0);
    // Three keys whose slots differ, served by three different masters.
    let mut spread: Vec<&str> = Vec::new();
    let mut masters = Vec::new();
    for key in KEYS {
        let master = set.master_of_slot(keyslot(&set, key));
        if !masters.contains(&master) {
            masters.push(master);
            spread.push(key);
        }
    }
    assert_eq!(
        spread.len(),
        3,
        "the keys {KEYS:?} span fewer than 3 masters"
    );
    let slots: Vec<u16> = spread.iter().map(|key| keyslot(&set, key)).collect();
    assert!(
        slots[0] != slots[1] && slots[1] != slots[2] && slots[0] != slots[2],
        "{slots:?}"
    );
    assert_eq!(
        slots,
        spread
            .iter()
            .map(|key| ClusterSet::slot_of(&lock_key(key)))
            .collect::<Vec<_>>()
    );
    let (a, b) = (client(&set), client(&set));

    // All or none: with the middle key held, a set that times out leaves none of the others.
    let held = a.lock(spread[1]).unwrap();
    let reversed: Vec<&str> = spread.iter().rev().copied().collect();
    for timeout in [ms(300), Duration::ZERO] {
        assert!(b.try_lock_all(&reversed, timeout).unwrap().is_none());
        for key in [spread[0], spread[2]] {
            assert!(!locked_on_its_master(&set, key), "{key} after {timeout:?}");
        }
    }
    held.unlock().unwrap();

    let all = b.lock_all(&reversed).unwrap();
    assert!(all.is_held());
    for key in &spread {
        assert!(locked_on_its_master(&set, key), "{key}");
        assert!(a.try_lock(key, Duration::ZERO).unwrap().is_none());
    }
    let tokens: Vec<u64> = spread
        .iter()
        .map(|key| all.token(key).unwrap().as_u64())
        .collect();
    all.unlock().unwrap();
    for key in &spread {
        assert!(!locked_on_its_master(&set, key), "{key}");
    }
    // Each key's next token is above the set's.
    let again = a.lock_all(&spread).unwrap();
    for (key, token) in spread.iter().zip(tokens) {
        assert!(again.token(key).unwrap().as_u64() > token, "{key}");
    }
    drop(again);
    for key in &spread {
        assert!(!locked_on_its_master(&set, key), "{key}");
    }

    // Overlapping sets across the masters, in random orders, from two clients.
    let Rounds(rounds) = run_random_sets(
        &[a, b],
        4,
        &KEYS,
        3,
        Duration::from_secs(2),
        1_000,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", set.logs()));
    assert!(rounds.iter().all(|&n| n > 0), "{rounds:?}");
    eprintln!("sets taken by each thread: {rounds:?}");
}
