//! Sharded wake-ups on a Redis Cluster under the faults that once broke them: a handoff while
//! the lock's slot migrates (the release runs on the importing node, the waiter's subscription
//! stands on the source), a master that learns of a migration late, a frozen master, ACL users
//! without `INFO` or without `SSUBSCRIBE`, and a master that dies under a waiter. Each failed
//! before its fix (a waiter woken by its 5 s backstop or not at all, or a thread left running).
//!
//! The tests run one at a time ([`serial`]): some count the process' `fencelock-shard` threads.
//! So this is a test binary of its own: every cluster client of another test would have shard
//! threads of the same name.

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, Topology};
use support::cluster::ClusterSet;
use support::wake::{await_subscription_of, client, lock_key, subscribed_on, NAMESPACE, UNHEARD};
use support::{ms, poll_until};

/// One test at a time: a test's count of shard threads must not see another test's clients.
/// Those of the test before end within a heartbeat of its clients being dropped.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let one = ONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let gone = poll_until(Duration::from_secs(5), ms(50), || match shard_threads() {
        left if left.is_empty() => Ok(()),
        left => Err(format!("{left:?}")),
    });
    if let Err(left) = gone {
        panic!("shard threads of an earlier test still run: {left}");
    }
    one
}

fn wait_for(
    waiter: &LockClient,
    key: &str,
    timeout: Duration,
) -> thread::JoinHandle<Option<(Instant, u64)>> {
    let (waiter, key) = (waiter.clone(), key.to_owned());
    thread::spawn(move || {
        let guard = waiter.try_lock(&key, timeout).unwrap()?;
        let at = Instant::now();
        let token = guard.token().as_u64();
        guard.unlock().unwrap();
        Some((at, token))
    })
}

/// This process' threads named `fencelock-shard`: (tid, utime+stime in ticks).
fn shard_threads() -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let dir = entry.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim() != "fencelock-shard" {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // Fields after the ')' : state is field 3; utime 14, stime 15.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let tid = entry.file_name().to_string_lossy().parse().unwrap_or(0);
        out.push((tid, ticks));
    }
    out
}

fn info_field(set: &ClusterSet, i: usize, section: &str, field: &str) -> u64 {
    let mut con = set.connection(i);
    let info: String = redis::cmd("INFO").arg(section).query(&mut con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// While a slot is being migrated (IMPORTING on the target, MIGRATING on the source, keys moved
/// already), a lock's keys live on the target and are reached with ASK; the client's map still
/// names the source. The waiter's SSUBSCRIBE goes to the source, the release's SPUBLISH runs on
/// the target: before this change, a classic PUBLISH reached every node.
#[test]
fn a_handoff_during_a_slot_migration_wakes_the_waiter() {
    let _one = serial();
    let set = ClusterSet::start(3, 0);
    let key = "migrating";
    let slot = ClusterSet::slot_of(&lock_key(key));
    let source = set.master_of_slot(slot);
    let target = set
        .master_ports()
        .into_iter()
        .find(|p| *p != source)
        .unwrap();
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    // Both clients know the map (source owns the slot).
    drop(holder.lock("warm-a").unwrap());
    drop(waiter.lock("warm-b").unwrap());
    // The waiter waits (subscribed on the source) when the keys move: every key of the lock
    // exists, so the release can run on the target under ASKING.
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for_result(&waiter, key, Duration::from_secs(20));
    await_subscription_of(&set, key, source, Duration::from_secs(5));
    set.begin_migration(slot, target);
    set.migrate_rest(slot);
    thread::sleep(ms(1500));
    let on_source = subscribed_on(&set, key, source);
    let on_target = subscribed_on(&set, key, target);
    eprintln!("subscription: on source {on_source}, on target {on_target}");
    let released = Instant::now();
    guard.unlock().unwrap();
    let outcome = blocked.join().unwrap();
    let waited = outcome.0 - released;
    eprintln!(
        "waiter's call returned {waited:?} after the release: {:?}",
        outcome.1
    );
    set.finish_migration(slot);
    assert!(
        outcome.1.is_ok() && waited < UNHEARD / 2,
        "the waiter's call returned {waited:?} after the release with {:?}: the handoff went \
         unheard (subscribed on source: {on_source}, on target: {on_target})",
        outcome.1
    );
}

fn wait_for_result(
    waiter: &LockClient,
    key: &str,
    timeout: Duration,
) -> thread::JoinHandle<(Instant, Result<Option<u64>, String>)> {
    let (waiter, key) = (waiter.clone(), key.to_owned());
    thread::spawn(move || {
        let r = waiter.try_lock(&key, timeout);
        let at = Instant::now();
        let r = match r {
            Ok(Some(g)) => {
                let t = g.token().as_u64();
                let _ = g.unlock();
                Ok(Some(t))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        };
        (at, r)
    })
}

/// A waiter gives up on a key whose master died (no replica): its key lingers 5 s, then the
/// node's thread should unsubscribe and end. Linger runs only on a live connection, though.
#[test]
fn a_shard_thread_ends_after_its_dead_masters_waiter_left() {
    let _one = serial();
    let mut set = ClusterSet::start(3, 0);
    let key = "dead";
    let master = set.master_of_slot(ClusterSet::slot_of(&lock_key(key)));
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for_result(&waiter, key, Duration::from_secs(3));
    await_subscription_of(&set, key, master, Duration::from_secs(5));
    assert_eq!(shard_threads().len(), 1, "{:?}", shard_threads());
    std::mem::forget(guard);
    set.kill(set.index_of_port(master));
    // Its master dead, the waiter's call ends in its time: not granted, or refused a connection
    // if it attempted again meanwhile (woken by its subscription's broken connection).
    let (_, outcome) = blocked.join().unwrap();
    assert!(
        matches!(outcome, Ok(None)) || outcome.as_ref().is_err_and(|e| e.contains("refused")),
        "{outcome:?}"
    );
    let left = Instant::now();
    // Linger (5 s) + a heartbeat or two: the thread should be gone well within 10 s.
    let mut samples = Vec::new();
    let (start_ticks, _) = (shard_threads().iter().map(|t| t.1).sum::<u64>(), ());
    while left.elapsed() < Duration::from_secs(30) && samples.last() != Some(&0) {
        thread::sleep(ms(1000));
        samples.push(shard_threads().len());
    }
    let end_ticks: u64 = shard_threads().iter().map(|t| t.1).sum();
    eprintln!(
        "shard threads each second after the waiter left: {samples:?}; cpu ticks {}",
        end_ticks.saturating_sub(start_ticks)
    );
    let still = shard_threads().len();
    let after = left.elapsed();
    // Dropping the client does end it.
    drop(waiter);
    drop(holder);
    let dropped = Instant::now();
    let ended = poll_until(Duration::from_secs(5), ms(50), || {
        if shard_threads().is_empty() {
            Ok(())
        } else {
            Err(String::new())
        }
    });
    eprintln!(
        "after the client was dropped: ended {:?} within {:?}",
        ended.is_ok(),
        dropped.elapsed()
    );
    assert!(ended.is_ok(), "a shard thread outlived its client");
    assert_eq!(
        still, 0,
        "a shard thread still runs {after:?} after its only waiter left"
    );
}

/// A user whose ACL lacks SSUBSCRIBE (a deployment written for classic pub/sub: `+subscribe`):
/// the subscription is never confirmed. Measures the shard thread's CPU, and the wake-up.
#[test]
fn a_refused_ssubscribe_costs_little_and_the_waiter_still_wakes() {
    let _one = serial();
    let set = ClusterSet::start(3, 0);
    for i in 0..3 {
        let mut con = set.connection(i);
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg("-ssubscribe")
            .query(&mut con)
            .unwrap();
    }
    let key = "noperm";
    let master = set.master_of_slot(ClusterSet::slot_of(&lock_key(key)));
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for(&waiter, key, Duration::from_secs(20));
    thread::sleep(ms(500));
    let ticks0: u64 = shard_threads().iter().map(|t| t.1).sum();
    let m = set.index_of_port(master);
    let slots0: u64 = (0..3)
        .map(|i| support::command_calls(&mut set.connection(i), "cluster|slots"))
        .sum();
    let rej0 = info_field(&set, m, "stats", "total_error_replies");
    let t0 = Instant::now();
    thread::sleep(ms(4000));
    let ticks1: u64 = shard_threads().iter().map(|t| t.1).sum();
    let slots1: u64 = (0..3)
        .map(|i| support::command_calls(&mut set.connection(i), "cluster|slots"))
        .sum();
    let rej1 = info_field(&set, m, "stats", "total_error_replies");
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "shard threads {:?}: {:.1}% of a core; CLUSTER SLOTS {:.1}/s; error replies on the master {:.1}/s",
        shard_threads(),
        (ticks1 - ticks0) as f64 / secs,
        (slots1 - slots0) as f64 / secs,
        (rej1 - rej0) as f64 / secs
    );
    {
        let mut con = set.connection(m);
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut con)
            .unwrap();
        for l in info.lines().filter(|l| {
            l.contains("subscribe") || l.contains("publish") || l.contains("cluster|slots")
        }) {
            eprintln!("master {master}: {l}");
        }
    }
    // Ticks are hundredths of a second: per second, percent of a core.
    let cpu = (ticks1 - ticks0) as f64 / secs;
    assert!(cpu < 0.5, "the shard thread used {cpu:.1}% of a core");
    drop(guard);
    blocked.join().unwrap().expect("never got the lock");
    // A round timed well inside the backstop: a fresh wait, released 1 s after it began.
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for(&waiter, key, Duration::from_secs(20));
    thread::sleep(ms(1000));
    let released = Instant::now();
    drop(guard);
    let (at, _) = blocked.join().unwrap().expect("never got the lock");
    eprintln!("woken {:?} after the release", at - released);
    assert!(
        at - released < UNHEARD / 2,
        "woken {:?} after the release (SSUBSCRIBE refused, SUBSCRIBE allowed)",
        at - released
    );
}

/// The key's master freezes (SIGSTOP) and its replica takes over: the waiter's subscription
/// follows to the new master. (The waiter's own call fails meanwhile: its backstop attempt goes
/// to the frozen master and times out, as before this change, so no wake-up is timed here.)
#[test]
fn a_frozen_masters_waiter_subscription_moves_to_the_new_master() {
    let _one = serial();
    let set = ClusterSet::start(3, 1);
    let key = "frozen";
    let slot = ClusterSet::slot_of(&lock_key(key));
    let old = set.master_of_slot(slot);
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for_result(&waiter, key, Duration::from_secs(40));
    await_subscription_of(&set, key, old, Duration::from_secs(5));
    thread::sleep(ms(1500));
    let paused = Instant::now();
    set.pause(set.index_of_port(old));
    let new = set.wait_for_owner_change(slot, old, Duration::from_secs(20));
    let took_over = paused.elapsed();
    let sub = poll_until(Duration::from_secs(10), ms(20), || {
        if subscribed_on(&set, key, new) {
            Ok(())
        } else {
            Err(String::new())
        }
    });
    let moved = paused.elapsed();
    eprintln!(
        "{new} took over {took_over:?} after the pause; subscribed there: {} at {moved:?}",
        sub.is_ok()
    );
    set.resume(set.index_of_port(old));
    drop(guard);
    let _ = blocked.join();
    assert!(sub.is_ok() && moved - took_over < UNHEARD / 2);
}

fn cluster_cmd(set: &ClusterSet, port: u16, args: &[&str]) {
    let mut con = set.connection(set.index_of_port(port));
    let mut cmd = redis::cmd("CLUSTER");
    for a in args {
        cmd.arg(*a);
    }
    let r: redis::RedisResult<String> = cmd.query(&mut con);
    eprintln!("CLUSTER {args:?} on {port}: {r:?}");
}

/// A slot migration ends as `redis-cli --cluster` ends it: `SETSLOT NODE` on the target and the
/// source; the other masters learn by gossip. The source drops the waiter's subscription at
/// once; the client asks for the map (of the first master) straight away, which may not know
/// yet, so the client subscribes on the source again, which answers `MOVED`; on a connection
/// that has had a read time out, redis-rs skips that error reply, so the key waits a whole
/// response timeout (5 s by default) before it is subscribed on the target.
#[test]
fn a_subscription_follows_a_migration_the_first_master_learns_late() {
    let _one = serial();
    let set = ClusterSet::start(3, 0);
    let (source, target) = (set.port_of(1), set.port_of(2));
    let key = (0..1000)
        .map(|i| format!("late{i}"))
        .find(|k| set.master_of_slot(ClusterSet::slot_of(&lock_key(k))) == source)
        .unwrap();
    let slot = ClusterSet::slot_of(&lock_key(&key));
    let defaults = |seeds| {
        LockClient::builder(Topology::cluster(seeds))
            .namespace(NAMESPACE)
            .lease(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (holder, waiter) = (defaults(set.seed_urls()), defaults(set.seed_urls()));
    let guard = holder.lock(&key).unwrap();
    let blocked = wait_for_result(&waiter, &key, Duration::from_secs(30));
    await_subscription_of(&set, &key, source, Duration::from_secs(5));
    // The confirmation woke the waiter, which attempted again: its next attempt (the backstop) is
    // 5 s after that. Move the slot just after that one, so that the next is 5 s off.
    let confirmed = Instant::now();
    thread::sleep(ms(5300));
    set.begin_migration(slot, target);
    set.migrate_rest(slot);
    let target_id = set.node_id(2);
    let slot_text = slot.to_string();
    // Master 0 keeps naming the source for 3 s (as a node that learns late by gossip would):
    // its view is set back every millisecond.
    let source_id = set.node_id(1);
    let stale = {
        let mut con = set.connection(0);
        let (slot_text, source_id) = (slot.to_string(), source_id.clone());
        thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                let _: redis::RedisResult<String> = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(&slot_text)
                    .arg("NODE")
                    .arg(&source_id)
                    .query(&mut con);
                thread::sleep(ms(1));
            }
        })
    };
    thread::sleep(ms(50));
    cluster_cmd(&set, target, &["SETSLOT", &slot_text, "NODE", &target_id]);
    cluster_cmd(&set, source, &["SETSLOT", &slot_text, "NODE", &target_id]);
    let moved = Instant::now();
    let poller = {
        let port = target;
        let key = key.clone();
        let ports = set.node_ports();
        let i = ports.iter().position(|p| *p == port).unwrap();
        let mut con = set.connection(i);
        thread::spawn(move || {
            while moved.elapsed() < Duration::from_secs(8) {
                let channels: HashSet<String> = redis::cmd("PUBSUB")
                    .arg("SHARDCHANNELS")
                    .arg(format!("{NAMESPACE}:released:*"))
                    .query(&mut con)
                    .unwrap();
                if channels.iter().any(|c| c.contains(&format!("{{{key}}}"))) {
                    return Some(moved.elapsed());
                }
                thread::sleep(ms(10));
            }
            None
        })
    };
    let _ = poll_until(Duration::from_secs(8), ms(10), || {
        if subscribed_on(&set, &key, target) {
            Ok(())
        } else {
            Err(String::new())
        }
    });
    let released = Instant::now();
    guard.unlock().unwrap();
    let (at, r) = blocked.join().unwrap();
    let woken = at.saturating_duration_since(released);
    let on_target = poller.join().unwrap();
    eprintln!(
        "moved {:?} after the confirmation; subscription on the target {on_target:?} after the \
         move; released {:?} after the move; waiter returned {woken:?} after the release: {r:?}",
        moved - confirmed,
        released - moved
    );
    stale.join().unwrap();
    let errors: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut set.connection(1))
        .unwrap();
    eprintln!(
        "source's error replies: {:?}",
        errors
            .lines()
            .filter(|l| l.starts_with("errorstat"))
            .collect::<Vec<_>>()
    );
    set.finish_migration(slot);
    assert!(
        woken < UNHEARD / 2,
        "woken {woken:?} after the release; subscribed on the new master {on_target:?} after the move"
    );
}

/// A waiter's key lingers 5 s after the waiter got the lock; then the node's thread unsubscribes
/// and ends. Also: the thread's CPU while settled.
#[test]
fn a_shard_thread_ends_after_linger_and_idles_cheaply() {
    let _one = serial();
    let set = ClusterSet::start(3, 0);
    let key = "linger";
    let master = set.master_of_slot(ClusterSet::slot_of(&lock_key(key)));
    let (holder, waiter) = (client(set.seed_urls()), client(set.seed_urls()));
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for(&waiter, key, Duration::from_secs(20));
    await_subscription_of(&set, key, master, Duration::from_secs(5));
    let t0: u64 = shard_threads().iter().map(|t| t.1).sum();
    let at0 = Instant::now();
    thread::sleep(ms(4000));
    let t1: u64 = shard_threads().iter().map(|t| t.1).sum();
    eprintln!(
        "settled thread: {:.2}% of a core",
        (t1 - t0) as f64 / at0.elapsed().as_secs_f64()
    );
    drop(guard);
    blocked.join().unwrap().unwrap();
    let left = Instant::now();
    let mut samples = Vec::new();
    while left.elapsed() < Duration::from_secs(30) && samples.last() != Some(&(0, false)) {
        thread::sleep(ms(500));
        samples.push((shard_threads().len(), subscribed_on(&set, key, master)));
    }
    eprintln!("(threads, subscribed) every 0.5 s after the waiter left: {samples:?}");
    assert_eq!(samples.last(), Some(&(0, false)));
}

/// A common ACL recipe, `+@all -@dangerous`, denies INFO (and nothing else fencelock used on a
/// cluster before this change). The shard thread asks INFO on every connection, fails, and
/// reconnects: nothing is ever subscribed, every handoff to another client waits its backstop,
/// and the thread never ends (linger runs only on a live connection).
#[test]
fn a_user_without_info_still_hears_handoffs() {
    let _one = serial();
    let set = ClusterSet::start(3, 0);
    let mut dangerous: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .arg("dangerous")
        .query(&mut set.connection(0))
        .unwrap();
    dangerous.retain(|c| {
        [
            "info",
            "role",
            "cluster",
            "evalsha",
            "eval",
            "ssubscribe",
            "spublish",
            "subscribe",
            "publish",
            "ping",
            "hello",
        ]
        .contains(&c.as_str())
    });
    eprintln!("of the commands a client may use, @dangerous holds {dangerous:?}");
    for i in 0..3 {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locks")
            .arg("on")
            .arg(">secret")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-@dangerous")
            .query(&mut set.connection(i))
            .unwrap();
    }
    let seeds: Vec<String> = set
        .node_ports()
        .iter()
        .map(|p| format!("redis://locks:secret@127.0.0.1:{p}/"))
        .collect();
    let key = "noinfo";
    let master = set.master_of_slot(ClusterSet::slot_of(&lock_key(key)));
    let (holder, waiter) = (client(seeds.clone()), client(seeds));
    let guard = holder.lock(key).unwrap();
    let blocked = wait_for(&waiter, key, Duration::from_secs(20));
    let subscribed = poll_until(Duration::from_secs(10), ms(10), || {
        if subscribed_on(&set, key, master) {
            Ok(())
        } else {
            Err(String::new())
        }
    })
    .is_ok();
    let released = Instant::now();
    drop(guard);
    let (at, _) = blocked.join().unwrap().expect("never got the lock");
    let woken = at - released;
    // The thread after its waiter left: linger (5 s) and a heartbeat later it should be gone.
    let c0 = |set: &ClusterSet| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut set.connection(set.index_of_port(master)))
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let conns0 = c0(&set);
    let left = Instant::now();
    let _ = poll_until(Duration::from_secs(30), ms(100), || {
        match shard_threads().len() {
            0 => Ok(()),
            n => Err(format!("{n} shard threads")),
        }
    });
    let conns = c0(&set) - conns0;
    let threads = shard_threads().len();
    eprintln!(
        "subscribed: {subscribed}; woken {woken:?} after the release; {:?} after: {threads} shard \
         thread(s), {conns} connections made to the master meanwhile",
        left.elapsed()
    );
    assert!(
        woken < UNHEARD / 2,
        "woken {woken:?} after the release (subscribed: {subscribed})"
    );
    assert_eq!(threads, 0);
}
