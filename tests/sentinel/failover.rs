//! Tokens never go backwards across an empty restart or a failover that lost writes, and with
//! replica acknowledgement an unreplicated grant is never reported held.
//!
//! Each failover test runs a real master and replica, with the replication link through the test
//! support's TCP proxy so that it can be cut while the master keeps acknowledging writes.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, LockOptions};

use crate::support;
use crate::support::proxy::{Mode, Proxy};
use crate::support::{lock_client, ms, RedisServer};

fn incr(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("INCR").arg(key).query(con).unwrap()
}

/// A master, a proxy in front of it, and a replica that replicates through the proxy.
struct Pair {
    master: RedisServer,
    link: Proxy,
    replica: RedisServer,
}

impl Pair {
    fn start() -> Pair {
        let master = RedisServer::start();
        let link = Proxy::start(master.port());
        let port = link.port().to_string();
        let replica = RedisServer::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--repl-diskless-sync-delay",
            "0",
        ]);
        let pair = Pair {
            master,
            link,
            replica,
        };
        pair.await_replicated();
        pair
    }

    /// Until the master has heard the replica acknowledge everything the master has (what a
    /// client's `WAIT` waits for), seen in `INFO replication`.
    fn await_acked(&self) {
        let mut con = self.master.connection();
        let acked = support::poll_until(Duration::from_secs(10), ms(10), || {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            let master = info
                .lines()
                .find_map(|l| l.strip_prefix("master_repl_offset:"))
                .and_then(|v| v.trim().parse::<i64>().ok());
            // "slave0:ip=127.0.0.1,port=...,state=online,offset=N,lag=0"
            let replica = info
                .lines()
                .find_map(|l| l.strip_prefix("slave0:"))
                .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("offset=")))
                .and_then(|v| v.trim().parse::<i64>().ok());
            match (master, replica) {
                (Some(master), Some(replica)) if replica >= master => Ok(()),
                other => Err(format!("offsets (master, replica acked): {other:?}")),
            }
        });
        if let Err(why) = acked {
            panic!("the replica never acknowledged the master's writes: {why}");
        }
    }

    /// Until the replica acknowledges everything the master has.
    fn await_replicated(&self) {
        let mut con = self.master.connection();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let acked: i64 = redis::cmd("WAIT").arg(1).arg(200).query(&mut con).unwrap();
            if acked >= 1 {
                return;
            }
            assert!(Instant::now() < deadline, "replica never caught up");
            thread::sleep(ms(50));
        }
    }
}

#[test]
fn tokens_increase_across_an_empty_restart() {
    let mut server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let before: Vec<u64> = (0..5)
        .map(|_| {
            let guard = client.lock("k").unwrap();
            guard.token().as_u64()
        })
        .collect();
    let mut con = server.connection();
    (0..5).for_each(|_| {
        incr(&mut con, "canary");
    });

    server.restart();

    // The canary: a plain counter starts over, so tokens built on one alone would repeat.
    let mut con = server.connection();
    assert_eq!(incr(&mut con, "canary"), 1, "the restart was not empty");
    let after = client.lock("k").unwrap().token().as_u64();
    let highest = *before.iter().max().unwrap();
    assert!(
        after > highest,
        "token {after} after restart, {highest} before"
    );
}

#[test]
fn tokens_and_held_locks_survive_a_restart_with_aof() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let client = lock_client(&server, 2_000);
    let rival = lock_client(&server, 2_000);
    let held = client.lock("durable").unwrap();
    server.kill();
    server.restart();
    // The lock key came back with the data; renewal reconnects and keeps it.
    thread::sleep(ms(1_500));
    assert!(held.is_held(), "renewal did not resume after the restart");
    assert!(rival.try_lock("durable", Duration::ZERO).unwrap().is_none());
    let token = held.token();
    held.unlock().unwrap();
    let next = rival.lock("durable").unwrap();
    assert!(next.token() > token);
}

#[test]
fn a_failover_that_loses_writes_does_not_turn_tokens_back() {
    let pair = Pair::start();
    let client = lock_client(&pair.master, 30_000);
    for _ in 0..3 {
        drop(client.lock("k").unwrap());
    }
    let mut master = pair.master.connection();
    incr(&mut master, "canary");
    pair.await_replicated();

    // Cut the link: the master keeps acknowledging grants and increments that never reach the
    // replica.
    pair.link.set_mode(Mode::Blackhole);
    let lost: Vec<u64> = (0..3)
        .map(|_| client.lock("k").unwrap().token().as_u64())
        .collect();
    let canary_before = (0..3).map(|_| incr(&mut master, "canary")).max().unwrap();

    // The master dies; its replica takes over.
    drop(master);
    drop(client);
    let Pair {
        mut master,
        replica,
        link,
    } = pair;
    master.kill();
    drop(link);
    let mut promoted = replica.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut promoted)
        .unwrap();

    // (a) The canary: a plain counter hands out a value it already handed out.
    let canary_after = incr(&mut promoted, "canary");
    assert!(
        canary_after <= canary_before,
        "the failover lost nothing ({canary_after} > {canary_before}): the test proves nothing"
    );

    // (b) fencelock's tokens keep increasing all the same.
    let client = lock_client(&replica, 30_000);
    let token = client.lock("k").unwrap().token().as_u64();
    let highest = *lost.iter().max().unwrap();
    assert!(
        token > highest,
        "token {token} after failover, {highest} before"
    );
}

#[test]
fn with_replica_acks_an_unreplicated_grant_is_never_reported_held() {
    let pair = Pair::start();
    let client = LockClient::builder(pair.master.url())
        .namespace(support::NAMESPACE)
        .lease(ms(30_000))
        // Long enough for a replica on a busy machine to acknowledge while the link is up.
        .min_replica_acks(1, ms(1_000))
        .build()
        .unwrap();

    // With the link up, grants are acknowledged and held.
    let guard = client.lock("acked").unwrap();
    assert!(guard.is_held());
    guard.unlock().unwrap();

    pair.link.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let err = client.lock("acked").unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    assert!(
        started.elapsed() >= ms(1_000),
        "did not wait for the replica"
    );
    let err = client.try_lock("acked", Duration::ZERO).unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    // The unacknowledged grant was given back, not left to expire.
    let mut master = pair.master.connection();
    let left: bool = redis::cmd("EXISTS")
        .arg("test:lock:{acked}")
        .query(&mut master)
        .unwrap();
    assert!(!left, "an unreplicated grant was left behind on the master");
}

#[test]
fn bad_replica_ack_settings_are_rejected() {
    let build = |replicas, timeout| {
        LockClient::builder("redis://127.0.0.1:1/")
            .min_replica_acks(replicas, timeout)
            .build()
            .map(drop)
    };
    assert!(build(0, ms(100)).unwrap_err().is_invalid_argument());
    assert!(build(1, Duration::ZERO).unwrap_err().is_invalid_argument());
    assert!(build(1, ms(5_000)).unwrap_err().is_invalid_argument());
    assert!(build(1, ms(100)).is_ok());
}

#[test]
fn a_client_pointed_at_a_replica_gets_readonly_not_a_refusal() {
    let pair = Pair::start();
    let client = lock_client(&pair.replica, 30_000);
    let err = client.try_lock("ro", Duration::ZERO).unwrap_err();
    assert_eq!(err.redis_code(), Some("READONLY"), "{err:?}");
    let err = client.try_lock("ro", ms(200)).unwrap_err();
    assert_eq!(err.redis_code(), Some("READONLY"), "{err:?}");
}

/// A lock handed over by a release was written by the releaser on another connection; the
/// waiter's replica check must still cover it (WAIT counts only its own connection's writes).
#[test]
fn with_replica_acks_an_unreplicated_handoff_is_never_reported_held() {
    let pair = Pair::start();
    let holder = lock_client(&pair.master, 30_000);
    let waiter = LockClient::builder(pair.master.url())
        .namespace(support::NAMESPACE)
        .lease(ms(30_000))
        .min_replica_acks(1, ms(1_000))
        .build()
        .unwrap();
    let guard = holder.lock("handed").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        tx.send(()).unwrap();
        waiter.lock("handed").map(|g| g.token())
    });
    rx.recv().unwrap();
    // Let the waiter queue (its refused attempt is acknowledged), then cut the link.
    support::await_queue_len(&mut pair.master.connection(), "handed", 1);
    pair.await_acked();
    pair.link.set_mode(Mode::Blackhole);
    guard.unlock().unwrap();
    let outcome = t.join().unwrap();
    let err = outcome.expect_err("an unreplicated handoff was reported held");
    assert!(err.is_not_replicated(), "{err:?}");
    let mut master = pair.master.connection();
    let left: bool = redis::cmd("EXISTS")
        .arg("test:lock:{handed}")
        .query(&mut master)
        .unwrap();
    assert!(
        !left,
        "an unreplicated handoff was left behind on the master"
    );
}

/// A renewal re-arms the lease on the master at once, but a failover brings back the lease as the
/// replica had it. With replica acknowledgement, a renewal the replica did not acknowledge does
/// not count: the guard turns not held by the deadline the replica knows, so no client can take
/// the lock on a promoted replica while the guard still says held.
#[test]
fn with_replica_acks_an_unreplicated_renewal_never_keeps_a_guard_held() {
    const LEASE: Duration = Duration::from_millis(1500);
    let pair = Pair::start();
    let client = LockClient::builder(pair.master.url())
        .namespace(support::NAMESPACE)
        .lease(LEASE)
        .min_replica_acks(1, ms(200))
        .build()
        .unwrap();
    let guard = client.lock("renewed").unwrap();
    // With the link up, acknowledged renewals keep it held past its first lease.
    thread::sleep(LEASE + ms(500));
    assert!(guard.is_held(), "acknowledged renewals did not keep it");

    pair.link.set_mode(Mode::Blackhole);
    let err = guard.extend(LEASE * 4).unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    assert!(guard.is_held(), "an unacknowledged extend cut the lease");
    // Renewals from now on go on new connections, which have written nothing before: from
    // Redis 7.2, a WAIT behind an extend that wrote nothing would count the stalled replica.
    let mut admin = pair.master.connection();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut admin)
        .unwrap();

    // Promote the replica once the lease it knows is over (renewals since the cut reached only
    // the master, which still has the lock), and take the lock there.
    thread::sleep(LEASE + ms(200));
    let mut replica = pair.replica.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica)
        .unwrap();
    let other = lock_client(&pair.replica, 30_000);
    let taken = other
        .try_lock("renewed", ms(3_000))
        .unwrap()
        .expect("the lock was not free on the promoted replica");
    assert!(
        !guard.is_held(),
        "the guard says held while another client holds the lock (token {} on the promoted \
         replica)",
        taken.token()
    );
    assert!(
        guard.lost().try_recv().is_ok(),
        "the loss was not signalled"
    );
    // The master still has it: it was renewed there all along.
    let mut master = pair.master.connection();
    assert!(support::lock_exists(&mut master, "renewed"));
}

/// An extend whose deadline is nearer than the WAIT timeout: too few acknowledgements in the time
/// left, not a connection that timed out (and was dropped).
#[test]
fn with_replica_acks_an_extend_near_its_deadline_is_not_replicated_not_timed_out() {
    let pair = Pair::start();
    let client = LockClient::builder(pair.master.url())
        .namespace(support::NAMESPACE)
        .lease(ms(1500))
        .response_timeout(ms(1000))
        .min_replica_acks(1, ms(800))
        .build()
        .unwrap();
    // Granted once the replica acknowledged it: a busy machine may miss the 800 ms for that
    // (the grant is then refused as not replicated), so on a fresh key until one is.
    let guard = (0..10)
        .find_map(|n| {
            match client.lock_with(&format!("near-{n}"), &LockOptions::new().renew(false)) {
                Ok(guard) => Some(guard),
                Err(e) if e.is_not_replicated() => None,
                Err(e) => panic!("{e:?}"),
            }
        })
        .expect("no replicated grant in 10 tries with the link up");
    pair.link.set_mode(Mode::Blackhole);
    thread::sleep(ms(1000));
    let err = guard.extend(ms(1500)).unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
}

/// A WAIT the server refuses (here an ACL without it; a master demoted under a blocked WAIT
/// answers UNBLOCKED) counts no replica: the extend is unconfirmed, the lock still held.
#[test]
fn with_replica_acks_a_refused_wait_does_not_lose_the_lock() {
    let pair = Pair::start();
    let client = LockClient::builder(pair.master.url())
        .namespace(support::NAMESPACE)
        .lease(ms(30_000))
        // With the link up, the grant's acknowledgement may take a while on a busy machine; the
        // refused WAIT below is answered at once.
        .min_replica_acks(1, ms(1_000))
        .build()
        .unwrap();
    let guard = client.lock("refused").unwrap();
    let mut admin = pair.master.connection();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-wait")
        .query(&mut admin)
        .unwrap();
    let err = guard.extend(ms(60_000)).unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    assert!(
        guard.is_held(),
        "a refused WAIT lost a lock the master still has"
    );
}

// Fenced storage (`FencedRedis`) across a failover.

fn t(n: u64) -> fencelock::FencingToken {
    fencelock::FencingToken::from(n)
}

/// A store on `server` in the test namespace, with `acks` replicas to wait for (1 s each).
fn store(server: &RedisServer, acks: Option<u32>) -> fencelock::FencedRedis {
    let builder = fencelock::FencedRedis::builder(server.url()).namespace(support::NAMESPACE);
    match acks {
        // Long enough for a replica on a busy machine to acknowledge while the link is up.
        Some(n) => builder.min_replica_acks(n, ms(1_000)),
        None => builder,
    }
    .build()
    .unwrap()
}

fn text(store: &fencelock::FencedRedis, resource: &str) -> Option<String> {
    store
        .get(resource)
        .unwrap()
        .map(|bytes| String::from_utf8(bytes).unwrap())
}

/// The master dies and its replica, cut off since the link was blackholed, is promoted.
fn fail_over(pair: Pair) -> RedisServer {
    let Pair {
        mut master,
        replica,
        link,
    } = pair;
    master.kill();
    drop(link);
    let mut promoted = replica.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut promoted)
        .unwrap();
    replica
}

/// With the replication link cut, every kind of write is reported not replicated, never
/// accepted; without replica acknowledgement the same write is reported accepted.
#[test]
fn with_replica_acks_an_unreplicated_fenced_write_is_never_reported_accepted() {
    let pair = Pair::start();
    let acked = store(&pair.master, Some(1));
    let plain = store(&pair.master, None);

    // With the link up, writes are acknowledged and accepted.
    acked.set("doc", t(5), "five").unwrap();
    assert_eq!(acked.incr_by("count", t(5), 1).unwrap(), 1);

    pair.link.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let not_replicated = |what: &str, result: fencelock::Result<String>| match result {
        Err(fencelock::Error::NotReplicated { acked, required }) => {
            assert_eq!((acked, required), (0, 1), "{what}");
        }
        other => panic!("{what}: expected NotReplicated, got {other:?}"),
    };
    not_replicated(
        "set",
        acked.set("doc", t(6), "six").map(|()| "accepted".into()),
    );
    assert!(
        started.elapsed() >= ms(1_000),
        "did not wait for the replica"
    );
    not_replicated(
        "incr_by",
        acked.incr_by("count", t(6), 1).map(|n| n.to_string()),
    );
    not_replicated("delete", acked.delete("gone", t(6)).map(|d| d.to_string()));
    not_replicated(
        "claim",
        acked.claim("doc", t(7)).map(|()| "accepted".into()),
    );
    // The same token again, from a store whose connection has written nothing before: the
    // script writes the record anyway, so the WAIT behind it counts this write, not none (from
    // Redis 7.2, a WAIT on a connection that wrote nothing counts every connected replica).
    let fresh = store(&pair.master, Some(1));
    not_replicated(
        "claim again",
        fresh.claim("doc", t(7)).map(|()| "accepted".into()),
    );
    // A store made from a client with replica acks waits as the client does.
    let client = LockClient::builder(pair.master.url())
        .namespace(support::NAMESPACE)
        .min_replica_acks(1, ms(1_000))
        .build()
        .unwrap();
    let shared = fencelock::FencedRedis::from(&client);
    assert_eq!(shared.min_replica_acks(), Some((1, ms(1_000))));
    not_replicated(
        "set through a client's store",
        shared.set("doc", t(7), "seven").map(|()| "accepted".into()),
    );
    // The master applied them all: not replicated is not undone.
    assert_eq!(text(&acked, "doc").as_deref(), Some("seven"));
    assert_eq!(acked.get_i64("count").unwrap(), Some(2));
    assert_eq!(acked.highest_token("doc").unwrap(), Some(t(7)));
    // A stale write stays refused.
    let err = acked.set("doc", t(4), "four").unwrap_err();
    assert!(err.is_stale_token(), "{err:?}");

    // Without replica acknowledgement, the same write is reported accepted.
    plain.set("doc", t(8), "eight").unwrap();
}

/// The rollback: a write reported accepted with a newer token is lost in a failover, and a
/// stalled holder's write with an older token is then accepted. With replica acknowledgement,
/// every write reported accepted is on the promoted replica, and the older token is refused.
#[test]
fn a_failover_lets_an_older_token_into_a_fenced_store_only_without_replica_acks() {
    for acks in [None, Some(1)] {
        let pair = Pair::start();
        let store = store(&pair.master, acks);
        // Holder 1 wrote while the link was up; holder 2 took over and writes while the replica
        // lags (here: the link is cut).
        store.set("doc", t(1), "by holder 1").unwrap();
        pair.await_replicated();
        pair.link.set_mode(Mode::Blackhole);
        let by_two = store.set("doc", t(2), "by holder 2");

        let promoted = fail_over(pair);
        let after = self::store(&promoted, acks);
        // Holder 1, stalled with token 1, wakes and writes.
        let late = after.set("doc", t(1), "late, by holder 1");
        match acks {
            None => {
                // Holder 2 was told its write was accepted; the failover lost it, and the stale
                // write went in.
                assert!(by_two.is_ok(), "{by_two:?}");
                assert!(late.is_ok(), "{late:?}");
                assert_eq!(text(&after, "doc").as_deref(), Some("late, by holder 1"));
            }
            Some(_) => {
                // Holder 2 was told its write's outcome is unknown, never that it was accepted.
                let err = by_two.unwrap_err();
                assert!(err.is_not_replicated(), "{err:?}");
            }
        }
    }

    // With replica acknowledgement, a write reported accepted survives the failover, and the
    // older token is refused on the promoted replica.
    let pair = Pair::start();
    let store = store(&pair.master, Some(1));
    store.set("doc", t(1), "by holder 1").unwrap();
    store.set("doc", t(2), "by holder 2").unwrap();
    pair.link.set_mode(Mode::Blackhole);
    let promoted = fail_over(pair);
    let after = self::store(&promoted, Some(1));
    let err = after.set("doc", t(1), "late, by holder 1").unwrap_err();
    assert!(err.is_stale_token(), "{err:?}");
    assert_eq!(text(&after, "doc").as_deref(), Some("by holder 2"));
}
