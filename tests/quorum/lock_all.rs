//! `lock_all` on a quorum of five masters: each key of a set is a majority's grant with its
//! own token, a timeout leaves no key on any master, unlock frees every master, losing one key
//! loses the set, and overlapping sets named in random orders do not deadlock.

use std::time::Duration;

use fencelock::crossbeam_channel::RecvTimeoutError;

use crate::support::quorum::Quorum;
use crate::support::sets::{run_random_sets, Rounds};
use crate::support::{ms, poll_until};

const KEYS: [&str; 5] = ["q:0", "q:1", "q:2", "q:3", "q:4"];

/// Polls (bounded) until no running master has `key`'s lock key.
fn await_free_everywhere(quorum: &Quorum, key: &str) {
    poll_until(Duration::from_secs(5), ms(10), || {
        match quorum.masters_holding(key) {
            left if left.is_empty() => Ok(()),
            left => Err(format!("still locked on masters {left:?}")),
        }
    })
    .unwrap_or_else(|e| panic!("{key:?}: {e}"));
}

#[test]
fn sets_on_a_quorum() {
    let quorum = Quorum::start(5);
    let (a, b) = (quorum.client(ms(2000)), quorum.client(ms(2000)));

    let held = a.lock("q:2").unwrap();
    for timeout in [ms(300), Duration::ZERO] {
        assert!(b
            .try_lock_all(&["q:3", "q:2", "q:1"], timeout)
            .unwrap()
            .is_none());
        // Released as a dropped guard is on a quorum: sent to every master before
        // try_lock_all returns, not waited for.
        for key in ["q:1", "q:3"] {
            await_free_everywhere(&quorum, key);
        }
    }
    held.unlock().unwrap();

    let set = b.lock_all(&["q:3", "q:2", "q:1"]).unwrap();
    assert!(set.is_held());
    for key in ["q:1", "q:2", "q:3"] {
        let holding = quorum.masters_holding(key);
        assert!(holding.len() >= quorum.majority(), "{key}: {holding:?}");
        let token = set.token(key).unwrap().as_u64();
        let confirmed = (0..quorum.len())
            .filter(|&i| quorum.fence(i, key) >= Some(token))
            .count();
        assert!(
            confirmed >= quorum.majority(),
            "{key}: token on {confirmed} masters"
        );
    }
    set.unlock().unwrap();
    for key in ["q:1", "q:2", "q:3"] {
        await_free_everywhere(&quorum, key);
    }

    // Losing one key loses the set, once.
    let set = a.lock_all(&["q:0", "q:4"]).unwrap();
    let lost = set.lost().clone();
    assert!(b.force_unlock("q:4").unwrap());
    assert_eq!(lost.recv_timeout(ms(5_000)), Ok(()));
    assert!(!set.is_held());
    assert_eq!(
        lost.recv_timeout(ms(1_000)),
        Err(RecvTimeoutError::Disconnected)
    );
    drop(set);
    await_free_everywhere(&quorum, "q:0");

    let Rounds(rounds) = run_random_sets(
        &[a, b],
        4,
        &KEYS,
        3,
        Duration::from_secs(2),
        1_000,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(rounds.iter().all(|&n| n > 0), "{rounds:?}");
    eprintln!("sets taken by each thread: {rounds:?}");
}
