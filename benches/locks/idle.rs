//! `idle`: what a key locked once leaves in Redis, and for how long. IK distinct keys are each
//! locked and unlocked once, on redis-servers of their own (the run's server holds the other
//! benchmarks' keys). First with the default idle expiry (24 h): Redis memory while the fence
//! counters carry their TTL, then with the same counters made persistent (`PERSIST`), which is
//! the layout before counters expired (one key without a TTL per key ever locked). Then, on a
//! second server, with the shortest idle expiry (1 s): how long until every key is gone, and the
//! memory left, twice with different keys, so what Redis keeps after its peak shows apart from
//! what each key keeps.
//!
//! Per key: the growth of `INFO memory`'s `used_memory` over the empty server, divided by IK
//! (it includes Redis' hash tables, which grow in powers of two), and the mean of
//! `MEMORY USAGE` over every counter (the key and value alone, no TTL entry).

use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, MIN_IDLE_EXPIRY};

use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{builder, info_value, RedisServer};

/// How long the counters may take to be reclaimed after the idle period: Redis finds expired
/// keys by sampling them, ten times a second.
const RECLAIM_BOUND: Duration = Duration::from_secs(30);
/// Time for Redis' periodic task (10 Hz) to shrink hash tables that emptied.
const SETTLE: Duration = Duration::from_secs(1);

fn used_memory(con: &mut redis::Connection) -> i64 {
    info_value(con, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn dbsize(con: &mut redis::Connection) -> u64 {
    redis::cmd("DBSIZE").query(con).expect("DBSIZE")
}

/// The fence counters of the bench namespace, by `SCAN`.
fn fence_keys(con: &mut redis::Connection) -> Vec<String> {
    let iter: redis::Iter<'_, String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg("bench:fence:*")
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(con)
        .expect("SCAN");
    iter.collect::<Result<_, _>>().expect("SCAN")
}

/// Mean `MEMORY USAGE` of `keys`, in bytes.
fn mean_usage(con: &mut redis::Connection, keys: &[String]) -> f64 {
    if keys.is_empty() {
        return 0.0;
    }
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("MEMORY").arg("USAGE").arg(key);
    }
    let sizes: Vec<u64> = pipe.query(con).expect("MEMORY USAGE");
    sizes.iter().sum::<u64>() as f64 / sizes.len() as f64
}

/// Locks and unlocks `n` distinct keys once each, named after `prefix`.
fn lock_each_once(client: &LockClient, n: u64, prefix: &str) {
    for i in 0..n {
        client
            .lock(&format!("idle:{prefix}{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
    }
}

/// Memory figures of the keys on `con` against the empty server's `empty` bytes.
fn per_key(con: &mut redis::Connection, empty: i64, n: u64) -> (u64, f64, f64) {
    let keys = fence_keys(con);
    let grown = used_memory(con) - empty;
    (dbsize(con), grown as f64 / n as f64, mean_usage(con, &keys))
}

pub fn run(p: &Params, r: &mut Report) {
    const B: &str = "6 idle keys";
    let n = p.idle_keys;
    section(&format!("6. idle keys: {n} keys locked once each"));

    // The default idle expiry (24 h), read before any counter can lapse; then the same counters
    // made persistent, as every counter was before counters expired.
    let server = RedisServer::start();
    let mut con = server.connection();
    let empty = used_memory(&mut con);
    let client = builder(server.url()).build().expect("LockClient");
    lock_each_once(&client, n, "");
    let (keys, grown, usage) = per_key(&mut con, empty, n);
    r.info(
        B,
        "counters with a TTL: keys; used_memory growth per key; MEMORY USAGE",
        format!("{keys}; {grown:.0} B; {usage:.0} B"),
    );
    let mut pipe = redis::pipe();
    for key in fence_keys(&mut con) {
        pipe.cmd("PERSIST").arg(key).ignore();
    }
    let () = pipe.query(&mut con).expect("PERSIST");
    // Redis shrinks the emptied table of TTLs in its periodic task (10 Hz).
    thread::sleep(SETTLE);
    let (keys, grown, usage) = per_key(&mut con, empty, n);
    r.info(
        B,
        "kept for ever (as before): keys; used_memory growth per key; MEMORY USAGE",
        format!("{keys}; {grown:.0} B; {usage:.0} B"),
    );
    drop(client);
    drop(server);

    // The shortest idle expiry, waited out.
    let server = RedisServer::start();
    let mut con = server.connection();
    let empty = used_memory(&mut con);
    let client = builder(server.url())
        .idle_expiry(MIN_IDLE_EXPIRY)
        .build()
        .expect("LockClient");
    // Twice, with different keys: what stays after the first round (Redis' tables sized for
    // its peak, its allocator's caches) is not per key if the second round leaves no more.
    for round in ["", "again, other keys: "] {
        lock_each_once(&client, n, round);
        let unlocked = Instant::now();
        while dbsize(&mut con) > 0 && unlocked.elapsed() < RECLAIM_BOUND {
            thread::sleep(Duration::from_millis(50));
        }
        let reclaimed_in = unlocked.elapsed();
        thread::sleep(SETTLE);
        let (keys, grown, _) = per_key(&mut con, empty, n);
        r.check(
            B,
            &format!("{round}idle expiry {MIN_IDLE_EXPIRY:?}: keys left"),
            format!(
                "{keys}, all gone {} after the last unlock",
                fmt_d(reclaimed_in)
            ),
            "0",
            keys == 0,
        );
        r.info(
            B,
            &format!("{round}then: used_memory growth per key"),
            format!("{grown:.0} B"),
        );
    }
}
