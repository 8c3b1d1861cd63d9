//! On a Redis Cluster a release hands the lock to another client's waiter with `SPUBLISH` on a
//! channel in the key's own slot, heard only by that slot's shard, rather than with a `PUBLISH`
//! that every node relays. The waiting client subscribes on the key's master, and follows the
//! slot when it moves: by migration, or by a failover. Real `redis-server --cluster-enabled yes`
//! processes throughout.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::support::cluster::ClusterSet;
use crate::support::wake::{
    all_channels, await_queued, await_subscription_of, client, lock_key, subscribed_on, UNHEARD,
};
use crate::support::{command_calls, ms, poll_until};

/// Waits until the waiter's subscription for `key` stands on the master at `port`, and on no
/// other node.
fn await_subscription(set: &ClusterSet, key: &str, port: u16, within: Duration) {
    let found = poll_until(within, ms(20), || {
        let alone = set
            .node_ports()
            .into_iter()
            .all(|p| subscribed_on(set, key, p) == (p == port));
        if alone {
            Ok(())
        } else {
            Err(all_channels(set))
        }
    });
    if let Err(channels) = found {
        panic!("no subscription for {key:?} on {port} alone within {within:?}: {channels}");
    }
}

/// `waiter` blocks on `key` in a thread: joined, the moment it got the lock and its token.
fn wait_for(waiter: &LockClient, key: &str) -> thread::JoinHandle<(Instant, u64)> {
    let (waiter, key) = (waiter.clone(), key.to_owned());
    thread::spawn(move || {
        let guard = waiter
            .try_lock(&key, Duration::from_secs(20))
            .unwrap()
            .expect("the waiter never got the lock");
        let at = Instant::now();
        let token = guard.token().as_u64();
        guard.unlock().unwrap();
        (at, token)
    })
}

#[test]
fn a_handoff_between_clients_is_published_in_the_keys_shard_only() {
    let set = ClusterSet::start(3, 0);
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    let key = "shard";
    let master = set.master_of_slot(ClusterSet::slot_of(&lock_key(key)));
    let classic_before: u64 = (0..3)
        .map(|i| command_calls(&mut set.connection(i), "publish"))
        .sum();
    let rounds = 20;
    let mut slowest = Duration::ZERO;
    for round in 0..rounds {
        let guard = holder.lock(key).unwrap();
        let blocked = wait_for(&waiter, key);
        if round == 0 {
            // The first wait subscribes; later ones find the subscription standing.
            await_subscription(&set, key, master, Duration::from_secs(5));
        } else {
            await_queued(&set, key, 1, Duration::from_secs(10));
        }
        let first = guard.token();
        let released = Instant::now();
        guard.unlock().unwrap();
        let (at, token) = blocked.join().unwrap();
        assert!(token > first.as_u64());
        eprintln!("round {round}: woken {:?} after the release", at - released);
        slowest = slowest.max(at - released);
    }
    assert!(
        slowest < UNHEARD / 2,
        "a waiter was woken {slowest:?} after a release: it did not hear it"
    );
    let mut con = set.connection(set.index_of_port(master));
    let sharded = command_calls(&mut con, "spublish");
    assert!(
        sharded >= rounds,
        "{sharded} handoffs published on the key's shard in {rounds} rounds"
    );
    let classic: u64 = (0..3)
        .map(|i| command_calls(&mut set.connection(i), "publish"))
        .sum();
    assert_eq!(
        classic - classic_before,
        0,
        "handoffs published classically, to every node"
    );
}

/// A waiter of another client waits on `key` while `shift` moves the key's slot off its master
/// (given the old master, it returns the new one): the waiter's subscription follows, well
/// before the waiter's next attempt (by which it would learn of the move otherwise), and the
/// release wakes it.
fn follows(set: &ClusterSet, key: &str, what: &str, shift: impl FnOnce(u16) -> u16) {
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    let old = set.master_of_slot(ClusterSet::slot_of(&lock_key(key)));
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for(&waiter, key);
    await_subscription(set, key, old, Duration::from_secs(5));
    let new = shift(old);
    let shifted = Instant::now();
    await_subscription(set, key, new, UNHEARD / 2);
    eprintln!(
        "subscribed on the new master {:?} after the {what}",
        shifted.elapsed()
    );
    let first = guard.token();
    let released = Instant::now();
    guard.unlock().unwrap();
    let (at, token) = blocked.join().unwrap();
    assert!(token > first.as_u64());
    let waited = at - released;
    assert!(waited < UNHEARD / 2, "woken {waited:?} after the release");
}

#[test]
fn a_waiters_subscription_follows_its_slot_to_another_master() {
    let set = ClusterSet::start(3, 0);
    let key = "moving";
    let slot = ClusterSet::slot_of(&lock_key(key));
    follows(&set, key, "migration", |from| {
        let to = set.master_ports().into_iter().find(|p| *p != from).unwrap();
        // The held lock moves with its slot; the source drops the subscription as it goes.
        set.begin_migration(slot, to);
        set.migrate_rest(slot);
        set.finish_migration(slot);
        to
    });
}

#[test]
fn a_waiters_subscription_follows_a_failover_of_its_master() {
    let set = ClusterSet::start(3, 1);
    follows(&set, "failing", "failover", |old| {
        // A coordinated failover: the lock is on the replica before it takes over.
        let new = set.replica_of(old);
        set.failover(new);
        new
    });
}

#[test]
fn a_key_new_to_a_masters_listener_is_subscribed_at_once() {
    let set = ClusterSet::start(3, 0);
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    let first = "first";
    let master = set.master_of_slot(ClusterSet::slot_of(&lock_key(first)));
    let _held = holder.lock(first).unwrap();
    let _blocked = wait_for(&waiter, first);
    await_subscription(&set, first, master, Duration::from_secs(5));
    // The master's listener now waits for messages only, a second at a time; each new key must
    // not wait for that second (a message on its channel wakes it).
    let keys: Vec<String> = (0..200)
        .map(|i| format!("next{i}"))
        .filter(|k| set.master_of_slot(ClusterSet::slot_of(&lock_key(k))) == master)
        .take(5)
        .collect();
    assert_eq!(keys.len(), 5);
    let mut guards = Vec::new();
    let mut waiting = Vec::new();
    for key in &keys {
        thread::sleep(ms(1200));
        guards.push(holder.lock(key).unwrap());
        let asked = Instant::now();
        waiting.push(wait_for(&waiter, key));
        await_subscription_of(&set, key, master, ms(400));
        eprintln!(
            "{key:?} subscribed {:?} after its waiter started",
            asked.elapsed()
        );
    }
    drop(guards);
    for blocked in waiting {
        blocked.join().unwrap();
    }
}
