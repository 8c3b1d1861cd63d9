//! Observers: the current leader first, then every change in order; a crashed leader reported
//! gone; after an outage, the current leader, never a stale one.

use std::thread;
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::{lock_client, lock_client_at, RedisServer};
use crate::{changes_until, next_change};

const PATIENCE: Duration = Duration::from_secs(10);

#[test]
fn an_observer_sees_every_leader_and_value_in_order() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let election = client.election("scheduler").unwrap();
    let observer = election.observe().unwrap();
    assert_eq!(
        next_change(&observer, PATIENCE),
        None,
        "nobody leads at first"
    );

    let mut expected = Vec::new();
    for node in ["a", "b", "c"] {
        let candidate = lock_client(&server, 30_000).election("scheduler").unwrap();
        let leadership = candidate.campaign(node).unwrap();
        let epoch = leadership.epoch().as_u64();
        expected.push((node.to_owned(), epoch));
        for v in 2..5 {
            let value = format!("{node} v{v}");
            leadership.proclaim(&value).unwrap();
            expected.push((value, epoch));
        }
        leadership.resign().unwrap();
        expected.push(("-".to_owned(), 0));
    }
    let seen = changes_until(&observer, "c v4", PATIENCE);
    // Every proclamation, in order; a resignation shows as nobody leading.
    assert_eq!(seen, expected[..expected.len() - 1]);
    assert_eq!(next_change(&observer, PATIENCE), None);
}

#[test]
fn an_observer_started_under_a_leader_reports_it_first() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let election = client.election("scheduler").unwrap();
    let leadership = election.campaign("a").unwrap();
    let observer = election.observe().unwrap();
    let first = next_change(&observer, PATIENCE).expect("the leader");
    assert_eq!((first.value(), first.epoch()), ("a", leadership.epoch()));
}

#[test]
fn an_observer_reports_a_leader_gone_when_its_lease_runs_out() {
    let server = RedisServer::start();
    let election = lock_client(&server, 30_000).election("scheduler").unwrap();
    let observer = election.observe().unwrap();
    assert_eq!(next_change(&observer, PATIENCE), None);
    // A leader that stops renewing after 300 ms and says nothing: as a crashed one.
    let leadership = election
        .campaign_with(
            "a",
            &fencelock::LockOptions::new()
                .lease(Duration::from_millis(300))
                .renew(false),
        )
        .unwrap();
    assert_eq!(next_change(&observer, PATIENCE).unwrap().value(), "a");
    let gone = Instant::now();
    assert_eq!(next_change(&observer, PATIENCE), None);
    assert!(gone.elapsed() < Duration::from_secs(5));
    assert!(!leadership.is_leader());
}

#[test]
fn an_observer_cut_off_meanwhile_reports_the_current_leader_not_a_stale_one() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let observer = lock_client_at(&proxy.url(), 30_000)
        .election("scheduler")
        .unwrap()
        .observe()
        .unwrap();
    assert_eq!(next_change(&observer, PATIENCE), None);
    let a = lock_client(&server, 30_000).election("scheduler").unwrap();
    let first = a.campaign("a").unwrap();
    assert_eq!(next_change(&observer, PATIENCE).unwrap().value(), "a");

    // Cut the observer off; meanwhile a resigns and b leads.
    proxy.set_mode(Mode::Reset);
    first.resign().unwrap();
    let b = lock_client(&server, 30_000).election("scheduler").unwrap();
    let second = b.campaign("b").unwrap();
    // No report while cut off can name b (it cannot hear), and none may name a again.
    let cut = Instant::now();
    while cut.elapsed() < Duration::from_millis(300) {
        if let Ok(change) = observer.changes().recv_timeout(Duration::from_millis(50)) {
            assert!(
                change.as_ref().is_none_or(|l| l.value() != "a"),
                "{change:?}"
            );
        }
    }
    proxy.set_mode(Mode::Pass);
    // At most one "nobody" (read while b was being granted), then b.
    let now = (0..3)
        .find_map(|_| next_change(&observer, PATIENCE))
        .expect("the current leader");
    assert_eq!((now.value(), now.epoch()), ("b", second.epoch()));
    drop(second);
    thread::yield_now();
}
