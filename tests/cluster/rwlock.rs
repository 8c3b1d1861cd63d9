//! Read-write locks on a Redis Cluster: every key of a lock, each grant's key included, lives in
//! its slot, on its master; never a writer beside another holder with threads on several
//! clients; and a writer's release admits other clients' waiting readers through the lock's
//! shard channel, at once.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, Topology};

use crate::support::cluster::ClusterSet;
use crate::support::{command_calls, ms, poll_until};

const NAMESPACE: &str = "rw";

fn client(set: &ClusterSet, lease: Duration) -> LockClient {
    LockClient::builder(Topology::cluster(set.seed_urls()))
        .namespace(NAMESPACE)
        .lease(lease)
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

/// The master that serves the read-write lock `name` (its tag is `%rwlock:<name>` for plain names).
fn master_of(set: &ClusterSet, name: &str) -> u16 {
    set.master_of_slot(ClusterSet::slot_of(&format!(
        "{NAMESPACE}:readers:{{%rwlock:{name}}}"
    )))
}

#[test]
fn never_a_writer_beside_another_holder_on_a_cluster_and_every_key_on_its_master() {
    let set = ClusterSet::start(3, 0);
    let clients = [client(&set, ms(2000)), client(&set, ms(2000))];
    let master = master_of(&set, "config");
    let keys_seen = Mutex::new(Vec::<String>::new());
    // (start, end, write)
    let holds = Mutex::new(Vec::<(Instant, Instant, bool)>::new());
    let stop = Instant::now() + Duration::from_secs(2);
    thread::scope(|s| {
        for t in 0..6 {
            let client = &clients[t % 2];
            let (holds, keys_seen, set) = (&holds, &keys_seen, &set);
            s.spawn(move || {
                let mut round = 0;
                while Instant::now() < stop {
                    round += 1;
                    let write = (round + t).is_multiple_of(3);
                    let look = |set: &ClusterSet| {
                        if keys_seen.lock().unwrap().is_empty() {
                            let keys: Vec<String> = redis::cmd("KEYS")
                                .arg(format!("{NAMESPACE}:*"))
                                .query(&mut set.connection(set.index_of_port(master)))
                                .unwrap();
                            *keys_seen.lock().unwrap() = keys;
                        }
                    };
                    let (start, end) = if write {
                        let guard = client.write_lock("config").unwrap();
                        let start = Instant::now();
                        thread::sleep(ms(1));
                        let end = Instant::now();
                        guard.unlock().unwrap();
                        (start, end)
                    } else {
                        let guard = client.read_lock("config").unwrap();
                        let start = Instant::now();
                        thread::sleep(ms(3));
                        if t == 0 {
                            look(set);
                        }
                        let end = Instant::now();
                        guard.unlock().unwrap();
                        (start, end)
                    };
                    holds.lock().unwrap().push((start, end, write));
                }
            });
        }
    });
    let mut holds = holds.into_inner().unwrap();
    let writes = holds.iter().filter(|h| h.2).count();
    assert!(
        writes >= 10 && holds.len() - writes >= 20,
        "only {writes} writes of {} grants",
        holds.len()
    );
    holds.sort_by_key(|h| h.0);
    let mut last_end: Option<Instant> = None;
    let mut last_write_end: Option<Instant> = None;
    for &(start, end, write) in &holds {
        assert!(
            last_write_end.is_none_or(|e| e <= start),
            "a grant began while a write held"
        );
        assert!(
            !write || last_end.is_none_or(|e| e <= start),
            "a write began while another grant held"
        );
        if last_end.is_none_or(|e| end > e) {
            last_end = Some(end);
        }
        if write && last_write_end.is_none_or(|e| end > e) {
            last_write_end = Some(end);
        }
    }
    let keys = keys_seen.into_inner().unwrap();
    assert!(
        keys.iter()
            .any(|k| k.starts_with("rw:rwhold:{%rwlock:config}:")),
        "no grant's key on the lock's master: {keys:?}"
    );
    assert!(
        keys.iter().all(|k| k.contains("{%rwlock:config}")),
        "{keys:?}"
    );
}

#[test]
fn a_writers_release_admits_other_clients_readers_on_the_shard_channel() {
    let set = ClusterSet::start(3, 0);
    let master = master_of(&set, "handoff");
    // Long leases: without the handoff message a waiter would ask again only after 5 s.
    let writer = client(&set, ms(30_000));
    let readers = [client(&set, ms(30_000)), client(&set, ms(30_000))];
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let w = writer.write_lock("handoff").unwrap();
        let first = w.token();
        let waiting: Vec<_> = readers
            .iter()
            .map(|r| {
                let r = r.clone();
                thread::spawn(move || {
                    let guard = r.try_read_lock("handoff", Duration::from_secs(20)).unwrap();
                    let at = Instant::now();
                    let guard = guard.expect("a reader never got the lock");
                    (at, guard)
                })
            })
            .collect();
        poll_until(Duration::from_secs(10), ms(5), || {
            let len: u64 = redis::cmd("LLEN")
                .arg(format!("{NAMESPACE}:queue:{{%rwlock:handoff}}"))
                .query(&mut set.connection(set.index_of_port(master)))
                .map_err(|e| e.to_string())?;
            if len == 2 {
                Ok(())
            } else {
                Err(format!("{len} waiting"))
            }
        })
        .unwrap();
        let released = Instant::now();
        w.unlock().unwrap();
        let guards: Vec<_> = waiting
            .into_iter()
            .map(|h| {
                let (at, guard) = h.join().unwrap();
                assert!(guard.token() > first);
                slowest = slowest.max(at - released);
                guard
            })
            .collect();
        // Both hold together.
        assert!(guards.iter().all(|g| g.is_held()));
    }
    assert!(
        slowest < ms(2_500),
        "a reader got the lock {slowest:?} after the release: it did not hear it"
    );
    let sharded = command_calls(&mut set.connection(set.index_of_port(master)), "spublish");
    assert!(sharded >= 6, "{sharded} handoffs published on the shard");
}
