//! `uncontended`: `lock` + `unlock` from one thread, a fresh key each time: the latency against
//! round trips taken alongside, then throughput and CPU of lock + unlock alone.

use std::time::Instant;

use crate::measure::{CpuMeter, Noise, ThreadCpu};
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, RedisServer, NOOP};
use crate::stats::{pct, sorted};

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
    noise.report(r, B);
}
