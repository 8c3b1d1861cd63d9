//! Fencing tokens stay exact and strictly increasing where the scripts' arithmetic could bend
//! them: above 2^53, where Lua's doubles can no longer tell neighbouring integers apart (tokens
//! would repeat), and on the acquire script's "already ours" branch (an idempotent retry after a
//! lost reply), which must keep the clock floor like every other grant (or a deleted fence key
//! hands out token 1 again).

use redis::Value;

use crate::support;
use crate::support::{fence_key, lock_client, lock_key, RedisServer};

/// The fence counter of `key` under the test namespace.
/// The fence counter as stored, parsed exactly (no detour through a double).
fn read_counter(con: &mut redis::Connection, key: &str) -> u64 {
    let raw: String = redis::cmd("GET")
        .arg(fence_key(key))
        .query(con)
        .unwrap_or_else(|e| panic!("GET {}: {e}", fence_key(key)));
    raw.parse()
        .unwrap_or_else(|e| panic!("fence counter {raw:?} is not a u64: {e}"))
}

/// Above 2^53 every grant still takes the counter after INCR, exactly: 2^53+1 is followed by
/// 2^53+2, 2^53+3, 2^53+4 (the clock floor, about 1.8e15 microseconds, is far below).
#[test]
fn tokens_above_2_pow_53_are_exact_and_strictly_increasing() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();
    let key = "big";
    let start: u64 = (1 << 53) + 1; // 9007199254740993
    let _: () = redis::cmd("SET")
        .arg(fence_key(key))
        .arg(start.to_string())
        .query(&mut con)
        .unwrap();

    // All three grants first, then the checks: the whole sequence shows in a failure.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let guard = client.lock(key).unwrap();
        let token = guard.token().as_u64();
        guard.unlock().unwrap();
        seen.push((token, read_counter(&mut con, key)));
    }
    let expected: Vec<(u64, u64)> = (1..=3).map(|i| (start + i, start + i)).collect();
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "tokens not strictly increasing; (token, counter after) of each grant: {seen:?}"
    );
    assert_eq!(
        seen, expected,
        "(token, counter after) of each grant after the counter was set to {start}"
    );
}

/// A reply's token: an integer, or (canonical decimal) bulk string; anything else panics.
fn token_of(value: &Value) -> u64 {
    match value {
        Value::Int(n) => u64::try_from(*n).unwrap_or_else(|_| panic!("negative token {n}")),
        Value::BulkString(bytes) => {
            let text = std::str::from_utf8(bytes)
                .unwrap_or_else(|_| panic!("token is not UTF-8: {bytes:?}"));
            assert!(
                text == "0" || (!text.starts_with('0') && text.bytes().all(|b| b.is_ascii_digit())),
                "token {text:?} is not a canonical decimal"
            );
            text.parse()
                .unwrap_or_else(|e| panic!("token {text:?} is not a u64: {e}"))
        }
        other => panic!("token is neither an integer nor a decimal string: {other:?}"),
    }
}

/// Runs the acquire script (grant.lua + acquire.lua, as the library builds it) for `key` as
/// `owner`, as a single try; returns (granted, token or pttl).
fn run_acquire(con: &mut redis::Connection, key: &str, owner: &str) -> (i64, u64) {
    let script = redis::Script::new(concat!(
        include_str!("../../src/scripts/grant.lua"),
        include_str!("../../src/scripts/acquire.lua")
    ));
    let ns = support::NAMESPACE;
    let reply: Value = script
        .key(lock_key(key))
        .key(fence_key(key))
        .key(format!("{ns}:queue:{{{key}}}"))
        .key(format!("{ns}:waiters:{{{key}}}"))
        .arg(owner)
        .arg("10000")
        .arg("0")
        .arg("60000")
        .invoke(con)
        .unwrap_or_else(|e| panic!("acquire script: {e}"));
    let Value::Array(items) = &reply else {
        panic!("acquire script replied {reply:?}, not an array");
    };
    let code = match items.first() {
        Some(Value::Int(code)) => *code,
        _ => panic!("acquire script replied {reply:?}: no status code first"),
    };
    let second = items
        .get(1)
        .unwrap_or_else(|| panic!("acquire script replied {reply:?}: no second element"));
    (code, token_of(second))
}

/// A counter behind the clock, set by hand to a small or a negative number, gives way to the
/// clock floor: the token is the server clock in microseconds (about 1.8e15), never the counter
/// plus one, and the counter keeps the token.
///
/// Protection: a variant of the minting that keeps the counter when it is below zero (lifting
/// only positive counters to the clock) fails here: the client refuses the token -4.
#[test]
fn counters_behind_the_clock_give_way_to_it_even_below_zero() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();
    for (key, counter) in [("small", "7"), ("negative", "-5")] {
        let _: () = redis::cmd("SET")
            .arg(fence_key(key))
            .arg(counter)
            .query(&mut con)
            .unwrap();
        let guard = client.lock(key).unwrap();
        let token = guard.token().as_u64();
        guard.unlock().unwrap();
        assert!(
            token > 1_000_000_000_000_000,
            "{key}: counter {counter} gave token {token}, not on the clock floor"
        );
        assert_eq!(
            read_counter(&mut con, key),
            token,
            "{key}: the counter after"
        );
    }
}

/// The "lock already belongs to this owner" branch (a retry whose first reply was lost) is a
/// grant like any other: with the fence key gone (a restart without persistence, a failover that
/// lost it) it still lifts the token to the clock floor, above every token handed out before.
#[test]
fn a_retry_that_finds_the_lock_ours_keeps_the_clock_floor() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let key = "retry";
    let owner = "c0ffee:1";

    let (code, first) = run_acquire(&mut con, key, owner);
    assert_eq!(
        code, 1,
        "the free lock was not granted (reply token/pttl {first})"
    );
    assert!(
        first > 1,
        "the first grant's token {first} is not on the clock floor"
    );

    let _: () = redis::cmd("DEL")
        .arg(fence_key(key))
        .query(&mut con)
        .unwrap();
    let (code, again) = run_acquire(&mut con, key, owner);
    assert_eq!(code, 1, "the lock already ours was not granted again");
    assert!(
        again > first,
        "the retry's token {again} is not above the first grant's {first}"
    );
}

/// `as_i64` holds for every token a grant can carry: the counter is a Redis integer (signed
/// 64-bit), so the last grant of a key carries `i64::MAX` and the next acquire fails with a
/// Redis error, granting nothing.
#[test]
fn every_granted_token_fits_an_i64_up_to_the_last() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();
    let key = "last";
    let _: () = redis::cmd("SET")
        .arg(fence_key(key))
        .arg((i64::MAX - 1).to_string())
        .query(&mut con)
        .unwrap();

    let guard = client.lock(key).unwrap();
    assert_eq!(guard.token().as_u64(), i64::MAX as u64);
    assert_eq!(guard.token().as_i64().unwrap(), i64::MAX);
    guard.unlock().unwrap();

    let err = client.lock(key).unwrap_err();
    assert!(err.is_redis(), "{err:?}");
    assert!(
        !support::lock_exists(&mut con, key),
        "a grant past i64::MAX"
    );

    // The only tokens that do not fit are made by hand.
    let by_hand = fencelock::FencingToken::from(i64::MAX as u64 + 1);
    let err = by_hand.as_i64().unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
}
