//! Counting semaphores on a Redis Cluster: every key of a semaphore, each permit's key
//! included, lives in its slot, on its master; never more than N permits held with threads on
//! several clients; and a release hands a permit to another client's waiter through the
//! semaphore's shard channel, at once.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, Topology};

use crate::support::cluster::ClusterSet;
use crate::support::{command_calls, ms, poll_until};

const NAMESPACE: &str = "sem";

fn client(set: &ClusterSet, lease: Duration) -> LockClient {
    LockClient::builder(Topology::cluster(set.seed_urls()))
        .namespace(NAMESPACE)
        .lease(lease)
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

/// The master that serves the semaphore `name` (its tag is `%semaphore:<name>` for plain names).
fn master_of(set: &ClusterSet, name: &str) -> u16 {
    set.master_of_slot(ClusterSet::slot_of(&format!(
        "{NAMESPACE}:permits:{{%semaphore:{name}}}"
    )))
}

#[test]
fn never_more_than_n_permits_on_a_cluster_and_every_key_on_its_master() {
    const N: usize = 2;
    let set = ClusterSet::start(3, 0);
    let clients = [client(&set, ms(2000)), client(&set, ms(2000))];
    let master = master_of(&set, "pool");
    let keys_seen = Mutex::new(Vec::<String>::new());
    let holds = Mutex::new(Vec::<(Instant, Instant, u64)>::new());
    let stop = Instant::now() + Duration::from_secs(2);
    thread::scope(|s| {
        for t in 0..6 {
            let semaphore = clients[t % 2].semaphore("pool", N as u32).unwrap();
            let (holds, keys_seen, set) = (&holds, &keys_seen, &set);
            s.spawn(move || {
                while Instant::now() < stop {
                    let permit = semaphore.acquire().unwrap();
                    let start = Instant::now();
                    thread::sleep(ms(2));
                    if t == 0 && keys_seen.lock().unwrap().is_empty() {
                        let keys: Vec<String> = redis::cmd("KEYS")
                            .arg(format!("{NAMESPACE}:*"))
                            .query(&mut set.connection(set.index_of_port(master)))
                            .unwrap();
                        *keys_seen.lock().unwrap() = keys;
                    }
                    let end = Instant::now();
                    holds
                        .lock()
                        .unwrap()
                        .push((start, end, permit.token().as_u64()));
                    permit.release().unwrap();
                }
            });
        }
    });
    let holds = holds.into_inner().unwrap();
    assert!(holds.len() >= 50, "only {} grants", holds.len());
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .flat_map(|&(start, end, _)| [(start, 1), (end, -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    assert!(most <= N as i32, "{most} permits held at once, of {N}");
    let mut tokens: Vec<u64> = holds.iter().map(|h| h.2).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), holds.len(), "a token was granted twice");
    let keys = keys_seen.into_inner().unwrap();
    assert!(
        keys.iter()
            .any(|k| k.starts_with("sem:permit:{%semaphore:pool}:")),
        "no permit key on the semaphore's master: {keys:?}"
    );
    assert!(
        keys.iter().all(|k| k.contains("{%semaphore:pool}")),
        "{keys:?}"
    );
}

#[test]
fn a_release_hands_a_permit_to_another_clients_waiter_on_the_shard_channel() {
    let set = ClusterSet::start(3, 0);
    // Long leases: without the handoff message the waiter would ask again only after 5 s.
    let (holder, waiter) = (client(&set, ms(30_000)), client(&set, ms(30_000)));
    let master = master_of(&set, "handoff");
    let mine = holder.semaphore("handoff", 1).unwrap();
    let theirs = waiter.semaphore("handoff", 1).unwrap();
    let mut slowest = Duration::ZERO;
    // Before the first wait's shard subscription stands, a release that no shard subscriber
    // hears publishes classically too: either way the waiter hears it.
    for _ in 0..5 {
        let permit = mine.acquire().unwrap();
        let first = permit.token();
        let waiting = {
            let theirs = theirs.clone();
            thread::spawn(move || {
                let permit = theirs.try_acquire(Duration::from_secs(20)).unwrap();
                let at = Instant::now();
                let permit = permit.expect("the waiter never got the permit");
                (at, permit.token())
            })
        };
        poll_until(Duration::from_secs(10), ms(5), || {
            match mine.status().map_err(|e| e.to_string())?.waiters {
                1 => Ok(()),
                n => Err(format!("{n} waiting")),
            }
        })
        .unwrap();
        let released = Instant::now();
        permit.release().unwrap();
        let (at, token) = waiting.join().unwrap();
        assert!(token > first);
        slowest = slowest.max(at - released);
    }
    assert!(
        slowest < ms(2_500),
        "a waiter got the permit {slowest:?} after the release: it did not hear it"
    );
    let sharded = command_calls(&mut set.connection(set.index_of_port(master)), "spublish");
    assert!(sharded >= 5, "{sharded} handoffs published on the shard");
}

/// While the semaphore's slot migrates key by key, a holder's permit key may be on the target
/// while the holders' set is still on the source: a script that counted there would take the
/// moved permit for a dead one. None runs: a new permit's key is one of its KEYS and exists
/// nowhere yet, so Redis answers TRYAGAIN until the migration ends. Never a third of two.
#[test]
fn a_slot_migrating_key_by_key_never_lets_a_permit_too_many_through() {
    let set = ClusterSet::start(3, 0);
    let (holder, other) = (client(&set, ms(30_000)), client(&set, ms(30_000)));
    let mine = holder.semaphore("moving", 2).unwrap();
    let theirs = other.semaphore("moving", 2).unwrap();
    let held = [mine.acquire().unwrap(), mine.acquire().unwrap()];
    let slot = ClusterSet::slot_of("sem:permits:{%semaphore:moving}");
    let source = set.master_of_slot(slot);
    let target = set
        .master_ports()
        .into_iter()
        .find(|&p| p != source)
        .unwrap();
    let permit_keys: Vec<String> = redis::cmd("KEYS")
        .arg("sem:permit:{%semaphore:moving}:*")
        .query(&mut set.connection(set.index_of_port(source)))
        .unwrap();
    assert_eq!(permit_keys.len(), 2, "{permit_keys:?}");

    set.begin_migration(slot, target);
    set.migrate_key(slot, &permit_keys[0]);
    for _ in 0..3 {
        match theirs.try_acquire(Duration::ZERO) {
            Ok(None) | Err(_) => {}
            Ok(Some(permit)) => panic!("a third permit of two: {permit:?}"),
        }
    }
    set.migrate_rest(slot);
    set.finish_migration(slot);
    assert!(theirs.try_acquire(Duration::ZERO).unwrap().is_none());
    let status = theirs.status().unwrap();
    assert_eq!((status.held, status.permits), (2, 2));
    assert!(held.iter().all(fencelock::Permit::is_held));
    let [a, b] = held;
    a.release().unwrap();
    let third = theirs
        .try_acquire(Duration::from_secs(5))
        .unwrap()
        .expect("the released permit");
    drop((b, third));
}
