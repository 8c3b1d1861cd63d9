//! Campaign, proclaim, resign and the order of candidates, on one server.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockOptions, MAX_LEADER_VALUE_LEN};

use crate::queue_of;
use crate::support::{await_queue_len, lock_client, ms, RedisServer, NAMESPACE};

#[test]
fn one_leader_at_a_time_and_each_epoch_above_the_last() {
    let server = RedisServer::start();
    let leading = Arc::new(AtomicUsize::new(0));
    let epochs = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let candidates: Vec<_> = (0..6)
        .map(|i| {
            let client = lock_client(&server, 5_000);
            let (leading, epochs) = (Arc::clone(&leading), Arc::clone(&epochs));
            thread::spawn(move || {
                let election = client.election("scheduler").unwrap();
                for round in 0..8 {
                    let leadership = election.campaign(&format!("node-{i}")).unwrap();
                    let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                    assert_eq!(now, 1, "{now} leaders at once");
                    epochs.lock().unwrap().push(leadership.epoch().as_u64());
                    if round % 2 == 0 {
                        thread::yield_now();
                    }
                    leading.fetch_sub(1, Ordering::SeqCst);
                    leadership.resign().unwrap();
                }
            })
        })
        .collect();
    for c in candidates {
        c.join().unwrap();
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    let epochs = epochs.lock().unwrap();
    assert_eq!(epochs.len(), 48);
    // Pushed while leading, so in the order of the leaderships.
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs did not rise: {epochs:?}"
    );
}

#[test]
fn the_leader_is_read_with_its_value_and_epoch_and_proclaim_changes_the_value() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let election = client.election("scheduler").unwrap();
    assert_eq!(election.name(), "scheduler");
    assert_eq!(election.leader().unwrap(), None);

    let leadership = election.campaign("node-a:8080").unwrap();
    assert!(leadership.is_leader());
    let leader = election.leader().unwrap().expect("a leader");
    assert_eq!(leader.value(), "node-a:8080");
    assert_eq!(leader.epoch(), leadership.epoch());

    leadership.proclaim("node-a:8080, v2").unwrap();
    let leader = election.leader().unwrap().expect("a leader");
    assert_eq!(leader.value(), "node-a:8080, v2");
    assert_eq!(
        leader.epoch(),
        leadership.epoch(),
        "proclaim keeps the epoch"
    );

    // Another client of the same namespace sees the same.
    let other = lock_client(&server, 5_000);
    assert_eq!(
        other.election("scheduler").unwrap().leader().unwrap(),
        Some(leader)
    );

    leadership.resign().unwrap();
    assert_eq!(election.leader().unwrap(), None);
}

#[test]
fn an_election_and_a_lock_of_the_same_name_are_independent() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let lock = client.lock("scheduler").unwrap();
    let leadership = client
        .election("scheduler")
        .unwrap()
        .try_campaign("a", ms(500))
        .unwrap()
        .expect("the election is not the lock");
    assert!(lock.is_held() && leadership.is_leader());
    assert!(client
        .try_lock("%election:scheduler", Duration::ZERO)
        .unwrap()
        .is_some());
}

#[test]
fn try_campaign_gives_up_at_its_timeout_and_a_resignation_hands_over_at_once() {
    let server = RedisServer::start();
    let a = lock_client(&server, 30_000).election("scheduler").unwrap();
    let b = lock_client(&server, 30_000).election("scheduler").unwrap();
    let first = a.campaign("a").unwrap();

    let tried = Instant::now();
    assert!(b.try_campaign("b", ms(300)).unwrap().is_none());
    assert!(tried.elapsed() >= ms(300));
    assert!(tried.elapsed() < Duration::from_secs(5));

    let waiting = thread::spawn(move || {
        let leadership = b.campaign("b").unwrap();
        (Instant::now(), leadership.epoch())
    });
    let mut con = server.connection();
    await_queue_len(&mut con, &queue_of("scheduler"), 1);
    let epoch = first.epoch();
    let resigned = Instant::now();
    first.resign().unwrap();
    let (took_over, next) = waiting.join().unwrap();
    assert!(next > epoch);
    // Handed over by the release, not found at the lease's end (30 s).
    assert!(took_over.duration_since(resigned) < Duration::from_secs(5));
}

#[test]
fn candidates_lead_in_the_order_they_came() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let holder = lock_client(&server, 30_000).election("queue").unwrap();
    let first = holder.campaign("first").unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiting = Vec::new();
    for (i, name) in ["b", "c", "d"].into_iter().enumerate() {
        let election = lock_client(&server, 30_000).election("queue").unwrap();
        let order = Arc::clone(&order);
        waiting.push(thread::spawn(move || {
            let leadership = election.campaign(name).unwrap();
            order.lock().unwrap().push(name);
            leadership.resign().unwrap();
        }));
        await_queue_len(&mut con, &queue_of("queue"), i as u64 + 1);
    }
    first.resign().unwrap();
    for w in waiting {
        w.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["b", "c", "d"]);
}

#[test]
fn bad_names_and_values_are_refused_before_any_call() {
    let client = fencelock::LockClient::new("redis://127.0.0.1:1/").unwrap();
    assert!(client.election("").unwrap_err().is_invalid_argument());
    assert!(client
        .election(&"n".repeat(fencelock::MAX_KEY_LEN + 1))
        .unwrap_err()
        .is_invalid_argument());
    let election = client.election("e").unwrap();
    let long = "v".repeat(MAX_LEADER_VALUE_LEN + 1);
    let started = Instant::now();
    assert!(election.campaign(&long).unwrap_err().is_invalid_argument());
    assert!(election
        .try_campaign(&long, ms(10))
        .unwrap_err()
        .is_invalid_argument());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no network call"
    );
}

#[test]
fn a_leadership_lost_behind_its_back_cannot_proclaim_and_reports_the_loss() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let election = client.election("scheduler").unwrap();
    let leadership = election.campaign("a").unwrap();
    let mut con = server.connection();
    let deleted: u64 = redis::cmd("DEL")
        .arg(format!("{NAMESPACE}:lock:{{%election:scheduler}}"))
        .query(&mut con)
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(leadership.proclaim("a, v2").unwrap_err().is_lock_lost());
    assert_eq!(
        election.leader().unwrap(),
        None,
        "a record without its lock names nobody"
    );
    leadership
        .lost()
        .recv_timeout(Duration::from_secs(30))
        .unwrap();
    assert!(!leadership.is_leader());
    assert!(leadership.resign().unwrap_err().is_lock_lost());
}

#[test]
fn a_campaign_can_be_cancelled() {
    let server = RedisServer::start();
    let a = lock_client(&server, 30_000).election("scheduler").unwrap();
    let b = lock_client(&server, 30_000).election("scheduler").unwrap();
    let _first = a.campaign("a").unwrap();
    let (cancel, cancelled) = fencelock::crossbeam_channel::bounded(1);
    let waiting = thread::spawn(move || {
        b.campaign_with("b", &LockOptions::new().cancel(cancelled))
            .map(|l| l.epoch())
    });
    let mut con = server.connection();
    await_queue_len(&mut con, &queue_of("scheduler"), 1);
    cancel.send(()).unwrap();
    assert!(waiting.join().unwrap().unwrap_err().is_cancelled());
}

#[test]
fn run_while_leader_campaigns_again_until_the_work_is_done() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let election = client.election("worker").unwrap();
    let mut epochs = Vec::new();
    let done = election
        .run_while_leader("w", &LockOptions::new(), |leadership| {
            assert!(leadership.is_leader());
            epochs.push(leadership.epoch());
            if epochs.len() < 3 {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(epochs.len())
            }
        })
        .unwrap();
    assert_eq!(done, 3);
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
    // Resigned at the end.
    assert_eq!(election.leader().unwrap(), None);
}

#[test]
fn dropping_a_leadership_resigns() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let election = client.election("scheduler").unwrap();
    let leadership = election.campaign("a").unwrap();
    drop(leadership);
    assert_eq!(election.leader().unwrap(), None);
    let next = lock_client(&server, 30_000)
        .election("scheduler")
        .unwrap()
        .try_campaign("b", Duration::ZERO)
        .unwrap();
    assert!(next.is_some(), "the lock was released");
}

#[test]
fn a_past_leaders_record_never_names_the_next_holder() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let election = client.election("scheduler").unwrap();
    let leadership = election.campaign("a").unwrap();
    // The lock passes to an owner that has not proclaimed (granted a moment ago, or dead since):
    // a's record is still there, and must name nobody.
    let mut con = server.connection();
    let _: () = redis::cmd("SET")
        .arg(format!("{NAMESPACE}:lock:{{%election:scheduler}}"))
        .arg("another-client:1")
        .arg("PX")
        .arg(30_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(election.leader().unwrap(), None);
    assert!(leadership.proclaim("a, v2").unwrap_err().is_lock_lost());
    assert_eq!(election.leader().unwrap(), None);
}
