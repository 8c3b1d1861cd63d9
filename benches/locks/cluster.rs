//! `cluster`: the same work on a Redis Cluster of 1, 2 and 3 masters (no replicas), each
//! started for the run on loopback.
//!
//! - **Scale**: N workers lock and unlock random keys of K for D, beside the `EVALSHA` rate the
//!   same cluster sustains from N threads, each on a connection per master, in the same run.
//!   The CPU that the client and all the nodes spend per job says what limits the figure on a
//!   machine where they share the cores.
//! - **Wake-ups**: H handoffs to a waiter of another client blocked in `lock()`: the latency,
//!   and what the release's `SPUBLISH` costs each node; then H scripts that publish the same
//!   message on the key's master, with a classic `PUBLISH` (which the cluster bus carries to
//!   every node, whichever serves the key) and with `SPUBLISH` (which stays in the key's
//!   shard), and what each costs the other nodes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::Topology;

use crate::measure::{process_cpu, self_cpu, self_pid, task_cpu, tasks};
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::builder;
use crate::server::cluster::ClusterSet;
use crate::stats::{mix, pct, sorted};

const B: &str = "9 cluster";
const TOUCH: &str = "return redis.call('INCR', KEYS[1])";

pub fn run(p: &Params, r: &mut Report) {
    section(&format!(
        "9. Redis Cluster: 1, 2 and 3 masters on this machine, N={} workers over K={} keys, {} each",
        p.workers,
        p.keys,
        fmt_d(p.duration)
    ));
    let mut rates = Vec::new();
    for masters in 1..=3 {
        let set = ClusterSet::start(masters, 0);
        let scripts = script_rate(&set, p.workers, p.keys, p.duration);
        let (jobs, client_cpu, nodes_cpu) = lock_rate(&set, p);
        r.info(
            B,
            &format!(
                "{masters} master(s): lock + unlock/s, EVALSHA/s ({} threads)",
                p.workers
            ),
            format!(
                "{jobs:.0}/s, {scripts:.0}/s ({:.0}% of half)",
                100.0 * jobs / (scripts / 2.0)
            ),
        );
        r.info(
            B,
            &format!("{masters} master(s): CPU per lock + unlock: client, all nodes"),
            format!("{}, {}", fmt_d(client_cpu), fmt_d(nodes_cpu)),
        );
        rates.push(jobs);
        if masters == 1 || masters == 3 {
            handoffs(&set, p, r, masters);
        }
    }
    r.info(
        B,
        "lock + unlock/s with 2 and 3 masters, against 1",
        format!("{:.2}×, {:.2}×", rates[1] / rates[0], rates[2] / rates[0]),
    );
}

/// Which master port serves each slot, as `CLUSTER SLOTS` says.
fn slot_table(set: &ClusterSet) -> Vec<u16> {
    let mut con = set.connection(0);
    let slots: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Vec<redis::Value>>(&mut con)
        .expect("CLUSTER SLOTS")
        .into_iter()
        .map(|entry| {
            let redis::Value::Array(parts) = entry else {
                panic!("CLUSTER SLOTS entry")
            };
            let start: u16 = redis::from_redis_value(parts[0].clone()).expect("start");
            let end: u16 = redis::from_redis_value(parts[1].clone()).expect("end");
            let redis::Value::Array(node) = parts[2].clone() else {
                panic!("CLUSTER SLOTS node")
            };
            let host: String = redis::from_redis_value(node[0].clone()).expect("host");
            let port: u16 = redis::from_redis_value(node[1].clone()).expect("port");
            (start, end, (host, port))
        })
        .collect();
    let mut table = vec![0; 16384];
    for (start, end, (_, port)) in slots {
        for slot in start..=end {
            table[usize::from(slot)] = port;
        }
    }
    table
}

/// The `EVALSHA` rate the cluster sustains from `n` threads, each with a connection to every
/// master, each call a small script on one of `keys` keys sent to the key's master.
fn script_rate(set: &ClusterSet, n: usize, keys: u64, duration: Duration) -> f64 {
    let table = Arc::new(slot_table(set));
    let calls = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let mut cons: HashMap<u16, redis::Connection> = set
                .master_ports()
                .into_iter()
                .map(|port| (port, set.connection(set.index_of_port(port))))
                .collect();
            let (table, calls, ready) =
                (Arc::clone(&table), Arc::clone(&calls), Arc::clone(&ready));
            thread::spawn(move || {
                let script = redis::Script::new(TOUCH);
                for con in cons.values_mut() {
                    let _: i64 = script.key("{w}").invoke(con).unwrap_or(0);
                    script.load(con).expect("SCRIPT LOAD");
                }
                ready.wait();
                let end = Instant::now() + duration;
                let (mut j, mut local) = (i as u64 * 1_000_003, 0u64);
                while Instant::now() < end {
                    j += 1;
                    let key = format!("tp:{{{}}}", mix(j) % keys);
                    let port = table[usize::from(ClusterSet::slot_of(&key))];
                    let con = cons.get_mut(&port).expect("a connection to every master");
                    let _: i64 = script.key(&key).invoke(con).expect("touch");
                    local += 1;
                }
                calls.fetch_add(local, Ordering::Relaxed);
            })
        })
        .collect();
    ready.wait();
    for h in handles {
        h.join().expect("script thread");
    }
    calls.load(Ordering::Relaxed) as f64 / duration.as_secs_f64()
}

/// CPU of every node of `set` so far.
fn nodes_cpu(set: &ClusterSet) -> Vec<Duration> {
    (0..set.node_ports().len())
        .map(|i| process_cpu(set.server(i).pid()))
        .collect()
}

/// lock + unlock/s from `p.workers` threads of one client over `p.keys` keys, and the CPU per
/// job of the client and of all the nodes together.
fn lock_rate(set: &ClusterSet, p: &Params) -> (f64, Duration, Duration) {
    let client = builder(Topology::cluster(set.seed_urls()))
        .pool_size(p.pool_size)
        .build()
        .expect("LockClient");
    let jobs = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(p.workers + 1));
    let handles: Vec<_> = (0..p.workers)
        .map(|i| {
            let (client, jobs, ready) = (client.clone(), Arc::clone(&jobs), Arc::clone(&ready));
            let (keys, duration) = (p.keys, p.duration);
            thread::spawn(move || {
                // Every master's pool and scripts warmed up.
                for w in 0..8 {
                    drop(client.lock(&format!("warm:{i}:{w}")).expect("lock"));
                }
                ready.wait();
                let end = Instant::now() + duration;
                let (mut j, mut local) = (i as u64 * 1_000_003, 0u64);
                while Instant::now() < end {
                    j += 1;
                    let guard = client
                        .lock(&format!("job:{}", mix(j) % keys))
                        .expect("lock");
                    guard.unlock().expect("unlock");
                    local += 1;
                }
                jobs.fetch_add(local, Ordering::Relaxed);
            })
        })
        .collect();
    ready.wait();
    let (ours, nodes) = (self_cpu(), nodes_cpu(set));
    let start = Instant::now();
    for h in handles {
        h.join().expect("worker");
    }
    let elapsed = start.elapsed();
    let done = jobs.load(Ordering::Relaxed).max(1);
    let client_cpu = self_cpu().saturating_sub(ours) / done as u32;
    let nodes_cpu: Duration = nodes_cpu(set)
        .iter()
        .zip(&nodes)
        .map(|(after, before)| after.saturating_sub(*before))
        .sum::<Duration>()
        / done as u32;
    (done as f64 / elapsed.as_secs_f64(), client_cpu, nodes_cpu)
}

/// H handoffs of one key to a waiter of another client: latency, and CPU per handoff of the
/// key's master and of the other nodes.
fn handoffs(set: &ClusterSet, p: &Params, r: &mut Report, masters: usize) {
    let holder = builder(Topology::cluster(set.seed_urls()))
        .build()
        .expect("LockClient");
    let waiter = builder(Topology::cluster(set.seed_urls()))
        .build()
        .expect("LockClient");
    let key = "handoff";
    let owner = set.master_of_slot(ClusterSet::slot_of(&format!("bench:lock:{{{key}}}")));
    drop(waiter.lock(key).expect("warm up"));
    let n = p.handoffs.max(1);
    let mut latencies = Vec::with_capacity(n);
    let started = Instant::now();
    let before = nodes_cpu(set);
    for _ in 0..n {
        let guard = holder.lock(key).expect("lock");
        let w = waiter.clone();
        let blocked = thread::spawn(move || {
            let guard = w.lock(key).expect("waiter lock");
            let at = Instant::now();
            drop(guard);
            at
        });
        // Until the waiter has queued in Redis and waits for its wake-up.
        thread::sleep(Duration::from_millis(3));
        let released = Instant::now();
        guard.unlock().expect("unlock");
        latencies.push(blocked.join().expect("waiter") - released);
    }
    let after = nodes_cpu(set);
    // What the nodes spend doing nothing for as long (their timers), taken off.
    let idle_from = nodes_cpu(set);
    thread::sleep(started.elapsed());
    let idle_to = nodes_cpu(set);
    let latencies = sorted(latencies);
    let per = |i: usize| {
        let busy = after[i].saturating_sub(before[i]);
        let idle = idle_to[i].saturating_sub(idle_from[i]);
        busy.saturating_sub(idle) / n as u32
    };
    let owner_cpu = per(set.index_of_port(owner));
    let others: Vec<String> = (0..after.len())
        .filter(|i| set.port_of(*i) != owner)
        .map(|i| fmt_d(per(i)))
        .collect();
    r.info(
        B,
        &format!("{masters} master(s): handoff to another client p50 / p99"),
        format!(
            "{} / {}",
            r.lat(pct(&latencies, 0.5)),
            fmt_d(pct(&latencies, 0.99))
        ),
    );
    r.info(
        B,
        &format!("{masters} master(s): node CPU per handoff (less idle): the key's master, each other node"),
        if others.is_empty() {
            fmt_d(owner_cpu)
        } else {
            format!("{}, {}", fmt_d(owner_cpu), others.join(" / "))
        },
    );
    // The waiting client's shard thread, idle while one of its waiters waits: it reads with a
    // short timeout, to take up new keys at once.
    let guard = holder.lock(key).expect("lock");
    let w = waiter.clone();
    let blocked = thread::spawn(move || drop(w.lock(key).expect("waiter lock")));
    thread::sleep(Duration::from_millis(500));
    let shard_threads = || -> Duration {
        tasks(self_pid())
            .iter()
            .filter(|(_, name)| name == "fencelock-shard")
            .map(|(tid, _)| task_cpu(self_pid(), *tid))
            .sum()
    };
    let (from, at) = (shard_threads(), Instant::now());
    thread::sleep(Duration::from_secs(2));
    let idle = shard_threads().saturating_sub(from).as_secs_f64() / at.elapsed().as_secs_f64();
    drop(guard);
    blocked.join().expect("waiter");
    r.info(
        B,
        &format!("{masters} master(s): CPU of the waiting client's shard thread while it waits"),
        format!("{:.3}% of a core", 100.0 * idle),
    );
    if masters > 1 {
        for command in ["PUBLISH", "SPUBLISH"] {
            let costs = publish_cost(set, owner, key, command, n);
            r.info(
                B,
                &format!(
                    "{masters} master(s): CPU of each other node per {command} of a handoff's message"
                ),
                costs.iter().map(|d| fmt_d(*d)).collect::<Vec<_>>().join(" / "),
            );
        }
    }
}

/// What `n` scripts on the master at `owner`, each publishing a handoff-sized message with
/// `command` on a channel in `key`'s slot, cost each other node, per message, less idle.
fn publish_cost(set: &ClusterSet, owner: u16, key: &str, command: &str, n: usize) -> Vec<Duration> {
    let script = format!("return redis.call('{command}', KEYS[1], ARGV[1])");
    let channel = format!("bench:released:{{{key}}}:s00000000000000000000000000000000");
    let message = format!("{} s00000000000000000000000000000000:1 {key}", u64::MAX / 2);
    let mut con = set.connection(set.index_of_port(owner));
    let started = Instant::now();
    let before = nodes_cpu(set);
    for _ in 0..n {
        let _: i64 = redis::cmd("EVAL")
            .arg(&script)
            .arg(1)
            .arg(&channel)
            .arg(&message)
            .query(&mut con)
            .expect("publish");
        // Spaced as handoffs are: messages sent back to back share the bus's reads and writes.
        thread::sleep(Duration::from_millis(1));
    }
    let after = nodes_cpu(set);
    let idle_from = nodes_cpu(set);
    thread::sleep(started.elapsed());
    let idle_to = nodes_cpu(set);
    (0..after.len())
        .filter(|i| set.port_of(*i) != owner)
        .map(|i| {
            let busy = after[i].saturating_sub(before[i]);
            let idle = idle_to[i].saturating_sub(idle_from[i]);
            busy.saturating_sub(idle) / n as u32
        })
        .collect()
}
