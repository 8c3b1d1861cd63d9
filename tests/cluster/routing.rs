//! A client pointed at a Redis Cluster sends each lock to the master of its slot, follows
//! redirects, and keeps granting exclusively, with rising tokens, through failovers and slot
//! migrations. Every set-up is real: `redis-server --cluster-enabled yes` processes.

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient, Topology};

use crate::support;
use crate::support::cluster::ClusterSet;
use crate::support::ms;
use crate::support::workload::Workload;

const NAMESPACE: &str = "cluster";

fn client(seeds: Vec<String>, lease_ms: u64) -> LockClient {
    LockClient::builder(Topology::cluster(seeds))
        .namespace(NAMESPACE)
        .lease(ms(lease_ms))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

/// The lock key of `key` in [`NAMESPACE`], and its fence key: one slot.
fn lock_key(key: &str) -> String {
    format!("{NAMESPACE}:lock:{{{key}}}")
}

fn fence_key(key: &str) -> String {
    format!("{NAMESPACE}:fence:{{{key}}}")
}

/// How many error replies starting with `prefix` (`MOVED`, `ASK`, `TRYAGAIN`) node `i` gave.
fn errors_given(set: &ClusterSet, i: usize, prefix: &str) -> u64 {
    let mut con = set.connection(i);
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut con)
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("errorstat_{prefix}:count=")))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// The workload's keys (`k0`...), by the master that serves each.
fn masters_of(set: &ClusterSet, keys: usize) -> HashSet<u16> {
    (0..keys)
        .map(|i| set.master_of_slot(ClusterSet::slot_of(&lock_key(&format!("k{i}")))))
        .collect()
}

#[test]
fn many_threads_over_keys_on_every_master_from_one_seed() {
    let set = ClusterSet::start(3, 1);
    assert_eq!(masters_of(&set, 12).len(), 3, "the keys span every master");
    // One client knows a single seed; the other every node.
    let one_seed = client(vec![set.seed_urls()[1].clone()], 2000);
    let clients = [one_seed, client(set.seed_urls(), 2000)];
    let workload = Workload::start(&clients, 3, 12);
    workload.await_grants(&[0, 0], 100, Duration::from_secs(30));
    let history = workload.stop();
    let checked = history
        .check()
        .unwrap_or_else(|e| panic!("{e}\n{}", set.logs()));
    assert!(checked >= 200, "{checked}");
    // The locks were taken where they live: every master holds fence keys.
    for port in set.master_ports() {
        let mut con = set.connection(set.index_of_port(port));
        let keys: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        assert!(keys > 0, "master {port} holds no key");
    }

    // A waiter in another client is handed the lock when it is released.
    let guard = clients[0].lock("handoff").unwrap();
    let other = clients[1].clone();
    let waiter = thread::spawn(move || {
        let guard = other.lock("handoff").unwrap();
        guard.token()
    });
    thread::sleep(ms(100));
    let first = guard.token();
    guard.unlock().unwrap();
    assert!(waiter.join().unwrap() > first);

    // A fenced store on the same cluster: writes go to the resource's master.
    let store = FencedRedis::open(Topology::cluster(set.seed_urls())).unwrap();
    let guard = clients[0].lock("doc").unwrap();
    store.set("doc", guard.token(), b"v1").unwrap();
    assert_eq!(store.get("doc").unwrap().as_deref(), Some(&b"v1"[..]));
    let stale = guard.token();
    guard.unlock().unwrap();
    let newer = clients[1].lock("doc").unwrap();
    store.set("doc", newer.token(), b"v2").unwrap();
    assert!(store.set("doc", stale, b"old").is_err());
}

#[test]
fn a_coordinated_failover_and_a_frozen_master_under_load() {
    let set = ClusterSet::start(3, 1);
    let acked = LockClient::builder(Topology::cluster(set.seed_urls()))
        .namespace(NAMESPACE)
        .lease(ms(2000))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .min_replica_acks(1, ms(200))
        .build()
        .unwrap();
    let clients = [acked, client(set.seed_urls(), 2000)];
    // A lock held across the failover of its master: it keeps renewing or is reported lost.
    let long = clients[0].lock("long").unwrap();
    let long_token = long.token();
    let workload = Workload::start(&clients, 3, 12);
    workload.await_grants(&[0, 0], 20, Duration::from_secs(20));

    let slot = ClusterSet::slot_of(&lock_key("long"));
    let old = set.master_of_slot(slot);
    let replica = set.replica_of(old);
    let started = Instant::now();
    set.failover(replica);
    eprintln!("CLUSTER FAILOVER took {:?}", started.elapsed());
    assert_eq!(set.master_of_slot(slot), replica);
    let before = workload.grants();
    workload.await_grants(&before, 20, Duration::from_secs(20));
    // The clients were sent on by the old master, and went.
    assert!(errors_given(&set, set.index_of_port(old), "MOVED") > 0);

    // A master frozen past the node timeout: its replica takes over; on waking it serves none
    // of its old slots.
    let frozen_port = set
        .master_ports()
        .into_iter()
        .find(|p| *p != replica)
        .unwrap();
    let frozen = set.index_of_port(frozen_port);
    let frozen_slot = (0..16384u16)
        .find(|s| set.master_of_slot(*s) == frozen_port)
        .unwrap();
    set.pause(frozen);
    let started = Instant::now();
    let new = set.wait_for_owner_change(frozen_slot, frozen_port, Duration::from_secs(20));
    eprintln!("a frozen master was replaced after {:?}", started.elapsed());
    let before = workload.grants();
    workload.await_grants(&before, 20, Duration::from_secs(20));
    set.resume(frozen);
    set.wait_ok(Duration::from_secs(20));
    let before = workload.grants();
    workload.await_grants(&before, 20, Duration::from_secs(20));
    let history = workload.stop();
    let checked = history
        .check()
        .unwrap_or_else(|e| panic!("{e}\n{}", set.logs()));
    assert!(checked > 60, "{checked}");
    assert_ne!(new, frozen_port);

    match long.lost().try_recv() {
        Ok(_) => assert!(!long.is_held()),
        Err(_) => {
            assert!(long.is_held(), "neither held nor reported lost");
            long.unlock().unwrap();
        }
    }
    // Nobody is locked out after the failover: the other client gets the lock, with a higher
    // token.
    let next = clients[1].try_lock("long", ms(5000)).unwrap().unwrap();
    assert!(next.token() > long_token);
}

#[test]
fn a_slot_migrated_under_load_through_the_split_window() {
    let set = ClusterSet::start(2, 0);
    let clients = [client(set.seed_urls(), 2000), client(set.seed_urls(), 2000)];
    // Every workload key is `k0`..`k5`; move the slot of k0 to the other master.
    let slot = ClusterSet::slot_of(&lock_key("k0"));
    let source = set.master_of_slot(slot);
    let target = set
        .master_ports()
        .into_iter()
        .find(|p| *p != source)
        .unwrap();
    // A lock held across the whole migration, renewing: on another key of the same slot, so
    // that the workload keeps calling on k0.
    let other = (0..1_000_000)
        .map(|n| format!("h{n}"))
        .find(|k| ClusterSet::slot_of(&lock_key(k)) == slot)
        .unwrap();
    let held = clients[0].lock(&other).unwrap();
    let workload = Workload::start(&clients, 3, 6);
    workload.await_grants(&[0, 0], 20, Duration::from_secs(20));

    set.begin_migration(slot, target);
    // The split window: k0's fence key is on the target, its lock key on the source. A call
    // that touches both is refused with TRYAGAIN until the rest follows.
    set.migrate_key(slot, &fence_key("k0"));
    let (src, dst) = (set.index_of_port(source), set.index_of_port(target));
    let tryagain_before = errors_given(&set, src, "TRYAGAIN") + errors_given(&set, dst, "TRYAGAIN");
    support::poll_until(Duration::from_secs(20), ms(20), || {
        match errors_given(&set, src, "TRYAGAIN") + errors_given(&set, dst, "TRYAGAIN") {
            n if n > tryagain_before => Ok(()),
            n => Err(format!("TRYAGAIN given {n} times")),
        }
    })
    .unwrap_or_else(|why| panic!("no call met the split window: {why}"));
    set.migrate_rest(slot);
    // Every key of the slot is on the target, the slot not yet handed over: ASK.
    let before = workload.grants();
    support::poll_until(Duration::from_secs(20), ms(20), || {
        match errors_given(&set, src, "ASK") {
            0 => Err("no ASK given".to_string()),
            _ => Ok(()),
        }
    })
    .unwrap_or_else(|why| panic!("no call was asked over: {why}"));
    set.finish_migration(slot);
    workload.await_grants(&before, 20, Duration::from_secs(20));
    assert_eq!(set.master_of_slot(slot), target);
    let history = workload.stop();
    history
        .check()
        .unwrap_or_else(|e| panic!("{e}\n{}", set.logs()));
    // The calls were refused and sent again: TRYAGAIN while the keys were split, ASK once they
    // had all moved. Once the slot is handed over, a call may meet MOVED, or the client may have
    // learned the move first, from the source dropping a waiter's shard subscription.
    let (source, target) = (set.index_of_port(source), set.index_of_port(target));
    let tryagain = errors_given(&set, source, "TRYAGAIN") + errors_given(&set, target, "TRYAGAIN");
    assert!(tryagain > 0, "no call met the split window");
    assert!(
        errors_given(&set, source, "ASK") > 0,
        "no call was asked over"
    );
    // A migration loses no lock: the one held through it is renewed on the new master, past
    // the lease it had when it moved.
    thread::sleep(ms(2500));
    assert!(
        held.lost().try_recv().is_err() && held.is_held(),
        "a lock held through a migration was lost"
    );
    let mut con = set.connection(target);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_key(&other))
        .query(&mut con)
        .unwrap();
    assert!(pttl > 0, "held, but not on the slot's new master: {pttl}");
    held.unlock().unwrap();
}

#[test]
fn a_seed_down_at_build_and_a_cluster_that_is_down() {
    let mut set = ClusterSet::start(3, 0);
    let dead = format!("redis://127.0.0.1:{}", support::free_port());
    let mut seeds = vec![dead];
    seeds.extend(set.seed_urls());
    let client = client(seeds, 2000);
    assert!(client.lock("a").unwrap().is_held());

    // A master dies with no replica to take over: its slots are served by nobody, and the
    // cluster says CLUSTERDOWN. A call answers in its time, with a connection error.
    let slot = ClusterSet::slot_of(&lock_key("b"));
    let port = set.master_of_slot(slot);
    let i = set.index_of_port(port);
    set.kill(i);
    let started = Instant::now();
    let err = client.try_lock("b", ms(800)).unwrap_err();
    let took = started.elapsed();
    assert!(err.is_connection(), "{err}");
    assert!(took < ms(2500), "took {took:?}: {err}");
    // Once the other masters have seen it fail, they say the cluster is down.
    let live = set.live_nodes()[0];
    support::poll_until(Duration::from_secs(30), ms(50), || {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut set.connection(live))
            .map_err(|e| e.to_string())?;
        if info.contains("cluster_state:fail") {
            Ok(())
        } else {
            Err("cluster_state not fail".to_string())
        }
    })
    .unwrap_or_else(|why| panic!("the live masters never said the cluster is down: {why}"));
    let started = Instant::now();
    let err = client.try_lock("b", ms(800)).unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert!(started.elapsed() < ms(2500), "took {:?}", started.elapsed());
    let fresh = self::client(set.seed_urls(), 2000);
    let err = fresh.lock("c").unwrap_err();
    assert!(err.is_connection(), "{err}");
}

/// The channels with a subscriber on node `i` (of any client of [`NAMESPACE`]).
fn channels_on(set: &ClusterSet, i: usize) -> HashSet<String> {
    let mut con = set.connection(i);
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{NAMESPACE}:released:*"))
        .query(&mut con)
        .unwrap()
}

#[test]
fn a_waiter_is_woken_and_resubscribes_when_the_node_of_its_classic_subscription_freezes() {
    // Without replicas, and with the rest of the cluster serving on when one master fails.
    let set = ClusterSet::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let holder = LockClient::builder(Topology::cluster(set.seed_urls()))
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    // Once the holder's client has subscribed, the next channel to appear is the waiter's.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..3).all(|i| channels_on(&set, i).is_empty()) {
        assert!(
            Instant::now() < deadline,
            "the holder's client never subscribed"
        );
        thread::sleep(ms(20));
    }
    let before: Vec<HashSet<String>> = (0..3).map(|i| channels_on(&set, i)).collect();
    let waiter = LockClient::builder(Topology::cluster(set.seed_urls()))
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(30))
        .connection_timeout(ms(500))
        .build()
        .unwrap();
    // The node the waiter's client subscribed on: where a new channel appears.
    let deadline = Instant::now() + Duration::from_secs(10);
    let sub = loop {
        if let Some(i) = (0..3).find(|i| channels_on(&set, *i).len() > before[*i].len()) {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter's client never subscribed"
        );
        thread::sleep(ms(20));
    };
    let ours: HashSet<String> = &channels_on(&set, sub) - &before[sub];
    // A key served by another master, held by the other client.
    let key = (0..1000)
        .map(|n| format!("w{n}"))
        .find(|k| set.master_of_slot(ClusterSet::slot_of(&lock_key(k))) != set.port_of(sub))
        .unwrap();
    let guard = holder.lock(&key).unwrap();
    let blocked = {
        let (waiter, key) = (waiter.clone(), key.clone());
        thread::spawn(move || {
            let got = waiter.try_lock(&key, Duration::from_secs(20)).unwrap();
            (Instant::now(), got.map(|g| g.token()))
        })
    };
    // The waiter attempted, found the lock held, and waits for its wake-up; without one it
    // would attempt again 5 s after that attempt (the longest a waiter trusts a holder's lease).
    let key_master = set.index_of_port(set.master_of_slot(ClusterSet::slot_of(&lock_key(&key))));
    support::poll_until(Duration::from_secs(10), ms(10), || {
        let queued: u64 = redis::cmd("LLEN")
            .arg(format!("{NAMESPACE}:queue:{{{key}}}"))
            .query(&mut set.connection(key_master))
            .map_err(|e| e.to_string())?;
        if queued == 1 {
            Ok(())
        } else {
            Err(format!("{queued} queued"))
        }
    })
    .unwrap_or_else(|why| panic!("the waiter never queued: {why}"));
    set.pause(sub);
    let released = Instant::now();
    let first = guard.token();
    guard.unlock().unwrap();
    let (at, token) = blocked.join().unwrap();
    // The handoff came on the key's shard channel, on the key's master: woken before the 5 s
    // re-attempt (about 4.7 s after the release), let alone the lease.
    let token = token.expect("the waiter never got the lock");
    assert!(token > first);
    let waited = at - released;
    assert!(waited < ms(3800), "woken after {waited:?}");
    eprintln!("woken {waited:?} after the release, its classic subscription's node frozen");
    // The classic subscription, which hears clients that publish classically, moves to a live
    // node after a missed heartbeat (about 2 s).
    let moved = support::poll_until(Duration::from_secs(8), ms(50), || {
        let live: HashSet<String> = (0..3)
            .filter(|i| *i != sub)
            .flat_map(|i| channels_on(&set, i))
            .collect();
        if ours.is_subset(&live) {
            Ok(())
        } else {
            Err(format!("{ours:?} not among {live:?}"))
        }
    });
    set.resume(sub);
    if let Err(why) = moved {
        panic!("the classic subscription stayed on the frozen node: {why}");
    }
}

#[test]
fn nodes_that_announce_no_address_are_reached_at_the_seed_host() {
    // MOVED and CLUSTER SLOTS then name a port only (`:30001`, `?`): the host is the one the
    // client reached the answering node at.
    let set = ClusterSet::start_with(
        3,
        0,
        &["--cluster-preferred-endpoint-type", "unknown-endpoint"],
    );
    let mut con = set.connection(0);
    let moved = redis::cmd("SET")
        .arg(lock_key(
            &(0..100)
                .map(|i| format!("m{i}"))
                .find(|k| set.master_of_slot(ClusterSet::slot_of(&lock_key(k))) != set.port_of(0))
                .unwrap(),
        ))
        .arg("x")
        .query::<()>(&mut con)
        .unwrap_err();
    assert!(moved.to_string().contains(" :"), "{moved}");
    let client = client(vec![set.seed_urls()[0].clone()], 2000);
    for i in 0..30 {
        let guard = client.lock(&format!("k{i}")).unwrap();
        guard.unlock().unwrap();
    }
    assert_eq!(masters_of(&set, 30).len(), 3);
    // The client's map goes stale: a slot moves, and the old owner answers `MOVED :port`.
    let slot = ClusterSet::slot_of(&lock_key("k0"));
    let from = set.master_of_slot(slot);
    let to = set.master_ports().into_iter().find(|p| *p != from).unwrap();
    set.begin_migration(slot, to);
    set.migrate_rest(slot);
    set.finish_migration(slot);
    let moved_before = errors_given(&set, set.index_of_port(from), "MOVED");
    let guard = client.lock("k0").unwrap();
    guard.unlock().unwrap();
    assert!(errors_given(&set, set.index_of_port(from), "MOVED") > moved_before);
}
