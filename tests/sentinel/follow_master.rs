//! A client pointed at Redis Sentinel finds the master, follows it through failovers without
//! being rebuilt, keeps held locks renewing or reports them lost, and its tokens keep rising.
//! Every set-up is real: a master, replicas and three `redis-server --sentinel` processes.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Error, LockClient, Topology};

use crate::support;
use crate::support::proxy::{Mode, Proxy};
use crate::support::sentinel::{SentinelSet, MASTER_NAME};
use crate::support::workload::Workload;
use crate::support::{command_calls, ms};

/// The settings docs/design.md recommends for locks on Sentinel: a master without a fresh
/// replica refuses writes, so a demoted master that comes back cannot grant.
const RECOMMENDED: &[&str] = &[
    "--min-replicas-to-write",
    "1",
    "--min-replicas-max-lag",
    "1",
];

fn client(set: &SentinelSet, lease_ms: u64) -> LockClient {
    LockClient::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .namespace("sentinel")
        .lease(ms(lease_ms))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

#[test]
fn finds_the_master_with_sentinels_dead_and_errs_without_any() {
    let mut set = SentinelSet::start(1);
    // A sentinel that is not there, first in the list: it costs one refused connection.
    let dead = format!("redis://127.0.0.1:{}", support::free_port());
    let mut urls = vec![dead];
    urls.extend(set.sentinel_urls());
    let client = LockClient::builder(Topology::sentinel(urls, MASTER_NAME))
        .connection_timeout(ms(1000))
        .build()
        .unwrap();
    let guard = client.lock("a").unwrap();
    assert!(guard.is_held());
    drop(guard);

    // A master name no sentinel knows: a set-up error, not an outage (all of them answered).
    let unknown = LockClient::builder(Topology::sentinel(set.sentinel_urls(), "nosuch"))
        .build()
        .unwrap();
    let err = unknown.lock("d").unwrap_err();
    assert!(err.is_rejected(), "{err}");
    assert!(err.to_string().contains("nosuch"), "{err}");

    // A frozen sentinel first in the list costs a short grace once the others have answered,
    // not its share of the connection timeout.
    set.pause_sentinel(0);
    let past_frozen = client_with(&set.sentinel_urls(), ms(3000));
    let started = Instant::now();
    assert!(past_frozen.lock("g").unwrap().is_held());
    assert!(
        started.elapsed() < ms(1500),
        "a frozen sentinel held up discovery for {:?}",
        started.elapsed()
    );
    set.resume_sentinel(0);

    // Two of three dead: a new client still finds the master.
    set.kill_sentinel(0);
    set.kill_sentinel(1);
    let again = client_with(&set.sentinel_urls(), ms(1000));
    assert!(again.lock("b").unwrap().is_held());

    // A frozen sentinel costs at most the connection timeout.
    set.pause_sentinel(2);
    let frozen = client_with(&set.sentinel_urls(), ms(300));
    let started = Instant::now();
    let err = frozen.try_lock("c", ms(2000)).unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert!(started.elapsed() < ms(1500), "took {:?}", started.elapsed());
    // A caller's own timeout holds while another thread of its client asks the frozen
    // sentinel for longer.
    let patient = Arc::new(client_with(&set.sentinel_urls(), ms(3000)));
    let asking = {
        let patient = Arc::clone(&patient);
        thread::spawn(move || patient.lock("h").map(drop))
    };
    thread::sleep(ms(200));
    let started = Instant::now();
    let err = patient.try_lock("i", ms(300)).unwrap_err();
    assert!(
        started.elapsed() < ms(1500),
        "try_lock(300 ms) waited {:?} behind another thread's discovery: {err}",
        started.elapsed()
    );
    assert!(asking.join().unwrap().unwrap_err().is_connection());
    set.resume_sentinel(2);

    // All dead: a connection error that says so, within the connection timeout.
    set.kill_sentinel(2);
    let none = client_with(&set.sentinel_urls(), ms(500));
    let started = Instant::now();
    let err = none.lock("e").unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert!(err.to_string().contains("no sentinel"), "{err}");
    assert!(started.elapsed() < ms(2000), "took {:?}", started.elapsed());
    // The client that found the master before keeps working without the sentinels.
    assert!(client.lock("f").unwrap().is_held());
}

fn client_with(urls: &[String], connection_timeout: Duration) -> LockClient {
    LockClient::builder(Topology::sentinel(urls, MASTER_NAME))
        .connection_timeout(connection_timeout)
        .build()
        .unwrap()
}

#[test]
fn the_url_form_reaches_the_same_master() {
    let set = SentinelSet::start(1);
    let hosts: Vec<String> = set
        .sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","));
    let by_url = LockClient::builder(url.as_str())
        .namespace("sentinel")
        .build()
        .unwrap();
    let by_hand = client(&set, 10_000);
    let guard = by_url.lock("shared").unwrap();
    assert!(by_hand.try_lock("shared", ms(100)).unwrap().is_none());
    drop(guard);
    assert!(by_hand.try_lock("shared", ms(2000)).unwrap().is_some());
    // A fenced store opens on the same topology.
    let store = fencelock::FencedRedis::builder(url.parse::<Topology>().unwrap())
        .namespace("sentinel")
        .build()
        .unwrap();
    let guard = by_url.lock("shared").unwrap();
    store.set("r", guard.token(), "v").unwrap();
    assert_eq!(store.get("r").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_coordinated_failover_under_load_keeps_granting_exclusively() {
    let set = SentinelSet::start_with(2, RECOMMENDED);
    // One client as recommended, with grants and renewals acknowledged by a replica.
    let acked = LockClient::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .namespace("sentinel")
        .lease(ms(3000))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .min_replica_acks(1, ms(200))
        .build()
        .unwrap();
    let clients = [acked, client(&set, 3000)];
    // A lock held across the failover: it keeps renewing, or is reported lost; never both.
    let long = clients[0].lock("long").unwrap();
    let long_token = long.token();
    let workload = Workload::start(&clients, 3, 6);
    workload.await_grants(&[0, 0], 20, Duration::from_secs(20));
    let before = workload.grants();
    let old = set.master_port();
    let new = set.failover();
    assert_ne!(old, new);
    workload.await_grants(&before, 20, Duration::from_secs(30));
    let history = workload.stop();
    let checked = history
        .check()
        .unwrap_or_else(|e| panic!("{e}\n{}", set.logs()));
    assert!(checked > 40, "{checked}");
    match long.lost().try_recv() {
        // Lost: then it must say so.
        Ok(_) => assert!(!long.is_held()),
        Err(_) => {
            assert!(long.is_held(), "neither held nor reported lost");
            // Renewed on the new master: the key is there, owned by this guard. Right after the
            // switch the new master may still wait for a replica, and refuse the release with
            // NOREPLICAS (the recommended min-replicas-to-write): then the lease frees it.
            if let Err(e) = long.unlock() {
                assert!(e.to_string().contains("NOREPLICAS"), "{e}");
            }
        }
    }
    let next = clients[1].lock("long").unwrap();
    assert!(next.token() > long_token);
}

#[test]
fn a_frozen_master_is_left_behind_and_not_used_when_it_resumes() {
    // No min-replicas-to-write here: the old master takes writes for a while after it resumes,
    // and only the clients' following keeps them off it.
    let mut set = SentinelSet::start(1);
    let early = [client(&set, 4000), client(&set, 4000)];
    let warm = Workload::start(&early, 2, 4);
    warm.await_grants(&[0, 0], 10, Duration::from_secs(20));
    let history = warm.stop();
    history.check().unwrap();
    let old = set.master_port();
    let old_index = set.master_index();
    set.servers()[old_index].pause();
    let new = set.wait_for_switch(old, Duration::from_secs(20));
    set.server_mut(old_index).resume();
    // For about ten seconds the resumed master still says it is one and takes writes. A
    // client learns of the failover from its sentinel, so once every sentinel names the new
    // master, and each client's watcher has asked (twice a second), no client may use the old
    // one any more.
    await_every_sentinel_names(&set, new, Duration::from_secs(10));
    thread::sleep(ms(1500));
    let mut old_con = set.servers()[old_index].connection();
    let scripts_before = command_calls(&mut old_con, "evalsha");
    // A client built now can only find the new master.
    let late = client(&set, 4000);
    let clients = [early[0].clone(), early[1].clone(), late];
    let workload = Workload::start(&clients, 2, 4);
    let since = workload.grants();
    workload.await_grants(&since, 20, Duration::from_secs(20));
    let history = workload.stop();
    let scripts_after = command_calls(&mut old_con, "evalsha");
    history
        .check()
        .unwrap_or_else(|e| panic!("master {old} -> {new}: {e}\n{}", set.logs()));
    assert_eq!(
        scripts_after, scripts_before,
        "clients kept running scripts on the old master {old}"
    );
}

/// Until every live sentinel names `port` as the master.
fn await_every_sentinel_names(set: &SentinelSet, port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let named: Vec<Option<u16>> = set
            .sentinel_ports()
            .iter()
            .map(|p| {
                let client = redis::Client::open(format!("redis://127.0.0.1:{p}/")).ok()?;
                let mut con = client.get_connection_with_timeout(ms(500)).ok()?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER_NAME)
                    .query::<Option<(String, u16)>>(&mut con)
                    .ok()
                    .flatten()
                    .map(|(_, port)| port)
            })
            .collect();
        if named.iter().all(|n| *n == Some(port)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sentinels name {named:?}, not {port}\n{}",
            set.logs()
        );
        thread::sleep(ms(50));
    }
}

#[test]
fn tokens_rise_through_a_failover_that_lost_the_grants() {
    let mut set = SentinelSet::start(1);
    let client = client(&set, 10_000);
    let old_index = set.master_index();
    let old = set.master_port();
    let replica = 1 - old_index;
    // The replica replicates through a proxy, which is then cut: what follows is granted on the
    // master only. (Pausing the replica instead would not do: what the master sent waits in
    // the replica's socket buffer and is applied when it resumes.) Sentinel points a replica
    // of the wrong address back at the master only a failover timeout (5 s) later.
    let link = Proxy::start(old);
    let mut replica_con = set.servers()[replica].connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(link.port())
        .query(&mut replica_con)
        .unwrap();
    let mut master_con = set.servers()[old_index].connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis::cmd("WAIT")
        .arg(1)
        .arg(100)
        .query::<i64>(&mut master_con)
        .unwrap()
        < 1
    {
        assert!(
            Instant::now() < deadline,
            "the replica never synced through the proxy"
        );
    }
    link.set_mode(Mode::Blackhole);
    let guard = client.lock("lossy").unwrap();
    let lost_token = guard.token();
    let lost = guard.lost().clone();
    set.server_mut(old_index).kill();
    set.wait_for_switch(old, Duration::from_secs(30));
    // The new master never had the grant: the holder hears so from its renewal.
    lost.recv_timeout(Duration::from_secs(15))
        .expect("a lock the new master never had is reported lost");
    assert!(!guard.is_held());
    drop(guard);
    let next = client.lock("lossy").unwrap();
    assert!(
        next.token() > lost_token,
        "{} after {}",
        next.token(),
        lost_token
    );
}

#[test]
fn a_client_built_while_the_master_is_down_answers_within_its_timeouts() {
    let mut set = SentinelSet::start(1);
    let old = set.master_port();
    let old_index = set.master_index();
    set.server_mut(old_index).kill();
    let client = client(&set, 5000);
    // Until Sentinel promotes the replica, calls fail or time out: never hang.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let started = Instant::now();
        let outcome = client.try_lock("x", ms(300));
        assert!(
            started.elapsed() < ms(2500),
            "try_lock(300 ms) took {:?}: {outcome:?}",
            started.elapsed()
        );
        match outcome {
            Ok(Some(guard)) => {
                assert!(guard.is_held());
                break;
            }
            Ok(None) | Err(Error::Connection(_) | Error::Timeout(_)) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            Instant::now() < deadline,
            "never granted after the failover"
        );
        thread::sleep(ms(50));
    }
    // Granted on the promoted replica: the sentinels have moved off the old master.
    set.wait_for_switch(old, Duration::from_secs(10));
}

/// A client with the default connection and response timeouts (5 s), as a user builds one.
fn default_client(set: &SentinelSet) -> LockClient {
    LockClient::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .namespace("sentinel")
        .lease(ms(4000))
        .build()
        .unwrap()
}

#[test]
fn a_try_lock_after_a_frozen_master_was_replaced_is_granted_on_the_new_one() {
    let mut set = SentinelSet::start(1);
    let clients = [default_client(&set), default_client(&set)];
    // Clients that worked before the freeze, and go on working through it.
    let workload = Workload::start(&clients, 2, 4);
    workload.await_grants(&[0, 0], 10, Duration::from_secs(20));
    let old = set.master_port();
    let old_index = set.master_index();
    set.servers()[old_index].pause();
    let new = set.wait_for_switch(old, Duration::from_secs(30));
    await_every_sentinel_names(&set, new, Duration::from_secs(10));
    let started = Instant::now();
    let outcome = clients[0].try_lock("after", Duration::from_secs(20));
    let took = started.elapsed();
    set.server_mut(old_index).resume();
    let history = workload.stop();
    history.check().unwrap();
    match outcome {
        Ok(Some(guard)) => {
            assert!(guard.is_held());
            println!("granted on {new} after {took:?}");
        }
        other => panic!(
            "try_lock(20 s) after the failover to {new}: {other:?} after {took:?}\n{}",
            set.logs()
        ),
    }
}

#[test]
fn a_try_lock_that_meets_a_frozen_master_is_granted_on_the_one_that_replaces_it() {
    let mut set = SentinelSet::start(1);
    let client = client(&set, 4000);
    client.lock("frozen").unwrap().unlock().unwrap();
    let old = set.master_port();
    let old_index = set.master_index();
    set.servers()[old_index].pause();
    let started = Instant::now();
    // `lock` without a deadline rides the failover too.
    let locking = {
        let client = client.clone();
        thread::spawn(move || client.lock("frozen-too").map(|guard| guard.is_held()))
    };
    // Sent to the frozen master: its reply never comes within the response timeout (1 s),
    // and the sentinels promote the replica about 3 s after the freeze.
    let outcome = client.try_lock("frozen", Duration::from_secs(20));
    let took = started.elapsed();
    let new = set.wait_for_switch(old, Duration::from_secs(10));
    let locked = locking.join().unwrap();
    set.server_mut(old_index).resume();
    assert!(
        matches!(locked, Ok(true)),
        "lock() through the failover: {locked:?}"
    );
    match outcome {
        Ok(Some(guard)) => {
            assert!(guard.is_held());
            assert!(took < Duration::from_secs(20), "{took:?}");
            println!("granted on {new} {took:?} after the freeze of {old}");
        }
        other => panic!(
            "try_lock(20 s) through the failover {old} -> {new}: {other:?} after {took:?}\n{}",
            set.logs()
        ),
    }
}

/// With the recommended `min-replicas-to-write 1` and one replica, the new master refuses writes
/// (NOREPLICAS) until the old master, reconfigured as its replica, has synced: a passing state,
/// which a `try_lock` with time left waits out. The time printed is what one replica costs.
#[test]
fn a_try_lock_waits_out_noreplicas_after_a_failover_with_one_replica() {
    let set = SentinelSet::start_with(1, RECOMMENDED);
    let client = client(&set, 4000);
    client.lock("warm").unwrap().unlock().unwrap();
    let new = set.failover();
    let started = Instant::now();
    let outcome = client.try_lock("after", Duration::from_secs(40));
    let took = started.elapsed();
    match outcome {
        Ok(Some(guard)) => {
            assert!(guard.is_held());
            println!("granted {took:?} after the sentinels named {new}");
        }
        other => panic!(
            "try_lock(40 s) after the failover to {new}: {other:?} after {took:?}\n{}",
            set.logs()
        ),
    }
}

/// A master that no replica can replace: a `try_lock` goes on asking the sentinels until its
/// deadline, and then fails with the connection error, no later than the deadline and one
/// connection attempt.
#[test]
fn a_try_lock_on_a_dead_master_that_nothing_replaces_ends_at_its_deadline() {
    let mut set = SentinelSet::start(0);
    let client = client(&set, 4000);
    client.lock("dead").unwrap().unlock().unwrap();
    let index = set.master_index();
    set.server_mut(index).kill();
    let started = Instant::now();
    let outcome = client.try_lock("dead", ms(3000));
    let took = started.elapsed();
    let e = outcome.expect_err("granted by a dead master");
    assert!(e.is_connection(), "{e:?}");
    // It kept looking (the last pause before the deadline is at most 1 s) ...
    assert!(took >= ms(1900), "gave up after {took:?}: {e}");
    // ... and stopped at the deadline: 3 s, plus a connection attempt (1 s), plus slack.
    assert!(took < ms(5500), "took {took:?}: {e}");
}

/// With the master and every sentinel dead, nothing can name another master: `lock()` gives up
/// after asking the sentinels once (a connection timeout), not after its failover patience.
#[test]
fn a_lock_with_every_sentinel_and_the_master_dead_fails_without_riding() {
    let mut set = SentinelSet::start(0);
    let client = client(&set, 4000);
    client.lock("dead").unwrap().unlock().unwrap();
    let index = set.master_index();
    for i in 0..set.sentinel_urls().len() {
        set.kill_sentinel(i);
    }
    set.server_mut(index).kill();
    for call in ["try_lock", "lock"] {
        let started = Instant::now();
        let outcome = match call {
            "try_lock" => client.try_lock("dead", ms(20_000)).map(|_| ()),
            _ => client.lock("dead").map(|_| ()),
        };
        let took = started.elapsed();
        let e = outcome.expect_err("granted by a dead master");
        println!("{call}: {e} after {took:?}");
        assert!(e.is_connection(), "{call}: {e:?}");
        // A connection attempt to the dead master, one question to the dead sentinels (1 s
        // connection timeout each), and slack; riding would take 20 s or 60 s.
        assert!(took < ms(8_000), "{call} took {took:?}: {e}");
    }
}
