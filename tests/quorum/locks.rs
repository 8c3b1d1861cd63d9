//! Quorum mode on five real redis-servers, without faults: a lock is a majority's grant, with
//! the same guard as on one server (token, is_held, renewal, extend, unlock), a release wakes a
//! waiter, and a guard's release reaches every master. Also the `redis+quorum://` form, and the
//! topologies that are refused.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::crossbeam_channel::TryRecvError;
use fencelock::{FencedRedis, LockClient, LockOptions, Topology};

use crate::support::fenced_workload::{Workload, WorkloadConfig};
use crate::support::quorum::Quorum;
use crate::support::{command_calls, ms, poll_until, RedisServer, NAMESPACE};

const MASTERS: usize = 5;

/// Polls (bounded) until no running master has `key`'s lock key.
fn await_released_everywhere(quorum: &Quorum, key: &str, within: Duration) {
    poll_until(within, ms(10), || match quorum.masters_holding(key) {
        left if left.is_empty() => Ok(()),
        left => Err(format!("still locked on masters {left:?}")),
    })
    .unwrap_or_else(|e| panic!("{key:?} not released on every master within {within:?}: {e}"));
}

#[test]
fn lock_is_a_majority_grant_and_unlock_frees_every_master() {
    let quorum = Quorum::start(MASTERS);
    let client = quorum.client(Duration::from_secs(30));
    let guard = client.lock("plain").unwrap();
    assert!(guard.is_held());
    assert_eq!(guard.key(), "plain");
    // The clock floor: tokens are the masters' clocks in microseconds, far above small counters.
    assert!(
        guard.token().as_u64() > 1_000_000_000_000_000,
        "{:?}",
        guard.token()
    );
    let holding = quorum.masters_holding("plain");
    assert!(
        holding.len() >= quorum.majority(),
        "the grant stands on masters {holding:?} only"
    );
    // The token is written back to a majority before the grant is reported.
    let confirmed: Vec<usize> = (0..MASTERS)
        .filter(|&i| quorum.fence(i, "plain") >= Some(guard.token().as_u64()))
        .collect();
    assert!(
        confirmed.len() >= quorum.majority(),
        "token {} stands on masters {confirmed:?} only",
        guard.token()
    );
    // Every master that has the key names one owner: the grant's.
    let owners: Vec<String> = holding
        .iter()
        .filter_map(|&i| quorum.lock_owner(i, "plain"))
        .collect();
    assert!(owners.windows(2).all(|w| w[0] == w[1]), "{owners:?}");

    guard.unlock().unwrap();
    await_released_everywhere(&quorum, "plain", Duration::from_secs(2));
    let again = client.try_lock("plain", Duration::ZERO).unwrap();
    assert!(again.is_some_and(|g| g.is_held()));
}

#[test]
fn tokens_rise_across_two_clients_and_many_threads() {
    let quorum = Quorum::start(MASTERS);
    let lease = ms(2_000);
    let clients = [quorum.client(lease), quorum.client(lease)];
    let store_server = RedisServer::start();
    let store = FencedRedis::open(store_server.url()).unwrap();
    let mut config = WorkloadConfig::new(&["a", "b", "c"], lease);
    config.long_hold = ms(20);
    let load = Workload::start(&clients, &store, &config);
    load.await_grants(0, 60, Duration::from_secs(20));
    let outcome = load.stop();
    outcome.assert_safe();
    let holds = outcome.history.holds();
    for holder_client in [0, 1] {
        assert!(
            holds.iter().any(|h| h.holder / 100 == holder_client),
            "client {holder_client} was never granted ({})",
            outcome.summary()
        );
    }
    assert!(outcome.writes.len() >= 60, "{}", outcome.summary());
    assert_eq!(outcome.lost, 0, "{}", outcome.summary());
}

#[test]
fn try_lock_gives_up_within_its_timeout_on_a_key_held_elsewhere() {
    let quorum = Quorum::start(MASTERS);
    let holder = quorum.client(Duration::from_secs(30));
    let other = quorum.client(Duration::from_secs(30));
    let _guard = holder.lock("busy").unwrap();
    for timeout in [Duration::ZERO, ms(300), ms(800)] {
        let started = Instant::now();
        let got = other.try_lock("busy", timeout).unwrap();
        let took = started.elapsed();
        assert!(got.is_none(), "granted a held key (timeout {timeout:?})");
        assert!(
            took < timeout + ms(1_000),
            "took {took:?} for a {timeout:?} timeout"
        );
    }
    // A thread of the holder's own client waits like any other.
    let started = Instant::now();
    assert!(holder.try_lock("busy", ms(300)).unwrap().is_none());
    assert!(started.elapsed() < ms(1_300), "{:?}", started.elapsed());
}

#[test]
fn a_waiter_is_woken_by_the_release_not_by_the_lease() {
    let quorum = Quorum::start(MASTERS);
    // A lease long enough that a waiter that only retried when it ran out would come far too
    // late for the bound below.
    let lease = Duration::from_secs(6);
    let holder = quorum.client(lease);
    let waiter = quorum.client(lease);
    let guard = holder.lock("wake").unwrap();
    let waiting = thread::spawn(move || {
        let got = waiter.lock("wake").map(|g| (Instant::now(), g.token()));
        (got, waiter)
    });
    // Long enough for the waiter to settle into its wait: a waiter may look again by itself at
    // growing intervals (a refusal can come from another's failed attempt, which tells
    // nobody), and by now those are longer than the bound below.
    thread::sleep(ms(3_000));
    let first = guard.token();
    let released = Instant::now();
    guard.unlock().unwrap();
    let (got, _waiter) = waiting.join().unwrap();
    let (granted, token) = got.unwrap();
    assert!(granted >= released, "granted before the release");
    let after = granted - released;
    assert!(
        after < ms(1_000),
        "the waiter got the lock {after:?} after the release (lease {lease:?})"
    );
    assert!(token > first, "{token:?} after {first:?}");
}

#[test]
fn a_waiter_attempts_again_when_told_on_its_key_s_channel() {
    let quorum = Quorum::start(MASTERS);
    // No renewal: the holder sends nothing, so every script a master runs is the waiter's.
    let lease = Duration::from_secs(10);
    let holder = quorum.client(lease);
    let waiter = quorum.client(lease);
    let _guard = holder
        .lock_with("told", &LockOptions::new().renew(false))
        .unwrap();
    let waiting = thread::spawn(move || waiter.try_lock("told", ms(5_000)).map(|g| g.is_some()));
    // Settled: subscribed on every master, and looking again by itself at intervals longer
    // than the gaps between the messages below.
    thread::sleep(ms(3_000));
    for i in 0..MASTERS {
        let patterns: i64 = redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query(&mut quorum.connection(i))
            .unwrap();
        assert!(patterns >= 1, "nobody listens for releases on master {i}");
    }
    // What a release publishes (the released owner id, a new one each time), without
    // releasing: each message must bring an attempt (to be refused) at once. A waiter deaf to
    // them looks again once at most in this time.
    let mut con = quorum.connection(0);
    for message in 0..3 {
        let before = scripts_run(&quorum, 0);
        let _: i64 = redis::cmd("PUBLISH")
            .arg(format!("{NAMESPACE}:freed:{{told}}"))
            .arg(format!("gone-owner:{message}"))
            .query(&mut con)
            .unwrap();
        poll_until(ms(250), ms(5), || match scripts_run(&quorum, 0) {
            n if n > before => Ok(()),
            _ => Err("no attempt".to_owned()),
        })
        .unwrap_or_else(|e| panic!("message {message}: {e} within 250 ms"));
        thread::sleep(ms(300));
    }
    assert!(!waiting.join().unwrap().unwrap(), "granted a held key");
}

/// Scripts master `i` ran since its last `CONFIG RESETSTAT` (EVALSHA, and EVAL after NOSCRIPT).
fn scripts_run(quorum: &Quorum, i: usize) -> u64 {
    let mut con = quorum.connection(i);
    command_calls(&mut con, "evalsha") + command_calls(&mut con, "eval")
}

#[test]
fn a_waiter_waits_for_the_release_without_polling_the_masters() {
    let quorum = Quorum::start(MASTERS);
    let lease = Duration::from_secs(6);
    let holder = quorum.client(lease);
    let waiter = quorum.client(lease);
    let _guard = holder.lock("polled").unwrap();
    for i in 0..MASTERS {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut quorum.connection(i))
            .unwrap();
    }
    let wait = ms(1_500);
    let started = Instant::now();
    assert!(waiter.try_lock("polled", wait).unwrap().is_none());
    let waited = started.elapsed();
    // What a waiter may send while the lock stays held: its first attempt, one per wake-up as
    // its subscriptions come up (each may have missed a release), its undos, and the holder's
    // renewals (one round a third of a lease). A waiter that attempts again at once after
    // every refusal sends hundreds in this time.
    let most = 40;
    let per_master: Vec<u64> = (0..MASTERS).map(|i| scripts_run(&quorum, i)).collect();
    assert!(
        per_master.iter().all(|&n| n <= most),
        "scripts run per master while one waiter waited {waited:?} for a held lock: \
         {per_master:?} (at most {most} expected)"
    );
}

#[test]
fn renewal_keeps_a_lock_held_for_many_leases() {
    let quorum = Quorum::start(MASTERS);
    let lease = ms(600);
    let holder = quorum.client(lease);
    let other = quorum.client(lease);
    let guard = holder.lock("renewed").unwrap();
    let until = Instant::now() + lease * 4;
    let mut checks = 0;
    while Instant::now() < until && checks < 1_000 {
        assert!(guard.is_held(), "lost after {checks} checks");
        assert_eq!(
            guard.lost().try_recv(),
            Err(TryRecvError::Empty),
            "lost() fired on a renewed lock"
        );
        checks += 1;
        thread::sleep(ms(20));
    }
    // Past four leases, the masters still have it, and nobody else can take it.
    let holding = quorum.masters_holding("renewed");
    assert!(holding.len() >= quorum.majority(), "{holding:?}");
    assert!(other.try_lock("renewed", Duration::ZERO).unwrap().is_none());
    assert!(guard.is_held());
    guard.unlock().unwrap();
}

#[test]
fn extend_lengthens_a_lease_without_renewal() {
    let quorum = Quorum::start(MASTERS);
    let lease = ms(400);
    let holder = quorum.client(lease);
    let other = quorum.client(lease);
    let once = LockOptions::new().renew(false);
    let extended = holder.lock_with("extended", &once).unwrap();
    // A second lock without the extend: it must run out, or the extend shows nothing.
    let plain = holder.lock_with("plain", &once).unwrap();
    quorum.note_lease(ms(3_000));
    extended.extend(ms(3_000)).unwrap();
    thread::sleep(lease * 2);

    assert!(
        !plain.is_held(),
        "a lock without renewal outlived its lease"
    );
    assert!(extended.is_held(), "the extended lock was lost");
    let long: Vec<usize> = (0..MASTERS)
        .filter(|&i| quorum.lock_pttl(i, "extended") > 1_000)
        .collect();
    assert!(
        long.len() >= quorum.majority(),
        "the extended lease runs on masters {long:?} only"
    );
    assert!(other
        .try_lock("extended", Duration::ZERO)
        .unwrap()
        .is_none());
    assert!(other.try_lock("plain", Duration::ZERO).unwrap().is_some());
    extended.unlock().unwrap();
}

#[test]
fn a_dropped_guard_releases_on_every_master() {
    let quorum = Quorum::start(MASTERS);
    // A lease far longer than the test: only a release can free the key.
    let client = quorum.client(Duration::from_secs(60));
    let other = quorum.client(Duration::from_secs(60));
    let guard = client.lock("dropped").unwrap();
    assert!(!quorum.masters_holding("dropped").is_empty());
    drop(guard);
    await_released_everywhere(&quorum, "dropped", Duration::from_secs(2));
    assert!(other.try_lock("dropped", Duration::ZERO).unwrap().is_some());
}

#[test]
fn the_redis_quorum_url_form_locks_on_those_masters() {
    let quorum = Quorum::start(MASTERS);
    let url = quorum.url();
    assert!(url.starts_with("redis+quorum://127.0.0.1:"), "{url}");
    let client = LockClient::builder(url.as_str())
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let guard = client.lock("by-url").unwrap();
    let holding = quorum.masters_holding("by-url");
    assert!(holding.len() >= quorum.majority(), "{holding:?}");
    // It contends with a client made from the list of URLs.
    let listed = quorum.client(Duration::from_secs(30));
    assert!(listed.try_lock("by-url", Duration::ZERO).unwrap().is_none());
    guard.unlock().unwrap();
    assert!(listed.try_lock("by-url", Duration::ZERO).unwrap().is_some());
}

#[test]
fn too_few_masters_or_one_named_twice_is_an_invalid_argument() {
    // No server needed: the topology is checked when the client is built.
    let a = "redis://127.0.0.1:7001";
    let b = "redis://127.0.0.1:7002";
    let refused = [
        ("two masters", Topology::quorum([a, b])),
        ("one master named twice", Topology::quorum([a, b, a])),
        (
            "the same master with and without its default database",
            Topology::quorum([
                "redis://127.0.0.1:7001",
                b,
                "redis://127.0.0.1:7001/0",
                "redis://127.0.0.1:7003",
            ]),
        ),
    ];
    for (what, topology) in refused {
        match LockClient::builder(topology).build() {
            Ok(_) => panic!("{what}: built"),
            Err(e) => assert!(e.is_invalid_argument(), "{what}: {e:?}"),
        }
    }
    for url in [
        "redis+quorum://127.0.0.1:7001,127.0.0.1:7002",
        "redis+quorum://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7001",
    ] {
        match LockClient::builder(url).build() {
            Ok(_) => panic!("{url}: built"),
            Err(e) => assert!(e.is_invalid_argument(), "{url}: {e:?}"),
        }
        match url.parse::<Topology>() {
            Ok(_) => panic!("{url}: parsed"),
            Err(e) => assert!(e.is_invalid_argument(), "{url}: {e:?}"),
        }
    }
    // Three distinct masters are a quorum (connections are made lazily).
    LockClient::builder(Topology::quorum([a, b, "redis://127.0.0.1:7003"]))
        .build()
        .unwrap();
}
