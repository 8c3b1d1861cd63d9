//! The token an attempt proposes: a master takes it only when it is above every token that
//! master stored, and a lock is held without the write-back round only when a majority took it.

use std::time::Duration;

use crate::support::quorum::Quorum;
use crate::support::{command_calls, ms, poll_until, NAMESPACE};

/// Scripts master `i` ran since its last `CONFIG RESETSTAT` (EVALSHA, and EVAL after NOSCRIPT).
fn scripts_run(quorum: &Quorum, i: usize) -> u64 {
    let mut con = quorum.connection(i);
    command_calls(&mut con, "evalsha") + command_calls(&mut con, "eval")
}

fn reset_stats(quorum: &Quorum) {
    for i in 0..quorum.len() {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut quorum.connection(i))
            .unwrap();
    }
}

#[test]
fn a_lock_on_a_key_in_use_is_held_after_one_round_with_its_token_on_every_master() {
    let quorum = Quorum::start(5);
    let client = quorum.client(Duration::from_secs(30));
    // The client's first call knows nothing of the masters' clocks: it may take the write-back.
    client.lock("used").unwrap().unlock().unwrap();
    for round in 0..3 {
        reset_stats(&quorum);
        let guard = client.lock("used").unwrap();
        let token = guard.token().as_u64();
        guard.unlock().unwrap();
        // Every master ran the acquire and the release, and no confirm: the token was taken by
        // every master, each of which held a smaller one (this client's last token, or below).
        poll_until(Duration::from_secs(5), ms(5), || {
            let run: Vec<u64> = (0..quorum.len()).map(|i| scripts_run(&quorum, i)).collect();
            if run.iter().all(|&n| n >= 2) {
                Ok(run)
            } else {
                Err(format!("scripts run per master: {run:?}"))
            }
        })
        .unwrap_or_else(|e| panic!("round {round}: the release did not reach every master: {e}"));
        let run: Vec<u64> = (0..quorum.len()).map(|i| scripts_run(&quorum, i)).collect();
        assert_eq!(
            run,
            vec![2; quorum.len()],
            "round {round}: scripts per master for a lock and its unlock (3: a write-back ran)"
        );
        let fences: Vec<Option<u64>> = (0..quorum.len()).map(|i| quorum.fence(i, "used")).collect();
        assert_eq!(fences, vec![Some(token); quorum.len()], "round {round}");
    }
}

#[test]
fn a_proposal_below_a_majority_s_tokens_is_not_the_token() {
    let quorum = Quorum::start(5);
    let client = quorum.client(Duration::from_secs(30));
    // The client learns the masters' clocks, so that its proposals follow them.
    client.lock("warm").unwrap().unlock().unwrap();
    // Masters 0, 1 and 2, a majority, hold a token far above any clock: as if granted under a
    // clock 1000 s ahead. Masters 3 and 4 have never seen the key, and take the proposal.
    let ahead = quorum.clock_us(0) + 1_000_000_000;
    for i in 0..3 {
        quorum.set_fence(i, "ahead", ahead);
    }
    // With 0 and 1 frozen, the grants are 2's (minted above `ahead`), 3's and 4's (the
    // proposal): a majority of grants, a minority of which took the proposal.
    quorum.freeze(0);
    quorum.freeze(1);
    let guard = client.lock("ahead").unwrap();
    let token = guard.token().as_u64();
    assert!(
        token > ahead,
        "token {token} is not above {ahead}, held by a majority before the grant"
    );
    // Written back to a majority: the next grant is above it too.
    let written: Vec<usize> = (2..5)
        .filter(|&i| quorum.fence(i, "ahead") >= Some(token))
        .collect();
    assert!(
        written.len() >= 3,
        "token {token} stands on {written:?} only"
    );
    quorum.thaw_all();
    guard.unlock().unwrap();
    let next = client.lock("ahead").unwrap();
    assert!(
        next.token().as_u64() > token,
        "{} after {token}",
        next.token()
    );
}

const GRANT_LUA: &str = include_str!("../../src/scripts/grant.lua");
const ACQUIRE_LUA: &str = include_str!("../../src/scripts/acquire.lua");
const RELEASE_LUA: &str = include_str!("../../src/scripts/quorum_release.lua");

/// A quorum attempt's acquire, as the engine sends it, by hand: whether it was granted.
fn acquire_by_hand(con: &mut redis::Connection, key: &str, owner: &str) -> bool {
    let lock = format!("{NAMESPACE}:lock:{{{key}}}");
    let keys = [
        lock.clone(),
        format!("{NAMESPACE}:fence:{{{key}}}"),
        format!("{NAMESPACE}:queue:{{{key}}}"),
        format!("{NAMESPACE}:waiters:{{{key}}}"),
        format!("{lock}:released"),
    ];
    let reply: Vec<redis::Value> = redis::cmd("EVAL")
        .arg(format!("{GRANT_LUA}{ACQUIRE_LUA}"))
        .arg(keys.len())
        .arg(&keys)
        .arg(owner)
        .arg(10_000)
        .arg("h")
        .arg(86_400_000)
        .arg("1")
        .query(con)
        .unwrap();
    redis::from_redis_value_ref::<i64>(&reply[0]).unwrap() == 1
}

/// A release of a quorum attempt, as the engine sends it, by hand: whether it found the key.
fn release_by_hand(con: &mut redis::Connection, key: &str, owner: &str) -> bool {
    let lock = format!("{NAMESPACE}:lock:{{{key}}}");
    let found: i64 = redis::cmd("EVAL")
        .arg(RELEASE_LUA)
        .arg(2)
        .arg(&lock)
        .arg(format!("{lock}:released"))
        .arg(owner)
        .arg("")
        .arg(10_000)
        .query(con)
        .unwrap();
    found == 1
}

/// A holder's unlock goes on a connection of its own, and can reach a master before the acquire
/// it undoes when the grant was decided without that master's reply. The acquire, run then,
/// must not take the key: nobody would release it, and while a minority of the masters is down
/// every attempt needs this one, so the lock would be stuck for a lease.
#[test]
fn an_acquire_that_runs_after_its_release_takes_nothing() {
    let quorum = Quorum::start(3);
    let mut con = quorum.connection(0);
    assert!(!release_by_hand(&mut con, "overtaken", "c:1"));
    assert!(!acquire_by_hand(&mut con, "overtaken", "c:1"));
    assert_eq!(quorum.lock_owner(0, "overtaken"), None);
    // Only that owner is refused: the next attempt is granted.
    assert!(acquire_by_hand(&mut con, "overtaken", "c:2"));
    assert!(release_by_hand(&mut con, "overtaken", "c:2"));
    assert_eq!(quorum.lock_owner(0, "overtaken"), None);
}
