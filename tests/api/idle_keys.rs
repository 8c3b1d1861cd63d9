//! A key nobody locks any more leaves nothing behind in Redis: its fence counter expires
//! `idle_expiry` after the server clock passes its last token, and its queue of waiters with
//! its longest-lived entry. Tokens keep rising across the counter's expiry, also when the counter
//! had run ahead of the clock (a burst of grants, a value set by hand): then it lives until the
//! clock has passed it.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::support::faults::{builder, wait_until};
use crate::support::{await_queue_len, fence_key, ms, RedisServer, NAMESPACE};

/// The idle expiry of these tests' clients.
const IDLE: Duration = Duration::from_secs(1);

/// A client in the test namespace with a short lease and the tests' idle expiry.
fn client(server: &RedisServer) -> LockClient {
    builder(server.url(), ms(200))
        .idle_expiry(IDLE)
        .build()
        .unwrap_or_else(|e| panic!("LockClient: {e}"))
}

/// One lock and unlock of `key`; its token.
fn grant(client: &LockClient, key: &str) -> u64 {
    let guard = client
        .lock(key)
        .unwrap_or_else(|e| panic!("lock {key:?}: {e}"));
    let token = guard.token().as_u64();
    guard
        .unlock()
        .unwrap_or_else(|e| panic!("unlock {key:?}: {e}"));
    token
}

/// Keys in the server's database, expired ones not yet reclaimed included (`DBSIZE`).
fn dbsize(con: &mut redis::Connection) -> u64 {
    redis::cmd("DBSIZE").query(con).unwrap()
}

/// The fence counter of `key` and its expiry as absolute server time in ms (`None`: none), read
/// in one script so the clock and the TTL agree; `None` if the counter is gone.
fn fence_expiry(con: &mut redis::Connection, key: &str) -> Option<(u64, Option<u64>)> {
    let (value, pttl, now): (Option<String>, i64, Vec<u64>) = redis::Script::new(
        "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('TIME')}",
    )
    .key(fence_key(key))
    .invoke(con)
    .unwrap_or_else(|e| panic!("reading the fence counter of {key:?}: {e}"));
    let value = value?;
    let counter = value
        .parse()
        .unwrap_or_else(|e| panic!("fence counter {value:?} is not a u64: {e}"));
    let now_ms = now[0] * 1000 + now[1] / 1000;
    let expiry = u64::try_from(pttl).ok().map(|pttl| now_ms + pttl);
    Some((counter, expiry))
}

/// The counter may expire only `IDLE` after the clock, in microseconds, passes it. A few ms of
/// slack: PTTL and TIME in one script may read the clock a moment apart.
fn assert_expiry_covers_counter(con: &mut redis::Connection, key: &str, context: &str) {
    assert_expiry_covers_counter_granted(con, key, context, None);
}

/// As [`assert_expiry_covers_counter`], for a key granted at `granted`: gone is right once IDLE
/// has passed since (less 100 ms for the clocks' reading apart).
fn assert_expiry_covers_counter_granted(
    con: &mut redis::Connection,
    key: &str,
    context: &str,
    granted: Option<Instant>,
) {
    let Some((counter, expiry)) = fence_expiry(con, key) else {
        if granted.is_some_and(|at| at.elapsed() + ms(100) >= IDLE) {
            return;
        }
        panic!("{context}: the fence counter of {key:?} is gone");
    };
    let expiry = expiry.unwrap_or_else(|| panic!("{context}: counter {counter} has no TTL"));
    let idle_ms = IDLE.as_millis() as u64;
    assert!(
        expiry * 1000 + 5_000 > counter + idle_ms * 1000,
        "{context}: counter {counter} (µs) expires at {expiry} ms, before the clock passes it by \
         the idle period ({idle_ms} ms)"
    );
}

/// Runs the acquire script by hand as a waiter (`ARGV[3] = 1`) of another process that then
/// dies: its queue entry is never refreshed or taken out.
fn enqueue_dead_waiter(con: &mut redis::Connection, key: &str) {
    let script = redis::Script::new(concat!(
        include_str!("../../src/scripts/grant.lua"),
        include_str!("../../src/scripts/acquire.lua")
    ));
    let (granted, _): (i64, i64) = script
        .key(format!("{NAMESPACE}:lock:{{{key}}}"))
        .key(fence_key(key))
        .key(format!("{NAMESPACE}:queue:{{{key}}}"))
        .key(format!("{NAMESPACE}:waiters:{{{key}}}"))
        .arg("deadbeef:1")
        .arg("300")
        .arg("1")
        .arg(IDLE.as_millis().to_string())
        .invoke(con)
        .unwrap_or_else(|e| panic!("acquire script as a dead waiter: {e}"));
    assert_eq!(
        granted, 0,
        "the dead waiter was granted {key:?}: it is held"
    );
}

/// Every Redis key fencelock made disappears once the keys are idle: 100 keys locked once, and
/// a contended key whose lock was handed over through its queue, with a waiter that died queued.
#[test]
fn every_key_of_an_idle_lock_disappears_after_the_idle_period() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let a = client(&server);
    let b = client(&server);
    // When each key was granted: a busy machine can take longer than IDLE to get to the checks
    // below, and a counter older than IDLE may be gone by then, as it should.
    let mut granted_at = Vec::new();
    for i in 0..100 {
        granted_at.push(Instant::now());
        grant(&a, &format!("once-{i}"));
    }
    let fresh = |at: &Instant| at.elapsed() + ms(100) < IDLE;

    // "busy": a holds it, b waits in Redis' queue, then a dead waiter behind b.
    let held = a.lock("busy").unwrap();
    let waiter = {
        let b = b.clone();
        thread::spawn(move || {
            let guard = b.lock("busy").unwrap_or_else(|e| panic!("b: lock: {e}"));
            let token = guard.token().as_u64();
            guard.unlock().unwrap_or_else(|e| panic!("b: unlock: {e}"));
            token
        })
    };
    await_queue_len(&mut con, "busy", 1);
    enqueue_dead_waiter(&mut con, "busy");
    await_queue_len(&mut con, "busy", 2);
    let first = held.token().as_u64();
    held.unlock().unwrap();
    let handed = waiter.join().unwrap();
    assert!(handed > first, "handoff token {handed} after {first}");
    // b's release handed the lock to the dead waiter: its grant runs out with its lease.

    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{NAMESPACE}:*"))
        .query(&mut con)
        .unwrap();
    if fresh(&granted_at[0]) {
        assert!(
            keys.len() >= 101,
            "right after the last unlock, each key's fence counter should still be there: {keys:?}"
        );
    }
    for (i, at) in granted_at.iter().enumerate() {
        let key = format!("once-{i}");
        assert_expiry_covers_counter_granted(&mut con, &key, "a key locked once", Some(*at));
    }
    assert_expiry_covers_counter(&mut con, "busy", "a key handed over");

    // The counters lapse about IDLE after their grants; the dead waiter's lock and entries
    // within its lease. Redis reclaims expired keys by sampling, 10 times a second.
    let start = Instant::now();
    wait_until(IDLE + Duration::from_secs(10), "every key gone", || {
        dbsize(&mut con) == 0
    });
    eprintln!("all keys gone {:?} after the last unlock", start.elapsed());
    drop((a, b));
}

/// A counter that expired is followed by a token from the clock floor, above the last one.
#[test]
fn tokens_rise_across_the_expiry_of_the_counter() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let client = client(&server);
    let before = grant(&client, "k");
    wait_until(
        IDLE + Duration::from_secs(10),
        "the counter expired",
        || fence_expiry(&mut con, "k").is_none(),
    );
    let after = grant(&client, "k");
    assert!(
        after > before,
        "the token after the counter expired, {after}, is not above the one before, {before}"
    );
}

/// A counter that ran ahead of the clock (here: set 3 s ahead, as a long run of grants faster
/// than one a microsecond, or a clock that stepped back, would leave it) must not lapse until
/// the clock has passed it: the first grant after a lapse takes its token from the clock.
#[test]
fn a_counter_ahead_of_the_clock_lives_until_the_clock_passes_it() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let client = client(&server);
    let last = grant(&client, "ahead");
    let now: Vec<u64> = redis::cmd("TIME").query(&mut con).unwrap();
    let ahead = now[0] * 1_000_000 + now[1] + 3_000_000;
    // INCRBY, like a run of INCRs, keeps the TTL the last grant set.
    let _: u64 = redis::cmd("INCRBY")
        .arg(fence_key("ahead"))
        .arg(ahead - last)
        .query(&mut con)
        .unwrap();
    let before = grant(&client, "ahead");
    assert_eq!(
        before,
        ahead + 1,
        "the grant did not count on from the counter"
    );

    let start = Instant::now();
    wait_until(Duration::from_secs(15), "the counter expired", || {
        fence_expiry(&mut con, "ahead").is_none()
    });
    let lived = start.elapsed();
    let after = grant(&client, "ahead");
    assert!(
        after > before,
        "after the counter expired ({lived:?} after the grant), the token {after} is not above \
         the one before, {before}: it lapsed before the clock passed it"
    );
}

/// Far ahead of the clock, the counter's expiry moves with it, and from 2^53 on (where its TTL
/// could not be computed exactly) the counter never expires; a burst of grants in one pipeline
/// keeps every expiry above its counter.
#[test]
fn far_ahead_counters_keep_their_expiry_beyond_the_clock() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let client = client(&server);
    let now: Vec<u64> = redis::cmd("TIME").query(&mut con).unwrap();
    let clock = now[0] * 1_000_000 + now[1];

    for (key, ahead) in [
        ("day", 86_400_000_000u64),
        ("century", 3_155_760_000_000_000),
    ] {
        let first = grant(&client, key);
        let _: u64 = redis::cmd("INCRBY")
            .arg(fence_key(key))
            .arg(clock + ahead - first)
            .query(&mut con)
            .unwrap();
        let token = grant(&client, key);
        assert_eq!(token, clock + ahead + 1);
        assert_expiry_covers_counter(&mut con, key, &format!("a counter {ahead} µs ahead"));
    }

    // Just below 2^53, with the TTL of an earlier grant; the next grant reaches 2^53.
    let first = grant(&client, "huge");
    let _: u64 = redis::cmd("INCRBY")
        .arg(fence_key("huge"))
        .arg((1u64 << 53) - 1 - first)
        .query(&mut con)
        .unwrap();
    assert_eq!(grant(&client, "huge"), 1 << 53);
    let expiry = fence_expiry(&mut con, "huge").map(|(_, expiry)| expiry);
    assert_eq!(
        expiry,
        Some(None),
        "a counter at 2^53 must not expire (Some(None): present, no TTL)"
    );

    // A burst: 300 grants and releases of one key in one pipeline, as fast as Redis runs them.
    let acquire = concat!(
        include_str!("../../src/scripts/grant.lua"),
        include_str!("../../src/scripts/acquire.lua")
    );
    let release = concat!(
        include_str!("../../src/scripts/grant.lua"),
        include_str!("../../src/scripts/release.lua")
    );
    let idle = IDLE.as_millis().to_string();
    let mut pipe = redis::pipe();
    for i in 0..300 {
        let owner = format!("burst:{i}");
        for (script, args) in [
            (
                acquire,
                [owner.as_str(), "300", "0", idle.as_str()].as_slice(),
            ),
            (release, [owner.as_str(), "0", idle.as_str()].as_slice()),
        ] {
            pipe.cmd("EVAL")
                .arg(script)
                .arg(4)
                .arg(format!("{NAMESPACE}:lock:{{burst}}"))
                .arg(fence_key("burst"))
                .arg(format!("{NAMESPACE}:queue:{{burst}}"))
                .arg(format!("{NAMESPACE}:waiters:{{burst}}"))
                .arg(args)
                .ignore();
        }
    }
    let () = pipe.query(&mut con).unwrap();
    assert_expiry_covers_counter(&mut con, "burst", "after a burst of 300 grants");
}
