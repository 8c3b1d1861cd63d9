//! `uncontended`: `lock` + `unlock` from one thread, a fresh key each time: the latency against
//! round trips taken alongside, then throughput and CPU of lock + unlock alone, then where the
//! time beyond two round trips goes ([`pieces`]).

use std::time::{Duration, Instant};

use redis::Value;

use crate::measure::{CpuMeter, Noise, ThreadCpu};
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, RedisServer, NOOP};
use crate::stats::{mix, pct, sorted};

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "1 uncontended";
    section("1. uncontended lock + unlock, one thread, a fresh key each time");
    let noise = Noise::start(server.pid());
    let client = client(&server.url());
    for i in 0..200 {
        client
            .lock(&format!("warm:{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
    }
    // Latency: each lock + unlock is paired with two no-op EVALSHA round trips from the same
    // thread just before it, so both see the same scheduling (one core or two) and load.
    let mut con = server.connection();
    let noop = redis::Script::new(NOOP);
    let _: i64 = noop.invoke(&mut con).expect("noop");
    let mut pairs = Vec::with_capacity(p.uncontended);
    let mut locks = Vec::with_capacity(p.uncontended);
    let mut unlocks = Vec::with_capacity(p.uncontended);
    let mut both = Vec::with_capacity(p.uncontended);
    for i in 0..p.uncontended {
        let key = format!("u:{i}");
        let t = Instant::now();
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let t0 = Instant::now();
        let guard = client.lock(&key).expect("lock");
        let t1 = Instant::now();
        guard.unlock().expect("unlock");
        let t2 = Instant::now();
        pairs.push(t0 - t);
        locks.push(t1 - t0);
        unlocks.push(t2 - t1);
        both.push(t2 - t0);
    }
    // Throughput and CPU: lock + unlock alone.
    let threads = ThreadCpu::snapshot();
    let cpu = CpuMeter::new(server.pid());
    let start = Instant::now();
    for i in 0..p.uncontended {
        client
            .lock(&format!("v:{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
    }
    let elapsed = start.elapsed();
    let (client_cpu, redis_cpu) = cpu.per_op(p.uncontended as u64);
    let by_thread = ThreadCpu::snapshot().per_op_since(&threads, p.uncontended as u64);
    let (pairs, locks, unlocks, both) =
        (sorted(pairs), sorted(locks), sorted(unlocks), sorted(both));
    r.info(B, "lock p50", r.lat(pct(&locks, 0.5)));
    r.info(B, "unlock p50", r.lat(pct(&unlocks, 0.5)));
    let p50 = pct(&both, 0.5);
    let pair = pct(&pairs, 0.5);
    r.info(
        B,
        "two no-op EVALSHA, paired with each op: p50",
        r.lat(pair),
    );
    r.check(
        B,
        "lock+unlock p50 / two paired EVALSHA",
        format!(
            "{} = {:.2}× (vs the run's RT: {:.2}× 2 RT)",
            fmt_d(p50),
            p50.as_secs_f64() / pair.as_secs_f64(),
            r.ratio(p50) / 2.0
        ),
        "≤ 1.3",
        p50.as_secs_f64() <= 1.3 * pair.as_secs_f64(),
    );
    r.info(B, "lock+unlock p99", r.lat(pct(&both, 0.99)));
    r.info(
        B,
        "lock+unlock alone: throughput",
        format!("{:.0}/s", p.uncontended as f64 / elapsed.as_secs_f64()),
    );
    r.info(
        B,
        "CPU per lock+unlock: client, redis",
        format!("{}, {}", fmt_d(client_cpu), fmt_d(redis_cpu)),
    );
    r.info(B, "client CPU per lock+unlock by thread", by_thread);
    pieces(server, &client, p.uncontended.min(2000), r);
    noise.report(r, B);
}

/// The library's acquire and release scripts, as it sends them (`src/scripts/mod.rs`).
const ACQUIRE: &str = concat!(
    include_str!("../../src/scripts/grant.lua"),
    include_str!("../../src/scripts/acquire.lua")
);
const RELEASE: &str = concat!(
    include_str!("../../src/scripts/grant.lua"),
    include_str!("../../src/scripts/release.lua")
);

/// Where an uncontended lock + unlock spends the time beyond two round trips. Each iteration
/// times, in a random order, five ways of making two calls:
///
/// - two no-op `EVALSHA` (two round trips);
/// - two no-op `EVALSHA` carrying the lock's four keys and the acquire's and release's arguments
///   (what the request's size costs);
/// - the library's acquire and release scripts sent directly with redis-rs, with the arguments
///   `lock` and `unlock` send (what the scripts' work in Redis costs);
/// - `lock` + `unlock` (what the rest of the library costs);
/// - `lock` + `unlock` of one key every time, whose fence counter is then there already (the
///   other ways use a fresh key each time, as the loops above do).
///
/// Meanwhile SLOWLOG, with its threshold at 0, records how long Redis ran each script.
fn pieces(server: &RedisServer, client: &fencelock::LockClient, n: usize, r: &mut Report) {
    const B: &str = "1 uncontended";
    let lease = client.lease().as_millis().to_string();
    // The default idle expiry of the fence counter (one day), which the bench's client keeps.
    let idle = "86400000";
    let owner = |i: usize| format!("0f1e2d3c4b5a69788796a5b4c3d2e1f0:{i}");
    let keys = |k: &str| {
        let ns = client.namespace();
        ["lock", "fence", "queue", "waiters"].map(|kind| format!("{ns}:{kind}:{{{k}}}"))
    };
    let mut con = server.connection();
    let noop = redis::Script::new(NOOP);
    let (acquire, release) = (redis::Script::new(ACQUIRE), redis::Script::new(RELEASE));
    // Loaded first, so that no NOSCRIPT round trip lands in the samples; and a check that the
    // keys above are the library's: a lock taken by the script is held for the client.
    let k = keys("pieces:check");
    let granted: Value = acquire
        .key(&k[..])
        .arg(owner(0))
        .arg(&lease)
        .arg("1")
        .arg(idle)
        .invoke(&mut con)
        .expect("acquire script");
    assert!(
        matches!(&granted, Value::Array(v) if v.first() == Some(&Value::Int(1))),
        "acquire script: {granted:?}"
    );
    assert!(
        client
            .try_lock("pieces:check", Duration::ZERO)
            .expect("try_lock")
            .is_none(),
        "the bench's key names differ from the library's"
    );
    let _: Value = release
        .key(&k[..])
        .arg(owner(0))
        .arg("0")
        .arg(idle)
        .invoke(&mut con)
        .expect("release script");
    let _: i64 = noop.invoke(&mut con).expect("noop");

    // Entries an iteration leaves in SLOWLOG: ten EVALSHA, the 24 commands the three acquire
    // and release scripts call, and the PING ahead of each of the library's two unlocks.
    const LOGGED: usize = 36;
    let slowlog = |con: &mut redis::Connection, args: &[&str]| {
        let _: Value = redis::cmd("CONFIG")
            .arg("SET")
            .arg(args)
            .query(con)
            .expect("CONFIG SET");
    };
    slowlog(
        &mut con,
        &["slowlog-max-len", &(LOGGED * n + 64).to_string()],
    );
    let _: Value = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query(&mut con)
        .expect("SLOWLOG");
    slowlog(&mut con, &["slowlog-log-slower-than", "0"]);

    let mut t: [Vec<Duration>; 5] = Default::default();
    for i in 0..n {
        // A new random order each iteration: with a fixed or rotating one, each way follows the
        // same other way every time, and that alone moved results by several microseconds.
        let mut order = [0, 1, 2, 3, 4];
        for k in (1..5).rev() {
            order.swap(k, (mix(i as u64 * 5 + k as u64) % (k as u64 + 1)) as usize);
        }
        for way in order {
            let user = format!("pieces:{i}:{way}");
            let k = keys(&user);
            let o = owner(i + 1);
            let start = Instant::now();
            match way {
                0 => {
                    let _: Value = noop.invoke(&mut con).expect("noop");
                    let _: Value = noop.invoke(&mut con).expect("noop");
                }
                1 => as_lock_and_unlock(&mut con, [&noop, &noop], &k, &o, &lease, idle),
                2 => as_lock_and_unlock(&mut con, [&acquire, &release], &k, &o, &lease, idle),
                3 => client.lock(&user).expect("lock").unlock().expect("unlock"),
                _ => client
                    .lock("pieces:same")
                    .expect("lock")
                    .unlock()
                    .expect("unlock"),
            }
            t[way].push(start.elapsed());
        }
    }
    slowlog(&mut con, &["slowlog-log-slower-than", "10000"]);
    let log: Vec<Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(LOGGED * n + 64)
        .query(&mut con)
        .expect("SLOWLOG GET");
    slowlog(&mut con, &["slowlog-max-len", "128"]);
    // Each entry: id, time, duration (µs), the command's arguments, ...; `at` picks the entries
    // whose argument at that index is `arg` (the script's sha, or a command's name).
    let ran = |at: usize, arg: &str| {
        let mut v: Vec<Duration> = log
            .iter()
            .filter_map(|e| match e {
                Value::Array(f) => match (f.get(2), f.get(3)) {
                    (Some(Value::Int(us)), Some(Value::Array(args)))
                        if args.get(at) == Some(&Value::BulkString(arg.as_bytes().to_vec())) =>
                    {
                        Some(Duration::from_micros(*us as u64))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        v.sort();
        v
    };
    let (ran_acquire, ran_release, ran_noop) = (
        ran(1, acquire.get_hash()),
        ran(1, release.get_hash()),
        ran(1, noop.get_hash()),
    );
    // The commands the scripts call, as Redis times each one inside the script.
    let call = |name: &str| pct(&ran(0, name), 0.5);
    let (get, incr, time, set, lpop, del) = (
        call("GET"),
        call("INCR"),
        call("TIME"),
        call("SET"),
        call("LPOP"),
        call("DEL"),
    );

    let [bare, sized, scripts, library, same] = t.map(sorted);
    let pair = pct(&bare, 0.5);
    let in_rt = |d: Duration| 2.0 * d.as_secs_f64() / pair.as_secs_f64();
    let line = |d: &[Duration]| format!("{} = {:.2} RT", fmt_d(pct(d, 0.5)), in_rt(pct(d, 0.5)));
    r.info(B, "pieces: two no-op EVALSHA: p50", line(&bare));
    r.info(
        B,
        "pieces: the same with the lock's keys and arguments: p50",
        line(&sized),
    );
    r.info(
        B,
        "pieces: the acquire and release scripts sent directly: p50",
        line(&scripts),
    );
    r.info(B, "pieces: lock + unlock: p50", line(&library));
    r.info(
        B,
        "pieces: lock + unlock of one key, again and again: p50",
        line(&same),
    );
    let (sa, sr, sn) = (
        pct(&ran_acquire, 0.5),
        pct(&ran_release, 0.5),
        pct(&ran_noop, 0.5),
    );
    r.info(
        B,
        "pieces: Redis runs acquire; release; a no-op (SLOWLOG p50)",
        format!(
            "{}; {}; {} ({}, {}, {} samples)",
            fmt_d(sa),
            fmt_d(sr),
            fmt_d(sn),
            ran_acquire.len(),
            ran_release.len(),
            ran_noop.len()
        ),
    );
    r.info(
        B,
        "pieces: of which the commands they call (p50 each)",
        format!(
            "acquire {} (GET {}, INCR {}, TIME {}, SET {} twice); release {} (GET, LPOP {}, DEL {})",
            fmt_d(get + incr + time + set * 2),
            fmt_d(get),
            fmt_d(incr),
            fmt_d(time),
            fmt_d(set),
            fmt_d(get + lpop + del),
            fmt_d(lpop),
            fmt_d(del)
        ),
    );
}

/// Sends the first script with the arguments `lock` sends the acquire script, then the second
/// with those `unlock` sends the release script.
fn as_lock_and_unlock(
    con: &mut redis::Connection,
    [first, second]: [&redis::Script; 2],
    keys: &[String; 4],
    owner: &str,
    lease: &str,
    idle: &str,
) {
    let _: Value = first
        .key(&keys[..])
        .arg(owner)
        .arg(lease)
        .arg("1")
        .arg(idle)
        .invoke(con)
        .expect("as acquire");
    let _: Value = second
        .key(&keys[..])
        .arg(owner)
        .arg("0")
        .arg(idle)
        .invoke(con)
        .expect("as release");
}
