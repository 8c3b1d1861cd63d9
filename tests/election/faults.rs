//! A leader process killed or frozen, Redis restarted, and a deposed leader's fenced write.

use std::process::Command;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockOptions};

use crate::support::{self, example_bin, lock_client, Child, RedisServer};

fn candidate(server: &RedisServer, name: &str, value: &str, lease_ms: u64) -> (Child, u64) {
    let child = Child::spawn({
        let mut cmd = Command::new(example_bin("election"));
        cmd.args([name, value, &lease_ms.to_string()])
            .env("REDIS_URL", server.url())
            .env("FENCELOCK_NAMESPACE", support::NAMESPACE);
        cmd
    });
    let line = child.expect_line("leader ", Duration::from_secs(10));
    let epoch = line["leader ".len()..].trim().parse().unwrap();
    (child, epoch)
}

#[test]
fn the_next_candidate_leads_within_about_a_lease_of_the_leaders_crash() {
    let server = RedisServer::start();
    let (mut leader, epoch) = candidate(&server, "scheduler", "crashing", 1_000);
    let election = lock_client(&server, 30_000).election("scheduler").unwrap();
    assert_eq!(election.leader().unwrap().unwrap().value(), "crashing");
    leader.kill();
    let killed = Instant::now();
    let next = election.campaign("next").unwrap();
    assert!(next.epoch().as_u64() > epoch);
    assert!(
        killed.elapsed() < Duration::from_millis(1_000 + 2_000),
        "took over after {:?}",
        killed.elapsed()
    );
    assert_eq!(election.leader().unwrap().unwrap().value(), "next");
}

#[test]
fn a_frozen_leader_is_deposed_past_its_lease_and_learns_it_when_it_wakes() {
    let server = RedisServer::start();
    let (mut frozen, epoch) = candidate(&server, "scheduler", "frozen", 500);
    let election = lock_client(&server, 30_000).election("scheduler").unwrap();
    frozen.pause();
    let next = election.campaign("next").unwrap();
    assert!(next.epoch().as_u64() > epoch);
    frozen.resume();
    // Its resignation finds the leadership gone.
    frozen.close_stdin();
    frozen.expect_line("lost", Duration::from_secs(10));
    assert_eq!(
        frozen
            .wait_exit(Duration::from_secs(10))
            .map(|s| s.success()),
        Some(true)
    );
    // The deposed leader's record never replaced the new one.
    let leader = election.leader().unwrap().unwrap();
    assert_eq!((leader.value(), leader.epoch()), ("next", next.epoch()));
}

#[test]
fn a_deposed_leaders_fenced_write_is_refused() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let store = FencedRedis::from(&client);
    let election = client.election("scheduler").unwrap();
    // A leader whose renewal stops after 200 ms: as one that stalled.
    let old = election
        .campaign_with(
            "old",
            &LockOptions::new()
                .lease(Duration::from_millis(200))
                .max_hold(Duration::from_millis(200)),
        )
        .unwrap();
    store.set("schedule", old.epoch(), "old").unwrap();
    let new = election.campaign("new").unwrap();
    store.set("schedule", new.epoch(), "new").unwrap();
    let refused = store.set("schedule", old.epoch(), "old, late").unwrap_err();
    assert!(refused.is_stale_token(), "{refused:?}");
    assert_eq!(store.get("schedule").unwrap().unwrap(), b"new");
}

#[test]
fn epochs_rise_across_a_restart_of_redis_without_persistence() {
    let mut server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let election = client.election("scheduler").unwrap();
    let before = election.campaign("a").unwrap();
    let epoch = before.epoch();
    server.restart();
    // The restart lost the lock: the leadership is known lost within its lease (renewal finds
    // the key gone), and nobody leads.
    before.lost().recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(election.leader().unwrap(), None);
    let after = election.campaign("b").unwrap();
    assert!(after.epoch() > epoch, "{} after {}", after.epoch(), epoch);
}
