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
    let client = quorum.client(Duration::from_secs(2));
    // The client's first call knows nothing of the masters' clocks: it may take the write-back.
    // It goes through each master's worker, which connects first: on a busy machine a master
    // can get its acquire late and its release not at all (dropped once nobody waits for it),
    // and then load the release script on NOSCRIPT in the first counted round. A second call
    // finds the connections made, and counting starts once every release arrived.
    for _ in 0..2 {
        client.lock("used").unwrap().unlock().unwrap();
        settle(&quorum, "used");
    }
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
        settle(&quorum, "used");
    }
}

/// Waits until no master holds `key`: every release has arrived, or what a late request left
/// behind on a master (an acquire run after its release was dropped) expired with the lease.
fn settle(quorum: &Quorum, key: &str) {
    poll_until(Duration::from_secs(5), ms(5), || {
        let holding = quorum.masters_holding(key);
        if holding.is_empty() {
            Ok(())
        } else {
            Err(format!("{key} still held on {holding:?}"))
        }
    })
    .unwrap_or_else(|e| panic!("the releases did not arrive: {e}"));
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

/// The largest of the masters' clocks (`TIME`, in microseconds), read now.
fn fastest_clock(quorum: &Quorum) -> u64 {
    (0..quorum.len())
        .map(|i| quorum.clock_us(i))
        .max()
        .expect("masters")
}

/// A master that restarted empty relies on its clock floor being past every token it stored,
/// proposals included, once it stayed down for longer than the clock offset plus the margin a
/// proposal may run ahead (docs/design.md, "Why tokens rise"). A reply whose request took a
/// while to reach the master (a busy or briefly stopped master, a request sent again through
/// the worker) must not push later proposals further ahead than that margin.
#[test]
fn a_proposal_after_a_slow_request_runs_no_further_ahead_of_the_clocks_than_the_margin() {
    let quorum = Quorum::start(3);
    let client = quorum.client(Duration::from_secs(30));
    // Warm: lanes to every master, and readings of their clocks.
    for _ in 0..2 {
        client.lock("slow").unwrap().unlock().unwrap();
    }
    // Every master reads the next acquire about 30 ms after it was sent (stopped, then
    // resumed), within the time an attempt waits for a master before it counts as stalled.
    for i in 0..quorum.len() {
        quorum.freeze(i);
    }
    let slow = std::thread::scope(|s| {
        let call = s.spawn(|| client.lock("slow"));
        std::thread::sleep(ms(30));
        quorum.thaw_all();
        call.join().expect("the lock call")
    })
    .unwrap();
    slow.unlock().unwrap();
    // The next attempt proposes from the readings of that slow one.
    let guard = client.lock("slow").unwrap();
    let token = guard.token().as_u64();
    let clock = fastest_clock(&quorum);
    guard.unlock().unwrap();
    assert!(
        token <= clock + 10_000,
        "token {token} is {} us ahead of the fastest master's clock {clock}, read after it was \
         granted: more than the 10 ms margin a restarted master is documented to wait out",
        token - clock
    );
}

/// A key none of the masters has a counter for is one round too once the client knows their
/// clocks: each master takes a proposal at or above its clock floor, and the proposal covers
/// the way there. On a busy machine a request can take longer to get there than the margin
/// covers, and that lock takes the write-back round: most of five new keys must not. (With no
/// margin, none is one round.)
#[test]
fn a_lock_on_a_new_key_is_held_after_one_round_once_the_clocks_are_known() {
    let quorum = Quorum::start(5);
    let client = quorum.client(Duration::from_secs(2));
    for _ in 0..2 {
        client.lock("warm").unwrap().unlock().unwrap();
        settle(&quorum, "warm");
    }
    let mut runs = Vec::new();
    for round in 0..5 {
        let key = format!("new-{round}");
        reset_stats(&quorum);
        let guard = client.lock(&key).unwrap();
        let token = guard.token().as_u64();
        guard.unlock().unwrap();
        let run = poll_until(Duration::from_secs(5), ms(5), || {
            let run: Vec<u64> = (0..quorum.len()).map(|i| scripts_run(&quorum, i)).collect();
            if run.iter().all(|&n| n >= 2) {
                Ok(run)
            } else {
                Err(format!("scripts run per master: {run:?}"))
            }
        })
        .unwrap_or_else(|e| panic!("{key}: the release did not reach every master: {e}"));
        // The token stands on a majority either way (taken, or written back).
        let fences: Vec<Option<u64>> = (0..quorum.len()).map(|i| quorum.fence(i, &key)).collect();
        assert!(
            fences.iter().filter(|&&f| f == Some(token)).count() >= quorum.majority(),
            "{key}: token {token}, fences {fences:?}"
        );
        runs.push(run);
    }
    // A write-back runs a third script on a majority.
    let one_round = runs
        .iter()
        .filter(|run| run.iter().filter(|&&n| n >= 3).count() < quorum.majority())
        .count();
    assert!(
        one_round >= 3,
        "{one_round} of 5 new keys were one round; scripts per master for each lock and its \
         unlock (3: a write-back ran): {runs:?}"
    );
}

/// A key whose counters run far ahead of the clocks (a master's clock stepped forward for a
/// while, or a counter set by hand) keeps its own tokens above them, but does not carry the
/// tokens of every other key ahead with it: those stay within the margin of the clocks, as
/// the restart rule assumes.
#[test]
fn a_key_far_ahead_does_not_carry_other_keys_tokens_ahead() {
    let quorum = Quorum::start(3);
    let client = quorum.client(Duration::from_secs(30));
    client.lock("warm").unwrap().unlock().unwrap();
    let ahead = quorum.clock_us(0) + 1_000_000_000;
    for i in 0..quorum.len() {
        quorum.set_fence(i, "ahead", ahead);
    }
    let guard = client.lock("ahead").unwrap();
    let token = guard.token().as_u64();
    assert!(token > ahead, "token {token} is not above {ahead}");
    guard.unlock().unwrap();
    for key in ["other", "another"] {
        let guard = client.lock(key).unwrap();
        let token = guard.token().as_u64();
        let clock = fastest_clock(&quorum);
        guard.unlock().unwrap();
        assert!(
            token <= clock + 10_000,
            "{key}: token {token} is {} us ahead of the fastest master's clock {clock}",
            token.saturating_sub(clock)
        );
    }
    // And "ahead" still rises.
    let next = client.lock("ahead").unwrap();
    assert!(
        next.token().as_u64() > token,
        "{} after {token}",
        next.token()
    );
}

/// The restart rule end to end: master 0's clock runs E ahead of 1 and 2; master 1 loses its
/// data and serves nothing for longer than E plus 10 ms (and than the lease), which
/// docs/design.md says is safe. A grant that started after one reported before the loss must
/// still have the larger token, even when the client had just read the masters' clocks through
/// a slow request. The loss is FLUSHALL and a freeze, which is what a restart without data
/// looks like to the clients, with a downtime the test controls to the millisecond.
#[test]
fn tokens_rise_across_a_master_that_lost_its_data_for_the_documented_wait() {
    let lease = Duration::from_secs(1);
    let mut quorum = Quorum::start_with_clocks(3);
    let offset = ms(1190);
    let down = offset + ms(15);
    quorum.clock(0).forward(offset);
    let client = quorum.client(lease);
    for _ in 0..2 {
        client.lock("k").unwrap().unlock().unwrap();
        settle(&quorum, "k");
    }
    // Master 2 runs nothing from here until the second grant (down, its data kept).
    quorum.kill(2);
    // An acquire that 0 and 1 read about 45 ms after it was sent (an attempt waits 50 ms for
    // a master before it counts as stalled).
    quorum.freeze(0);
    quorum.freeze(1);
    let slow = std::thread::scope(|s| {
        let call = s.spawn(|| client.lock("k"));
        std::thread::sleep(ms(45));
        quorum.thaw(0);
        quorum.thaw(1);
        call.join().expect("the lock call")
    })
    .unwrap();
    slow.unlock().unwrap();
    // The first grant, on 0 and 1, reported and released.
    let first = client.lock("k").unwrap();
    let t1 = first.token().as_u64();
    first.unlock().unwrap();
    settle(&quorum, "k");
    // Master 1 loses its data and serves nothing for E + 15 ms; master 2 comes back meanwhile.
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut quorum.connection(1))
        .unwrap();
    quorum.freeze(1);
    let lost = std::time::Instant::now();
    quorum.restart(2);
    std::thread::sleep(down.saturating_sub(lost.elapsed()));
    quorum.thaw(1);
    assert!(
        lost.elapsed() >= down,
        "master 2 took {:?} to come back",
        lost.elapsed()
    );
    // The second grant, on 1 and 2, by another client.
    quorum.freeze(0);
    let other = quorum.client(lease);
    let second = other.lock("k").unwrap();
    let t2 = second.token().as_u64();
    second.unlock().unwrap();
    quorum.thaw_all();
    assert!(
        t2 > t1,
        "the second grant's token {t2} is not above the first's {t1} (by {} us): master 1 lost \
         its data and served nothing for {down:?}, clock offset {offset:?}",
        t1 - t2
    );
}
