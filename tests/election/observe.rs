//! Observers: the current leader first, then every change in order; a crashed leader reported
//! gone; after an outage, the current leader, never a stale one.

use std::thread;
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::{
    add_documented_acl_user, lock_client, lock_client_at, RedisServer, NAMESPACE,
};
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

#[test]
fn an_observer_whose_user_may_not_subscribe_still_reports_the_leader() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "deaf", "on", ">secret", "resetchannels"])
        .arg(&[&format!("~{NAMESPACE}:*"), "+@all"])
        .query(&mut con)
        .unwrap();
    let election = lock_client(&server, 30_000).election("scheduler").unwrap();
    let _leadership = election.campaign("a").unwrap();
    let url = format!("redis://deaf:secret@127.0.0.1:{}/", server.port());
    let observer = lock_client_at(&url, 30_000)
        .election("scheduler")
        .unwrap()
        .observe()
        .unwrap();
    // Read at the start, whatever the subscription does.
    assert_eq!(next_change(&observer, PATIENCE).unwrap().value(), "a");
}

#[test]
fn an_observer_hears_within_a_lease_of_a_leader_that_may_not_publish() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // The leader's user may lock but not publish on the election's channel.
    add_documented_acl_user(&mut con);
    let observer = lock_client(&server, 1_000)
        .election("scheduler")
        .unwrap()
        .observe()
        .unwrap();
    assert_eq!(next_change(&observer, PATIENCE), None);
    let url = format!("redis://locker:secret@127.0.0.1:{}/", server.port());
    let election = lock_client_at(&url, 30_000).election("scheduler").unwrap();
    let _leadership = election.campaign("a").unwrap();
    let heard = Instant::now();
    // No message: the observer's read once per lease of its client (1 s) finds the leader.
    assert_eq!(next_change(&observer, PATIENCE).unwrap().value(), "a");
    assert!(
        heard.elapsed() < Duration::from_secs(5),
        "{:?}",
        heard.elapsed()
    );
}

#[test]
fn a_read_of_nobody_ends_the_earlier_leaders_so_a_late_message_of_theirs_is_not_reported() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let leadership = lock_client(&server, 30_000)
        .election("scheduler")
        .unwrap()
        .campaign("x1")
        .unwrap();
    // Every chunk through the proxy is held: the subscription's confirmation, the read after
    // it and the messages arrive late, so a message published before the read is processed
    // after it.
    proxy.set_mode(Mode::Delay(Duration::from_millis(250)));
    let observer = lock_client_at(&proxy.url(), 30_000)
        .election("scheduler")
        .unwrap()
        .observe()
        .unwrap();
    let channel = format!("{NAMESPACE}:leader:{{%election:scheduler}}");
    let mut con = server.connection();
    crate::support::poll_until(Duration::from_secs(30), Duration::from_millis(5), || {
        let (_, n): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        if n >= 1 {
            Ok(())
        } else {
            Err("not subscribed yet".to_owned())
        }
    })
    .unwrap();
    leadership.proclaim("x2").unwrap();
    leadership.resign().unwrap();
    let mut seen = Vec::new();
    while let Ok(change) = observer.changes().recv_timeout(Duration::from_secs(3)) {
        seen.push(change.map(|l| l.value().to_owned()));
        if seen.len() > 5 {
            break;
        }
    }
    // Nobody has led since x resigned: no leader may follow a "nobody".
    let after_none = seen
        .iter()
        .skip_while(|c| c.is_some())
        .skip(1)
        .any(Option::is_some);
    assert!(!after_none, "a leader reported after nobody: {seen:?}");
    assert_eq!(seen.last(), Some(&None), "{seen:?}");
}

#[test]
fn values_of_any_bytes_and_size_round_trip_to_observers() {
    let server = RedisServer::start();
    let election = lock_client(&server, 30_000)
        .election("odd name {x} é")
        .unwrap();
    let observer = election.observe().unwrap();
    assert_eq!(next_change(&observer, PATIENCE), None);
    let big = "z".repeat(fencelock::MAX_LEADER_VALUE_LEN);
    let values = [
        "",
        " lead ing ",
        "a\0b",
        "line1\nline2\r\n",
        "é🦀",
        "leader 1 2 3 x",
        &big,
    ];
    let leadership = election.campaign(values[0]).unwrap();
    for v in &values[1..] {
        leadership.proclaim(v).unwrap();
        assert_eq!(election.leader().unwrap().unwrap().value(), *v);
        assert_eq!(leadership.value(), *v);
    }
    let seen: Vec<String> = (0..values.len())
        .map(|_| next_change(&observer, PATIENCE).unwrap().value().to_owned())
        .collect();
    assert_eq!(seen, values);
    assert!(leadership
        .proclaim(&(big.clone() + "z"))
        .unwrap_err()
        .is_invalid_argument());
}
