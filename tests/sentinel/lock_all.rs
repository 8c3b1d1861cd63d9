//! `lock_all` through Sentinel: a set taken on the master and held through a failover; the same
//! keys taken again right after the switch, within the call's deadline; and once more after
//! Sentinel has made the old master a replica of the new one. Each key's token rises every time,
//! above every earlier grant of that key.
//!
//! Right after the switch the old master, alive, still takes writes (here with no
//! `min-replicas-to-write`; with it, it does so too while the other replica still follows it),
//! and a lock call made before the client hears of the switch is granted there
//! (docs/design.md, "What it guarantees, and what it cannot"); a first version of this test saw
//! that happen 1 ms after the switch. Such a grant is lost when the old master resyncs from the
//! new one, and the tokens of the set after it must still rise above it: the clock floor.

use std::time::{Duration, Instant};

use fencelock::{LockClient, MultiGuard, Topology};

use crate::support::ms;
use crate::support::sentinel::{SentinelSet, MASTER_NAME};

const NAMESPACE: &str = "sets";
/// Named out of order, as a caller might.
const KEYS: [&str; 3] = ["m:3", "m:1", "m:2"];
/// How long a demoted old master may take to become a synced replica: Sentinel reconfigures it
/// on its 10 s INFO period.
const SETTLE: Duration = Duration::from_secs(40);
/// The deadline of each `try_lock_all` after the failover.
const DEADLINE: Duration = Duration::from_secs(20);

fn client(set: &SentinelSet) -> LockClient {
    LockClient::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .namespace(NAMESPACE)
        .lease(ms(4_000))
        .connection_timeout(ms(1_000))
        .response_timeout(ms(1_000))
        .build()
        .unwrap()
}

/// `key`'s fence counter on the server of `con`: the last token handed out for it there.
fn counter(con: &mut redis::Connection, key: &str) -> Option<u64> {
    let raw: Option<String> = redis::cmd("GET")
        .arg(format!("{NAMESPACE}:fence:{{{key}}}"))
        .query(con)
        .unwrap();
    raw.map(|raw| raw.parse().unwrap())
}

/// Each key's token in `set`, in the order of [`KEYS`].
fn tokens(set: &MultiGuard) -> Vec<u64> {
    KEYS.iter()
        .map(|key| set.token(key).expect("one of the set").as_u64())
        .collect()
}

/// Asserts that every key's token in `later` is above its token in `earlier`.
fn rising(what: &str, earlier: &[u64], later: &[u64]) {
    for ((key, earlier), later) in KEYS.iter().zip(earlier).zip(later) {
        assert!(
            later > earlier,
            "{what}: {key}: token {later} after {earlier}"
        );
    }
}

/// `try_lock_all` of [`KEYS`] with [`DEADLINE`], which must be granted before it.
fn take_again(sentinels: &SentinelSet, client: &LockClient, what: &str) -> MultiGuard {
    let started = Instant::now();
    let outcome = client.try_lock_all(&KEYS, DEADLINE);
    let took = started.elapsed();
    match outcome {
        Ok(Some(set)) => {
            println!("{what}: granted after {took:?}");
            assert!(took < DEADLINE, "{what}: granted after {took:?}");
            assert!(set.is_held(), "{what}");
            set
        }
        other => panic!(
            "{what}: try_lock_all({DEADLINE:?}): {other:?} after {took:?}\n{}",
            sentinels.logs()
        ),
    }
}

/// A set held through the switch is still held (renewed on the new master) or reported lost;
/// never neither. Then released.
fn held_or_lost(what: &str, set: MultiGuard) {
    if set.is_held() {
        println!("{what}: still held");
    } else {
        assert_eq!(
            set.lost().recv_timeout(ms(1_000)),
            Ok(()),
            "{what}: not held, and not reported lost"
        );
        println!("{what}: reported lost");
    }
    // What the release does not free, the 4 s lease does, well within the next deadline.
    if let Err(e) = set.unlock() {
        println!("{what}: release: {e}");
    }
}

#[test]
fn a_set_is_taken_again_through_a_failover_with_rising_tokens_for_every_key() {
    let sentinels = SentinelSet::start(1);
    let client = client(&sentinels);
    // Keys whose counters differ: m:2 was granted alone twice before.
    for _ in 0..2 {
        client.lock("m:2").unwrap().unlock().unwrap();
    }
    let first = client.lock_all(&KEYS).unwrap();
    let before = tokens(&first);
    let old = sentinels.master_port();
    let mut old_master = sentinels.servers()[sentinels.master_index()].connection();
    for (key, token) in KEYS.iter().zip(&before) {
        // Each key's own counter: the tokens of a set are not one sequence.
        assert_eq!(Some(*token), counter(&mut old_master, key), "{key}");
    }
    assert!(before[2] > before[1], "m:2 {} m:1 {}", before[2], before[1]);

    let new = sentinels.failover();
    assert_ne!(new, old);
    held_or_lost("the set held through the failover", first);

    // Right after the switch: granted before the deadline, on whichever master the client
    // reached (see the top of the file), with higher tokens.
    let again = take_again(&sentinels, &client, "right after the switch");
    let after = tokens(&again);
    rising("right after the switch", &before, &after);
    let on_old = counter(&mut old_master, KEYS[0]) == Some(after[0]);
    println!(
        "right after the switch: granted on the {} master",
        if on_old { "old" } else { "new" }
    );
    held_or_lost("the set taken right after the switch", again);

    // Once the old master is a replica of the new one, only the new master grants: a set
    // granted on the old master in the meantime is gone with its writes, and the tokens still
    // rise above it.
    sentinels.wait_settled(SETTLE);
    let last = take_again(&sentinels, &client, "once settled");
    let settled = tokens(&last);
    rising("once settled", &after, &settled);
    let mut new_master = sentinels.servers()[sentinels.server_by_port(new)].connection();
    for (key, token) in KEYS.iter().zip(&settled) {
        assert_eq!(
            Some(*token),
            counter(&mut new_master, key),
            "{key} on {new}"
        );
    }
    last.unlock().unwrap();
}
